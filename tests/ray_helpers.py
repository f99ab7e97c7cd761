"""Helpers shared by the Ray tests: find a command by a marker in its command line, poll."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable


def new_marker() -> str:
    """A unique word to put in a command line (``exec -a <marker> sleep 30``)."""
    return f"shellseam-marker-{secrets.token_hex(6)}"


def marker_pids(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line carries ``marker``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline and stat[stat.rfind(")") + 2] not in "ZX":
            pids.append(int(name))
    return pids


def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Polls ``check`` until it holds or ``timeout_s`` passes; its last answer."""
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        if check():
            return True
        time.sleep(0.02)
    return check()
