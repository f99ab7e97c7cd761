"""asyncio runs spawn on the service's fixed spawner pool while other runs are in flight.

Under vfork semantics the spawning thread sleeps until its child has exec'd; with other runs
in flight the loop must stay free meanwhile. A lone run (nothing of the service running)
spawns inline: there is nothing to stall, and the two thread hand-offs would cost it about
as much as the spawn. What users rely on: errors still arrive as ShellError from ``run``, a
run cancelled while its spawn is in flight leaves nothing running, and the pool is a fixed
number of threads that ``dispose`` takes down.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from conftest import proc_stats
from shellseam import LocalShellExecutor, ShellError, ShellExecRequest, SubprocessService
from shellseam.service import SPAWNER_THREADS


def _spawner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("shellseam-spawn")]


def test_spawn_errors_arrive_from_run(ex: LocalShellExecutor) -> None:
    spec = ex.resolve(ShellExecRequest(command="true", workdir="/nonexistent/shellseam"))
    with pytest.raises(ShellError) as caught:
        asyncio.run(ex.run(spec))
    assert caught.value.code == "SPAWN_FAILED"
    assert "cannot change to the working directory /nonexistent/shellseam" in caught.value.reason


def _recording(ex: LocalShellExecutor) -> list[str]:
    """Names of the threads ``ex`` spawns on, from now on."""
    spawned_on: list[str] = []
    spawn = ex._spawn

    def recording_spawn(*args: object, **kwargs: object) -> object:
        spawned_on.append(threading.current_thread().name)
        return spawn(*args, **kwargs)  # type: ignore[arg-type]

    ex._spawn = recording_spawn  # type: ignore[assignment,method-assign]
    return spawned_on


def test_spawns_run_off_the_loop_thread(service: SubprocessService) -> None:
    ex = LocalShellExecutor(service=service)
    spawned_on = _recording(ex)
    before = {t.ident for t in _spawner_threads()}  # other services' pools
    # Something of the service runs all along (here a background command): every spawn
    # then goes to the pool, however quickly the batch's own commands finish.
    busy = ex.start(ex.resolve(ShellExecRequest(command="sleep 60")))

    async def main() -> None:
        results = await asyncio.gather(
            *(ex.run(ex.resolve(ShellExecRequest(command="echo hi"))) for _ in range(16))
        )
        assert [r.stdout.text for r in results] == ["hi\n"] * 16

    try:
        asyncio.run(main())
    finally:
        busy.kill()
        busy.wait_sync(10)
    assert len(spawned_on) == 17
    assert all(name.startswith("shellseam-spawn") for name in spawned_on[1:]), spawned_on
    assert len([t for t in _spawner_threads() if t.ident not in before]) <= SPAWNER_THREADS


def test_a_lone_run_spawns_inline(service: SubprocessService) -> None:
    ex = LocalShellExecutor(service=service)
    spawned_on = _recording(ex)

    async def main() -> None:
        for _ in range(3):
            r = await ex.run(ex.resolve(ShellExecRequest(command="echo hi")))
            assert r.stdout.text == "hi\n"

    asyncio.run(main())
    assert spawned_on == [threading.current_thread().name] * 3
    # With a background command of the service running, the next run goes to the pool.
    bg = ex.start(ex.resolve(ShellExecRequest(command="sleep 30")))
    try:
        asyncio.run(main())
    finally:
        bg.kill()
        bg.wait_sync(10)
    assert all(name.startswith("shellseam-spawn") for name in spawned_on[4:]), spawned_on


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
    # Let every spawn still queued or under way land (the pool's shutdown waits for them):
    # each one that started must then be killed, well before its `sleep 30` could end
    # (nothing here kills them for the test).
    pool = service._spawners
    assert pool is not None
    pool.shutdown(wait=True)

    def leftovers() -> list[tuple[int, str, int, int]]:
        return [p for p in proc_stats() if marker in _cmdline(p[0])]

    deadline = time.monotonic() + 15
    while (service.running or leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
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
    before = {t.ident for t in _spawner_threads()}

    async def two() -> None:  # the second spawns on the pool while the first runs
        await asyncio.gather(
            *(ex.run(ex.resolve(ShellExecRequest(command="sleep 0.2"))) for _ in range(2))
        )

    asyncio.run(two())
    ours = [t for t in _spawner_threads() if t.ident not in before]
    assert 1 <= len(ours) <= SPAWNER_THREADS
    svc.dispose()
    assert not any(t.is_alive() for t in ours)
    # A disposed service refuses new runs with DISPOSED instead of starting a new pool.
    with pytest.raises(ShellError) as caught:
        asyncio.run(ex.run(ex.resolve(ShellExecRequest(command="true"))))
    assert caught.value.code == "DISPOSED"
    assert not [t for t in _spawner_threads() if t.ident not in before]
