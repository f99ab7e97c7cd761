"""A harness that reaps children itself (``waitpid(-1)``) steals the shell's status: the
result says the status is unknown instead of inventing ``exit code: 0`` (SPEC §3)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import HELPERS, run
from fakes import run_result
from shellseam import (
    LocalShellExecutor,
    ShellRunResult,
    SubprocessService,
    containment_facts,
    parse_exit_status,
    render_result,
)


@pytest.fixture
def stray_reaper() -> Iterator[list[int]]:
    """A thread that reaps any child of this process as soon as it exits, as a careless
    harness's SIGCHLD handler would; yields the pids it stole."""
    stolen: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid:
                stolen.append(pid)
            else:
                stop.wait(0.0002)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield stolen
    finally:
        stop.set()
        thread.join()


def test_a_stolen_status_is_unknown_never_a_made_up_zero(
    ex: LocalShellExecutor, stray_reaper: list[int]
) -> None:
    results: list[ShellRunResult] = []
    for _ in range(200):
        result = run(ex, "echo failing; exit 3")
        results.append(result)
        if result.exit_status_unknown:
            break
    stolen = [r for r in results if r.exit_status_unknown]
    assert stolen, f"the stray reaper never won the race ({len(stray_reaper)} reaped)"
    for r in results:
        assert r.stdout.text == "failing\n"
        if r.exit_status_unknown:
            assert (r.exit_code, r.signal) == (None, None)
            assert render_result(r) == "failing\n[exit status unknown]"
        else:
            assert (r.exit_code, r.signal) == (3, None)
            assert render_result(r).endswith("[exit code: 3]")


def test_unknown_status_renders_as_the_last_line_and_parses_back() -> None:
    text = render_result(
        run_result("out\n", exit_code=None, exit_status_unknown=True, leftover_killed=1)
    )
    assert text == "out\n[stopped 1 leftover background process]\n[exit status unknown]"
    assert parse_exit_status(text) == (
        "out\n[stopped 1 leftover background process]",
        {"unknown": True},
    )
    assert ShellRunResult.__dataclass_fields__["exit_status_unknown"].default is False


# Found by attacking: once the harness's stray reaper took the leader, its number is free,
# and a command that left the session can bring the pid allocator round so that the
# harness's next process gets it (a `Popen(start_new_session=True)`: its own group and
# session, both numbered like the call's). The call then signalled that group by number:
# SIGTERM at the drain's end, SIGKILL when it settled, and a session scan counted the
# stranger as a leftover. The call's group is now signalled through the leader's pidfd
# (the group itself, not its number) and the session is scanned only while the leader is
# provably unreaped.
TAKE = os.path.join(HELPERS, "take_the_leaders_number.py")


@pytest.mark.parametrize("containment", ["auto", "session"])
def test_a_leader_reaped_elsewhere_never_lends_its_number_to_the_calls_kill(
    containment: str, service: SubprocessService, tmp_path: Path
) -> None:
    if containment == "auto" and containment_facts()["containment"] != "cgroup":
        pytest.skip("no writable cgroup hierarchy")
    ex = LocalShellExecutor(
        cwd=str(tmp_path),
        grace_ms=20_000,  # the drain waits for the escapee, whatever the lap takes
        service=service,
        containment=containment,  # type: ignore[arg-type]
    )
    for attempt in range(5):
        ready, go = tmp_path / f"ready{attempt}", tmp_path / f"go{attempt}"
        stranger: list[subprocess.Popen[bytes]] = []
        stop = threading.Event()
        thread = threading.Thread(
            target=_careless_harness, args=(stop, stranger, ready, go), daemon=True
        )
        thread.start()
        try:
            r = run(ex, f"setsid {sys.executable} {TAKE} $$ {ready} {go} & echo leader=$$")
        finally:
            stop.set()
            thread.join()
        leader = int(r.stdout.text.split("leader=")[1])
        assert r.stderr.text == ""
        # Peeked before the stray reaper took it, or lost: never another process's status.
        assert r.exit_status_unknown or r.exit_code == 0
        if not stranger:
            pytest.fail("the escapee never got ready")
        victim = stranger[0]
        try:
            if victim.pid != leader:
                continue  # another process on the machine took the number first: again
            time.sleep(0.3)  # a SIGKILL sent as the call settled has landed by now
            assert victim.poll() is None, "the stranger that got the leader's number was killed"
            with open(f"/proc/{victim.pid}/status") as f:
                pending = [ln for ln in f if ln.startswith(("SigPnd", "ShdPnd"))]
            assert all(int(ln.split()[1], 16) == 0 for ln in pending), pending
            # The escapee, left in the call's cgroup (session containment does not follow setsid).
            assert r.leftover_killed == (1 if containment == "auto" else 0)
            return
        finally:
            victim.kill()
            victim.wait()
            for p in _escapees(str(TAKE)):
                os.kill(p, 9)
    pytest.fail("the stranger never got the leader's number")


def _careless_harness(
    stop: threading.Event, stranger: list[subprocess.Popen[bytes]], ready: Path, go: Path
) -> None:
    """Reaps what exits, as a careless SIGCHLD handler does, but never the stranger (its owner
    waits for it); starts the stranger once the escapee is ready."""
    while not stop.is_set():
        with contextlib.suppress(ChildProcessError):
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info and not any(p.pid == info.si_pid for p in stranger):
                os.waitpid(info.si_pid, os.WNOHANG)
        if not stranger and ready.exists():
            stranger.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
            go.touch()
        stop.wait(0.0005)


def _escapees(script: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/cmdline", "rb") as f:
                if script.encode() in f.read():
                    found.append(int(name))
    return found


# Found by attacking: a harness that ignores SIGCHLD has every child reaped by the kernel the
# moment it exits. Once the leader was gone, a session-contained call did nothing by number,
# so a job left in the shell's own group was killed (through the pidfd) but not counted. The
# group itself, asked through the pidfd, still has members: its number cannot have changed
# hands, and the session is scanned as before.
SIGCHLD_IGNORED = r"""
import signal, sys
from shellseam import LocalShellExecutor, ShellExecRequest, SubprocessService
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
svc = SubprocessService()
ex = LocalShellExecutor(service=svc, grace_ms=200, containment="session")
r = ex.run_sync(ex.resolve(ShellExecRequest(command=sys.argv[1])))
print(r.exit_status_unknown, r.leftover_killed, flush=True)
svc.dispose()
"""


def test_a_harness_ignoring_sigchld_still_counts_what_the_group_left() -> None:
    command = "sleep 100 > /dev/null 2>&1 & echo started"
    out = subprocess.run(
        [sys.executable, "-c", SIGCHLD_IGNORED, command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == "True 1\n"
