"""Type stubs of the native core (``rust/bindings/``); checked by ``mypy.stubtest``."""

from os import PathLike
from typing import final

from .types import (
    CollectedOutput,
    ResourceLimits,
    SandboxPolicy,
    ShellExecSpec,
    ShellResources,
    ShellRunResult,
    ShellSandboxInfo,
)

__all__ = [
    "SPAWNER_THREADS",
    "CallLimits",
    "Collected",
    "Collector",
    "ConfinedCall",
    "ContainmentFacts",
    "DisposedError",
    "Env",
    "EnvBuilder",
    "Finished",
    "NativeError",
    "Notifier",
    "Outcome",
    "PendingRun",
    "Proc",
    "ReadDelta",
    "Resources",
    "RootCheck",
    "Ruleset",
    "Rusage",
    "SandboxError",
    "ShellTemplate",
    "SpawnError",
    "Supervisor",
    "_keeper_main",
    "bench_minimal_reader",
    "bench_session_spawn",
    "build_ruleset",
    "capability_facts",
    "containment_facts",
    "fork_child",
    "fork_parent",
    "fork_prepare",
    "harness_dumpable",
    "landlock_abi",
    "landlock_fs_rights",
    "landlock_missing",
    "protect_harness",
    "register_result_types",
    "register_spec_type",
]

class NativeError(Exception):
    """A failure of the native core.

    ``args`` is ``(code, message, errno, stage)``: ``code`` the ``ShellError`` code,
    ``errno`` the OS error number (0 when none), ``stage`` where a spawn failed (or None).
    """

    args: tuple[str, str, int, str | None]

class SpawnError(NativeError):
    """A spawn failed (``SPAWN_FAILED``; ``SANDBOX_UNAVAILABLE`` at stage ``"sandbox"``)."""

class DisposedError(NativeError):
    """The service has been disposed (``DISPOSED``)."""

class SandboxError(NativeError):
    """A Landlock ruleset could not be built (``SANDBOX_UNAVAILABLE``)."""

@final
class Rusage:
    """Resource usage of a process's leader as ``wait4`` reported it (zeros when unknown)."""

    @property
    def user_cpu_ms(self) -> float:
        """CPU time in user mode, in milliseconds."""
    @property
    def system_cpu_ms(self) -> float:
        """CPU time in the kernel on the leader's behalf, in milliseconds."""
    @property
    def max_rss_kib(self) -> int:
        """Peak resident set size of the leader, in KiB."""

@final
class Outcome:
    """How a process ended."""

    @property
    def exit_code(self) -> int | None:
        """The leader's exit code; None when a signal killed it or the status is unknown."""
    @property
    def signal(self) -> int | None:
        """The number of the signal that killed the leader, if one did."""
    @property
    def exit_status_unknown(self) -> bool:
        """Somebody else reaped the leader (a stray ``waitpid(-1)``): its status is lost."""
    @property
    def duration_ms(self) -> float:
        """From spawn to settlement (drain and leftover reaping included)."""
    @property
    def leftover_killed(self) -> int:
        """Processes left in the group after the drain that the supervisor terminated."""
    @property
    def kill_requested(self) -> bool:
        """A kill was requested (timeout, abort, ``kill()`` or disposal)."""
    @property
    def rusage(self) -> Rusage:
        """The leader's resource usage (zeros when its status was lost)."""

@final
class Collected:
    """One stream as collected so far: its (tail) text and how to recover the rest."""

    @property
    def text(self) -> str:
        """The kept tail, valid UTF-8 (invalid bytes replaced)."""
    @property
    def truncated(self) -> bool:
        """Bytes were dropped from ``text``."""
    @property
    def spill_path(self) -> str | None:
        """The file holding the stream from byte 0, once it outgrew the cap."""
    @property
    def total_bytes(self) -> int:
        """Bytes the stream produced."""
    @property
    def spill_truncated(self) -> bool:
        """The stream outgrew the spill cap: the file holds only its head."""

@final
class ReadDelta:
    """One consuming read of a stream."""

    @property
    def text(self) -> str:
        """Output since the previous read (a trailing incomplete character waits)."""
    @property
    def lossy(self) -> bool:
        """Unread bytes were dropped from memory since the previous read."""
    @property
    def spill_path(self) -> str | None:
        """The stream's spill file, where dropped bytes can still be read."""
    @property
    def spill_truncated(self) -> bool:
        """The spill file stopped short of the stream: it holds only its head."""

@final
class Finished:
    """A finished process: its outcome and both collected streams, taken together."""

    @property
    def outcome(self) -> Outcome: ...
    @property
    def stdout(self) -> Collected: ...
    @property
    def stderr(self) -> Collected: ...

@final
class Notifier:
    def __new__(cls) -> Notifier: ...
    @property
    def fd(self) -> int: ...
    def wake(self) -> None: ...
    def take(self) -> list[int]: ...
    def wait(self, timeout: float | None = None) -> list[int]: ...

_Pairs = list[tuple[bytes, bytes]]

@final
class Env:
    @staticmethod
    def from_pairs(pairs: _Pairs) -> Env: ...
    def pairs(self) -> _Pairs: ...

@final
class EnvBuilder:
    def __new__(
        cls,
        scrub_patterns: list[str],
        managed_prefix: str,
        drop_names: list[bytes],
        terminal: _Pairs,
        allowed_names: list[bytes],
    ) -> EnvBuilder: ...
    def build(
        self, base: dict[bytes, bytes], extra: _Pairs | None = None, managed: _Pairs | None = None
    ) -> Env: ...

@final
class Proc:
    @property
    def pid(self) -> int: ...
    @property
    def token(self) -> int: ...
    @property
    def done(self) -> bool: ...
    def kill(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...
    def wait_result(self, timeout: float | None = None) -> Finished | None:
        """Waits until done, then returns the result in the same call; None on timeout."""
    def subscribe(self, notifier: Notifier) -> None: ...
    def outcome(self) -> Outcome | None:
        """How it ended, or None while running."""
    def result(self) -> Finished | None:
        """The outcome and both collected streams in one call, or None while running."""
    def collected(self) -> tuple[Collected, Collected]:
        """Both streams as collected so far: (stdout, stderr)."""
    def read(self) -> tuple[ReadDelta, ReadDelta]:
        """Consuming read of both streams: (stdout, stderr)."""
    def resources(self) -> Resources | None:
        """Containment facts, or None while running."""
    def shell_resources(self, limits: ResourceLimits) -> ShellResources | None:
        """The call's ``ShellResources`` (``limits``: its limits), or None while running."""
    def shell_result(
        self, *, timed_out: bool, aborted: bool, timeout_ms: int, limits: ResourceLimits
    ) -> ShellRunResult | None:
        """The ``ShellRunResult`` of the settled process, or None while running."""

@final
class ShellTemplate:
    """A shell executor's spawn settings that do not change from call to call."""

    def __new__(
        cls,
        program: bytes,
        argv0: bytes,
        stderr_cap: int,
        spill_cap: int,
        grace_ms: int,
        cgroup: bool,
    ) -> ShellTemplate: ...

@final
class Collector:
    def __new__(cls, cap: int, spill_cap: int, spill_parent: str | PathLike[str]) -> Collector: ...
    def push(self, chunk: bytes) -> None: ...
    def collected(self) -> Collected: ...
    def read(self, final_read: bool = False) -> ReadDelta: ...
    def tail_bytes(self) -> bytes: ...

@final
class Ruleset:
    @property
    def enforcement(self) -> str: ...
    @property
    def missing(self) -> list[str]: ...

@final
class RootCheck:
    """Paths with the directory (device, inode) each was pinned to, or None where it named
    nothing."""

    def __new__(cls, entries: list[tuple[bytes, tuple[int, int] | None]]) -> RootCheck: ...
    def still_same(self) -> bool:
        """Whether every path still names its directory, or still names nothing."""

@final
class ConfinedCall:
    """A sandboxing executor's prepared call of one policy."""

    def __new__(
        cls,
        policy: SandboxPolicy,
        roots: RootCheck,
        ruleset: Ruleset,
        builder: EnvBuilder,
        env: _Pairs,
        info: ShellSandboxInfo,
    ) -> ConfinedCall: ...

@final
class Resources:
    """Containment facts of one finished call."""

    @property
    def cgroup(self) -> bool: ...
    @property
    def tree_memory(self) -> bool: ...
    @property
    def tree_processes(self) -> bool: ...
    @property
    def tree_cpu(self) -> bool: ...
    @property
    def limit_exceeded(self) -> str | None: ...
    @property
    def peak_memory_bytes(self) -> int | None: ...
    @property
    def cpu_ms(self) -> float | None: ...

@final
class ContainmentFacts:
    """What this host offers for containment."""

    @property
    def cgroup(self) -> bool: ...
    @property
    def memory(self) -> bool: ...
    @property
    def pids(self) -> bool: ...
    @property
    def cgroup_root(self) -> str | None: ...
    @property
    def memory_controller(self) -> str | None: ...
    @property
    def pids_controller(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...

@final
class CallLimits:
    """The limits of one call, as ``Supervisor.spawn`` takes them (None: no limit).

    The Python layer validates them first (``ResourceLimits``); here a negative value is an
    ``OverflowError`` and a non-int a ``TypeError``, as for any native ``u64``.
    """

    def __new__(
        cls,
        *,
        memory_bytes: int | None = None,
        max_processes: int | None = None,
        cpu_ms: int | None = None,
        file_size_bytes: int | None = None,
        open_files: int | None = None,
    ) -> CallLimits: ...
    @staticmethod
    def of(limits: ResourceLimits) -> CallLimits | None:
        """The record of a ``ResourceLimits``, read off its fields."""
    @property
    def memory_bytes(self) -> int | None:
        """Memory of the whole call (cgroup), else of each process (``RLIMIT_AS``)."""
    @property
    def max_processes(self) -> int | None:
        """Processes of the whole call (cgroup ``pids``); unenforced without it."""
    @property
    def cpu_ms(self) -> int | None:
        """CPU time of the whole call (cgroup), else of each process (``RLIMIT_CPU``)."""
    @property
    def file_size_bytes(self) -> int | None:
        """Largest file a process may write (``RLIMIT_FSIZE``)."""
    @property
    def open_files(self) -> int | None:
        """Open file descriptors per process (``RLIMIT_NOFILE``)."""

#: Native spawner threads per service (``Supervisor.run_queued``).
SPAWNER_THREADS: int

@final
class PendingRun:
    @property
    def done(self) -> bool:
        """Whether the run is over: its process done, or its spawn failed."""
    def kill(self, abort: bool = False) -> bool:
        """Kills the run now or as it lands; ``abort``: its result says aborted (unless its
        timeout fired first). False when it is over or a kill was already requested."""
    def result(self, limits_record: ResourceLimits) -> ShellRunResult | None:
        """The result of the run that is over (raises the spawn's error); None before."""
    def subscribe(self, notifier: Notifier, token: int) -> None:
        """Also pushes ``token`` to ``notifier`` when the run is over (at once if it is)."""

@final
class Supervisor:
    def __new__(
        cls,
        spill_parent: str | PathLike[str],
        spill_total: int = ...,
        keeper: tuple[bytes, list[bytes]] | None = None,
        keep_spill: bool = False,
    ) -> Supervisor: ...
    def ensure_spill_dir(self) -> str | None:
        """The spill directory, created now if nothing spilled yet (None: cannot be)."""
    def note_scratch_dir(self, dir: str) -> None:
        """Tells the keeper to remove ``dir`` if the harness dies before it does."""
    def forget_scratch_dir(self, dir: str) -> None:
        """The harness removed ``dir`` itself: the keeper forgets it."""
    @property
    def keeper_pid(self) -> int | None: ...
    def has_cgroups(self) -> bool: ...
    @property
    def spill_dir(self) -> str | None: ...
    @property
    def running(self) -> int: ...
    @property
    def queued(self) -> int:
        """Runs ``run_queued`` took whose spawn is not over yet."""
    @property
    def disposed(self) -> bool: ...
    @property
    def has_thread(self) -> bool: ...
    def spawn(
        self,
        *,
        program: bytes,
        argv: list[bytes],
        cwd: bytes,
        env: Env,
        stdin: bytes,
        stdout_cap: int,
        stderr_cap: int,
        spill_cap: int,
        grace_ms: int,
        ruleset: Ruleset | None = None,
        script_fd: int | None = None,
        limits: CallLimits | None = None,
        cgroup: bool = True,
    ) -> Proc: ...
    def run_queued(
        self,
        notifier: Notifier,
        token: int,
        template: ShellTemplate,
        command: bytes,
        cwd: bytes,
        env: Env,
        stdin: bytes,
        stdout_cap: int,
        ruleset: Ruleset | None,
        limits: CallLimits | None,
        timeout_ms: int,
        script_fd: int | None = None,
    ) -> PendingRun:
        """``run_shell`` for an event loop: queues the spawn for a native spawner thread (or
        spawns here when nothing of the service runs) and returns at once; the supervisor
        kills the run when ``timeout_ms`` passes, and ``token`` reaches ``notifier`` once the
        run is over. ``script_fd`` is duplicated."""
    def run_spec(
        self,
        template: ShellTemplate,
        builder: EnvBuilder,
        environ: dict[bytes, bytes],
        spec: ShellExecSpec,
        ruleset: Ruleset | None = None,
        env: _Pairs | None = None,
    ) -> ShellRunResult | None:
        """``run_shell`` of a resolved spec read natively; None when it needs Python."""
    def run_confined(
        self,
        template: ShellTemplate,
        confined: ConfinedCall,
        environ: dict[bytes, bytes],
        spec: ShellExecSpec,
    ) -> ShellRunResult | None:
        """``run_spec`` of a spec of ``confined``'s policy whose roots are still the same."""
    def run_shell(
        self,
        template: ShellTemplate,
        command: bytes,
        cwd: bytes,
        env: Env,
        stdin: bytes,
        stdout_cap: int,
        ruleset: Ruleset | None,
        limits: CallLimits | None,
        timeout_ms: int,
        limits_record: ResourceLimits,
        script_fd: int | None = None,
    ) -> ShellRunResult:
        """A foreground run in one call: spawns ``<shell> -c <command>`` with ``template``'s
        settings, waits up to ``timeout_ms`` (then kills and waits for the end) and returns
        the result; the calling thread drives the process from its spawn on."""
    def begin_dispose(self) -> list[Proc]: ...
    def dispose(self, keep_spill: bool = False) -> None: ...

def build_ruleset(writable_root_fds: list[int], network: bool, read_only: bool) -> Ruleset:
    """The confinement of a mode: Landlock rules from pinned directory fds, the seccomp
    filter and the privilege drop, applied by every child spawned with it."""

def fork_prepare() -> None:
    """Before os.fork(): holds the registry of the services' pipe ends."""

def fork_parent() -> None:
    """After os.fork() in the parent."""

def fork_child() -> None:
    """After os.fork() in the child: the services' pipe ends now name /dev/null."""

def capability_facts() -> tuple[bool, int]:
    """(harness holds CAP_SETPCAP, highest capability number)."""

def protect_harness() -> None:
    """Makes this process non-dumpable (PR_SET_DUMPABLE 0)."""

def harness_dumpable() -> bool:
    """Whether this process is dumpable."""

def landlock_abi() -> int: ...
def landlock_missing(network: bool) -> list[str]: ...
def landlock_fs_rights() -> list[str]: ...
def containment_facts() -> ContainmentFacts: ...
def _keeper_main(fd: int) -> int: ...
def bench_minimal_reader(
    argv: list[str],
    buf_bytes: int = 131072,
    tail_bytes: int = 65536,
    spill_path: str | PathLike[str] | None = None,
    spill_bytes: int = 67108864,
) -> float:
    """Wall seconds of ``argv`` with stdout drained by a minimal epoll reader keeping a
    ``tail_bytes`` ring and, with ``spill_path`` (a new file), the first ``spill_bytes``
    written there (a benchmark floor; stdin and stderr are /dev/null)."""

def bench_session_spawn(program: bytes, argv: list[bytes], env: Env) -> float:
    """Wall seconds of ``program`` spawned by glibc ``posix_spawn`` as a session leader with
    piped stdio, stdout and stderr drained with ``poll`` to EOF, then reaped: the floor of a
    call with shellseam's contract, minus shellseam (a benchmark diagnostic)."""

def register_result_types(
    collected: type[CollectedOutput],
    resources: type[ShellResources],
    run_result: type[ShellRunResult],
    signal_names: dict[int, str],
) -> None:
    """The record classes the core builds results of, and the names of signals."""

def register_spec_type(
    cls: type[ShellExecSpec],
    mark: str,
    fields: list[str],
    max_arg_bytes: int,
    fs_utf8: bool,
) -> None:
    """The spec class ``Supervisor.run_spec`` reads: the ``__dict__`` key of the mark
    ``resolve`` sets, the fields whose checked values it holds (in order), the longest
    ``-c`` argument and whether the filesystem encoding is UTF-8."""
