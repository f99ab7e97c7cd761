"""Test doubles for the tool layer: a scriptable background handle and a recording executor.

``FakeProcess`` has the ``ShellProcess`` surface and settles when a test says so (from any
thread, as the native supervisor would). ``FakeExecutor`` is a real ``ShellExecutor``
subclass that records every request and spec it receives, so tests can pin exactly what
the bash tool forwards (and what it must never forward).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from shellseam.errors import INVALID_REQUEST, ShellError
from shellseam.executor import ShellExecutor
from shellseam.types import (
    CollectedOutput,
    ProcessStatus,
    ResourceLimits,
    SandboxMode,
    ShellExecRequest,
    ShellExecSpec,
    ShellProcessRead,
    ShellRunResult,
    ShellSandboxInfo,
)


class FakeProcess:
    """A background handle whose output and settlement are driven by the test."""

    def __init__(self, *, kill_settles: bool = True) -> None:
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self.status: ProcessStatus = "running"
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.sandbox: ShellSandboxInfo | None = None
        self.kill_calls = 0
        self._kill_settles = kill_settles
        self._kill_requested = False
        self._stdout = ""
        self._stderr = ""
        self._lossy = False
        self._spill: tuple[str | None, str | None] = (None, None)
        self._callbacks: list[Callable[[FakeProcess], None]] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def feed(self, stdout: str = "", stderr: str = "") -> None:
        with self._lock:
            self._stdout += stdout
            self._stderr += stderr

    def drop(self, stdout_spill: str | None, stderr_spill: str | None) -> None:
        """Pretend unread bytes were dropped from memory."""
        with self._lock:
            self._lossy = True
            self._spill = (stdout_spill, stderr_spill)

    def read_output(self) -> ShellProcessRead:
        with self._lock:
            delta = self._stdout
            if self._stderr:
                delta += "\n[stderr]\n" + self._stderr
            read = ShellProcessRead(delta, self._lossy, *self._spill)
            self._stdout = self._stderr = ""
            self._lossy = False
            return read

    def finish(
        self, exit_code: int | None = 0, signal: str | None = None, killed: bool = False
    ) -> None:
        """Settle: ``completed`` unless killed, a kill was requested or a signal ended it."""
        with self._lock:
            if self.status != "running":
                return
            self.exit_code = exit_code
            self.signal = signal
            killed = killed or self._kill_requested or signal is not None
            self.status = "killed" if killed else "completed"
            callbacks, self._callbacks = self._callbacks, []
            waiters, self._waiters = self._waiters, []
        self._settled.set()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut)
        for cb in callbacks:
            cb(self)

    def finish_later(self, delay_s: float, **kw: object) -> threading.Thread:
        """Settle from another thread after ``delay_s``, like the native supervisor."""

        def run() -> None:
            threading.Event().wait(delay_s)
            self.finish(**kw)  # type: ignore[arg-type]

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def kill(self) -> bool:
        with self._lock:
            self.kill_calls += 1
            if self.status != "running" or self._kill_requested:
                return False
            self._kill_requested = True
        if self._kill_settles:
            self.finish(exit_code=None, signal="SIGTERM")
        return True

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self.status == "running":
                self._waiters.append((loop, fut))
            else:
                fut.set_result(None)
        try:
            await fut
        finally:
            with self._lock:
                if (loop, fut) in self._waiters:
                    self._waiters.remove((loop, fut))

    def wait_sync(self, timeout: float | None = None) -> bool:
        return self._settled.wait(timeout)

    def add_done_callback(self, cb: Callable[[FakeProcess], None]) -> None:
        with self._lock:
            if self.status == "running":
                self._callbacks.append(cb)
                return
        cb(self)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def collected(text: str = "", **kw: object) -> CollectedOutput:
    """A stream that produced ``text``; keywords override the other fields."""
    fields: dict[str, object] = {
        "text": text,
        "truncated": False,
        "spill_path": None,
        "total_bytes": len(text.encode()),
        "spill_truncated": False,
    }
    fields.update(kw)
    return CollectedOutput(**fields)  # type: ignore[arg-type]


def run_result(
    stdout: str | CollectedOutput = "",
    stderr: str | CollectedOutput = "",
    exit_code: int | None = 0,
    **kw: object,
) -> ShellRunResult:
    """A finished run; plain strings become untruncated streams, keywords override."""
    fields: dict[str, object] = {
        "exit_code": exit_code,
        "signal": None,
        "timed_out": False,
        "aborted": False,
        "timeout_ms": 120_000,
        "stdout": collected(stdout) if isinstance(stdout, str) else stdout,
        "stderr": collected(stderr) if isinstance(stderr, str) else stderr,
        "duration_ms": 1.5,
    }
    fields.update(kw)
    return ShellRunResult(**fields)  # type: ignore[arg-type]


@dataclass
class FakeExecutor(ShellExecutor):
    """Records what it is given; answers with a scripted result or error."""

    cwd: str = "/fake/executor/cwd"
    sandbox_mode: SandboxMode | None = None
    result: ShellRunResult | Callable[[ShellExecSpec], ShellRunResult] = field(
        default_factory=run_result
    )
    run_error: ShellError | None = None
    start_error: ShellError | None = None
    requests: list[ShellExecRequest] = field(default_factory=list)
    specs: list[ShellExecSpec] = field(default_factory=list)
    started: list[FakeProcess] = field(default_factory=list)

    def resolve(self, request: ShellExecRequest) -> ShellExecSpec:
        self.requests.append(request)
        if not request.command.strip() or "\0" in request.command:
            raise ShellError(INVALID_REQUEST, "command must be a non-empty string without NUL")
        timeout_ms = 120_000 if request.timeout_ms is None else request.timeout_ms
        if not isinstance(timeout_ms, int) or timeout_ms <= 0:
            raise ShellError(INVALID_REQUEST, f"timeout_ms must be a positive int: {timeout_ms}")
        return ShellExecSpec(
            command=request.command,
            workdir=os.path.join(self.cwd, request.workdir or ""),
            timeout_ms=min(timeout_ms, 600_000),
            stdout_max_bytes=request.stdout_max_bytes or 64_000,
            signal=request.signal,
            stdin=request.stdin,
            env=request.env,
            managed_env=request.managed_env,
            sandbox_policy=request.sandbox_policy,
            limits=request.limits or ResourceLimits(),
        )

    async def run(self, spec: ShellExecSpec) -> ShellRunResult:
        return self.run_sync(spec)

    def run_sync(self, spec: ShellExecSpec) -> ShellRunResult:
        self.specs.append(spec)
        if self.run_error is not None:
            raise self.run_error
        if spec.signal is not None and spec.signal.aborted:
            return run_result(exit_code=None, aborted=True, timeout_ms=spec.timeout_ms)
        return self.result(spec) if callable(self.result) else self.result

    def start(self, spec: ShellExecSpec) -> FakeProcess:  # type: ignore[override]
        self.specs.append(spec)
        if self.start_error is not None:
            raise self.start_error
        process = FakeProcess()
        self.started.append(process)
        return process
