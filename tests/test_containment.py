"""No process a call starts outlives it (SPEC §3 Containment): every escaper form is gone
after return, timeout, abort, cancel, kill() and dispose(), and counted in leftover_killed.

Attack first: each escaper here survived its call with leftover_killed=0 before cgroup
containment (issue 10). Survivors are found by a random marker in their environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from containment_helpers import (
    CLONE_MACHINES,
    CLONE_PARENT,
    ESCAPERS,
    PY,
    cloned,
    kill_and_reap,
    kill_marked,
    marked_env,
    new_cgroup_dirs,
    new_token,
    own_cgroup_dirs,
    survivors,
    wait_gone,
)

from conftest import proc_stats, run
from shellseam import (
    AbortController,
    LocalShellExecutor,
    ResourceLimits,
    SandboxShellExecutor,
    ShellExecRequest,
    SubprocessService,
    containment_facts,
    landlock_abi,
)

HAS_CGROUP = containment_facts()["containment"] == "cgroup"
needs_cgroup = pytest.mark.skipif(not HAS_CGROUP, reason="no writable cgroup v2 hierarchy")
FORMS = list(ESCAPERS)


@pytest.fixture(autouse=True, scope="module")
def nothing_left_behind() -> Iterator[None]:
    before = own_cgroup_dirs()
    yield
    left = new_cgroup_dirs(before)
    kill_marked()
    assert left == [], f"cgroup directories left behind: {left}"


@pytest.fixture
def svc() -> Iterator[SubprocessService]:
    service = SubprocessService()
    try:
        yield service
    finally:
        service.dispose()
        kill_marked()


@pytest.fixture
def ex(svc: SubprocessService, tmp_path: os.PathLike[str]) -> LocalShellExecutor:
    return LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=svc)


def request(token: str, command: str, **kw: object) -> ShellExecRequest:
    return ShellExecRequest(command=command, env=marked_env(token), **kw)  # type: ignore[arg-type]


def escape_then(form: str, rest: str) -> str:
    # The pause lets multi-step forms (a double fork) settle before the shell moves on.
    return f"{ESCAPERS[form]}\nsleep 0.2; echo started; {rest}"


@needs_cgroup
@pytest.mark.parametrize("form", FORMS)
def test_escaper_is_stopped_and_counted_on_return(ex: LocalShellExecutor, form: str) -> None:
    token = new_token()
    r = ex.run_sync(ex.resolve(request(token, escape_then(form, "true"))))
    assert r.exit_code == 0
    assert r.stdout.text == "started\n"
    assert r.leftover_killed == 1
    assert survivors(token) == []
    assert r.resources is not None and r.resources.containment == "cgroup"


@needs_cgroup
@pytest.mark.parametrize("form", FORMS)
def test_escaper_is_stopped_on_timeout(ex: LocalShellExecutor, form: str) -> None:
    token = new_token()
    r = ex.run_sync(ex.resolve(request(token, escape_then(form, "sleep 100"), timeout_ms=800)))
    assert r.timed_out
    assert r.leftover_killed == 1
    assert survivors(token) == []


@needs_cgroup
@pytest.mark.parametrize("form", FORMS)
def test_escaper_is_stopped_on_abort(ex: LocalShellExecutor, form: str) -> None:
    token = new_token()
    ctl = AbortController()
    timer = threading.Timer(0.8, ctl.abort)
    timer.start()
    try:
        r = ex.run_sync(
            ex.resolve(request(token, escape_then(form, "sleep 100"), signal=ctl.signal))
        )
    finally:
        timer.cancel()
    assert r.aborted
    assert r.leftover_killed == 1
    assert survivors(token) == []


@needs_cgroup
@pytest.mark.parametrize("form", FORMS)
def test_escaper_is_stopped_on_cancel(ex: LocalShellExecutor, form: str) -> None:
    token = new_token()

    async def cancel_it() -> None:
        task = asyncio.create_task(
            ex.run(ex.resolve(request(token, escape_then(form, "sleep 100"))))
        )
        await asyncio.sleep(0.8)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert survivors(token) == []


@needs_cgroup
@pytest.mark.parametrize("form", FORMS)
def test_escaper_is_stopped_by_background_kill(ex: LocalShellExecutor, form: str) -> None:
    token = new_token()
    p = ex.start(ex.resolve(request(token, escape_then(form, "sleep 100"))))
    time.sleep(0.8)
    assert survivors(token) != []
    assert p.kill()
    assert p.wait_sync(10)
    assert p.status == "killed"
    assert survivors(token) == []
    assert p.resources is not None and p.resources.containment == "cgroup"


@needs_cgroup
@pytest.mark.parametrize("form", FORMS)
def test_escaper_is_stopped_by_dispose(tmp_path: os.PathLike[str], form: str) -> None:
    token = new_token()
    before = own_cgroup_dirs()
    service = SubprocessService()
    try:
        ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=service)
        p = ex.start(ex.resolve(request(token, escape_then(form, "sleep 100"))))
        time.sleep(0.8)
        assert survivors(token) != []
        service.dispose()
        assert p.status == "killed"
        assert survivors(token) == []
        assert new_cgroup_dirs(before) == []
    finally:
        service.dispose()
        kill_marked()


@needs_cgroup
def test_background_escapee_of_a_completed_task_is_counted(ex: LocalShellExecutor) -> None:
    token = new_token()
    p = ex.start(ex.resolve(request(token, escape_then("setsid", "exit 4"))))
    assert p.wait_sync(10)
    assert (p.status, p.exit_code) == ("completed", 4)
    assert survivors(token) == []


def test_session_containment_is_reported(tmp_path: os.PathLike[str]) -> None:
    before = own_cgroup_dirs()
    service = SubprocessService()
    try:
        ex = LocalShellExecutor(cwd=str(tmp_path), containment="session", service=service)
        r = ex.run_sync(ex.resolve(ShellExecRequest(command="sleep 0.01 & echo hi")))
        assert r.stdout.text == "hi\n"
        assert r.resources is not None
        assert r.resources.containment == "session"
        # max_processes has no per-process fallback: the facts say it was not enforced
        # for the whole call.
        assert r.resources.enforcement == "process"
        assert r.resources.peak_memory_bytes is None
        assert r.resources.cpu_ms >= 0.0
        assert new_cgroup_dirs(before) == []
    finally:
        service.dispose()


def test_containment_is_validated() -> None:
    with pytest.raises(ValueError, match="containment"):
        LocalShellExecutor(containment="none")  # type: ignore[arg-type]


@needs_cgroup
def test_sigterm_trapping_escapee_is_killed_after_the_grace(ex: LocalShellExecutor) -> None:
    token = new_token()
    trap = "setsid bash -c 'trap \"\" TERM; sleep 300' > /dev/null 2>&1 &"
    started = time.monotonic()
    r = ex.run_sync(ex.resolve(request(token, f"{trap}\nsleep 0.2")))
    assert r.leftover_killed >= 1
    assert survivors(token) == []
    assert time.monotonic() - started < 5


@needs_cgroup
def test_pooled_cgroups_are_reused_and_removed(tmp_path: os.PathLike[str]) -> None:
    before = own_cgroup_dirs()
    svc = SubprocessService()
    ex = LocalShellExecutor(cwd=str(tmp_path), service=svc)
    for _ in range(20):
        assert ex.run_sync(ex.resolve(ShellExecRequest(command="true"))).exit_code == 0
    root = str(containment_facts()["cgroup_root"])
    (parent,) = [d for d in new_cgroup_dirs(before) if os.path.dirname(d) == root]
    calls = [d for d in os.listdir(parent) if os.path.isdir(os.path.join(parent, d))]
    assert 1 <= len(calls) <= 3, calls  # sequential calls share a couple of cgroups
    svc.dispose()
    assert new_cgroup_dirs(before) == []


def test_no_survivors_anywhere_at_the_end() -> None:
    time.sleep(0.1)
    assert wait_gone("no-such-token") == []


@needs_cgroup
def test_kill_reaches_an_escapee_holding_the_pipes_at_once(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    # The escapee keeps stdout open: were it signalled only after the shell's drain grace,
    # the timeout would take the whole grace longer. SIGTERM reaches it with the shell.
    token = new_token()
    ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=3000, service=svc)
    started = time.monotonic()
    r = ex.run_sync(ex.resolve(request(token, "setsid sleep 300 & sleep 100", timeout_ms=300)))
    assert time.monotonic() - started < 2.0
    assert r.timed_out
    assert r.leftover_killed == 1
    assert survivors(token) == []


@needs_cgroup
def test_a_call_without_a_cgroup_falls_back_to_session_and_says_so(
    tmp_path: os.PathLike[str],
) -> None:
    before = own_cgroup_dirs()
    svc = SubprocessService()
    try:
        ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=svc)
        assert svc._supervisor.has_cgroups()  # creates the service's parent, no call cgroup
        root = str(containment_facts()["cgroup_root"])
        (parent,) = [d for d in new_cgroup_dirs(before) if os.path.dirname(d) == root]
        with open(os.path.join(parent, "cgroup.max.descendants"), "w") as f:
            f.write("0")  # no call cgroup can be made
        r = ex.run_sync(ex.resolve(ShellExecRequest(command="echo ok")))
        assert r.stdout.text == "ok\n"
        assert r.resources is not None
        assert r.resources.containment == "session"
        assert r.resources.enforcement == "process"  # max_processes had no controller
    finally:
        svc.dispose()
    assert new_cgroup_dirs(before) == []


@needs_cgroup
def test_no_fd_of_a_call_outlives_its_result(ex: LocalShellExecutor) -> None:
    # Only the service's warm cgroup holds descriptors between calls, and a call that makes
    # it unusable (a leftover was killed) gets it replaced before its result is handed over:
    # the count is exact right after each call, with no settling time.
    ex.run_sync(ex.resolve(ShellExecRequest(command="true")))
    fds = len(os.listdir("/proc/self/fd"))
    for command in ("true", "sleep 0.01 &", "echo x; exit 3"):
        for _ in range(10):
            ex.run_sync(ex.resolve(ShellExecRequest(command=command)))
            assert len(os.listdir("/proc/self/fd")) == fds


needs_clone_syscall = pytest.mark.skipif(
    os.uname().machine not in CLONE_MACHINES, reason="raw clone number unknown here"
)


def zombie_children(pids: list[int]) -> list[int]:
    """Those of `pids` that are zombie children of this process."""
    me = str(os.getpid())
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
        if state == "Z" and ppid == me:
            out.append(pid)
    return out


def eventually_no_zombies(pids: list[int], within_s: float = 3.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := zombie_children(pids)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


# Attack: clone(CLONE_PARENT) makes the harness the parent of the command's children; when they
# exit they are the harness's zombies, forever (SPEC §7: no zombie after any run). Whether
# they exit during the call or are killed with it as leftovers, shellseam reaps them.
@needs_clone_syscall
@pytest.mark.parametrize(
    ("kind", "containment", "limits", "linger"),
    [
        pytest.param("local", "auto", None, "linger-setsid", marks=needs_cgroup),
        ("local", "auto", ResourceLimits(), "linger"),  # no pids controller joined
        ("local", "session", None, "linger"),
        pytest.param("read-only", "auto", None, "linger-setsid", marks=needs_cgroup),
    ],
)
def test_clone_parent_children_leave_no_zombie_in_the_harness(
    svc: SubprocessService,
    tmp_path: os.PathLike[str],
    kind: str,
    containment: str,
    limits: ResourceLimits | None,
    linger: str,
) -> None:
    config: dict[str, object] = {"containment": containment, "grace_ms": 300, "service": svc}
    if limits is not None:
        config["limits"] = limits
    ex: LocalShellExecutor
    if kind == "local":
        ex = LocalShellExecutor(cwd=str(tmp_path), **config)  # type: ignore[arg-type]
    elif landlock_abi() < 1:
        pytest.skip("kernel has no Landlock")
    else:
        ex = SandboxShellExecutor(mode=kind, cwd=str(tmp_path), **config)  # type: ignore[arg-type]
    r = run(ex, f"{CLONE_PARENT} 3 {linger}")
    exited, lingering = cloned(r.stdout.text)
    try:
        if "refused" in r.stdout.text:
            return  # a confined mode may forbid CLONE_PARENT: nothing to reap then
        assert len(exited) == 3 and len(lingering) == 1, r.stdout.text
        assert r.leftover_killed == 1  # the lingerer, killed with its call
        assert eventually_no_zombies(exited + lingering) == []
    finally:
        kill_and_reap(exited + lingering)


# Only zombies that are provably a call's are reaped: the harness's own children keep their
# exit status for their owner, whatever calls settle meanwhile.
@needs_clone_syscall
def test_the_harness_own_children_keep_their_status(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    mine = [
        subprocess.Popen([sys.executable, "-c", "import os; os._exit(5)"]),
        subprocess.Popen([sys.executable, "-c", "import os; os._exit(6)"], start_new_session=True),
        subprocess.Popen([sys.executable, "-c", "import os; os.setpgid(0, 0); os._exit(9)"]),
    ]
    try:
        pids = [p.pid for p in mine]
        deadline = time.monotonic() + 5
        while len(zombie_children(pids)) < len(pids) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(zombie_children(pids)) == len(pids)
        for containment in ("auto", "session"):
            ex = LocalShellExecutor(
                cwd=str(tmp_path), grace_ms=300, service=svc, containment=containment
            )
            for _ in range(3):
                r = run(ex, f"{CLONE_PARENT} 2 linger")
                exited, lingering = cloned(r.stdout.text)
                assert eventually_no_zombies(exited + lingering) == []
        time.sleep(0.6)  # past any rescan of settled calls
        assert [p.wait(timeout=5) for p in mine] == [5, 6, 9]
    finally:
        for p in mine:
            with contextlib.suppress(OSError):
                p.kill()


# Found by attacking: under session containment (no cgroup: `containment="session"`, or a host
# without a writable hierarchy) a `set -m` job or a `setpgid(0, 0)` child leaves the shell's
# process group but not its session, and SPEC §3 counts the session: they must be terminated
# and counted when the call settles, however it settles.
@pytest.mark.parametrize("form", ["set -m", "setpgid"])
@pytest.mark.parametrize("kind", ["local", "workspace-write"])
@pytest.mark.parametrize("ending", ["return", "timeout", "kill"])
def test_session_containment_ends_the_whole_session(
    svc: SubprocessService, tmp_path: os.PathLike[str], form: str, kind: str, ending: str
) -> None:
    if kind != "local" and landlock_abi() < 1:
        pytest.skip("kernel has no Landlock")
    config: dict[str, object] = {"containment": "session", "grace_ms": 300, "service": svc}
    ex: LocalShellExecutor = (
        LocalShellExecutor(cwd=str(tmp_path), **config)  # type: ignore[arg-type]
        if kind == "local"
        else SandboxShellExecutor(mode=kind, cwd=str(tmp_path), **config)  # type: ignore[arg-type]
    )
    token = new_token()
    rest = {"return": "exit 0", "timeout": "sleep 300", "kill": "sleep 300"}[ending]
    timeout_ms = 1500 if ending == "timeout" else 60_000
    req = request(token, escape_then(form, rest), timeout_ms=timeout_ms)
    if ending == "kill":
        p = ex.start(ex.resolve(req))
        deadline = time.monotonic() + 10
        while len(survivors(token)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # the shell, the escaper and the foreground sleep
        assert p.kill()
        assert p.wait_sync(10) and p.status == "killed"
    else:
        r = ex.run_sync(ex.resolve(req))
        assert r.resources is not None and r.resources.containment == "session"
        assert r.timed_out is (ending == "timeout")
        assert r.leftover_killed >= 1
    assert wait_gone(token) == []


# Found by attacking the session scan that looks only at the pids handed out since the call's
# leader: a command that makes the pid allocator lap (a loop of short-lived threads, no
# privilege needed) until it hands out numbers just past the leader again leaves its members
# outside that range. The members here stay in the shell's group and session; both must
# still be ended and counted. `ending`: the lap's last pid is gone when the call settles, or
# is a live member of the call.
LAP = f"""{PY} - $$ <<'EOF'
import sys, threading
leader = int(sys.argv[1])
seen = []
def note():
    seen.append(threading.get_native_id())
wrapped = False
while True:
    t = threading.Thread(target=note)
    t.start()
    t.join()
    pid = seen.pop()
    wrapped = wrapped or pid < leader
    if wrapped and leader < pid < leader + 10:
        break
EOF"""
BURN = f"""{PY} -c 'import os
for _ in range(200):
    os.waitpid(os.fork() or os._exit(0), 0)'"""


@pytest.mark.parametrize("ending", ["gone", "live"])
def test_session_containment_survives_a_lap_of_the_pid_allocator(
    svc: SubprocessService, tmp_path: os.PathLike[str], ending: str
) -> None:
    ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=svc, containment="session")
    token = new_token()
    last = "sleep 301 > /dev/null 2>&1 &" if ending == "live" else "true"
    command = (
        # The members are made 200 pids after the leader, so a lap that stops just past the
        # leader does not pass them again.
        f"{BURN}\nsleep 300 > /dev/null 2>&1 &\n"
        "set -m; sleep 300 > /dev/null 2>&1 & set +m\n"
        f"{LAP}\n{last}\necho lapped"
    )
    r = ex.run_sync(ex.resolve(request(token, command, timeout_ms=120_000)))
    assert r.stdout.text == "lapped\n"
    assert r.resources is not None and r.resources.containment == "session"
    assert r.leftover_killed == (3 if ending == "live" else 2)
    assert wait_gone(token) == []


def executor_in(
    containment: str, svc: SubprocessService, tmp_path: os.PathLike[str]
) -> LocalShellExecutor:
    """An executor with `containment` ("auto" skips the test without a cgroup)."""
    if containment == "auto" and not HAS_CGROUP:
        pytest.skip("no writable cgroup hierarchy")
    return LocalShellExecutor(
        cwd=str(tmp_path),
        grace_ms=300,
        service=svc,
        containment=containment,  # type: ignore[arg-type]
    )


# Found by attacking: a process whose main thread exited (`pthread_exit`) while another thread
# runs shows a zombie's state in /proc/<pid>/stat (`Zl`), yet lives on. Judged dead, it was
# neither counted nor killed and outlived its call, in both containment modes (in a cgroup,
# which then could not be removed). Ignoring SIGTERM, it also outlived `cgroup.kill`, which
# signals a process through its (dead) main thread. `threads`: one sleeping thread, or a
# chain of threads that each start the next and exit (each looked dead or exiting by the
# time its stat was read).
def orphaned_threads(threads: str, group: str) -> str:
    body = {
        "sleeping": "threading.Thread(target=time.sleep, args=(300,)).start()",
        "hopping": "def hop():\n    threading.Thread(target=hop).start()\nhop()",
    }[threads]
    own_group = "os.setpgid(0, 0)" if group == "own group" else "pass"
    return f"""{PY} -c 'import ctypes, os, signal, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
{own_group}
{body}
time.sleep(0.1)
ctypes.CDLL(None).pthread_exit(None)' > /dev/null 2>&1 &
sleep 0.5; echo started"""


@pytest.mark.parametrize("group", ["shell's group", "own group"])
@pytest.mark.parametrize("threads", ["sleeping", "hopping"])
@pytest.mark.parametrize("containment", ["auto", "session"])
def test_a_process_whose_main_thread_exited_does_not_outlive_its_call(
    svc: SubprocessService, tmp_path: os.PathLike[str], containment: str, threads: str, group: str
) -> None:
    ex = executor_in(containment, svc, tmp_path)
    token = new_token()
    r = ex.run_sync(ex.resolve(request(token, orphaned_threads(threads, group))))
    assert r.stdout.text == "started\n"
    assert r.leftover_killed == 1
    assert wait_gone(token) == []


# Found by attacking: under session containment a chain of processes that each fork the next
# and exit, ignoring SIGTERM, is never all in one scan of the session; the call settled as
# soon as one scan missed it, and the chain ran on in the shell's own process group.
FORK_CHAIN = f"""{PY} -c 'import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
end = time.monotonic() + 60
while time.monotonic() < end:
    if os.fork():
        os._exit(0)
    time.sleep(0.0005)' > /dev/null 2>&1 &
sleep 0.3; echo started"""


# Found by attacking: the lap can leave no trace in any counter (helpers/pid_lap.py: forks
# that fail in a pid namespace whose init died), and a live process outside the session then
# takes the last pid.
FAILED_FORK_LAP = f"{PY} {os.path.join(os.path.dirname(__file__), 'helpers', 'pid_lap.py')} $$"


def test_session_containment_survives_a_lap_made_of_failed_forks(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=svc, containment="session")
    token = new_token()
    command = (
        f"{BURN}\nsleep 300 > /dev/null 2>&1 &\n"
        "set -m; sleep 300 > /dev/null 2>&1 & set +m\n"
        f"{FAILED_FORK_LAP}\n"
        # The last pid handed out stays alive, outside the session (waited for with builtins
        # only, which fork nothing).
        "setsid sleep 301 > /dev/null 2>&1 < /dev/null &\n"
        'until read -r l < /proc/$!/stat && set -- ${l##*) } && [ "$4" = "$!" ]; do :; done\n'
        "echo lapped"
    )
    r = ex.run_sync(ex.resolve(request(token, command, timeout_ms=120_000)))
    assert r.stdout.text == "lapped\n", r.stderr.text
    assert r.leftover_killed == 2
    # The setsid sleep left the session: session containment does not follow it.
    kill_marked()
    assert wait_gone(token) == []


# Found by attacking: `cgroup.procs` hands out a page of pids per read, and a short read was
# taken for the end of the list: a call with more than ~680 processes had the rest neither
# counted nor killed by pid, and a process `cgroup.kill` misses (its main thread exited)
# listed after them outlived the call.
MANY = "trap '' TERM; for i in $(seq 1000); do sleep 300 & done > /dev/null 2>&1"


@needs_cgroup
def test_every_member_of_a_big_call_is_counted_and_killed(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor_in("auto", svc, tmp_path)
    token = new_token()
    command = f"{MANY}\n{orphaned_threads('sleeping', 'own group')}"
    r = ex.run_sync(ex.resolve(request(token, command, timeout_ms=60_000)))
    assert r.stdout.text == "started\n"
    assert r.leftover_killed == 1001
    assert wait_gone(token) == []


# Found by attacking: under session containment the SIGKILL pass lists the session, then
# signals each member outside the shell's group; what a member not killed yet forked after
# the listing outlived the call (10-18 `sleep`s a call from a `set -m` job that keeps starting
# them). Each poll of a call being reaped now kills again whatever is still there.
FORKER = (
    "set -m; ( trap '' TERM; for i in $(seq 300); do sleep 300 & done; "
    "( trap '' TERM; while :; do sleep 300 & done ) & wait ) > /dev/null 2>&1 & "
    "sleep 1; echo started"
)


@pytest.mark.parametrize("containment", ["auto", "session"])
@pytest.mark.parametrize(("job", "rounds"), [("fork chain", 3), ("forks during the kill", 2)])
def test_a_forking_job_does_not_outlive_its_call(
    svc: SubprocessService, tmp_path: os.PathLike[str], containment: str, job: str, rounds: int
) -> None:
    ex = executor_in(containment, svc, tmp_path)
    command = FORK_CHAIN if job == "fork chain" else FORKER
    for _ in range(rounds):
        token = new_token()
        r = ex.run_sync(ex.resolve(request(token, command, timeout_ms=60_000)))
        assert r.stdout.text == "started\n"
        if job != "fork chain":
            assert r.leftover_killed >= 300
        assert wait_gone(token, timeout=1.0) == []


# Found by attacking: a job that traces the shell (`PTRACE_SEIZE`) holds its zombie, which the
# harness can then not wait for: the pidfd said "exited" and waitid "running", so the
# supervisor spun at 100 % CPU, the tracer ran on uncounted, and under session containment
# (the tracer in a session of its own) the call ignored its timeout and dispose() waited for
# the tracer. The exit is taken from the pidfd; the status is read once the tracer lets go.
TRACER = f"""{PY} -c 'import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
leader = int(sys.argv[1])
if libc.ptrace(0x4206, leader, 0, 0x40) != 0:  # PTRACE_SEIZE, PTRACE_O_TRACEEXIT
    sys.exit("seize failed")
print("seized", flush=True)
while True:  # pass the shell its signals until its exit event, then never wait again
    _, status = os.waitpid(leader, 0x40000000)  # __WALL
    if status >> 8 == signal.SIGTRAP | 6 << 8:  # PTRACE_EVENT_EXIT
        libc.ptrace(7, leader, 0, 0)  # PTRACE_CONT
        break
    sig = os.WSTOPSIG(status)
    libc.ptrace(7, leader, 0, 0 if sig == signal.SIGTRAP else sig)
time.sleep(300)' $$"""


@pytest.mark.parametrize("containment", ["auto", "session"])
@pytest.mark.parametrize("tracer", ["in the call", "setsid"])
def test_a_traced_shell_does_not_hold_its_call(
    svc: SubprocessService, tmp_path: os.PathLike[str], containment: str, tracer: str
) -> None:
    ex = executor_in(containment, svc, tmp_path)
    token = new_token()
    prefix = "setsid " if tracer == "setsid" else ""
    command = f"{prefix}{TRACER} > seized 2>&1 &\nuntil [ -s seized ]; do sleep 0.01; done; exit 5"
    zombies_before = set(own_zombies())
    started = time.monotonic()
    cpu = time.process_time()
    r = ex.run_sync(ex.resolve(request(token, command, timeout_ms=10_000)))
    assert time.monotonic() - started < 5, "the call waited for the tracer"
    assert time.process_time() - cpu < 2, "the harness spun"
    assert not r.timed_out
    if tracer == "in the call" or containment == "auto":
        # The tracer is the call's: killed and counted, and the shell's status then read.
        assert r.leftover_killed == 1
        assert (r.exit_code, r.exit_status_unknown) == (5, False)
        assert wait_gone(token) == []
    else:
        # Session containment does not follow setsid: the tracer holds the zombie on.
        assert r.exit_status_unknown
    kill_marked()
    # Once the tracer is gone, the zombie leader goes back to the harness, which reaps it:
    # no zombie of a call stays (it stayed for good before).
    deadline = time.monotonic() + 5
    while set(own_zombies()) - zombies_before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert set(own_zombies()) - zombies_before == set()


def own_zombies() -> list[int]:
    me = os.getpid()
    return [pid for pid, state, ppid, _ in proc_stats() if state == "Z" and ppid == me]


# Found by attacking: a job counted when the timeout's SIGTERM reached it outside the shell's
# group, which then moved into that group, was counted again as a group member (2 for 1).
JOINS_THE_GROUP = f"""set -m; {PY} -c 'import os, signal, sys, time
leader = int(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: os.setpgid(0, leader))
time.sleep(300)' $$ > /dev/null 2>&1 &
set +m; sleep 300"""


def test_a_job_moving_into_the_shells_group_is_counted_once(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor_in("session", svc, tmp_path)
    for _ in range(3):
        token = new_token()
        r = ex.run_sync(ex.resolve(request(token, JOINS_THE_GROUP, timeout_ms=700)))
        assert r.timed_out
        assert r.leftover_killed == 1
        assert wait_gone(token) == []
