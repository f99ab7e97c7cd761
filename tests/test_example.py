"""The agent-loop example runs as a script and shows the tool loop's exact strings.

The example is found in the repository root, the working directory of the test run or
``$SHELLSEAM_REPO_ROOT``; it imports the installed shellseam (never the source tree).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("SHELLSEAM_REPO_ROOT") or os.getcwd())
EXAMPLE = ROOT / "examples" / "agent_loop.py"


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="run from the repository root")
def test_agent_loop_example_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        "system: Check the [exit code: N] marker on every bash result; "
        "investigate failures before moving on."
    )
    assert lines[1] == "tools: bash, task_output, task_list, task_kill"
    assert lines[3].startswith("hello from session-")
    text = proc.stdout
    assert "[stderr]\nls: cannot access 'no-such-file': No such file or directory\n" in text
    assert "[exit code: 2]\n  (card status pill: {'exit_code': 2})\n" in text
    assert (
        "started background task bash-1\n"
        '> task_output {"task_id": "bash-1", "block": true}\n'
        "task bash-1: completed, exit code: 0\ntick 1\ntick 2\ntick 3\n"
    ) in text
    assert "killed task bash-2\n" in text
    assert "notice: background task bash-2 finished: killed\n" in text
    assert text.endswith(
        "bash-1  completed  Tick three times\nbash-2  killed  Wait for a long time\n"
    )
