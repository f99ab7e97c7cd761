"""Hygiene over thousands of calls: no zombie, no leaked fd, no leaked thread."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time

from conftest import proc_stats
from shellseam import AbortController, LocalShellExecutor, ShellExecRequest, SubprocessService
from shellseam.service import SPAWNER_THREADS


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def own_zombies() -> int:
    me = os.getpid()
    return sum(1 for _, state, ppid, _ in proc_stats() if state == "Z" and ppid == me)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def test_thousand_calls_leave_nothing_behind() -> None:
    svc = SubprocessService()
    ex = LocalShellExecutor(service=svc, grace_ms=200, max_output_bytes=100)
    # Start the supervisor and open the spill directory (the service holds its fd).
    ex.run_sync(ex.resolve(ShellExecRequest(command="seq 1 500")))
    gc.collect()  # earlier tests' event loops (and their eventfds) must not skew the count
    fds, threads = fd_count(), thread_count()

    async def batch() -> None:
        specs = []
        for i in range(1000):
            kind = i % 5
            if kind == 0:
                specs.append(ShellExecRequest(command="echo hi"))
            elif kind == 1:
                specs.append(ShellExecRequest(command="seq 1 500"))  # spills
            elif kind == 2:
                specs.append(ShellExecRequest(command="sleep 5", timeout_ms=20))
            elif kind == 3:
                c = AbortController()
                asyncio.get_running_loop().call_later(0.01, c.abort)
                specs.append(ShellExecRequest(command="sleep 5", signal=c.signal))
            else:
                specs.append(ShellExecRequest(command="exit 3", stdin="data"))
        sem = asyncio.Semaphore(64)

        async def one(req: ShellExecRequest) -> None:
            async with sem:
                await ex.run(ex.resolve(req))

        await asyncio.gather(*(one(r) for r in specs))

    asyncio.run(batch())
    for _ in range(50):
        p = ex.start(ex.resolve(ShellExecRequest(command="sleep 5")))
        p.kill()
        p.wait_sync(10)
    assert svc.running == 0
    gc.collect()
    assert own_zombies() == 0
    assert fd_count() == fds
    assert thread_count() <= threads + SPAWNER_THREADS  # the fixed pool, nothing per call
    svc.dispose()
    # The supervisor and the spawner pool are gone too. A joined Python thread may still be
    # leaving the kernel for a moment after join() returns: wait for it, boundedly.
    deadline = time.monotonic() + 10
    while thread_count() != threads - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_count() == threads - 1


def test_one_supervisor_thread_for_many_concurrent_processes() -> None:
    svc = SubprocessService()
    ex = LocalShellExecutor(service=svc)
    base = {t.ident for t in threading.enumerate()}
    native_before = thread_count()

    async def main() -> int:
        tasks = [
            asyncio.ensure_future(ex.run(ex.resolve(ShellExecRequest(command="sleep 0.5"))))
            for _ in range(200)
        ]
        await asyncio.sleep(0.2)
        during = thread_count()
        await asyncio.gather(*tasks)
        return during

    during = asyncio.run(main())
    # The supervisor and the fixed spawner pool: nothing per process or waiter.
    assert during - native_before <= 1 + SPAWNER_THREADS
    svc.dispose()
    assert {t.ident for t in threading.enumerate()} <= base


def held_fds() -> list[str]:
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    return held


def test_a_call_in_flight_holds_three_descriptors() -> None:
    # Every descriptor the harness holds is copied into each child it spawns and closed at
    # exec, and counts against RLIMIT_NOFILE: a call in flight holds its two pipes and its
    # pidfd, not its cgroup's directories or files (it held six before).
    svc = SubprocessService()
    ex = LocalShellExecutor(service=svc)
    try:
        ex.run_sync(ex.resolve(ShellExecRequest(command="true")))
        n = 48

        async def main() -> tuple[list[str], list[str]]:
            gc.collect()
            before = held_fds()
            spec = ex.resolve(ShellExecRequest(command="sleep 1"))
            tasks = [asyncio.ensure_future(ex.run(spec)) for _ in range(n)]
            deadline = time.monotonic() + 10
            while svc.running < n and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            during = held_fds()
            for r in await asyncio.gather(*tasks):
                assert r.exit_code == 0
            return before, during

        before, during = asyncio.run(main())
        cgroup = [h for h in during if h.startswith("/sys/fs/cgroup/")]
        cgroup_before = [h for h in before if h.startswith("/sys/fs/cgroup/")]
        # A kernel that resets `memory.peak` per open file (6.12+, cgroup v2 memory
        # controller) needs that file held for the call: one more each, nothing else.
        peaks = [h for h in cgroup if h.endswith("/memory.peak")]
        assert len(peaks) <= n, peaks
        # The service's parents and its warm cgroup's files were open before: nothing more.
        assert len(cgroup) - len(peaks) == len(cgroup_before), sorted(
            set(cgroup) - set(cgroup_before)
        )
        # An event loop's own selector and self-pipe come on top of the calls' three each.
        assert len(during) - len(before) <= 3 * n + len(peaks) + 6, sorted(during)
    finally:
        svc.dispose()
