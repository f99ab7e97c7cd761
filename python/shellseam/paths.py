"""Where the front ends keep spill files: the service's default spill parent, moved out of a
sandbox's writable roots when it lies inside them.

A confined call whose writable roots contain the spill directory is refused (a command must
not rewrite what the model will read). ``~/.cache/shellseam`` lies inside a workspace rooted
at ``~``, so a front end whose workspace contains the default parent puts its spill files in
``/var/tmp/shellseam-<uid>`` instead, which no confined mode's default roots contain.
``shellseam run`` keeps its spill files (printed paths must stay readable after it exits) in
a ``cli/`` folder of that parent, which ``shellseam clean`` sweeps.
"""

from __future__ import annotations

import os

from .service import _private_dir, default_spill_parent


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def _outside_parent() -> str:
    return f"/var/tmp/shellseam-{os.geteuid()}"


def spill_parent_outside(*roots: str) -> str:
    """The default spill parent, or ``/var/tmp/shellseam-<uid>`` when the default lies inside
    one of ``roots`` (and that one can be ours)."""
    base = default_spill_parent()
    if not any(_inside(base, root) for root in roots):
        return base
    fallback = _outside_parent()
    return fallback if _private_dir(fallback) else base


def cli_spill_parent(*roots: str) -> str:
    """``<spill parent outside roots>/cli``, created private; the parent itself when that
    folder cannot be ours (e.g. someone else made it in a shared temp directory)."""
    base = spill_parent_outside(*roots)
    path = os.path.join(base, "cli")
    return path if _private_dir(path) else base


def cli_spill_parents() -> list[str]:
    """Every folder ``shellseam run`` may have kept spill files in (for ``shellseam clean``)."""
    parents = [cli_spill_parent()]
    other = os.path.join(_outside_parent(), "cli")
    if other not in parents and os.path.isdir(other):
        parents.append(other)
    return parents
