"""``LocalShellExecutor(shell=...)``: another POSIX shell than bash, for front ends that must
match a harness running ``/bin/sh -c`` (mini-swe-agent's ``LocalEnvironment``).

``argv[0]`` is the value as given, so ``$0`` and the shell's own message prefix are exactly
what ``subprocess.Popen(command, shell=True)`` produces.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from shellseam import (
    LocalShellExecutor,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    landlock_abi,
)


def _run(executor: LocalShellExecutor, command: str) -> tuple[str, str, int | None]:
    result = executor.run_sync(executor.resolve(ShellExecRequest(command=command)))
    return result.stdout.text, result.stderr.text, result.exit_code


def _popen_shell(command: str) -> tuple[str, str, int]:
    done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    return done.stdout, done.stderr, done.returncode


def test_default_is_bash_named_bash() -> None:
    executor = LocalShellExecutor()
    assert executor.shell == "bash"
    assert _run(executor, 'echo "$0 ${BASH_VERSION:+bash}"') == ("bash bash\n", "", 0)


def test_bin_sh_runs_exactly_as_popen_shell_true() -> None:
    executor = LocalShellExecutor(shell="/bin/sh")
    for command in ('echo "$0"', "nonexistent_command_12345", "echo a\nif then", "exit 7"):
        assert _run(executor, command) == _popen_shell(command)
    assert os.path.realpath(_run(executor, "readlink /proc/$$/exe")[0].strip()) == (
        os.path.realpath("/bin/sh")
    )


def test_a_bare_name_is_found_and_kept_as_argv0() -> None:
    assert _run(LocalShellExecutor(shell="sh"), 'echo "$0"') == ("sh\n", "", 0)


def test_sandboxed_executor_takes_it_too(tmp_path: Path) -> None:
    if landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock")
    executor = SandboxShellExecutor(mode="read-only", cwd=str(tmp_path), shell="/bin/sh")
    out, _err, code = _run(executor, 'echo "$0"; echo x > f')
    assert out.startswith("/bin/sh\n")
    assert code == 2
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("shell", ["/bin/sh", "bash"])
def test_a_command_beyond_one_argument_runs_whole_or_fails_loudly(shell: str) -> None:
    # Long scripts reach the shell another way than argv (SPEC); that way must work for
    # every shell, never run an empty script in its place.
    command = 'echo "$0"; : ' + "x" * 200_000 + '\necho "end $LINENO"'
    executor = LocalShellExecutor(shell=shell)
    try:
        out, _err, code = _run(executor, command)
    except ShellError as err:
        assert err.code == "SPAWN_FAILED"
        return
    lineno = "" if shell == "/bin/sh" else "2"
    assert (out, code) == (f"{shell}\nend {lineno}\n", 0)


@pytest.mark.parametrize(
    ("shell", "error", "message"),
    [
        (b"/bin/sh", TypeError, "shell must be a str, got bytes"),
        (None, TypeError, "shell must be a str, got NoneType"),
        ("", ValueError, "shell must be a program name or an absolute path, got ''"),
        ("bin/sh", ValueError, "shell must be a program name or an absolute path"),
        ("sh\0", ValueError, "shell must be a program name or an absolute path"),
        ("/nonexistent/sh", ValueError, "shell '/nonexistent/sh' is not an executable program"),
        ("no-such-shell-xyz", ValueError, "shell 'no-such-shell-xyz' is not an executable"),
        ("/etc/passwd", ValueError, "shell '/etc/passwd' is not an executable program"),
        ("/tmp", ValueError, "shell '/tmp' is not an executable program"),
    ],
)
def test_bad_shell_is_refused_when_built(shell: object, error: type, message: str) -> None:
    with pytest.raises(error, match="^" + re.escape(message)):
        LocalShellExecutor(shell=shell)  # type: ignore[arg-type]
