"""The native boundary: frozen records with named fields, one error conversion that keeps
the ShellError code and errno, and one Python module (the service) that talks to the core."""

from __future__ import annotations

import ast
import errno
import os
import pathlib

import pytest

import shellseam
from conftest import run
from shellseam import LocalShellExecutor, ShellError, SubprocessService, _core
from shellseam.service import ManagedProcess


def _spawn(service: SubprocessService, command: str, cwd: str = "/") -> ManagedProcess:
    env = _core.Env.from_pairs([(b"PATH", os.environ.get("PATH", "/usr/bin:/bin").encode())])
    return service.spawn(
        program=b"/bin/bash",
        argv=[b"bash", b"-c", command.encode()],
        cwd=cwd,
        env=env,
        stdin=b"",
        stdout_cap=1000,
        stderr_cap=1000,
        spill_cap=1 << 20,
        grace_ms=300,
    )


def _native_spawn(
    sup: _core.Supervisor,
    program: bytes,
    argv: list[bytes],
    cwd: bytes = b"/",
    limits: _core.CallLimits | None = None,
) -> _core.Proc:
    """A spawn straight through the core, with an empty environment and small caps."""
    return sup.spawn(
        program=program,
        argv=argv,
        cwd=cwd,
        env=_core.Env.from_pairs([]),
        stdin=b"",
        stdout_cap=100,
        stderr_cap=100,
        spill_cap=100,
        grace_ms=10,
        limits=limits,
    )


def test_finished_process_is_a_record_with_named_fields(service: SubprocessService) -> None:
    proc = _spawn(service, "printf out; printf err >&2; exit 3")
    assert proc.wait(10)
    finished = proc.result()
    assert finished is not None
    assert finished.outcome.exit_code == 3
    assert finished.outcome.signal is None
    assert finished.outcome.exit_status_unknown is False
    assert finished.outcome.kill_requested is False
    assert finished.outcome.leftover_killed == 0
    assert finished.outcome.duration_ms >= 0
    assert finished.outcome.rusage.max_rss_kib > 0
    assert finished.stdout.text == "out" and finished.stdout.total_bytes == 3
    assert finished.stderr.text == "err" and finished.stderr.spill_path is None
    out, err = proc.read()
    assert (out.text, out.lossy, out.spill_path) == ("out", False, None)
    assert err.text == "err"
    with pytest.raises(AttributeError):
        finished.outcome.exit_code = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        out.text = "forged"  # type: ignore[misc]


def test_call_limits_cross_as_a_frozen_record_with_named_fields(tmp_path: pathlib.Path) -> None:
    limits = _core.CallLimits(memory_bytes=1 << 30, cpu_ms=500)
    assert (limits.memory_bytes, limits.cpu_ms) == (1 << 30, 500)
    assert (limits.max_processes, limits.file_size_bytes, limits.open_files) == (None,) * 3
    with pytest.raises(AttributeError):
        limits.cpu_ms = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        _core.CallLimits(1 << 30)  # type: ignore[call-arg]  # keywords only: no positional order
    with pytest.raises(OverflowError):
        _core.CallLimits(open_files=-1)
    sup = _core.Supervisor(str(tmp_path))
    try:
        with pytest.raises(TypeError):
            _native_spawn(sup, b"/bin/true", [b"true"], limits=(None,) * 5)  # type: ignore[arg-type]
        proc = _native_spawn(
            sup,
            b"/bin/bash",
            [b"bash", b"-c", b"ulimit -n"],
            limits=_core.CallLimits(open_files=37),
        )
        finished = proc.wait_result(10)
        assert finished is not None
        assert finished.stdout.text.strip() == "37"
    finally:
        sup.dispose()


def test_wait_result_waits_and_collects_in_one_call(service: SubprocessService) -> None:
    # stdin is empty, so the command must block on something other than input: a sleep
    # that only the kill ends (exec, so the SIGTERM lands on the process we wait for).
    proc = _spawn(service, "exec sleep 30")
    assert proc.wait_result(0) is None  # still running: a timed-out wait has no result
    proc.kill()
    finished = proc.wait_result(None)
    assert finished is not None
    assert finished.outcome.kill_requested is True
    assert finished.outcome.signal == 15
    quick = _spawn(service, "printf done; exit 4")
    finished = quick.wait_result(10)
    assert finished is not None
    assert (finished.outcome.exit_code, finished.stdout.text) == (4, "done")


def test_output_left_in_the_pipes_at_exit_is_kept(service: SubprocessService) -> None:
    # The waiting caller settles the exit itself: what the pipes still hold then is kept,
    # byte for byte, on both streams.
    for size in (0, 1, 4095, 65536, 300_000):
        proc = _spawn(service, f"head -c {size} /dev/zero; head -c {size} /dev/zero >&2; exit 9")
        finished = proc.wait_result(10)
        assert finished is not None
        assert finished.outcome.exit_code == 9
        assert finished.stdout.total_bytes == size
        assert finished.stderr.total_bytes == size


def test_native_spawn_error_keeps_code_errno_and_stage(tmp_path: pathlib.Path) -> None:
    sup = _core.Supervisor(str(tmp_path))
    try:
        with pytest.raises(_core.SpawnError) as caught:
            _native_spawn(sup, b"/bin/bash", [b"bash", b"-c", b"true"], cwd=b"/nonexistent/dir")
        assert isinstance(caught.value, _core.NativeError)
        assert caught.value.args == (
            "SPAWN_FAILED",
            os.strerror(errno.ENOENT),
            errno.ENOENT,
            "chdir",
        )
        sup.dispose()
        with pytest.raises(_core.DisposedError) as disposed:
            _native_spawn(sup, b"/bin/true", [b"true"])
        assert disposed.value.args[0] == "DISPOSED"
    finally:
        sup.dispose()


def test_spawn_failure_becomes_a_shell_error_with_the_reason(
    service: SubprocessService, tmp_path: pathlib.Path
) -> None:
    ex = LocalShellExecutor(cwd=str(tmp_path), service=service)
    missing = str(tmp_path / "gone")
    with pytest.raises(ShellError) as caught:
        run(ex, "true", workdir=missing)
    assert caught.value.code == "SPAWN_FAILED"
    assert caught.value.reason == (
        f"cannot change to the working directory {missing}: {os.strerror(errno.ENOENT)}"
    )


def test_only_the_service_module_talks_to_the_core() -> None:
    root = pathlib.Path(shellseam.__file__).parent
    importers = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module or ''}.{a.name}" for a in node.names]
                names.append(node.module or "")
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.split(".")[-1] == "_core" or "._core" in n for n in names):
                importers.append(path.relative_to(root).as_posix())
                break
    # The bench harness may reach the core directly for its "native core alone" figure.
    assert [p for p in importers if not p.startswith(("bench", "_bench"))] == ["service.py"]


#: Fragments of every model-facing marker and status line (SPEC §5 and the task tools).
MODEL_FACING = (
    "[stderr]",
    "[exit code",
    "[killed by signal",
    "[exit status unknown]",
    "[output truncated",
    "[timed out after",
    "[stopped ",
    "[sandbox: file access denied",
    "[some output was dropped",
    "(no output)",
    "spawn failed",
    "sandbox unavailable",
    "invalid request",
    "no such task",
    "started background task",
    " finished: ",
    "(no tasks)",
    "killed task",
    "had already finished",
    "tool call aborted",
)


def _string_constants(tree: ast.AST) -> list[str]:
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            docstrings.add(id(first.value))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_model_facing_strings_live_in_render_only() -> None:
    root = pathlib.Path(shellseam.__file__).parent
    # The mini-swe-agent adapter is being moved onto render_markers by its own change.
    exempt = {"render.py", "integrations/minisweagent.py"}
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in exempt or rel.startswith(("bench", "_bench")):
            continue
        for text in _string_constants(ast.parse(path.read_text(), rel)):
            found += [(rel, marker) for marker in MODEL_FACING if marker in text]
    assert found == []
