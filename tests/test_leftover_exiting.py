"""A background job that prints its last line and exits is not a leftover.

A process closes its pipes (the supervisor's EOF) before it becomes a zombie; a count of
the group taken in between saw it as alive, so ``(sleep 0.01; echo late) & echo early``
rendered ``[stopped 1 leftover background process]`` in about 4 calls of 10 under dash,
which mini-swe-agent users then saw in their observations. Processes already in exit(2)
are not counted: nothing was stopped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from containment_helpers import new_cgroup_dirs, own_cgroup_dirs

from conftest import run
from shellseam import LocalShellExecutor, SubprocessService


@pytest.mark.parametrize("shell", ["/bin/sh", "bash"])
def test_a_job_that_exits_on_its_own_is_never_counted(
    service: SubprocessService, shell: str
) -> None:
    executor = LocalShellExecutor(shell=shell, grace_ms=2_000, service=service)
    for _ in range(60):
        result = run(executor, "(sleep 0.01; echo late) & echo early")
        assert (result.stdout.text, result.leftover_killed) == ("early\nlate\n", 0)


def test_a_job_still_running_is_counted(service: SubprocessService) -> None:
    executor = LocalShellExecutor(shell="/bin/sh", grace_ms=200, service=service)
    result = run(executor, "sleep 30 > /dev/null 2>&1 & echo started")
    assert (result.stdout.text, result.leftover_killed) == ("started\n", 1)


# Found by attacking: a job with threads and a large address space that exits on its own
# (`exit_group`) shows a zombie main thread and other threads for as long as the address
# space takes to tear down (half a second for 4 GiB), every one of them exiting. It was taken
# for a process whose main thread exited while others run on, and counted (3 calls of 3
# under session containment).
BIG_JOB = """
import os, sys, threading
block = bytearray(1 << 31)
block[::4096] = b"\\1" * (len(block) // 4096)  # every page touched: 2 GiB to tear down
for _ in range(4):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
with open(sys.argv[1], "w") as fifo:
    fifo.write("x")
os._exit(0)
"""


# Found by attacking: a worker thread calls `exit_group` while the main thread is deep in the
# kernel (a long `munmap`): the main thread shows neither a zombie's state nor `PF_EXITING`
# until it returns, only the SIGKILL `exit_group` queued on it. It was counted (10 of 10).
MUNMAP_JOB = """
import ctypes, mmap, os, sys, threading
block = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000)  # POPULATE
address = ctypes.addressof(ctypes.c_char.from_buffer(block))
def worker():
    with open(sys.argv[1], "w") as fifo:
        fifo.write("x")
    os._exit(0)
threading.Thread(target=worker).start()
ctypes.CDLL(None).munmap(ctypes.c_void_p(address), ctypes.c_size_t(3 << 30))
"""


def job_call(
    service: SubprocessService, tmp_path: Path, containment: str, grace_ms: int, job: str
) -> tuple[LocalShellExecutor, str]:
    """An executor, and the start of a command that runs the Python source ``job`` (given a
    fifo's path) in the background and waits until the job writes to the fifo; the caller
    appends the rest of the command."""
    executor = LocalShellExecutor(
        grace_ms=grace_ms,
        service=service,
        containment=containment,  # type: ignore[arg-type]
    )
    script = tmp_path / "job.py"
    script.write_text(job)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return executor, f"{sys.executable} {script} {fifo} > /dev/null 2>&1 & read x < {fifo}; "


@pytest.mark.parametrize("containment", ["auto", "session"])
@pytest.mark.parametrize("job", ["threads tearing down 2 GiB", "main thread in munmap"])
def test_a_job_in_exit_group_is_never_counted(
    service: SubprocessService, tmp_path: Path, containment: str, job: str
) -> None:
    source = BIG_JOB if job.startswith("threads") else MUNMAP_JOB
    executor, start = job_call(service, tmp_path, containment, 2_000, source)
    # The job writes, then exits: a moment for its exit to begin (the teardown it then does
    # takes far longer), else under load the count could rightly find it still running.
    command = start + "sleep 0.05; echo done"
    before = own_cgroup_dirs()
    for _ in range(3):
        result = run(executor, command)
        assert (result.stdout.text, result.leftover_killed) == ("done\n", 0)
    # A job still exiting as its call settles keeps its cgroup busy a moment: dispose() waits
    # for it (it left the cgroup directories behind when the machine was loaded).
    service.dispose()
    assert new_cgroup_dirs(before) == []


# Found by attacking: `execve` in a worker thread queues a SIGKILL on every other thread, the
# main thread too, busy here in a long `munmap`; the process then runs on as the new program.
# Taken for exiting by its main thread's pending SIGKILL, it was never counted.
EXEC_JOB = """
import ctypes, mmap, os, sys, threading, time
block = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000)  # POPULATE
address = ctypes.addressof(ctypes.c_char.from_buffer(block))
def exec_sleep():
    time.sleep(0.05)  # the main thread is in munmap by now
    with open(sys.argv[1], "w") as fifo:
        fifo.write("x")
    os.execv("/bin/sleep", ["sleep", "300"])
threading.Thread(target=exec_sleep).start()
ctypes.CDLL(None).munmap(ctypes.c_void_p(address), ctypes.c_size_t(3 << 30))
"""


@pytest.mark.parametrize("containment", ["auto", "session"])
def test_a_job_that_execs_from_a_thread_is_counted(
    service: SubprocessService, tmp_path: Path, containment: str
) -> None:
    executor, start = job_call(service, tmp_path, containment, 200, EXEC_JOB)
    command = start + "echo done"
    for _ in range(3):
        result = run(executor, command)
        assert (result.stdout.text, result.leftover_killed) == ("done\n", 1)
