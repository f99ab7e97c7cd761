"""The fused deadline of a foreground ``run_sync`` with an abort signal: timeout and abort
are one deadline.

The first cause to fire kills the process and is the only cause reported (SPEC §3); later
causes are ignored. ``run_sync`` arms it with the bounded native wait and the caller's
``AbortSignal``; the asyncio ``run`` keeps the same rule in the core (the supervisor's timer
and ``PendingRun.kill``), and a ``run_sync`` without a signal in its one native call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

Cause = Literal["timeout", "abort"]


class Deadline:
    """First-cause-wins: fires ``kill`` once, for whichever of timeout and abort comes first."""

    __slots__ = ("_kill", "_lock", "cause")

    def __init__(self, kill: Callable[[], object]) -> None:
        self._lock = threading.Lock()
        self._kill = kill
        self.cause: Cause | None = None

    def fire(self, cause: Cause) -> None:
        with self._lock:
            if self.cause is not None:
                return
            self.cause = cause
        self._kill()

    def on_timeout(self) -> None:
        self.fire("timeout")

    def on_abort(self) -> None:
        self.fire("abort")
