"""The `shellseam` command line, run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "shellseam.cli"]


def cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


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
    assert set(data) == {
        "exit_code",
        "signal",
        "timed_out",
        "aborted",
        "timeout_ms",
        "stdout",
        "stderr",
        "duration_ms",
        "leftover_killed",
        "sandbox",
        "resources",
        "exit_status_unknown",
    }
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


def test_infrastructure_failure_is_one_line_exit_125() -> None:
    p = cli("run", "--workdir", "/definitely/missing", "--", "true")
    assert p.returncode == 125 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "SPAWN_FAILED" in p.stderr


def test_spill_paths_stay_readable_after_exit() -> None:
    p = cli("run", "--", "seq 1 100000")
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
