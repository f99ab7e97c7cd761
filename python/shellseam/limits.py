"""Resource limits: tightening, and the host's containment facts.

An executor's ``limits`` are ceilings set by whoever built it; a request may only tighten
them (field-wise minimum). Their validation lives with the seam's other checks
(``checks.check_limits`` for constructors, ``checks.request_limits`` for requests and specs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from .checks import LIMIT_FIELDS
from .service import NativeResources, host_containment
from .types import LimitEnforcement, LimitName, ResourceLimits, ShellResources

Enforcement = Literal["tree", "process", "unavailable"]


def tighten(ceiling: ResourceLimits, request: ResourceLimits | None) -> ResourceLimits:
    """The field-wise minimum of the executor's ceilings and a request's limits."""
    if request is None:
        return ceiling
    changes: dict[str, int | None] = {}
    for name in LIMIT_FIELDS:
        mine, theirs = getattr(ceiling, name), getattr(request, name)
        changes[name] = theirs if mine is None else mine if theirs is None else min(mine, theirs)
    return replace(ceiling, **changes)


def containment_facts() -> dict[str, object]:
    """What this host offers: the containment mechanism and, per limit, how it is enforced
    (``tree``: cgroup controller for the whole call; ``process``: per-process rlimit;
    ``unavailable``). Used by ``shellseam doctor``."""
    facts = host_containment()
    per_limit: dict[str, Enforcement] = {
        "memory_bytes": "tree" if facts.memory else "process",
        "max_processes": "tree" if facts.pids else "unavailable",
        "cpu_ms": "tree" if facts.cgroup else "process",
        "file_size_bytes": "process",
        "open_files": "process",
    }
    return {
        "containment": "cgroup" if facts.cgroup else "session",
        "cgroup_root": facts.cgroup_root,
        "memory_controller": facts.memory_controller,
        "pids_controller": facts.pids_controller,
        "limits": per_limit,
        "reason": facts.reason,
    }


_WHOLE_CALL = (
    ("memory_bytes", "tree_memory"),
    ("max_processes", "tree_processes"),
    ("cpu_ms", "tree_cpu"),
)
#: How bash reports a job killed by SIGXFSZ / SIGXCPU (and the 128+n exit statuses).
_XFSZ_TEXT, _XCPU_TEXT = "File size limit exceeded", "CPU time limit exceeded"
_XFSZ, _XCPU, _SIGKILL = 25, 24, 9


def _enforcement(limits: ResourceLimits, raw: NativeResources | None) -> LimitEnforcement | None:
    asked = [name for name in LIMIT_FIELDS if getattr(limits, name) is not None]
    if not asked:
        return None
    for name, tree in _WHOLE_CALL:
        if getattr(limits, name) is not None and not (raw is not None and getattr(raw, tree)):
            return "process"
    whole_call = {name for name, _ in _WHOLE_CALL}
    return "tree" if any(name in whole_call for name in asked) else "process"


#: ``_enforcement`` of recent (limits, controllers) pairs, by the limits object's identity
#: (it is held in the entry, so its id cannot be reused meanwhile): a call's limits are
#: almost always its executor's, and the answer is the same for every call.
_ENFORCEMENT: dict[tuple[int, bool, bool, bool], tuple[ResourceLimits, LimitEnforcement | None]]
_ENFORCEMENT = {}


def _enforcement_of(limits: ResourceLimits, raw: NativeResources | None) -> LimitEnforcement | None:
    key = (
        id(limits),
        raw is not None and raw.tree_memory,
        raw is not None and raw.tree_processes,
        raw is not None and raw.tree_cpu,
    )
    hit = _ENFORCEMENT.get(key)
    if hit is not None and hit[0] is limits:
        return hit[1]
    if len(_ENFORCEMENT) >= 256:
        _ENFORCEMENT.clear()
    answer = _enforcement(limits, raw)
    _ENFORCEMENT[key] = (limits, answer)
    return answer


def _killed_by(
    signum: int | None, exit_code: int | None, stderr_tail: str, sig: int, text: str
) -> bool:
    return signum == sig or exit_code == 128 + sig or text in stderr_tail


def build_resources(
    limits: ResourceLimits,
    raw: NativeResources | None,
    *,
    exit_code: int | None,
    signum: int | None,
    stderr_tail: Callable[[], str],
    rusage_cpu_ms: Callable[[], float],
) -> ShellResources:
    """The ``ShellResources`` of a settled call from the core's facts and its status.

    The core knows the cgroup's verdicts (OOM kill, refused forks, CPU kill); a file-size
    hit, and a CPU hit under a per-process rlimit, are read from how the command ended
    (the signal, bash's 128+n status, or bash's message about a killed job). The stderr
    tail and the leader's CPU time are asked for only when needed.
    """
    exceeded: LimitName | None = None
    tree_cpu = raw is not None and raw.tree_cpu
    if raw is not None and raw.limit_exceeded is not None:
        exceeded = raw.limit_exceeded  # type: ignore[assignment]
    elif limits.cpu_ms is not None and not tree_cpu:
        # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (one second on).
        killed_over = signum == _SIGKILL and rusage_cpu_ms() >= limits.cpu_ms
        if killed_over or _killed_by(signum, exit_code, stderr_tail(), _XCPU, _XCPU_TEXT):
            exceeded = "cpu"
    if (
        exceeded is None
        and limits.file_size_bytes is not None
        and _killed_by(signum, exit_code, stderr_tail(), _XFSZ, _XFSZ_TEXT)
    ):
        exceeded = "file_size"
    cpu_ms = raw.cpu_ms if raw is not None and raw.cpu_ms is not None else rusage_cpu_ms()
    return ShellResources(
        containment="cgroup" if raw is not None and raw.cgroup else "session",
        enforcement=_enforcement_of(limits, raw),
        limits=limits,
        limit_exceeded=exceeded,
        peak_memory_bytes=raw.peak_memory_bytes if raw is not None else None,
        cpu_ms=cpu_ms,
    )


def containment_report() -> list[str]:
    """``shellseam doctor``'s containment lines: the mechanism and, per limit, how it is
    enforced on this host."""
    facts = containment_facts()
    if facts["containment"] == "cgroup":
        controllers = ", ".join(
            f"{name} {facts[key]}"
            for name, key in (("memory", "memory_controller"), ("pids", "pids_controller"))
            if facts[key] is not None
        )
        lines = [
            f"containment: cgroup per call under {facts['cgroup_root']}"
            f" (controllers: {controllers or 'none'})"
        ]
    else:
        lines = [
            "containment: session only — processes that start a new session (setsid, "
            f"double-fork daemons) are not contained ({facts['reason']})"
        ]
    per_limit = facts["limits"]
    assert isinstance(per_limit, dict)
    lines.append("limits: " + ", ".join(f"{k}={v}" for k, v in per_limit.items()))
    return lines
