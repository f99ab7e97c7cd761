"""``LocalShellExecutor``: every call a fresh ``bash -c`` in its own process group.

This layer owns the bash-level duties of the seam (seed 003): request defaults and caps,
first-cause timeout/abort classification, the model-friendly terminal environment and the
environment order, and turning native outcomes into ``ShellRunResult``. Process groups,
draining, bounded collectors, spill files and kill escalation are the native core's.
"""

from __future__ import annotations

import asyncio
import os
import posix
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from . import _core
from .abort import AbortSignal
from .errors import DISPOSED, INVALID_REQUEST, ShellError
from .limits import build_resources, check_limits, request_limits, tighten
from .executor import ShellExecutor
from .process import ShellProcess, signal_name
from .service import SubprocessService, default_service
from .types import (
    CollectedOutput,
    ResourceLimits,
    ShellResources,
    SandboxMode,
    SandboxPolicy,
    ShellExecRequest,
    ShellExecSpec,
    ShellRunResult,
    ShellSandboxInfo,
)

#: Settings that keep pagers and colour codes out of a model-read result (Codex's set).
TERMINAL_ENV: tuple[tuple[str, str], ...] = (
    ("NO_COLOR", "1"),
    ("TERM", "dumb"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GIT_TERMINAL_PROMPT", "0"),
)

#: Ambient variables that would make a non-interactive bash read a startup file.
_STARTUP_FILE_VARS = [b"BASH_ENV", b"ENV"]

Cause = Literal["timeout", "abort"]
ContainmentMode = Literal["auto", "session"]

#: The default ceilings: a fork bomb stops at 4096 processes instead of taking the host.
DEFAULT_LIMITS = ResourceLimits(max_processes=4096)


def _bash_path() -> bytes:
    for candidate in ("/bin/bash", "/usr/bin/bash"):
        if os.access(candidate, os.X_OK):
            return os.fsencode(candidate)
    found = shutil.which("bash")
    return os.fsencode(found or "/bin/bash")


_BASH = _bash_path()


class _FirstCause:
    """The fused deadline of one run: the first of timeout and abort kills the process and
    is the only cause reported; later causes are ignored."""

    __slots__ = ("_lock", "_proc", "cause")

    def __init__(self, proc: _core.Proc) -> None:
        self._lock = threading.Lock()
        self._proc = proc
        self.cause: Cause | None = None

    def fire(self, cause: Cause) -> None:
        with self._lock:
            if self.cause is not None:
                return
            self.cause = cause
        self._proc.kill()

    def on_timeout(self) -> None:
        self.fire("timeout")

    def on_abort(self) -> None:
        self.fire("abort")

    def watch(self, signal: AbortSignal | None) -> Callable[[], None]:
        """Listens to the caller's signal; returns the remover."""
        return signal.add_listener(self.on_abort) if signal is not None else _nothing


def _nothing() -> None:
    return None


def _invalid(reason: str) -> ShellError:
    return ShellError(INVALID_REQUEST, reason)


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _invalid(f"{name} must be a positive integer, got {value!r}")
    return value


def _check_text(value: str, name: str) -> None:
    """Text must be encodable: a lone surrogate (valid JSON, invalid UTF-8) is refused here
    instead of failing at spawn."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"{name} is not valid UTF-8 (it contains a lone surrogate)") from None


def _check_env(env: Mapping[str, str] | None, name: str) -> None:
    if env is None:
        return
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise _invalid(f"{name} keys and values must be strings")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise _invalid(f"{name} has an invalid entry {key!r}")
        _check_text(key, name)
        _check_text(value, name)


def _pairs(env: Mapping[str, str] | Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    items = env.items() if isinstance(env, Mapping) else env
    return [(os.fsencode(k), os.fsencode(v)) for k, v in items]


def _collected(raw: tuple[str, bool, str | None, int, bool]) -> CollectedOutput:
    text, truncated, spill_path, total_bytes, spill_truncated = raw
    return CollectedOutput(text, truncated, spill_path, total_bytes, spill_truncated)


_EMPTY = CollectedOutput(
    text="", truncated=False, spill_path=None, total_bytes=0, spill_truncated=False
)


def _resources_stamp(spec: ShellExecSpec) -> Callable[[_core.Proc], ShellResources | None]:
    """Derives a settled background process's resources from the core's facts."""

    def stamp(proc: _core.Proc) -> ShellResources | None:
        outcome = proc.outcome()
        if outcome is None:
            return None
        exit_code, signum, _ms, _left, _kill, user_ms, sys_ms, _rss = outcome
        return build_resources(
            spec.limits,
            proc.resources(),
            exit_code=exit_code,
            signum=signum,
            stderr_tail=proc.collected()[1][0],
            rusage_cpu_ms=user_ms + sys_ms,
        )

    return stamp


class LocalShellExecutor(ShellExecutor):
    """Runs each command as a fresh non-login ``bash -c`` with the harness's privileges."""

    sandbox_mode: SandboxMode | None = None

    def __init__(
        self,
        *,
        cwd: str | None = None,
        timeout_ms: int = 120_000,
        max_timeout_ms: int = 600_000,
        max_output_bytes: int = 64_000,
        max_spill_bytes: int = 64 * 2**20,
        grace_ms: int = 3_000,
        scrub_patterns: Sequence[str] = ("*KEY*", "*SECRET*", "*TOKEN*"),
        managed_prefix: str = "DSH_",
        limits: ResourceLimits = DEFAULT_LIMITS,
        containment: ContainmentMode = "auto",
        service: SubprocessService | None = None,
    ) -> None:
        for name, value in (
            ("timeout_ms", timeout_ms),
            ("max_timeout_ms", max_timeout_ms),
            ("max_output_bytes", max_output_bytes),
            ("max_spill_bytes", max_spill_bytes),
        ):
            _positive_int(value, name)
        if isinstance(grace_ms, bool) or not isinstance(grace_ms, int) or grace_ms < 0:
            raise _invalid(f"grace_ms must be a non-negative integer, got {grace_ms!r}")
        self.limits = check_limits(limits, where="limits")
        if containment not in ("auto", "session"):
            raise ValueError(f'containment must be "auto" or "session", got {containment!r}')
        self.containment: ContainmentMode = containment
        self.cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        self.timeout_ms = timeout_ms
        self.max_timeout_ms = max_timeout_ms
        self.max_output_bytes = max_output_bytes
        self.max_spill_bytes = max_spill_bytes
        self.grace_ms = grace_ms
        self.scrub_patterns = tuple(scrub_patterns)
        self.managed_prefix = managed_prefix
        self._service = service
        self._env = _core.EnvBuilder(
            list(self.scrub_patterns), managed_prefix, _STARTUP_FILE_VARS, _pairs(TERMINAL_ENV)
        )

    @property
    def service(self) -> SubprocessService:
        """The service this executor spawns through (the process default when not given)."""
        return self._service if self._service is not None else default_service()

    # -- resolve -----------------------------------------------------------------------

    def resolve(self, request: ShellExecRequest) -> ShellExecSpec:
        command = request.command
        if not isinstance(command, str) or not command.strip():
            raise _invalid("command must be a non-empty string")
        if "\0" in command:
            raise _invalid("command contains a NUL byte")
        _check_text(command, "command")
        workdir = request.workdir
        if workdir is None:
            workdir = self.cwd
        elif not isinstance(workdir, str) or not workdir or "\0" in workdir:
            raise _invalid(f"workdir must be a non-empty path, got {workdir!r}")
        else:
            _check_text(workdir, "workdir")
        workdir = os.path.abspath(os.path.join(self.cwd, workdir))
        timeout_ms = self.timeout_ms if request.timeout_ms is None else request.timeout_ms
        timeout_ms = min(_positive_int(timeout_ms, "timeout_ms"), self.max_timeout_ms)
        stdout_max = request.stdout_max_bytes
        stdout_max = self.max_output_bytes if stdout_max is None else stdout_max
        stdout_max = min(_positive_int(stdout_max, "stdout_max_bytes"), self.max_spill_bytes)
        if request.stdin is not None and not isinstance(request.stdin, (str, bytes)):
            raise _invalid("stdin must be str or bytes")
        if isinstance(request.stdin, str):
            _check_text(request.stdin, "stdin")
        _check_env(request.env, "env")
        _check_env(request.managed_env, "managed_env")
        asked = None if request.limits is None else request_limits(request.limits)
        return ShellExecSpec(
            command=command,
            workdir=workdir,
            timeout_ms=timeout_ms,
            stdout_max_bytes=stdout_max,
            signal=request.signal,
            stdin=request.stdin,
            env=request.env,
            managed_env=request.managed_env,
            sandbox_policy=self._stamp_policy(request.sandbox_policy),
            limits=tighten(self.limits, asked),
        )

    def _stamp_policy(self, policy: SandboxPolicy | None) -> SandboxPolicy | None:
        """A non-sandboxing executor carries the request's policy through untouched."""
        return policy

    # -- sandbox hooks (overridden by SandboxShellExecutor) ------------------------------

    def _ruleset(self, spec: ShellExecSpec) -> _core.Ruleset | None:
        return None

    def _sandbox_info(
        self, spec: ShellExecSpec, exit_code: int | None, stderr_tail: str
    ) -> ShellSandboxInfo | None:
        return None

    def _runner_failed_info(self, spec: ShellExecSpec) -> ShellSandboxInfo | None:
        return None

    # -- spawning ----------------------------------------------------------------------

    def _child_env(self, spec: ShellExecSpec) -> _core.Env:
        # posix.environ is the bytes dict behind os.environ (kept current by it); the
        # builder caches the filtered inherited layer until that dict changes.
        return self._env.build(
            posix.environ,
            _pairs(spec.env) if spec.env else None,
            _pairs(spec.managed_env) if spec.managed_env else None,
        )

    def child_env(self, spec: ShellExecSpec) -> list[tuple[bytes, bytes]]:
        """The child's environment for ``spec``, in the SPEC's order (module docstring)."""
        return self._child_env(spec).pairs()

    def _spawn(self, spec: ShellExecSpec, stdout_cap: int) -> _core.Proc:
        ruleset = self._ruleset(spec)
        try:
            stdin = spec.stdin.encode() if isinstance(spec.stdin, str) else (spec.stdin or b"")
            command = spec.command.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as err:  # a spec built by hand, past resolve's checks
            raise _invalid(f"not encodable as UTF-8: {err.reason}") from None
        return self.service.spawn(
            program=_BASH,
            argv=[b"bash", b"-c", command],
            cwd=spec.workdir,
            env=self._child_env(spec),
            stdin=stdin,
            stdout_cap=stdout_cap,
            stderr_cap=self.max_output_bytes,
            spill_cap=self.max_spill_bytes,
            grace_ms=self.grace_ms,
            ruleset=ruleset,
            limits=request_limits(spec.limits),
            cgroup=self.containment == "auto",
        )

    def _result(self, spec: ShellExecSpec, proc: _core.Proc, cause: Cause | None) -> ShellRunResult:
        finished = proc.result()
        assert finished is not None, "a result is built only for a finished process"
        (exit_code, signum, duration_ms, leftover, _, user_ms, sys_ms, _), out, err = finished
        stderr = _collected(err)
        return ShellRunResult(
            exit_code=exit_code,
            signal=signal_name(signum),
            timed_out=cause == "timeout",
            aborted=cause == "abort",
            timeout_ms=spec.timeout_ms,
            stdout=_collected(out),
            stderr=stderr,
            duration_ms=duration_ms,
            leftover_killed=leftover,
            sandbox=self._sandbox_info(spec, exit_code, stderr.text),
            resources=build_resources(
                spec.limits,
                proc.resources(),
                exit_code=exit_code,
                signum=signum,
                stderr_tail=stderr.text,
                rusage_cpu_ms=user_ms + sys_ms,
            ),
        )

    def _aborted_before_start(self, spec: ShellExecSpec) -> ShellRunResult:
        if self.service.disposed:
            raise ShellError(DISPOSED, "the subprocess service has been disposed")
        return ShellRunResult(
            exit_code=None,
            signal=None,
            timed_out=False,
            aborted=True,
            timeout_ms=spec.timeout_ms,
            stdout=_EMPTY,
            stderr=_EMPTY,
            duration_ms=0.0,
        )

    # -- foreground --------------------------------------------------------------------

    def run_sync(self, spec: ShellExecSpec) -> ShellRunResult:
        if spec.signal is not None and spec.signal.aborted:
            return self._aborted_before_start(spec)
        proc = self._spawn(spec, spec.stdout_max_bytes)
        first = _FirstCause(proc)
        remove = first.watch(spec.signal)
        try:
            if not proc.wait(spec.timeout_ms / 1000):
                first.on_timeout()
                proc.wait(None)
        except BaseException:
            # KeyboardInterrupt while waiting: nothing may be left running.
            proc.kill()
            proc.wait(None)
            raise
        finally:
            remove()
        return self._result(spec, proc, first.cause)

    async def run(self, spec: ShellExecSpec) -> ShellRunResult:
        if spec.signal is not None and spec.signal.aborted:
            return self._aborted_before_start(spec)
        proc = self._spawn(spec, spec.stdout_max_bytes)
        first = _FirstCause(proc)
        timer = asyncio.get_running_loop().call_later(spec.timeout_ms / 1000, first.on_timeout)
        remove = first.watch(spec.signal)
        service = self.service
        try:
            await service.wait_async(proc)
        except asyncio.CancelledError:
            proc.kill()
            while not proc.done:
                try:
                    await service.wait_async(proc)
                except asyncio.CancelledError:
                    continue
            raise
        finally:
            timer.cancel()
            remove()
        return self._result(spec, proc, first.cause)

    # -- background --------------------------------------------------------------------

    def start(self, spec: ShellExecSpec) -> ShellProcess:
        service = self.service
        try:
            proc = self._spawn(spec, self.max_output_bytes)
        except ShellError as err:
            if err.code == "DISPOSED":
                raise
            return ShellProcess(
                service=service,
                proc=None,
                spawn_failure=err.reason,
                failed_sandbox=(
                    self._runner_failed_info(spec) if err.code == "SANDBOX_UNAVAILABLE" else None
                ),
            )
        stamp = None
        if self.sandbox_mode is not None:

            def stamp(exit_code: int | None, stderr_tail: str) -> ShellSandboxInfo:
                info = self._sandbox_info(spec, exit_code, stderr_tail)
                assert info is not None
                return info

        return ShellProcess(
            service=service, proc=proc, sandbox_stamp=stamp, resources_stamp=_resources_stamp(spec)
        )
