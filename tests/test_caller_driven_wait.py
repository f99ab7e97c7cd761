"""A caller blocked in ``wait`` drives its own process (the supervisor steps aside until the
leader exits or the wait times out). What users rely on: every byte still arrives, exactly,
whoever happened to drain it; a wait that times out hands the process back and the
supervisor carries on; a kill from another thread ends a driven wait."""

from __future__ import annotations

import os
import threading
import time

from shellseam import SubprocessService, _core
from shellseam.service import ManagedProcess


def _spawn(service: SubprocessService, command: str, stdin: bytes = b"") -> ManagedProcess:
    env = _core.Env.from_pairs([(b"PATH", os.environ.get("PATH", "/usr/bin:/bin").encode())])
    return service.spawn(
        program=b"/bin/bash",
        argv=[b"bash", b"-c", command.encode()],
        cwd="/",
        env=env,
        stdin=stdin,
        stdout_cap=1 << 20,
        stderr_cap=1 << 20,
        spill_cap=1 << 30,
        grace_ms=300,
    )


def test_output_drained_by_the_waiting_caller_is_exact(service: SubprocessService) -> None:
    # Several pipe-fulls on both streams, interleaved, while the caller waits.
    cmd = (
        "for i in $(seq 1 40); do head -c 30000 /dev/zero | tr '\\0' o; "
        "head -c 20000 /dev/zero | tr '\\0' e >&2; done; exit 5"
    )
    finished = _spawn(service, cmd).wait_result(30)
    assert finished is not None
    assert finished.outcome.exit_code == 5
    assert finished.stdout.total_bytes == 40 * 30000
    assert finished.stderr.total_bytes == 40 * 20000
    assert set(finished.stdout.text) == {"o"} and set(finished.stderr.text) == {"e"}


def test_a_timed_out_wait_hands_the_process_back(service: SubprocessService) -> None:
    # Output keeps coming after the caller gave up: the supervisor must drain it (a pipe
    # nobody drains would block the writer and the command would never finish).
    cmd = "for i in $(seq 1 30); do head -c 10000 /dev/zero | tr '\\0' x; sleep 0.01; done"
    proc = _spawn(service, cmd)
    assert proc.wait_result(0.05) is None
    deadline = time.monotonic() + 30
    while not proc.done and time.monotonic() < deadline:
        time.sleep(0.01)  # nobody waits: only the supervisor can settle it
    finished = proc.result()
    assert finished is not None
    assert finished.outcome.exit_code == 0
    assert finished.stdout.total_bytes == 300_000


def test_a_kill_from_another_thread_ends_a_driven_wait(service: SubprocessService) -> None:
    proc = _spawn(service, "echo started; exec sleep 30")
    threading.Timer(0.2, proc.kill).start()
    started = time.monotonic()
    finished = proc.wait_result(None)
    assert finished is not None
    assert time.monotonic() - started < 10
    assert finished.outcome.signal == 15
    assert finished.stdout.text == "started\n"


def test_two_waiters_on_one_process_both_see_the_result(service: SubprocessService) -> None:
    proc = _spawn(service, "sleep 0.3; printf done")
    results: list[str] = []

    def waiter() -> None:
        finished = proc.wait_result(30)
        assert finished is not None
        results.append(finished.stdout.text)

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == ["done", "done"]


def test_a_background_holder_of_the_pipes_is_left_to_the_supervisor(
    service: SubprocessService,
) -> None:
    # The leader exits while a child still holds stdout: the drain grace and the leftover
    # kill are the supervisor's, after the caller handed the pipes back.
    proc = _spawn(service, "(sleep 5; echo late) & echo early")
    finished = proc.wait_result(30)
    assert finished is not None
    assert finished.stdout.text == "early\n"
    assert finished.outcome.leftover_killed == 2  # the subshell and its sleep


def test_a_bulk_producer_is_handed_back_and_every_byte_arrives(
    service: SubprocessService,
) -> None:
    # Tens of MiB: the caller drains the first bulk read, then leaves the stream to the
    # supervisor's epoll loop; the tail and the spill file still hold every byte, in order.
    size = 24 << 20
    finished = _spawn(service, f"head -c {size} /dev/zero | tr '\\0' z; printf END").wait_result(60)
    assert finished is not None
    assert finished.outcome.exit_code == 0
    assert finished.stdout.total_bytes == size + 3
    assert finished.stdout.text.endswith("zzzEND")
    spill = finished.stdout.spill_path
    assert spill is not None and os.path.getsize(spill) == size + 3


def test_a_leader_that_closes_one_stream_early_loses_nothing_on_the_other(
    service: SubprocessService,
) -> None:
    # Once one stream closes, the waiting caller leaves the other out of its poll for a
    # moment (a leader on its way out closes both): a leader that goes on writing to the
    # other, several pipe-fulls and from the far side of a pause, must lose no byte of it.
    for closed, kept, fd in (("1", "stderr", 2), ("2", "stdout", 1)):
        cmd = (
            f"exec {closed}>&-; head -c 900000 /dev/zero | tr '\\0' k >&{fd}; "
            f"sleep 0.01; printf tail >&{fd}; exit 4"
        )
        finished = _spawn(service, cmd).wait_result(30)
        assert finished is not None
        assert finished.outcome.exit_code == 4
        out = getattr(finished, kept)
        assert out.total_bytes == 900_000 + 4
        assert out.text.endswith("ktail")
        gone = finished.stdout if kept == "stderr" else finished.stderr
        assert gone.total_bytes == 0
