"""Differential test: the same actions through LocalEnvironment and ShellseamEnvironment.

Every action in ``SAME`` must give the same observation (output and returncode, exception
entry included) or, for a submitting action, the same submission, from mini-swe-agent
2.4.6's ``LocalEnvironment`` and from ``ShellseamEnvironment`` with its defaults. The cases
are the ones where an adapter can drift: the shell itself (``/bin/sh``, ``$0``, dash's
``echo``), stderr merged in write order, ``$LINENO`` and ``line N:`` messages, syntax errors
on the first and a later line, signals, bytes that are not UTF-8, ``\\r\\n``, the submission
sentinel. A hypothesis test composes further scripts from fragments (stderr between stdout
lines, syntax errors at any position, here-docs, ``set -x``) and holds them to the same rule,
and ``shell="bash"`` is held to ``bash -c`` with stderr on stdout the same way.

What must differ, and why (each pinned by a test below, both sides shown):
- the terminal settings shellseam adds for a model reader (``TERM=dumb``, ``NO_COLOR=1``,
  ``PAGER=cat``, ...): the config's ``env`` still wins;
- credentials matching the scrub patterns are not passed to commands (unless in ``env``);
- a timeout kills with SIGTERM first (a trap may run), and the observation ends with
  ``[timed out after <n>ms]``; the exception entry is LocalEnvironment's, word for word;
- background processes still running when the shell exits are stopped and the observation
  says so; LocalEnvironment leaves them running (or waits for them while they hold the
  pipe, up to the timeout);
- output beyond ``max_output_bytes`` keeps its tail in memory and names the spill file;
- the action's stdin is an empty pipe; LocalEnvironment's shell inherits the harness's stdin
  (from a terminal, ``cat`` waits for the timeout). Under pytest both are empty, so ``cat``
  and ``read`` are also in ``SAME``;
- the shell's own command line (``/proc/$$/cmdline``, ``ps``) shows the stderr redirect that
  precedes the action on its first line;
- a NUL byte in the command fails in both, with shellseam's error message;
- a command over the kernel's 128 KiB argument limit fails in LocalEnvironment (E2BIG); the
  SPEC has shellseam run it (up to 16 MiB) once the core passes long scripts another way.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip(
    "minisweagent", reason="mini-swe-agent is not installed (pip install 'shellseam[minisweagent]')"
)

from hypothesis import given, settings
from hypothesis import strategies as st
from minisweagent.environments.local import LocalEnvironment
from minisweagent.exceptions import Submitted

from shellseam.integrations.minisweagent import ShellseamEnvironment

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

SAME = [
    "echo 'hello world'",
    "printf 'no trailing newline'",
    "exit 3",
    "echo out; echo err >&2; echo out2; echo err2 >&2",
    'echo "$0"',
    'echo "[$LINENO]"',
    "nonexistent_command_12345",
    "echo a\nnonexistent_command_12345\necho b",
    "if then",
    "echo before\nif then\necho never",
    "kill -TERM $$",
    "kill -KILL $$",
    r"printf '\377\376 not utf-8 \303\n'",
    r"printf 'crlf\r\nlone cr\rend\n'",
    "echo héllo ✓ 日本",
    "echo -e 'a\\nb'",
    "set -x; echo traced",
    "exec 2>/dev/null; nonexistent_command_12345; echo after",
    "trap 'echo bye' EXIT; echo hi; exit 5",
    "cat <<EOF\nline $((1+1))\nEOF",
    "seq 1 30000",
    "ls /nonexistent-dir-for-parity",
    "",
    "(sleep 0.2; echo late) & echo early",
    "yes | head -n 2",
    "exit 300",
    "exec >&-; echo gone",
    'echo "$PPID $-"; umask',
    'cat; read line; echo "[$?]"',
    f"echo {SENTINEL}; printf 'diff --git a/x b/x\\n'",
    f"\n\n  {SENTINEL}  \necho 'the rest'\nprintf 'no newline'",
    f"echo {SENTINEL}; echo but it failed; exit 1",
]


def _observe(env: Any, command: str, **kw: Any) -> tuple[Any, ...]:
    try:
        result = env.execute({"command": command}, **kw)
    except Submitted as submitted:
        (message,) = submitted.messages
        return ("submitted", message["extra"]["submission"], message["content"])
    return ("observation", result["output"], result["returncode"], result["exception_info"])


@pytest.fixture(scope="module")
def envs() -> tuple[LocalEnvironment, ShellseamEnvironment]:
    return LocalEnvironment(timeout=10), ShellseamEnvironment(timeout=10)


def test_there_are_at_least_thirty_cases() -> None:
    assert len(SAME) >= 30


@pytest.mark.parametrize("command", SAME)
def test_same_observation(
    envs: tuple[LocalEnvironment, ShellseamEnvironment], command: str
) -> None:
    local, ours = envs
    assert _observe(ours, command) == _observe(local, command)


FRAGMENTS = [
    "echo out",
    "echo err >&2",
    "printf 'no newline'",
    "printf 'to stderr' >&2",
    'echo "line $LINENO"',
    "nonexistent_command_12345",
    "if then",
    "fi",
    "false",
    "(exit 3)",
    "set -x",
    "set +x",
    "cat <<EOF\nhere $((2*3))\nEOF",
    "# a comment",
    "",
    "f() { echo in f >&2; return 2; }; f",
    "exit 4",
    f"echo {SENTINEL}",
    "printf 'cr\\r\\n'",
]
# No pipes: the commands of a pipeline write concurrently, so their order differs run to run
# in LocalEnvironment itself.
JOINERS = ["\n", "; ", " && ", " || "]


@st.composite
def scripts(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=5))
    script = parts[0]
    for part in parts[1:]:
        script += draw(st.sampled_from(JOINERS)) + part
    return script


@settings(max_examples=60, deadline=None)
@given(script=scripts())
def test_same_observation_for_composed_scripts(
    envs: tuple[LocalEnvironment, ShellseamEnvironment], script: str
) -> None:
    local, ours = envs
    assert _observe(ours, script) == _observe(local, script)


def test_same_in_a_given_cwd_and_with_config_env(tmp_path: Path) -> None:
    command = 'pwd; echo "$PARITY_VAR"; ls'
    (tmp_path / "a file").write_text("")
    local = LocalEnvironment(cwd=str(tmp_path), env={"PARITY_VAR": "from config"})
    ours = ShellseamEnvironment(cwd=str(tmp_path), env={"PARITY_VAR": "from config"})
    assert _observe(ours, command) == _observe(local, command)
    assert _observe(ours, command)[1] == f"{tmp_path}\nfrom config\na file\n"


# --- what must differ, both sides pinned ---------------------------------------------------


def test_terminal_settings_for_a_model_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    command = 'echo "$TERM|$NO_COLOR|$PAGER|$GIT_PAGER|$GIT_TERMINAL_PROMPT"'
    assert LocalEnvironment().execute({"command": command})["output"].startswith("xterm|")
    assert ShellseamEnvironment().execute({"command": command})["output"] == "dumb|1|cat|cat|0\n"
    configured = ShellseamEnvironment(env={"TERM": "xterm-256color"})
    assert configured.execute({"command": 'echo "$TERM"'})["output"] == "xterm-256color\n"


def test_credentials_are_not_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_SECRET_TOKEN", "s3cret")
    command = 'echo "[$PARITY_SECRET_TOKEN]"'
    assert LocalEnvironment().execute({"command": command})["output"] == "[s3cret]\n"
    assert ShellseamEnvironment().execute({"command": command})["output"] == "[]\n"


def test_timeout_terminates_first_and_says_so() -> None:
    command = "trap 'echo terminated' TERM; echo started; sleep 5 & wait"
    local = LocalEnvironment(timeout=1).execute({"command": command})
    ours = ShellseamEnvironment(timeout=1, grace_ms=500).execute({"command": command})
    assert (local["returncode"], ours["returncode"]) == (-1, -1)
    assert ours["exception_info"] == local["exception_info"]
    assert ours["extra"] == local["extra"]
    assert local["output"] == "started\n"  # SIGKILL at once: the trap never runs
    assert ours["output"] == "started\nterminated\n[timed out after 1000ms]"


def test_leftover_background_processes_are_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = f"sleep 30 > /dev/null 2>&1 & echo $! > {pid_file}; echo done"
    local = LocalEnvironment().execute({"command": command})
    local_pid = int(pid_file.read_text())
    try:
        assert local == {"output": "done\n", "returncode": 0, "exception_info": ""}
        assert _alive(local_pid)  # LocalEnvironment leaves it running
    finally:
        os.kill(local_pid, 9)
    ours = ShellseamEnvironment(grace_ms=200).execute({"command": command})
    assert ours == {
        "output": "done\n[stopped 1 leftover background process]",
        "returncode": 0,
        "exception_info": "",
    }
    assert _wait_dead(int(pid_file.read_text()))


def test_output_beyond_the_memory_budget_names_its_spill_file() -> None:
    command = "seq 1 1000"
    local = LocalEnvironment().execute({"command": command})
    ours = ShellseamEnvironment(max_output_bytes=100).execute({"command": command})
    tail, marker = ours["output"].rsplit("\n", 1)
    assert local["output"].endswith(tail + "\n") and len(tail) < 100
    spill = marker.removeprefix("[output truncated; full output: ").removesuffix("]")
    assert Path(spill).read_text() == local["output"]


def test_stdin_is_an_empty_pipe() -> None:
    # LocalEnvironment's shell would read the harness's own stdin here.
    result = ShellseamEnvironment().execute({"command": "cat; ls -l /proc/$$/fd/0"})
    assert result["returncode"] == 0
    assert "pipe:[" in result["output"]


def test_the_shell_command_line_shows_the_stderr_redirect() -> None:
    command = "tr '\\0' ' ' < /proc/$$/cmdline; echo"
    # The arguments are NUL-terminated: each shows as a trailing space.
    assert LocalEnvironment().execute({"command": command})["output"] == (
        f"/bin/sh -c {command} \n"
    )
    assert ShellseamEnvironment().execute({"command": command})["output"] == (
        f"/bin/sh -c exec 2>&1; {command} \n"
    )


def test_a_nul_byte_fails_in_both_with_its_own_message() -> None:
    local = LocalEnvironment().execute({"command": "echo a\0b"})
    ours = ShellseamEnvironment().execute({"command": "echo a\0b"})
    assert (
        (local["returncode"], local["output"]) == (ours["returncode"], ours["output"]) == (-1, "")
    )
    assert local["exception_info"].endswith("embedded null byte")
    assert ours["exception_info"].endswith("command contains a NUL byte")


def test_a_command_beyond_one_argument_runs_whole_or_fails_loudly() -> None:
    # LocalEnvironment: E2BIG. shellseam: SPEC runs it (up to 16 MiB) once long scripts reach
    # the shell another way; whichever holds, /bin/sh must run all of it or none, visibly.
    command = "echo start; : " + "x" * 200_000 + "\necho end"
    local = LocalEnvironment().execute({"command": command})
    assert local["returncode"] == -1 and "Argument list too long" in local["exception_info"]
    ours = ShellseamEnvironment().execute({"command": command})
    if ours["returncode"] == -1:
        assert "Argument list too long" in ours["exception_info"]
    else:
        assert (ours["output"], ours["returncode"]) == ("start\nend\n", 0)


# --- shell="bash": the same against bash -c with stderr on stdout ------------------------

BASH_SAME = [
    'echo "$0 ${BASH_VERSION:+is bash}"',
    'echo "$LINENO"\necho "$LINENO"; nonexistent_command_12345',
    "if then",
    "echo first; if then",
    "echo before\nif then",
    "echo out; echo err >&2; echo out2",
    "shopt -q extglob && echo extglob || echo no extglob",
]


def _bash_reference(command: str) -> tuple[str, int]:
    done = subprocess.run(
        ["bash", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    return done.stdout, done.returncode


@pytest.mark.parametrize("command", BASH_SAME)
def test_bash_option_matches_bash_dash_c(command: str) -> None:
    ours = ShellseamEnvironment(shell="bash").execute({"command": command})
    assert (ours["output"], ours["returncode"]) == _bash_reference(command)


@settings(max_examples=40, deadline=None)
@given(script=scripts().filter(lambda s: SENTINEL not in s))
def test_bash_option_matches_bash_dash_c_for_composed_scripts(script: str) -> None:
    ours = ShellseamEnvironment(shell="bash").execute({"command": script})
    assert (ours["output"], ours["returncode"]) == _bash_reference(script)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_dead(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
