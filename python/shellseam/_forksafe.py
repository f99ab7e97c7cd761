"""Locks that a forked copy of the harness gets back unlocked.

A thread of the harness may hold a lock when another thread calls ``os.fork()``; the copy has
only the forking thread, so that lock would never be released there and the copy's next
call would hang on it. Every ``ForkSafeLock`` is replaced by a fresh one in the copy, while
it is still single-threaded (``os.register_at_fork``). Only the forking thread's own critical
sections would be unsafe, and none of this package forks inside one.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType


class ForkSafeLock:
    """A ``threading.Lock`` (as a context manager) that is unlocked again after a fork."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _LOCKS.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()

    def _renew(self) -> None:
        self._lock = threading.Lock()


_LOCKS: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _renew_all() -> None:
    for lock in list(_LOCKS):
        lock._renew()


os.register_at_fork(after_in_child=_renew_all)
