"""The `shellseam` command line, run as a real subprocess (SPEC §6)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import proc_stats, process_alive
from shellseam import ShellRunResult
from shellseam.cli import parse_size

CLI = [sys.executable, "-m", "shellseam.cli"]


@pytest.fixture(autouse=True, scope="module")
def _private_cache() -> Iterator[None]:
    """The CLI keeps its spill files under the cache's `shellseam/cli/`: these tests' go to
    a cache of their own, removed afterwards, never the user's. Not under /tmp, which the
    sandbox modes may write (a spill directory there is refused)."""
    cache = tempfile.mkdtemp(prefix="shellseam-cli-cache-", dir="/var/tmp")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_CACHE_HOME", cache)
            yield
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def cli(
    *args: str, cwd: str | None = None, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI with ``stdin`` as its input (an empty pipe when None: never the test's own)."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        input=stdin if stdin is not None else "",
        env=env,
    )


def test_run_prints_rendering_and_exits_with_code() -> None:
    p = cli("run", "--", "echo out; echo err >&2; exit 2")
    assert p.stdout == "out\n[stderr]\nerr\n[exit code: 2]\n"
    assert p.returncode == 2 and p.stderr == ""


def test_words_are_joined_into_one_command() -> None:
    p = cli("run", "--", "echo", "a", "b")
    assert p.stdout == "a b\n[exit code: 0]\n" and p.returncode == 0


def test_silent_command() -> None:
    p = cli("run", "--", "true")
    assert p.stdout == "(no output)\n[exit code: 0]\n"


def test_signal_exit_is_128_plus_n_and_timeout_marker() -> None:
    p = cli("run", "--timeout-ms", "200", "--", "sleep 10")
    assert p.stdout == "(no output)\n[timed out after 200ms]\n[killed by signal: SIGTERM]\n"
    assert p.returncode == 128 + 15


def test_json_output_has_dataclass_fields(tmp_path: object) -> None:
    p = cli("run", "--json", "--workdir", str(tmp_path), "--", "pwd")
    data = json.loads(p.stdout)
    assert data["exit_code"] == 0 and data["stdout"]["text"] == f"{tmp_path}\n"
    assert set(data) == {f.name for f in dataclasses.fields(ShellRunResult)}
    assert {"exit_status_unknown", "resources"} <= set(data)
    assert set(data["stdout"]) == {
        "text",
        "truncated",
        "spill_path",
        "total_bytes",
        "spill_truncated",
    }


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--timeout-ms", "-5", "--", "true"),
        ("run", "--timeout-ms", "abc", "--", "true"),
        ("run",),
        ("run", "--", "   "),
        ("bogus",),
        ("run", "--sandbox", "nope", "--", "true"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: tuple[str, ...]) -> None:
    p = cli(*args)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


@pytest.mark.parametrize("stream", [[], ["--stream"]])
def test_infrastructure_failure_is_one_line_exit_125(stream: list[str]) -> None:
    p = cli("run", *stream, "--workdir", "/definitely/missing", "--", "true")
    assert p.returncode == 125 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "SPAWN_FAILED" in p.stderr


def test_spill_paths_stay_readable_after_exit() -> None:
    p = cli("run", "--", "seq 1 100000")
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("[output truncated"))
    path = line.removeprefix("[output truncated; full output: ").removesuffix("]")
    try:
        with open(path) as f:
            assert f.read().endswith("99999\n100000\n")
        assert os.stat(path).st_mode & 0o777 == 0o600
    finally:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def test_sandboxed_run_marks_denial() -> None:
    p = cli("run", "--sandbox", "read-only", "--workdir", "/var/tmp", "--", "touch x")
    assert p.returncode == 1
    assert p.stdout.endswith("[sandbox: file access denied under read-only mode]\n[exit code: 1]\n")


def test_doctor_reports_landlock_and_limits() -> None:
    p = cli("doctor")
    assert p.returncode == 0
    assert p.stdout.startswith("landlock abi: ")
    for needle in ("mode read-only", "mode workspace-write", "spill parent:", "defaults:"):
        assert needle in p.stdout
    lines = p.stdout.splitlines()
    # SPEC §6: "... spill directory, limits": the default limits, and how each is enforced.
    assert "default limits: max_processes=4096" in lines
    (enforced,) = [line for line in lines if line.startswith("limits: ")]
    assert "max_processes=" in enforced and "memory_bytes=" in enforced


# -- conventions: version, usage, help --------------------------------------------------------


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    p = cli("--version")
    assert (p.returncode, p.stdout, p.stderr) == (0, f"shellseam {version('shellseam')}\n", "")


def test_bare_shellseam_prints_the_usage_and_exits_2() -> None:
    # SPEC §6: "`shellseam` alone prints the usage" (on stdout, as --help does; it is not
    # a usage error's one-line message on stderr).
    p = cli()
    assert p.returncode == 2 and p.stderr == ""
    assert p.stdout.startswith("usage: shellseam [-h] [--version] COMMAND ...\n")
    for command in ("run", "doctor", "mcp", "clean", "bench"):
        assert f"\n    {command} " in p.stdout
    assert p.stdout == cli("--help").stdout


def test_help_has_examples_and_exit_codes() -> None:
    p = cli("run", "--help")
    assert p.returncode == 0
    assert "echo data | shellseam run -- cat" in p.stdout
    assert "exit codes of `shellseam run`:" in p.stdout
    for code in ("  2 ", "  125 ", "  128+n "):
        assert code in p.stdout
    # How the words after -- become one command, and the advice to quote it.
    assert (
        "joined with single spaces into ONE command" in p.stdout and "quote the whole" in p.stdout
    )


def test_every_option_of_every_command_has_help() -> None:
    from shellseam.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == {"run", "doctor", "mcp", "clean", "bench"}
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    for choice in subparsers._choices_actions:
        assert choice.help, choice.dest


# -- run: stdin, quoting, stream, network, limits --------------------------------------------


def test_stdin_is_passed_to_the_command_when_not_a_terminal() -> None:
    p = cli("run", "--", "cat", stdin="data\n")
    assert (p.returncode, p.stdout) == (0, "data\n[exit code: 0]\n")


def test_stdin_over_the_limit_is_one_usage_line_not_the_hosts_memory() -> None:
    # Found by attacking: `yes | shellseam run -- head -1` read stdin without a bound (the
    # CLI grew until the host's memory ran out; under `ulimit -v` a MemoryError traceback).
    limit_mib = 64
    for shell_input in ("yes |", "cat /dev/zero |"):
        # A session of its own: a failing run is killed whole (the pipeline's writer too).
        with subprocess.Popen(
            ["bash", "-c", f"{shell_input} {shlex.join(CLI)} run -- head -c 1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as pipeline:
            try:
                out, err = pipeline.communicate(timeout=60)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pipeline.pid, signal.SIGKILL)
        assert pipeline.returncode == 2, err
        assert out == ""
        assert err == (
            f"shellseam: stdin is over {limit_mib} MiB (the CLI passes its stdin on as bytes, "
            "read to its end first): let the command read the file itself\n"
        )
    exactly = cli("run", "--", "wc -c", stdin="y" * (limit_mib * 2**20))
    assert exactly.stdout == f"{limit_mib * 2**20}\n[exit code: 0]\n"


@pytest.mark.parametrize(("sig", "name"), [(35, "SIG35"), (40, "SIG40"), (64, "SIGRTMAX")])
def test_a_real_time_signal_exits_128_plus_its_number(sig: int, name: str) -> None:
    # SIG35 and SIG40 exited 137 (SIGKILL's) before: the name was not in signal.Signals.
    p = cli("run", "--", f"kill -{sig} $$")
    assert p.stdout == f"(no output)\n[killed by signal: {name}]\n"
    assert p.returncode == 128 + sig


def test_a_terminal_stdin_is_not_read() -> None:
    import pty

    leader, follower = pty.openpty()
    try:
        p = subprocess.run(
            [*CLI, "run", "--", "cat"],
            stdin=follower,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert (p.returncode, p.stdout) == (0, "(no output)\n[exit code: 0]\n")


def test_one_quoted_argument_keeps_its_quotes() -> None:
    p = cli("run", "--", "echo it's")
    assert p.returncode == 2 and "unexpected EOF" in p.stdout
    p = cli("run", "--", '''echo "it's"''')
    assert (p.returncode, p.stdout) == (0, "it's\n[exit code: 0]\n")


def test_stream_shows_output_then_the_markers_on_stderr() -> None:
    p = cli("run", "--stream", "--", "echo out; echo err >&2; exit 3")
    assert (p.returncode, p.stdout, p.stderr) == (3, "out\n", "err\n[exit code: 3]\n")
    p = cli("run", "--stream", "--timeout-ms", "300", "--", "echo a; sleep 10")
    assert (p.returncode, p.stdout) == (128 + 15, "a\n")
    assert p.stderr == "[timed out after 300ms]\n[killed by signal: SIGTERM]\n"
    p = cli("run", "--stream", "--", "true")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "[exit code: 0]\n")


def test_stream_timeout_fires_while_the_cli_stdout_is_blocked() -> None:
    # Found by attacking: `shellseam run --stream --timeout-ms 1000 -- yes | sleep 30` kept
    # `yes` running past its timeout: the live copy blocked on the full pipe and the timeout
    # was only looked at between copies. The command must end on time whatever the reader.
    marker = f"SHELLSEAM_TEST_STREAM_{os.getpid()}_{time.monotonic_ns()}"
    env = {**os.environ, marker: "1"}

    def running() -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"{marker}=1".encode() in f.read().split(b"\0"):
                        with open(f"/proc/{pid}/comm") as c:
                            found.append(c.read().strip())
            except OSError:
                continue
        return found

    with subprocess.Popen(
        [*CLI, "run", "--stream", "--timeout-ms", "1000", "--", "yes"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # never read until the end: the pipe fills
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        try:
            time.sleep(1.0)
            assert "yes" in running()
            deadline = time.monotonic() + 10
            while "yes" in running() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "yes" not in running()  # killed on time, the CLI still blocked
        finally:
            proc.kill()
            proc.communicate()


def test_stream_is_live() -> None:
    with subprocess.Popen(
        [*CLI, "run", "--stream", "--", "echo first; sleep 30; echo never"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            # The line arrives while the command still sleeps, long before it could end.
            assert proc.stdout.readline() == "first\n"
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 128 + signal.SIGINT
        assert proc.stdout.read() == ""
        assert proc.stderr.read() == "[killed by signal: SIGTERM]\n"


def test_stream_and_json_exclude_each_other() -> None:
    p = cli("run", "--stream", "--json", "--", "true")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not allowed with" in p.stderr


@pytest.mark.parametrize("sandbox", [[], ["--sandbox", "danger-full-access"]])
def test_no_network_needs_a_confining_sandbox(sandbox: list[str]) -> None:
    p = cli("run", *sandbox, "--no-network", "--", "true")
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == (
        "shellseam: --no-network needs a confining mode: read-only or workspace-write\n"
    )


def test_no_network_takes_tcp_away(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        command = (
            f"{sys.executable} -c 'import socket; "
            f'socket.create_connection(("127.0.0.1", {port}))\''
        )
        args = ("run", "--sandbox", "workspace-write", "--workdir", str(tmp_path))
        assert cli(*args, "--", command).returncode == 0
        p = cli(*args, "--no-network", "--", command)
        assert p.returncode == 1 and "Error" in p.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("--memory", "0"),
        ("--memory", "12Q"),
        ("--memory", "1.5"),
        ("--memory", ""),
        ("--max-processes", "0"),
        ("--max-processes", "-3"),
        ("--cpu-ms", "1e3"),
        ("--cpu-ms", str(2**63)),
        # Only ASCII digits, as the sizes take (int() took these; red team).
        ("--max-processes", "\u0661"),
        ("--cpu-ms", "1_000"),
    ],
)
def test_bad_limit_values_are_usage_errors(args: tuple[str, str]) -> None:
    p = cli("run", *args, "--", "true")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_limit_flags_become_the_calls_limits() -> None:
    p = cli(
        "run",
        "--json",
        "--memory",
        "64M",
        "--max-processes",
        "50",
        "--cpu-ms",
        "5000",
        "--",
        "true",
    )
    assert p.returncode == 0, p.stderr
    limits = json.loads(p.stdout)["resources"]["limits"]
    assert (limits["memory_bytes"], limits["max_processes"], limits["cpu_ms"]) == (
        64 * 2**20,
        50,
        5000,
    )


# -- signals: the command dies with the CLI's stop signal -----------------------------------


def _children_running(parent: int, needle: str) -> list[int]:
    found = []
    for pid, state, ppid, _pgrp in proc_stats():
        if ppid != parent or state in "ZX":
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle.encode() in cmdline:
            found.append(pid)
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.parametrize("stream", [[], ["--stream"]])
def test_a_stop_signal_kills_the_command_and_exits_128_plus_n(
    stop: signal.Signals, stream: list[str]
) -> None:
    with subprocess.Popen(
        [*CLI, "run", *stream, "--", "sleep 33"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            deadline = time.monotonic() + 20
            while not (sleepers := _children_running(proc.pid, "sleep 33")):
                assert time.monotonic() < deadline, "the command never started"
                time.sleep(0.02)
            proc.send_signal(stop)
            assert proc.wait(timeout=20) == 128 + stop
        finally:
            if proc.poll() is None:
                proc.kill()
        assert all(not process_alive(pid) for pid in sleepers)
        assert "Traceback" not in proc.stderr.read()


# -- spill files under the cache's cli/ folder, and `shellseam clean` -----------------------


def _env_with_cache(cache: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(cache)}


def test_cli_spill_files_live_under_the_cache_cli_folder(tmp_path: Path) -> None:
    p = cli("run", "--", "seq 1 100000", env=_env_with_cache(tmp_path))
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("[output truncated"))
    path = Path(line.removeprefix("[output truncated; full output: ").removesuffix("]"))
    assert path.parent.parent == tmp_path / "shellseam" / "cli"
    assert path.read_text().endswith("99999\n100000\n")


def test_clean_removes_folders_older_than_a_day(tmp_path: Path) -> None:
    env = _env_with_cache(tmp_path)
    cli_dir = tmp_path / "shellseam" / "cli"
    cli_dir.mkdir(parents=True)
    old, young = cli_dir / "shellseam-old", cli_dir / "shellseam-young"
    for folder in (old, young):
        folder.mkdir()
        (folder / "stdout-x.log").write_text("x")
    two_days_ago = time.time() - 2 * 86400
    for path in (old / "stdout-x.log", old):
        os.utime(path, (two_days_ago, two_days_ago))
    p = cli("clean", env=env)
    assert p.returncode == 0
    # One line per folder swept (the first is the cache's; a /var/tmp one may follow).
    assert p.stdout.splitlines()[0] == (
        f"removed 1 spill folder from {cli_dir} (1 younger than a day kept)"
    )
    assert not old.exists() and young.exists()
    p = cli("clean", "--all", env=env)
    assert p.stdout.splitlines()[0] == f"removed 1 spill folder from {cli_dir}"
    assert list(cli_dir.iterdir()) == []


def test_clean_leaves_what_is_not_a_spill_folder_of_ours(tmp_path: Path) -> None:
    cli_dir = tmp_path / "shellseam" / "cli"
    (cli_dir / "notes").mkdir(parents=True)
    (cli_dir / "shellseam-link").symlink_to(tmp_path)
    p = cli("clean", "--all", env=_env_with_cache(tmp_path))
    assert p.stdout.splitlines()[0] == f"removed 0 spill folders from {cli_dir}"
    assert (cli_dir / "notes").is_dir() and (cli_dir / "shellseam-link").is_symlink()


# Red team (stop 17): /var/tmp is everyone's. Another local user made the victim's fallback
# folder, /var/tmp/shellseam-<uid>, with `cli` a symlink to the victim's own cache, and the
# victim's `shellseam clean --all` removed the spill folders of its running services.
@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")
def test_clean_never_sweeps_a_fallback_folder_someone_else_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shellseam import paths

    live = tmp_path / "cache" / "shellseam"
    (live / "shellseam-live").mkdir(parents=True)
    planted = tmp_path / "vartmp" / "shellseam-0"
    planted.mkdir(parents=True)
    (planted / "cli").symlink_to(live)
    os.chown(planted, 65534, 65534)
    monkeypatch.setattr(paths, "_outside_parent", lambda: str(planted))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert str(planted / "cli") not in paths.cli_spill_parents()
    os.chown(planted, 0, 0)  # ours now, but `cli` is still a symlink
    assert str(planted / "cli") not in paths.cli_spill_parents()
    (planted / "cli").unlink()
    (planted / "cli").mkdir(mode=0o700)
    assert str(planted / "cli") in paths.cli_spill_parents()
    assert (live / "shellseam-live").is_dir()


# Red team (stop 17): a workspace-write command can chmod the spill parents (Landlock has no
# right for it); a parent others may write let them swap spill folders under a printed path.
def test_a_spill_parent_others_could_write_is_made_private_again(tmp_path: Path) -> None:
    from shellseam.service import _private_dir

    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(0o777)
    assert _private_dir(str(parent))
    assert parent.stat().st_mode & 0o777 == 0o700
    link = tmp_path / "link"
    link.symlink_to(parent)
    assert not _private_dir(str(link))  # a symlink is never a private folder


# Red team (stop 17): an output that could not be written (the reader left, fd 1 closed, a
# full disk) ended `shellseam run` with a Python traceback.
@pytest.mark.parametrize(
    ("shell", "code"),
    [
        ("{cli} run --stream -- yes | head -c 10 >/dev/null; exit ${{PIPESTATUS[0]}}", 141),
        ("{cli} run -- 'echo hi' >&-", 0),
        ("{cli} run --stream -- 'echo hi' >&-", 0),
        ("{cli} run --json -- 'echo hi' >/dev/full", 125),
    ],
)
def test_output_that_cannot_be_written_is_no_traceback(shell: str, code: int) -> None:
    command = " ".join(CLI)
    p = subprocess.run(
        ["bash", "-c", shell.format(cli=command)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == code, p.stderr
    assert len(p.stderr.splitlines()) <= 1, p.stderr


def test_a_workspace_holding_the_cache_gets_its_spill_files_elsewhere(tmp_path: Path) -> None:
    # cwd = the workspace root of a workspace-write call; the default spill parent lies in
    # it (the usual case of a shell in ~): the spill files must go where it cannot write.
    p = cli(
        "run",
        "--sandbox",
        "workspace-write",
        "--",
        "seq 1 100000",
        cwd=str(tmp_path),
        env=_env_with_cache(tmp_path / ".cache"),
    )
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("[output truncated"))
    path = Path(line.removeprefix("[output truncated; full output: ").removesuffix("]"))
    try:
        assert path.parent.parent == Path(f"/var/tmp/shellseam-{os.geteuid()}/cli")
        assert path.read_text().endswith("99999\n100000\n")
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
        for made in (path.parent.parent, path.parent.parent.parent):  # when left empty
            with contextlib.suppress(OSError):
                made.rmdir()


# -- missing extras ---------------------------------------------------------------------------


def test_mcp_without_the_extra_is_a_one_line_hint() -> None:
    code = (
        "import sys; sys.modules['mcp'] = None; "
        "from shellseam.cli import main; sys.exit(main(['mcp']))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert (p.returncode, p.stdout) == (2, "")
    assert (
        p.stderr == "shellseam: shellseam mcp needs the 'mcp' extra: pip install 'shellseam[mcp]'\n"
    )


# -- parse_size: SPEC's SIZE grammar ---------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def _any_case(draw: st.DrawFn, text: str) -> str:
    return "".join(c.upper() if draw(st.booleans()) else c for c in text)


@st.composite
def _sizes(draw: st.DrawFn) -> tuple[str, int]:
    unit = draw(st.sampled_from(sorted(_UNITS)))
    number = draw(st.integers(min_value=1, max_value=(2**63 - 1) // _UNITS[unit]))
    return f"{number}{_any_case(draw, unit)}", number * _UNITS[unit]


@given(_sizes())
def test_parse_size_reads_every_unit_in_any_case(case: tuple[str, int]) -> None:
    text, expected = case
    assert parse_size(text) == expected


def test_parse_size_examples() -> None:
    assert parse_size("512M") == 512 * 2**20
    assert parse_size("2G") == parse_size("2Gi") == parse_size("2gib") == 2 * 2**30
    assert parse_size("100MB") == 100 * 10**6
    assert parse_size("1.5K") == 1536
    assert parse_size("4096") == 4096
    assert parse_size(" 1 kb ") == 1000


@given(st.text(max_size=12))
def test_parse_size_returns_a_positive_int_or_raises_value_error(text: str) -> None:
    try:
        value = parse_size(text)
    except ValueError as err:
        assert str(err).startswith("invalid size")
    else:
        assert isinstance(value, int) and 0 < value <= 2**63 - 1


@pytest.mark.parametrize(
    "text", ["", "0", "0K", "-1", "1.5", "0.1K", "K", "1KK", "1 Q", "1e3", "9223372036854775808"]
)
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_ctrl_c_while_stdin_is_still_open_exits_130() -> None:
    with subprocess.Popen(
        [*CLI, "run", "--", "cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            # Wait until the CLI blocks reading its stdin (read(0, ...) on x86_64: syscall 0).
            deadline = time.monotonic() + 20
            while not Path(f"/proc/{proc.pid}/syscall").read_text().startswith("0 0x0 "):
                assert time.monotonic() < deadline, "the CLI never read its stdin"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read() == "" and "Traceback" not in proc.stderr.read()


def test_stream_keeps_up_with_megabytes_of_output() -> None:
    p = cli("run", "--stream", "--", "seq 1 200000")
    expected = "".join(f"{i}\n" for i in range(1, 200001))
    assert (p.returncode, p.stderr) == (0, "[exit code: 0]\n")
    assert p.stdout == expected
