"""A harness that reaps children itself (``waitpid(-1)``) steals the shell's status: the
result says the status is unknown instead of inventing ``exit code: 0`` (SPEC §3)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from conftest import run
from fakes import run_result
from shellseam import LocalShellExecutor, ShellRunResult, parse_exit_status, render_result


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
