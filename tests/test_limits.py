"""Resource limits on real processes (SPEC §3 Limits): memory, processes, CPU, file size,
open files; effective limits, enforcement facts and the rendered markers."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections.abc import Iterator

import pytest
from containment_helpers import (
    CLONE_MACHINES,
    CLONE_PARENT,
    cloned,
    kill_and_reap,
    kill_marked,
    marked_env,
    new_cgroup_dirs,
    new_token,
    own_cgroup_dirs,
    survivors,
)

from conftest import HELPERS, run
from shellseam import (
    LocalShellExecutor,
    ResourceLimits,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
    containment_facts,
    landlock_abi,
    render_result,
)

FACTS = containment_facts()
PER_LIMIT = FACTS["limits"]
assert isinstance(PER_LIMIT, dict)
PY = sys.executable
MIB = 2**20


@pytest.fixture
def svc() -> Iterator[SubprocessService]:
    before = own_cgroup_dirs()
    service = SubprocessService()
    try:
        yield service
    finally:
        service.dispose()
        kill_marked()
        assert new_cgroup_dirs(before) == []


def executor(
    svc: SubprocessService, tmp_path: os.PathLike[str], **kw: object
) -> LocalShellExecutor:
    return LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=svc, **kw)  # type: ignore[arg-type]


@pytest.mark.skipif(PER_LIMIT["memory_bytes"] != "tree", reason="no memory controller")
@pytest.mark.parametrize("background", [False, True])
def test_an_oom_kill_ends_the_whole_call(
    svc: SubprocessService, tmp_path: os.PathLike[str], background: bool
) -> None:
    # Found by attacking: the kernel's OOM kill takes one process; on a v1 controller the
    # shell went on (`...; echo after` printed "after", exit 0, under a "killed" marker).
    # SPEC: memory over the limit -> the call is killed.
    ex = executor(svc, tmp_path, limits=ResourceLimits(memory_bytes=100 * MIB))
    hog = f"{PY} -c 'b = b\"x\" * (300 << 20)'"
    command = f"sleep 30 & {hog}; sleep 30; echo after" if background else f"{hog}; echo after"
    started = time.monotonic()
    r = ex.run_sync(ex.resolve(ShellExecRequest(command=command)))
    assert time.monotonic() - started < 20
    assert r.resources is not None and r.resources.limit_exceeded == "memory"
    assert "after" not in r.stdout.text
    assert r.signal == "SIGKILL" and r.exit_code is None
    text = render_result(r)
    assert "[killed: memory limit of 104857600 bytes exceeded]\n" in text
    assert text.endswith("\n[killed by signal: SIGKILL]")


@pytest.mark.skipif(PER_LIMIT["memory_bytes"] != "tree", reason="no memory controller")
def test_memory_limit_kills_the_call_and_says_so(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(memory_bytes=256 * 2**20))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command=f"{PY} -c 'b = b\"x\" * (2 << 30)'")))
    assert r.resources is not None
    assert r.resources.limit_exceeded == "memory"
    assert r.resources.enforcement == "tree"
    assert r.signal == "SIGKILL" or r.exit_code == 137
    text = render_result(r)
    assert "[killed: memory limit of 268435456 bytes exceeded]\n" in text
    peak = r.resources.peak_memory_bytes
    assert peak is not None and 100 * 2**20 < peak <= 300 * 2**20


def test_peak_memory_is_reported_per_call(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    # On a v1 memory controller only calls with a memory limit join it (a migration each).
    ex = executor(svc, tmp_path, limits=ResourceLimits(memory_bytes=2**30))
    big = ex.run_sync(ex.resolve(ShellExecRequest(command=f"{PY} -c 'b = b\"x\" * (200 << 20)'")))
    small = ex.run_sync(ex.resolve(ShellExecRequest(command="true")))
    assert big.resources is not None and small.resources is not None
    if PER_LIMIT["memory_bytes"] != "tree":
        assert big.resources.peak_memory_bytes is None
        return
    assert big.resources.peak_memory_bytes is not None
    assert big.resources.peak_memory_bytes >= 200 << 20
    # A reused cgroup starts its peak afresh.
    assert small.resources.peak_memory_bytes is not None
    assert small.resources.peak_memory_bytes < 100 << 20
    plain = executor(svc, tmp_path)
    unlimited = plain.run_sync(plain.resolve(ShellExecRequest(command="true")))
    assert unlimited.resources is not None
    if FACTS["memory_controller"] == "cgroup v1":
        assert unlimited.resources.peak_memory_bytes is None


FORKER = f"""{PY} -c '
import os, time
ok = failed = 0
for _ in range(200):
    try:
        pid = os.fork()
    except BlockingIOError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    ok += 1
print(ok, failed)
'"""


@pytest.mark.skipif(PER_LIMIT["max_processes"] != "tree", reason="no pids controller")
def test_process_limit_refuses_forks_and_kills_nothing(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    token = new_token()
    ex = executor(svc, tmp_path, limits=ResourceLimits(max_processes=64))
    started = time.monotonic()
    r = ex.run_sync(ex.resolve(ShellExecRequest(command=FORKER, env=marked_env(token))))
    ok, failed = map(int, r.stdout.text.split())
    assert r.exit_code == 0  # nothing was killed for reaching the limit
    assert ok == 63 and failed == 137  # 64 processes: the forker and 63 children
    assert r.resources is not None and r.resources.limit_exceeded == "processes"
    assert r.leftover_killed == 63
    assert "[process limit of 64 reached; some forks failed]\n" in render_result(r)
    assert survivors(token) == []
    assert time.monotonic() - started < 5


def test_bash_fork_loop_under_a_process_limit(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    if PER_LIMIT["max_processes"] != "tree":
        pytest.skip("no pids controller")
    token = new_token()
    ex = executor(svc, tmp_path, limits=ResourceLimits(max_processes=64))
    # bash retries a failed fork with back-off; 70 jobs hit the limit once, quickly.
    cmd = "for i in $(seq 70); do sleep 5 & done 2>/dev/null; echo done"
    r = ex.run_sync(
        ex.resolve(ShellExecRequest(command=cmd, env=marked_env(token), timeout_ms=60_000))
    )
    assert r.resources is not None and r.resources.limit_exceeded == "processes"
    assert survivors(token) == []


@pytest.mark.skipif(PER_LIMIT["cpu_ms"] != "tree", reason="no cgroup CPU accounting")
def test_cpu_limit_stops_a_busy_loop(svc: SubprocessService, tmp_path: os.PathLike[str]) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(cpu_ms=300))
    started = time.monotonic()
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="while :; do :; done")))
    assert time.monotonic() - started < 20
    assert r.signal == "SIGKILL"
    assert not r.timed_out
    assert r.resources is not None and r.resources.limit_exceeded == "cpu"
    assert r.resources.cpu_ms >= 300
    assert render_result(r).endswith(
        "[killed: cpu limit of 300ms exceeded]\n[killed by signal: SIGKILL]"
    )


def test_cpu_limit_counts_the_whole_tree(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    if PER_LIMIT["cpu_ms"] != "tree":
        pytest.skip("no cgroup CPU accounting")
    ex = executor(svc, tmp_path, limits=ResourceLimits(cpu_ms=400))
    busy = "(while :; do :; done) & (while :; do :; done) & wait"
    r = ex.run_sync(ex.resolve(ShellExecRequest(command=busy)))
    assert r.resources is not None and r.resources.limit_exceeded == "cpu"


def test_cpu_time_is_reported_without_a_limit(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path)
    r = ex.run_sync(
        ex.resolve(ShellExecRequest(command="i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"))
    )
    assert r.resources is not None
    assert r.resources.limit_exceeded is None
    assert r.resources.cpu_ms > 5


def test_file_size_limit_gets_sigxfsz_and_the_marker(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(file_size_bytes=4096))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="exec head -c 100000 /dev/zero > big")))
    assert r.signal == "SIGXFSZ"
    assert os.path.getsize(os.path.join(str(tmp_path), "big")) == 4096
    assert r.resources is not None and r.resources.limit_exceeded == "file_size"
    assert render_result(r).endswith(
        "[file size limit of 4096 bytes reached]\n[killed by signal: SIGXFSZ]"
    )


def test_file_size_limit_in_a_pipeline_is_seen_through_bash(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(file_size_bytes=1000))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="head -c 5000 /dev/zero > f; echo after")))
    assert r.stdout.text == "after\n"
    assert r.resources is not None and r.resources.limit_exceeded == "file_size"


def test_open_files_limit_is_per_process(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(open_files=64))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="ulimit -n; ulimit -Hn")))
    assert r.stdout.text == "64\n64\n"
    assert r.resources is not None and r.resources.enforcement == "process"


def test_request_limits_only_tighten(svc: SubprocessService, tmp_path: os.PathLike[str]) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(max_processes=100, open_files=512))
    spec = ex.resolve(
        ShellExecRequest(command="ulimit -n", limits=ResourceLimits(open_files=4096, cpu_ms=9000))
    )
    assert spec.limits == ResourceLimits(max_processes=100, open_files=512, cpu_ms=9000)
    r = ex.run_sync(spec)
    assert r.stdout.text == "512\n"
    assert r.resources is not None and r.resources.limits == spec.limits


def test_default_limits_are_applied(svc: SubprocessService, tmp_path: os.PathLike[str]) -> None:
    ex = executor(svc, tmp_path)
    spec = ex.resolve(ShellExecRequest(command="true"))
    assert spec.limits == ResourceLimits(max_processes=4096)
    r = ex.run_sync(spec)
    assert r.resources is not None
    expected = "tree" if PER_LIMIT["max_processes"] == "tree" else "process"
    assert r.resources.enforcement == expected


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_bad_request_limits_are_invalid_requests(
    svc: SubprocessService, tmp_path: os.PathLike[str], bad: object
) -> None:
    ex = executor(svc, tmp_path)
    with pytest.raises(ShellError) as info:
        ex.resolve(ShellExecRequest(command="true", limits=ResourceLimits(max_processes=bad)))  # type: ignore[arg-type]
    assert info.value.code == "INVALID_REQUEST"


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        (ResourceLimits(memory_bytes=0), ValueError),
        (ResourceLimits(cpu_ms=-3), ValueError),
        (ResourceLimits(open_files="9"), TypeError),  # type: ignore[arg-type]
        ({"memory_bytes": 1}, TypeError),
    ],
)
def test_bad_executor_limits_are_refused(limits: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="limits"):
        LocalShellExecutor(limits=limits)  # type: ignore[arg-type]


def test_session_containment_falls_back_to_rlimits(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(
        svc,
        tmp_path,
        containment="session",
        limits=ResourceLimits(memory_bytes=64 * 2**20, cpu_ms=1500),
    )
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="ulimit -v; ulimit -t")))
    assert r.stdout.text == f"{64 * 1024}\n2\n"
    assert r.resources is not None
    assert (r.resources.containment, r.resources.enforcement) == ("session", "process")


def test_session_cpu_rlimit_is_detected(svc: SubprocessService, tmp_path: os.PathLike[str]) -> None:
    ex = executor(svc, tmp_path, containment="session", limits=ResourceLimits(cpu_ms=200))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="while :; do :; done")))
    assert r.signal in ("SIGXCPU", "SIGKILL")
    assert r.resources is not None and r.resources.limit_exceeded == "cpu"


def test_session_cpu_limit_holds_to_the_millisecond(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    # RLIMIT_CPU counts whole seconds: a 300 ms limit let a busy loop burn a full second
    # while the marker quoted 300ms. Each member's own CPU time is checked as it runs.
    ex = executor(svc, tmp_path, containment="session", limits=ResourceLimits(cpu_ms=300))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="while :; do :; done")))
    assert r.resources is not None and r.resources.limit_exceeded == "cpu"
    assert r.signal == "SIGKILL"
    assert 300 <= r.resources.cpu_ms < 800, r.resources
    assert render_result(r).endswith(
        "[killed: cpu limit of 300ms exceeded]\n[killed by signal: SIGKILL]"
    )


def test_background_handle_carries_resources(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(file_size_bytes=10))
    p = ex.start(ex.resolve(ShellExecRequest(command="head -c 100 /dev/zero > f")))
    assert p.resources is None or p.status != "running"
    assert p.wait_sync(10)
    assert p.resources is not None
    assert p.resources.limit_exceeded == "file_size"
    assert p.resources.limits.file_size_bytes == 10


def test_containment_facts_name_every_limit() -> None:
    before = own_cgroup_dirs()
    assert FACTS["containment"] in ("cgroup", "session")
    assert set(PER_LIMIT) == {
        "memory_bytes",
        "max_processes",
        "cpu_ms",
        "file_size_bytes",
        "open_files",
    }
    assert set(PER_LIMIT.values()) <= {"tree", "process", "unavailable"}
    assert PER_LIMIT["file_size_bytes"] == "process"
    containment_facts()
    assert new_cgroup_dirs(before) == []  # probing leaves nothing behind


def test_doctor_reports_containment_and_each_limit() -> None:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "shellseam", "doctor"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    (mechanism,) = [line for line in lines if line.startswith("containment: ")]
    if FACTS["containment"] == "cgroup":
        assert mechanism.startswith(f"containment: cgroup per call under {FACTS['cgroup_root']}")
    else:
        assert "not contained" in mechanism
    expected = ", ".join(f"{k}={v}" for k, v in PER_LIMIT.items())
    assert f"limits: {expected}" in lines


def test_tiny_open_files_limit_is_the_commands_problem_not_a_spawn_failure(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    # The rlimit is set after the child's stdio is in place, so even 1 open file spawns;
    # bash itself then cannot open its libraries (EMFILE) and says so.
    ex = executor(svc, tmp_path, limits=ResourceLimits(open_files=1))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="echo hi")))
    assert r.exit_code == 127
    assert "Error 24" in r.stderr.text or "Too many open files" in r.stderr.text
    ex = executor(svc, tmp_path, limits=ResourceLimits(open_files=4))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="echo hi")))
    assert (r.stdout.text, r.exit_code) == ("hi\n", 0)


# Found by the SPEC audit (stop 17): a limit above what the kernel lets the harness set made
# every call fail (`open_files` one above the hard RLIMIT_NOFILE: SPAWN_FAILED), or silently
# dropped the call's cgroup (a pids.max above PID_MAX_LIMIT: session containment, nothing
# contained, the process limit unenforced).
def test_open_files_above_the_harness_hard_limit_is_that_limit(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard RLIMIT_NOFILE to exceed")
    ex = executor(svc, tmp_path, limits=ResourceLimits(open_files=hard + 1))
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="ulimit -n; ulimit -Hn")))
    assert (r.stdout.text, r.exit_code) == (f"{hard}\n{hard}\n", 0), r.stderr.text


@pytest.mark.skipif(PER_LIMIT["max_processes"] != "tree", reason="no pids controller")
@pytest.mark.parametrize("ceiling", [4 * 1024 * 1024 + 1, 2**31 - 1, 2**62])
def test_a_process_limit_above_the_kernels_still_contains_the_call(
    svc: SubprocessService, tmp_path: os.PathLike[str], ceiling: int
) -> None:
    token = new_token()
    ex = executor(svc, tmp_path, limits=ResourceLimits(max_processes=ceiling))
    r = ex.run_sync(
        ex.resolve(
            ShellExecRequest(
                command="setsid sleep 300 > /dev/null 2>&1 & echo ok", env=marked_env(token)
            )
        )
    )
    assert r.stdout.text == "ok\n" and r.resources is not None
    assert (r.resources.containment, r.resources.enforcement) == ("cgroup", "tree")
    assert r.leftover_killed >= 1
    assert survivors(token) == []


def test_model_input_cannot_set_limits(svc: SubprocessService, tmp_path: os.PathLike[str]) -> None:
    import asyncio

    from shellseam import BashTool, ManagedEnvRegistry, ToolContext
    from shellseam.tasks import TaskRuntime

    ex = executor(svc, tmp_path, limits=ResourceLimits(open_files=64, file_size_bytes=100))
    tool = BashTool(ex, tasks=TaskRuntime(), env=ManagedEnvRegistry(home=str(tmp_path)))
    args = {
        "command": "ulimit -n; head -c 1000 /dev/zero > f",
        "description": "limits from the model are ignored",
        "limits": {"open_files": 100000, "file_size_bytes": None},
        "memory_bytes": 1,
    }
    result = asyncio.run(tool.execute(args, ToolContext("s", str(tmp_path))))
    assert result.text.startswith("64\n")
    assert "[file size limit of 100 bytes reached]" in result.text


# Nothing a call leaves charged to its cgroup may weigh on a later call (SPEC §7).
#
# Attack: with a memory limit, fill 100 MiB of tmpfs (/dev/shm outlives the call). The pages
# stay charged to the call's memory cgroup; once it went back to the pool, the next call of
# the same executor started with them and was OOM-killed allocating 50 MiB.
@pytest.mark.skipif(PER_LIMIT["memory_bytes"] != "tree", reason="no memory controller")
@pytest.mark.parametrize("confined", [False, True])
def test_tmpfs_pages_a_call_leaves_do_not_count_against_the_next(
    svc: SubprocessService, tmp_path: os.PathLike[str], confined: bool
) -> None:
    limits = ResourceLimits(memory_bytes=128 * MIB)
    ex = executor(svc, tmp_path, limits=limits)
    if confined:
        if landlock_abi() < 1:
            pytest.skip("kernel has no Landlock")
        ex = SandboxShellExecutor(cwd=str(tmp_path), grace_ms=300, service=svc, limits=limits)
    shm = f"/dev/shm/shellseam-test-{os.getpid()}-{confined}"
    try:
        run(ex, "true")
        fds = len(os.listdir("/proc/self/fd"))
        plant = run(ex, f"head -c {100 * MIB} /dev/zero > {shm}")
        assert plant.exit_code == 0, plant.stderr.text
        # Its cgroup is not pooled: removed off the caller's path, but no fd of it outlives
        # the result meanwhile.
        assert len(os.listdir("/proc/self/fd")) == fds
        victim = run(ex, f"{PY} {os.path.join(HELPERS, 'grow_memory.py')} 50")
        assert victim.exit_code == 0, (victim.stdout.text, victim.stderr.text)
        assert victim.resources is not None
        assert victim.resources.limit_exceeded is None
        charge = int(victim.stdout.text.split()[1])
        assert charge < 16 * MIB, f"the next call started with {charge} bytes charged"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(shm)


# The pool still works: calls that leave nothing charged share a cgroup or two.
@pytest.mark.skipif(PER_LIMIT["memory_bytes"] != "tree", reason="no memory controller")
def test_clean_cgroups_are_still_pooled_under_a_memory_limit(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(memory_bytes=128 * MIB))
    seen = set()
    for command in ("true", "ls / > /dev/null", f"{PY} -c pass") * 5:
        r = run(ex, f"{command}; grep -E '^0::|memory' /proc/self/cgroup")
        assert r.exit_code == 0
        seen.add(r.stdout.text)
    assert len(seen) <= 3, seen


# Attack: leave 15 zombies with clone(CLONE_PARENT) under max_processes=20. They are children
# of the harness, which never reaped them, and stayed charged to the pooled pids cgroup: the
# next call's forks failed with EAGAIN and it reported limit_exceeded="processes".
@pytest.mark.skipif(PER_LIMIT["max_processes"] != "tree", reason="no pids controller")
@pytest.mark.skipif(os.uname().machine not in CLONE_MACHINES, reason="raw clone unknown")
def test_zombies_a_call_leaves_do_not_count_against_the_next(
    svc: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    ex = executor(svc, tmp_path, limits=ResourceLimits(max_processes=20))
    forks = "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.2 & done; wait; echo forks-done"
    plant = run(ex, f"{CLONE_PARENT} 15")
    exited, _ = cloned(plant.stdout.text)
    try:
        assert len(exited) == 15, plant.stdout.text
        victim = run(ex, forks)
        assert victim.stdout.text == "forks-done\n", victim.stderr.text
        assert victim.resources is not None
        assert victim.resources.limit_exceeded is None
    finally:
        kill_and_reap(exited)
