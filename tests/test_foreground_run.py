"""A foreground run in one native call (``SubprocessService.run_shell``, behind ``run_sync``).

The calling thread drives its process from the spawn on, so the command's pipes and pidfd
join the supervisor's epoll set only when the caller hands them over. What users rely on:
exact output and status, the timeout and its kill, a background holder of the pipes still
drained and killed by the supervisor, stdin larger than a pipe still fed, a
KeyboardInterrupt that leaves nothing running, and a resolved spec checked again whenever
its values are not the ones ``resolve`` checked."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import threading
import time

import pytest

from shellseam import (
    LocalShellExecutor,
    ResourceLimits,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
    _core,
)
from shellseam.types import ShellRunResult

LIMITS = ResourceLimits()


def _run(
    service: SubprocessService, command: str, *, stdin: bytes = b"", timeout_ms: int = 30_000
) -> ShellRunResult:
    env = _core.Env.from_pairs([(b"PATH", os.environ.get("PATH", "/usr/bin:/bin").encode())])
    template = service.shell_template(b"/bin/bash", b"bash", 1 << 20, 1 << 30, 300, True)
    return service.run_shell(
        template, command.encode(), "/", env, stdin, 1 << 20, None, LIMITS, timeout_ms
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_output_and_status_are_exact(service: SubprocessService) -> None:
    cmd = (
        "for i in $(seq 1 30); do head -c 30000 /dev/zero | tr '\\0' o; "
        "head -c 20000 /dev/zero | tr '\\0' e >&2; done; exit 7"
    )
    result = _run(service, cmd)
    assert result.exit_code == 7 and result.signal is None and not result.timed_out
    assert result.stdout.total_bytes == 30 * 30000
    assert result.stderr.total_bytes == 30 * 20000
    assert set(result.stdout.text) == {"o"} and set(result.stderr.text) == {"e"}
    assert result.sandbox is None


def test_the_timeout_kills_the_group(service: SubprocessService) -> None:
    started = time.monotonic()
    result = _run(service, "echo $$; exec sleep 30", timeout_ms=300)
    assert time.monotonic() - started < 10
    assert result.timed_out and result.signal == "SIGTERM"
    assert not _alive(int(result.stdout.text))


def test_a_background_holder_of_the_pipes_is_left_to_the_supervisor(
    service: SubprocessService,
) -> None:
    # The leader exits while a child still holds stdout: the pipes (never in the epoll set
    # until now) go to the supervisor, whose drain grace and leftover kill end the call.
    result = _run(service, "(sleep 5; echo late) & echo early")
    assert result.stdout.text == "early\n"
    assert result.leftover_killed == 2  # the subshell and its sleep


def test_stdin_larger_than_a_pipe_is_still_fed(service: SubprocessService) -> None:
    # What does not fit at once needs the supervisor's EPOLLOUT: such a call is registered
    # from the start instead of deferred.
    data = os.urandom(3 << 20)
    result = _run(service, "sha256sum | cut -d' ' -f1", stdin=data)
    assert result.stdout.text.strip() == hashlib.sha256(data).hexdigest()


def test_a_keyboard_interrupt_leaves_nothing_running(
    service: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    marker = os.path.join(tmp_path, "pid")
    main = threading.get_ident()

    def interrupt() -> None:
        deadline = time.monotonic() + 10
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        _run(service, f"echo $$ > {marker}.tmp && mv {marker}.tmp {marker}; exec sleep 30")
    with open(marker) as f:
        pid = int(f.read())
    assert not _alive(pid)
    assert service.running == 0


def test_a_run_sync_then_a_background_start_share_one_service(
    service: SubprocessService, tmp_path: os.PathLike[str]
) -> None:
    # A deferred registration must not disturb the supervisor's own processes.
    ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=300, service=service)
    handle = ex.start(ex.resolve(ShellExecRequest(command="sleep 0.3; echo bg")))
    fg = ex.run_sync(ex.resolve(ShellExecRequest(command="echo fg")))
    assert fg.stdout.text == "fg\n"
    assert handle.wait_sync(10)
    assert handle.read_output().delta == "bg\n"


# -- a resolved spec is checked again when its values changed --------------------------


def test_a_resolved_spec_changed_behind_the_frozen_dataclass_is_checked(
    ex: LocalShellExecutor,
) -> None:
    spec = ex.resolve(ShellExecRequest(command="true"))
    assert ex.run_sync(spec).exit_code == 0
    object.__setattr__(spec, "timeout_ms", -1)
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec)
    assert err.value.code == "INVALID_REQUEST"
    assert "timeout_ms" in err.value.reason


def test_a_replaced_spec_is_checked(ex: LocalShellExecutor) -> None:
    spec = ex.resolve(ShellExecRequest(command="true"))
    bad = dataclasses.replace(spec, command="echo \0")
    with pytest.raises(ShellError) as err:
        ex.run_sync(bad)
    assert err.value.code == "INVALID_REQUEST"


def test_an_env_mapping_changed_after_resolve_is_checked(ex: LocalShellExecutor) -> None:
    env = {"GREETING": "hi"}
    spec = ex.resolve(ShellExecRequest(command="echo $GREETING", env=env))
    assert ex.run_sync(spec).stdout.text == "hi\n"
    env["BAD=NAME"] = "x"
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec)
    assert err.value.code == "INVALID_REQUEST"


# -- the harness's environment, as each call sees it -----------------------------------


def test_every_change_of_the_harness_environment_is_seen(
    ex: LocalShellExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The environment cache compares the objects of os.environ, not their bytes: a value
    # replaced by an equal one, by another of the same length, or removed and put back,
    # must each give the child exactly what os.environ holds.
    spec = ex.resolve(ShellExecRequest(command="printf '%s|' \"${SS_PROBE-unset}\""))
    seen = []
    monkeypatch.setenv("SS_PROBE", "aaaa")
    seen.append(ex.run_sync(spec).stdout.text)
    monkeypatch.setenv("SS_PROBE", "aaaa")
    seen.append(ex.run_sync(spec).stdout.text)
    monkeypatch.setenv("SS_PROBE", "bbbb")
    seen.append(ex.run_sync(spec).stdout.text)
    monkeypatch.delenv("SS_PROBE")
    seen.append(ex.run_sync(spec).stdout.text)
    monkeypatch.setenv("SS_PROBE", "bbbb")
    seen.append(ex.run_sync(spec).stdout.text)
    assert seen == ["aaaa|", "aaaa|", "bbbb|", "unset|", "bbbb|"]


# -- a confined foreground run waits on its pipes before the spawner's answer ----------


@pytest.fixture
def sandboxed(service: SubprocessService, tmp_path: os.PathLike[str]) -> SandboxShellExecutor:
    return SandboxShellExecutor(
        mode="workspace-write", cwd=str(tmp_path), grace_ms=300, service=service
    )


def _sb(ex: SandboxShellExecutor, command: str, **fields: object) -> ShellRunResult:
    return ex.run_sync(ex.resolve(ShellExecRequest(command=command, **fields)))  # type: ignore[arg-type]


def test_confined_stdin_is_closed_at_once_without_input(sandboxed: SandboxShellExecutor) -> None:
    r = _sb(sandboxed, "read -r line; echo rc=$?; cat; echo end")
    assert r.stdout.text == "rc=1\nend\n" and r.exit_code == 0


def test_confined_stdin_is_fed(sandboxed: SandboxShellExecutor) -> None:
    data = "".join(f"line {i}\n" for i in range(20_000))  # more than a pipe holds
    r = _sb(sandboxed, "wc -l", stdin=data)
    assert r.stdout.text.strip() == "20000"


def test_confined_output_after_a_silent_start_is_whole(sandboxed: SandboxShellExecutor) -> None:
    # Silent past the first wait on the pipes, then output on both streams.
    r = _sb(sandboxed, "sleep 0.05; printf out; printf err >&2; exit 4")
    assert (r.stdout.text, r.stderr.text, r.exit_code) == ("out", "err", 4)


def test_confined_leader_exit_with_a_silent_holder(sandboxed: SandboxShellExecutor) -> None:
    started = time.monotonic()
    r = _sb(sandboxed, "sleep 30 &")
    assert time.monotonic() - started < 10
    assert r.exit_code == 0 and r.leftover_killed == 1


def test_confined_timeout(sandboxed: SandboxShellExecutor) -> None:
    r = _sb(sandboxed, "sleep 30", timeout_ms=200)
    assert r.timed_out and r.signal == "SIGTERM"


def test_confined_spawn_failure_is_reported(
    sandboxed: SandboxShellExecutor, tmp_path: os.PathLike[str]
) -> None:
    gone = os.path.join(tmp_path, "gone")
    os.mkdir(gone)
    spec = sandboxed.resolve(ShellExecRequest(command="true", workdir=gone))
    os.rmdir(gone)
    with pytest.raises(ShellError) as err:
        sandboxed.run_sync(spec)
    assert err.value.code == "SPAWN_FAILED"


# -- found by this stop's review ------------------------------------------------------------


def test_an_interrupt_during_the_timeouts_kill_still_waits_for_the_end(
    tmp_path: os.PathLike[str],
) -> None:
    # The timeout has fired and the command ignores SIGTERM: an interrupt in the grace
    # period must not return while the command still runs (its SIGKILL comes at the grace).
    service = SubprocessService()
    ex = LocalShellExecutor(cwd=str(tmp_path), grace_ms=1500, service=service)
    marker = os.path.join(tmp_path, "pid")
    main = threading.get_ident()

    def interrupt() -> None:
        time.sleep(0.8)  # past the 300 ms timeout, inside the 1.5 s grace
        signal.pthread_kill(main, signal.SIGINT)

    spec = ex.resolve(
        ShellExecRequest(
            command=f"trap '' TERM; echo $$ > {marker}; while :; do sleep 0.05; done",
            timeout_ms=300,
        )
    )
    threading.Thread(target=interrupt).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ex.run_sync(spec)
        with open(marker) as f:
            pid = int(f.read())
        assert not _alive(pid)
    finally:
        service.dispose()


def test_a_field_swapped_for_an_equal_value_of_another_type_is_checked(
    ex: LocalShellExecutor,
) -> None:
    spec = ex.resolve(ShellExecRequest(command="true"))
    object.__setattr__(spec, "timeout_ms", float(spec.timeout_ms))
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec)
    assert err.value.code == "INVALID_REQUEST"


def test_containment_changed_after_a_run_is_followed(ex: LocalShellExecutor) -> None:
    spec = ex.resolve(ShellExecRequest(command="cat /proc/self/cgroup"))
    assert "/shellseam-" in ex.run_sync(spec).stdout.text
    ex.containment = "session"
    assert "/shellseam-" not in ex.run_sync(spec).stdout.text


def test_output_settings_changed_after_a_run_are_followed(ex: LocalShellExecutor) -> None:
    spec = ex.resolve(ShellExecRequest(command="printf 0123456789; printf abcdefghij >&2"))
    first = ex.run_sync(spec)
    assert (first.stdout.text, first.stderr.text) == ("0123456789", "abcdefghij")
    ex.max_output_bytes = 4  # the stderr cap; stdout's comes with the spec
    ex.max_spill_bytes = 6
    second = ex.run_sync(spec)
    assert second.stderr.text == "ghij" and second.stderr.truncated
    assert second.stderr.spill_path is not None
    with open(second.stderr.spill_path, "rb") as f:
        assert f.read() == b"abcdef"
    assert second.stderr.spill_truncated and second.stderr.total_bytes == 10


def test_a_mutable_environment_entry_is_never_served_stale(ex: LocalShellExecutor) -> None:
    import posix

    value = bytearray(b"one")
    posix.environ[b"SS_MUTABLE"] = value  # type: ignore[assignment]
    spec = ex.resolve(ShellExecRequest(command="printf '%s' \"$SS_MUTABLE\""))
    seen = []
    try:
        for text in (b"one", b"two"):
            value[:] = text
            try:
                seen.append(ex.run_sync(spec).stdout.text)
            except TypeError:
                seen.append(None)  # refused, as a non-bytes entry always was
    finally:
        del posix.environ[b"SS_MUTABLE"]
    assert seen[1] in ("two", None)


def test_a_long_command_runs_in_the_foreground_call(ex: LocalShellExecutor) -> None:
    # Beyond one argument's limit the shell reads the command from a sealed memfd, in the
    # same one native call.
    filler = "#" + "x" * (300 * 1024) + "\n"
    r = ex.run_sync(ex.resolve(ShellExecRequest(command=filler + "echo $0 done")))
    assert r.stdout.text == "bash done\n" and r.exit_code == 0


def test_bytes_stdin_of_a_bytes_subclass_is_passed(ex: LocalShellExecutor) -> None:
    class Payload(bytes):
        pass

    r = ex.run_sync(ex.resolve(ShellExecRequest(command="cat", stdin=Payload(b"kept"))))
    assert r.stdout.text == "kept"


@pytest.mark.parametrize("cap", [(6 << 20) + 777, 64 << 20])
def test_a_large_spill_holds_the_exact_head_of_the_stream(
    ex: LocalShellExecutor, tmp_path: os.PathLike[str], cap: int
) -> None:
    # Past its first MiBs a spill file is written uncached in aligned blocks, its last
    # partial block padded and the file cut back: every byte must still be the stream's.
    data = os.urandom((9 << 20) + 4321)
    src = os.path.join(tmp_path, "src.bin")
    with open(src, "wb") as f:
        f.write(data)
    ex.max_spill_bytes = cap
    got = ex.run_sync(ex.resolve(ShellExecRequest(command=f"cat {src}; cat {src} >&2")))
    assert got.exit_code == 0
    for stream in (got.stdout, got.stderr):
        assert stream.total_bytes == len(data) and stream.truncated
        assert stream.spill_path is not None
        with open(stream.spill_path, "rb") as f:
            spilled = f.read()
        assert len(spilled) == min(cap, len(data))
        assert hashlib.sha256(spilled).digest() == hashlib.sha256(data[:cap]).digest()
        assert stream.spill_truncated == (cap < len(data))
        assert os.stat(stream.spill_path).st_mode & 0o777 == 0o600
