"""The subprocess service: owner of the native supervisor and of every running process.

This is the one module that talks to the native core (``shellseam._core``): everything
above it holds a ``ManagedProcess`` (or the opaque environment and ruleset types named
here) and speaks the SPEC's vocabulary.

Executors share one service (a default one per process when none is given), so a
background process survives its executor being replaced; ``dispose()`` kills (with
escalation) and reaps everything still running. Waiting is event-driven without threads
per waiter: an asyncio loop watches one eventfd per loop, and done callbacks are fanned out
by at most one dispatcher thread per service.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import itertools
import logging
import os
import posix
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Required, TypeAlias, TypedDict, Unpack, cast

from . import _core
from ._forksafe import ForkSafeLock
from .abort import AbortSignal
from .checks import (
    CHECKED_FIELDS,
    CHECKED_MARK,
    MAX_BYTES,
    MAX_TIMEOUT_MS,
    config_bool,
    config_int,
    config_path,
)
from .errors import (
    DISPOSED,
    INVALID_REQUEST,
    SANDBOX_UNAVAILABLE,
    SPAWN_FAILED,
    ShellError,
    ShellErrorCode,
)
from .types import (
    CollectedOutput,
    ResourceLimits,
    ShellExecSpec,
    ShellResources,
    ShellRunResult,
)

_log = logging.getLogger("shellseam")

#: The native records a managed process reports (frozen, named fields).
Outcome: TypeAlias = _core.Outcome
Collected: TypeAlias = _core.Collected
ReadDelta: TypeAlias = _core.ReadDelta
Finished: TypeAlias = _core.Finished
#: A prepared child environment, the rules that build one, and a prepared Landlock ruleset.
ChildEnv: TypeAlias = _core.Env
EnvBuilder: TypeAlias = _core.EnvBuilder
Ruleset: TypeAlias = _core.Ruleset
RootCheck: TypeAlias = _core.RootCheck
#: A failure of the core (``native_error`` turns it into a ``ShellError``).
NativeError: TypeAlias = _core.NativeError
#: ``run_spec`` with an executor's template and environment rules bound (``spec_runner``).
SpecRunner: TypeAlias = Callable[[ShellExecSpec], ShellRunResult | None]
#: A sandboxing executor's prepared call of one policy (``SubprocessService.confined_runner``).
ConfinedCall: TypeAlias = _core.ConfinedCall
ShellTemplate: TypeAlias = _core.ShellTemplate
#: ``SubprocessService.run_shell``'s and ``run_shell_async``'s arguments for one call, in their
#: order: template, command, working directory, environment, stdin, stdout cap, ruleset,
#: limits, timeout, and a long command's script fd.
ShellCall: TypeAlias = tuple[
    ShellTemplate, bytes, str, ChildEnv, bytes, int, Ruleset | None, ResourceLimits, int, int | None
]
#: Containment facts of a settled call, and of the host.
NativeResources: TypeAlias = _core.Resources
HostContainment: TypeAlias = _core.ContainmentFacts


class SpawnArgs(TypedDict, total=False):
    """What ``SubprocessService.spawn`` takes: one process group's
    program, argv, working directory, environment, stdin, caps, grace and containment."""

    program: Required[bytes]
    argv: Required[Sequence[bytes]]
    cwd: Required[str]
    env: Required[ChildEnv]
    stdin: Required[bytes]
    stdout_cap: Required[int]
    stderr_cap: Required[int]
    spill_cap: Required[int]
    grace_ms: Required[int]
    ruleset: Ruleset | None
    script_fd: int | None
    limits: ResourceLimits | None
    cgroup: bool


#: Native threads that spawn for event loops (see ``run_shell_async``): a fixed pool per
#: service, never one per call.
SPAWNER_THREADS: int = _core.SPAWNER_THREADS

#: Tokens of queued runs: above every process token, so one loop notifier serves both.
_SPAWN_TOKEN_BASE = 1 << 63

_STAGE_REASONS = {
    "chdir": "cannot change to the working directory",
    "exec": "cannot execute the shell",
    "pipes": "cannot create pipes",
    "clone": "cannot create a process",
    "supervise": "cannot supervise the process",
    "forked-child": "unusable in a forked child",
    "contain": "cannot apply the call's cgroup or limits",
}

#: The keeper process (see rust/keeper.rs): a bare interpreter that loads this extension
#: from its file, without importing the package or site, and runs its keeper loop on stdin.
_KEEPER_BOOTSTRAP = """\
import sys
from importlib.machinery import ExtensionFileLoader
from importlib.util import module_from_spec, spec_from_loader
loader = ExtensionFileLoader("shellseam._core", sys.argv[1])
core = module_from_spec(spec_from_loader("shellseam._core", loader))
loader.exec_module(core)
sys.exit(core._keeper_main(0))
"""


def _keeper_command() -> tuple[bytes, list[bytes]] | None:
    """How to start the keeper; None when this interpreter cannot be re-executed."""
    executable, library = sys.executable, getattr(_core, "__file__", None)
    if not executable or not library:
        return None
    argv = [executable, "-I", "-S", "-c", _KEEPER_BOOTSTRAP, library]
    return os.fsencode(executable), [os.fsencode(a) for a in argv]


# The core builds the result records of settled calls itself (one native call per
# foreground run); signals are named as ``signal.Signals`` names them.
_core.register_result_types(
    CollectedOutput,
    ShellResources,
    ShellRunResult,
    {int(sig): sig.name for sig in signal.Signals},
)

#: The kernel's limit for one argument (MAX_ARG_STRLEN, with its NUL); longer commands reach
#: the shell through a sealed memfd.
MAX_ARG_BYTES = 128 * 1024 - 1

# The core reads a spec ``resolve`` marked checked itself (``SubprocessService.run_spec``).
_core.register_spec_type(
    ShellExecSpec,
    CHECKED_MARK,
    list(CHECKED_FIELDS),
    MAX_ARG_BYTES,
    sys.getfilesystemencoding() == "utf-8",
)

#: The core record of the limits converted last (a call's limits are almost always its
#: executor's: the same object every call).
_LAST_LIMITS: tuple[ResourceLimits | None, _core.CallLimits | None] = (None, None)


def _native_args(call: SpawnArgs) -> dict[str, Any]:
    """``call`` as the core's spawns take it, its caps and grace checked first."""
    _check_caps(call["stdout_cap"], call["stderr_cap"], call["spill_cap"], call["grace_ms"])
    return {
        **call,
        "argv": list(call["argv"]),
        "cwd": _cwd_bytes(call["cwd"]),
        "limits": _call_limits(call.get("limits")),
    }


def _check_caps(stdout_cap: int, stderr_cap: int, spill_cap: int, grace_ms: int) -> None:
    """Caps and grace as the core takes them (``ValueError``/``TypeError`` naming them)."""
    # One comparison chain on the hot path; the per-name checks only to say what is wrong.
    if not (
        type(stdout_cap) is int
        and type(stderr_cap) is int
        and type(spill_cap) is int
        and type(grace_ms) is int
        and 0 <= stdout_cap <= MAX_BYTES
        and 0 <= stderr_cap <= MAX_BYTES
        and 0 <= spill_cap <= MAX_BYTES
        and 0 <= grace_ms <= MAX_TIMEOUT_MS
    ):
        for name, value, maximum in (
            ("stdout_cap", stdout_cap, MAX_BYTES),
            ("stderr_cap", stderr_cap, MAX_BYTES),
            ("spill_cap", spill_cap, MAX_BYTES),
            ("grace_ms", grace_ms, MAX_TIMEOUT_MS),
        ):
            config_int(value, name, minimum=0, maximum=maximum)


def _cwd_bytes(cwd: str) -> bytes:
    try:
        return os.fsencode(cwd)
    except UnicodeEncodeError as err:
        raise ShellError(INVALID_REQUEST, f"workdir is not encodable: {err.reason}") from None


def _call_limits(limits: ResourceLimits | None) -> _core.CallLimits | None:
    """The core's record of a call's limits (None: no limits at all)."""
    global _LAST_LIMITS
    if limits is None:
        return None
    last, record = _LAST_LIMITS
    if last is limits:
        return record
    record = _core.CallLimits.of(limits)
    _LAST_LIMITS = (limits, record)
    return record


def _native_shell_args(
    template: ShellTemplate,
    command: bytes,
    cwd: str,
    env: ChildEnv,
    stdin: bytes,
    stdout_cap: int,
    ruleset: Ruleset | None,
    limits: ResourceLimits,
    timeout_ms: int,
) -> tuple[
    ShellTemplate, bytes, bytes, ChildEnv, bytes, int, Ruleset | None, _core.CallLimits | None, int
]:
    """What ``Supervisor.run_shell`` and ``run_queued`` take first, in their order: the cap
    checked (``ValueError``/``TypeError`` naming it, so that no value reaches the core as an
    overflow), the working directory and the limits as the core takes them."""
    if not (type(stdout_cap) is int and 0 <= stdout_cap <= MAX_BYTES):
        config_int(stdout_cap, "stdout_cap", minimum=0, maximum=MAX_BYTES)
    return (
        template,
        command,
        _cwd_bytes(cwd),
        env,
        stdin,
        stdout_cap,
        ruleset,
        _call_limits(limits),
        timeout_ms,
    )


def _runs_nothing(spec: ShellExecSpec) -> None:
    """The spec runner of a service whose foreground runs go through its own ``run_shell``."""
    return None


def native_error(err: NativeError, cwd: str | None = None) -> ShellError:
    """The ShellError of a native failure: its code as the core gave it, the reason by stage
    (also for native calls made outside this module, through a bound runner)."""
    raw_code, message, _errno, stage = err.args
    code = cast(ShellErrorCode, raw_code)  # the core names only ShellError codes
    if code == SANDBOX_UNAVAILABLE:
        return ShellError(code, f"the kernel refused the Landlock ruleset: {message}")
    if code == DISPOSED:
        return ShellError(code, "the subprocess service has been disposed")
    what = _STAGE_REASONS.get(stage, stage) if stage is not None else None
    if stage == "chdir" and cwd is not None:
        what = f"{what} {cwd}"
    return ShellError(code, f"{what}: {message}" if what else message)


def host_containment() -> HostContainment:
    """What this host offers for containment (probes by creating a cgroup parent)."""
    return _core.containment_facts()


def landlock_abi() -> int:
    """The running kernel's Landlock ABI (0: none)."""
    return _core.landlock_abi()


def landlock_missing(network: bool) -> list[str]:
    """Requested features this kernel lacks for a confined mode (empty: full enforcement)."""
    return _core.landlock_missing(network)


def landlock_fs_rights() -> list[str]:
    """Names of the filesystem rights the running kernel can handle."""
    return _core.landlock_fs_rights()


def build_ruleset(writable_root_fds: list[int], network: bool, read_only: bool) -> Ruleset:
    """The confinement of a mode (Landlock rules from pinned directory fds, the seccomp
    filter, the privilege drop); ``ShellError(SANDBOX_UNAVAILABLE)`` when the kernel cannot
    build it."""
    try:
        return _core.build_ruleset(writable_root_fds, network, read_only)
    except _core.SandboxError as err:
        raise ShellError(SANDBOX_UNAVAILABLE, str(err.args[1])) from None


def capability_facts() -> tuple[bool, int]:
    """(the harness holds CAP_SETPCAP, the highest capability number)."""
    return _core.capability_facts()


def protect_harness() -> None:
    """Makes this process non-dumpable (``PR_SET_DUMPABLE`` 0)."""
    _core.protect_harness()


def harness_dumpable() -> bool:
    """Whether this process is dumpable."""
    return _core.harness_dumpable()


class ManagedProcess:
    """One process group of a service: the only owner of its native process."""

    __slots__ = ("_proc", "_service")

    def __init__(self, service: SubprocessService, proc: _core.Proc) -> None:
        self._service = service
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def done(self) -> bool:
        return self._proc.done

    def kill(self) -> bool:
        """SIGTERM to the group now, SIGKILL after the grace; False when already settled or
        a kill is already under way."""
        return self._proc.kill()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks (GIL released) until settled or ``timeout`` seconds pass (``None`` or
        infinity: no timeout); True when settled."""
        return self._proc.wait(timeout)

    def wait_result(self, timeout: float | None = None) -> Finished | None:
        """``wait`` then ``result`` in one native call; None when ``timeout`` passed first."""
        return self._proc.wait_result(timeout)

    async def wait_async(self) -> None:
        """Resolves when settled, woken by the loop's eventfd (no thread)."""
        await self._service._wait_async(self._proc)

    def add_done_callback(self, cb: Callable[[], None]) -> None:
        """Runs ``cb`` once settled: at once if it is, else on the service's dispatcher."""
        self._service._add_done_callback(self._proc, cb)

    def outcome(self) -> Outcome | None:
        """How it ended, or None while running."""
        return self._proc.outcome()

    def result(self) -> Finished | None:
        """Outcome and both collected streams together, or None while running."""
        return self._proc.result()

    def collected(self) -> tuple[Collected, Collected]:
        """(stdout, stderr) as collected so far."""
        return self._proc.collected()

    def read(self) -> tuple[ReadDelta, ReadDelta]:
        """Consuming read of (stdout, stderr)."""
        return self._proc.read()

    def resources(self) -> NativeResources | None:
        """Containment facts of the settled process, or None while running."""
        return self._proc.resources()

    def shell_resources(self, limits: ResourceLimits) -> ShellResources | None:
        """The call's ``ShellResources`` (``limits``: its limits), or None while running."""
        return self._proc.shell_resources(limits)

    def shell_result(
        self, *, timed_out: bool, aborted: bool, timeout_ms: int, limits: ResourceLimits
    ) -> ShellRunResult | None:
        """The ``ShellRunResult`` of the settled process (``sandbox`` None), or None while
        running."""
        return self._proc.shell_result(
            timed_out=timed_out, aborted=aborted, timeout_ms=timeout_ms, limits=limits
        )


class _LoopWaiters:
    """Futures of one event loop, resolved from a native eventfd the loop watches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.notifier = _core.Notifier()
        self.futures: dict[int, list[asyncio.Future[None]]] = {}
        loop.add_reader(self.notifier.fd, self._on_ready)

    def _on_ready(self) -> None:
        for token in self.notifier.take():
            for fut in self.futures.pop(token, ()):
                if not fut.done():
                    fut.set_result(None)


def _private_dir(path: str) -> bool:
    """Creates ``path`` (0700) if needed; True when it is a real directory of ours (made
    private again when others could write it: a workspace-write command may chmod it)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return False
    return _owned_dir(path, repair=True)


def _owned_dir(path: str, *, repair: bool = False) -> bool:
    """Whether ``path`` is a real directory (not a symlink) owned by us that no one else may
    write; ``repair`` takes group and other write access away from one of ours first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return False
        if st.st_mode & 0o022 and repair:
            os.fchmod(fd, 0o700)
            st = os.fstat(fd)
        return not st.st_mode & 0o022 and os.access(path, os.W_OK)
    except OSError:
        return False
    finally:
        os.close(fd)


def default_spill_parent() -> str:
    """Where spill directories go: ``$XDG_CACHE_HOME/shellseam``, else
    ``~/.cache/shellseam``, else ``/var/tmp/shellseam-<uid>``, else the temp dir. The first
    two lie outside every confined mode's default writable roots."""
    candidates = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        candidates.append(os.path.join(xdg, "shellseam"))
    home = os.path.expanduser("~")
    if os.path.isabs(home):
        candidates.append(os.path.join(home, ".cache", "shellseam"))
    candidates.append(f"/var/tmp/shellseam-{os.geteuid()}")
    for candidate in candidates:
        if _private_dir(candidate):
            return candidate
    return tempfile.gettempdir()


def _check_spill_total(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_spill_total_bytes must be an int, got {type(value).__name__}")
    if value < 0 or value >= 2**64:
        raise ValueError(f"max_spill_total_bytes must be in [0, 2**64), got {value}")
    return value


class SubprocessService:
    """Owns the native supervisor and every process spawned through it."""

    #: A foreground run goes through this class's own ``run_shell``: ``run_spec`` may then
    #: read a resolved spec natively instead (false for a subclass overriding either).
    _native_specs: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        base = SubprocessService
        cls._native_specs = cls.run_shell is base.run_shell and cls.run_spec is base.run_spec

    def __init__(
        self,
        spill_parent: str | None = None,
        max_spill_total_bytes: int = 2**30,
        keep_spill: bool = False,
    ) -> None:
        parent = (
            default_spill_parent()
            if spill_parent is None
            else config_path(spill_parent, "spill_parent")
        )
        self.spill_parent = os.path.abspath(parent)
        self.max_spill_total_bytes = _check_spill_total(max_spill_total_bytes)
        config_bool(keep_spill, "keep_spill")
        self._supervisor = _core.Supervisor(
            self.spill_parent, self.max_spill_total_bytes, _keeper_command(), keep_spill
        )
        self.keep_spill = keep_spill
        self._lock = ForkSafeLock()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaiters] = (
            weakref.WeakKeyDictionary()
        )
        self._callbacks: dict[int, list[Callable[[], None]]] = {}
        self._dispatch_notifier: _core.Notifier | None = None
        self._dispatcher: threading.Thread | None = None
        self._spawn_tokens = itertools.count(_SPAWN_TOKEN_BASE)

    # -- facts -------------------------------------------------------------------------

    @property
    def disposed(self) -> bool:
        return self._supervisor.disposed

    @property
    def spill_dir(self) -> str | None:
        """The private spill directory, once something spilled."""
        return self._supervisor.spill_dir

    @property
    def spill_location(self) -> str:
        """The spill directory (created now if nothing spilled yet), or the parent it will
        be made in when it cannot be: what a confined call's writable roots must not
        contain."""
        return (
            self._supervisor.spill_dir or self._supervisor.ensure_spill_dir() or self.spill_parent
        )

    @property
    def keeper_pid(self) -> int | None:
        """The keeper process's pid, once the first call started it."""
        return self._supervisor.keeper_pid

    @property
    def running(self) -> int:
        """Processes not yet settled."""
        return self._supervisor.running

    def scratch_dir(self, prefix: str) -> str:
        """A new private directory for commands' scratch files (a read-only call's
        ``$TMPDIR``, the sandbox cache) in the spill parent; the keeper removes it if the
        harness dies first. Remove it with ``remove_scratch_dir``."""
        os.makedirs(self.spill_parent, mode=0o700, exist_ok=True)
        path = tempfile.mkdtemp(prefix=prefix, dir=self.spill_parent)
        self._supervisor.note_scratch_dir(path)
        return path

    def remove_scratch_dir(self, path: str) -> None:
        """Removes a ``scratch_dir`` (never following what its commands left there)."""
        from .paths import remove_tree  # paths builds on this module

        remove_tree(path)
        if not os.path.lexists(path):  # a walk a running command disturbed leaves the rest
            self._supervisor.forget_scratch_dir(path)

    # -- spawning ----------------------------------------------------------------------

    def spawn(self, **call: Unpack[SpawnArgs]) -> ManagedProcess:
        """Spawns one process group; raises ``ShellError`` with an exact reason.

        Caps and grace are checked here (``ValueError``/``TypeError`` naming them), so that
        no value reaches the core as an overflow."""
        native = _native_args(call)
        try:
            proc = self._supervisor.spawn(**native)
        except _core.NativeError as err:
            raise native_error(err, call["cwd"]) from None
        return ManagedProcess(self, proc)

    def shell_template(
        self,
        program: bytes,
        argv0: bytes,
        stderr_cap: int,
        spill_cap: int,
        grace_ms: int,
        cgroup: bool,
    ) -> ShellTemplate:
        """An executor's fixed settings for ``run_shell`` (checked here, once)."""
        _check_caps(0, stderr_cap, spill_cap, grace_ms)
        return _core.ShellTemplate(program, argv0, stderr_cap, spill_cap, grace_ms, cgroup)

    def run_shell(
        self,
        template: ShellTemplate,
        command: bytes,
        cwd: str,
        env: ChildEnv,
        stdin: bytes,
        stdout_cap: int,
        ruleset: Ruleset | None,
        limits: ResourceLimits,
        timeout_ms: int,
        script_fd: int | None = None,
    ) -> ShellRunResult:
        """A foreground run in one native call: spawns ``<shell> -c <command>`` with
        ``template``'s settings (``script_fd``: a long command's sealed script, ``command``
        then the stub that reads it), waits up to ``timeout_ms``, then kills and waits for the
        end; the ``ShellRunResult`` (``sandbox`` None), ``timed_out`` when the timeout fired.
        The calling thread drives the process from its spawn on. Raises as ``spawn`` does; a
        ``KeyboardInterrupt`` while waiting kills the group and waits for it first."""
        native = _native_shell_args(
            template, command, cwd, env, stdin, stdout_cap, ruleset, limits, timeout_ms
        )
        try:
            result: ShellRunResult = self._supervisor.run_shell(*native, limits, script_fd)
        except _core.NativeError as err:
            raise native_error(err, cwd) from None
        return result

    def spec_runner(self, template: ShellTemplate, builder: EnvBuilder) -> SpecRunner:
        """``run_spec`` of an unconfined executor's specs with ``template`` and ``builder``,
        as the native call itself with its other arguments bound (no Python frame runs
        between the caller and the core); it raises ``NativeError``, which
        ``native_error`` turns into the ``ShellError`` ``run_spec`` raises. A subclass that
        overrides ``run_shell`` or ``run_spec`` gets a runner that runs nothing (its
        executors then call ``run_shell``)."""
        if not self._native_specs:
            return _runs_nothing
        runner: SpecRunner = functools.partial(
            self._supervisor.run_spec, template, builder, posix.environ
        )
        return runner

    def run_spec(
        self,
        template: ShellTemplate,
        builder: EnvBuilder,
        spec: ShellExecSpec,
        ruleset: Ruleset | None = None,
        env: list[tuple[bytes, bytes]] | None = None,
    ) -> ShellRunResult | None:
        """``run_shell`` of ``spec`` as an executor's ``resolve`` made and marked it, in one
        native call that reads the spec itself: the child environment is what ``builder``
        makes of the harness's with the confinement's ``env`` (``ruleset``) layered on;
        None, with nothing run, when the spec needs the executor's own path (an abort
        signal, ``env`` layers, a command beyond one argument, text that is not plain
        UTF-8, a spec built or changed by hand; a subclass overriding ``run_shell``)."""
        if not self._native_specs:
            return None
        try:
            result: ShellRunResult | None = self._supervisor.run_spec(
                template, builder, posix.environ, spec, ruleset, env or None
            )
        except _core.NativeError as err:
            raise native_error(err, spec.workdir) from None
        return result

    def confined_runner(self, template: ShellTemplate, confined: ConfinedCall) -> SpecRunner:
        """``run_spec`` of a spec whose sandbox policy has the values ``confined`` was
        prepared for, with its ruleset and environment, once its roots were found to be
        the same directories still, as the native call itself with its other arguments
        bound (as ``spec_runner``). The result carries ``confined``'s sandbox record
        unless the command exited nonzero (the caller then looks for a denial). The runner
        returns None, with nothing run, when ``run_spec`` would, the policy is another, or a
        root changed (always, for a subclass overriding ``run_shell`` or ``run_spec``)."""
        if not self._native_specs:
            return _runs_nothing
        runner: SpecRunner = functools.partial(
            self._supervisor.run_confined, template, confined, posix.environ
        )
        return runner

    async def run_shell_async(
        self,
        template: ShellTemplate,
        command: bytes,
        cwd: str,
        env: ChildEnv,
        stdin: bytes,
        stdout_cap: int,
        ruleset: Ruleset | None,
        limits: ResourceLimits,
        timeout_ms: int,
        script_fd: int | None = None,
        abort: AbortSignal | None = None,
        settle: Callable[[], None] | None = None,
    ) -> ShellRunResult:
        """``run_shell`` for an event loop, in one native call to start and one to collect.

        The spawn runs on one of the service's native spawner threads: under vfork
        semantics the spawning thread sleeps until its child has exec'd, and with many
        commands in flight the child first waits for a CPU, which on the loop thread would
        stall every other run (with nothing of this service running, it spawns inline:
        there is nothing to stall). The supervisor kills the run when ``timeout_ms`` passes,
        and wakes the loop once, through the eventfd it already watches, when the run is
        over. ``abort`` firing kills it (the result then says aborted). Cancelling the
        awaiting task kills the group and re-raises once it has been reaped. ``settle``
        runs once the run is over, however it ends (from the service's dispatcher thread
        when the awaiting coroutine is closed before that)."""
        try:
            native = _native_shell_args(
                template, command, cwd, env, stdin, stdout_cap, ruleset, limits, timeout_ms
            )
            loop = asyncio.get_running_loop()
            waiters = self._waiters(loop)
            token = next(self._spawn_tokens)
            pending = self._supervisor.run_queued(waiters.notifier, token, *native, script_fd)
        except BaseException as err:
            if settle is not None:
                settle()
            if isinstance(err, _core.NativeError):
                raise native_error(err, cwd) from None
            raise
        remove = None
        if abort is not None:

            def on_abort() -> None:
                pending.kill(True)

            remove = abort.add_listener(on_abort)
        cancelled: asyncio.CancelledError | None = None
        try:
            # The token comes once, when the run is over; registered before this coroutine
            # first yields, so before the loop can take it.
            while not pending.done:
                fut: asyncio.Future[None] = loop.create_future()
                waiters.futures[token] = [fut]
                try:
                    await fut
                except asyncio.CancelledError as err:
                    if cancelled is None:
                        cancelled = err
                        pending.kill()
                    # Waits on until the group is reaped, however often it is cancelled.
                except BaseException:
                    pending.kill()
                    raise
                finally:
                    waiters.futures.pop(token, None)
        finally:
            if remove is not None:
                remove()
            if settle is not None:
                self._when_done(
                    token, lambda: pending.done, lambda n: pending.subscribe(n, token), settle
                )
        if cancelled is not None:
            raise cancelled
        try:
            result = pending.result(limits)
        except _core.NativeError as err:
            raise native_error(err, cwd) from None
        if result is None:  # not reached: the loop above ends once the run is over
            raise ShellError(SPAWN_FAILED, "the queued run's result is missing")
        return result

    # -- waiting -----------------------------------------------------------------------

    def _waiters(self, loop: asyncio.AbstractEventLoop) -> _LoopWaiters:
        waiters = self._loops.get(loop)
        if waiters is None:
            waiters = self._loops.setdefault(loop, _LoopWaiters(loop))
        return waiters

    async def _wait_async(self, proc: _core.Proc) -> None:
        """Resolves when ``proc`` is done, woken by the loop's eventfd (no thread)."""
        if proc.done:
            return
        loop = asyncio.get_running_loop()
        waiters = self._waiters(loop)
        fut: asyncio.Future[None] = loop.create_future()
        waiters.futures.setdefault(proc.token, []).append(fut)
        proc.subscribe(waiters.notifier)
        try:
            await fut
        finally:
            pending = waiters.futures.get(proc.token)
            if pending is not None and fut in pending:
                pending.remove(fut)
                if not pending:
                    del waiters.futures[proc.token]

    def _add_done_callback(self, proc: _core.Proc, cb: Callable[[], None]) -> None:
        """Runs ``cb`` once ``proc`` is done: at once if it is, else on the dispatcher."""
        self._when_done(proc.token, lambda: proc.done, proc.subscribe, cb)

    def _when_done(
        self,
        token: int,
        done: Callable[[], bool],
        subscribe: Callable[[_core.Notifier], None],
        cb: Callable[[], None],
    ) -> None:
        """Runs ``cb`` at once if ``done()``, else on the dispatcher once ``token`` reaches
        the notifier given to ``subscribe``."""
        with self._lock:
            if not done():
                notifier = self._ensure_dispatcher()
                self._callbacks.setdefault(token, []).append(cb)
                subscribe(notifier)
                return
        cb()

    def _ensure_dispatcher(self) -> _core.Notifier:
        if self._dispatch_notifier is None:
            self._dispatch_notifier = _core.Notifier()
        if self._dispatcher is None:
            self._dispatcher = threading.Thread(
                target=self._dispatch, name="shellseam-callbacks", daemon=True
            )
            self._dispatcher.start()
        return self._dispatch_notifier

    def _dispatch(self) -> None:
        notifier = self._dispatch_notifier
        assert notifier is not None
        while True:
            tokens = notifier.wait(None)
            with self._lock:
                batches = [self._callbacks.pop(t, []) for t in tokens]
                idle = not self._callbacks
                if idle and self.disposed:
                    self._dispatcher = None
            for batch in batches:
                for cb in batch:
                    try:
                        cb()
                    except Exception:  # one bad callback must not stop the others
                        _log.exception("exception in a ShellProcess done callback")
            if idle and self.disposed:
                return

    # -- teardown ----------------------------------------------------------------------

    def dispose(self, keep_spill: bool | None = None) -> None:
        """Kills and reaps every process, stops the supervisor, removes spill files (unless
        ``keep_spill``, which defaults to the service's setting)."""
        keep = self.keep_spill if keep_spill is None else keep_spill
        self._supervisor.dispose(keep_spill=keep)
        dispatcher = self._dispatcher
        if self._dispatch_notifier is not None:
            self._dispatch_notifier.wake()
        if dispatcher is not None and dispatcher is not threading.current_thread():
            dispatcher.join()

    async def aclose(self, keep_spill: bool | None = None) -> None:
        """``dispose()`` without blocking the event loop: awaits the kills, then disposes."""
        for proc in self._supervisor.begin_dispose():
            await self._wait_async(proc)
        self.dispose(keep_spill)


_default: SubprocessService | None = None
_default_lock = threading.Lock()


def _forget_default_after_fork() -> None:
    # The child inherits the parent's default service but not its supervisor thread; the
    # next call in the child creates a service of its own.
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_default_after_fork)
# A forked child closes every service's pipe ends (a copy of a command's stdin write end
# would keep the command waiting for EOF until the child exits).
os.register_at_fork(
    before=_core.fork_prepare, after_in_parent=_core.fork_parent, after_in_child=_core.fork_child
)


def default_service() -> SubprocessService:
    """The process-wide service used by executors created without one."""
    global _default
    service = _default  # every call of an executor without its own service comes here
    if service is not None and not service.disposed:
        return service
    with _default_lock:
        if _default is None or _default.disposed:
            _default = SubprocessService()
            atexit.register(_default.dispose)
        return _default
