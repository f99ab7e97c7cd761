"""Attacking the sandbox as a hostile model would, beyond the issue's list, and the
everyday workflows the hardening must keep working (/dev/shm, here-docs in read-only,
caches, honest denials)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import glob
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import first_line, run
from shellseam import (
    SandboxPolicy,
    SandboxShellExecutor,
    ShellExecRequest,
    SubprocessService,
    landlock_abi,
)
from shellseam.paths import remove_tree
from shellseam.sandbox import is_denial

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="kernel has no Landlock")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root harness")
PY = sys.executable


def py(code: str) -> str:
    return f"{PY} -c {subprocess.list2cmdline([textwrap.dedent(code)])}"


def errno_of(call: str) -> str:
    """A python one-liner printing the errno name of a raw syscall (or 'ok')."""
    return py(f"""
        import ctypes, errno
        libc = ctypes.CDLL(None, use_errno=True)
        r = {call}
        print("ok" if r >= 0 else errno.errorcode[ctypes.get_errno()])
    """)


@pytest.fixture
def box() -> Iterator[dict[str, str]]:
    base = tempfile.mkdtemp(prefix="shellseam-hard-", dir="/var/tmp")
    ws = os.path.join(base, "ws")
    protected = os.path.join(base, "protected")
    os.mkdir(ws)
    os.mkdir(protected)
    with open(os.path.join(protected, "file"), "w") as f:
        f.write("precious\n")
    yield {"base": base, "ws": ws, "protected": protected, "file": f"{protected}/file"}
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def svc(box: dict[str, str]) -> Iterator[SubprocessService]:
    service = SubprocessService(spill_parent=os.path.join(box["base"], "spill"))
    yield service
    service.dispose()


def sandbox(
    box: dict[str, str], svc: SubprocessService, mode: str = "workspace-write"
) -> SandboxShellExecutor:
    return SandboxShellExecutor(mode=mode, cwd=box["ws"], grace_ms=300, service=svc)  # type: ignore[arg-type]


def unchanged(box: dict[str, str]) -> bool:
    with open(box["file"]) as f:
        return f.read() == "precious\n" and os.listdir(box["protected"]) == ["file"]


# -- escapes through the filesystem ------------------------------------------------------


@pytest.mark.parametrize(
    "attack",
    [
        "ln -s {protected} link && echo x > link/new",  # symlink out of the workspace
        "ln {file} hard && echo x >> hard",  # hard link, then write through it
        "mv {protected} stolen",  # move the protected tree in
        "cp -a {file} copy && mv copy {protected}/file",  # replace through a rename
        "exec 3<{file}; echo x >> /proc/self/fd/3",  # reopen a read fd for writing
        "echo x > /proc/$$/root{file}",  # the /proc root magic link
    ],
)
def test_filesystem_escapes_fail(box: dict[str, str], svc: SubprocessService, attack: str) -> None:
    r = run(sandbox(box, svc), attack.format(**box))
    assert r.exit_code != 0
    assert unchanged(box)


@needs_root
@pytest.mark.parametrize(
    "attack",
    [
        "echo '|/bin/sh -c id' > /proc/sys/kernel/core_pattern",
        "echo 3 > /proc/sys/vm/drop_caches",
        "echo $$ > /sys/fs/cgroup/pids/cgroup.procs",
        "echo 1 > /sys/fs/cgroup/pids/pids.max",
        "echo x > /dev/kmsg",
        "head -c 1 /dev/mem",
        "mount -t tmpfs none {ws}",
        "unshare -Ur true",
        "unshare -m true",
        "chroot / true",
        "capsh --addamb=cap_chown -- -c true",
    ],
)
def test_privileged_operations_fail(
    box: dict[str, str], svc: SubprocessService, attack: str
) -> None:
    before = open("/proc/sys/kernel/core_pattern").read()  # noqa: SIM115
    r = run(sandbox(box, svc), attack.format(**box))
    assert r.exit_code != 0, (attack, r.stdout.text)
    assert open("/proc/sys/kernel/core_pattern").read() == before  # noqa: SIM115


@pytest.mark.parametrize(
    ("name", "call", "expected"),
    [
        ("keyctl", "libc.syscall(250, 0, -3, 0)", "EPERM"),  # KEYCTL_GET_KEYRING_ID session
        ("add_key", "libc.syscall(248, b'user', b'k', b'v', 1, -3)", "EPERM"),
        ("io_uring_setup", "libc.syscall(425, 8, ctypes.create_string_buffer(120))", "EPERM"),
        ("clone3", "libc.syscall(435, 0, 0)", "ENOSYS"),
        ("setns", "libc.syscall(308, 0, 0)", "EPERM"),
        ("bpf", "libc.syscall(321, 0, ctypes.create_string_buffer(64), 64)", "EPERM"),
        ("userfaultfd", "libc.syscall(323, 0)", "EPERM"),
    ],
)
def test_dangerous_syscalls_are_refused(
    box: dict[str, str], svc: SubprocessService, name: str, call: str, expected: str
) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of x86_64")
    r = run(sandbox(box, svc, "read-only"), errno_of(call))
    assert r.stdout.text == f"{expected}\n", (name, r.stderr.text)


def _cgroup2_mount() -> str | None:
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if fields[2] == "cgroup2":
                return fields[1]
    return None


def clone3_into_cgroup(cgroup_dir: str, key: tuple[int, int, int, int]) -> str:
    """A command that clones itself into `cgroup_dir` with clone3 (CLONE_INTO_CGROUP),
    passing `key` in the four argument registers clone3 ignores; prints ok or the errno."""
    return py(f"""
        import ctypes, errno, os, struct
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        fd = os.open({cgroup_dir!r}, os.O_RDONLY | os.O_DIRECTORY)
        # flags CLONE_INTO_CGROUP, exit_signal SIGCHLD, cgroup fd (clone_args, 88 bytes)
        fields = (1 << 33, 0, 0, 0, 17, 0, 0, 0, 0, 0, fd)
        args = ctypes.create_string_buffer(struct.pack("11Q", *fields))
        key = [ctypes.c_uint64(k) for k in {list(key)!r}]
        r = libc.syscall(ctypes.c_long(435), args, ctypes.c_size_t(88), *key)
        if r == 0:
            os._exit(0)
        if r > 0:
            os.waitpid(r, 0)
        print("ok" if r > 0 else errno.errorcode[ctypes.get_errno()])
    """)


@needs_root
@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
def test_clone3_out_of_the_call_cgroup_is_refused_whatever_the_registers_hold(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    # The confined spawner's own filter allows clone3 only with its 256-bit key in the
    # registers clone3 ignores; its children inherit that filter. Attack first: unconfined,
    # the same call leaves the call's cgroup.
    root = _cgroup2_mount()
    if root is None or os.uname().machine != "x86_64":
        pytest.skip("needs cgroup2 and x86_64 syscall numbers")
    from shellseam import LocalShellExecutor

    local = LocalShellExecutor(cwd=box["ws"], service=svc)
    assert run(local, clone3_into_cgroup(root, (0, 0, 0, 0))).stdout.text == "ok\n"
    guesses = [(0, 0, 0, 0), (1, 2, 3, 4), (2**64 - 1,) * 4]
    guesses += [tuple(int.from_bytes(os.urandom(8), "little") for _ in range(4))]
    ex = sandbox(box, svc, mode)
    for key in guesses:
        r = run(ex, clone3_into_cgroup(root, key))  # type: ignore[arg-type]
        assert r.stdout.text == "ENOSYS\n", (key, r.stderr.text)


@pytest.mark.parametrize("protect", [True, False])
def test_nothing_of_the_spawner_thread_is_readable_from_a_confined_command(
    box: dict[str, str], svc: SubprocessService, protect: bool
) -> None:
    # Where the key could show: the harness's memory and the registers of a clone3 under
    # way (/proc/<pid>/task/<tid>/syscall). Landlock refuses a confined command any ptrace
    # access to the harness, dumpable or not; the command runs while other confined calls
    # are being spawned.
    ex = SandboxShellExecutor(
        mode="workspace-write", cwd=box["ws"], service=svc, protect_harness=protect
    )
    probe = py(f"""
        import glob
        pid = {os.getpid()}
        paths = glob.glob(f"/proc/{{pid}}/task/*/syscall") + [f"/proc/{{pid}}/mem",
            f"/proc/{{pid}}/maps", f"/proc/{{pid}}/syscall"]
        for _ in range(200):
            for path in paths:
                try:
                    with open(path, "rb") as f:
                        f.read(4096)
                    print("read", path)
                except OSError as err:
                    pass
        print("done")
    """)
    from shellseam import LocalShellExecutor

    # Attack first: an unconfined command of a root harness reads all of it.
    unconfined = run(LocalShellExecutor(cwd=box["ws"], service=svc), probe).stdout.text
    assert f"read /proc/{os.getpid()}/syscall\n" in unconfined or os.geteuid() != 0
    stop = threading.Event()

    def spawn_meanwhile() -> None:
        while not stop.is_set():
            run(ex, "true")

    helper = threading.Thread(target=spawn_meanwhile)
    helper.start()
    try:
        r = run(ex, probe)
    finally:
        stop.set()
        helper.join()
    assert r.stdout.text == "done\n", r.stdout.text


@needs_root
def test_trace_buffers_and_kernel_internals_are_unreadable(
    box: dict[str, str], svc: SubprocessService
) -> None:
    # Once anybody enables a syscall event, the trace buffer holds every process's syscall
    # arguments (the spawner's clone3 key among them); a root-uid command passes its
    # owner-only mode. Attack first: unconfined, it reads.
    trace = "/sys/kernel/tracing/trace"
    mounted = os.path.exists(trace)
    if not mounted:
        try:
            subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)
        except (OSError, subprocess.CalledProcessError):
            pytest.skip("no tracefs here")
    try:
        from shellseam import LocalShellExecutor

        # The trace buffer, and the kernel's address layout (root-only, like the rest of
        # /sys/kernel but mm).
        for path in (trace, "/sys/kernel/vmcoreinfo"):
            if not os.path.exists(path):
                continue
            read = f"head -c 64 {path} >/dev/null && echo read"
            local = LocalShellExecutor(cwd=box["ws"], service=svc)
            assert run(local, read).stdout.text == "read\n"
            for mode in ("workspace-write", "read-only"):
                r = run(sandbox(box, svc, mode), read)
                assert r.stdout.text == "" and "Permission denied" in r.stderr.text, mode
        for mode in ("workspace-write", "read-only"):
            r = run(sandbox(box, svc, mode), "cat /sys/kernel/mm/transparent_hugepage/enabled")
            assert r.exit_code == 0 or not os.path.exists("/sys/kernel/mm/transparent_hugepage")
    finally:
        if not mounted:
            subprocess.run(["umount", "/sys/kernel/tracing"], check=False)


PERF_SYSTEM_WIDE = """
    import ctypes, errno, struct
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # perf_event_attr: PERF_TYPE_SOFTWARE, size 128, PERF_COUNT_SW_CONTEXT_SWITCHES
    attr = ctypes.create_string_buffer(struct.pack("IIQ", 1, 128, 3) + bytes(112))
    fd = libc.syscall(298, attr, {pid}, 0, -1, 0)
    print("ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()])
"""


@needs_root
def test_perf_events_of_every_process_are_refused(
    box: dict[str, str], svc: SubprocessService
) -> None:
    # A system-wide event (pid -1) samples every process's registers and stacks, and the
    # kernel checks no ptrace access for it. Attack first, with the host allowing such
    # events: unconfined, it opens.
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of x86_64")
    knob = "/proc/sys/kernel/perf_event_paranoid"
    with open(knob) as f:
        saved = f.read()
    try:
        with open(knob, "w") as f:
            f.write("-1")
        from shellseam import LocalShellExecutor

        local = LocalShellExecutor(cwd=box["ws"], service=svc)
        assert run(local, py(PERF_SYSTEM_WIDE.format(pid=-1))).stdout.text == "ok\n"
        for mode in ("workspace-write", "read-only"):
            r = run(sandbox(box, svc, mode), py(PERF_SYSTEM_WIDE.format(pid=-1)))
            assert r.stdout.text == "EPERM\n", (mode, r.stderr.text)
            # Its own process may still be measured.
            assert (
                run(sandbox(box, svc, mode), py(PERF_SYSTEM_WIDE.format(pid=0))).stdout.text
                == "ok\n"
            )
    finally:
        with open(knob, "w") as f:
            f.write(saved)


def test_a_confined_command_carries_one_inherited_filter(
    box: dict[str, str], svc: SubprocessService
) -> None:
    # The spawner's keyed filter is the whole filter: a child installs no layer of its own
    # (each install costs a JIT compile, and a kworker's free at the child's exit).
    with open("/proc/thread-self/status") as f:
        mine = next(line for line in f if line.startswith("Seccomp_filters:"))
    r = run(sandbox(box, svc), "grep Seccomp_filters: /proc/self/status")
    assert r.stdout.text == f"Seccomp_filters:\t{int(mine.split()[1]) + 1}\n"


def _metadata(path: str) -> tuple[object, ...]:
    """What a metadata write could change: stat, xattrs, inode flags and generation."""
    st = os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        xattr = fcntl.ioctl(fd, 0x801C581F, bytes(28))  # FS_IOC_FSGETXATTR
        try:
            version = fcntl.ioctl(fd, 0x80087601, bytes(8))  # FS_IOC_GETVERSION
        except OSError:
            version = b""
    finally:
        os.close(fd)
    return (st.st_mode, st.st_uid, st.st_mtime_ns, os.listxattr(path), xattr, version)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        # file_setattr(AT_FDCWD, path, &file_attr{xflags=NODUMP}, 24, 0)
        (
            "file_setattr",
            "libc.syscall(469, -100, {f!r}, ctypes.create_string_buffer(b'\\x80', 24), 24, 0)",
        ),
        # setxattrat(AT_FDCWD, path, 0, name, &xattr_args{value, size=1}, 16)
        (
            "setxattrat",
            "libc.syscall(463, -100, {f!r}, 0, b'user.x', (ctypes.c_uint64 * 2)"
            "(ctypes.addressof(v := ctypes.create_string_buffer(b'1')), 1), 16)",
        ),
        ("removexattrat", "libc.syscall(466, -100, {f!r}, 0, b'user.keep')"),
        ("FS_IOC_SETVERSION", "libc.ioctl(libc.open({f!r}, 0), 0x40087602, {v})"),
        ("FS_IOC32_SETVERSION", "libc.ioctl(libc.open({f!r}, 0), 0x40047602, {v})"),
        ("EXT4_IOC_SETVERSION", "libc.ioctl(libc.open({f!r}, 0), 0x40086604, {v})"),
        ("EXT4_IOC32_SETVERSION", "libc.ioctl(libc.open({f!r}, 0), 0x40046604, {v})"),
        ("FS_IOC32_SETFLAGS", "libc.ioctl(libc.open({f!r}, 0), 0x40046602, {v})"),
    ],
)
def test_read_only_refuses_metadata_writes_through_newer_calls(
    box: dict[str, str], svc: SubprocessService, name: str, call: str
) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of x86_64")
    f = box["file"]
    with contextlib.suppress(OSError):  # a file system without user xattrs
        os.setxattr(f, "user.keep", b"1")
    before = _metadata(f)
    value = "ctypes.byref(ctypes.c_long(0x80))"
    r = run(sandbox(box, svc, "read-only"), errno_of(call.format(f=f.encode(), v=value)))
    assert r.stdout.text == "EPERM\n", (name, r.stderr.text)
    assert _metadata(f) == before


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_a_syscall_newer_than_the_filter_answers_enosys(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    """A syscall the filter cannot know (a future kernel's) never slips past it: ENOSYS, on
    which libc falls back to an older call the filter does judge."""
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of x86_64")
    for nr in (470, 511, 1000):
        r = run(sandbox(box, svc, mode), errno_of(f"libc.syscall({nr}, 0, 0, 0)"))
        assert r.stdout.text == "ENOSYS\n", (nr, r.stderr.text)


def _harness_children() -> set[int]:
    kids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
            kids.update(int(pid) for pid in f.read().split())
    return kids


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_clone_parent_makes_no_child_of_the_harness(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    """`clone(CLONE_PARENT)` makes a sibling of the shell, that is a child of the harness,
    which nobody reaps: a zombie per call, until the harness runs out of pids."""
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of x86_64")
    ex = sandbox(box, svc, mode)
    run(ex, "true")  # the service's keeper process, a child of the harness, starts now
    before = _harness_children()
    r = run(
        ex,
        py("""
            import ctypes, errno, os
            libc = ctypes.CDLL(None, use_errno=True)
            pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD)
            if pid == 0:
                os._exit(7)
            print(pid if pid < 0 else "made", errno.errorcode.get(ctypes.get_errno()))
        """),
    )
    time.sleep(0.2)
    stray = _harness_children() - before
    for pid in stray:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    assert stray == set()
    assert r.stdout.text == "-1 EPERM\n", r.stderr.text
    # fork, and clone without CLONE_PARENT, still make children of the command.
    r = run(
        ex,
        py("""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            pid = libc.syscall(56, 17, 0, 0, 0, 0)  # clone(SIGCHLD)
            if pid == 0:
                os._exit(3)
            print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            pid = os.fork()
            if pid == 0:
                os._exit(4)
            print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """),
    )
    assert r.stdout.text == "3\n4\n", r.stderr.text


def test_the_harness_cannot_be_traced_or_inspected(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc)
    me = os.getpid()
    for attack in (
        f"strace -p {me} -e trace=none -o /dev/null & sleep 0.5; kill $! 2>/dev/null; wait $!",
        f"readlink /proc/{me}/fd/0",
        f"cat /proc/{me}/fd/0 < /dev/null",
        f"cat /proc/{me}/environ",
        f"cat /proc/{me}/maps",
        f"head -c 16 /proc/{me}/mem",
        f"ls /proc/{me}/root/",
    ):
        r = run(ex, attack)
        assert r.exit_code != 0, (attack, r.stdout.text[:200])


def test_no_signal_leaves_the_domain(box: dict[str, str], svc: SubprocessService) -> None:
    """`kill -1` from a confined command reaches none of the harness's processes. SIGWINCH is
    ignored by default, so nothing else on the machine is hurt if this ever fails."""
    marker = os.path.join(box["base"], "winched")
    victim = subprocess.Popen(
        [
            PY,
            "-c",
            "import signal, time, sys\n"
            f"signal.signal(signal.SIGWINCH, lambda *a: open({marker!r}, 'w').close())\n"
            "print('ready', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert victim.stdout is not None and victim.stdout.readline() == b"ready\n"
        old = signal.signal(signal.SIGWINCH, lambda *a: open(marker + ".harness", "w").close())
        try:
            r = run(sandbox(box, svc), f"kill -WINCH -1; kill -WINCH {victim.pid} {os.getpid()}")
            time.sleep(0.2)
        finally:
            signal.signal(signal.SIGWINCH, old)
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr.text
        assert not os.path.exists(marker) and not os.path.exists(marker + ".harness")
    finally:
        victim.kill()
        victim.wait()


# -- file leases: no command stalls the harness ---------------------------------------------

LEASE_ALL = py("""
    import errno, fcntl, glob, os, signal, sys, time
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    held, refused = [], set()
    for path in sys.argv[1:]:
        for f in sorted(glob.glob(path)):
            try:
                fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
                held.append(fd)
            except OSError as e:
                refused.add(errno.errorcode[e.errno])
                os.close(fd)
    print(len(held), *sorted(refused), flush=True)
    if held:
        time.sleep(60)
""")


def _lease_targets(pattern_pid: int) -> list[str]:
    return [
        f"/sys/fs/cgroup/{h}/shellseam-{pattern_pid}-*/c*/*" for h in ("unified", "pids", "memory")
    ]


@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
def test_a_confined_command_cannot_take_a_file_lease(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    # A read lease on a file a command owns (a uid-0 command owns root's files, its
    # capabilities dropped or not) makes every open of that file for writing wait out
    # fs.lease-break-time (45 s): the harness's own opens of its pooled cgroups' files
    # included. Landlock has no hook for leases; the filter refuses F_SETLEASE.
    with open(os.path.join(box["ws"], "mine"), "w") as f:
        f.write("x\n")
    with open("/proc/sys/fs/leases-enable") as f:
        if f.read().strip() == "0":
            pytest.skip("file leases are disabled on this host")
    r = run(sandbox(box, svc, mode), f"{LEASE_ALL} {box['ws']}/mine")
    assert r.stdout.text.split("\n")[0] == "0 EPERM", r.stderr.text


@needs_root
@pytest.mark.parametrize("leaser", ["confined", "unconfined"])
def test_leases_on_the_pooled_cgroups_never_stall_a_call(
    box: dict[str, str], svc: SubprocessService, leaser: str
) -> None:
    # Attack found by the red team: a background command took read leases on the files of
    # the service's idle pooled cgroups; the next calls' setup opened them for writing and
    # hung 45 s each, spawner threads included, far past every timeout. Confined, the lease
    # is refused; an unconfined root command (which could move itself out of its cgroup
    # anyway, README) still gets its lease, and the harness's open fails at once instead.
    ex = sandbox(box, svc)
    spec = ex.resolve(ShellExecRequest(command="sleep 0.3; echo ran", timeout_ms=5000))

    async def burst(n: int) -> list[str]:
        results = await asyncio.gather(*(ex.run(spec) for _ in range(n)))
        return [r.stdout.text for r in results]

    assert asyncio.run(burst(6)) == ["ran\n"] * 6  # six cgroups in the pool, idle now
    targets = _lease_targets(os.getpid())
    if not any(glob.glob(t) for t in targets):
        pytest.skip("no cgroup per call on this host")
    if leaser == "confined":
        proc = ex.start(ex.resolve(ShellExecRequest(command=f"{LEASE_ALL} {' '.join(targets)}")))
        try:
            first = first_line(proc)
            assert first.startswith("0 EPERM"), first
            started = time.monotonic()
            assert asyncio.run(burst(6)) == ["ran\n"] * 6
            assert time.monotonic() - started < 10
        finally:
            proc.kill()
        return
    holder = subprocess.Popen(
        [*shlex.split(LEASE_ALL), *targets], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        held = holder.stdout.readline().split()
        assert held and int(held[0]) > 0, held
        started = time.monotonic()
        assert asyncio.run(burst(6)) == ["ran\n"] * 6
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()


# -- network=False: no way to a unix socket --------------------------------------------------


def no_network(box: dict[str, str], mode: str, network: bool = False) -> SandboxPolicy:
    return SandboxPolicy(mode=mode, workspace_root=box["ws"], network=network)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
@pytest.mark.parametrize(
    "attack",
    [
        "a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.sendto(b'leak', {path!r})",
        "a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.connect({path!r}); "
        "a.send(b'leak')",
        "a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET); a.connect({path!r})",
    ],
)
def test_no_socketpair_but_a_stream_one_reaches_a_pathname_socket(
    box: dict[str, str], svc: SubprocessService, mode: str, attack: str
) -> None:
    """An unconnected datagram socket from `socketpair` sends to any socket path it can see
    (`/dev/log`, an agent's datagram socket): without network only stream pairs are made."""
    path = os.path.join(box["base"], "srv.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        server.setblocking(False)
        r = run(
            sandbox(box, svc, mode),
            py(f"import socket; {attack.format(path=path)}"),
            sandbox_policy=no_network(box, mode),
        )
        assert r.exit_code != 0 and "Operation not permitted" in r.stderr.text, r.stderr.text
        with pytest.raises(BlockingIOError):
            server.recv(16)


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_stream_socketpair_works_and_reaches_nothing_else(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    path = os.path.join(box["base"], "srv.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        server.setblocking(False)
        r = run(
            sandbox(box, svc, mode),
            py(f"""
                import errno, socket
                kind = socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
                a, b = socket.socketpair(socket.AF_UNIX, kind)
                a.send(b"x"); print(b.recv(1))
                for attempt in (lambda: a.sendto(b"leak", {path!r}), lambda: a.connect({path!r})):
                    try:
                        attempt()
                    except OSError as e:
                        print(errno.errorcode[e.errno])
            """),
            sandbox_policy=no_network(box, mode),
        )
        assert r.stdout.text == "b'x'\nEISCONN\nEISCONN\n", r.stderr.text
        with pytest.raises(BlockingIOError):
            server.accept()


def test_with_network_a_datagram_socketpair_still_works(
    box: dict[str, str], svc: SubprocessService
) -> None:
    """network=True changes nothing: reaching a pathname unix socket stays possible there
    (documented; Landlock has no right for it)."""
    path = os.path.join(box["base"], "srv.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        server.settimeout(5)
        r = run(
            sandbox(box, svc, "read-only"),
            py(f"""
                import socket
                a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                a.sendto(b"hello", {path!r})
            """),
            sandbox_policy=no_network(box, "read-only", network=True),
        )
        assert r.exit_code == 0, r.stderr.text
        assert server.recv(16) == b"hello"


# -- devices: no terminal, keyboard, console or disk is readable -----------------------------


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_a_terminal_it_did_not_open_is_unreadable(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    """The harness's terminal (here a pty of the test's own) is readable by its user: a
    command that reads it takes what the user types, a password included."""
    master, slave = os.openpty()
    typist = threading.Timer(0.5, os.write, (master, b"hunter2\n"))
    try:
        name = os.ttyname(slave)
        typist.start()
        r = run(sandbox(box, svc, mode), f"timeout 3 head -n1 < {name}")
        typist.join()
        assert "hunter2" not in r.stdout.text
        assert r.exit_code != 0 and "Permission denied" in r.stderr.text, r.stderr.text
        # The keystrokes are still there, for the terminal's owner.
        readable, _, _ = select.select([slave], [], [], 2)
        assert readable and os.read(slave, 64) == b"hunter2\n"
    finally:
        typist.cancel()
        os.close(master)
        os.close(slave)


def _harness_can_open(dev: str) -> bool:
    try:
        os.close(os.open(dev, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_no_disk_console_or_input_device_is_readable(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    """Keystrokes (`/dev/input/event*`), the text of the consoles (`/dev/vcs*`) and raw disks
    are readable by their owner, root, without any capability."""
    candidates = (
        *("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/loop0"),
        *("/dev/vcs", "/dev/vcsa", "/dev/hwrng", *glob.glob("/dev/input/event*")[:2]),
    )
    devices = [d for d in candidates if _harness_can_open(d)]
    if not devices:
        pytest.skip("the harness can read none of the devices")
    ex = sandbox(box, svc, mode)
    for dev in devices:
        r = run(ex, f"timeout 2 head -c 1 {dev} | wc -c")
        assert "Permission denied" in r.stderr.text and r.stdout.text == "0\n", (dev, r.stderr)


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_the_devices_and_pipes_commands_use_still_work(
    box: dict[str, str], svc: SubprocessService, mode: str
) -> None:
    r = run(
        sandbox(box, svc, mode),
        "head -c 16 /dev/urandom | wc -c; head -c 4 /dev/random | wc -c; "
        "head -c 3 /dev/zero | wc -c; echo x > /dev/null; cat /dev/null; "
        "echo full > /dev/full || echo ENOSPC; ls /dev | grep -cx null; ls / | grep -cx usr; "
        "ls /dev/shm > /dev/null && echo shm; echo out > /dev/stdout; echo err > /dev/stderr; "
        "echo piped | cat /proc/self/fd/0; cat /dev/stdin <<< here; cat <(echo substituted)",
    )
    assert r.stdout.text == ("16\n4\n3\nENOSPC\n1\n1\nshm\nout\npiped\nhere\nsubstituted\n"), (
        r.stderr.text
    )
    assert r.stderr.text.endswith("err\n")


# -- what must keep working ------------------------------------------------------------------


def test_dev_shm_and_multiprocessing_work_in_workspace_write(
    box: dict[str, str], svc: SubprocessService
) -> None:
    r = run(
        sandbox(box, svc),
        py("""
            from multiprocessing import Pool
            if __name__ == "__main__":
                with Pool(2) as p:
                    print(p.map(abs, [-1, -2]))
        """),
    )
    assert (r.exit_code, r.stdout.text) == (0, "[1, 2]\n"), r.stderr.text
    r = run(sandbox(box, svc), "f=/dev/shm/shellseam-$$; echo x > $f && cat $f && rm $f")
    assert r.stdout.text == "x\n"
    assert run(sandbox(box, svc, "read-only"), "echo x > /dev/shm/shellseam-ro").exit_code != 0


def test_read_only_gets_a_private_tmpdir_for_here_docs(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc, "read-only")
    body = "x" * 100_000
    # (`touch` would fail: read-only refuses utime everywhere, its own TMPDIR included.)
    r = run(ex, f"cat <<EOF | wc -c\n{body}\nEOF\necho $TMPDIR; echo > $TMPDIR/s && echo ok")
    count, tmpdir, ok = r.stdout.text.split()
    assert (r.exit_code, count, ok) == (0, str(len(body) + 1), "ok")
    assert not os.path.exists(tmpdir), "removed when the call settled"
    assert os.path.dirname(tmpdir) == os.path.realpath(svc.spill_parent)
    # Every call has its own; nothing else became writable.
    second = run(ex, f"echo $TMPDIR; echo > {os.path.dirname(tmpdir)}/x").stdout.text.strip()
    assert second != tmpdir
    assert not os.path.exists(os.path.join(os.path.dirname(tmpdir), "x"))


def test_background_read_only_tmpdir_is_removed_when_settled(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc, "read-only")
    proc = ex.start(ex.resolve(ShellExecRequest(command="echo $TMPDIR; sleep 0.2")))
    assert proc.wait_sync(10)
    tmpdir = proc.read_output().delta.strip()
    deadline = time.monotonic() + 5
    while os.path.exists(tmpdir) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(tmpdir)


# Attack: a tree deeper than Python's recursion limit in the call's own $TMPDIR made the
# cleanup (shutil.rmtree) raise a bare RecursionError out of run_sync and leak the directory.
def test_a_very_deep_tree_in_the_private_tmpdir_is_removed(
    box: dict[str, str], svc: SubprocessService
) -> None:
    ex = sandbox(box, svc, "read-only")
    r = run(
        ex,
        "echo $TMPDIR; cd $TMPDIR; for i in $(seq 1500); do mkdir d && cd d; done; "
        "echo x > f; ln -s / up; echo built",
    )
    tmpdir, built = r.stdout.text.split()
    assert (r.exit_code, built) == (0, "built"), r.stderr.text
    assert not os.path.exists(tmpdir)
    assert os.path.isdir("/usr/bin")  # the symlink to / was removed, never followed


def test_remove_tree_never_follows_symlinks_and_never_raises(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "file").write_text("y")
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # deeper than PATH_MAX allows to name: built fd by fd
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.symlink(keep, "link", dir_fd=fd)
    os.close(fd)
    remove_tree(str(tree))
    assert not tree.exists()
    assert (keep / "precious").read_text() == "x"
    remove_tree(str(tree))  # gone already: nothing to do, no error
    (tmp_path / "plain").write_text("z")
    remove_tree(str(tmp_path / "plain"))  # a file: unlinked
    assert not (tmp_path / "plain").exists()


# Attack (red team, stop 17): a command still running while the harness removed a tree it
# could write moved the directory the walk was in to a shallower place; the walk climbed back
# up with "..", as many levels as it came down, out of the tree, and emptied every directory
# above it with the harness's rights (up to $HOME, or / under a root harness).
def test_remove_tree_never_climbs_out_of_a_tree_moved_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    (victim / "precious").mkdir(parents=True)
    (victim / "precious" / "f").write_text("keep")
    (victim / "top").write_text("keep")
    tree = victim / "tree"
    deep = tree / "d1" / "d2" / "d3"
    deep.mkdir(parents=True)
    (deep / "file").write_text("x")
    real_open = os.open
    moved: list[bool] = []

    def open_moving(path: object, flags: int, *args: object, **kw: object) -> int:
        # The command's move, at the worst moment: as the walk leaves d3 for "..".
        if path == ".." and not moved:
            moved.append(True)
            os.rename(deep, tree / "x")
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("shellseam.paths.os.open", open_moving)
    remove_tree(str(tree))
    monkeypatch.undo()
    assert moved
    assert (victim / "top").read_text() == "keep"
    assert (victim / "precious" / "f").read_text() == "keep"
    remove_tree(str(tree))  # what the stopped walk left goes on the next try
    assert not tree.exists()
    assert sorted(os.listdir(victim)) == ["precious", "top"]


def test_a_running_command_cannot_steer_its_tmpdir_cleanup_out_of_the_tree(
    box: dict[str, str],
) -> None:
    # Session containment: the daemon outlives the call (a cgroup would kill it before the
    # cleanup), as under an unprivileged harness, whose default this is.
    # The red team's end-to-end form: a setsid daemon of a read-only call renames the
    # directory the harness's $TMPDIR cleanup is emptying; the victim sits beside the spill
    # parent, outside every root the command may write.
    victim = os.path.join(box["base"], "s1", "s2", "s3", "victim")
    os.makedirs(os.path.join(victim, "spillp"))
    for i in range(5):
        with open(os.path.join(victim, f"precious{i}"), "w") as f:
            f.write("x")
    service = SubprocessService(spill_parent=os.path.join(victim, "spillp"))
    try:
        ex = SandboxShellExecutor(
            mode="read-only",
            cwd=box["ws"],
            grace_ms=300,
            service=service,
            containment="session",
        )
        daemon = os.path.join(box["base"], "daemon.py")
        with open(daemon, "w") as f:
            f.write(
                textwrap.dedent(
                    """
                    import os, time
                    t = os.environ["TMPDIR"]; d3 = t + "/d1/d2/d3"
                    try:
                        m = os.stat(d3).st_mtime_ns
                    except OSError:
                        raise SystemExit  # the walk already went past d3
                    end = time.monotonic() + 20
                    while time.monotonic() < end:
                        try:
                            if os.stat(d3).st_mtime_ns != m:
                                os.rename(d3, t + "/x")
                                break
                        except OSError:
                            break
                        time.sleep(0.0005)
                    """
                )
            )
        cmd = (
            "echo $TMPDIR; mkdir -p $TMPDIR/d1/d2/d3 && cd $TMPDIR/d1/d2/d3 && "
            + py("[open(str(i), 'w').close() for i in range(30000)]")
            + f" && setsid -f {sys.executable} {daemon}"
        )
        disturbed = 0
        for _ in range(3):  # the daemon must catch the walk inside d3: a race, retried
            r = ex.run_sync(ex.resolve(ShellExecRequest(command=cmd)))
            assert r.exit_code == 0, r.stderr.text
            time.sleep(1)
            tmpdir = r.stdout.text.strip()
            if os.path.exists(tmpdir):  # the walk stopped at the move, leaving the rest
                disturbed += 1
                shutil.rmtree(tmpdir)
                break
        assert disturbed, "the daemon never caught the cleanup inside d3"
        assert sorted(os.listdir(victim)) == [
            "precious0",
            "precious1",
            "precious2",
            "precious3",
            "precious4",
            "spillp",
        ]
    finally:
        service.dispose()
        subprocess.run(["pkill", "-f", daemon], check=False)


def test_caches_point_at_a_per_service_directory(
    box: dict[str, str], svc: SubprocessService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", os.path.join(box["base"], "real-cache"))
    ex = sandbox(box, svc)
    r = run(ex, 'echo "$XDG_CACHE_HOME $PIP_CACHE_DIR $npm_config_cache"; touch $PIP_CACHE_DIR/w')
    caches = r.stdout.text.split()
    assert r.exit_code == 0 and len(set(caches)) == 1
    assert caches[0] != os.path.join(box["base"], "real-cache")
    assert os.path.exists(os.path.join(caches[0], "w"))
    r = run(ex, "echo $PIP_CACHE_DIR", env={"PIP_CACHE_DIR": "/mine"})
    assert r.stdout.text == "/mine\n"
    free = SandboxPolicy(mode="danger-full-access", workspace_root=box["ws"])
    r = run(ex, "echo $XDG_CACHE_HOME", sandbox_policy=free)
    assert r.stdout.text == os.path.join(box["base"], "real-cache") + "\n"


@pytest.mark.parametrize("attack", ["rm -rf {c}", "rm -rf {c} && ln -s {protected} {c}"])
def test_removing_the_cache_dir_neither_blocks_nor_widens_later_calls(
    box: dict[str, str], svc: SubprocessService, attack: str
) -> None:
    ex = sandbox(box, svc)
    cache = run(ex, "echo $XDG_CACHE_HOME").stdout.text.strip()
    # The directory itself sits in the (read-only) spill parent: only its content goes.
    assert run(ex, attack.format(c=cache, **box)).exit_code != 0
    assert os.path.isdir(cache) and not os.path.islink(cache)
    # Removed from outside (a cleaner, the harness): the next call gets a fresh one.
    shutil.rmtree(cache)
    os.symlink(box["protected"], cache)
    r = run(ex, f"echo $XDG_CACHE_HOME; echo x > {box['protected']}/new; touch $XDG_CACHE_HOME/ok")
    fresh = r.stdout.text.split()[0]
    assert fresh != cache and os.path.exists(os.path.join(fresh, "ok"))
    assert unchanged(box)


def test_a_writable_root_made_after_the_first_call_is_granted_then(
    box: dict[str, str], svc: SubprocessService
) -> None:
    later = os.path.join(box["base"], "later")
    p = SandboxPolicy(mode="workspace-write", workspace_root=box["ws"], writable_roots=(later,))
    ex = sandbox(box, svc)
    assert run(ex, "true", sandbox_policy=p).exit_code == 0
    os.mkdir(later)
    assert run(ex, f"echo x > {later}/f", sandbox_policy=p).exit_code == 0
    assert run(ex, f"echo x > {box['protected']}/f", sandbox_policy=p).exit_code != 0


def test_git_cargo_style_writes_stay_in_the_workspace(
    box: dict[str, str], svc: SubprocessService
) -> None:
    r = run(
        sandbox(box, svc),
        "git init -q repo && cd repo && echo a > a && git add a && "
        "git -c user.email=a@b -c user.name=n commit -qm one && git log --oneline | wc -l",
    )
    assert (r.exit_code, r.stdout.text) == (0, "1\n"), r.stderr.text


# -- denial detection ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "stdout", "stderr", "denied"),
    [
        (1, "", "touch: cannot touch 'x': Permission denied\n", True),
        (1, "error: permission denied (os error 13)\n", "", True),  # 2>&1 | tail
        (1, "", "Error: EACCES: permission denied, open 'x'\n", True),  # node
        (101, "", "failed to write: Read-only file system\n", True),
        (1, "", "open x: operation not permitted\n", True),  # go
        (2, "", "EPERM\n", True),
        (126, "", "bash: line 1: ./script.sh: Permission denied\n", False),  # not executable
        (
            126,
            "",
            "touch: cannot touch 'y': Permission denied\nbash: ./s: Permission denied\n",
            True,
        ),
        (0, "", "Permission denied\n", False),  # it succeeded anyway
        (None, "", "Permission denied\n", False),  # killed by a signal
        (1, "", "no such file\n", False),
    ],
)
def test_denial_signatures(exit_code: int | None, stdout: str, stderr: str, denied: bool) -> None:
    assert is_denial(exit_code, stdout, stderr) is denied


def test_denial_seen_through_a_pipe(box: dict[str, str], svc: SubprocessService) -> None:
    r = run(
        sandbox(box, svc), f"touch {box['protected']}/x 2>&1 | tail -1; exit ${{PIPESTATUS[0]}}"
    )
    assert r.stderr.text == "" and r.sandbox is not None and r.sandbox.denied
    script = os.path.join(box["ws"], "script.sh")
    with open(script, "w") as f:
        f.write("echo hi\n")
    r = run(sandbox(box, svc), "./script.sh")
    assert r.exit_code == 126 and r.sandbox is not None and not r.sandbox.denied
