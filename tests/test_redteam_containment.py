"""Red team: a command that tries to outlive its call, reach another call, or widen a later one.

Every test makes the attack as a hostile model's command would and asserts the secure
outcome; the one that still succeeds is a strict xfail naming the hole. Every process a
test could leave behind is killed in `finally`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from conftest import first_line, process_alive, run
from shellseam import (
    LocalShellExecutor,
    ResourceLimits,
    SandboxShellExecutor,
    ShellExecRequest,
    SubprocessService,
    landlock_abi,
)

ROOT = os.geteuid() == 0
PY = sys.executable
needs_root = pytest.mark.skipif(not ROOT, reason="the attack needs a root harness")
needs_landlock = pytest.mark.skipif(landlock_abi() < 6, reason="needs Landlock signal scoping")
V2 = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"


@pytest.fixture
def box() -> Iterator[dict[str, str]]:
    ws = tempfile.mkdtemp(prefix="shellseam-rt-", dir="/tmp")
    base = tempfile.mkdtemp(prefix="shellseam-rt-", dir="/var/tmp")
    try:
        yield {"ws": ws, "spill": os.path.join(base, "spill"), "base": base}
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def svc(box: dict[str, str]) -> Iterator[SubprocessService]:
    service = SubprocessService(spill_parent=box["spill"])
    try:
        yield service
    finally:
        service.dispose()


def sandbox(box: dict[str, str], svc: SubprocessService, **config: object) -> SandboxShellExecutor:
    return SandboxShellExecutor(cwd=box["ws"], grace_ms=300, service=svc, **config)  # type: ignore[arg-type]


def read_pid(path: str, within_s: float = 5.0) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                text = f.read()
            if text.endswith("\n"):
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def kill_quietly(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _escape_to_root_cgroup(marker: str) -> str:
    """Leave the session and move into the root of every cgroup hierarchy, then linger."""
    moves = f"for f in {V2}/cgroup.procs /sys/fs/cgroup/*/cgroup.procs; do echo $$ > $f; done"
    return (
        f"setsid -f sh -c '{moves} 2>/dev/null; echo $$ > {marker}.tmp; "
        f"mv {marker}.tmp {marker}; exec sleep 30'; sleep 0.3"
    )


# Attack: an unconfined root command (LocalShellExecutor, or danger-full-access) writes its pid
# into the root cgroup's cgroup.procs (v2 and v1) and leaves the session: neither cgroup.kill
# nor the session kill finds it, and it outlives the call. CLONE_NEWCGROUP does not stop it
# here (the unified hierarchy is not mounted with nsdelegate), and a root command could setns
# back anyway: containment of a hostile *root, unconfined* command needs confinement.
@needs_root
@pytest.mark.xfail(
    strict=True,
    reason="open: an unconfined root command escapes its call's cgroup by writing the root "
    "cgroup.procs (v2 and v1) and survives the call",
)
def test_unconfined_root_command_cannot_leave_its_cgroup(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = LocalShellExecutor(cwd=box["ws"], grace_ms=300, service=svc)
    marker = os.path.join(box["ws"], "escaped")
    pid = None
    try:
        run(ex, _escape_to_root_cgroup(marker))
        pid = read_pid(marker)
        time.sleep(0.2)
        assert not process_alive(pid), "the escaped process outlived its call"
    finally:
        kill_quietly(pid)


# The same attack from a confined command: Landlock refuses every write under /sys, so the
# process stays in its call's cgroup and dies with it.
@needs_root
@needs_landlock
@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
def test_confined_command_cannot_leave_its_cgroup(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    ex = sandbox(box, svc, mode=mode)
    # read-only cannot write a marker in the workspace: it reports through stdout instead.
    cmd = (
        f"setsid -f sh -c 'echo $$ > {V2}/cgroup.procs || echo refused; "
        f"echo $$ > /sys/fs/cgroup/pids/cgroup.procs || echo refused; echo pid=$$; exec sleep 30'"
        "; sleep 0.3"
    )
    r = run(ex, cmd)
    out = r.stdout.text
    pid = int(out.split("pid=")[1].split()[0])
    try:
        assert out.count("refused") == 2, out
        assert r.leftover_killed == 1
        assert not process_alive(pid)
    finally:
        kill_quietly(pid)


@needs_root
@needs_landlock
def test_confined_call_cannot_reach_a_sibling_calls_processes(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc)
    victim = ex.start(ex.resolve(ShellExecRequest(command="echo $$ > victim; exec sleep 30")))
    try:
        pid = read_pid(os.path.join(box["ws"], "victim"))
        with open(f"/proc/{pid}/cgroup") as f:
            v2 = next(line[3:].strip() for line in f if line.startswith("0::"))
        assert v2 != "/"
        attack = (
            f"kill -9 -{pid} || echo refused; kill -9 {pid} || echo refused; "
            f"echo 1 > {V2}{v2}/cgroup.kill || echo refused; "
            f"echo 1 > {V2}{v2}/cgroup.freeze || echo refused; "
            f"echo $$ > {V2}{v2}/cgroup.procs || echo refused; "
            f"echo 1 > {V2}{os.path.dirname(v2)}/cgroup.kill || echo refused"
        )
        r = run(ex, attack)
        assert r.stdout.text == "refused\n" * 6
        time.sleep(0.1)
        assert process_alive(pid)
        assert victim.status == "running"
    finally:
        victim.kill()
        victim.wait_sync(10)


@needs_root
@needs_landlock
def test_confined_command_cannot_touch_the_keeper(
    box: dict[str, str], svc: SubprocessService
) -> None:
    os.environ["SHELLSEAM_RT_SECRET_TOKEN"] = "hunter2-keeper"
    try:
        ex = sandbox(box, svc)
        run(ex, "true")
        keeper = svc.keeper_pid
        assert keeper is not None
        attack = (
            f"cat /proc/{keeper}/environ; readlink /proc/{keeper}/fd/0; "
            f"cat /proc/{keeper}/maps; kill -STOP {keeper} || echo refused; "
            f"kill -9 {keeper} || echo refused"
        )
        r = run(ex, attack)
        assert "hunter2" not in r.stdout.text + r.stderr.text
        assert r.stdout.text == "refused\nrefused\n"
        with open(f"/proc/{keeper}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] in "SR"  # alive, not stopped
    finally:
        del os.environ["SHELLSEAM_RT_SECRET_TOKEN"]


# Attack (red team, stop 32): an unconfined command runs as the harness's user, so it can
# kill the keeper (a process of that user), then anything it leaves behind outlives a harness
# that dies afterwards. The sandbox refuses the kill (above); unconfined, it is open.
@pytest.mark.xfail(
    strict=True,
    reason="open: an unconfined command can kill the keeper, and its processes then outlive "
    "a harness that dies after it",
    raises=AssertionError,
)
def test_unconfined_command_cannot_kill_the_keeper(box: dict[str, str]) -> None:
    marker = os.path.join(box["ws"], "left")
    command = (
        "kill -9 $KEEPER; setsid -f sh -c 'echo $$ > left; exec sleep 60'; "
        "echo $$ > left.shell; sleep 60"
    )
    script = os.path.join(box["base"], "harness.py")
    with open(script, "w") as f:
        f.write(
            "import sys\n"
            "from shellseam import LocalShellExecutor, ShellExecRequest\n"
            "ex = LocalShellExecutor(cwd=sys.argv[1])\n"
            "ex.run_sync(ex.resolve(ShellExecRequest(command='true')))\n"
            "env = {'KEEPER': str(ex.service.keeper_pid)}\n"
            "ex.run_sync(ex.resolve(ShellExecRequest(command=sys.argv[2], env=env)))\n"
        )
    harness = subprocess.Popen([PY, script, box["ws"], command])
    pid = shell = None
    try:
        pid = read_pid(marker, within_s=20)
        shell = read_pid(f"{marker}.shell")
        harness.kill()
        harness.wait()
        time.sleep(1.5)  # the keeper's "about a second"
        assert not process_alive(pid), "a process outlived its harness"
    finally:
        kill_quietly(pid)
        if shell is not None:  # the call's own group (its shell and sleep) outlived it too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell, signal.SIGKILL)
        if harness.poll() is None:
            harness.kill()
            harness.wait()


# Attack (red team, stop 32): the call's cgroup files belong to the harness's user, so an
# unconfined command of that user raises its own limits (`echo max > pids.max`).
@needs_root
@pytest.mark.xfail(
    strict=True,
    reason="open: an unconfined command can raise its own call cgroup's limits",
    raises=AssertionError,
)
def test_unconfined_command_cannot_raise_its_own_limits(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = LocalShellExecutor(
        cwd=box["ws"], grace_ms=300, service=svc, limits=ResourceLimits(max_processes=10)
    )
    # Its own cgroup's pids.max only: v1 pids where the host has it, else the v2 cgroup.
    own = (
        "p=$(sed -n 's/^[0-9]*:pids://p' /proc/self/cgroup); "
        'if [ -n "$p" ]; then f=/sys/fs/cgroup/pids$p/pids.max; '
        f"else f={V2}$(sed -n 's/^0:://p' /proc/self/cgroup)/pids.max; fi; "
    )
    r = run(ex, own + 'echo max > "$f"; for i in $(seq 30); do sleep 2 & done; wait')
    assert r.resources is not None
    assert r.resources.limit_exceeded == "processes"


# Attack (red team, stop 17): Landlock has no hook for prlimit64, so a confined command set
# the harness's RLIMIT_CPU to 1 s (the harness was killed a second later), the keeper's
# RLIMIT_NOFILE to 0 (it could no longer kill a dead harness's commands) and a sibling's.
@needs_landlock
@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_confined_command_cannot_change_another_process_limits(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    ex = sandbox(box, svc, mode=mode)
    run(ex, "true")
    keeper = svc.keeper_pid
    before = [resource.prlimit(pid, resource.RLIMIT_CPU) for pid in (os.getpid(), keeper)]
    victim = subprocess.Popen(["sleep", "30"])
    try:
        # Harmless values for the harness and the keeper (a test that fails must not kill the
        # test run): a CPU limit of ~28 h; the victim gets a crippling one.
        r = run(
            ex,
            f"for pid in $PPID {keeper}; do prlimit --pid $pid --cpu=99999:99999 2>/dev/null "
            f"&& echo changed $pid; done; prlimit --pid {victim.pid} --nofile=3:3 2>/dev/null "
            f"&& echo changed {victim.pid}; "
            "ulimit -S -n 64 && ulimit -S -n",  # the command's own limits still work
        )
        assert r.stdout.text == "64\n", r.stdout.text + r.stderr.text
        after = [resource.prlimit(pid, resource.RLIMIT_CPU) for pid in (os.getpid(), keeper)]
        assert after == before
        assert resource.prlimit(victim.pid, resource.RLIMIT_NOFILE)[0] != 3
    finally:
        for pid, limit in zip((os.getpid(), keeper), before, strict=True):
            with contextlib.suppress(OSError):
                resource.prlimit(pid, resource.RLIMIT_CPU, limit)
        victim.kill()
        victim.wait()


# Attack (red team, stop 17): no Landlock hook covers scheduling either: a read-only command
# reniced a sibling call to 19, made it SCHED_IDLE, pinned it to one CPU and idled its I/O
# (and, under an unprivileged harness, the harness itself and every process of its user).
@needs_landlock
def test_confined_command_cannot_reschedule_another_process(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc, mode="read-only")
    sibling = ex.start(ex.resolve(ShellExecRequest(command="echo $$; exec sleep 30")))
    try:
        victim = int(first_line(sibling, within_s=5))
        affinity = os.sched_getaffinity(victim)
        niceness = os.getpriority(os.PRIO_PROCESS, victim)  # the test run's own (CI may nice)
        # (PRIO_USER, every process of the user, is refused too: seccomp.rs tests it; trying
        # it here would renice the whole user for good if it ever got through.)
        r = run(
            ex,
            f"renice -n 19 -p {victim}; chrt -i -p 0 {victim}; taskset -p 1 {victim}; "
            f"ionice -c3 -p {victim}; "
            # What a command starts itself (pid 0) still works.
            "nice -n 5 nice; taskset -c 0 true && ionice -c3 true && chrt -i 0 true && echo own",
        )
        expected = str(min(niceness + 5, 19))
        assert r.stdout.text.splitlines()[-2:] == [expected, "own"], r.stdout.text + r.stderr.text
        assert os.getpriority(os.PRIO_PROCESS, victim) == niceness
        assert os.sched_getscheduler(victim) == os.SCHED_OTHER
        assert os.sched_getaffinity(victim) == affinity
    finally:
        sibling.kill()
        assert sibling.wait_sync(10)


# Attack (red team, stop 17): the IPC namespace is the host's. A read-only command wrote into
# the harness's System V shared memory, took its queued message, removed its semaphore, and
# left segments that outlived the call and its memory limit.
@needs_landlock
def test_confined_command_has_no_ipc(box: dict[str, str], svc: SubprocessService) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shm = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    assert shm >= 0
    addr = libc.shmat(shm, None, 0)
    try:
        ctypes.memmove(addr, b"harness-secret\0", 15)
        for mode in ("read-only", "workspace-write"):
            ex = sandbox(box, svc, mode=mode)
            r = run(
                ex,
                f"ipcrm -m {shm}; "
                + PY
                + " -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                f"print(l.shmat({shm}, None, 0), l.shmget(0, 4096, 0o1600), "
                "l.semget(0, 1, 0o1600), l.msgget(0, 0o1600), ctypes.get_errno())'",
            )
            made = r.stdout.text.split()[1:4]
            # What a regressed filter would have let the command make: removed whatever.
            for flag, ident in zip(("-m", "-s", "-q"), made, strict=False):
                if ident.isdigit():
                    subprocess.run(["ipcrm", flag, ident], check=False)
            assert r.stdout.text == "-1 -1 -1 -1 1\n", r.stdout.text + r.stderr.text
            assert ctypes.string_at(addr, 15) == b"harness-secret\0"
    finally:
        libc.shmdt(ctypes.c_void_p(addr))
        libc.shmctl(shm, 0, None)  # IPC_RMID


# Attack: a workspace-write call plants a poisoned pip/npm/XDG cache; an escalated
# danger-full-access call (approved by the user) must not pick it up.
def test_the_sandbox_cache_never_reaches_an_unconfined_call(
    box: dict[str, str], svc: SubprocessService
) -> None:
    if landlock_abi() < 1:
        pytest.skip("kernel has no Landlock")
    confined = sandbox(box, svc)
    planted = run(confined, "echo $XDG_CACHE_HOME; touch $PIP_CACHE_DIR/poison")
    cache = planted.stdout.text.strip()
    assert cache and os.path.exists(os.path.join(cache, "poison"))
    danger = sandbox(box, svc, mode="danger-full-access")
    names = "XDG_CACHE_HOME PIP_CACHE_DIR npm_config_cache"
    r = run(danger, f"for n in {names}; do printenv $n; done; echo end")
    assert cache not in r.stdout.text
    local = LocalShellExecutor(cwd=box["ws"], grace_ms=300, service=svc)
    assert cache not in run(local, f"for n in {names}; do printenv $n; done").stdout.text


# Attack: reach the harness's own descriptors (an MCP server's JSON-RPC stdout: forge a reply
# to the client; its stdin: steal the client's next request) through /proc/<pid>/fd.
@needs_landlock
def test_confined_command_cannot_open_the_harness_fds(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc)
    me = os.getpid()
    r = run(
        ex,
        f"for n in 0 1 2; do echo forged > /proc/{me}/fd/$n || echo refused; done; "
        f"head -c 1 /proc/{me}/fd/0 || echo refused",
    )
    assert r.stdout.text == "refused\n" * 4


# Attack: a workdir that is a symlink (planted by an earlier call) to a directory outside the
# workspace; `..` climbing out. The working directory never widens what may be written.
def test_a_symlinked_or_climbing_workdir_grants_no_writes(
    box: dict[str, str], svc: SubprocessService
) -> None:
    if landlock_abi() < 1:
        pytest.skip("kernel has no Landlock")
    outside = os.path.join(box["base"], "outside")
    os.mkdir(outside)
    ex = sandbox(box, svc)
    assert run(ex, f"ln -s {outside} link").exit_code == 0
    for workdir in (os.path.join(box["ws"], "link"), os.path.join(box["ws"], "..", "..", outside)):
        r = run(ex, "echo pwned > file; pwd -P", workdir=workdir)
        assert r.exit_code == 0 and r.stdout.text == f"{outside}\n"
        assert "Permission denied" in r.stderr.text
    assert os.listdir(outside) == []


# Attack: the same move defeats a memory limit: an unconfined root command joins the root
# v1 memory cgroup (and the root v2 cgroup) and allocates past `memory_bytes`.
@needs_root
@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/memory"), reason="needs v1 memory")
@pytest.mark.xfail(
    strict=True,
    reason="open: an unconfined root command leaves its memory cgroup and escapes memory_bytes",
)
def test_unconfined_root_command_cannot_escape_its_memory_limit(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = LocalShellExecutor(
        cwd=box["ws"], grace_ms=300, service=svc, limits=ResourceLimits(memory_bytes=64 * 2**20)
    )
    grow = f"{sys.executable} -c 'b = bytearray(160 * 2**20); print(len(b))'"
    r = run(
        ex,
        f"echo $$ > /sys/fs/cgroup/memory/cgroup.procs; echo $$ > {V2}/cgroup.procs; {grow}",
    )
    assert r.resources is not None
    assert r.resources.limit_exceeded == "memory"
    assert r.stdout.text == ""


def _marked(token: str) -> list[int]:
    """Live processes whose environment carries `token` (the test's own marker)."""
    found = []
    needle = f"RT_MARK={token}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and process_alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


# Attack: the classic fork bomb. Under a process limit the call still ends (at its timeout),
# reports the limit, and leaves nothing behind.
@pytest.mark.parametrize("confined", [False, True])
def test_a_fork_bomb_ends_with_its_call(
    box: dict[str, str], svc: SubprocessService, confined: bool
) -> None:
    if confined and landlock_abi() < 1:
        pytest.skip("kernel has no Landlock")
    limits = ResourceLimits(max_processes=64)
    ex = (
        sandbox(box, svc, limits=limits)
        if confined
        else LocalShellExecutor(cwd=box["ws"], grace_ms=300, service=svc, limits=limits)
    )
    token = os.urandom(8).hex()
    try:
        r = run(ex, "bomb() { bomb | bomb & }; bomb; wait", timeout_ms=3000, env={"RT_MARK": token})
        assert r.timed_out or r.exit_code is not None
        assert r.resources is not None
        if r.resources.enforcement == "tree":
            assert r.resources.limit_exceeded == "processes"
        assert _marked(token) == []
    finally:
        for pid in _marked(token):
            kill_quietly(pid)
