"""TaskRuntime: ids, owner fencing, consuming reads, waits, kills, notices and disposal."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fakes import FakeProcess
from shellseam.tasks import TaskInfo, TaskNotFound, TaskRead, TaskRuntime


class BareHandle:
    """Only the read/kill/wait surface: no ``add_done_callback``."""

    def __init__(self) -> None:
        self.inner = FakeProcess()

    @property
    def status(self) -> str:
        return self.inner.status

    @property
    def exit_code(self) -> int | None:
        return self.inner.exit_code

    @property
    def signal(self) -> str | None:
        return self.inner.signal

    def read_output(self):  # type: ignore[no-untyped-def]
        return self.inner.read_output()

    def kill(self) -> bool:
        return self.inner.kill()

    async def wait(self) -> None:
        await self.inner.wait()


def test_ids_are_kind_and_counter_per_runtime() -> None:
    rt = TaskRuntime()
    assert rt.start("bash", "s1", FakeProcess()) == "bash-1"
    assert rt.start("bash", "s2", FakeProcess()) == "bash-2"
    assert rt.start("agent", "s1", FakeProcess()) == "agent-1"
    assert rt.start("bash", "s1", FakeProcess()) == "bash-3"
    assert TaskRuntime().start("bash", "s1", FakeProcess()) == "bash-1"
    with pytest.raises(ValueError):
        rt.start("", "s1", FakeProcess())


def test_foreign_and_unknown_ids_answer_alike() -> None:
    async def main() -> None:
        rt = TaskRuntime()
        proc = FakeProcess()
        task_id = rt.start("bash", "alice", proc)
        for tid in (task_id, "bash-99"):
            with pytest.raises(TaskNotFound) as info:
                rt.read(tid, "mallory")
            assert info.value.task_id == tid
            assert str(info.value) == f"no such task: {tid}"
            assert isinstance(info.value, KeyError)
            with pytest.raises(TaskNotFound):
                rt.kill(tid, "mallory")
            with pytest.raises(TaskNotFound):
                await rt.wait(tid, "mallory", 10)
        assert rt.list("mallory") == []
        assert proc.kill_calls == 0
        assert rt.drain_notices("mallory") == []

    asyncio.run(main())


def test_read_is_consuming_and_reports_status() -> None:
    rt = TaskRuntime()
    proc = FakeProcess()
    tid = rt.start("bash", "s", proc, "count things")
    proc.feed("one\n", "warn\n")
    first = TaskRead(tid, "running", None, None, "one\n\n[stderr]\nwarn\n", False)
    assert rt.read(tid, "s") == first
    assert rt.read(tid, "s").delta == ""
    proc.feed("two\n")
    proc.drop("/spill/out", None)
    proc.finish(3)
    assert rt.read(tid, "s") == TaskRead(tid, "completed", 3, None, "two\n", True, "/spill/out")


def test_list_reports_every_task_of_the_owner_in_start_order() -> None:
    rt = TaskRuntime()
    a, b, other = FakeProcess(), FakeProcess(), FakeProcess()
    ta = rt.start("bash", "s", a, "first")
    tb = rt.start("bash", "s", b)
    rt.start("bash", "t", other, "not yours")
    b.finish(None, "SIGKILL")
    assert rt.list("s") == [
        TaskInfo(ta, "bash", "running", None, None, "first"),
        TaskInfo(tb, "bash", "killed", None, "SIGKILL", ""),
    ]


def test_kill_then_kill_again() -> None:
    rt = TaskRuntime()
    proc = FakeProcess()
    tid = rt.start("bash", "s", proc)
    assert rt.kill(tid, "s") is True
    assert proc.status == "killed"
    assert rt.kill(tid, "s") is False


def test_notice_queued_on_settle_and_delivered_once() -> None:
    rt = TaskRuntime()
    proc, other = FakeProcess(), FakeProcess()
    tid = rt.start("bash", "s", proc)
    rt.start("bash", "t", other)
    assert rt.drain_notices("s") == []
    proc.finish_later(0.01, exit_code=0).join()
    assert rt.drain_notices("t") == []
    assert rt.drain_notices("s") == [f"background task {tid} finished: completed"]
    assert rt.drain_notices("s") == []
    # A read after delivery still works and does not requeue anything.
    assert rt.read(tid, "s").status == "completed"
    assert rt.drain_notices("s") == []


def test_notice_dropped_when_a_read_observes_the_settled_task_first() -> None:
    rt = TaskRuntime()
    proc = FakeProcess()
    tid = rt.start("bash", "s", proc)
    proc.finish(None, "SIGTERM")
    assert rt.read(tid, "s").status == "killed"
    assert rt.drain_notices("s") == []


def test_read_while_running_does_not_drop_the_later_notice() -> None:
    rt = TaskRuntime()
    proc = FakeProcess()
    tid = rt.start("bash", "s", proc)
    rt.read(tid, "s")
    rt.kill(tid, "s")
    assert rt.drain_notices("s") == [f"background task {tid} finished: killed"]


def test_handle_without_done_callback_gets_notice_on_drain() -> None:
    rt = TaskRuntime()
    handle = BareHandle()
    tid = rt.start("bash", "s", handle)  # type: ignore[arg-type]
    handle.inner.finish(0)
    assert rt.drain_notices("s") == [f"background task {tid} finished: completed"]
    assert rt.drain_notices("s") == []


def test_already_settled_handle_registers_and_notifies() -> None:
    rt = TaskRuntime()
    proc = FakeProcess()
    proc.finish(1)
    tid = rt.start("bash", "s", proc)
    assert rt.drain_notices("s") == [f"background task {tid} finished: completed"]


def test_wait_times_out_then_settles() -> None:
    async def main() -> None:
        rt = TaskRuntime()
        proc = FakeProcess()
        tid = rt.start("bash", "s", proc)
        started = time.monotonic()
        assert await rt.wait(tid, "s", 50) is False
        assert time.monotonic() - started >= 0.04
        assert await rt.wait(tid, "s", 0) is False
        proc.finish_later(0.05, exit_code=0)
        assert await rt.wait(tid, "s", 5_000) is True
        assert await rt.wait(tid, "s", 0) is True
        # The waits above did not consume the notice: wait is not a read.
        assert rt.drain_notices("s") == [f"background task {tid} finished: completed"]

    asyncio.run(main())


def test_dispose_owner_kills_awaits_and_forgets_only_that_owner() -> None:
    async def main() -> None:
        rt = TaskRuntime()
        slow = FakeProcess(kill_settles=False)
        done = FakeProcess()
        keep = FakeProcess()
        t_slow = rt.start("bash", "s", slow)
        rt.start("bash", "s", done)
        t_keep = rt.start("bash", "t", keep)
        done.finish(0)

        def settle_after_kill() -> None:
            while slow.kill_calls == 0:
                time.sleep(0.005)
            slow.finish_later(0.05, exit_code=None, signal="SIGKILL")

        threading.Thread(target=settle_after_kill, daemon=True).start()
        await rt.dispose_owner("s")
        assert slow.status == "killed"
        assert slow.kill_calls == 1
        assert rt.list("s") == []
        assert rt.drain_notices("s") == []
        with pytest.raises(TaskNotFound):
            rt.read(t_slow, "s")
        assert keep.status == "running"
        assert rt.list("t")[0].id == t_keep

    asyncio.run(main())


def test_dispose_kills_everything_and_refuses_new_tasks() -> None:
    async def main() -> None:
        rt = TaskRuntime()
        procs = [FakeProcess() for _ in range(3)]
        for i, proc in enumerate(procs):
            rt.start("bash", f"s{i}", proc)
        await rt.dispose()
        assert [p.status for p in procs] == ["killed"] * 3
        late = FakeProcess()
        with pytest.raises(RuntimeError, match="disposed"):
            rt.start("bash", "s0", late)
        assert late.status == "killed"

    asyncio.run(main())


def test_concurrent_settlements_each_notify_exactly_once() -> None:
    rt = TaskRuntime()
    procs = [FakeProcess() for _ in range(200)]
    ids = [rt.start("bash", "s", p) for p in procs]
    delivered: list[str] = []
    threads = [p.finish_later(0.001 * (i % 7), exit_code=i % 3) for i, p in enumerate(procs)]
    while any(t.is_alive() for t in threads):
        delivered += rt.drain_notices("s")
    delivered += rt.drain_notices("s")
    assert sorted(delivered) == sorted(f"background task {t} finished: completed" for t in ids)
