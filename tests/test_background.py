"""Background processes: start, consuming merged reads, lossy reads, kill, wait, disposal."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

from conftest import pids_in_group
from shellseam import (
    LocalShellExecutor,
    ShellError,
    ShellExecRequest,
    ShellProcess,
    SubprocessService,
)
from shellseam.render import render_lossy_markers


def start(ex: LocalShellExecutor, command: str, **fields: object) -> ShellProcess:
    return ex.start(ex.resolve(ShellExecRequest(command=command, **fields)))  # type: ignore[arg-type]


def test_start_returns_at_once_and_applies_no_timeout(ex: LocalShellExecutor) -> None:
    t0 = time.monotonic()
    p = start(ex, "sleep 1; echo done", timeout_ms=100)
    assert time.monotonic() - t0 < 0.5
    assert p.status == "running" and p.exit_code is None and p.signal is None
    assert p.wait_sync(10)
    assert p.status == "completed" and p.exit_code == 0
    assert p.read_output().delta == "done\n"


def test_reads_are_consuming_and_merge_stderr_section(ex: LocalShellExecutor) -> None:
    p = start(ex, "echo a; echo b >&2; sleep 0.3; echo c")
    time.sleep(0.2)
    first = p.read_output()
    assert first.delta == "a\n\n[stderr]\nb\n" and not first.lossy
    assert p.wait_sync(10)
    second = p.read_output()
    assert second.delta == "c\n"  # no stderr since the last read: no section
    assert p.read_output().delta == ""  # reads stay valid after settlement
    assert second.stdout_spill_path is None and second.stderr_spill_path is None


def test_lossy_read_points_at_spill(service: SubprocessService) -> None:
    ex = LocalShellExecutor(max_output_bytes=1000, service=service)
    p = start(ex, "seq 1 10000")
    assert p.wait_sync(10)
    r = p.read_output()
    assert r.lossy and r.stdout_spill_path is not None
    assert len(r.delta.encode()) <= 1000 and r.delta.endswith("10000\n")
    with open(r.stdout_spill_path) as f:
        assert f.read() == "".join(f"{i}\n" for i in range(1, 10001))


def test_a_settled_process_holds_no_spill_file_open(service: SubprocessService) -> None:
    # Its collectors live as long as the process object; the spill file (its descriptor
    # and 1 MiB batch buffer) is closed when the stream ends.
    ex = LocalShellExecutor(max_output_bytes=1000, service=service)
    p = start(ex, "seq 1 10000; seq 1 10000 >&2")
    assert p.wait_sync(10)
    r = p.read_output()
    assert r.stdout_spill_path is not None and r.stderr_spill_path is not None
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            held.add(os.readlink(f"/proc/self/fd/{fd}"))
    assert r.stdout_spill_path not in held and r.stderr_spill_path not in held
    assert p.status == "completed"


def test_a_lossy_read_of_a_running_command_names_a_spill_file_complete_so_far(
    service: SubprocessService,
) -> None:
    ex = LocalShellExecutor(max_output_bytes=1000, service=service)
    p = start(ex, "seq 1 100000; echo marker >&2; sleep 30")
    try:
        deadline = time.monotonic() + 10
        seen, spill = "", None
        while "marker" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            r = p.read_output()
            seen += r.delta
            if r.stdout_spill_path is not None:
                spill = r.stdout_spill_path
        assert "marker" in seen and p.status == "running" and spill is not None
        # The stream so far is under one spill batch: nothing would be on disk yet had the
        # read not written it out.
        with open(spill) as f:
            assert f.read() == "".join(f"{i}\n" for i in range(1, 100001))
    finally:
        p.kill()
        p.wait_sync(10)


# Red team (stop 17): a lossy background read said "full output: <path>" of a spill file that
# had stopped at its cap (1 MiB of a 3.3 MB stream), or of an empty one once the service's
# spill total was used up; the foreground result says "first <n> bytes saved" for the same.
def test_lossy_read_of_a_capped_spill_says_only_the_head_was_saved(
    service: SubprocessService,
) -> None:
    ex = LocalShellExecutor(max_output_bytes=1000, max_spill_bytes=2**20, service=service)
    p = start(ex, "seq 1 500000")
    assert p.wait_sync(10)
    r = p.read_output()
    assert r.lossy and r.stdout_spill_truncated and not r.stderr_spill_truncated
    assert r.stdout_spill_path is not None
    assert os.path.getsize(r.stdout_spill_path) == 2**20
    assert render_lossy_markers(
        r.lossy, r.stdout_spill_path, r.stderr_spill_path, r.stdout_spill_truncated
    ) == [
        f"[some output was dropped from memory; first {2**20} bytes saved: {r.stdout_spill_path}]"
    ]
    uncapped = LocalShellExecutor(max_output_bytes=1000, service=service)
    q = start(uncapped, "seq 1 10000")
    assert q.wait_sync(10)
    assert not q.read_output().stdout_spill_truncated


def test_kill_is_idempotent_and_status_killed(ex: LocalShellExecutor) -> None:
    p = start(ex, "sleep 30")
    assert p.kill() is True
    assert p.kill() is False  # escalation under way
    assert p.wait_sync(10)
    assert p.status == "killed" and p.signal == "SIGTERM" and p.exit_code is None
    assert p.kill() is False  # settled: no-op


def test_completed_vs_killed_by_own_signal(ex: LocalShellExecutor) -> None:
    p = start(ex, "exit 4")
    assert p.wait_sync(10)
    assert (p.status, p.exit_code) == ("completed", 4)
    p = start(ex, "kill -9 $$")
    assert p.wait_sync(10)
    assert (p.status, p.signal) == ("killed", "SIGKILL")


def test_async_wait_and_done_callback(ex: LocalShellExecutor) -> None:
    seen: list[str] = []
    done = threading.Event()

    async def main() -> None:
        p = start(ex, "sleep 0.2")
        p.add_done_callback(lambda proc: (seen.append(proc.status), done.set()))
        await p.wait()
        assert p.status == "completed"

    asyncio.run(main())
    assert done.wait(5) and seen == ["completed"]
    late: list[str] = []
    p = start(ex, "true")
    p.wait_sync(10)
    p.add_done_callback(lambda proc: late.append(proc.status))  # settled: runs at once
    assert late == ["completed"]


def test_wait_sync_timeout(ex: LocalShellExecutor) -> None:
    p = start(ex, "sleep 30")
    assert p.wait_sync(0.1) is False
    p.kill()
    assert p.wait_sync(10) is True


def test_spawn_failure_is_delivered_once(ex: LocalShellExecutor) -> None:
    p = start(ex, "true", workdir="/no/such/dir")
    assert p.status == "killed" and p.exit_code is None
    first = p.read_output().delta
    assert first.startswith("spawn failed: ") and "/no/such/dir" in first
    assert p.read_output().delta == ""
    assert p.kill() is False
    assert p.wait_sync(0) is True
    asyncio.run(p.wait())


def test_process_survives_executor_replacement_and_dies_with_service() -> None:
    svc = SubprocessService()
    ex = LocalShellExecutor(service=svc, grace_ms=300)
    p = start(ex, "echo $$; sleep 30")
    del ex
    ex2 = LocalShellExecutor(service=svc)
    assert ex2.service is svc
    time.sleep(0.2)
    pid = int(p.read_output().delta)
    assert p.status == "running" and pids_in_group(pid)
    svc.dispose()
    assert p.status == "killed" and pids_in_group(pid) == []
    try:
        start(LocalShellExecutor(service=svc), "true")
    except ShellError as err:
        assert err.code == "DISPOSED"
    else:
        raise AssertionError("start after dispose must raise DISPOSED")


def test_aclose_kills_without_blocking_the_loop() -> None:
    async def main() -> None:
        svc = SubprocessService()
        ex = LocalShellExecutor(service=svc, grace_ms=300)
        p = start(ex, "sleep 30")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.ensure_future(ticker())
        await svc.aclose()
        t.cancel()
        assert p.status == "killed" and svc.disposed

    asyncio.run(main())


def test_partial_utf8_is_held_until_complete(ex: LocalShellExecutor) -> None:
    p = start(ex, r"printf '\xe2\x82'; sleep 0.3; printf '\xac'")
    time.sleep(0.15)
    assert p.read_output().delta == ""
    p.wait_sync(10)
    assert p.read_output().delta == "€"


def test_a_failing_done_callback_does_not_stop_the_others(ex: LocalShellExecutor) -> None:
    seen: list[str] = []
    done = threading.Event()

    def bad(_proc: ShellProcess) -> None:
        raise RuntimeError("boom")

    p = start(ex, "sleep 0.2")
    p.add_done_callback(bad)
    p.add_done_callback(lambda proc: (seen.append(proc.status), done.set()))
    assert done.wait(5) and seen == ["completed"]
    q = start(ex, "sleep 0.1")
    q.add_done_callback(lambda proc: seen.append("second"))
    assert q.wait_sync(5)
    for _ in range(100):
        if "second" in seen:
            break
        time.sleep(0.01)
    assert "second" in seen


def test_spill_path_is_given_only_for_the_stream_that_lost_bytes(
    service: SubprocessService,
) -> None:
    ex = LocalShellExecutor(max_output_bytes=1000, service=service)
    p = start(ex, "seq 1 1000; sleep 0.3; seq 1 1000 >&2")
    time.sleep(0.15)
    first = p.read_output()  # 3.9 KB of stdout through a 1000-byte tail: stdout lost bytes
    assert first.lossy and first.stdout_spill_path is not None
    assert first.stderr_spill_path is None
    assert p.wait_sync(10)
    second = p.read_output()
    assert second.lossy and second.stderr_spill_path is not None
    assert second.stdout_spill_path is None  # stdout lost nothing since the last read


def test_forked_child_never_touches_the_parents_processes(service: SubprocessService) -> None:
    import os

    ex = LocalShellExecutor(service=service, grace_ms=300)
    p = start(ex, "sleep 30")
    pid = os.fork()
    if pid == 0:  # the child: the inherited service must refuse, not signal or hang
        code = 0
        try:
            if p.kill() is not False:
                code = 1
            failed = start(ex, "true")  # a spawn failure settles the handle as killed
            if failed.status != "killed" or "forked child" not in failed.read_output().delta:
                code = 2
            try:
                ex.run_sync(ex.resolve(ShellExecRequest(command="true")))
                code = 3
            except ShellError as err:
                if err.code != "SPAWN_FAILED":
                    code = 3
            service.dispose()  # must not kill the parent's sleep
            # The default service is fresh in the child and works.
            r = LocalShellExecutor().run_sync(
                LocalShellExecutor().resolve(ShellExecRequest(command="echo child"))
            )
            if r.stdout.text != "child\n":
                code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert p.status == "running"
    assert p.kill() and p.wait_sync(10)
