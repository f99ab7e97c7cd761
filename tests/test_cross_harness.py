"""Two harnesses (and two test runs) on one machine leave each other's commands alone.

A test run's clean-up (`kill_marked`) once SIGKILLed every process carrying any
containment marker, another test run's commands included: run next to the containment
tests, their calls came back `SIGKILL`ed out of nowhere (the kernel's signal_generate
tracepoint showed the other pytest process as the sender). It now kills only the
processes marked with its own tokens.

And the product side (SPEC §3 Containment): a harness whose calls time out (TERM, then
SIGKILL escalation and `cgroup.kill`) and which then dies (its keeper kills what is left)
must not signal the calls of another harness running at the same time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from containment_helpers import any_marked, kill_marked, marked_env, new_token

from conftest import HELPERS

#: Plain calls, one after another: every one must exit 0 with "ok".
PLAIN = r"""
import json, sys
from shellseam import LocalShellExecutor, ShellExecRequest, SubprocessService
svc = SubprocessService()
ex = LocalShellExecutor(service=svc, containment=sys.argv[1])
out = []
for i in range(int(sys.argv[2])):
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="sleep 0.05; echo ok")))
    out.append([r.exit_code, r.signal, r.stdout.text])
svc.dispose()
print(json.dumps(out), flush=True)
"""

#: Calls that time out and escalate to SIGKILL, then the harness dies mid-call.
KILLER = r"""
import os, sys, time
from shellseam import LocalShellExecutor, ShellExecRequest, SubprocessService
ex = LocalShellExecutor(service=SubprocessService(), containment=sys.argv[1], grace_ms=100)
ignore = f"exec {sys.executable} {sys.argv[2]}/ignore_term.py"
for command in [ignore, "sleep 30 & sleep 30", "setsid sleep 30 > /dev/null 2>&1 & sleep 30"]:
    ex.run_sync(ex.resolve(ShellExecRequest(command=command, timeout_ms=100)))
ex.start(ex.resolve(ShellExecRequest(command="sleep 300 & sleep 300")))
time.sleep(0.1)
os._exit(3)
"""


def test_clean_up_spares_processes_another_test_run_marked() -> None:
    foreign = "f" * 16  # a token this test process never handed out
    proc = subprocess.Popen(["sleep", "30"], env={**os.environ, **marked_env(foreign)})
    try:
        time.sleep(0.1)
        assert proc.pid not in any_marked()
        kill_marked()
        time.sleep(0.1)
        assert proc.poll() is None, "the clean-up killed another test run's process"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("mode", ["auto", "session"])
def test_a_dying_harness_leaves_another_harness_calls_alone(mode: str) -> None:
    token = new_token()
    env = {**os.environ, **marked_env(token)}
    plain = subprocess.Popen(
        [sys.executable, "-c", PLAIN, mode, "20"], stdout=subprocess.PIPE, text=True, env=env
    )
    killers: list[subprocess.Popen[bytes]] = []
    try:
        while plain.poll() is None:
            killer = subprocess.Popen([sys.executable, "-c", KILLER, mode, str(HELPERS)], env=env)
            killers.append(killer)
            killer.wait(60)
        out, _ = plain.communicate(timeout=60)
        results = json.loads(out)
        assert len(results) == 20
        bad = [r for r in results if r != [0, None, "ok\n"]]
        assert bad == [], f"{len(bad)} plain calls were disturbed: {bad[:3]}"
    finally:
        for p in [plain, *killers]:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGKILL)
            p.wait()
        kill_marked()
