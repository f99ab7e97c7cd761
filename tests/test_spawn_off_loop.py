"""asyncio runs spawn on the service's native spawner threads while other runs are in flight.

Under vfork semantics the spawning thread sleeps until its child has exec'd; with other runs
in flight the loop must stay free meanwhile. A lone run (nothing of the service running)
spawns inline: there is nothing to stall, and the two thread hand-offs would cost it about
as much as the spawn. What users rely on: errors still arrive as ShellError from ``run``, a
run cancelled while its spawn is in flight leaves nothing running, and the spawners are a
fixed number of threads that ``dispose`` takes down. Which thread spawned a child is the
kernel's fact: ``/proc/self/task/<tid>/children``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

from conftest import proc_stats
from shellseam import (
    LocalShellExecutor,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    ShellExecSpec,
    ShellRunResult,
    SubprocessService,
    landlock_abi,
)
from shellseam.service import SPAWNER_THREADS


def _threads_named(name: str) -> set[int]:
    tids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == name:
                    tids.add(int(tid))
        except OSError:
            continue
    return tids


def _spawning_threads() -> dict[int, str]:
    """Each child of this process, with the name of the thread that spawned it."""
    by_child = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/children") as f:
                children = [int(p) for p in f.read().split()]
        except OSError:
            continue
        for child in children:
            by_child[child] = name if int(tid) != os.getpid() else "main"
    return by_child


def test_spawn_errors_arrive_from_run(ex: LocalShellExecutor) -> None:
    spec = ex.resolve(ShellExecRequest(command="true", workdir="/nonexistent/shellseam"))
    with pytest.raises(ShellError) as caught:
        asyncio.run(ex.run(spec))
    assert caught.value.code == "SPAWN_FAILED"
    assert "cannot change to the working directory /nonexistent/shellseam" in caught.value.reason


def test_a_queued_spawns_error_arrives_from_run(service: SubprocessService) -> None:
    ex = LocalShellExecutor(service=service)
    busy = ex.start(ex.resolve(ShellExecRequest(command="sleep 60")))  # so it is queued
    spec = ex.resolve(ShellExecRequest(command="true", workdir="/nonexistent/shellseam"))
    try:
        with pytest.raises(ShellError) as caught:
            asyncio.run(ex.run(spec))
    finally:
        busy.kill()
        busy.wait_sync(10)
    assert caught.value.code == "SPAWN_FAILED"
    assert "cannot change to the working directory /nonexistent/shellseam" in caught.value.reason


def _batch_spawners(ex: LocalShellExecutor, n: int) -> tuple[list[str], list[str]]:
    """Runs ``n`` commands at once; the spawning thread of each, and their output."""
    seen: dict[int, str] = {}

    async def main() -> list[str]:
        runs = asyncio.gather(
            *(ex.run(ex.resolve(ShellExecRequest(command="echo $$; sleep 0.5"))) for _ in range(n))
        )
        await asyncio.sleep(0.3)  # all spawned, none exited
        seen.update(_spawning_threads())
        return [r.stdout.text for r in await runs]

    out = asyncio.run(main())
    pids = [int(text.split()[0]) for text in out]
    return [seen.get(pid, "?") for pid in pids], out


def test_spawns_run_off_the_loop_thread(service: SubprocessService) -> None:
    ex = LocalShellExecutor(service=service)
    # Something of the service runs all along (here a background command): every spawn
    # then goes to the spawner threads, however quickly the batch's own commands finish.
    busy = ex.start(ex.resolve(ShellExecRequest(command="sleep 60")))
    try:
        spawned_on, _ = _batch_spawners(ex, 16)
    finally:
        busy.kill()
        busy.wait_sync(10)
    assert spawned_on == ["shellseam-spawn"] * 16
    assert 1 <= len(_threads_named("shellseam-spawn")) <= SPAWNER_THREADS * 2  # + other services


def test_a_lone_run_spawns_inline(service: SubprocessService) -> None:
    ex = LocalShellExecutor(service=service)
    spawned_on, out = _batch_spawners(ex, 1)
    assert spawned_on == ["main"], out
    # With a background command of the service running, the next run is queued.
    bg = ex.start(ex.resolve(ShellExecRequest(command="sleep 30")))
    try:
        spawned_on, out = _batch_spawners(ex, 1)
    finally:
        bg.kill()
        bg.wait_sync(10)
    assert spawned_on == ["shellseam-spawn"], out


def test_a_run_cancelled_during_its_spawn_leaves_nothing_running(
    service: SubprocessService,
) -> None:
    ex = LocalShellExecutor(service=service)
    marker = f"shellseam-cancelled-spawn-{os.getpid()}"
    # A background command keeps the service busy, so that every run spawns on the pool.
    busy = ex.start(ex.resolve(ShellExecRequest(command="sleep 60")))

    async def main() -> None:
        for _ in range(20):
            task = asyncio.ensure_future(
                ex.run(ex.resolve(ShellExecRequest(command=f"exec -a {marker} sleep 30")))
            )
            await asyncio.sleep(0)  # the spawn is submitted, maybe under way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    try:
        asyncio.run(main())
    finally:
        busy.kill()
        busy.wait_sync(10)
    # Every spawn still queued or under way lands, and each one that started must then be
    # killed, well before its `sleep 30` could end (nothing here kills them for the test).

    def leftovers() -> list[tuple[int, str, int, int]]:
        return [p for p in proc_stats() if marker in _cmdline(p[0])]

    def busy_still() -> bool:
        return bool(service._supervisor.queued or service.running or leftovers())

    deadline = time.monotonic() + 15
    while busy_still() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service._supervisor.queued == 0
    assert service.running == 0
    assert leftovers() == []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_dispose_stops_the_spawner_threads() -> None:
    svc = SubprocessService()
    ex = LocalShellExecutor(service=svc)
    before = _threads_named("shellseam-spawn")

    async def two() -> None:  # the second is queued while the first runs
        await asyncio.gather(
            *(ex.run(ex.resolve(ShellExecRequest(command="sleep 0.2"))) for _ in range(2))
        )

    asyncio.run(two())
    ours = _threads_named("shellseam-spawn") - before
    assert 1 <= len(ours) <= SPAWNER_THREADS
    svc.dispose()
    assert not ours & _threads_named("shellseam-spawn")
    # A disposed service refuses new runs with DISPOSED instead of starting new threads.
    with pytest.raises(ShellError) as caught:
        asyncio.run(ex.run(ex.resolve(ShellExecRequest(command="true"))))
    assert caught.value.code == "DISPOSED"
    assert not _threads_named("shellseam-spawn") - before


def _read_only(
    tmp_path: os.PathLike[str], grace_ms: int = 3_000
) -> tuple[SubprocessService, SandboxShellExecutor, Callable[[], list[str]]]:
    """A read-only executor on a service of its own whose spill parent is in ``tmp_path``,
    and the private ``$TMPDIR``s its calls have there now (each call gets one, removed when
    the call settles). Skips without Landlock."""
    if landlock_abi() < 1:
        pytest.skip("needs Landlock")
    parent = os.path.join(tmp_path, "spill")
    svc = SubprocessService(spill_parent=parent)
    ws = os.path.join(tmp_path, "ws")
    os.mkdir(ws)
    ro = SandboxShellExecutor(mode="read-only", cwd=ws, service=svc, grace_ms=grace_ms)

    def scratch() -> list[str]:
        return sorted(d for d in os.listdir(parent) if d.startswith("tmp-"))

    return svc, ro, scratch


def test_a_run_cancelled_while_queued_settles_its_confinement(tmp_path: os.PathLike[str]) -> None:
    # A read-only call gets a private $TMPDIR in the spill parent, removed when the call
    # settles: a run cancelled while its spawn was queued must settle it too, also when
    # its loop closed before the spawn landed.
    svc, ro, scratch = _read_only(tmp_path)
    busy = ro.start(ro.resolve(ShellExecRequest(command="sleep 60")))
    held = scratch()  # the background command's own
    assert len(held) == 1

    async def main() -> None:
        tasks = [
            asyncio.ensure_future(ro.run(ro.resolve(ShellExecRequest(command="sleep 30"))))
            for _ in range(8)
        ]
        await asyncio.sleep(0)  # each has queued its spawn
        for task in tasks:
            task.cancel()
        for task in tasks:
            with pytest.raises(asyncio.CancelledError):
                await task

    try:
        asyncio.run(main())  # the loop is gone before some spawns land
        deadline = time.monotonic() + 15
        while (svc._supervisor.queued or svc.running > 1 or scratch() != held) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert scratch() == held
        assert svc.running == 1
    finally:
        busy.kill()
        busy.wait_sync(10)
        svc.dispose()


def test_a_cancelled_run_reraises_only_once_its_group_is_reaped(
    service: SubprocessService,
) -> None:
    # SPEC §2: cancelling the awaiting task kills the group and re-raises once it has been
    # reaped, also for a run whose spawn was still queued when the cancel came.
    ex = LocalShellExecutor(service=service)
    marker = f"shellseam-reaped-before-raise-{os.getpid()}"
    busy = ex.start(ex.resolve(ShellExecRequest(command="sleep 60")))  # so runs are queued

    async def main() -> list[str]:
        seen = []
        for _ in range(10):
            spec = ex.resolve(ShellExecRequest(command=f"exec -a {marker} sleep 30"))
            task = asyncio.ensure_future(ex.run(spec))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert service.running == 1, "only the background command is left"
            assert service._supervisor.queued == 0, "no spawn of it still to land"
            seen += [_cmdline(p[0]) for p in proc_stats() if marker in _cmdline(p[0])]
        return seen

    try:
        assert asyncio.run(main()) == []
    finally:
        busy.kill()
        busy.wait_sync(10)


def test_the_timeout_of_an_async_run_does_not_wait_for_a_busy_loop(
    ex: LocalShellExecutor,
) -> None:
    # The supervisor keeps the timeout: a loop blocked by other work (a synchronous call in
    # another task) does not stretch a run's timeout to the length of that work.
    spec = ex.resolve(ShellExecRequest(command="sleep 30", timeout_ms=300))

    async def main() -> ShellRunResult:
        run = asyncio.ensure_future(ex.run(spec))
        await asyncio.sleep(0.05)  # spawned
        time.sleep(2.0)  # the loop is blocked well past the timeout
        return await run

    result = asyncio.run(main())
    assert result.timed_out
    assert result.exit_code is None
    assert 250 <= result.duration_ms < 1500, result.duration_ms


def test_an_abort_after_the_timeout_keeps_the_timeout(ex: LocalShellExecutor) -> None:
    from shellseam import AbortController

    controller = AbortController()
    spec = ex.resolve(
        ShellExecRequest(command="trap '' TERM; sleep 30", timeout_ms=200, signal=controller.signal)
    )

    async def main() -> ShellRunResult:
        run = asyncio.ensure_future(ex.run(spec))
        await asyncio.sleep(0.35)  # timed out, its group in the kill's grace (TERM ignored)
        controller.abort()
        return await run

    result = asyncio.run(main())
    assert result.timed_out
    assert not result.aborted


def test_a_run_coroutine_closed_unfinished_kills_its_command(
    service: SubprocessService,
) -> None:
    # A coroutine closed before its run is over (a loop torn down without cancelling its
    # tasks) cannot wait for the reap; it still may not leave the command running.
    ex = LocalShellExecutor(service=service)
    marker = f"shellseam-closed-coroutine-{os.getpid()}"
    spec = ex.resolve(ShellExecRequest(command=f"exec -a {marker} sleep 30"))

    async def main() -> None:
        coro = ex.run(spec)
        step = coro.__await__()
        next(step)  # spawned (inline: nothing else runs), now waiting for the end
        coro.close()

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while service.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.running == 0
    assert [p for p in proc_stats() if marker in _cmdline(p[0])] == []


@pytest.mark.parametrize("first_ms, second_ms", [(60_000, 300), (300, 700)])
def test_each_runs_timeout_fires_on_time_whatever_was_armed_before(
    ex: LocalShellExecutor, first_ms: int, second_ms: int
) -> None:
    # The supervisor is woken for a new timeout only when it is due before the end of its
    # current sleep; one due later is taken when it wakes for the earlier one.
    def spec(timeout_ms: int) -> ShellExecSpec:
        return ex.resolve(ShellExecRequest(command="sleep 30", timeout_ms=timeout_ms))

    async def main() -> tuple[ShellRunResult | None, ShellRunResult]:
        first = asyncio.ensure_future(ex.run(spec(first_ms)))
        await asyncio.sleep(0.1)  # its timer is the supervisor's
        second = await ex.run(spec(second_ms))
        if first_ms > 10_000:
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            return None, second
        return await first, second

    first, second = asyncio.run(main())
    assert second.timed_out
    assert second_ms - 50 <= second.duration_ms < second_ms + 800, second.duration_ms
    assert first is None or first.timed_out


def test_a_closed_run_coroutine_settles_its_confinement_once_the_command_is_gone(
    tmp_path: os.PathLike[str],
) -> None:
    # The dispatcher settles what the closed coroutine cannot wait for: a read-only call's
    # private $TMPDIR is removed once its killed command is gone, not before.
    svc, ro, scratch = _read_only(tmp_path, grace_ms=300)
    marker = f"shellseam-closed-confined-{os.getpid()}"
    spec = ro.resolve(ShellExecRequest(command=f"exec -a {marker} sleep 30"))

    async def main() -> None:
        coro = ro.run(spec)
        step = coro.__await__()
        next(step)  # spawned, waiting for the end
        assert len(scratch()) == 1
        coro.close()

    try:
        asyncio.run(main())
        deadline = time.monotonic() + 10
        while (svc.running or scratch()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.running == 0
        assert scratch() == []
        assert [p for p in proc_stats() if marker in _cmdline(p[0])] == []
    finally:
        svc.dispose()
