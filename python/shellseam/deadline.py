"""The fused deadline of one foreground run: timeout and abort are one deadline.

The first cause to fire kills the process and is the only cause reported (SPEC §3); later
causes are ignored. A ``Deadline`` is armed with the run's timeout (a timer on the event loop
for ``run``, the bounded native wait for ``run_sync``) and listens to the caller's
``AbortSignal`` until the run settles.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from .abort import AbortSignal

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

    @contextmanager
    def watching(self, signal: AbortSignal | None) -> Iterator[Deadline]:
        """Listens to the caller's signal while the block runs (from any thread)."""
        remove = signal.add_listener(self.on_abort) if signal is not None else None
        try:
            yield self
        finally:
            if remove is not None:
                remove()

    @contextmanager
    def timer(self, timeout_ms: int) -> Iterator[Deadline]:
        """Arms the timeout on the running event loop while the block runs."""
        handle = asyncio.get_running_loop().call_later(timeout_ms / 1000, self.on_timeout)
        try:
            yield self
        finally:
            handle.cancel()
