"""The attacks of issue 9, one test each, against real Landlock, seccomp and capabilities.

Every test states the attack as a hostile model would make it and asserts the secure
outcome. The harness runs as root here, so "root keeps its capabilities" is tested for
real; sockets stay on loopback.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import platform
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator

import pytest

import shellseam
from conftest import run
from shellseam import (
    LocalShellExecutor,
    SandboxPolicy,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
    landlock_abi,
)
from shellseam.sandbox import _identity, _inside

ABI = landlock_abi()
pytestmark = pytest.mark.skipif(ABI < 1, reason="kernel has no Landlock")
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the attack needs a root harness")
PY = sys.executable


@pytest.fixture
def box() -> Iterator[dict[str, str]]:
    """A workspace under /tmp (so a confined command can rename it), a protected directory
    outside every writable root, and a spill parent outside them too."""
    ws_parent = tempfile.mkdtemp(prefix="shellseam-atk-", dir="/tmp")
    ws = os.path.join(ws_parent, "ws")
    os.mkdir(ws)
    base = tempfile.mkdtemp(prefix="shellseam-atk-", dir="/var/tmp")
    protected = os.path.join(base, "protected")
    os.mkdir(protected)
    secret = os.path.join(protected, "file")
    with open(secret, "w") as f:
        f.write("precious\n")
    os.chmod(secret, 0o644)
    spill = os.path.join(base, "spill")
    yield {
        "ws": ws,
        "ws_parent": ws_parent,
        "protected": protected,
        "file": secret,
        "spill": spill,
        "base": base,
    }
    shutil.rmtree(ws_parent, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def svc(box: dict[str, str]) -> Iterator[SubprocessService]:
    service = SubprocessService(spill_parent=box["spill"])
    yield service
    service.dispose()


def sandbox(
    box: dict[str, str], svc: SubprocessService, mode: str = "workspace-write", **config: object
) -> SandboxShellExecutor:
    return SandboxShellExecutor(
        mode=mode,
        cwd=box["ws"],
        grace_ms=300,
        service=svc,  # type: ignore[arg-type]
        **config,
    )


def policy(box: dict[str, str], mode: str = "workspace-write", **fields: object) -> SandboxPolicy:
    return SandboxPolicy(mode=mode, workspace_root=box["ws"], **fields)  # type: ignore[arg-type]


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def py(code: str) -> str:
    """A python one-liner for a shell command line."""
    return f"{PY} -c {subprocess.list2cmdline([textwrap.dedent(code)])}"


# -- 1. workspace-root swap ---------------------------------------------------------------


def test_1_workspace_root_swap_is_refused(box: dict[str, str], svc: SubprocessService) -> None:
    ex = sandbox(box, svc)
    ws = box["ws"]
    r = run(ex, f"mv {ws} {ws}.real && ln -s {box['protected']} {ws}")
    assert r.exit_code == 0, r.stderr.text  # /tmp is writable: the swap itself succeeds
    with pytest.raises(ShellError) as info:
        run(ex, f"echo pwned > {ws}/file")
    assert info.value.code == "SANDBOX_UNAVAILABLE"
    assert info.value.reason == f"workspace root changed: {ws}"
    with open(box["file"]) as f:
        assert f.read() == "precious\n"


def test_1_swap_between_resolve_and_run_grants_nothing_new(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc)
    ws = box["ws"]
    spec = ex.resolve(ShellExecRequest(command=f"echo pwned > {box['protected']}/new"))
    os.rename(ws, ws + ".real")
    os.symlink(box["protected"], ws)
    with pytest.raises(ShellError) as info:
        ex.run_sync(spec)
    assert info.value.reason == f"workspace root changed: {ws}"
    assert not os.path.exists(os.path.join(box["protected"], "new"))


def test_1_swap_through_the_bash_tool(box: dict[str, str], svc: SubprocessService) -> None:
    from shellseam import BashTool, ManagedEnvRegistry, ToolContext

    tool = BashTool(
        sandbox(box, svc),
        tasks=None,
        env=ManagedEnvRegistry(home=box["base"]),
        enable_run_in_background=False,
    )
    ctx = ToolContext(session_id="s", session_cwd=box["ws"])
    ws = box["ws"]

    async def call(cmd: str) -> str:
        res = await tool.execute({"command": cmd, "description": "d"}, ctx)
        return res.text

    first = asyncio.run(call(f"mv {ws} {ws}.real && ln -s {box['protected']} {ws}"))
    assert first.endswith("[exit code: 0]")
    second = asyncio.run(call(f"echo pwned > {ws}/file"))
    assert second == f"Error: sandbox unavailable: workspace root changed: {ws}"
    with open(box["file"]) as f:
        assert f.read() == "precious\n"


def test_1_a_missing_root_planted_as_a_symlink_is_refused(
    box: dict[str, str], svc: SubprocessService
) -> None:
    later = os.path.join(box["ws_parent"], "later")  # under /tmp: a command can create it
    p = policy(box, writable_roots=(later,))
    ex = sandbox(box, svc)
    assert run(ex, f"ln -s {box['protected']} {later}", sandbox_policy=p).exit_code == 0
    with pytest.raises(ShellError) as info:
        run(ex, f"echo pwned > {later}/new", sandbox_policy=p)
    assert info.value.reason == f"workspace root changed: {later}"
    assert os.listdir(box["protected"]) == ["file"]


def test_1_a_root_planted_as_a_symlink_before_its_first_use_is_refused(
    box: dict[str, str], svc: SubprocessService
) -> None:
    # Found by attacking: session B's workspace exists under /tmp but no call has used it
    # yet. A command of session A swaps it for a symlink to a directory nobody may write;
    # B's first call must not pin where the symlink leads. Through the BashTool, as a model
    # would, and with a fresh executor (whose pins know nothing yet).
    from shellseam import BashTool, ManagedEnvRegistry, ToolContext

    session_b = os.path.join(box["ws_parent"], "session-b")
    os.mkdir(session_b)
    tool = BashTool(
        sandbox(box, svc),
        tasks=None,
        env=ManagedEnvRegistry(home=box["base"]),
        enable_run_in_background=False,
    )

    async def call(cmd: str, cwd: str) -> str:
        ctx = ToolContext(session_id=cwd, session_cwd=cwd)
        res = await tool.execute({"command": cmd, "description": "d"}, ctx)
        return res.text

    plant = f"mv {session_b} {session_b}.gone && ln -s {box['protected']} {session_b}"
    assert asyncio.run(call(plant, box["ws"])).endswith("[exit code: 0]")
    second = asyncio.run(call(f"echo pwned > {box['protected']}/new", session_b))
    assert second.startswith(f"Error: sandbox unavailable: workspace root {session_b} leads")
    fresh = SandboxShellExecutor(mode="workspace-write", cwd=session_b, service=svc)
    with pytest.raises(ShellError) as info:
        fresh.resolve(ShellExecRequest(command=f"echo pwned > {box['protected']}/new"))
    assert info.value.code == "SANDBOX_UNAVAILABLE"
    assert info.value.reason == (
        f"workspace root {session_b} leads through {session_b}, a symlink in a directory "
        "confined commands can write: pass the root's real path"
    )
    assert os.listdir(box["protected"]) == ["file"]


def test_1_a_planted_tmpdir_symlink_is_refused(
    box: dict[str, str], svc: SubprocessService, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmpdir = os.path.join(box["ws_parent"], "tmpdir")
    os.symlink(box["protected"], tmpdir)  # as a command under /tmp could have
    monkeypatch.setenv("TMPDIR", tmpdir)
    with pytest.raises(ShellError) as info:
        run(sandbox(box, svc), f"echo pwned > {box['protected']}/new")
    assert info.value.code == "SANDBOX_UNAVAILABLE"
    assert os.listdir(box["protected"]) == ["file"]


def test_1_symlinked_roots_that_widen_nothing_still_resolve(
    box: dict[str, str], svc: SubprocessService
) -> None:
    # A symlink outside every writable directory (the harness's own layout), and one under
    # /tmp that stays under /tmp, are followed as before.
    outside = os.path.join(box["base"], "link-to-protected")
    os.symlink(box["protected"], outside)
    inside = os.path.join(box["ws_parent"], "link-to-ws")
    os.symlink(box["ws"], inside)
    ex = sandbox(box, svc)
    for link, real in ((outside, box["protected"]), (inside, box["ws"])):
        spec = ex.resolve(
            ShellExecRequest(
                command="true",
                sandbox_policy=SandboxPolicy(mode="workspace-write", workspace_root=link),
            )
        )
        assert spec.sandbox_policy is not None
        assert spec.sandbox_policy.workspace_root == real


#: A confined command that swaps two entries of a directory as fast as it can
#: (`renameat2(RENAME_EXCHANGE)`, x86-64 syscall 316): a directory and a symlink out.
_FLIPPER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, until = sys.argv[1].encode(), sys.argv[2].encode(), time.monotonic() + float(sys.argv[3])
print("flipping", flush=True)
while time.monotonic() < until:
    for _ in range(500):
        libc.syscall(316, -100, a, -100, b, 2)
"""


@pytest.mark.parametrize("swapped", ["root", "parent"])
def test_1_a_root_swapped_while_it_is_first_pinned_never_pins_where_the_link_leads(
    box: dict[str, str], svc: SubprocessService, swapped: str
) -> None:
    # Found by attacking: a root's first pin looked at the path three times (realpath, a
    # walk of lstats, open). A command flipping a directory and a symlink under /tmp made
    # the three see different things: 9-20 % of fresh executors pinned the symlink's target
    # (a directory nobody may write) as session B's workspace, or ~/.cache/shellseam (the
    # spill directory) under a /tmp name that passed the spill check; a raw OSError (EINVAL
    # from realpath) escaped resolve on many others. Now: one walk on held directory fds.
    if platform.machine() != "x86_64":
        pytest.skip("the flipper calls renameat2 by its x86-64 number")
    arena = os.path.join(box["ws_parent"], "arena")
    os.mkdir(arena)
    flip_a, flip_b = os.path.join(arena, "d"), os.path.join(arena, "l")
    if swapped == "root":  # the workspace itself flips between a directory and a link
        os.mkdir(flip_a)
        os.symlink(box["protected"], flip_b)
        victim = flip_a
    else:  # a directory on the way to it flips, with a same-named directory past the link
        os.makedirs(os.path.join(flip_a, "sub"))
        os.mkdir(os.path.join(box["protected"], "sub"))
        os.symlink(box["protected"], flip_b)
        victim = os.path.join(flip_a, "sub")
    outside = {_identity(os.stat(box["protected"]))}
    if swapped == "parent":
        outside.add(_identity(os.stat(os.path.join(box["protected"], "sub"))))
    attacker = sandbox(box, svc)
    flipper = attacker.start(
        attacker.resolve(ShellExecRequest(command=f"{py(_FLIPPER)} {flip_a} {flip_b} 4"))
    )
    tally = {"refused": 0, "pinned inside": 0}
    escaped: list[str] = []
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            victim_ex = sandbox(box, svc)  # a fresh executor: nothing pinned yet
            request = ShellExecRequest(
                command="true",
                sandbox_policy=SandboxPolicy(mode="workspace-write", workspace_root=victim),
            )
            try:
                spec = victim_ex.resolve(request)
            except ShellError as err:
                assert err.code == "SANDBOX_UNAVAILABLE", err
                tally["refused"] += 1
                continue
            except OSError as err:
                escaped.append(repr(err))
                continue
            root = spec.sandbox_policy.workspace_root  # type: ignore[union-attr]
            pinned = victim_ex._pins._known.get(victim)
            if _inside(root, box["protected"]) or (pinned and pinned[1] in outside):
                escaped.append(f"pinned {root} {pinned}")
            else:
                tally["pinned inside"] += 1
    finally:
        flipper.kill()
        flipper.wait_sync(10)
    assert escaped == [], (len(escaped), escaped[:5], tally)
    assert tally["refused"] + tally["pinned inside"] > 50, tally
    assert sorted(os.listdir(box["protected"])) == (
        ["file"] if swapped == "root" else ["file", "sub"]
    )


def test_1_relative_and_non_absolute_roots_are_invalid(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc)
    for p in (
        policy(box, writable_roots=(".",)),
        SandboxPolicy(mode="read-only", workspace_root="ws"),
    ):
        with pytest.raises(ShellError) as info:
            ex.resolve(ShellExecRequest(command="true", sandbox_policy=p))
        assert info.value.code == "INVALID_REQUEST"


def test_1_roots_are_resolved_to_real_paths(box: dict[str, str], svc: SubprocessService) -> None:
    link = os.path.join(box["ws_parent"], "link")
    os.symlink(box["ws"], link)
    ex = sandbox(box, svc)
    spec = ex.resolve(
        ShellExecRequest(
            command="true",
            sandbox_policy=SandboxPolicy(
                mode="workspace-write", workspace_root=link, writable_roots=(link + "/",)
            ),
        )
    )
    assert spec.sandbox_policy is not None
    assert spec.sandbox_policy.workspace_root == box["ws"]


# -- 2. keystroke injection / terminals ------------------------------------------------


@pytest.mark.parametrize("confined", [False, True])
def test_2_every_command_is_a_session_leader_without_a_terminal(
    box: dict[str, str], svc: SubprocessService, confined: bool
) -> None:
    ex: LocalShellExecutor = (
        sandbox(box, svc) if confined else LocalShellExecutor(cwd=box["ws"], service=svc)
    )
    r = run(ex, "echo $$; ps -o sid= -o tty= -p $$")
    pid, rest = r.stdout.text.split("\n", 1)
    sid, tty = rest.split()
    assert sid == pid and tty == "?"
    r = run(ex, "exec 3</dev/tty")
    assert r.exit_code != 0


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_2_other_terminal_gets_no_keystrokes(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        os.chmod(name, 0o666)
        ex = sandbox(box, svc, mode)
        inject = py(f"""
            import fcntl, os, termios
            fd = os.open({name!r}, os.O_RDONLY | os.O_NOCTTY)
            for c in b"id > /tmp/pwned\\n":
                fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))
        """)
        r = run(ex, inject)
        assert r.exit_code != 0
        assert "Operation not permitted" in r.stderr.text or "Permission denied" in r.stderr.text
        r = run(ex, f"printf 'id\\n' > {name}")
        assert r.exit_code != 0 and "Permission denied" in r.stderr.text
        r = run(
            ex,
            py(f"""
            import fcntl, os, struct
            fd = os.open({name!r}, os.O_RDONLY | os.O_NOCTTY)
            fcntl.ioctl(fd, 0x541C, struct.pack("B", 12))  # TIOCLINUX
        """),
        )
        assert r.exit_code != 0
        # Nothing reached the terminal's input queue nor its screen.
        readable, _, _ = select.select([slave, master], [], [], 0.2)
        assert readable == []
    finally:
        os.close(master)
        os.close(slave)


def test_2_console_and_tty_devices_are_not_writable(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc, "read-only")
    for dev in ("/dev/tty", "/dev/console", "/dev/ptmx"):
        if os.path.exists(dev):
            r = run(ex, f"echo x > {dev}")
            assert r.exit_code != 0, dev
    # The bit buckets and the command's own pipes stay usable.
    r = run(ex, "echo a > /dev/null && echo out > /dev/stdout && echo err > /dev/stderr")
    assert (r.exit_code, r.stdout.text, r.stderr.text) == (0, "out\n", "err\n")


# -- 3. unix sockets and the ssh agent --------------------------------------------------


def test_3_pathname_unix_socket_refused_without_network(
    box: dict[str, str], svc: SubprocessService
) -> None:
    path = os.path.join(box["base"], "agent.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(1)
        server.settimeout(0.3)
        ex = sandbox(box, svc, "read-only")
        r = run(
            ex,
            py(f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})"),
            sandbox_policy=policy(box, "read-only", network=False),
        )
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr.text
        with pytest.raises(TimeoutError):
            server.accept()
        # socketpair still works.
        r = run(
            ex,
            py("import socket; a, b = socket.socketpair(); a.send(b'x'); print(b.recv(1))"),
            sandbox_policy=policy(box, "read-only", network=False),
        )
        assert r.stdout.text == "b'x'\n"


@pytest.mark.skipif(ABI < 6, reason="abstract unix sockets are scoped from Landlock ABI 6")
def test_3_abstract_unix_socket_of_the_harness_is_out_of_reach(
    box: dict[str, str], svc: SubprocessService
) -> None:
    name = f"\0shellseam-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name)
        server.listen(1)
        server.settimeout(0.3)
        r = run(
            sandbox(box, svc),
            py(f"import socket; socket.socket(socket.AF_UNIX).connect({name!r})"),
        )
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr.text
        with pytest.raises(TimeoutError):
            server.accept()


def test_3_ssh_auth_sock_is_not_inherited_by_confined_commands(
    box: dict[str, str], svc: SubprocessService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/agent.sock")
    ex = sandbox(box, svc, "read-only")
    assert run(ex, "echo ${SSH_AUTH_SOCK-unset}").stdout.text == "unset\n"
    r = run(ex, "echo $SSH_AUTH_SOCK", env={"SSH_AUTH_SOCK": "/explicit"})
    assert r.stdout.text == "/explicit\n"
    free = SandboxPolicy(mode="danger-full-access", workspace_root=box["ws"])
    assert run(ex, "echo $SSH_AUTH_SOCK", sandbox_policy=free).stdout.text == "/run/agent.sock\n"
    local = LocalShellExecutor(cwd=box["ws"], service=svc)
    assert run(local, "echo $SSH_AUTH_SOCK").stdout.text == "/run/agent.sock\n"


# -- 4. device nodes ---------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("kind", ["b 7 0", "c 1 3", "c 1 1"])
def test_4_device_nodes_cannot_be_created(
    box: dict[str, str], svc: SubprocessService, kind: str
) -> None:
    ex = sandbox(box, svc)
    r = run(ex, f"mknod {box['ws']}/dev {kind}")
    assert r.exit_code != 0
    assert not os.path.exists(os.path.join(box["ws"], "dev"))
    # Other special files a build may need still work.
    assert run(ex, f"mkfifo {box['ws']}/fifo").exit_code == 0
    assert stat.S_ISFIFO(os.lstat(os.path.join(box["ws"], "fifo")).st_mode)


# -- 5. capabilities ---------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_5_no_capabilities_no_new_privs_seccomp(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    ex = sandbox(box, svc, mode)
    r = run(ex, "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status")
    got = dict(line.split(":\t") for line in r.stdout.text.splitlines())
    assert got == {
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }
    # Executing a set-uid-root program regains nothing (NOROOT + locked securebits).
    suid = os.path.join(box["base"], "suidpy")
    shutil.copy(os.path.realpath(PY), suid)
    os.chmod(suid, 0o4755)
    r = run(ex, f"{suid} -c \"print(open('/proc/self/status').read())\" | grep CapEff")
    assert r.stdout.text.split() == ["CapEff:", "0000000000000000"]
    # An unconfined command keeps the harness's privileges (nothing is dropped there).
    local = LocalShellExecutor(cwd=box["ws"], service=svc)
    assert run(local, "grep CapEff /proc/self/status").stdout.text != "CapEff:\t0000000000000000\n"


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
@pytest.mark.parametrize("uid", [0, 65534])
def test_5_ambient_capabilities_of_the_harness_do_not_reach_a_confined_command(
    uid: int,
) -> None:
    # A harness started with an ambient capability (here CAP_NET_RAW, bit 13), as root or as
    # an unprivileged user, passes it to every unconfined child through exec; a confined
    # child must come out with none.
    # Outside /tmp, which confined commands may write: the spill directory may not be there.
    home = pathlib.Path(tempfile.mkdtemp(prefix="shellseam-ambient-", dir="/var/tmp"))
    ws = pathlib.Path(tempfile.mkdtemp(prefix="shellseam-ambient-ws-", dir="/tmp"))
    try:
        # The package as the harness's user can read it (a CI venv may sit in a private
        # directory): a copy on PYTHONPATH.
        shutil.copytree(os.path.dirname(shellseam.__file__), home / "site" / "shellseam")
        for path in (home, ws):
            os.chown(path, uid, uid)
        _ambient_case(home, ws, uid)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(ws, ignore_errors=True)


def _ambient_case(home: pathlib.Path, ws: pathlib.Path, uid: int) -> None:
    script = textwrap.dedent(
        f"""
        import shellseam
        from shellseam import LocalShellExecutor, SandboxShellExecutor, ShellExecRequest
        assert shellseam.__file__.startswith({str(home)!r}), shellseam.__file__
        q = "grep CapAmb /proc/self/status"
        for ex in (
            LocalShellExecutor(cwd={str(ws)!r}),
            SandboxShellExecutor(mode="workspace-write", cwd={str(ws)!r}),
        ):
            print(ex.run_sync(ex.resolve(ShellExecRequest(command=q))).stdout.text, end="")
        """
    )
    ids = ["--reuid", str(uid), "--regid", str(uid), "--clear-groups"] if uid else []
    got = subprocess.run(
        ["setpriv", *ids, "--inh-caps", "+net_raw", "--ambient-caps", "+net_raw", PY, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / "cache"),
            "PYTHONPATH": str(home / "site"),
        },
        cwd=str(home),
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout == "CapAmb:\t0000000000002000\nCapAmb:\t0000000000000000\n"


@needs_root
@pytest.mark.parametrize(
    "op", ["chmod 777", "chown 1:1", "touch -d 2001-01-01", "setfattr", "chattr"]
)
def test_5_read_only_refuses_metadata_writes(
    box: dict[str, str], svc: SubprocessService, op: str
) -> None:
    f = box["file"]
    before = os.stat(f)
    ex = sandbox(box, svc, "read-only")
    cmd = {
        "setfattr": py(f"import os; os.setxattr({f!r}, 'user.x', b'1')"),
        "chattr": py(f"""
            import fcntl, os, struct
            fd = os.open({f!r}, os.O_RDONLY)
            fcntl.ioctl(fd, 0x40086602, struct.pack('l', 0x4000))  # FS_IOC_SETFLAGS
        """),
    }.get(op, f"{op} {f}")
    r = run(ex, cmd)
    assert r.exit_code != 0, r
    after = os.stat(f)
    assert (after.st_mode, after.st_uid, after.st_gid, after.st_mtime_ns) == (
        before.st_mode,
        before.st_uid,
        before.st_gid,
        before.st_mtime_ns,
    )
    assert r.sandbox is not None and r.sandbox.denied


@needs_root
def test_5_hostname_and_rtnetlink_refused(box: dict[str, str], svc: SubprocessService) -> None:
    ex = sandbox(box, svc)
    name = socket.gethostname()
    r = run(ex, "hostname pwned")
    assert r.exit_code != 0 and socket.gethostname() == name
    mtu = _read("/sys/class/net/lo/mtu")
    r = run(ex, "ip link set lo mtu 1280")
    assert r.exit_code != 0
    assert _read("/sys/class/net/lo/mtu") == mtu


@needs_root
@pytest.mark.parametrize("network", [True, False])
def test_5_no_packet_or_raw_sockets(
    box: dict[str, str], svc: SubprocessService, network: bool
) -> None:
    ex = sandbox(box, svc, "read-only")
    for family, kind in (("AF_PACKET", "SOCK_RAW"), ("AF_INET", "SOCK_RAW")):
        r = run(
            ex,
            py(f"import socket; socket.socket(socket.{family}, socket.{kind}, 3)"),
            sandbox_policy=policy(box, "read-only", network=network),
        )
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr.text, (family, r)


# -- 6. the harness's environment --------------------------------------------------------

_HARNESS = """
import os, sys
from shellseam import *
os.environ["SHELLSEAM_PROBE_SECRET_KEY"] = "s3cr3t"
mode, protect = sys.argv[1], sys.argv[2] == "1"
if mode == "local":
    ex = LocalShellExecutor(cwd="/")
else:
    ex = SandboxShellExecutor(mode=mode, cwd="/tmp", protect_harness=protect)
r = ex.run_sync(ex.resolve(ShellExecRequest(
    command="tr '\\\\0' '\\\\n' < /proc/$PPID/environ | grep -c PROBE_SECRET; "
            "cat /proc/$PPID/maps > /dev/null && echo maps-readable")))
print(r.exit_code, repr(r.stdout.text), repr(r.stderr.text))
"""


def _harness(mode: str, protect: bool) -> str:
    out = subprocess.run(
        [PY, "-c", _HARNESS, mode, "1" if protect else "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_6_confined_command_cannot_read_the_harness_environ(mode: str) -> None:
    out = _harness(mode, True)
    assert "Permission denied" in out and "s3cr3t" not in out and "maps-readable" not in out


def test_6_unprotected_harness_stays_readable_unconfined() -> None:
    assert "maps-readable" in _harness("danger-full-access", False)
    assert "maps-readable" in _harness("local", False)
    # Even unprotected, a confined command is outside the harness's ptrace domain.
    assert "maps-readable" not in _harness("read-only", False)


# -- 7. spill directory --------------------------------------------------------------------


def test_7_spill_dir_inside_a_writable_root_is_refused(box: dict[str, str]) -> None:
    spill_parent = tempfile.mkdtemp(prefix="shellseam-spill-", dir="/tmp")
    service = SubprocessService(spill_parent=spill_parent)
    try:
        ex = sandbox(box, service)
        with pytest.raises(ShellError) as info:
            run(ex, "true")
        assert info.value.code == "SANDBOX_UNAVAILABLE"
        # The directory is made at the check, so the message names it exactly.
        assert service.spill_dir is not None
        assert os.path.dirname(service.spill_dir) == spill_parent
        assert info.value.reason == (
            f"spill directory {service.spill_dir} lies inside writable root /tmp"
        )
        # read-only writes nowhere: allowed.
        assert run(sandbox(box, service, "read-only"), "true").exit_code == 0
    finally:
        service.dispose()
        shutil.rmtree(spill_parent, ignore_errors=True)


def test_7_confined_command_cannot_touch_the_spill_dir(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc, max_output_bytes=10)
    r = run(ex, "seq 1 100")
    path = r.stdout.spill_path
    assert path is not None and _read(path) == "".join(f"{i}\n" for i in range(1, 101))
    d = os.path.dirname(path)
    for cmd in (
        f"mv {d} {d}.x",
        f"ln -s / {d}/link",
        f"echo x > {d}/new",
        f"rm {path}",
        f"echo x >> {path}",
        f"mv {path} {box['ws']}/",
    ):
        assert run(ex, cmd).exit_code != 0, cmd
    assert run(ex, f"cat {path} | wc -l").stdout.text == "100\n"  # reading stays allowed
    names = os.listdir(d)  # the denials' stderr spilled too (max_output_bytes=10)
    assert os.path.basename(path) in names and not {"new", "link"} & set(names)
    assert all(n.startswith(("stdout-", "stderr-")) for n in names)


# Attack: Landlock has no right for chmod, so a workspace-write command (the harness's uid)
# opened the spill directory to every local user, who could then replace what the model
# reads. The service puts it back to 0700 as the call finishes.
def test_7_a_chmodded_spill_dir_is_private_again_when_the_call_ends(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc, max_output_bytes=10)
    path = run(ex, "seq 1 100").stdout.spill_path
    assert path is not None
    d = os.path.dirname(path)
    r = run(ex, f"chmod 0777 {d} && stat -c %a {d}")
    assert r.stdout.text.startswith("777"), r.stderr.text  # the command did change it
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_7_a_swapped_spill_dir_never_redirects_later_spill_files(
    box: dict[str, str], svc: SubprocessService
) -> None:
    """Whoever renames the spill directory and plants a symlink in its place (here the
    harness itself, as a confined command cannot) redirects nothing: files are created
    relative to the directory fd the service holds."""
    ex = LocalShellExecutor(cwd=box["ws"], service=svc, max_output_bytes=10)
    first = run(ex, "seq 1 100").stdout.spill_path
    assert first is not None
    d = os.path.dirname(first)
    os.rename(d, d + ".moved")
    os.symlink(box["protected"], d)
    second = run(ex, "seq 1 100").stdout.spill_path
    assert second is not None and os.path.dirname(second) == d
    assert os.listdir(box["protected"]) == ["file"]
    assert os.path.exists(os.path.join(d + ".moved", os.path.basename(second)))
    os.unlink(d)
    os.rename(d + ".moved", d)


# -- 8. UDP and TCP with network=False -------------------------------------------------


@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_8_no_datagram_or_stream_reaches_loopback(
    box: dict[str, str], svc: SubprocessService, proto: str
) -> None:
    kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        if proto == "tcp":
            s.listen(1)
        s.settimeout(0.3)
        port = s.getsockname()[1]
        ex = sandbox(box, svc)
        closed = policy(box, network=False)
        r = run(ex, f"echo leak > /dev/{proto}/127.0.0.1/{port}", sandbox_policy=closed)
        assert r.exit_code != 0 and r.sandbox is not None and r.sandbox.denied
        r = run(
            ex,
            py(f"""
            import socket
            s = socket.socket(socket.AF_INET6 if False else socket.AF_INET, socket.{kind.name})
            s.connect(("127.0.0.1", {port})); s.send(b"leak")
        """),
            sandbox_policy=closed,
        )
        assert r.exit_code != 0
        with pytest.raises(TimeoutError):
            s.recv(10) if proto == "udp" else s.accept()


# -- 10. configuration traps ---------------------------------------------------------------


def test_10_scrub_patterns_as_a_str_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="scrub_patterns"):
        LocalShellExecutor(scrub_patterns="OPENAI_API_KEY")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="allow_env"):
        LocalShellExecutor(allow_env="HOME")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scrub_patterns"):
        SandboxShellExecutor(scrub_patterns=[1])  # type: ignore[list-item]


def test_10_default_patterns_and_the_url_rule(
    svc: SubprocessService, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaked = {
        "MYSQL_PWD": "a",
        "PGPASSWORD": "b",
        "TWINE_PASSWORD": "c",
        "GH_PAT": "d",
        "AWS_CREDENTIALS_FILE": "e",
        "LDAP_PASSWD": "f",
        "DATABASE_URL": "postgres://u:p@h/db",
        "PIP_INDEX_URL": "https://user:tok@pypi.example/simple",
    }
    kept = {
        "TOKENIZERS_PARALLELISM": "false",
        "KEYBOARD_LAYOUT": "us",
        "PYTHON_KEYRING_BACKEND": "x",
        "PLAIN_URL": "https://example.org/a",
        "SSH_URL": "ssh://git@github.com/x",
    }
    for k, v in {**leaked, **kept}.items():
        monkeypatch.setenv(k, v)
    ex = LocalShellExecutor(service=svc)
    env = dict(kv.split("=", 1) for kv in run(ex, "env").stdout.text.splitlines() if "=" in kv)
    assert not set(leaked) & set(env)
    assert {k: env.get(k) for k in kept} == kept


# -- 11. spill total ------------------------------------------------------------------------


def test_11_spill_files_share_a_total_budget(box: dict[str, str]) -> None:
    service = SubprocessService(spill_parent=box["spill"], max_spill_total_bytes=300_000)
    try:
        ex = LocalShellExecutor(cwd=box["ws"], service=service, max_output_bytes=1000)
        first = run(ex, "head -c 200000 /dev/zero")
        assert first.stdout.spill_truncated is False
        second = run(ex, "head -c 200000 /dev/zero")
        assert second.stdout.spill_truncated is True
        assert second.stdout.total_bytes == 200_000
        assert os.path.getsize(second.stdout.spill_path or "") == 100_000
        third = run(ex, "head -c 5000 /dev/zero")
        assert third.stdout.spill_truncated is True
        assert os.path.getsize(third.stdout.spill_path or "") == 0
        from shellseam import render_result

        assert f"[output truncated; first 0 bytes saved: {third.stdout.spill_path}]" in (
            render_result(third)
        )
    finally:
        service.dispose()


def test_11_spill_total_is_validated() -> None:
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="max_spill_total_bytes"):
            SubprocessService(max_spill_total_bytes=bad)
    with pytest.raises(TypeError, match="max_spill_total_bytes"):
        SubprocessService(max_spill_total_bytes=1.5)  # type: ignore[arg-type]


# -- 12. fork while stdin is written ---------------------------------------------------------


def test_12_forked_child_does_not_hold_the_stdin_pipe(svc: SubprocessService) -> None:
    ex = LocalShellExecutor(service=svc)
    proc = ex.start(
        ex.resolve(ShellExecRequest(command="sleep 0.3; wc -c", stdin=b"x" * (4 * 2**20)))
    )
    pid = os.fork()
    if pid == 0:
        time.sleep(8)
        os._exit(0)
    try:
        assert proc.wait_sync(6), "the command waited for the forked child to close stdin"
        assert proc.read_output().delta == f"{4 * 2**20}\n"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


# -- long commands -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [200 * 1024, 16 * 2**20 - 200])
@pytest.mark.parametrize("confined", [False, True])
def test_long_commands_run_like_short_ones(
    box: dict[str, str], svc: SubprocessService, size: int, confined: bool
) -> None:
    ex: LocalShellExecutor = (
        sandbox(box, svc, "read-only")
        if confined
        else LocalShellExecutor(cwd=box["ws"], service=svc)
    )
    head = 'echo "$0:$LINENO"; f() { echo "in f:$LINENO"; }; f\n'
    tail = 'echo "end:$LINENO"; set -e; false; echo unreachable\n'
    filler_lines = (size - len(head) - len(tail)) // 8
    body = head + ": xxxxx\n" * filler_lines + tail
    long = run(ex, body)
    short = run(ex, head + ": xxxxx\n" * 3 + tail)
    assert long.exit_code == short.exit_code == 1
    assert (
        long.stdout.text.split("\n")[:2]
        == short.stdout.text.split("\n")[:2]
        == ["bash:1", "in f:1"]
    )
    assert long.stdout.text.split("\n")[2] == f"end:{filler_lines + 2}"
    assert long.stderr.text == short.stderr.text == ""


def test_command_over_16_mib_is_invalid(svc: SubprocessService) -> None:
    ex = LocalShellExecutor(service=svc)
    with pytest.raises(ShellError) as info:
        ex.resolve(ShellExecRequest(command="#" * (16 * 2**20 + 1)))
    assert info.value.code == "INVALID_REQUEST"


def test_long_command_errors_read_like_bash_c(svc: SubprocessService) -> None:
    ex = LocalShellExecutor(service=svc)
    pad = "#" * (200 * 1024) + "\n"
    long = run(ex, "nosuchcommand-xyz\n" + pad)
    short = run(ex, "nosuchcommand-xyz\n")
    assert (
        long.stderr.text
        == short.stderr.text
        == ("bash: line 1: nosuchcommand-xyz: command not found\n")
    )
    assert long.exit_code == 127
    # The script's fd is not inherited by the command.
    r = run(ex, "ls /proc/self/fd | sort -n | tr '\\n' ' '\n" + pad)
    assert r.stdout.text == "0 1 2 3 "  # 3 is ls's own directory fd


# -- 9. process-group id reuse ---------------------------------------------------------------

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


@needs_root
@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason="cannot steer pid allocation")
def test_9_a_reused_group_id_is_never_signalled(svc: SubprocessService) -> None:
    """The shell exits while an escaped process (another session) holds its pipes: its group
    is empty during the drain. Steering the next pid onto the group's id must not work (the
    leader stays unreaped) — and if it did, the end of the drain would SIGTERM a stranger."""
    ex = LocalShellExecutor(service=svc, grace_ms=1500)
    proc = ex.start(ex.resolve(ShellExecRequest(command="setsid sleep 30 & echo $! $$")))
    out = ""
    deadline = time.monotonic() + 5
    while out.count(" ") < 1 or not out.endswith("\n"):
        out += proc.read_output().delta
        assert time.monotonic() < deadline
        time.sleep(0.01)
    escapee, leader = (int(x) for x in out.split())
    victims: list[subprocess.Popen[bytes]] = []
    try:
        time.sleep(0.2)  # the shell has exited; the escapee keeps the pipes open
        for _ in range(20):
            with open(NS_LAST_PID, "w") as f:
                f.write(str(leader - 1))
            v = subprocess.Popen(["sleep", "30"], start_new_session=True)
            victims.append(v)
            assert v.pid != leader, "the group id of a running call was handed out again"
        assert proc.wait_sync(10)
        assert all(v.poll() is None for v in victims), "a stranger was signalled"
        assert proc.exit_code == 0
    finally:
        for v in victims:
            v.kill()
            v.wait()
        os.kill(escapee, 9)


_LOW_FDS_HARNESS = """
import os, sys
os.close(0)
from shellseam import *
for mode in ("read-only", "workspace-write"):
    ex = SandboxShellExecutor(mode=mode, cwd="/var/tmp")
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="echo ok-$LINENO\\n" + "#" * 200_000)))
    print(mode, r.exit_code, r.stdout.text.strip(), repr(r.stderr.text))
"""


def test_long_commands_with_the_harness_stdin_closed() -> None:
    """Pipe, report and ruleset fds get low numbers when the harness closed its stdin; none
    of them may be the fd the child puts the script on."""
    out = subprocess.run(
        [PY, "-c", _LOW_FDS_HARNESS], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.stdout.splitlines() == ["read-only 0 ok-1 ''", "workspace-write 0 ok-1 ''"], (
        out.stderr
    )


def test_1_the_cli_sees_the_symlink_its_shell_entered(box: dict[str, str]) -> None:
    # `cd /tmp/x && shellseam run --sandbox workspace-write ...` after a command of an
    # earlier run swapped /tmp/x for a symlink: the shell's $PWD names the symlink, and the
    # CLI judges the root by it (os.getcwd() would only show where it leads).
    link = os.path.join(box["ws_parent"], "x")
    os.symlink(box["protected"], link)
    # The CLI keeps its spill folder: under the box, not the user's cache.
    cache = os.path.join(box["base"], "cache")
    env = {**os.environ, "PWD": link, "XDG_CACHE_HOME": cache}
    p = subprocess.run(
        [PY, "-m", "shellseam.cli", "run", "--sandbox", "workspace-write", "--",
         f"echo pwned > {box['protected']}/new"],
        cwd=link, env=env, capture_output=True, text=True, timeout=60, input="",
    )  # fmt: skip
    assert p.returncode != 0
    assert "leads through" in p.stderr and p.stderr.count("\n") == 1
    assert os.listdir(box["protected"]) == ["file"]
    # The same directory entered by its real path is an ordinary workspace.
    ok = subprocess.run(
        [PY, "-m", "shellseam.cli", "run", "--sandbox", "workspace-write", "--", "pwd"],
        cwd=box["ws"], env={**os.environ, "PWD": box["ws"], "XDG_CACHE_HOME": cache},
        capture_output=True, text=True, timeout=60, input="",
    )  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.startswith(box["ws"] + "\n")


@needs_root
def test_1_kernel_filesystems_are_never_writable_roots(
    box: dict[str, str], svc: SubprocessService
) -> None:
    # Found by attacking: a harness that granted the cgroup hierarchy as a writable root let a
    # root-uid command move itself out of its call's cgroup (`echo $$ > .../cgroup.procs`),
    # capabilities dropped or not: uid 0 owns those files.
    ex = sandbox(box, svc)
    roots = [
        r for r in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/proc", "/sys") if os.path.isdir(r)
    ]
    for root in roots:
        with pytest.raises(ShellError) as info:
            run(ex, "echo $$ > cgroup.procs", sandbox_policy=policy(box, writable_roots=(root,)))
        assert info.value.code == "SANDBOX_UNAVAILABLE"
        assert info.value.reason.startswith(f"writable root {root} reaches the kernel's ")
