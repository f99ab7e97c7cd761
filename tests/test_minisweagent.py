"""ShellseamEnvironment under mini-swe-agent: its own agent loop, and LocalEnvironment parity.

The parity tests run every behaviour that mini-swe-agent's LocalEnvironment tests check
against both classes, so the adapter is held to the installed version's real conventions
(not to our reading of them). Then the things shellseam adds on top are checked alone.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pydantic
import pytest

# mini-swe-agent prints a banner on import unless told not to.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip(
    "minisweagent", reason="mini-swe-agent is not installed (pip install 'shellseam[minisweagent]')"
)

from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.environments.local import LocalEnvironment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output

import shellseam
from fakes import FakeExecutor, run_result
from shellseam.integrations.minisweagent import ShellseamEnvironment
from shellseam.types import ShellSandboxInfo

ENV_CLASSES = [LocalEnvironment, ShellseamEnvironment]
CLASS_PATH = "shellseam.integrations.minisweagent.ShellseamEnvironment"


@pytest.fixture(params=ENV_CLASSES, ids=["local", "shellseam"])
def env_class(request: pytest.FixtureRequest) -> Any:
    return request.param


def _alive(pid: int) -> bool:
    """A process counts as alive unless it is gone or a zombie (dead, waiting to be reaped)."""
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


# --- the behaviours mini-swe-agent's LocalEnvironment tests check, on both classes -------


def test_config_defaults_match_local_environment() -> None:
    ours = ShellseamEnvironment().config
    theirs = LocalEnvironment().config
    assert (ours.cwd, ours.env, ours.timeout) == (theirs.cwd, theirs.env, theirs.timeout)


def test_basic_execution(env_class: Any) -> None:
    result = env_class().execute({"command": "echo 'hello world'"})
    assert result == {"output": "hello world\n", "returncode": 0, "exception_info": ""}


def test_config_env_is_set_merged_and_wins(env_class: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXISTING_VAR", "existing_value")
    monkeypatch.setenv("CONFLICT_VAR", "original_value")
    env = env_class(env={"NEW_VAR": "new_value", "CONFLICT_VAR": "override_value"})
    result = env.execute({"command": "echo $EXISTING_VAR $NEW_VAR $CONFLICT_VAR"})
    assert result["returncode"] == 0
    assert result["output"] == "existing_value new_value override_value\n"


def test_cwd_from_config_from_call_and_default(
    env_class: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir, call_dir, process_dir = (tmp_path / n for n in ("config", "call", "process"))
    for d in (config_dir, call_dir, process_dir):
        d.mkdir()
    assert env_class(cwd=str(config_dir)).execute({"command": "pwd"})["output"] == (
        f"{config_dir}\n"
    )
    env = env_class(cwd=str(config_dir))
    assert env.execute({"command": "pwd"}, cwd=str(call_dir))["output"] == f"{call_dir}\n"
    monkeypatch.chdir(process_dir)
    assert env_class().execute({"command": "pwd"})["output"] == f"{process_dir}\n"


def test_failure_with_no_output_is_empty_string(env_class: Any) -> None:
    assert env_class().execute({"command": "exit 1"}) == {
        "output": "",
        "returncode": 1,
        "exception_info": "",
    }


def test_nonexistent_command(env_class: Any) -> None:
    result = env_class().execute({"command": "nonexistent_command_12345"})
    assert result["returncode"] == 127
    assert "nonexistent_command_12345" in result["output"]
    assert "not found" in result["output"]


def test_stderr_is_merged_in_write_order(env_class: Any) -> None:
    command = "echo one; echo two >&2; echo three; ls /nonexistent-dir-for-test"
    result = env_class().execute({"command": command})
    assert result["output"].splitlines()[:3] == ["one", "two", "three"]
    assert "/nonexistent-dir-for-test" in result["output"].splitlines()[3]


def test_syntax_errors_reach_the_output(env_class: Any) -> None:
    result = env_class().execute({"command": "if then"})
    assert result["returncode"] == 2
    assert "syntax error" in result["output"].lower()


@pytest.mark.parametrize(("command", "code"), [("echo test", 0), ("exit 1", 1), ("exit 42", 42)])
def test_return_codes(env_class: Any, command: str, code: int) -> None:
    assert env_class().execute({"command": command})["returncode"] == code


@pytest.mark.parametrize(("sig", "code"), [("KILL", -9), ("35", -35), ("64", -64)])
def test_death_by_signal_is_negative_signal_number(env_class: Any, sig: str, code: int) -> None:
    # Real-time signals too: 35 (named SIG35 in results) read -1 before.
    assert env_class().execute({"command": f"kill -{sig} $$"})["returncode"] == code


def test_multiline_output_and_shell_features(env_class: Any) -> None:
    env = env_class()
    assert env.execute({"command": "printf 'l1\\nl2\\nl3'"})["output"] == "l1\nl2\nl3"
    assert env.execute({"command": "echo 'hello world' | grep world"})["output"] == (
        "hello world\n"
    )
    assert env.execute({"command": "echo $(echo nested)"})["output"] == "nested\n"


def test_file_operations_persist_between_actions(env_class: Any, tmp_path: Path) -> None:
    env = env_class(cwd=str(tmp_path))
    assert env.execute({"command": "echo 'test content' > test.txt"})["returncode"] == 0
    assert env.execute({"command": "cat test.txt"})["output"] == "test content\n"
    assert (tmp_path / "test.txt").read_text() == "test content\n"


def test_timeout_is_reported_as_local_environment_reports_it(
    env_class: Any, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    env = env_class(timeout=1)
    started = time.monotonic()
    # The grandchild shares the process group: a timeout must take it down too.
    result = env.execute({"command": f"echo before; sleep 30 & echo $! > {pid_file}; wait"})
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 5
    assert result["returncode"] == -1
    assert result["output"].startswith("before\n")
    assert result["exception_info"] == (
        "An error occurred while executing the command: Command "
        f"'echo before; sleep 30 & echo $! > {pid_file}; wait' timed out after 1 seconds"
    )
    assert result["extra"]["exception_type"] == "TimeoutExpired"
    assert _wait_dead(int(pid_file.read_text()))


def test_per_call_timeout_wins_over_config(env_class: Any) -> None:
    result = env_class(timeout=30).execute({"command": "sleep 10"}, timeout=1)
    assert result["returncode"] == -1
    assert "timed out after 1 seconds" in result["exception_info"]


def test_spawn_failure_is_an_exception_entry(env_class: Any, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = env_class(cwd=str(missing)).execute({"command": "true"})
    assert result["returncode"] == -1
    assert result["output"] == ""
    assert result["exception_info"].startswith("An error occurred while executing the command: ")
    assert str(missing) in result["exception_info"]
    assert result["extra"]["exception"] in result["exception_info"]


def test_submission_sentinel(env_class: Any) -> None:
    env = env_class()
    with pytest.raises(Submitted) as raised:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; printf 'a\\nb\\n'"})
    (message,) = raised.value.messages
    assert message["role"] == "exit"
    assert message["extra"] == {"exit_status": "Submitted", "submission": "a\nb\n"}
    # Only a successful action submits.
    result = env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 3"})
    assert result["returncode"] == 3


def test_template_vars_and_serialize(env_class: Any, tmp_path: Path) -> None:
    env = env_class(cwd=str(tmp_path), timeout=7)
    tvars = env.get_template_vars(extra_var="x")
    assert tvars["cwd"] == str(tmp_path)
    assert tvars["timeout"] == 7
    assert tvars["system"] == os.uname().sysname
    assert tvars["extra_var"] == "x"
    info = env.serialize()["info"]["config"]
    assert info["environment"]["cwd"] == str(tmp_path)
    assert info["environment_type"] == f"{env_class.__module__}.{env_class.__name__}"


# --- what shellseam adds ----------------------------------------------------------------


def test_mini_swe_agent_builds_it_from_config(tmp_path: Path) -> None:
    env = get_environment(
        {"environment_class": CLASS_PATH, "cwd": str(tmp_path), "timeout": 5, "grace_ms": 100}
    )
    assert isinstance(env, ShellseamEnvironment)
    assert env.config.grace_ms == 100
    assert env.serialize()["info"]["config"]["environment_type"] == CLASS_PATH


def test_credentials_are_scrubbed_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLSEAM_TEST_API_KEY", "leaked")
    env = ShellseamEnvironment()
    assert env.execute({"command": 'echo "[$SHELLSEAM_TEST_API_KEY]"'})["output"] == "[]\n"
    env = ShellseamEnvironment(env={"SHELLSEAM_TEST_API_KEY": "given"})
    assert env.execute({"command": 'echo "[$SHELLSEAM_TEST_API_KEY]"'})["output"] == "[given]\n"


def test_timeout_escalates_past_a_sigterm_trap() -> None:
    env = ShellseamEnvironment(timeout=1, grace_ms=200)
    started = time.monotonic()
    result = env.execute({"command": "trap '' TERM; echo trapped; while :; do sleep 0.05; done"})
    assert time.monotonic() - started < 4
    assert result["returncode"] == -1
    assert result["output"].startswith("trapped\n")
    assert "[timed out after 1000ms]" in result["output"]


def test_large_output_is_bounded_with_its_spill_file_named() -> None:
    env = ShellseamEnvironment(max_output_bytes=1000)
    result = env.execute({"command": "seq 1 100000"})
    assert result["returncode"] == 0
    body, marker = result["output"].rsplit("\n", 1)
    assert marker.startswith("[output truncated; full output: ")
    assert body.endswith("99999\n100000")
    assert len(body) <= 1000
    spill_path = marker.removeprefix("[output truncated; full output: ").removesuffix("]")
    expected = "".join(f"{i}\n" for i in range(1, 100001))
    assert Path(spill_path).read_text() == expected


def test_leftover_background_processes_are_stopped_and_reported(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    env = ShellseamEnvironment(grace_ms=200)
    result = env.execute({"command": f"sleep 30 > /dev/null & echo $! > {pid_file}; echo done"})
    assert result["returncode"] == 0
    assert result["output"] == "done\n[stopped 1 leftover background process]"
    assert _wait_dead(int(pid_file.read_text()))


def test_read_only_sandbox_blocks_writes_in_the_workspace(tmp_path: Path) -> None:
    if shellseam.landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock")
    env = ShellseamEnvironment(cwd=str(tmp_path), sandbox="read-only")
    result = env.execute({"command": "cat calc.py 2> /dev/null; echo x > f.txt"})
    assert result["returncode"] == 2  # dash: a failed redirection
    assert result["output"].startswith("/bin/sh: 1: cannot create f.txt: Permission denied\n")
    assert not (tmp_path / "f.txt").exists()
    env = ShellseamEnvironment(cwd=str(tmp_path), sandbox="workspace-write")
    assert env.execute({"command": "echo x > f.txt"})["returncode"] == 0
    assert (tmp_path / "f.txt").read_text() == "x\n"


def test_sandbox_denial_marker_ends_the_observation(tmp_path: Path) -> None:
    if shellseam.landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock")
    env = ShellseamEnvironment(cwd=str(tmp_path), sandbox="read-only")
    result = env.execute({"command": "echo x > f.txt"})
    assert result == {
        "output": "/bin/sh: 1: cannot create f.txt: Permission denied\n"
        "[sandbox: file access denied under read-only mode]",
        "returncode": 2,
        "exception_info": "",
    }


def test_a_file_that_is_not_executable_is_not_a_sandbox_denial(tmp_path: Path) -> None:
    # Exit 126 from the shell itself ("Permission denied" for a file without +x) is the
    # SPEC's exception; with stderr merged, the shell's message is on stdout, in dash's words.
    if shellseam.landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock")
    (tmp_path / "script.sh").write_text("echo hi\n")
    for shell, message in (
        ("sh", "/bin/sh: 1: ./script.sh: Permission denied\n"),
        ("bash", "bash: line 1: ./script.sh: Permission denied\n"),
    ):
        env = ShellseamEnvironment(cwd=str(tmp_path), sandbox="workspace-write", shell=shell)
        result = env.execute({"command": "./script.sh"})
        assert (result["output"], result["returncode"]) == (message, 126)


# --- markers go in the observation, never in a submission ---------------------------------

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _submission(env: Any, command: str) -> str:
    with pytest.raises(Submitted) as raised:
        env.execute({"command": command})
    (message,) = raised.value.messages
    assert message["content"] == message["extra"]["submission"]
    submission: str = message["extra"]["submission"]
    return submission


def test_a_leftover_marker_is_never_submitted(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    env = ShellseamEnvironment(grace_ms=200)
    command = f"echo {SENTINEL}; sleep 30 > /dev/null 2>&1 & echo $! > {pid_file}; echo patch"
    assert _submission(env, command) == "patch\n"
    assert _wait_dead(int(pid_file.read_text()))


def _denied(stdout: str, exit_code: int) -> Any:
    return run_result(
        stdout,
        exit_code=exit_code,
        sandbox=ShellSandboxInfo(mode="read-only", denied=True, enforcement="full"),
        leftover_killed=2,
    )


def test_markers_end_the_observation_but_not_the_submission() -> None:
    env = ShellseamEnvironment()
    env._executor = FakeExecutor(result=_denied("touch: cannot touch 'x': Permission denied\n", 1))
    assert env.execute({"command": "touch x"}) == {
        "output": "touch: cannot touch 'x': Permission denied\n"
        "[sandbox: file access denied under read-only mode]\n"
        "[stopped 2 leftover background processes]",
        "returncode": 1,
        "exception_info": "",
    }
    env._executor = FakeExecutor(result=_denied(f"{SENTINEL}\nthe patch", 0))
    assert _submission(env, "submit") == "the patch"


def test_a_truncated_submission_is_read_whole_from_its_spill_file() -> None:
    # 5.7 MB: beyond the 4 MiB kept in memory by default.
    command = f"echo {SENTINEL}; seq 1 800000"
    expected = "".join(f"{i}\n" for i in range(1, 800001))
    assert len(expected) > 5 * 2**20
    assert _submission(ShellseamEnvironment(), command) == expected
    assert _submission(LocalEnvironment(), command) == expected


def test_a_truncated_tail_that_starts_with_the_sentinel_is_not_a_submission() -> None:
    # The last 100 bytes begin with the sentinel line, the output does not.
    filler = "y" * (100 - len(SENTINEL) - 2)
    command = f"seq 1 1000; echo {SENTINEL}; echo {filler}"
    result = ShellseamEnvironment(max_output_bytes=100).execute({"command": command})
    assert result["returncode"] == 0
    assert result["output"].startswith(f"{SENTINEL}\n{filler}\n[output truncated; full output: ")


def test_a_submission_too_large_for_its_spill_file_is_not_submitted_in_part() -> None:
    env = ShellseamEnvironment()
    env._executor = shellseam.LocalShellExecutor(
        shell="/bin/sh", max_output_bytes=100, max_spill_bytes=1000
    )
    result = env.execute({"command": f"echo {SENTINEL}; seq 1 1000"})
    assert result["returncode"] == 0
    tail, marker = result["output"].rsplit("\n", 1)
    assert tail.endswith("999\n1000")
    assert re.fullmatch(r"\[output truncated; first 1000 bytes saved: .+\]", marker)


# --- the shell ------------------------------------------------------------------------------


def test_shell_is_bin_sh_by_default_and_bash_on_request() -> None:
    assert ShellseamEnvironment().config.shell == "sh"
    command = 'echo "$0"; echo "${BASH_VERSION:+bash}"'
    assert ShellseamEnvironment().execute({"command": command})["output"] == "/bin/sh\n\n"
    env = ShellseamEnvironment(shell="bash")
    assert env.execute({"command": command})["output"] == "bash\nbash\n"
    assert env.serialize()["info"]["config"]["environment"]["shell"] == "bash"
    with pytest.raises(pydantic.ValidationError):
        ShellseamEnvironment(shell="zsh")


def test_line_numbers_are_the_actions_own() -> None:
    command = 'echo "$LINENO"\nnonexistent_command_12345'
    result = ShellseamEnvironment(shell="bash").execute({"command": command})
    assert result["output"] == "1\nbash: line 2: nonexistent_command_12345: command not found\n"
    result = ShellseamEnvironment().execute({"command": command})
    assert result["output"] == "\n/bin/sh: 2: nonexistent_command_12345: not found\n"


def test_a_syntax_error_on_the_first_line_reads_as_written() -> None:
    result = ShellseamEnvironment(shell="bash").execute({"command": "echo a; if then"})
    assert result["returncode"] == 2
    assert result["output"] == (
        "bash: -c: line 1: syntax error near unexpected token `then'\n"
        "bash: -c: line 1: `echo a; if then'\n"
    )


# --- mini-swe-agent's own agent loop ------------------------------------------------------


def test_default_agent_solves_a_scripted_task_through_shellseam(tmp_path: Path) -> None:
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    check = "python3 -c 'import calc; assert calc.add(2, 3) == 5, calc.add(2, 3)'"
    steps = [
        "cat calc.py",
        check,
        "sed -i 's/a - b/a + b/' calc.py",
        check + " && echo tests pass",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat calc.py",
    ]
    # mini-swe-agent's test model takes untyped **kwargs.
    model = DeterministicModel(  # type: ignore[no-untyped-call]
        outputs=[make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(steps)]
    )
    env = get_environment({"environment_class": CLASS_PATH, "cwd": str(tmp_path)})
    agent = DefaultAgent(
        model,
        env,
        system_template="You are a test agent on {{system}}.",
        instance_template="Fix calc.py in {{cwd}}: {{task}}",
        step_limit=len(steps) + 1,
        cost_limit=0,
    )

    outcome = agent.run("add must add")

    fixed = "def add(a, b):\n    return a + b\n"
    assert outcome == {"exit_status": "Submitted", "submission": fixed}
    assert (tmp_path / "calc.py").read_text() == fixed
    assert agent.messages[1]["content"] == f"Fix calc.py in {tmp_path}: add must add"
    observations = [m for m in agent.messages if m["role"] == "user"][1:]
    assert len(observations) == 4  # the submitting step ends the loop instead
    cat_obs, failing, edit, passing = (m["extra"] for m in observations)
    assert (cat_obs["returncode"], cat_obs["raw_output"]) == (
        0,
        "def add(a, b):\n    return a - b\n",
    )
    assert failing["returncode"] == 1
    assert "AssertionError: -1" in failing["raw_output"]  # stderr, merged
    assert "<returncode>1</returncode>" in observations[1]["content"]
    assert (edit["returncode"], edit["raw_output"]) == (0, "")
    assert (passing["returncode"], passing["raw_output"]) == (0, "tests pass\n")
    assert agent.messages[-1]["role"] == "exit"
    trajectory = agent.serialize()
    assert trajectory["info"]["config"]["environment_type"] == CLASS_PATH
    assert trajectory["info"]["exit_status"] == "Submitted"
