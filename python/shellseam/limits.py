"""Resource limits: tightening, and the host's containment facts.

An executor's ``limits`` are ceilings set by whoever built it; a request may only tighten
them (field-wise minimum). Their validation lives with the seam's other checks
(``checks.check_limits`` for constructors, ``checks.request_limits`` for requests and specs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from .checks import LIMIT_FIELDS
from .service import host_containment
from .types import ResourceLimits

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
