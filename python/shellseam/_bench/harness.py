"""What every benchmark shares: sizes (``FULL``, ``QUICK``, ``TINY``), table rows and their
verdicts, interleaved timing, and the executors and environment of the in-process runs.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import resource
import shutil
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from shellseam import (
    LocalShellExecutor,
    ShellExecRequest,
    ShellExecSpec,
    ShellRunResult,
    SubprocessService,
)

Verdict = Literal["PASS", "MISS", "info", "skip"]

MIB = 1 << 20
GIB = 1 << 30
BASH = "/bin/bash" if os.access("/bin/bash", os.X_OK) else (shutil.which("bash") or "/bin/bash")
TRUE_ARGV = ["bash", "-c", "true"]


@dataclass(frozen=True)
class Config:
    """How much work each benchmark does; ``FULL``, ``QUICK`` and ``TINY`` (tests)."""

    sequential_reps: int
    inflight_count: int
    inflight_rounds: int
    big_output_bytes: int
    big_output_rounds: int
    big_parent_bytes: int
    big_parent_rounds: int
    parent_spawn_reps: int
    parent_fork_reps: int
    concurrent_count: int
    concurrent_sleep_s: float
    concurrent_rounds: int
    sandbox_reps: int


FULL = Config(
    sequential_reps=600,
    inflight_count=64,
    inflight_rounds=40,
    big_output_bytes=GIB,
    big_output_rounds=9,
    big_parent_bytes=2 * GIB,
    big_parent_rounds=12,
    parent_spawn_reps=25,
    parent_fork_reps=2,
    concurrent_count=1024,
    concurrent_sleep_s=1.0,
    concurrent_rounds=3,
    sandbox_reps=600,
)
QUICK = Config(
    sequential_reps=300,
    inflight_count=64,
    inflight_rounds=20,
    big_output_bytes=GIB,
    big_output_rounds=5,
    big_parent_bytes=GIB,
    big_parent_rounds=8,
    parent_spawn_reps=15,
    parent_fork_reps=1,
    concurrent_count=256,
    concurrent_sleep_s=1.0,
    concurrent_rounds=2,
    sandbox_reps=300,
)
#: A configuration that exercises every code path in seconds (the smoke test's).
TINY = Config(
    sequential_reps=5,
    inflight_count=4,
    inflight_rounds=2,
    big_output_bytes=4 * MIB,
    big_output_rounds=1,
    big_parent_bytes=32 * MIB,
    big_parent_rounds=2,
    parent_spawn_reps=3,
    parent_fork_reps=1,
    concurrent_count=8,
    concurrent_sleep_s=0.05,
    concurrent_rounds=1,
    sandbox_reps=5,
)

BENCHES = (
    "sequential",
    "inflight",
    "big-output",
    "big-parent",
    "concurrent",
    "sandbox",
    "containment",
)


@dataclass(frozen=True)
class Row:
    """One line of the table: a shellseam figure, its peer's, and the compared value."""

    bench: str
    metric: str
    ours: float | None  # shellseam's median, in ``unit``
    peer: float | None  # the peer's median, in ``unit`` (None: an absolute target)
    unit: str
    value: float | None  # what the target judges: a ratio ("x") or an absolute figure
    value_unit: str
    target: str
    verdict: Verdict
    note: str = ""


# -- measurement helpers ------------------------------------------------------------------


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples) if samples else math.nan


def _orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """One order per round, shuffled (fixed seed): every contender goes first, last and
    after every other one about equally often, so neither drift in machine load nor the
    after-effects of one contender (a namespace teardown, dirty pages) favour anybody."""
    rng = random.Random(0x5EA)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def interleaved(
    contenders: Mapping[str, Callable[[], float]], rounds: int, *, warm_up: bool = True
) -> dict[str, list[float]]:
    """Runs every contender once per round; each call returns its own duration."""
    for fn in contenders.values() if warm_up else ():  # imports, supervisor, page cache
        fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    gc.collect()
    for order in _orders(list(contenders), rounds):
        for name in order:
            samples[name].append(contenders[name]())
    return samples


async def interleaved_async(
    contenders: Mapping[str, Callable[[], Awaitable[float]]], rounds: int
) -> dict[str, list[float]]:
    for fn in contenders.values():
        await fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    gc.collect()
    for order in _orders(list(contenders), rounds):
        for name in order:
            samples[name].append(await contenders[name]())
    return samples


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    return run


def spawn_wait(path: str, argv: list[str], env: Mapping[bytes, bytes]) -> int:
    """The floor: one ``posix_spawn`` and a blocking ``waitpid``, nothing else."""
    pid = os.posix_spawn(path, argv, env)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def checked(result: ShellRunResult, stdout_bytes: int | None = None) -> ShellRunResult:
    if result.exit_code != 0:
        raise RuntimeError(f"benchmark command failed: {result}")
    if stdout_bytes is not None and result.stdout.total_bytes != stdout_bytes:
        raise RuntimeError(f"expected {stdout_bytes} bytes, got {result.stdout.total_bytes}")
    return result


def ratio_row(
    bench: str,
    metric: str,
    ours: float,
    peer: float,
    unit: str,
    target: float | None,
    *,
    higher_is_better: bool = False,
    strict: bool = False,
    note: str = "",
) -> Row:
    """``ours / peer`` judged against ``target`` (≤, or ≥ when ``higher_is_better``)."""
    ratio = ours / peer if peer else math.nan
    if target is None:
        return Row(bench, metric, ours, peer, unit, ratio, "x", "-", "info", note)
    op = ">=" if higher_is_better else ("<" if strict else "<=")
    met = {">=": ratio >= target, "<": ratio < target, "<=": ratio <= target}[op]
    verdict: Verdict = "PASS" if met else "MISS"
    return Row(bench, metric, ours, peer, unit, ratio, "x", f"{op} {target:.2f}x", verdict, note)


def limit_row(
    bench: str, metric: str, value: float, unit: str, limit: float, note: str = ""
) -> Row:
    verdict: Verdict = "PASS" if value <= limit else "MISS"
    return Row(bench, metric, value, None, unit, value, unit, f"<= {limit:g} {unit}", verdict, note)


def info_row(bench: str, metric: str, value: float, unit: str, note: str = "") -> Row:
    return Row(bench, metric, value, None, unit, value, unit, "-", "info", note)


def thread_count() -> int:
    """Native threads included (the supervisor is no Python thread)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def settle_threads(baseline: int, timeout_s: float = 10.0) -> None:
    """Waits for helper threads of a previous contender (asyncio's watchers) to exit."""
    deadline = time.monotonic() + timeout_s
    while thread_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)


def raise_nofile(needed: int) -> None:
    """Raises the soft fd limit to the hard one when ``needed`` fds would not fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Harness:
    """The executors and environment shared by the in-process benchmarks."""

    def __init__(self) -> None:
        self.service = SubprocessService()
        self.local = LocalShellExecutor(service=self.service)
        true_spec = self.spec("true")
        # The floor and the peers get the very environment shellseam passes, so every child
        # does identical work and only the spawning differs.
        self.env: dict[bytes, bytes] = dict(self.local.child_env(true_spec))

    def spec(self, command: str, executor: LocalShellExecutor | None = None) -> ShellExecSpec:
        return (executor or self.local).resolve(ShellExecRequest(command=command))

    def close(self) -> None:
        self.service.dispose()
