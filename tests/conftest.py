"""Shared fixtures: a private SubprocessService per test and /proc inspection helpers."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from shellseam import (
    LocalShellExecutor,
    ShellExecRequest,
    ShellProcess,
    ShellRunResult,
    SubprocessService,
)

HELPERS = os.path.join(os.path.dirname(__file__), "helpers")


@pytest.fixture
def service() -> Iterator[SubprocessService]:
    svc = SubprocessService()
    yield svc
    svc.dispose()


@pytest.fixture
def ex(service: SubprocessService, tmp_path: os.PathLike[str]) -> LocalShellExecutor:
    """A local executor with a short grace so that kill paths stay fast."""
    return LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=service)


def run(executor: LocalShellExecutor, command: str, **fields: object) -> ShellRunResult:
    return executor.run_sync(executor.resolve(ShellExecRequest(command=command, **fields)))  # type: ignore[arg-type]


def proc_stats() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgrp) of every process, read from /proc/<pid>/stat."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        yield int(name), fields[0], int(fields[1]), int(fields[2])


def pids_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) members of a process group."""
    return [pid for pid, state, _, pgrp in proc_stats() if pgrp == pgid and state not in "ZX"]


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in ("Z", "X")


def first_line(proc: ShellProcess, within_s: float = 10.0) -> str:
    """What a background process printed up to its first newline (or all of it by then)."""
    deadline = time.monotonic() + within_s
    out = ""
    while "\n" not in out and time.monotonic() < deadline:
        out += proc.read_output().delta
        time.sleep(0.02)
    return out
