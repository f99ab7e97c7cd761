"""AbortController / AbortSignal: a thread-safe cancellation token, as in the seeds.

A signal fires at most once; listeners run exactly once, on the thread that aborts (or at
once, on the registering thread, when the signal had already fired).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class AbortSignal:
    """Read side of an :class:`AbortController`."""

    __slots__ = ("_aborted", "_listeners", "_lock", "_reason")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._reason: object | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def aborted(self) -> bool:
        return self._aborted

    @property
    def reason(self) -> object | None:
        return self._reason

    def add_listener(self, cb: Callable[[], None]) -> Callable[[], None]:
        """Run ``cb`` when the signal fires (at once if it already has); returns a remover."""
        with self._lock:
            if not self._aborted:
                self._listeners.append(cb)

                def remove() -> None:
                    with self._lock:
                        if cb in self._listeners:
                            self._listeners.remove(cb)

                return remove
        cb()
        return lambda: None

    def _fire(self, reason: object | None) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._reason = reason
            listeners, self._listeners = self._listeners, []
        for cb in listeners:
            cb()

    def __repr__(self) -> str:
        return f"AbortSignal(aborted={self._aborted!r}, reason={self._reason!r})"


class AbortController:
    """Owns an :class:`AbortSignal` and fires it with :meth:`abort`."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: object | None = None) -> None:
        """Fire the signal once; later calls are no-ops."""
        self.signal._fire(reason)
