"""``LocalShellExecutor``: every call a fresh ``bash -c`` in its own process group.

This layer owns the bash-level duties of the seam (seed 003): request defaults and caps,
first-cause timeout/abort classification, the model-friendly terminal environment and the
environment order, and turning native outcomes into ``ShellRunResult``. Process groups,
draining, bounded collectors, spill files and kill escalation are the native core's.
"""

from __future__ import annotations

import fcntl
import os
import posix
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from .checks import (
    MAX_BYTES,
    MAX_TIMEOUT_MS,
    check_command,
    check_env,
    check_limits,
    check_policy,
    check_signal,
    check_spec,
    check_stdin,
    check_workdir,
    config_int,
    config_path,
    invalid,
    mark_checked,
    marked_values,
    positive_int,
    request_limits,
)
from .deadline import Cause, Deadline
from .errors import DISPOSED, INVALID_REQUEST, SANDBOX_UNAVAILABLE, ShellError
from .executor import ShellExecutor
from .limits import tighten
from .process import ShellProcess
from .service import (
    MAX_ARG_BYTES,
    ChildEnv,
    EnvBuilder,
    ManagedProcess,
    NativeError,
    Ruleset,
    ShellCall,
    ShellTemplate,
    SpawnArgs,
    SpecRunner,
    SubprocessService,
    default_service,
    native_error,
)
from .types import (
    ResourceLimits,
    SandboxMode,
    SandboxPolicy,
    ShellExecRequest,
    ShellExecSpec,
    ShellResources,
    ShellRunResult,
    ShellSandboxInfo,
    aborted_before_start,
)

ContainmentMode = Literal["auto", "session"]

#: An executor's service, its spawn settings for it, and its spec runner
#: (``SubprocessService.spec_runner``).
_Shell: TypeAlias = tuple[SubprocessService, ShellTemplate, SpecRunner]

#: The default ceilings: a fork bomb stops at 4096 processes instead of taking the host.
DEFAULT_LIMITS = ResourceLimits(max_processes=4096)

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

#: Credential-looking names removed from the inherited environment (case-insensitive globs).
DEFAULT_SCRUB_PATTERNS: tuple[str, ...] = (
    "*KEY*",
    "*SECRET*",
    "*TOKEN*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "*_PAT",
    "*_PWD",
)

#: Exact names never scrubbed although a default pattern matches them.
DEFAULT_ALLOW_ENV: tuple[str, ...] = (
    "TOKENIZERS_PARALLELISM",
    "KEYBOARD_LAYOUT",
    "PYTHON_KEYRING_BACKEND",
)


#: The steps of a foreground run the core takes over for a resolved spec: a subclass that
#: overrides one of them has its specs run the Python way.
_NATIVE_HOOKS = (
    "_child_env",
    "_shell_arg",
    "_shell_template",
    "_shell_call",
    "_call_setup",
    "_run_foreground",
)

#: The executor attributes ``run_shell``'s template is made of (see ``_shell_template``).
_TEMPLATE_SETTINGS = frozenset(
    {
        "max_output_bytes",
        "max_spill_bytes",
        "grace_ms",
        "containment",
        "_shell_program",
        "_shell_argv0",
        "_env",
    }
)
#: How bash runs a long command: it reads the script from fd 3 (a sealed memfd) and
#: evaluates it with fd 3 closed. `$0`, `$LINENO`, error messages ("bash: line N: …"),
#: `set -e` and exit codes read as with `bash -c <command>` (a script file or `source`
#: would name /dev/fd/3 in `$0`-style messages and BASH_SOURCE).
_LONG_COMMAND_STUB = b'eval "$(</dev/fd/3)" 3<&-'
#: The same for another POSIX shell (``shell=`` option), which lacks bash's ``$(<file)``.
_POSIX_LONG_COMMAND_STUB = b'eval "$(cat <&3)" 3<&-'


def _shell_path(shell: str) -> bytes:
    """The program ``shell`` names: an absolute path as is, a bare name from /bin, /usr/bin
    or ``$PATH``. Resolved once, when the executor is built."""
    if os.path.isabs(shell):
        candidates = [shell]
    else:
        candidates = [f"/bin/{shell}", f"/usr/bin/{shell}"]
        found = shutil.which(shell)
        if found is not None:
            candidates.append(found)
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.fsencode(candidate)
    raise ValueError(f"shell {shell!r} is not an executable program on this machine")


def _check_shell(shell: object) -> str:
    if not isinstance(shell, str):
        raise TypeError(f"shell must be a str, got {type(shell).__name__}")
    if not shell or "\0" in shell or ("/" in shell and not os.path.isabs(shell)):
        raise ValueError(f"shell must be a program name or an absolute path, got {shell!r}")
    return shell


try:
    _BASH = _shell_path("bash")
except ValueError:  # no bash here: every spawn fails with SPAWN_FAILED naming the path
    _BASH = b"/bin/bash"


class Confinement:
    """What one call needs beyond its command (built by ``_prepare``): the confinement
    (ruleset) the child applies, the call's own environment variables, an environment
    builder with extra drops, and a cleanup run once when the call settles."""

    __slots__ = ("_lock", "cleanup", "env", "env_builder", "ruleset")

    def __init__(
        self,
        ruleset: Ruleset | None = None,
        env: Sequence[tuple[bytes, bytes]] = (),
        env_builder: EnvBuilder | None = None,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self.ruleset = ruleset
        self.env = list(env)
        self.env_builder = env_builder
        self.cleanup = cleanup
        self._lock = threading.Lock()

    def settle(self) -> None:
        """Runs the cleanup (once)."""
        if self.cleanup is None:  # nothing to run (an unconfined call): no lock to take
            return
        with self._lock:
            cleanup, self.cleanup = self.cleanup, None
        if cleanup is not None:
            cleanup()


_UNCONFINED = Confinement()


def _names(value: object, name: str) -> tuple[str, ...]:
    """A sequence of str; a bare str is refused, never split into characters."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of str, got {type(value).__name__}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{name} entries must be str, got {type(item).__name__}")
        if not item or "\0" in item:
            raise ValueError(f"{name} entries must be non-empty without NUL, got {item!r}")
    return items


def _encoded(spec: ShellExecSpec) -> tuple[bytes, bytes]:
    """The call's stdin and command as bytes."""
    stdin = spec.stdin
    if not isinstance(stdin, bytes):
        stdin = stdin.encode() if isinstance(stdin, str) else b""
    try:
        return stdin, spec.command.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:  # a spec built by hand, past resolve's checks
        raise invalid(f"not encodable as UTF-8: {err.reason}") from None


def _script_memfd(command: bytes) -> int:
    """A sealed memfd holding a long command."""
    fd = os.memfd_create("shellseam-command", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(command)
        while view:
            view = view[os.write(fd, view) :]
        # A shell reading fd 3 itself (not through /dev/fd/3) starts at the shared offset.
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(
            fd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE,
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _pairs(env: Mapping[str, str] | Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    items = env.items() if isinstance(env, Mapping) else env
    return [(os.fsencode(k), os.fsencode(v)) for k, v in items]


def _resources(spec: ShellExecSpec, proc: ManagedProcess) -> ShellResources | None:
    """The resources of a settled process (None while it runs)."""
    return proc.shell_resources(spec.limits)


class LocalShellExecutor(ShellExecutor):
    """Runs each command as a fresh non-login ``bash -c`` with the harness's privileges.

    ``shell`` (not in SPEC, default ``"bash"``) names another POSIX shell to run as
    ``<shell> -c <command>``, by program name or absolute path; ``argv[0]`` is the value as
    given. The mini-swe-agent adapter uses ``"/bin/sh"``, as ``LocalEnvironment`` does.
    """

    sandbox_mode: SandboxMode | None = None
    #: The class confines nothing (``run_sync`` then skips the confinement hooks): true
    #: unless a subclass overrides one of them.
    _plain: bool = True
    #: The class prepares a foreground run this class's way (none of ``_NATIVE_HOOKS`` is
    #: overridden), which the core then does itself for a resolved spec
    #: (``SubprocessService.run_spec``).
    _native_specs: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        base = LocalShellExecutor
        cls._native_specs = all(getattr(cls, h) is getattr(base, h) for h in _NATIVE_HOOKS)
        cls._plain = cls._native_specs and all(
            getattr(cls, hook) is getattr(base, hook)
            for hook in ("_prepare", "_sandbox_info", "_result")
        )

    def __init__(
        self,
        *,
        cwd: str | None = None,
        timeout_ms: int = 120_000,
        max_timeout_ms: int = 600_000,
        max_output_bytes: int = 64_000,
        max_spill_bytes: int = 64 * 2**20,
        grace_ms: int = 3_000,
        scrub_patterns: Sequence[str] = DEFAULT_SCRUB_PATTERNS,
        allow_env: Sequence[str] = DEFAULT_ALLOW_ENV,
        managed_prefix: str = "DSH_",
        limits: ResourceLimits = DEFAULT_LIMITS,
        containment: ContainmentMode = "auto",
        service: SubprocessService | None = None,
        shell: str = "bash",
    ) -> None:
        for name, value, maximum in (
            ("timeout_ms", timeout_ms, MAX_TIMEOUT_MS),
            ("max_timeout_ms", max_timeout_ms, MAX_TIMEOUT_MS),
            ("max_output_bytes", max_output_bytes, MAX_BYTES),
            ("max_spill_bytes", max_spill_bytes, MAX_BYTES),
        ):
            config_int(value, name, minimum=1, maximum=maximum)
        config_int(grace_ms, "grace_ms", minimum=0, maximum=MAX_TIMEOUT_MS)
        if cwd is not None:
            config_path(cwd, "cwd")
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
        self.scrub_patterns = _names(scrub_patterns, "scrub_patterns")
        self.allow_env = _names(allow_env, "allow_env")
        if not isinstance(managed_prefix, str):
            raise TypeError(f"managed_prefix must be str, got {type(managed_prefix).__name__}")
        self.managed_prefix = managed_prefix
        if service is not None and not isinstance(service, SubprocessService):
            raise TypeError(f"service must be a SubprocessService, got {type(service).__name__}")
        self._service = service
        # Not in SPEC (which runs bash): front ends that must match another harness's shell
        # exactly, such as mini-swe-agent's LocalEnvironment (``/bin/sh -c``), name it here.
        # argv[0] is the value as given, so ``$0`` and the shell's own message prefix are
        # what ``Popen(cmd, shell=True)`` gives when it is "/bin/sh".
        self.shell = _check_shell(shell)
        self._shell_program = _BASH if shell == "bash" else _shell_path(shell)
        self._shell_argv0 = os.fsencode(shell)
        self._env = self._env_builder(())
        #: The settings ``run_shell`` takes from this executor, with the service they were
        #: made for; None once one of them changed (``__setattr__``).
        self._template: _Shell | None = None

    def _env_builder(
        self, drop_names: Sequence[bytes], fixed: Sequence[tuple[str, str]] = ()
    ) -> EnvBuilder:
        """Environment rules with extra dropped names and extra fixed variables (set after
        the terminal settings, before the call's own env, which wins)."""
        return EnvBuilder(
            list(self.scrub_patterns),
            self.managed_prefix,
            [*_STARTUP_FILE_VARS, *drop_names],
            _pairs([*TERMINAL_ENV, *fixed]),
            [os.fsencode(n) for n in self.allow_env],
        )

    @property
    def service(self) -> SubprocessService:
        """The service this executor spawns through (the process default when not given)."""
        return self._service if self._service is not None else default_service()

    # -- resolve -----------------------------------------------------------------------

    def resolve(self, request: ShellExecRequest) -> ShellExecSpec:
        if not isinstance(request, ShellExecRequest):
            raise invalid(f"expected a ShellExecRequest, got {type(request).__name__}")
        command = check_command(request.command)
        workdir = self.cwd if request.workdir is None else check_workdir(request.workdir)
        workdir = os.path.abspath(os.path.join(self.cwd, workdir))
        timeout_ms = self.timeout_ms if request.timeout_ms is None else request.timeout_ms
        timeout_ms = min(positive_int(timeout_ms, "timeout_ms"), self.max_timeout_ms)
        stdout_max = request.stdout_max_bytes
        stdout_max = self.max_output_bytes if stdout_max is None else stdout_max
        stdout_max = min(positive_int(stdout_max, "stdout_max_bytes"), self.max_spill_bytes)
        check_signal(request.signal)
        check_stdin(request.stdin)
        check_env(request.env, "env")
        check_env(request.managed_env, "managed_env")
        check_policy(request.sandbox_policy)
        asked = None if request.limits is None else request_limits(request.limits)
        spec = ShellExecSpec(
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
        return mark_checked(spec)

    def _stamp_policy(self, policy: SandboxPolicy | None) -> SandboxPolicy | None:
        """A non-sandboxing executor carries the request's policy through untouched."""
        return policy

    # -- sandbox hooks (overridden by SandboxShellExecutor) ------------------------------

    def _prepare(self, spec: ShellExecSpec) -> Confinement:
        """What a call needs beyond the command: nothing when nothing is confined."""
        return _UNCONFINED

    def _sandbox_info(
        self, spec: ShellExecSpec, exit_code: int | None, stdout_tail: str, stderr_tail: str
    ) -> ShellSandboxInfo | None:
        return None

    def _runner_failed_info(self, spec: ShellExecSpec) -> ShellSandboxInfo | None:
        return None

    # -- spawning ----------------------------------------------------------------------

    def _child_env(self, spec: ShellExecSpec, confinement: Confinement | None = None) -> ChildEnv:
        # posix.environ is the bytes dict behind os.environ (kept current by it); the
        # builder caches the filtered inherited layer until that dict changes. A confined
        # call's own variables (TMPDIR, caches) come before the caller's env, which wins.
        conf = confinement if confinement is not None else _UNCONFINED
        extra = _pairs(spec.env) if spec.env else []
        if conf.env:
            extra = [*conf.env, *extra]
        builder = conf.env_builder if conf.env_builder is not None else self._env
        return builder.build(
            posix.environ,
            extra or None,
            _pairs(spec.managed_env) if spec.managed_env else None,
        )

    def child_env(self, spec: ShellExecSpec) -> list[tuple[bytes, bytes]]:
        """The child's environment for ``spec``, in the SPEC's order (module docstring)."""
        conf = self._prepare(spec)
        try:
            return self._child_env(spec, conf).pairs()
        finally:
            conf.settle()

    def _spawn(self, spec: ShellExecSpec, stdout_cap: int) -> tuple[ManagedProcess, Confinement]:
        """Spawns the call; the caller settles the confinement when the call settles (a
        foreground call right after its wait, a background one from its done callback)."""
        conf, call, script_fd = self._spawn_call(spec, stdout_cap)
        try:
            return self.service.spawn(**call), conf
        except BaseException:
            conf.settle()
            raise
        finally:
            if script_fd is not None:
                os.close(script_fd)

    def _spawn_call(
        self, spec: ShellExecSpec, stdout_cap: int
    ) -> tuple[Confinement, SpawnArgs, int | None]:
        """The confinement and ``SubprocessService.spawn`` arguments of a call, and a long
        command's script fd, which the caller closes once the spawn is over."""
        stdin, command = _encoded(spec)
        conf = self._prepare(spec)
        script_fd = None
        try:
            arg, script_fd = self._shell_arg(command)
            call: SpawnArgs = {
                "program": self._shell_program,
                "argv": [self._shell_argv0, b"-c", arg],
                "cwd": spec.workdir,
                "env": self._child_env(spec, conf),
                "stdin": stdin,
                "stdout_cap": stdout_cap,
                "stderr_cap": self.max_output_bytes,
                "spill_cap": self.max_spill_bytes,
                "grace_ms": self.grace_ms,
                "ruleset": conf.ruleset,
                "script_fd": script_fd,
                "limits": spec.limits,
                "cgroup": self.containment == "auto",
            }
        except BaseException:
            if script_fd is not None:
                os.close(script_fd)
            conf.settle()
            raise
        return conf, call, script_fd

    def _call_setup(self, spec: ShellExecSpec) -> tuple[SubprocessService, Confinement]:
        """The service and the confinement of a call; the caller settles the confinement
        once the run is over. An unconfined call skips the confinement hooks: each Python
        call costs ~1-2 us here when it runs cold, right after a child."""
        service = self._service if self._service is not None else default_service()
        return service, (_UNCONFINED if self._plain else self._prepare(spec))

    def _shell_call(
        self,
        spec: ShellExecSpec,
        values: dict[str, Any],
        service: SubprocessService,
        conf: Confinement,
    ) -> tuple[ShellCall, int | None]:
        """The ``run_shell``/``run_shell_async`` arguments of a foreground call
        (``values``: the checked spec's fields), and a long command's script fd, which the
        caller closes once the run is over; on failure the confinement is settled."""
        script_fd = None
        try:
            stdin, command = _encoded(spec)
            arg, script_fd = self._shell_arg(command)
            call: ShellCall = (
                self._shell_template(service),
                arg,
                values["workdir"],
                self._child_env(spec, conf),
                stdin,
                values["stdout_max_bytes"],
                conf.ruleset,
                values["limits"],
                values["timeout_ms"],
                script_fd,
            )
        except BaseException:
            conf.settle()
            if script_fd is not None:
                os.close(script_fd)
            raise
        return call, script_fd

    def _run_foreground(self, spec: ShellExecSpec, values: dict[str, Any]) -> ShellRunResult:
        """Spawns, waits and collects the call in one native call, settles its confinement
        and completes the result with the sandbox facts; ``values``: the checked spec's
        fields. A confined spec as ``resolve`` made it goes to the core as it is
        (``SubprocessService.run_spec``); an unconfined one is here because it could not
        (``run_sync`` tried), so it and any other go through ``run_shell``."""
        service, conf = self._call_setup(spec)
        plain = self._plain
        script_fd = None
        try:
            result = None
            if not plain and self._native_specs:
                builder = conf.env_builder if conf.env_builder is not None else self._env
                template = self._shell_template(service)
                result = service.run_spec(template, builder, spec, conf.ruleset, conf.env)
            if result is None:
                call, script_fd = self._shell_call(spec, values, service, conf)
                result = service.run_shell(*call)
        finally:
            if not plain:
                conf.settle()
            if script_fd is not None:
                os.close(script_fd)
        return result if plain else self._result(spec, result)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in _TEMPLATE_SETTINGS:
            # The template is made again, from the new value, at the next run.
            object.__setattr__(self, "_template", None)

    def _shell(self, service: SubprocessService) -> _Shell:
        """The executor's fixed spawn settings for ``run_shell`` with ``service``, and its
        spec runner, made again when the service is another or a setting changed
        (``__setattr__``)."""
        shell = self._template
        if shell is None or shell[0] is not service:
            made = service.shell_template(
                self._shell_program,
                self._shell_argv0,
                self.max_output_bytes,
                self.max_spill_bytes,
                self.grace_ms,
                self.containment == "auto",
            )
            shell = self._template = (service, made, service.spec_runner(made, self._env))
        return shell

    def _shell_template(self, service: SubprocessService) -> ShellTemplate:
        return self._shell(service)[1]

    def _shell_arg(self, command: bytes) -> tuple[bytes, int | None]:
        """The shell's ``-c`` argument, and the sealed memfd it reads a command from that is
        beyond one argument's limit (the caller closes it once spawned)."""
        if len(command) <= MAX_ARG_BYTES:
            return command, None
        stub = _LONG_COMMAND_STUB if self.shell == "bash" else _POSIX_LONG_COMMAND_STUB
        return stub, _script_memfd(command)

    def _result(self, spec: ShellExecSpec, result: ShellRunResult | None) -> ShellRunResult:
        """Completes a settled process's native result with the sandbox facts."""
        assert result is not None, "a settled process has a result"
        info = self._sandbox_info(spec, result.exit_code, result.stdout.text, result.stderr.text)
        if info is not None:
            # The record is new and not yet seen by anyone: filling in its one field the
            # core leaves to the executor is part of building it.
            object.__setattr__(result, "sandbox", info)
        return result

    def _aborted_before_start(self, spec: ShellExecSpec) -> ShellRunResult:
        if self.service.disposed:
            raise ShellError(DISPOSED, "the subprocess service has been disposed")
        return aborted_before_start(spec)

    # -- foreground --------------------------------------------------------------------

    def run_sync(self, spec: ShellExecSpec) -> ShellRunResult:
        if self._plain:
            # The hot path: the core reads a spec as resolve made it itself, in the one
            # native call that runs it (no Python step of the call runs cold after a child,
            # not even a method of the service's: the runner is that call, bound).
            service = self._service if self._service is not None else default_service()
            shell = self._template
            if shell is None or shell[0] is not service:
                shell = self._shell(service)
            try:
                done = shell[2](spec)
            except NativeError as err:
                raise native_error(err, spec.workdir) from None
            if done is not None:
                return done
        values = marked_values(spec)  # a spec as resolve made it needs no new check
        if values is None:
            values = vars(check_spec(spec))
        signal = values["signal"]
        if signal is None:
            # One native call spawns, waits, kills on the timeout and builds the result
            # records.
            return self._run_foreground(spec, values)
        if signal.aborted:
            return self._aborted_before_start(spec)
        proc, conf = self._spawn(spec, spec.stdout_max_bytes)
        result: ShellRunResult | None
        try:
            deadline = Deadline(proc.kill)
            remove = signal.add_listener(deadline.on_abort)
            try:
                if not proc.wait(spec.timeout_ms / 1000):
                    deadline.on_timeout()
                    proc.wait(None)
            finally:
                remove()
            result = self._settled(spec, proc, deadline.cause)
        except BaseException:
            # KeyboardInterrupt while waiting: nothing may be left running.
            proc.kill()
            proc.wait(None)
            raise
        finally:
            conf.settle()
        return self._result(spec, result)

    def _settled(
        self, spec: ShellExecSpec, proc: ManagedProcess, cause: Cause | None
    ) -> ShellRunResult | None:
        return proc.shell_result(
            timed_out=cause == "timeout",
            aborted=cause == "abort",
            timeout_ms=spec.timeout_ms,
            limits=spec.limits,
        )

    async def run(self, spec: ShellExecSpec) -> ShellRunResult:
        values = marked_values(spec)  # a spec as resolve made it needs no new check
        if values is None:
            values = vars(check_spec(spec))
        signal = values["signal"]
        if signal is not None and signal.aborted:
            return self._aborted_before_start(spec)
        # One native call queues the run, the supervisor keeps its timeout, and the loop is
        # woken once, when it is over.
        service, conf = self._call_setup(spec)
        call, script_fd = self._shell_call(spec, values, service, conf)
        plain = self._plain
        try:
            result = await service.run_shell_async(*call, signal, None if plain else conf.settle)
        finally:
            if script_fd is not None:
                os.close(script_fd)
        return result if plain else self._result(spec, result)

    # -- background --------------------------------------------------------------------

    def start(self, spec: ShellExecSpec) -> ShellProcess:
        check_spec(spec)
        try:
            proc, conf = self._spawn(spec, self.max_output_bytes)
        except ShellError as err:
            # A refused request is the caller's error, raised as run raises it (SPEC §2);
            # only the spawn itself failing settles the handle.
            if err.code in (DISPOSED, INVALID_REQUEST):
                raise
            return ShellProcess(
                proc=None,
                spawn_failure=err.reason,
                failed_sandbox=(
                    self._runner_failed_info(spec) if err.code == SANDBOX_UNAVAILABLE else None
                ),
            )
        stamp = None
        if self.sandbox_mode is not None:

            def stamp(exit_code: int | None, stdout: str, stderr: str) -> ShellSandboxInfo:
                info = self._sandbox_info(spec, exit_code, stdout, stderr)
                assert info is not None
                return info

        if conf.cleanup is not None:
            proc.add_done_callback(conf.settle)
        return ShellProcess(
            proc=proc, sandbox_stamp=stamp, resources_stamp=lambda p: _resources(spec, p)
        )
