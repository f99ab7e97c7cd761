"""A timeout, abort or kill delivers SIGTERM once to the shell: the call's process group gets
it, and only the cgroup members that left the group get their own. A trapping shell that ran
its handler twice would print twice (seen as a flaky "terminated\\nterminated")."""

from __future__ import annotations

import os

import pytest

from shellseam import LocalShellExecutor, ShellExecRequest

TRAP = "trap 'echo terminated' TERM; echo started; sleep 5 & wait; sleep 5 & wait; echo end"


@pytest.mark.parametrize("containment", ["auto", "session"])
def test_a_timeout_terminates_a_trapping_shell_once(
    tmp_path: os.PathLike[str], containment: str
) -> None:
    ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=600, containment=containment)  # type: ignore[arg-type]
    for _ in range(6):
        r = ex.run_sync(ex.resolve(ShellExecRequest(command=TRAP, timeout_ms=300)))
        assert r.timed_out
        assert r.stdout.text.count("terminated") == 1, r.stdout.text
