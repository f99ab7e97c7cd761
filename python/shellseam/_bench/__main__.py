"""``python -m shellseam._bench``: the suite's command line (bench children use it too)."""

import sys

from .cli import main

sys.exit(main())
