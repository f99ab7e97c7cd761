"""The task runtime: ids, owners, reads, waits, kills and completion notices (SPEC §4).

Generic on purpose: it knows nothing about bash, only about handles with a read/kill/wait
surface (a ``ShellProcess`` is one). Each task belongs to an opaque owner token and is
invisible to every other owner: a foreign id answers exactly as an unknown one does.
Handles may settle on any thread (their done callbacks run on the supervisor's), so all
state is guarded by one lock and no handle method is called while it is held.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .render import render_no_such_task, render_notice

TaskStatus = Literal["running", "completed", "killed"]


class TaskOutput(Protocol):
    """One consuming read of a handle (``ShellProcessRead`` has this shape)."""

    @property
    def delta(self) -> str: ...
    @property
    def lossy(self) -> bool: ...
    @property
    def stdout_spill_path(self) -> str | None: ...
    @property
    def stderr_spill_path(self) -> str | None: ...


class TaskHandle(Protocol):
    """What the runtime needs from a task's handle (``ShellProcess`` has this shape).

    A handle that also offers ``add_done_callback(cb)`` gets its completion notice queued
    the moment it settles; without it, settlement is noticed by the next runtime call.
    """

    @property
    def status(self) -> TaskStatus: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> str | None: ...
    def read_output(self) -> TaskOutput: ...
    def kill(self) -> bool: ...
    def wait(self) -> Awaitable[None]: ...


class TaskNotFound(KeyError):
    """No task with this id is visible to the caller (unknown, foreign or disposed)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id

    def __str__(self) -> str:
        return render_no_such_task(self.task_id)


@dataclass(frozen=True)
class TaskRead:
    """A consuming read: the status observed first, then the output since the last read."""

    id: str
    status: TaskStatus
    exit_code: int | None
    signal: str | None
    delta: str
    lossy: bool
    stdout_spill_path: str | None = None
    stderr_spill_path: str | None = None
    # Not in SPEC: as on ``ShellProcessRead``, the spill file holds only the stream's head.
    stdout_spill_truncated: bool = False
    stderr_spill_truncated: bool = False


@dataclass(frozen=True)
class TaskInfo:
    """One line of ``TaskRuntime.list``."""

    id: str
    kind: str
    status: TaskStatus
    exit_code: int | None
    signal: str | None
    description: str


@dataclass(eq=False)
class _Task:
    id: str
    kind: str
    owner: str
    handle: TaskHandle
    description: str
    settled_status: TaskStatus | None = None
    # Once the owner has seen the settled task (a read or a delivered notice), no notice
    # for it is (re)delivered.
    reported: bool = False


@dataclass
class _Owner:
    tasks: dict[str, _Task] = field(default_factory=dict)
    pending_notices: list[str] = field(default_factory=list)


def _termination(handle: TaskHandle) -> tuple[TaskStatus, int | None, str | None]:
    """Status, exit code and signal, the status sampled first: codes only once settled."""
    status = handle.status
    if status == "running":
        return status, None, None
    return status, handle.exit_code, handle.signal


class TaskRuntime:
    """Registry of background tasks, fenced by owner token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[str, _Owner] = {}
        self._counters: dict[str, Iterator[int]] = {}
        self._disposed = False

    def start(self, kind: str, owner: str, handle: TaskHandle, description: str = "") -> str:
        """Register ``handle`` as a new task of ``owner`` and return its id ``<kind>-<n>``.

        A disposed runtime kills the handle (so nothing outlives the runtime unowned) and
        raises ``RuntimeError``.
        """
        if not kind:
            raise ValueError("task kind must be a non-empty string")
        with self._lock:
            task = None
            if not self._disposed:
                counter = self._counters.setdefault(kind, itertools.count(1))
                task = _Task(f"{kind}-{next(counter)}", kind, owner, handle, description)
                self._owners.setdefault(owner, _Owner()).tasks[task.id] = task
        if task is None:
            handle.kill()
            raise RuntimeError("task runtime is disposed")
        # Registered outside the lock: a handle that already settled may call back at once.
        add_done_callback: Callable[[Callable[[object], None]], None] | None = getattr(
            handle, "add_done_callback", None
        )
        if add_done_callback is not None:

            def on_done(_handle: object) -> None:
                self._observe(task)

            add_done_callback(on_done)
        return task.id

    def read(self, task_id: str, owner: str) -> TaskRead:
        """Consume the output since the previous read; raises ``TaskNotFound``.

        The status is sampled before the output, so a read reporting a settled task also
        carries the task's final output. Observing the settled task drops its notice.
        """
        task = self._get(task_id, owner)
        status, exit_code, signal = _termination(task.handle)
        out = task.handle.read_output()
        if status != "running":
            with self._lock:
                self._settle_locked(task, status)
                self._mark_reported_locked(task)
        return TaskRead(
            id=task.id,
            status=status,
            exit_code=exit_code,
            signal=signal,
            delta=out.delta,
            lossy=out.lossy,
            stdout_spill_path=out.stdout_spill_path,
            stderr_spill_path=out.stderr_spill_path,
            # Other kinds of handle may not say (the protocol predates these two).
            stdout_spill_truncated=bool(getattr(out, "stdout_spill_truncated", False)),
            stderr_spill_truncated=bool(getattr(out, "stderr_spill_truncated", False)),
        )

    async def wait(self, task_id: str, owner: str, timeout_ms: float | None = None) -> bool:
        """Wait until the task settles or ``timeout_ms`` passes (None: no limit); settled?"""
        task = self._get(task_id, owner)
        if self._observe(task):
            return True
        # Clamped (2**53 ms, ~285,000 years) so a huge int cannot overflow the float division.
        timeout_s = None if timeout_ms is None else min(max(timeout_ms, 0), 2**53) / 1000
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task.handle.wait(), timeout_s)
        return self._observe(task)

    def kill(self, task_id: str, owner: str) -> bool:
        """Kill the task; False when it had already settled. Raises ``TaskNotFound``."""
        return self._get(task_id, owner).handle.kill()

    def list(self, owner: str) -> list[TaskInfo]:
        """The owner's tasks in start order."""
        with self._lock:
            tasks = list(self._owners.get(owner, _Owner()).tasks.values())
        infos = []
        for task in tasks:
            status, exit_code, signal = _termination(task.handle)
            if status != "running":
                self._observe(task)
            infos.append(TaskInfo(task.id, task.kind, status, exit_code, signal, task.description))
        return infos

    def drain_notices(self, owner: str) -> builtins.list[str]:
        """Completion notices queued for ``owner`` since the last drain, each delivered once."""
        with self._lock:
            tasks = list(self._owners.get(owner, _Owner()).tasks.values())
        for task in tasks:
            self._observe(task)
        with self._lock:
            state = self._owners.get(owner)
            if state is None:
                return []
            notices = []
            for task_id in state.pending_notices:
                task = state.tasks[task_id]
                task.reported = True
                assert task.settled_status is not None
                notices.append(render_notice(task.id, task.settled_status))
            state.pending_notices.clear()
            return notices

    async def dispose_owner(self, owner: str) -> None:
        """Kill every task of ``owner``, await their settlement, then forget them."""
        with self._lock:
            state = self._owners.get(owner)
            tasks = [] if state is None else list(state.tasks.values())
        for task in tasks:
            task.handle.kill()
        await asyncio.gather(*(task.handle.wait() for task in tasks))
        with self._lock:
            state = self._owners.get(owner)
            if state is not None:
                for task in tasks:
                    state.tasks.pop(task.id, None)
                    if task.id in state.pending_notices:
                        state.pending_notices.remove(task.id)
                if not state.tasks:
                    del self._owners[owner]

    async def dispose(self) -> None:
        """Refuse new tasks, then kill and await every task of every owner."""
        with self._lock:
            self._disposed = True
            owners = list(self._owners)
        await asyncio.gather(*(self.dispose_owner(owner) for owner in owners))

    def _get(self, task_id: str, owner: str) -> _Task:
        with self._lock:
            state = self._owners.get(owner)
            task = None if state is None else state.tasks.get(task_id)
        if task is None:
            raise TaskNotFound(task_id)
        return task

    def _observe(self, task: _Task) -> bool:
        """Record the task's settlement if its handle has settled; returns settled?"""
        status = task.handle.status
        if status == "running":
            return False
        with self._lock:
            self._settle_locked(task, status)
        return True

    def _settle_locked(self, task: _Task, status: TaskStatus) -> None:
        if task.settled_status is not None:
            return
        task.settled_status = status
        state = self._owners.get(task.owner)
        if not task.reported and state is not None and state.tasks.get(task.id) is task:
            state.pending_notices.append(task.id)

    def _mark_reported_locked(self, task: _Task) -> None:
        task.reported = True
        state = self._owners.get(task.owner)
        if state is not None and task.id in state.pending_notices:
            state.pending_notices.remove(task.id)
