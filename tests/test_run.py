"""Foreground runs of LocalShellExecutor: results, timeouts, aborts, cancellation, disposal."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal as sig
import subprocess
import sys
import threading
import time

import pytest

from conftest import HELPERS, pids_in_group, run
from shellseam import (
    AbortController,
    LocalShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
)


def test_exit_code_and_streams(ex: LocalShellExecutor) -> None:
    r = run(ex, "echo out; echo err >&2; exit 2")
    assert (r.exit_code, r.signal, r.timed_out, r.aborted) == (2, None, False, False)
    assert r.stdout.text == "out\n" and r.stderr.text == "err\n"
    assert r.stdout.total_bytes == 4 and not r.stdout.truncated and r.stdout.spill_path is None
    assert r.timeout_ms == 120_000
    assert r.leftover_killed == 0 and r.sandbox is None
    assert r.duration_ms > 0


def test_each_call_is_a_fresh_non_login_shell(ex: LocalShellExecutor) -> None:
    run(ex, "cd /; export FOO=1")
    r = run(ex, 'echo "$PWD:${FOO-unset}"; shopt -q login_shell && echo login || echo nonlogin')
    assert r.stdout.text == f"{ex.cwd}:unset\nnonlogin\n"


def test_command_is_group_leader(ex: LocalShellExecutor) -> None:
    r = run(ex, "ps -o pid=,pgid= -p $$")
    pid, pgid = r.stdout.text.split()
    assert pid == pgid


def test_signal_death_reports_signal(ex: LocalShellExecutor) -> None:
    r = run(ex, "kill -KILL $$")
    assert (r.exit_code, r.signal, r.timed_out) == (None, "SIGKILL", False)


def test_stdin_bytes_then_eof(ex: LocalShellExecutor) -> None:
    assert run(ex, "cat", stdin="héllo").stdout.text == "héllo"
    assert run(ex, "wc -c", stdin=b"\x00\x01\x02").stdout.text.strip() == "3"
    assert run(ex, "cat").stdout.text == ""  # None: empty stdin, immediate EOF


def test_child_that_never_reads_stdin_is_not_an_error(ex: LocalShellExecutor) -> None:
    r = run(ex, "exit 0", stdin=b"x" * (8 << 20))
    assert r.exit_code == 0


def test_large_stdin_is_streamed(ex: LocalShellExecutor) -> None:
    data = os.urandom(3 << 20)
    r = run(ex, "sha256sum", stdin=data)
    import hashlib

    assert r.stdout.text.split()[0] == hashlib.sha256(data).hexdigest()


def test_timeout_kills_the_group(ex: LocalShellExecutor) -> None:
    t0 = time.monotonic()
    r = run(ex, "sleep 30 & sleep 30", timeout_ms=200)
    assert time.monotonic() - t0 < 5
    assert r.timed_out and not r.aborted
    assert r.signal == "SIGTERM" and r.exit_code is None
    assert r.timeout_ms == 200


def test_trapping_term_and_exiting_zero_still_reports_timeout(ex: LocalShellExecutor) -> None:
    r = run(ex, f"exec {sys.executable} {HELPERS}/ignore_term.py exit0", timeout_ms=500)
    assert r.timed_out and r.exit_code == 0 and r.signal is None


def test_ignoring_term_escalates_to_kill(ex: LocalShellExecutor) -> None:
    t0 = time.monotonic()
    r = run(ex, f"exec {sys.executable} {HELPERS}/ignore_term.py", timeout_ms=500)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.signal == "SIGKILL"
    assert 0.5 + 0.3 <= elapsed < 5  # timeout, then grace_ms before SIGKILL
    assert r.stdout.text == "ready\n"


def test_pre_aborted_signal_spawns_nothing(ex: LocalShellExecutor, tmp_path: object) -> None:
    c = AbortController()
    c.abort("stop")
    marker = os.path.join(ex.cwd, "ran")
    r = run(ex, f"touch {marker}", signal=c.signal)
    assert r.aborted and not r.timed_out
    assert (r.exit_code, r.signal) == (None, None)
    assert r.stdout.text == "" and r.stderr.text == ""
    assert not os.path.exists(marker)


def test_abort_during_run(ex: LocalShellExecutor) -> None:
    c = AbortController()
    threading.Timer(0.2, c.abort).start()
    r = run(ex, "sleep 30", signal=c.signal)
    assert r.aborted and not r.timed_out and r.signal == "SIGTERM"


def test_first_cause_wins_and_is_the_only_one(ex: LocalShellExecutor) -> None:
    c = AbortController()
    # The timeout fires first; a later abort must not flip the classification.
    threading.Timer(0.6, c.abort).start()
    r = run(ex, f"exec {sys.executable} {HELPERS}/ignore_term.py", timeout_ms=200, signal=c.signal)
    assert r.timed_out and not r.aborted


def test_async_run_and_abort() -> None:
    async def main() -> None:
        svc = SubprocessService()
        ex = LocalShellExecutor(service=svc, grace_ms=300)
        r = await ex.run(ex.resolve(ShellExecRequest(command="echo hi")))
        assert r.stdout.text == "hi\n" and r.exit_code == 0
        c = AbortController()
        asyncio.get_running_loop().call_later(0.1, c.abort)
        r = await ex.run(ex.resolve(ShellExecRequest(command="sleep 30", signal=c.signal)))
        assert r.aborted and r.signal == "SIGTERM"
        r = await ex.run(ex.resolve(ShellExecRequest(command="sleep 30", timeout_ms=100)))
        assert r.timed_out
        await svc.aclose()

    asyncio.run(main())


def test_cancelling_run_kills_then_reraises() -> None:
    async def main() -> None:
        svc = SubprocessService()
        ex = LocalShellExecutor(service=svc, grace_ms=300)
        spec = ex.resolve(ShellExecRequest(command="echo $$; sleep 30"))
        task = asyncio.ensure_future(ex.run(spec))
        await asyncio.sleep(0.3)
        assert svc.running == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert svc.running == 0  # reaped before CancelledError surfaced
        svc.dispose()

    asyncio.run(main())


def test_dispose_during_run_returns_killed_result() -> None:
    svc = SubprocessService()
    ex = LocalShellExecutor(service=svc, grace_ms=300)
    spec = ex.resolve(ShellExecRequest(command="sleep 30"))
    threading.Timer(0.2, svc.dispose).start()
    r = ex.run_sync(spec)
    assert r.signal == "SIGTERM" and not r.timed_out and not r.aborted
    with pytest.raises(ShellError) as info:
        ex.run_sync(spec)
    assert info.value.code == "DISPOSED"


def test_missing_workdir_is_spawn_failed(ex: LocalShellExecutor) -> None:
    with pytest.raises(ShellError) as info:
        run(ex, "true", workdir="/definitely/not/here")
    assert info.value.code == "SPAWN_FAILED"
    assert "/definitely/not/here" in info.value.reason
    assert "No such file or directory" in info.value.reason


def test_relative_workdir(ex: LocalShellExecutor) -> None:
    os.mkdir(os.path.join(ex.cwd, "sub"))
    assert run(ex, "pwd", workdir="sub").stdout.text == os.path.join(ex.cwd, "sub") + "\n"


def test_invalid_utf8_and_binary_output(ex: LocalShellExecutor) -> None:
    r = run(ex, r"printf 'a\xffb\xc3'; printf '\x00z'")
    assert r.stdout.text == "a\ufffdb\ufffd\x00z"
    assert r.stdout.total_bytes == 6


def test_output_beyond_cap_spills_complete_stream(ex: LocalShellExecutor) -> None:
    r = run(ex, "seq 1 100000")
    expected = "".join(f"{i}\n" for i in range(1, 100001)).encode()
    assert r.stdout.truncated and not r.stdout.spill_truncated
    assert r.stdout.total_bytes == len(expected)
    assert r.stdout.text.encode() == expected[-64_000:]
    assert r.stdout.spill_path is not None
    with open(r.stdout.spill_path, "rb") as f:
        assert f.read() == expected
    st = os.stat(r.stdout.spill_path)
    assert st.st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(r.stdout.spill_path)).st_mode & 0o777 == 0o700


def test_spill_is_capped_and_flagged(service: SubprocessService) -> None:
    ex = LocalShellExecutor(max_output_bytes=1000, max_spill_bytes=5000, service=service)
    r = run(ex, "head -c 20000 /dev/zero | tr '\\0' x")
    assert r.stdout.truncated and r.stdout.spill_truncated
    assert r.stdout.total_bytes == 20000 and r.stdout.text == "x" * 1000
    assert r.stdout.spill_path is not None and os.path.getsize(r.stdout.spill_path) == 5000


def test_stdout_max_bytes_raises_foreground_budget(ex: LocalShellExecutor) -> None:
    r = run(ex, "seq 1 100000", stdout_max_bytes=1_000_000)
    assert not r.stdout.truncated and r.stdout.text.endswith("100000\n")


def test_tail_never_starts_inside_a_code_point(service: SubprocessService) -> None:
    ex = LocalShellExecutor(max_output_bytes=8, service=service)
    r = run(ex, "printf 'aaaaaaaaa€€€'")  # 9 + 9 bytes; the last 8 start inside a €
    assert r.stdout.truncated and r.stdout.text == "€€"


def test_spill_files_removed_on_dispose_unless_kept() -> None:
    for keep in (False, True):
        svc = SubprocessService(keep_spill=keep)
        ex = LocalShellExecutor(max_output_bytes=10, service=svc)
        r = run(ex, "seq 1 1000")
        assert r.stdout.spill_path is not None
        try:
            svc.dispose()
            assert os.path.exists(r.stdout.spill_path) == keep
        finally:  # what was kept is the test's to remove
            shutil.rmtree(os.path.dirname(r.stdout.spill_path), ignore_errors=True)


def test_leftover_holding_pipes_is_drained_then_killed(ex: LocalShellExecutor) -> None:
    t0 = time.monotonic()
    r = run(ex, f"{sys.executable} {HELPERS}/grandchild_holds_pipe.py")
    elapsed = time.monotonic() - t0
    assert r.exit_code == 0
    assert "parent done\n" in r.stdout.text and "grandchild " in r.stdout.text
    assert r.leftover_killed == 1
    assert 0.3 <= elapsed < 5  # waited the drain grace, then terminated
    grandchild = int(r.stdout.text.split("grandchild ")[1].split()[0])
    assert not os.path.exists(f"/proc/{grandchild}") or pids_in_group(grandchild) == []


def test_background_job_not_holding_pipes_is_terminated(ex: LocalShellExecutor) -> None:
    r = run(ex, "sleep 100 >/dev/null 2>&1 & echo $!")
    assert r.leftover_killed == 1
    pid = int(r.stdout.text)
    assert pids_in_group(pid) == [] and r.exit_code == 0


def test_command_closing_stdout_early(ex: LocalShellExecutor) -> None:
    r = run(ex, "exec >&-; sleep 0.1; echo late >&2")
    assert r.exit_code == 0 and r.stderr.text == "late\n"


def test_sigpipe_default_in_child(ex: LocalShellExecutor) -> None:
    # CPython ignores SIGPIPE; a child inheriting that would loop forever in `yes`.
    r = run(ex, "yes | head -n 2", timeout_ms=10_000)
    assert r.stdout.text == "y\ny\n" and not r.timed_out


def test_no_signal_blocked_or_ignored_in_child(ex: LocalShellExecutor) -> None:
    r = run(ex, "grep -E '^Sig(Blk|Ign)' /proc/self/status")
    assert r.stdout.text == "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"


def test_no_harness_fd_leaks(ex: LocalShellExecutor, tmp_path: object) -> None:
    leaked = os.open("/etc/hostname", os.O_RDONLY)  # deliberately inheritable
    os.set_inheritable(leaked, True)
    try:
        r = run(ex, "ls /proc/self/fd")
    finally:
        os.close(leaked)
    # 0-2 plus the fd ls uses to read the directory itself.
    fds = sorted(int(x) for x in r.stdout.text.split())
    assert fds[:3] == [0, 1, 2] and len(fds) <= 4


def test_fork_many_children_all_terminated(ex: LocalShellExecutor) -> None:
    r = run(ex, f"{sys.executable} {HELPERS}/fork_many.py 300; echo $$")
    assert r.leftover_killed == 300
    assert pids_in_group(int(r.stdout.text.split()[-1])) == []


def test_gigabyte_of_output_is_bounded(ex: LocalShellExecutor) -> None:
    r = run(ex, "head -c 1G /dev/zero", timeout_ms=120_000)
    assert r.exit_code == 0 and r.stdout.total_bytes == 1 << 30
    assert r.stdout.truncated and len(r.stdout.text) == 64_000
    assert r.stdout.spill_path is not None
    assert os.path.getsize(r.stdout.spill_path) == 64 * 2**20 and r.stdout.spill_truncated


def test_dispose_keep_spill_argument_overrides_the_service_setting() -> None:
    svc = SubprocessService()
    ex = LocalShellExecutor(max_output_bytes=10, service=svc)
    r = run(ex, "seq 1 100")
    assert r.stdout.spill_path is not None
    svc.dispose(keep_spill=True)
    assert os.path.exists(r.stdout.spill_path)
    os.unlink(r.stdout.spill_path)
    os.rmdir(os.path.dirname(r.stdout.spill_path))


def test_pre_aborted_call_after_dispose_raises_disposed() -> None:
    svc = SubprocessService()
    ex = LocalShellExecutor(service=svc)
    c = AbortController()
    c.abort()
    spec = ex.resolve(ShellExecRequest(command="true", signal=c.signal))
    svc.dispose()
    with pytest.raises(ShellError) as info:
        ex.run_sync(spec)
    assert info.value.code == "DISPOSED"


@pytest.mark.parametrize("containment", ["auto", "session"])
def test_no_disposition_of_the_harness_reaches_the_child(
    service: SubprocessService, tmp_path: os.PathLike[str], containment: str
) -> None:
    # Cloned with CLONE_CLEAR_SIGHAND (clone3, with or without a cgroup), the kernel resets
    # the handlers and the child resets only what the harness ignores; a kernel without it
    # makes the child reset everything. Either way the command starts with every signal at
    # SIG_DFL.
    rt = sig.SIGRTMIN + 3
    saved = {s: sig.getsignal(s) for s in (sig.SIGUSR1, sig.SIGUSR2, sig.SIGWINCH, rt)}
    sig.signal(sig.SIGUSR1, sig.SIG_IGN)
    sig.signal(sig.SIGWINCH, sig.SIG_IGN)
    sig.signal(rt, sig.SIG_IGN)
    sig.signal(sig.SIGUSR2, lambda *_: None)
    try:
        ex = LocalShellExecutor(cwd=str(tmp_path), service=service, containment=containment)
        r = run(ex, "cat /proc/self/status")  # cat installs no handler of its own
    finally:
        for s, handler in saved.items():
            sig.signal(s, handler)
    masks = [
        line
        for line in r.stdout.text.splitlines()
        if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
    ]
    assert masks == [f"{name}:\t{0:016x}" for name in ("SigBlk", "SigIgn", "SigCgt")]


def test_a_signal_ignored_between_two_bursts_is_reset_in_the_second(
    service: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    # Queued spawns share one read of the ignored signals when it began after they were
    # queued: a disposition set before a run is queued is never served from an older read.
    ex = LocalShellExecutor(cwd=str(tmp_path), service=service)
    spec = ex.resolve(ShellExecRequest(command="grep ^SigIgn /proc/self/status"))
    clean = f"SigIgn:\t{0:016x}\n"
    saved = sig.getsignal(sig.SIGUSR1)

    async def burst() -> list[str]:
        return [r.stdout.text for r in await asyncio.gather(*(ex.run(spec) for _ in range(24)))]

    async def main() -> tuple[list[str], list[str]]:
        # Something running, so that every run goes through the spawner threads.
        keep = ex.start(ex.resolve(ShellExecRequest(command="sleep 5")))
        try:
            first = await burst()
            sig.signal(sig.SIGUSR1, sig.SIG_IGN)
            second = await burst()
        finally:
            keep.kill()
        return first, second

    try:
        first, second = asyncio.run(main())
    finally:
        sig.signal(sig.SIGUSR1, saved)
    assert first == [clean] * 24
    assert second == [clean] * 24


@pytest.mark.parametrize("containment", ["auto", "session"])
def test_a_forked_harness_resets_its_own_ignored_signals(
    tmp_path: os.PathLike[str], containment: str
) -> None:
    # The ignored signals are read from the process's status file, through an fd held
    # once opened: a forked copy of the harness must read its own, not its parent's.
    svc = SubprocessService()
    ex = LocalShellExecutor(cwd=str(tmp_path), service=svc, containment=containment)
    try:
        assert run(ex, "true").exit_code == 0  # the parent's status fd is open now
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                sig.signal(sig.SIGUSR2, sig.SIG_IGN)  # ignored in the copy only
                child_svc = SubprocessService()
                child = LocalShellExecutor(
                    cwd=str(tmp_path), service=child_svc, containment=containment
                )
                out = run(child, "grep SigIgn /proc/self/status").stdout.text
                child_svc.dispose()
                os.write(w, out.encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            got = f.read()
        os.waitpid(pid, 0)
        assert got == f"SigIgn:\t{0:016x}\n"
    finally:
        svc.dispose()


CLONE3_REFUSED = r"""
import ctypes, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
# A container runtime's filter without clone3 (it answers ENOSYS, so that glibc's own
# threads fall back to clone).
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, ENOSYS, NR_CLONE3 = 0x7FFF0000, 0x00050000, 38, 435
prog = [
    (BPF_LD_W_ABS, 0, 0, 0),
    (BPF_JEQ_K, 0, 1, NR_CLONE3),
    (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
    (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
]
raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
buf = ctypes.create_string_buffer(raw)
fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
fbuf = ctypes.create_string_buffer(fprog)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.addressof(fbuf), 0, 0) == 0, ctypes.get_errno()  # SECCOMP
assert libc.syscall(NR_CLONE3, 0, 0) == -1 and ctypes.get_errno() == ENOSYS
from shellseam import LocalShellExecutor, ShellExecRequest
for mode in ("session", "auto"):
    ex = LocalShellExecutor(containment=mode, cwd="/")
    r = ex.run_sync(ex.resolve(ShellExecRequest(command="echo $0 ok")))
    r2 = ex.run_sync(ex.resolve(ShellExecRequest(command="cat /proc/self/status")))
    masks = [x for x in r2.stdout.text.splitlines() if x.startswith(("SigIgn", "SigCgt"))]
    print(mode, r.exit_code, r.stdout.text.strip(), masks)
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the filter's syscall number")
def test_without_clone3_every_spawn_falls_back_to_clone() -> None:
    # Every child is cloned with clone3 when the kernel has it (CLONE_CLEAR_SIGHAND, and
    # CLONE_INTO_CGROUP with a cgroup); where clone3 answers ENOSYS, spawns use clone,
    # with a cgroup joined by the child itself, and the handlers reset one by one.
    out = subprocess.run(
        [sys.executable, "-c", CLONE3_REFUSED], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    masks = r"['SigIgn:\t0000000000000000', 'SigCgt:\t0000000000000000']"
    assert out.stdout == f"session 0 bash ok {masks}\nauto 0 bash ok {masks}\n"
