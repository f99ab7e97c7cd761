"""The seam's vocabulary: requests, resolved specs, results and background reads.

Field names are the snake_case renderings of the seeds' camelCase; ``None`` plays the
seeds' ``undefined``. Everything here is a frozen value: executors build them, callers
read them. The one result every executor builds alike, a run aborted before it started,
is built here too (``aborted_before_start``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .abort import AbortSignal

SandboxMode = Literal["read-only", "workspace-write", "danger-full-access"]
SandboxEnforcement = Literal["full", "partial"]
ProcessStatus = Literal["running", "completed", "killed"]
Containment = Literal["cgroup", "session"]
LimitEnforcement = Literal["tree", "process"]
LimitName = Literal["memory", "processes", "cpu", "file_size"]

SANDBOX_MODES: tuple[SandboxMode, ...] = ("read-only", "workspace-write", "danger-full-access")


@dataclass(frozen=True, kw_only=True)
class SandboxPolicy:
    """What one sandboxed call may touch."""

    mode: SandboxMode
    workspace_root: str
    writable_roots: tuple[str, ...] = ()
    network: bool = True


@dataclass(frozen=True, kw_only=True)
class ResourceLimits:
    """Ceilings of one call; ``None``: no limit on that resource.

    ``memory_bytes``, ``max_processes`` and ``cpu_ms`` bound the whole call (every process it
    starts, together) where a cgroup controller exists, else each process (rlimits);
    ``file_size_bytes`` and ``open_files`` are always per-process rlimits.
    """

    memory_bytes: int | None = None
    max_processes: int | None = None
    cpu_ms: int | None = None
    file_size_bytes: int | None = None
    open_files: int | None = None


@dataclass(frozen=True, kw_only=True)
class ShellExecRequest:
    """A caller's request; optional fields are filled by ``ShellExecutor.resolve``."""

    command: str
    workdir: str | None = None
    timeout_ms: int | None = None
    stdout_max_bytes: int | None = None
    signal: AbortSignal | None = None
    stdin: str | bytes | None = None
    env: Mapping[str, str] | None = None
    managed_env: Mapping[str, str] | None = None
    sandbox_policy: SandboxPolicy | None = None
    limits: ResourceLimits | None = None


@dataclass(frozen=True, kw_only=True)
class ShellExecSpec:
    """A fully resolved request: every field explicit (no defaults on purpose)."""

    command: str
    workdir: str
    timeout_ms: int
    stdout_max_bytes: int
    signal: AbortSignal | None
    stdin: str | bytes | None
    env: Mapping[str, str] | None
    managed_env: Mapping[str, str] | None
    sandbox_policy: SandboxPolicy | None
    limits: ResourceLimits


@dataclass(frozen=True)
class CollectedOutput:
    """One stream of a finished run: its (tail) text and how to recover the rest."""

    text: str
    truncated: bool
    spill_path: str | None
    total_bytes: int
    spill_truncated: bool


@dataclass(frozen=True)
class ShellSandboxInfo:
    """Sandbox facts of one run, present iff a sandboxing executor handled it."""

    mode: SandboxMode
    denied: bool
    enforcement: SandboxEnforcement | None = None
    runner_failed: bool = False


@dataclass(frozen=True)
class ShellResources:
    """Containment and resource facts of one call, stamped before completion is signalled.

    ``containment``: ``cgroup`` tracks every descendant, even one that left the session;
    ``session`` only the command's session/process group. ``enforcement``: ``tree`` when the
    whole call's limits are cgroup controllers, ``process`` when some fell back to
    per-process rlimits, ``None`` when no limit was asked.
    """

    containment: Containment
    enforcement: LimitEnforcement | None
    limits: ResourceLimits
    limit_exceeded: LimitName | None
    peak_memory_bytes: int | None
    cpu_ms: float


@dataclass(frozen=True)
class ShellRunResult:
    """The outcome of one completed (or killed) foreground run."""

    exit_code: int | None
    signal: str | None
    timed_out: bool
    aborted: bool
    timeout_ms: int
    stdout: CollectedOutput
    stderr: CollectedOutput
    duration_ms: float
    leftover_killed: int = 0
    sandbox: ShellSandboxInfo | None = None
    resources: ShellResources | None = None
    #: The status was reaped by someone else (a stray ``waitpid(-1)`` in the harness):
    #: ``exit_code`` and ``signal`` are None, never a made-up 0.
    exit_status_unknown: bool = False


#: A stream that never ran.
NO_OUTPUT = CollectedOutput(
    text="", truncated=False, spill_path=None, total_bytes=0, spill_truncated=False
)


def aborted_before_start(spec: ShellExecSpec) -> ShellRunResult:
    """The result of a run whose signal was already aborted: nothing was started."""
    return ShellRunResult(
        exit_code=None,
        signal=None,
        timed_out=False,
        aborted=True,
        timeout_ms=spec.timeout_ms,
        stdout=NO_OUTPUT,
        stderr=NO_OUTPUT,
        duration_ms=0.0,
    )


@dataclass(frozen=True)
class ShellProcessRead:
    """One consuming read of a background process."""

    delta: str
    lossy: bool
    stdout_spill_path: str | None = None
    stderr_spill_path: str | None = None
    # Not in SPEC: the named spill file holds only the stream's head (its cap was reached),
    # so the lossy marker says how much was saved instead of promising the full output.
    stdout_spill_truncated: bool = False
    stderr_spill_truncated: bool = False
