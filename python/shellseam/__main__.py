"""``python -m shellseam``: the same command line as the ``shellseam`` script."""

import sys

from .cli import main

sys.exit(main())
