"""The CLI's spill parent: a ``cli/`` folder in the service's default spill parent.

``shellseam run`` keeps its spill files (the printed paths must stay readable after it exits),
so they get a folder of their own that ``shellseam clean`` can sweep without touching the
spill directories of long-running services. The base is ``service.default_spill_parent()``:
one rule for where spill files live.
"""

from __future__ import annotations

import os

from .service import _private_dir, default_spill_parent


def cli_spill_parent() -> str:
    """``<default spill parent>/cli``, created private; the default spill parent itself when
    that folder cannot be ours (e.g. someone else made it in a shared temp directory)."""
    base = default_spill_parent()
    path = os.path.join(base, "cli")
    return path if _private_dir(path) else base
