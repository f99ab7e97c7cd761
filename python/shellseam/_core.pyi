"""Type stubs of the native core (``rust/bindings.rs``); checked by ``mypy.stubtest``."""

from os import PathLike
from typing import final

__all__ = [
    "Collector",
    "DisposedError",
    "Env",
    "EnvBuilder",
    "Notifier",
    "Proc",
    "Ruleset",
    "SandboxError",
    "SpawnError",
    "Supervisor",
    "build_ruleset",
    "capability_facts",
    "harness_dumpable",
    "landlock_abi",
    "landlock_fs_rights",
    "landlock_missing",
    "protect_harness",
]

_Collected = tuple[str, bool, str | None, int, bool]
_Delta = tuple[str, bool, str | None]
_Outcome = tuple[int | None, int | None, float, int, bool, float, float, int]

class SpawnError(Exception): ...
class DisposedError(Exception): ...
class SandboxError(Exception): ...

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
    def subscribe(self, notifier: Notifier) -> None: ...
    def outcome(self) -> _Outcome | None: ...
    def result(self) -> tuple[_Outcome, _Collected, _Collected] | None: ...
    def collected(self) -> tuple[_Collected, _Collected]: ...
    def read(self) -> tuple[_Delta, _Delta]: ...

@final
class Collector:
    def __new__(cls, cap: int, spill_cap: int, spill_parent: str | PathLike[str]) -> Collector: ...
    def push(self, chunk: bytes) -> None: ...
    def collected(self) -> _Collected: ...
    def read(self, final_read: bool = False) -> _Delta: ...
    def tail_bytes(self) -> bytes: ...

@final
class Ruleset:
    @property
    def enforcement(self) -> str: ...
    @property
    def missing(self) -> list[str]: ...

@final
class Supervisor:
    def __new__(
        cls, spill_parent: str | PathLike[str], spill_total: int = ...
    ) -> Supervisor: ...
    @property
    def spill_dir(self) -> str | None: ...
    @property
    def running(self) -> int: ...
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
    ) -> Proc: ...
    def begin_dispose(self) -> list[Proc]: ...
    def dispose(self, keep_spill: bool = False) -> None: ...

def build_ruleset(writable_root_fds: list[int], network: bool, read_only: bool) -> Ruleset:
    """The confinement of a mode: Landlock rules from pinned directory fds, the seccomp
    filter and the privilege drop, applied by every child spawned with it."""
def capability_facts() -> tuple[bool, int]:
    """(harness holds CAP_SETPCAP, highest capability number)."""
def protect_harness() -> None:
    """Makes this process non-dumpable (PR_SET_DUMPABLE 0)."""
def harness_dumpable() -> bool:
    """Whether this process is dumpable."""
def landlock_abi() -> int: ...
def landlock_missing(network: bool) -> list[str]: ...
def landlock_fs_rights() -> list[str]: ...
