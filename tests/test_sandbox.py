"""SandboxShellExecutor under real Landlock: access per mode, denials, network, signals."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator

import pytest

import shellseam
from conftest import run
from shellseam import (
    SandboxPolicy,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
    landlock_abi,
)

ABI = landlock_abi()
needs_landlock = pytest.mark.skipif(ABI < 1, reason="kernel has no Landlock")
needs_net = pytest.mark.skipif(ABI < 4, reason="Landlock ABI < 4 has no network rules")
needs_scope = pytest.mark.skipif(ABI < 6, reason="Landlock ABI < 6 has no signal scoping")

pytestmark = needs_landlock


@pytest.fixture
def dirs() -> Iterator[dict[str, str]]:
    """A workspace and an 'outside' directory, both outside /tmp (which is writable)."""
    base = tempfile.mkdtemp(prefix="shellseam-sb-", dir="/var/tmp")
    ws = os.path.join(base, "ws")
    outside = os.path.join(base, "outside")
    extra = os.path.join(base, "extra")
    tmp = tempfile.mkdtemp(prefix="shellseam-sb-", dir="/tmp")
    for d in (ws, outside, extra):
        os.mkdir(d)
    for d in (ws, outside, tmp):
        with open(os.path.join(d, "existing"), "w") as f:
            f.write("content\n")
    yield {"ws": ws, "outside": outside, "extra": extra, "tmp": tmp}
    shutil.rmtree(base)
    shutil.rmtree(tmp)


def make(mode: shellseam.SandboxMode, ws: str, service: SubprocessService) -> SandboxShellExecutor:
    return SandboxShellExecutor(mode=mode, cwd=ws, grace_ms=300, service=service)


def ok(ex: SandboxShellExecutor, command: str, **fields: object) -> bool:
    return run(ex, command, **fields).exit_code == 0


OPS = {
    "read": "cat {d}/existing",
    "list": "ls {d}",
    "write": "echo x >> {d}/existing",
    "truncate": ": > {d}/existing",
    "create": "echo x > {d}/new-$RANDOM",
    "mkdir": "mkdir {d}/newdir-$RANDOM",
    "remove": "rm {d}/existing",
    "exec": "cp /bin/true {d}/t 2>/dev/null; {d}/t",
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_read_only(op: str, dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("read-only", dirs["ws"], service)
    for d in (dirs["ws"], dirs["tmp"], dirs["outside"]):
        cmd = OPS[op].format(d=d)
        if op in ("read", "list"):
            assert ok(ex, cmd), cmd
        elif op == "exec":
            continue  # cannot copy the binary in: covered by the workspace-write case
        else:
            assert not ok(ex, cmd), cmd
    assert ok(ex, "echo x > /dev/null && head -c 1 /dev/zero >/dev/null && echo y > /dev/stdout")
    assert ok(ex, "/bin/ls / >/dev/null")


@pytest.mark.parametrize("op", sorted(OPS))
def test_workspace_write(op: str, dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("workspace-write", dirs["ws"], service)
    for d in (dirs["ws"], dirs["tmp"]):
        assert ok(ex, OPS[op].format(d=d)), (op, d)
    cmd = OPS[op].format(d=dirs["outside"])
    assert ok(ex, cmd) == (op in ("read", "list")), cmd


def test_workdir_inside_workspace_still_writes_whole_workspace(
    dirs: dict[str, str], service: SubprocessService
) -> None:
    os.mkdir(os.path.join(dirs["ws"], "build"))
    ex = make("workspace-write", dirs["ws"], service)
    assert ok(ex, "echo x > ../top-level", workdir="build")


def test_writable_roots_and_tmpdir(dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("workspace-write", dirs["ws"], service)
    policy = SandboxPolicy(
        mode="workspace-write", workspace_root=dirs["ws"], writable_roots=(dirs["extra"],)
    )
    assert ok(ex, f"touch {dirs['extra']}/f", sandbox_policy=policy)
    assert not ok(ex, f"touch {dirs['extra']}/g")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = dirs["outside"]
    try:
        assert ok(ex, f"touch {dirs['outside']}/via-tmpdir")
    finally:
        if old is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = old


def test_danger_full_access_confines_nothing(
    dirs: dict[str, str], service: SubprocessService
) -> None:
    ex = make("danger-full-access", dirs["ws"], service)
    r = run(ex, f"touch {dirs['outside']}/f")
    assert r.exit_code == 0
    assert r.sandbox == shellseam.ShellSandboxInfo(
        mode="danger-full-access", denied=False, enforcement=None
    )


def test_request_policy_overrides_default(dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("read-only", dirs["ws"], service)
    assert ex.sandbox_mode == "read-only"
    spec = ex.resolve(ShellExecRequest(command="true"))
    assert spec.sandbox_policy == SandboxPolicy(mode="read-only", workspace_root=dirs["ws"])
    policy = SandboxPolicy(mode="workspace-write", workspace_root=dirs["ws"])
    r = run(ex, "touch f", sandbox_policy=policy)
    assert r.exit_code == 0 and r.sandbox is not None and r.sandbox.mode == "workspace-write"


def test_denial_classification(dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("read-only", dirs["ws"], service)
    denied = run(ex, f"touch {dirs['ws']}/x")
    assert denied.exit_code == 1 and "Permission denied" in denied.stderr.text
    assert denied.sandbox == shellseam.ShellSandboxInfo(
        mode="read-only", denied=True, enforcement="full" if ABI >= 6 else "partial"
    )
    for command in ("exit 1", "kill -9 $$", "ls /definitely-missing", "true"):
        r = run(ex, command)
        assert r.sandbox is not None and r.sandbox.denied is False, command
    # A permission message with a zero exit is not a denial either.
    r = run(ex, f"touch {dirs['ws']}/x; true")
    assert r.exit_code == 0 and r.sandbox is not None and not r.sandbox.denied


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


@needs_net
def test_network_false_denies_tcp(dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("workspace-write", dirs["ws"], service)
    with _listener() as s:
        port = s.getsockname()[1]
        connect = f"exec 3<>/dev/tcp/127.0.0.1/{port}"
        assert ok(ex, connect)
        closed = SandboxPolicy(mode="workspace-write", workspace_root=dirs["ws"], network=False)
        r = run(ex, connect, sandbox_policy=closed)
        # The seccomp filter refuses the socket itself (EPERM) before Landlock's TCP rule.
        assert r.exit_code != 0 and "socket: Operation not permitted" in r.stderr.text
        assert r.sandbox is not None and r.sandbox.denied
        bind = f"{sys.executable} -c 'import socket; socket.socket().bind((\"127.0.0.1\", 0))'"
        assert ok(ex, bind)
        assert not ok(ex, bind, sandbox_policy=closed)


@needs_scope
def test_sandboxed_command_cannot_signal_the_harness(
    dirs: dict[str, str], service: SubprocessService
) -> None:
    ex = make("workspace-write", dirs["ws"], service)
    received: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda n, _f: received.append(n))
    try:
        r = run(ex, f"kill -USR1 {os.getpid()}")
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert r.exit_code != 0 and "Operation not permitted" in r.stderr.text
    assert received == []
    # Signals inside its own domain still work.
    assert ok(ex, "sleep 5 & kill $!; wait $!; [ $? -eq 143 ]")


def test_harness_keeps_full_access(dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("read-only", dirs["ws"], service)
    for _ in range(30):
        run(ex, "true")
    path = os.path.join(dirs["outside"], "harness-write")
    with open(path, "w") as f:
        f.write("still free")
    with open("/proc/self/status") as f:
        assert "NoNewPrivs:\t0" in f.read()


def test_background_carries_facts(dirs: dict[str, str], service: SubprocessService) -> None:
    ex = make("read-only", dirs["ws"], service)
    p = ex.start(ex.resolve(ShellExecRequest(command=f"touch {dirs['ws']}/bg")))
    assert p.wait_sync(10)
    assert p.sandbox is not None and p.sandbox.denied and p.sandbox.mode == "read-only"
    assert not p.sandbox.runner_failed


def test_no_landlock_fails_closed(
    dirs: dict[str, str], service: SubprocessService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shellseam.sandbox, "landlock_abi", lambda: 0)
    ex = make("workspace-write", dirs["ws"], service)
    with pytest.raises(ShellError) as info:
        run(ex, "true")
    assert info.value.code == "SANDBOX_UNAVAILABLE"
    p = ex.start(ex.resolve(ShellExecRequest(command="true")))
    assert p.status == "killed" and p.sandbox is not None and p.sandbox.runner_failed
    assert p.read_output().delta.startswith("spawn failed: ")
    # danger-full-access needs no Landlock.
    assert ok(make("danger-full-access", dirs["ws"], service), "true")


RUNNER_FAILURE_SCRIPT = textwrap.dedent(
    """
    import ctypes, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    # Nest this process in 16 Landlock domains (the kernel's limit): the child's own
    # landlock_restrict_self then fails with E2BIG, a real kernel refusal.
    attr = struct.pack("QQQ", 1 << 11, 0, 0)  # handles only make_block: harmless here
    libc.prctl(38, 1, 0, 0, 0)
    for _ in range(16):
        fd = libc.syscall(444, attr, 24, 0)
        assert fd >= 0 and libc.syscall(446, fd, 0) == 0
    import shellseam
    ex = shellseam.SandboxShellExecutor(mode="read-only", cwd="/")
    spec = ex.resolve(shellseam.ShellExecRequest(command="echo ran"))
    try:
        ex.run_sync(spec)
        print("ran")
    except shellseam.ShellError as err:
        print(err.code)
        print(err.reason)
    p = ex.start(spec)
    p.wait_sync(5)
    print(p.status, p.sandbox.runner_failed, p.sandbox.denied)
    print(p.read_output().delta)
    """
)


def test_kernel_refusing_the_ruleset_is_a_runner_failure() -> None:
    out = subprocess.run(
        [sys.executable, "-c", RUNNER_FAILURE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "SANDBOX_UNAVAILABLE"
    assert "Landlock" in out[1]
    assert out[2] == "killed True False"
    assert out[3].startswith("spawn failed: ")


def test_landlock_abi_reports_kernel() -> None:
    assert shellseam._core.landlock_abi() == ABI and ABI >= 1


def test_replaced_workspace_is_refused_not_rebuilt(
    dirs: dict[str, str], service: SubprocessService
) -> None:
    ex = make("workspace-write", dirs["ws"], service)
    assert ok(ex, "echo 1 > a")
    shutil.rmtree(dirs["ws"])
    os.mkdir(dirs["ws"])  # same path, another directory: never silently re-granted
    with pytest.raises(ShellError) as info:
        run(ex, "echo 2 > b")
    assert info.value.code == "SANDBOX_UNAVAILABLE"
    assert info.value.reason == f"workspace root changed: {dirs['ws']}"
    assert not os.path.exists(os.path.join(dirs["ws"], "b"))


def test_tmpdir_is_the_value_at_resolve_time(
    dirs: dict[str, str], service: SubprocessService, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = make("workspace-write", dirs["ws"], service)
    monkeypatch.setenv("TMPDIR", dirs["extra"])
    spec = ex.resolve(
        ShellExecRequest(command=f"touch {dirs['extra']}/a; touch {dirs['outside']}/b")
    )
    monkeypatch.setenv("TMPDIR", dirs["outside"])
    r = ex.run_sync(spec)
    assert os.path.exists(os.path.join(dirs["extra"], "a"))
    assert not os.path.exists(os.path.join(dirs["outside"], "b"))
    assert "Permission denied" in r.stderr.text
