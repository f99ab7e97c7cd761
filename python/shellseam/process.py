"""``ShellProcess``: the background handle returned by ``ShellExecutor.start``.

It carries no id and no owner (those are the task runtime's). Reads are consuming and merge
both streams into one delta (stdout text, then a ``[stderr]`` section); they stay valid
after settlement. Sandbox facts are stamped before completion is signalled: they are
derived from the settled process itself, so every observer of a settled handle sees them.
"""

from __future__ import annotations

import asyncio
import signal as _signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .checks import wait_timeout
from .render import render_delta, render_spawn_failure
from .types import ProcessStatus, ShellProcessRead, ShellResources, ShellSandboxInfo

if TYPE_CHECKING:
    from .service import ManagedProcess

#: Derives the sandbox facts of a settled process from its exit code and output tails.
SandboxStamp = Callable[[int | None, str, str], ShellSandboxInfo]
#: Derives the resources of a settled process (None while it runs).
ResourcesStamp = Callable[["ManagedProcess"], ShellResources | None]


def signal_name(signum: int | None) -> str | None:
    """``"SIGTERM"`` for 15; a bare number for signals Python does not name."""
    if signum is None:
        return None
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


class ShellProcess:
    """A background process handle (see SPEC §2)."""

    def __init__(
        self,
        *,
        proc: ManagedProcess | None,
        spawn_failure: str | None = None,
        sandbox_stamp: SandboxStamp | None = None,
        failed_sandbox: ShellSandboxInfo | None = None,
        resources_stamp: ResourcesStamp | None = None,
    ) -> None:
        self._proc = proc
        self._failure = spawn_failure
        self._failure_delivered = False
        self._stamp = sandbox_stamp
        self._failed_sandbox = failed_sandbox
        self._lock = threading.Lock()
        self._sandbox: ShellSandboxInfo | None = None
        self._resources_stamp = resources_stamp
        self._resources: ShellResources | None = None

    # -- state -------------------------------------------------------------------------

    @property
    def status(self) -> ProcessStatus:
        proc = self._proc
        if proc is None:
            return "killed"
        outcome = proc.outcome()
        if outcome is None:
            return "running"
        return "killed" if outcome.kill_requested or outcome.signal is not None else "completed"

    @property
    def exit_code(self) -> int | None:
        outcome = self._proc.outcome() if self._proc is not None else None
        return None if outcome is None else outcome.exit_code

    @property
    def signal(self) -> str | None:
        outcome = self._proc.outcome() if self._proc is not None else None
        return None if outcome is None else signal_name(outcome.signal)

    @property
    def sandbox(self) -> ShellSandboxInfo | None:
        if self._proc is None:
            return self._failed_sandbox
        if self._stamp is None:
            return None
        with self._lock:
            if self._sandbox is None:
                outcome = self._proc.outcome()
                if outcome is None:
                    return None
                collected = self._proc.collected()
                self._sandbox = self._stamp(outcome.exit_code, collected[0].text, collected[1].text)
            return self._sandbox

    @property
    def resources(self) -> ShellResources | None:
        """Containment and limit facts; None while running and for a spawn failure."""
        if self._proc is None or self._resources_stamp is None:
            return None
        with self._lock:
            if self._resources is None:
                self._resources = self._resources_stamp(self._proc)
            return self._resources

    # -- reading -----------------------------------------------------------------------

    def read_output(self) -> ShellProcessRead:
        """Output since the previous read (consuming); valid after settlement too."""
        if self._proc is None:
            with self._lock:
                first = not self._failure_delivered
                self._failure_delivered = True
            delta = render_spawn_failure(self._failure) if first and self._failure else ""
            return ShellProcessRead(delta=delta, lossy=False)
        out, err = self._proc.read()
        return ShellProcessRead(
            delta=render_delta(out.text, err.text),
            lossy=out.lossy or err.lossy,
            # A path is given for each stream that lost bytes, so that every lossy marker a
            # reader renders names a stream that really dropped something.
            stdout_spill_path=out.spill_path if out.lossy else None,
            stderr_spill_path=err.spill_path if err.lossy else None,
            stdout_spill_truncated=out.lossy and out.spill_truncated,
            stderr_spill_truncated=err.lossy and err.spill_truncated,
        )

    # -- control -----------------------------------------------------------------------

    def kill(self) -> bool:
        """Kills the group (SIGTERM, then SIGKILL after the grace); False once settled."""
        return self._proc.kill() if self._proc is not None else False

    async def wait(self) -> None:
        """Resolves when settled; never raises (cancellation aside)."""
        if self._proc is not None:
            await self._proc.wait_async()
        else:
            await asyncio.sleep(0)

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Blocks until settled or ``timeout`` seconds pass (None or infinity: no timeout);
        True when settled."""
        limit = wait_timeout(timeout)
        if self._proc is None:
            return True
        return self._proc.wait(limit)

    def add_done_callback(self, cb: Callable[[ShellProcess], None]) -> None:
        """Calls ``cb(self)`` once settled: at once if it is, else from the service's
        dispatcher thread (callbacks must be thread-safe)."""
        if self._proc is None:
            cb(self)
            return
        self._proc.add_done_callback(lambda: cb(self))

    def __repr__(self) -> str:
        pid = self._proc.pid if self._proc is not None else None
        return f"ShellProcess(pid={pid}, status={self.status!r})"
