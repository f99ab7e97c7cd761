"""The Ray node protocol without Ray: a node state machine on a loop thread of its own, a
client link, and an in-process transport that injects faults — a lost reply, a duplicate
delivery, a delayed abort, the node dying mid-read, an expired lease, a silent node.

For every fault: no output is lost or duplicated, nothing runs twice, and no process
survives (processes are found by a marker in their command line, through /proc).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_helpers import eventually, marker_pids, new_marker
from shellseam import (
    AbortController,
    BashTool,
    LocalShellExecutor,
    ManagedEnvRegistry,
    ResourceLimits,
    ShellError,
    ShellExecRequest,
    SubprocessService,
    TaskRuntime,
    ToolContext,
    render_result,
    task_tools,
)
from shellseam.ray.client import RemoteShellExecutor
from shellseam.ray.handle import RemoteShellProcess
from shellseam.ray.link import NodeLink
from shellseam.ray.nodestate import NodeState
from shellseam.ray.protocol import (
    InProcessTransport,
    LoopThread,
    NodeLost,
    RetryDelivery,
    WireDecoder,
    WireEncoder,
    failed,
)

LEASE_S = 1.5  # short, yet many heartbeats long even on a loaded machine


def abort_once_running(ctl: AbortController, marker: str) -> None:
    """Aborts from another thread as soon as the marked command runs."""

    def watch() -> None:
        eventually(lambda: bool(marker_pids(marker)), 30)
        ctl.abort()

    threading.Thread(target=watch, daemon=True).start()


class FaultyTransport(InProcessTransport):
    """The in-process transport with faults scheduled per method, each used once. Every
    message and reply travels as the Ray transport's bytes (``WireEncoder``/``WireDecoder``
    and pickle), so every scenario here runs through that encoding too."""

    def __init__(self, node: NodeState, loop: LoopThread) -> None:
        super().__init__(node, loop)
        self._faults: dict[str, list[Callable[[str, object], concurrent.futures.Future[Any]]]] = {}
        self._pending: list[concurrent.futures.Future[Any]] = []
        self._lock = threading.Lock()
        self.delivered: list[str] = []
        self._encoder = WireEncoder()
        self._decoder = WireDecoder()

    def inject(
        self, method: str, fault: Callable[[str, object], concurrent.futures.Future[Any]]
    ) -> None:
        with self._lock:
            self._faults.setdefault(method, []).append(fault)

    def deliver(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        self.delivered.append(method)
        method, message = self._decoder.decode(self._encoder.encode(method, message))
        real = super().submit(method, message)
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def done(f: concurrent.futures.Future[Any]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(pickle.loads(pickle.dumps(f.result(), pickle.HIGHEST_PROTOCOL)))

        real.add_done_callback(done)
        return out

    def submit(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        with self._lock:
            queue = self._faults.get(method)
            fault = queue.pop(0) if queue else None
        fut = fault(method, message) if fault is not None else self.deliver(method, message)
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self.lost:
                out.set_exception(NodeLost("node service is gone"))
                return out
            self._pending.append(out)

        def done(f: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                if out in self._pending:
                    self._pending.remove(out)
            if out.done():
                return
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result())

        fut.add_done_callback(done)
        return out

    # -- faults --------------------------------------------------------------------------

    def lose_reply(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        """The node does the work; its reply never arrives ("may or may not have run")."""
        real = self.deliver(method, message)
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        real.add_done_callback(lambda _f: out.set_exception(RetryDelivery("reply lost")))
        return out

    def duplicate(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        """The request arrives twice; the client sees the second reply."""
        self.deliver(method, message)
        return self.deliver(method, message)

    def delay(self, seconds: float) -> Callable[[str, object], concurrent.futures.Future[Any]]:
        def fault(method: str, message: object) -> concurrent.futures.Future[Any]:
            out: concurrent.futures.Future[Any] = concurrent.futures.Future()

            def later() -> None:
                real = self.deliver(method, message)
                real.add_done_callback(
                    lambda f: (
                        out.set_exception(f.exception())  # type: ignore[arg-type]
                        if f.exception()
                        else out.set_result(f.result())
                    )
                )

            threading.Timer(seconds, later).start()
            return out

        return fault

    def die(self) -> None:
        """The node service dies: every pending call fails, and (the keeper's guarantee)
        its commands die with it."""
        with self._lock:
            self.lost = True
            pending, self._pending = self._pending, []
        for fut in pending:
            if not fut.done():
                fut.set_exception(NodeLost("actor died"))
        node: NodeState = self.node  # type: ignore[assignment]
        node.service.dispose()

    def die_on(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        """The node dies while this call is in flight."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        threading.Timer(0.05, self.die).start()
        return fut

    def silent(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        """The call is swallowed: no reply, no error (a hung node)."""
        return concurrent.futures.Future()


@dataclass
class World:
    node: NodeState
    loop: LoopThread
    transport: FaultyTransport
    link: NodeLink
    ex: RemoteShellExecutor
    cwd: str

    def executor(self, link: NodeLink | None = None, **config: Any) -> RemoteShellExecutor:
        config.setdefault("grace_ms", 200)
        return RemoteShellExecutor(link or self.link, cwd=self.cwd, **config)

    def new_link(self, **kwargs: Any) -> NodeLink:
        kwargs.setdefault("heartbeat_s", 0.1)  # well inside the tests' short lease
        return NodeLink("node-a", lambda: self.transport, **kwargs)

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()

        return self.loop.submit(call()).result(5)


@pytest.fixture
def world(tmp_path: Any) -> Iterator[World]:
    loop = LoopThread()
    service = SubprocessService(spill_parent=str(tmp_path))
    node = NodeState(node_id="node-a", lease_s=LEASE_S, service=service, max_running=64)
    transport = FaultyTransport(node, loop)
    link = NodeLink("node-a", lambda: transport, heartbeat_s=0.1, slack_s=3.0)
    ex = RemoteShellExecutor(link, cwd=str(tmp_path), grace_ms=200)
    try:
        yield World(node, loop, transport, link, ex, str(tmp_path))
    finally:
        link.close()
        loop.submit(_dispose(node)).result(10)
        loop.stop()


async def _dispose(node: NodeState) -> None:
    node.dispose()


def spec_of(ex: RemoteShellExecutor | LocalShellExecutor, command: str, **fields: Any) -> Any:
    return ex.resolve(ShellExecRequest(command=command, **fields))


# -- results are the local ones ------------------------------------------------------------


COMMANDS = [
    "echo out; echo err >&2; exit 2",
    "true",
    "printf 'no newline'",
    "head -c 70000 /dev/zero | tr '\\0' x",
    "kill -TERM $$",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_remote_results_render_byte_identical_to_local(world: World, command: str) -> None:
    local = LocalShellExecutor(cwd=world.cwd, grace_ms=200, service=world.node.service)
    remote = world.ex.run_sync(spec_of(world.ex, command))
    here = local.run_sync(spec_of(local, command))
    assert type(remote) is type(here)
    assert remote.exit_code == here.exit_code and remote.signal == here.signal
    assert remote.stdout.text == here.stdout.text and remote.stderr.text == here.stderr.text
    # The spill path names a different file; everything else of the rendering is identical.
    strip = (remote.stdout.spill_path or "", here.stdout.spill_path or "")
    assert render_result(remote).replace(strip[0], "P") == render_result(here).replace(
        strip[1], "P"
    )


def test_async_run_and_nonzero_exit(world: World) -> None:
    result = asyncio.run(world.ex.run(spec_of(world.ex, "echo hi; exit 7")))
    assert render_result(result) == "hi\n[exit code: 7]"


def test_resolve_is_local_and_validates(world: World) -> None:
    with pytest.raises(ShellError) as err:
        world.ex.resolve(ShellExecRequest(command="  "))
    assert err.value.code == "INVALID_REQUEST"
    assert "run" not in world.transport.delivered
    with pytest.raises((ValueError, ShellError)):
        world.executor(grace_ms=-1)  # the local twin validates the config
    with pytest.raises(TypeError, match="service"):
        world.executor(service=world.node.service)


@pytest.mark.parametrize(
    "bad",
    [
        "echo",
        None,
        {"command": "true"},
        ("limits", ResourceLimits(memory_bytes=-1)),
        ("command", "x" * (16 * 2**20 + 1)),
        ("timeout_ms", 0),
    ],
)
def test_a_bad_spec_is_invalid_request_before_any_remote_work(world: World, bad: Any) -> None:
    # As the local executor: run, run_sync and start check the spec first (SPEC §2).
    if isinstance(bad, tuple):
        bad = dataclasses.replace(spec_of(world.ex, "true"), **{bad[0]: bad[1]})
    for call in (world.ex.run_sync, world.ex.start, lambda s: asyncio.run(world.ex.run(s))):
        with pytest.raises(ShellError) as err:
            call(bad)
        assert err.value.code == "INVALID_REQUEST"
    assert not {"run", "start"} & set(world.transport.delivered)


def test_configuration_reads_as_a_local_executors(world: World) -> None:
    ex = world.executor(timeout_ms=5_000, max_output_bytes=1234)
    assert (ex.timeout_ms, ex.max_output_bytes, ex.grace_ms) == (5_000, 1234, 200)
    assert ex.cwd == world.cwd and ex.sandbox_mode is None and ex.node_id == "node-a"
    with pytest.raises(AttributeError):
        _ = ex.service


def test_spawn_failure_raises_the_local_code(world: World) -> None:
    with pytest.raises(ShellError) as err:
        world.ex.run_sync(spec_of(world.ex, "true", workdir="/nonexistent/dir"))
    assert err.value.code == "SPAWN_FAILED"
    assert "/nonexistent/dir" in err.value.reason


# -- call ids: lost replies and duplicates run once ----------------------------------------


def test_lost_run_reply_is_asked_again_and_the_command_runs_once(world: World) -> None:
    world.transport.inject("run", world.transport.lose_reply)
    result = world.ex.run_sync(spec_of(world.ex, "echo ran >> count; cat count"))
    assert result.stdout.text == "ran\n"
    assert world.transport.delivered.count("run") == 2
    with open(os.path.join(world.cwd, "count")) as f:
        assert f.read() == "ran\n"


def test_duplicate_run_delivery_runs_once(world: World) -> None:
    world.transport.inject("run", world.transport.duplicate)
    result = asyncio.run(world.ex.run(spec_of(world.ex, "echo ran >> count; cat count")))
    assert result.stdout.text == "ran\n"
    with open(os.path.join(world.cwd, "count")) as f:
        assert f.read() == "ran\n"


def test_duplicate_start_delivery_starts_once(world: World) -> None:
    world.transport.inject("start", world.transport.duplicate)
    proc = world.ex.start(spec_of(world.ex, "echo ran >> count"))
    assert proc.wait_sync(5)
    with open(os.path.join(world.cwd, "count")) as f:
        assert f.read() == "ran\n"


def test_acknowledged_records_are_dropped_by_the_node(world: World) -> None:
    for _ in range(3):
        world.ex.run_sync(spec_of(world.ex, "true"))
    world.link.heartbeat()

    def records() -> int:
        return sum(len(c.calls) for c in world.node._clients.values())

    assert eventually(lambda: world.on_loop(records) == 0)


# -- abort, timeout, cancel ----------------------------------------------------------------


def test_abort_forwards_and_kills(world: World) -> None:
    marker = new_marker()
    ctl = AbortController()
    abort_once_running(ctl, marker)
    result = world.ex.run_sync(spec_of(world.ex, f"exec -a {marker} sleep 30", signal=ctl.signal))
    assert result.aborted and not result.timed_out
    assert result.signal == "SIGTERM"
    assert marker_pids(marker) == []


def test_delayed_run_lets_the_abort_arrive_first_and_nothing_spawns(world: World) -> None:
    ctl = AbortController()
    world.transport.inject("run", world.transport.delay(1.0))
    threading.Timer(0.1, ctl.abort).start()
    result = world.ex.run_sync(spec_of(world.ex, "touch spawned", signal=ctl.signal))
    assert result.aborted and result.exit_code is None and result.signal is None
    assert result.stdout.text == "" and result.duration_ms == 0.0
    assert not os.path.exists(os.path.join(world.cwd, "spawned"))


def test_a_call_cancelled_before_it_arrives_never_runs_nor_stays(world: World) -> None:
    world.transport.inject("run", world.transport.delay(1.0))

    async def main() -> None:
        task = asyncio.ensure_future(world.ex.run(spec_of(world.ex, "touch spawned")))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    time.sleep(1.2)  # the delayed run has arrived by now
    assert not os.path.exists(os.path.join(world.cwd, "spawned"))
    assert world.on_loop(lambda: sum(len(c.calls) for c in world.node._clients.values())) == 0


def test_abort_delayed_past_the_end_changes_nothing(world: World) -> None:
    ctl = AbortController()
    world.transport.inject("abort", world.transport.delay(0.3))
    spec = spec_of(world.ex, "echo done", signal=ctl.signal)
    first = world.ex.run_sync(spec)
    ctl.abort()
    time.sleep(0.5)
    assert not first.aborted and first.exit_code == 0
    second = world.ex.run_sync(spec_of(world.ex, "echo again"))
    assert second.stdout.text == "again\n" and not second.aborted


def test_already_aborted_signal_spawns_nothing(world: World) -> None:
    ctl = AbortController()
    ctl.abort()
    result = world.ex.run_sync(spec_of(world.ex, "touch spawned", signal=ctl.signal))
    assert result.aborted and result.exit_code is None
    assert "run" not in world.transport.delivered


def test_timeout_is_the_nodes(world: World) -> None:
    result = world.ex.run_sync(spec_of(world.ex, "sleep 5", timeout_ms=200))
    assert result.timed_out and not result.aborted
    assert render_result(result).endswith("[timed out after 200ms]\n[killed by signal: SIGTERM]")


def test_cancel_reraises_only_after_the_reap(world: World) -> None:
    marker = new_marker()

    async def main() -> None:
        task = asyncio.ensure_future(
            world.ex.run(spec_of(world.ex, f"trap '' TERM; exec -a {marker} sleep 30"))
        )
        assert await asyncio.to_thread(eventually, lambda: bool(marker_pids(marker)))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert marker_pids(marker) == []

    asyncio.run(main())


# -- the watchdog and a lost node ----------------------------------------------------------


def test_silent_node_raises_remote_unavailable_after_the_watchdog(world: World) -> None:
    link = world.new_link(slack_s=0.3)
    ex = world.executor(link, grace_ms=100)
    world.transport.inject("run", world.transport.silent)
    started = time.monotonic()
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec_of(ex, "true", timeout_ms=200))
    elapsed = time.monotonic() - started
    assert err.value.code == "REMOTE_UNAVAILABLE"
    assert "stopped answering" in err.value.reason
    assert elapsed >= 0.2 + 0.2 + 0.3 - 0.05
    link.close()


def test_node_death_during_run_raises_remote_unavailable_and_kills(world: World) -> None:
    marker = new_marker()
    threading.Timer(0.5, world.transport.die).start()
    with pytest.raises(ShellError) as err:
        world.ex.run_sync(spec_of(world.ex, f"exec -a {marker} sleep 30"))
    assert err.value.code == "REMOTE_UNAVAILABLE"
    assert err.value.reason.startswith("remote node lost: node-a")
    assert eventually(lambda: marker_pids(marker) == [])


def test_unreachable_node_at_connect_is_remote_unavailable(world: World) -> None:
    def refuse() -> Any:
        raise NodeLost("node is not alive")

    ex = world.executor(NodeLink("node-gone", refuse))
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec_of(ex, "true"))
    assert err.value.code == "REMOTE_UNAVAILABLE"
    assert err.value.reason.startswith("remote node lost: node-gone")


# -- background handles: exactly-once reads ------------------------------------------------

LINES = "".join(f"line {i}\n" for i in range(40))


def _producer(world: World) -> RemoteShellProcess:
    proc = world.ex.start(
        spec_of(world.ex, "for i in $(seq 0 39); do echo line $i; sleep 0.005; done")
    )
    assert isinstance(proc, RemoteShellProcess)
    return proc


def _read_all(proc: RemoteShellProcess) -> str:
    text = ""
    while True:
        settled = proc.status != "running"
        text += proc.read_output().delta
        if settled:
            return text + proc.read_output().delta
        time.sleep(0.01)


def test_background_reads_survive_lost_replies_and_duplicates(world: World) -> None:
    proc = _producer(world)
    for _ in range(3):
        world.transport.inject("read", world.transport.lose_reply)
        world.transport.inject("read", world.transport.duplicate)
    assert _read_all(proc) == LINES
    assert proc.status == "completed" and proc.exit_code == 0


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(faults=st.lists(st.sampled_from(["ok", "lose", "dup"]), max_size=12))
def test_any_sequence_of_read_faults_delivers_every_byte_once(
    world: World, faults: list[str]
) -> None:
    proc = world.ex.start(spec_of(world.ex, "seq 1 300; echo err >&2; sleep 0.05; seq 301 400"))
    for fault in faults:
        if fault == "lose":
            world.transport.inject("read", world.transport.lose_reply)
        elif fault == "dup":
            world.transport.inject("read", world.transport.duplicate)
        else:
            world.transport.inject("read", world.transport.deliver)
    text = _read_all(proc)
    stdout = "".join(f"{i}\n" for i in range(1, 401))
    # stderr comes as a marked section of whichever read saw it: remove it, then compare.
    assert text.count("\n[stderr]\nerr\n") == 1
    assert text.replace("\n[stderr]\nerr\n", "") == stdout


def test_background_kill_and_wait(world: World) -> None:
    marker = new_marker()
    proc = world.ex.start(spec_of(world.ex, f"exec -a {marker} sleep 30"))
    assert eventually(lambda: bool(marker_pids(marker)))
    world.transport.inject("kill", world.transport.lose_reply)
    assert proc.kill() is True
    assert proc.wait_sync(5)
    assert proc.status == "killed" and proc.signal == "SIGTERM"
    assert proc.kill() is False
    assert marker_pids(marker) == []
    asyncio.run(proc.wait())


def test_wait_sync_takes_timeouts_as_a_local_handle_does(world: World) -> None:
    # SPEC §2: wait_sync(inf) means no timeout; huge timeouts too, and bad ones give the
    # local handle's errors (never a bare OverflowError, never a silent False for nan).
    proc = world.ex.start(spec_of(world.ex, "sleep 0.2"))
    for bad, error in ((math.nan, ValueError), ("5", TypeError), (True, TypeError)):
        with pytest.raises(error, match="timeout"):
            proc.wait_sync(bad)  # type: ignore[arg-type]
    assert proc.wait_sync(1e300) is True
    assert proc.exit_code == 0
    for timeout in (10**400, math.inf, -(10**400), -1, 0):
        assert proc.wait_sync(timeout) is True


def test_done_callbacks_run_once_settled(world: World) -> None:
    seen: list[str] = []
    done = threading.Event()
    proc = world.ex.start(spec_of(world.ex, "exit 3"))

    def cb(p: Any) -> None:
        seen.append(p.status)
        done.set()

    proc.add_done_callback(cb)
    assert done.wait(5)
    assert seen == ["completed"] and proc.exit_code == 3
    # The node's settlement facts travel with the handle, stamped before it settles.
    local_facts = world.ex.run_sync(spec_of(world.ex, "exit 3")).resources
    assert proc.resources is not None and local_facts is not None
    assert proc.resources.containment == local_facts.containment


def test_node_death_mid_read_settles_killed_with_one_lost_delta(world: World) -> None:
    marker = new_marker()
    proc = world.ex.start(spec_of(world.ex, f"echo before; exec -a {marker} sleep 30"))
    seen: list[str] = []
    assert eventually(lambda: bool(seen.append(proc.read_output().delta)) or "".join(seen) != "")
    assert "".join(seen) == "before\n"
    assert eventually(lambda: bool(marker_pids(marker)))
    world.transport.inject("read", world.transport.die_on)
    reads = [proc.read_output().delta for _ in range(3)]
    assert reads == ["remote node lost: node-a", "", ""]
    assert proc.status == "killed" and proc.exit_code is None and proc.signal is None
    assert proc.wait_sync(1)
    assert eventually(lambda: marker_pids(marker) == [])


def test_a_silent_read_gives_up_and_kills_rather_than_lie(world: World) -> None:
    link = world.new_link(slack_s=0.3)
    ex = world.executor(link)
    marker = new_marker()
    proc = ex.start(spec_of(ex, f"exec -a {marker} sleep 30"))
    assert eventually(lambda: bool(marker_pids(marker)))
    world.transport.inject("read", world.transport.silent)
    assert proc.read_output().delta == "remote node lost: node-a"
    assert proc.status == "killed"
    # The node was only slow: the kill sent on giving up makes "killed" true there too.
    assert eventually(lambda: marker_pids(marker) == [])
    link.close()


def test_handle_of_a_dead_incarnation_is_refused(world: World, tmp_path: Any) -> None:
    proc = world.ex.start(spec_of(world.ex, "sleep 30"))
    assert isinstance(proc, RemoteShellProcess)
    # A new incarnation answers under the same name: the old handle must not reach it.
    fresh = NodeState(node_id="node-a", service=SubprocessService(spill_parent=str(tmp_path)))
    transport = InProcessTransport(fresh, world.loop)
    stale = RemoteShellProcess(world.link, transport, proc._incarnation, proc._handle_id)
    assert stale.read_output().delta == "remote node lost: node-a"
    assert stale.status == "killed"
    assert stale.kill() is False
    assert proc.kill() is True
    world.loop.submit(_dispose(fresh)).result(10)


# -- leases --------------------------------------------------------------------------------


def test_expired_lease_kills_the_clients_commands(world: World) -> None:
    marker = new_marker()
    link = world.new_link(heartbeat_s=0.1)
    ex = world.executor(link)
    proc = ex.start(spec_of(ex, f"exec -a {marker} sleep 30"))
    assert eventually(lambda: bool(marker_pids(marker)))
    time.sleep(LEASE_S * 2)  # heartbeats keep it alive
    assert marker_pids(marker) != []
    link.close()  # the harness "dies": no more heartbeats
    assert eventually(lambda: marker_pids(marker) == [], LEASE_S * 4)
    assert proc.wait_sync(2) and proc.status == "killed"


def test_expired_lease_during_a_run_is_remote_unavailable(world: World) -> None:
    link = world.new_link()
    link.close()  # no heartbeats: only the run message itself renews the lease
    ex = world.executor(link)
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec_of(ex, "sleep 5"))
    assert err.value.code == "REMOTE_UNAVAILABLE"
    link.close()


def test_a_late_retry_after_lease_expiry_never_runs_and_the_link_recovers(world: World) -> None:
    link = world.new_link()
    link.close()
    ex = world.executor(link)
    old_id = link.client_id
    with pytest.raises(ShellError) as err:
        ex.run_sync(spec_of(ex, "sleep 5"))
    assert "expired" in err.value.reason
    assert link.client_id != old_id
    # The expired client's id is refused for new work, so a duplicate that arrives late
    # cannot run a second time.
    from shellseam.ray.protocol import RunCall, wire_spec

    late = RunCall(old_id, "late-1", wire_spec(spec_of(ex, "touch late")), ex._config)
    reply = world.transport.submit("run", late).result(5)
    assert reply.fault is not None and reply.fault.code == "LEASE_EXPIRED"
    assert not os.path.exists(os.path.join(world.cwd, "late"))
    assert ex.run_sync(spec_of(ex, "echo back")).stdout.text == "back\n"


def test_a_heartbeat_after_expiry_gets_a_new_lease(world: World) -> None:
    link = world.new_link()
    link.close()
    ex = world.executor(link)
    ex.run_sync(spec_of(ex, "true"))
    old_id = link.client_id
    time.sleep(LEASE_S * 2)  # silent: the node lets the lease run out
    link.closed = False  # the harness comes back
    link.heartbeat()
    assert eventually(lambda: link.client_id != old_id)
    assert ex.run_sync(spec_of(ex, "echo fine")).stdout.text == "fine\n"


def test_dropped_settled_handles_are_forgotten_by_the_node(world: World) -> None:
    import gc

    proc = world.ex.start(spec_of(world.ex, "true"))
    assert proc.wait_sync(5)
    running = world.ex.start(spec_of(world.ex, "sleep 30"))

    def handles() -> int:
        return sum(len(c.handles) for c in world.node._clients.values())

    assert world.on_loop(handles) == 2
    del proc
    gc.collect()
    assert eventually(lambda: world.on_loop(handles) == 1)
    assert running.status == "running"  # a held handle is kept, its command untouched
    running.kill()


# -- admission -----------------------------------------------------------------------------


def test_admission_is_fair_across_clients(world: World, tmp_path: Any) -> None:
    loop = LoopThread()
    node = NodeState(
        node_id="node-b",
        max_running=1,
        lease_s=30,
        service=SubprocessService(spill_parent=str(tmp_path)),
    )
    transport = InProcessTransport(node, loop)
    greedy = RemoteShellExecutor(NodeLink("node-b", lambda: transport), cwd=world.cwd)
    polite = RemoteShellExecutor(NodeLink("node-b", lambda: transport), cwd=world.cwd)

    async def main() -> None:
        first = asyncio.ensure_future(greedy.run(spec_of(greedy, "sleep 1; echo g0 >> log")))
        await asyncio.sleep(0.1)
        more = [
            asyncio.ensure_future(greedy.run(spec_of(greedy, f"echo g{i} >> log")))
            for i in range(1, 4)
        ]
        await asyncio.sleep(0.1)
        mine = asyncio.ensure_future(polite.run(spec_of(polite, "echo p >> log")))
        await asyncio.gather(first, *more, mine)

    try:
        asyncio.run(main())
        with open(os.path.join(world.cwd, "log")) as f:
            order = f.read().split()
        assert order[0] == "g0" and order.index("p") <= 2
    finally:
        loop.submit(_dispose(node)).result(10)
        loop.stop()


def test_queued_background_kill_never_spawns(world: World, tmp_path: Any) -> None:
    loop = LoopThread()
    node = NodeState(
        node_id="node-c", max_running=1, service=SubprocessService(spill_parent=str(tmp_path))
    )
    transport = InProcessTransport(node, loop)
    ex = RemoteShellExecutor(NodeLink("node-c", lambda: transport), cwd=world.cwd)
    try:
        busy = ex.start(spec_of(ex, "sleep 30"))
        queued = ex.start(spec_of(ex, "touch spawned"))
        assert queued.status == "running"
        assert queued.kill() is True
        assert queued.wait_sync(5) and queued.status == "killed"
        busy.kill()
        assert busy.wait_sync(5)
        assert not os.path.exists(os.path.join(world.cwd, "spawned"))
    finally:
        loop.submit(_dispose(node)).result(10)
        loop.stop()


# -- environment, spill files --------------------------------------------------------------


def test_ray_names_are_stripped_but_spec_env_wins(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_JOB_ID", "01000000")
    monkeypatch.setenv("SHELLSEAM_NODE_VISIBLE", "yes")
    result = world.ex.run_sync(
        spec_of(world.ex, "env | grep -E '^(RAY_|SHELLSEAM_NODE)' | sort", env={"RAY_MINE": "1"})
    )
    assert result.stdout.text == "RAY_MINE=1\nSHELLSEAM_NODE_VISIBLE=yes\n"


def test_read_spill_streams_the_nodes_own_file_in_chunks(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shellseam.ray.client.SPILL_CHUNK_BYTES", 1000)
    monkeypatch.setattr("shellseam.ray.nodestate.SPILL_CHUNK_BYTES", 1000)
    result = world.ex.run_sync(spec_of(world.ex, "seq 1 30000", stdout_max_bytes=1000))
    path = result.stdout.spill_path
    assert result.stdout.truncated and path is not None
    expected = "".join(f"{i}\n" for i in range(1, 30001)).encode()
    assert world.ex.read_spill(path) == expected
    assert world.ex.read_spill(path, offset=10, size=2500) == expected[10:2510]
    assert world.ex.read_spill(path, offset=len(expected) + 5) == b""
    # Found by attacking: offsets past what the kernel takes raised a bare OSError (EINVAL)
    # and OverflowError from the node's pread. Past the end of the file is the end.
    for offset in (2**63 - 1, 2**63, 2**80):
        assert world.ex.read_spill(path, offset=offset) == b""
        assert world.ex.read_spill(path, offset=offset, size=10) == b""


def test_read_spill_refuses_anything_but_its_own_files(world: World, tmp_path: Any) -> None:
    result = world.ex.run_sync(spec_of(world.ex, "seq 1 30000", stdout_max_bytes=1000))
    path = result.stdout.spill_path
    assert path is not None
    spill_dir = os.path.dirname(path)
    link = os.path.join(spill_dir, "..", os.path.basename(spill_dir), "x")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    symlink = tmp_path / "link"
    symlink.symlink_to(path)
    for bad in [
        "/etc/passwd",
        str(outside),
        str(symlink),
        link,
        spill_dir,
        os.path.join(spill_dir, "nope"),
        "relative/path",
        "",
    ]:
        with pytest.raises(ShellError) as err:
            world.ex.read_spill(bad)
        assert err.value.code == "INVALID_REQUEST", bad
    for bad_args in [{"offset": -1}, {"size": -5}, {"offset": True}]:
        with pytest.raises(ShellError) as err:
            world.ex.read_spill(path, **bad_args)
        assert err.value.code == "INVALID_REQUEST"


# -- everything above the executor works unchanged -----------------------------------------


def test_bash_tool_and_task_tools_over_the_protocol(world: World, tmp_path: Any) -> None:
    runtime = TaskRuntime()
    tool = BashTool(world.ex, tasks=runtime, env=ManagedEnvRegistry(home=str(tmp_path)))
    task_output, task_list, task_kill = task_tools(runtime)
    ctx = ToolContext(session_id="s1", session_cwd=world.cwd)

    async def main() -> None:
        fg = await tool.execute({"command": "echo hi; exit 4", "description": "d"}, ctx)
        assert fg.text == "hi\n[exit code: 4]" and not fg.is_error
        bg = await tool.execute(
            {
                "command": "echo bg; touch ready; sleep 30",
                "description": "srv",
                "run_in_background": True,
            },
            ctx,
        )
        assert bg.text == "started background task bash-1"
        listed = await task_list.execute({}, ctx)
        assert listed.text == "bash-1  running  srv"
        ready = os.path.join(world.cwd, "ready")
        assert await asyncio.to_thread(eventually, lambda: os.path.exists(ready))
        await asyncio.sleep(0.1)
        out = await task_output.execute({"task_id": "bash-1"}, ctx)
        assert out.text == "task bash-1: running\nbg\n"
        killed = await task_kill.execute({"task_id": "bash-1"}, ctx)
        assert killed.text == "killed task bash-1"
        await runtime.wait("bash-1", "s1", 5000)
        assert runtime.drain_notices("s1") == ["background task bash-1 finished: killed"]
        await tool.execute(
            {"command": "sleep 30", "description": "x", "run_in_background": True}, ctx
        )
        await runtime.dispose_owner("s1")
        assert runtime.list("s1") == []

    asyncio.run(main())


def test_failed_transport_future_helper() -> None:
    fut = failed(NodeLost("x"))
    with pytest.raises(NodeLost):
        fut.result()


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=3),
    arrivals=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=25),
)
def test_admission_never_exceeds_its_limit_and_serves_clients_in_turn(
    limit: int, arrivals: list[int]
) -> None:
    from shellseam.ray.nodestate import Admission, _Client

    async def main() -> list[int]:
        admission = Admission(limit)
        clients = [_Client(f"c{i}", 0.0) for i in range(4)]
        order: list[int] = []
        peak = 0

        async def one(who: int) -> None:
            nonlocal peak
            await admission.acquire(clients[who])
            order.append(who)
            peak = max(peak, admission.running)
            await asyncio.sleep(0)
            admission.release()

        tasks = [asyncio.ensure_future(one(who)) for who in arrivals]
        await asyncio.gather(*tasks)
        assert peak <= limit and admission.running == 0 and admission.queued == 0
        return order

    order = asyncio.run(main())
    # Everyone arrives before the first release: the first ``limit`` get slots, the rest
    # are served round-robin over clients in the order each first had to wait, and in
    # arrival order within a client.
    waiting: dict[int, list[int]] = {}
    for who in arrivals[limit:]:
        waiting.setdefault(who, []).append(who)
    expected = arrivals[:limit]
    rotation = list(waiting)
    while rotation:
        who = rotation.pop(0)
        expected.append(waiting[who].pop(0))
        if waiting[who]:
            rotation.append(who)
    assert order == expected


def test_worker_additions_are_the_names_the_parent_lacks() -> None:
    pytest.importorskip("ray")
    import subprocess
    import sys

    env = {**os.environ, "ADDED_BY_RAY_WORKER": "1", "RAY_SOMETHING": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from shellseam.ray.node import worker_additions; print(worker_additions())",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "'ADDED_BY_RAY_WORKER'" in out
    assert "RAY_SOMETHING" not in out  # RAY_* goes by its own pattern
    assert "'PATH'" not in out  # the parent (this test) has it too


def test_a_bad_config_fails_before_any_remote_work(tmp_path: Any) -> None:
    ray = pytest.importorskip("ray")
    from shellseam.ray import RayShellExecutor

    if ray.is_initialized():
        pytest.skip("needs a process where Ray is not initialized")
    with pytest.raises((ValueError, ShellError)):
        RayShellExecutor(cwd=str(tmp_path), grace_ms=-1)
    service = SubprocessService()
    try:
        with pytest.raises(TypeError, match="service"):
            RayShellExecutor(cwd=str(tmp_path), service=service)
    finally:
        service.dispose()
    with pytest.raises(TypeError, match="node_id"):
        RayShellExecutor(cwd=str(tmp_path), node_id=7)  # type: ignore[arg-type]
    assert not ray.is_initialized()  # no cluster was started or joined for any of them
