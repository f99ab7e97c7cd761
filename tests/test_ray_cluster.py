"""``RayShellExecutor`` on a real local cluster: one head and two worker nodes (plain Ray, no
dashboard), started once per test session and torn down after this module.

Run with the others, or alone with ``-m ray``. Every command a test starts carries a marker
in its command line, so that /proc (all nodes of a local cluster share this machine) shows
whether it is still alive after a node service, a node or a harness died.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from ray_helpers import eventually, marker_pids, new_marker  # noqa: E402
from shellseam import (  # noqa: E402
    AbortController,
    BashTool,
    LocalShellExecutor,
    ManagedEnvRegistry,
    ShellError,
    ShellExecRequest,
    SubprocessService,
    TaskRuntime,
    ToolContext,
    render_result,
    task_tools,
)
from shellseam._bench.ray import ensure_ray_temp_root, release_ray_temp_root  # noqa: E402
from shellseam.ray import RayShellExecutor  # noqa: E402
from shellseam.ray import node as ray_node  # noqa: E402
from shellseam.ray.channel import ChannelTransport  # noqa: E402
from shellseam.ray.executor import alive_nodes  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

#: Fast failure detection, so that a removed node is declared dead within seconds.
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
}


@dataclass
class LocalCluster:
    cluster: Any
    workers: list[Any]

    @property
    def node_ids(self) -> list[str]:
        return [w.node_id for w in self.workers]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # Started once per session (only this module uses it) and torn down as soon as the
    # module is done, so that no Ray driver threads run under the other tests.
    # Ray's sockets live under its temp dir, whose path must stay short.
    # On a machine that never ran Ray, Cluster failed: it records its address in /tmp/ray.
    made = ensure_ray_temp_root()
    temp_dir = tempfile.mkdtemp(prefix="ssray-", dir="/tmp")
    try:
        c = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "_system_config": SYSTEM_CONFIG,
                "temp_dir": temp_dir,
            },
        )
        try:
            workers = [c.add_node(num_cpus=1) for _ in range(2)]
            ray.init(address=c.address, log_to_driver=False, namespace="shellseam-tests")
            yield LocalCluster(c, workers)
        finally:
            ray.shutdown()
            c.shutdown()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
        if made:
            release_ray_temp_root(made)


@pytest.fixture(scope="session")
def keeper() -> bool:
    """Whether the containment keeper's guarantee holds here (a dead service takes its
    commands with it), probed for real: a throwaway harness starts a command that leaves its
    session, then is SIGKILLed."""
    marker = new_marker()
    code = textwrap.dedent(
        f"""
        import sys
        from shellseam import LocalShellExecutor, ShellExecRequest
        ex = LocalShellExecutor(cwd="/")
        cmd = "setsid bash -c 'exec -a {marker} sleep 60' & sleep 60"
        p = ex.start(ex.resolve(ShellExecRequest(command=cmd)))
        print("up", flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        assert eventually(lambda: bool(marker_pids(marker)))  # the probe itself works
        child.kill()
        child.wait()
        return eventually(lambda: marker_pids(marker) == [], 3)
    finally:
        _kill_markers(marker)


def _kill_markers(*markers: str) -> None:
    for marker in markers:
        for pid in marker_pids(marker):
            os.kill(pid, signal.SIGKILL)


def commands_gone(keeper: bool, *markers: str) -> None:
    """The commands of a dead node service are gone (with the keeper), else cleaned up here
    and the test marked as waiting for it."""
    if keeper:
        assert eventually(lambda: not any(marker_pids(m) for m in markers), 5)
        return
    _kill_markers(*markers)
    pytest.xfail("commands outlive a dead node service until the containment keeper lands")


def spec(ex: Any, command: str, **fields: Any) -> Any:
    return ex.resolve(ShellExecRequest(command=command, **fields))


@pytest.fixture
def ex(cluster: LocalCluster, tmp_path: Any) -> RayShellExecutor:
    return RayShellExecutor(node_id=cluster.node_ids[0], cwd=str(tmp_path), grace_ms=300)


# -- identity and placement ----------------------------------------------------------------


def test_one_named_pinned_service_per_node(cluster: LocalCluster, tmp_path: Any) -> None:
    for node_id in cluster.node_ids:
        ex = RayShellExecutor(node_id=node_id, cwd=str(tmp_path))
        assert ex.node_id == node_id
        ex.run_sync(spec(ex, "true"))
        actor = ray.get_actor(f"shellseam-node-{node_id}", namespace="shellseam")
        where, _pid = ray.get(actor.where.remote())
        assert where == node_id
        assert ray.get(actor.info.remote()).max_running == 4 * (os.cpu_count() or 1)


def test_concurrent_creation_yields_one_service(cluster: LocalCluster) -> None:
    node_id = cluster.node_ids[1]
    handles: list[Any] = []

    def create() -> None:
        handles.append(ray_node.get_or_create(node_id))

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pids = {ray.get(h.where.remote())[1] for h in handles}
    assert len(pids) == 1


def test_unbound_executor_picks_an_alive_node(cluster: LocalCluster, tmp_path: Any) -> None:
    ex = RayShellExecutor(cwd=str(tmp_path))
    assert ex.node_id in alive_nodes()
    assert ex.run_sync(spec(ex, "echo ok")).stdout.text == "ok\n"
    with pytest.raises(ValueError, match="node_id"):
        RayShellExecutor(node_id="f" * 56, cwd=str(tmp_path))


def on_channel(ex: RayShellExecutor) -> None:
    """Brings the executor's messages onto its node service's channel (the failure tests
    then break a channel with calls in flight on it, not an actor call)."""
    ex.run_sync(spec(ex, "true"))
    transport = ex.link.transport()
    assert isinstance(transport, ChannelTransport)
    assert eventually(lambda: transport.channel_open, 10)


def test_messages_travel_on_the_service_channel_once_it_is_open(ex: RayShellExecutor) -> None:
    # The first message goes through the actor call while the channel opens beside it.
    ex.run_sync(spec(ex, "true"))
    transport = ex.link.transport()
    assert isinstance(transport, ChannelTransport)
    assert eventually(lambda: transport.channel_open, 10)
    result = ex.run_sync(spec(ex, "echo via; echo err >&2; exit 3"))
    assert (result.stdout.text, result.stderr.text, result.exit_code) == ("via\n", "err\n", 3)
    assert transport.channel_open


# -- foreground ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    ["echo out; echo err >&2; exit 2", "true", "kill -TERM $$", "seq 1 20000"],
)
def test_renderings_are_byte_identical_to_local(ex: RayShellExecutor, command: str) -> None:
    service = SubprocessService()
    try:
        local = LocalShellExecutor(cwd=ex.cwd, grace_ms=300, service=service)
        here = local.run_sync(spec(local, command, stdout_max_bytes=1000))
        there = ex.run_sync(spec(ex, command, stdout_max_bytes=1000))
        mapped = render_result(there)
        if there.stdout.spill_path and here.stdout.spill_path:
            mapped = mapped.replace(there.stdout.spill_path, here.stdout.spill_path)
        assert mapped == render_result(here)
        assert asyncio.run(ex.run(spec(ex, command))).exit_code == here.exit_code
    finally:
        service.dispose()


def test_node_environment_has_no_ray_names(ex: RayShellExecutor) -> None:
    result = ex.run_sync(spec(ex, "env | grep -c '^RAY_' || true", env={"RAY_MINE": "x"}))
    assert result.stdout.text == "1\n"  # only the one the spec passed
    result = ex.run_sync(spec(ex, "echo $TERM $NO_COLOR"))
    assert result.stdout.text == "dumb 1\n"
    # What Ray adds to its worker processes is not the node's environment either.
    result = ex.run_sync(spec(ex, "env | grep -E '^(SPT_NOENV|PYTHONBREAKPOINT)=' || true"))
    assert result.stdout.text == ""


def test_abort_timeout_and_cancel(ex: RayShellExecutor) -> None:
    marker = new_marker()
    ctl = AbortController()

    def abort_once_running() -> None:
        eventually(lambda: bool(marker_pids(marker)), 30)
        ctl.abort()

    threading.Thread(target=abort_once_running, daemon=True).start()
    aborted = ex.run_sync(spec(ex, f"exec -a {marker} sleep 30", signal=ctl.signal))
    assert aborted.aborted and aborted.signal == "SIGTERM"
    assert marker_pids(marker) == []

    timed = ex.run_sync(spec(ex, "sleep 30", timeout_ms=300))
    assert (
        render_result(timed) == "(no output)\n[timed out after 300ms]\n[killed by signal: SIGTERM]"
    )

    async def cancel() -> None:
        task = asyncio.ensure_future(ex.run(spec(ex, f"trap '' TERM; exec -a {marker} sleep 30")))
        assert await asyncio.to_thread(eventually, lambda: bool(marker_pids(marker)))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert marker_pids(marker) == []  # reaped before the CancelledError came back

    asyncio.run(cancel())


def test_sandboxed_mode_runs_confined_on_the_node(cluster: LocalCluster, tmp_path: Any) -> None:
    ex = RayShellExecutor(node_id=cluster.node_ids[1], mode="read-only", cwd=str(tmp_path))
    assert ex.sandbox_mode == "read-only"
    result = ex.run_sync(spec(ex, "echo x > file"))
    assert result.exit_code != 0 and result.sandbox is not None and result.sandbox.denied
    assert not (tmp_path / "file").exists()


# -- background ----------------------------------------------------------------------------


def test_background_start_reads_and_kill(ex: RayShellExecutor) -> None:
    marker = new_marker()
    proc = ex.start(spec(ex, f"echo first; echo warn >&2; exec -a {marker} sleep 30"))
    assert eventually(lambda: bool(marker_pids(marker)))
    assert proc.status == "running"
    seen: list[str] = []
    # Both streams were written before the exec; each read is consuming.
    assert eventually(
        lambda: (
            bool(seen.append(proc.read_output().delta))
            or "".join(seen).replace("\n[stderr]\n", "|") == "first\n|warn\n"
        )
    ), seen
    assert proc.read_output().delta == ""
    assert proc.kill() is True
    assert proc.wait_sync(10)
    assert (proc.status, proc.exit_code, proc.signal) == ("killed", None, "SIGTERM")
    assert marker_pids(marker) == []
    done = ex.start(spec(ex, "echo bye; exit 3"))
    asyncio.run(asyncio.wait_for(done.wait(), 10))
    assert (done.status, done.exit_code) == ("completed", 3)
    assert done.read_output().delta == "bye\n"


def test_bash_tool_with_background_tasks(ex: RayShellExecutor, tmp_path: Any) -> None:
    runtime = TaskRuntime()
    tool = BashTool(ex, tasks=runtime, env=ManagedEnvRegistry(home=str(tmp_path)))
    task_output, _task_list, task_kill = task_tools(runtime)
    ctx = ToolContext(session_id="s", session_cwd=ex.cwd)

    async def main() -> None:
        fg = await tool.execute({"command": "echo $DSH_SHELL", "description": "d"}, ctx)
        assert fg.text == "1\n[exit code: 0]"
        bg = await tool.execute(
            {
                "command": "echo up; touch ready; sleep 30",
                "description": "srv",
                "run_in_background": True,
            },
            ctx,
        )
        assert bg.text == "started background task bash-1"
        ready = os.path.join(ex.cwd, "ready")
        assert await asyncio.to_thread(eventually, lambda: os.path.exists(ready), 10)
        out = await task_output.execute({"task_id": "bash-1", "block": True, "timeoutMs": 200}, ctx)
        assert out.text == "task bash-1: running\nup\n"
        assert (await task_kill.execute({"task_id": "bash-1"}, ctx)).text == "killed task bash-1"
        await runtime.dispose_owner("s")

    asyncio.run(main())


def test_read_spill(ex: RayShellExecutor) -> None:
    result = ex.run_sync(spec(ex, "seq 1 200000", stdout_max_bytes=1000))
    path = result.stdout.spill_path
    assert path is not None
    expected = "".join(f"{i}\n" for i in range(1, 200001)).encode()
    assert ex.read_spill(path) == expected
    assert ex.read_spill(path, offset=7, size=100) == expected[7:107]
    for bad in ["/etc/passwd", os.path.dirname(path), path + "/../x"]:
        with pytest.raises(ShellError) as err:
            ex.read_spill(bad)
        assert err.value.code == "INVALID_REQUEST"


# -- failures and cleanup ------------------------------------------------------------------


def _service_pid(node_id: str) -> int:
    actor = ray.get_actor(f"shellseam-node-{node_id}", namespace="shellseam")
    pid: int = ray.get(actor.where.remote())[1]
    return pid


def test_ray_kill_of_the_service_kills_its_commands(
    cluster: LocalCluster, keeper: bool, tmp_path: Any
) -> None:
    ex = RayShellExecutor(node_id=cluster.node_ids[1], cwd=str(tmp_path))
    on_channel(ex)
    marker = new_marker()
    proc = ex.start(spec(ex, f"exec -a {marker} sleep 60"))
    assert eventually(lambda: bool(marker_pids(marker)), 10)
    ray.kill(ray.get_actor(f"shellseam-node-{ex.node_id}", namespace="shellseam"))
    assert proc.wait_sync(20) and proc.status == "killed"
    assert proc.read_output().delta == f"remote node lost: {ex.node_id}"
    # The next call brings a fresh service (a new incarnation) up on the same node.
    assert ex.run_sync(spec(ex, "echo again")).stdout.text == "again\n"
    commands_gone(keeper, marker)


def test_sigkill_of_the_service_process_kills_its_commands(
    cluster: LocalCluster, keeper: bool, tmp_path: Any
) -> None:
    ex = RayShellExecutor(node_id=cluster.node_ids[0], cwd=str(tmp_path))
    on_channel(ex)
    marker = new_marker()
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(ex.run_sync(spec(ex, f"exec -a {marker} sleep 60")))
        except ShellError as err:
            result.append(err)

    runner = threading.Thread(target=run)
    runner.start()
    assert eventually(lambda: bool(marker_pids(marker)), 10)
    os.kill(_service_pid(ex.node_id), signal.SIGKILL)
    runner.join(30)
    assert isinstance(result[0], ShellError) and result[0].code == "REMOTE_UNAVAILABLE"
    assert result[0].reason.startswith(f"remote node lost: {ex.node_id}")
    commands_gone(keeper, marker)


def test_node_removal_is_remote_unavailable_and_leaves_nothing(
    cluster: LocalCluster, keeper: bool, tmp_path: Any
) -> None:
    doomed = cluster.cluster.add_node(num_cpus=1)
    ex = RayShellExecutor(node_id=doomed.node_id, cwd=str(tmp_path))
    on_channel(ex)
    fg_marker, bg_marker = new_marker(), new_marker()
    proc = ex.start(spec(ex, f"exec -a {bg_marker} sleep 60"))
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(ex.run_sync(spec(ex, f"exec -a {fg_marker} sleep 60")))
        except ShellError as err:
            result.append(err)

    runner = threading.Thread(target=run)
    runner.start()
    assert eventually(lambda: bool(marker_pids(fg_marker) and marker_pids(bg_marker)), 15)
    cluster.cluster.remove_node(doomed, allow_graceful=False)
    runner.join(60)
    assert isinstance(result[0], ShellError) and result[0].code == "REMOTE_UNAVAILABLE"
    assert proc.wait_sync(30) and proc.status == "killed"
    assert proc.read_output().delta == f"remote node lost: {doomed.node_id}"
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec(ex, "true"))
    assert err.value.code == "REMOTE_UNAVAILABLE"
    commands_gone(keeper, fg_marker, bg_marker)


def test_killed_harness_loses_its_commands_within_the_lease(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    marker = new_marker()
    code = textwrap.dedent(
        f"""
        import ray, sys
        from shellseam import ShellExecRequest
        from shellseam.ray import RayShellExecutor
        ray.init(address={cluster.cluster.address!r}, log_to_driver=False)
        ex = RayShellExecutor(node_id={cluster.node_ids[1]!r}, cwd={str(tmp_path)!r})
        p = ex.start(ex.resolve(ShellExecRequest(command="exec -a {marker} sleep 120")))
        ex.run_sync(ex.resolve(ShellExecRequest(command="true")))
        print("up", flush=True)
        sys.stdin.read()
        """
    )
    harness = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert harness.stdout is not None
        assert harness.stdout.readline() == b"up\n"
        assert eventually(lambda: bool(marker_pids(marker)), 10)
        harness.kill()
        harness.wait()
        killed_at = time.monotonic()
        assert eventually(lambda: marker_pids(marker) == [], 15)
        assert time.monotonic() - killed_at < 13
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        for pid in marker_pids(marker):
            os.kill(pid, signal.SIGKILL)


def test_bench_rows_smoke(cluster: LocalCluster) -> None:
    from shellseam._bench import ray as bench_ray

    rows = bench_ray.run(True, tiny=True)
    # R1 and its five diagnostics, R2, the spill read rate.
    assert [r.verdict in ("PASS", "MISS") for r in rows] == [True] + [False] * 5 + [True, False]
    assert {r.verdict for r in rows[1:6]} == {"info"}
    assert rows[7].unit == "MiB/s" and (rows[7].value or 0) > 0


def test_attack_a_command_driving_the_cluster_is_stopped_by_network_false(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    """The threat: a command that knows the cluster's address (any process can find it)
    joins it as a driver and runs code on every node. Confined with ``network=False`` it
    cannot open the socket."""
    address = cluster.cluster.address
    attack = (
        f"{sys.executable} -c \"import ray; ray.init(address='{address}', "
        "log_to_driver=False); print('pwned', ray.get(ray.remote(lambda: 42).remote()))\""
    )
    open_ex = RayShellExecutor(node_id=cluster.node_ids[0], cwd=str(tmp_path))
    succeeded = open_ex.run_sync(spec(open_ex, attack, timeout_ms=60_000))
    assert "pwned 42" in succeeded.stdout.text  # unconfined, the attack works

    from shellseam import SandboxPolicy

    confined = RayShellExecutor(
        node_id=cluster.node_ids[0], mode="workspace-write", cwd=str(tmp_path)
    )
    policy = SandboxPolicy(mode="workspace-write", workspace_root=str(tmp_path), network=False)
    host, port = address.rsplit(":", 1)
    probe = confined.run_sync(
        spec(
            confined,
            f"{sys.executable} -c \"import socket; socket.create_connection(('{host}', {port}))\"",
            sandbox_policy=policy,
        )
    )
    assert probe.exit_code != 0 and "PermissionError" in probe.stderr.text
    # Ray would retry for a minute; a few seconds show it gets nowhere.
    stopped = confined.run_sync(spec(confined, attack, sandbox_policy=policy, timeout_ms=8_000))
    assert "pwned" not in stopped.stdout.text and stopped.exit_code != 0


def test_attack_a_command_that_reaches_the_channel_without_the_token_runs_nothing(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    """The threat: the channel listens on the node's address, which a command with the network
    reaches. A pickle that runs code when loaded, sent as a frame straight away and after a
    handshake with a guessed token, must never be loaded, and the service keeps serving."""
    ex = RayShellExecutor(node_id=cluster.node_ids[0], cwd=str(tmp_path))
    on_channel(ex)
    actor = ray.get_actor(f"shellseam-node-{ex.node_id}", namespace="shellseam")
    host, port, _token = ray.get(actor.channel.remote())
    pwned = tmp_path / "pwned"
    attack = textwrap.dedent(
        f"""\
        import os, pickle, socket, struct
        class Evil:
            def __reduce__(self):
                return (os.system, ("touch {pwned}",))
        body = pickle.dumps(("run", Evil()))
        frame = struct.pack("!QI", 1, len(body)) + body + bytes(32)
        with socket.create_connection(("{host}", {port}), timeout=5) as s:
            s.sendall(frame)
            print("raw", s.recv(100))
        with socket.create_connection(("{host}", {port}), timeout=5) as s:
            s.sendall(b"shellseam-channel-1\\n" + bytes(16))
            s.recv(48)
            s.sendall(bytes(32) + frame)
            print("guessed", s.recv(100))
        """
    )
    script = tmp_path / "attack.py"
    script.write_text(attack)
    got = ex.run_sync(spec(ex, f"{sys.executable} {script}", timeout_ms=30_000))
    assert got.exit_code == 0, got.stderr.text
    assert got.stdout.text == "raw b''\nguessed b''\n"  # both closed unanswered
    time.sleep(0.5)
    assert not pwned.exists()
    assert ex.run_sync(spec(ex, "echo still")).stdout.text == "still\n"
    assert ex.link.transport().channel_open  # type: ignore[attr-defined]


def test_the_address_probe_accepts_a_real_cluster(cluster: LocalCluster) -> None:
    # The probe that refuses a non-Ray address before `ray.init` (test_redteam_mcp.py) asks
    # for gRPC's first frame: the cluster's GCS must pass it.
    from shellseam.factory import _check_reachable

    _check_reachable(cluster.cluster.address)
    _check_reachable(f"ray://{cluster.cluster.address}")
