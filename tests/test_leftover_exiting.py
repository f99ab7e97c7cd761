"""A background job that prints its last line and exits is not a leftover.

A process closes its pipes (the supervisor's EOF) before it becomes a zombie; a count of
the group taken in between saw it as alive, so ``(sleep 0.01; echo late) & echo early``
rendered ``[stopped 1 leftover background process]`` in about 4 calls of 10 under dash,
which mini-swe-agent users then saw in their observations. Processes already in exit(2)
are not counted: nothing was stopped.
"""

from __future__ import annotations

import pytest

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
