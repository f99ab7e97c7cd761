"""A resolved spec read by the core itself (``SubprocessService.run_spec``, behind ``run_sync``).

A spec ``resolve`` made and marked goes to the core as it is, in the one native call that
runs it; anything the core does not read (an abort signal, ``env`` layers, a long command, a
spec built or changed by hand) takes the executor's Python path. What users rely on: the
same bytes, status, environment and limits either way, and no step of the Python path left
out where a subclass or a spec needs it."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from shellseam import (
    AbortController,
    LocalShellExecutor,
    ResourceLimits,
    SandboxPolicy,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
)
from shellseam.local import Confinement
from shellseam.service import ChildEnv
from shellseam.types import ShellExecSpec, ShellRunResult, ShellSandboxInfo


@pytest.fixture
def python_path_refused(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Makes the Python path of a foreground run fail, so that a run that still works
    went through ``run_spec``."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Python path ran")

    monkeypatch.setattr(SubprocessService, "run_shell", refused)
    monkeypatch.setattr(LocalShellExecutor, "_child_env", refused)
    yield


def _spec(ex: LocalShellExecutor, command: str, **fields: object) -> ShellExecSpec:
    return ex.resolve(ShellExecRequest(command=command, **fields))  # type: ignore[arg-type]


def test_a_resolved_spec_runs_in_the_core_with_exact_bytes(
    service: SubprocessService, tmp_path: pathlib.Path, python_path_refused: None
) -> None:
    workdir = tmp_path / "répertoire ✓"
    workdir.mkdir()
    ex = LocalShellExecutor(cwd=str(workdir), service=service)
    r = ex.run_sync(_spec(ex, "printf 'ü-%s-' \"$(cat)\"; pwd; echo 'ß' >&2; exit 3", stdin="ñ€"))
    assert (r.exit_code, r.stdout.text, r.stderr.text) == (3, f"ü-ñ€-{workdir}\n", "ß\n")
    assert r.stdout.total_bytes == len(f"ü-ñ€-{workdir}\n".encode())
    assert r.resources.limits == ex.limits and r.sandbox is None


def test_bytes_stdin_reaches_the_command_unchanged(
    ex: LocalShellExecutor, python_path_refused: None
) -> None:
    payload = bytes(range(256)) * 3
    r = ex.run_sync(_spec(ex, "od -An -v -tx1 | tr -d ' \\n'", stdin=payload))
    assert r.stdout.text == payload.hex()


def test_a_sandboxed_spec_runs_in_the_core_with_its_confinement(
    service: SubprocessService, tmp_path: pathlib.Path, python_path_refused: None
) -> None:
    ex = SandboxShellExecutor(mode="read-only", cwd=str(tmp_path), service=service)
    r = ex.run_sync(_spec(ex, 'test -d "$TMPDIR" && echo tmp ok; touch ./x'))
    assert r.stdout.text == "tmp ok\n" and r.exit_code == 1
    assert "Permission denied" in r.stderr.text or "Read-only" in r.stderr.text
    assert r.sandbox is not None and r.sandbox.denied
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "fields",
    [
        {"command": "#" + "x" * (200 * 1024) + "\necho long"},
        {"command": "echo $SS_LAYER", "env": {"SS_LAYER": "long"}},
        {"command": "echo long", "signal": AbortController().signal},
    ],
    ids=["beyond-one-argument", "env-layer", "abort-signal"],
)
def test_specs_the_core_does_not_read_run_the_python_way(
    ex: LocalShellExecutor, fields: dict[str, object]
) -> None:
    r = ex.run_sync(ex.resolve(ShellExecRequest(**fields)))  # type: ignore[arg-type]
    assert (r.exit_code, r.stdout.text) == (0, "long\n")


def test_each_spec_runs_under_its_own_limits(
    ex: LocalShellExecutor, tmp_path: pathlib.Path
) -> None:
    # The core converts a spec's limits once per ResourceLimits object: alternating specs
    # must each get their own.
    capped = _spec(
        ex, "head -c 100000 /dev/zero > big", limits=ResourceLimits(file_size_bytes=4096)
    )
    free = _spec(ex, "head -c 100000 /dev/zero > big")
    for _ in range(2):
        hit = ex.run_sync(capped)
        assert hit.resources.limit_exceeded == "file_size" and hit.exit_code == 128 + 25
        assert hit.resources.limits.file_size_bytes == 4096
        ok = ex.run_sync(free)
        assert ok.exit_code == 0 and ok.resources.limit_exceeded is None
        assert ok.resources.limits == ex.limits
        assert (tmp_path / "big").stat().st_size == 100000


def test_a_subclass_that_builds_its_own_environment_is_honoured(
    service: SubprocessService, tmp_path: pathlib.Path
) -> None:
    class Tagged(SandboxShellExecutor):
        def _child_env(
            self, spec: ShellExecSpec, confinement: Confinement | None = None
        ) -> ChildEnv:
            env = super()._child_env(spec, confinement)
            pairs = [*env.pairs(), (b"SS_TAGGED", b"yes")]
            return type(env).from_pairs(pairs)

    ex = Tagged(mode="danger-full-access", cwd=str(tmp_path), service=service)
    assert ex.run_sync(_spec(ex, "echo $SS_TAGGED")).stdout.text == "yes\n"


def test_a_disposed_service_refuses_a_resolved_spec(tmp_path: pathlib.Path) -> None:
    service = SubprocessService()
    ex = LocalShellExecutor(cwd=str(tmp_path), service=service)
    spec = _spec(ex, "true")
    assert ex.run_sync(spec).exit_code == 0
    service.dispose()
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec)
    assert err.value.code == "DISPOSED"


def test_a_missing_workdir_is_reported_with_its_path(
    ex: LocalShellExecutor, tmp_path: pathlib.Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    spec = _spec(ex, "true", workdir=str(gone))
    os.rmdir(gone)
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec)
    assert err.value.code == "SPAWN_FAILED" and str(gone) in err.value.reason


# -- a sandboxed call of the policy prepared last ----------------------------------------


@pytest.fixture
def workspaces() -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    """Two workspaces outside /tmp (which every confined command may write)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="shellseam-spec-", dir="/var/tmp"))
    a, b = base / "a", base / "b"
    a.mkdir()
    b.mkdir()
    yield a, b
    shutil.rmtree(base)


def test_a_sandboxed_call_of_the_prepared_policy_runs_in_one_native_call(
    service: SubprocessService,
    workspaces: tuple[pathlib.Path, pathlib.Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, _ = workspaces
    ex = SandboxShellExecutor(mode="workspace-write", cwd=str(a), service=service)
    assert ex.run_sync(_spec(ex, "echo 1 > one")).exit_code == 0  # prepares the policy

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Python path ran")

    monkeypatch.setattr(SubprocessService, "run_spec", refused)
    monkeypatch.setattr(SandboxShellExecutor, "_prepare", refused)
    ok = ex.run_sync(_spec(ex, "echo 2 > two && cat one two"))
    assert (ok.exit_code, ok.stdout.text) == (0, "1\n2\n")
    assert ok.sandbox is not None and not ok.sandbox.denied
    assert ok.sandbox.mode == "workspace-write" and ok.sandbox.enforcement == "full"
    # A nonzero exit is looked at for a denial, as on the Python path.
    denied = ex.run_sync(_spec(ex, "echo x > /etc/shellseam-probe"))
    assert denied.exit_code == 1 and denied.sandbox is not None and denied.sandbox.denied
    plain = ex.run_sync(_spec(ex, "exit 3"))
    assert plain.exit_code == 3 and plain.sandbox is not None and not plain.sandbox.denied
    assert not os.path.exists("/etc/shellseam-probe")


def test_a_spec_of_another_policy_never_runs_under_the_prepared_one(
    service: SubprocessService, workspaces: tuple[pathlib.Path, pathlib.Path]
) -> None:
    a, b = workspaces
    ex = SandboxShellExecutor(mode="workspace-write", cwd=str(a), service=service)
    assert ex.run_sync(_spec(ex, "echo a > f")).exit_code == 0
    other = SandboxPolicy(mode="workspace-write", workspace_root=str(b))
    r = ex.run_sync(
        _spec(ex, f"echo b > f && echo no > {a}/g", sandbox_policy=other, workdir=str(b))
    )
    assert r.exit_code == 1 and r.sandbox is not None and r.sandbox.denied
    assert (b / "f").read_text() == "b\n" and not (a / "g").exists()
    read_only = SandboxPolicy(mode="read-only", workspace_root=str(a))
    r = ex.run_sync(_spec(ex, "echo no > h", sandbox_policy=read_only))
    assert r.exit_code == 1 and r.sandbox is not None and r.sandbox.mode == "read-only"
    assert not (a / "h").exists()
    # And back: the first policy's calls still write where they may.
    assert ex.run_sync(_spec(ex, "echo again > f")).exit_code == 0
    assert (a / "f").read_text() == "again\n"


def test_a_subclass_judging_denials_its_own_way_is_honoured(
    service: SubprocessService, tmp_path: pathlib.Path
) -> None:
    class Strict(SandboxShellExecutor):
        def _sandbox_info(
            self, spec: ShellExecSpec, exit_code: int | None, stdout_tail: str, stderr_tail: str
        ) -> ShellSandboxInfo:
            return ShellSandboxInfo(mode="workspace-write", denied=True, enforcement="full")

    ex = Strict(mode="workspace-write", cwd=str(tmp_path), service=service)
    for _ in range(2):
        r = ex.run_sync(_spec(ex, "true"))
        assert r.exit_code == 0 and r.sandbox is not None and r.sandbox.denied


# -- what the core does not take over ------------------------------------------------------


_DEADLOCK_PROBE = """
import dataclasses, sys, threading, time
from shellseam import LocalShellExecutor, ResourceLimits, ShellExecRequest, SubprocessService

@dataclasses.dataclass(frozen=True)
class Slow(ResourceLimits):
    def __getattribute__(self, name):
        time.sleep(0.002)
        return super().__getattribute__(name)

service = SubprocessService()
ex = LocalShellExecutor(cwd=sys.argv[1], service=service, limits=Slow(max_processes=64))
specs = [ex.resolve(ShellExecRequest(command=f"echo {i}")) for i in range(4)]
results = []

def calls(spec):
    for _ in range(5):
        results.append(ex.run_sync(spec).stdout.text)

threads = [threading.Thread(target=calls, args=(s,)) for s in specs]
for t in threads:
    t.start()
for t in threads:
    t.join()
service.dispose()
print("".join(sorted(results)), end="")
"""


def test_limits_whose_reads_let_other_threads_in_never_deadlock(tmp_path: pathlib.Path) -> None:
    # The core converts a spec's limits once per object under a lock of its own: reading a
    # subclass's attributes runs Python code, which lets another thread in while the first
    # waits for the GIL; that thread must never wait for the lock holding the GIL. In a
    # child interpreter: a deadlock holds the GIL, so it would hang this one.
    done = subprocess.run(
        [sys.executable, "-c", _DEADLOCK_PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"{i}\n" * 5 for i in range(4))


def test_an_executor_that_shapes_its_commands_itself_is_honoured(
    service: SubprocessService, tmp_path: pathlib.Path
) -> None:
    class Wrapped(LocalShellExecutor):
        def _shell_arg(self, command: bytes) -> tuple[bytes, int | None]:
            return super()._shell_arg(b"WRAPPED=1; " + command)

    ex = Wrapped(cwd=str(tmp_path), service=service)
    assert ex.run_sync(_spec(ex, 'echo "w=$WRAPPED"')).stdout.text == "w=1\n"


@pytest.mark.parametrize("confined", [False, True], ids=["local", "sandboxed"])
def test_a_service_whose_run_shell_is_its_own_still_runs_every_call(
    tmp_path: pathlib.Path, confined: bool
) -> None:
    class Counting(SubprocessService):
        calls = 0

        def run_shell(self, *args: Any, **kwargs: Any) -> ShellRunResult:
            type(self).calls += 1
            return super().run_shell(*args, **kwargs)

    service = Counting()
    try:
        ex: LocalShellExecutor = (
            SandboxShellExecutor(mode="workspace-write", cwd=str(tmp_path), service=service)
            if confined
            else LocalShellExecutor(cwd=str(tmp_path), service=service)
        )
        for i in range(3):
            assert ex.run_sync(_spec(ex, f"echo {i}")).stdout.text == f"{i}\n"
        assert Counting.calls == 3
    finally:
        service.dispose()
