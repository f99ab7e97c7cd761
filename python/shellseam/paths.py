"""Where shellseam keeps files on the host: the default spill parent.

Spill files must live where no confined mode's default writable roots reach them (a sandboxed
command must not rewrite what the model will read). So the default parent is a per-user cache
directory, never the shared temp directory unless nothing else works (SPEC §3, spill rules).
"""

from __future__ import annotations

import os
import tempfile


def spill_parent_candidates() -> list[str]:
    """The default spill parents, best first (SPEC §3)."""
    candidates: list[str] = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        candidates.append(os.path.join(xdg, "shellseam"))
    home = os.path.expanduser("~")
    if os.path.isabs(home):
        candidates.append(os.path.join(home, ".cache", "shellseam"))
    candidates.append(f"/var/tmp/shellseam-{os.getuid()}")
    candidates.append(tempfile.gettempdir())
    return candidates


def default_spill_parent(*subdirs: str) -> str:
    """The first default spill parent that exists or can be created (0700), joined with
    ``subdirs`` (created too): e.g. ``default_spill_parent("cli")`` for the CLI's spills."""
    for base in spill_parent_candidates():
        path = os.path.join(base, *subdirs)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK):
            return path
    return os.path.join(tempfile.gettempdir(), *subdirs)
