"""The node service: a Ray actor per node wrapping the protocol's ``NodeState``.

One per node, named ``shellseam-node-<node_id>`` in namespace ``shellseam``, created by
whoever needs it first (``get_if_exists`` settles the creation race in the GCS), detached so
that no single harness owns it, hard-pinned to its node, reserving no CPU, never restarted
or retried by Ray (a restarted service could not know what its predecessor ran). It is an
async actor: many calls are in flight at once on its one event loop.

When the actor's process dies (``ray.kill``, SIGKILL, node removal) its
``SubprocessService`` dies with it, and with the service its commands (the containment
keeper), so no command outlives the node service that owns it.
"""

from __future__ import annotations

import os
import pickle
import select
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .channel import ChannelServer
from .nodestate import NodeState
from .protocol import (
    LEASE_S,
    CallRef,
    HandleRef,
    Heartbeat,
    HeartbeatReply,
    KillReply,
    NodeInfo,
    ReadCall,
    ReadReply,
    RunCall,
    RunReply,
    SpillRead,
    SpillReply,
    StartReply,
    WaitReply,
    WireDecoder,
)

NAMESPACE = "shellseam"
#: Calls one node service keeps in flight at once (Ray's own default for async actors).
MAX_CONCURRENCY = 10_000


def actor_name(node_id: str) -> str:
    return f"shellseam-node-{node_id}"


#: The protocol methods ``call`` dispatches to.
METHODS = frozenset(
    {
        "run",
        "abort",
        "cancel",
        "start",
        "read",
        "kill",
        "wait",
        "release",
        "heartbeat",
        "read_spill",
        "info",
    }
)


class NodeService:
    """The actor body: every method is one protocol message (see ``protocol``)."""

    def __init__(self, node_id: str, max_running: int | None, lease_s: float) -> None:
        self._state = NodeState(
            node_id=node_id,
            max_running=max_running,
            lease_s=lease_s,
            strip_env=worker_additions(),
        )
        self._wire = WireDecoder()
        self._channel = ChannelServer(self.call, self._keeper_alive)
        self._keeper: tuple[int, int, select.poll] | None = None  # pid, its pidfd, a poll on it

    async def call(self, payload: bytes) -> bytes:
        """One message as ``WireEncoder`` bytes in, the pickled reply out: Ray carries bytes
        faster than objects it must inspect (about 0.2 ms a round trip here)."""
        method, message = self._wire.decode(payload)
        if method not in METHODS:
            raise ValueError(f"unknown node service method {method!r}")
        reply = await getattr(self._state, method)(message)
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)

    def _keeper_alive(self) -> bool:
        """Whether the service's containment keeper still runs. Without it the service is
        going down or can no longer keep its promises (Ray configured to SIGKILL a worker's
        children as it exits, or someone killed the keeper): the channel then stops
        answering, and the client learns what happened through Ray, as an actor call would."""
        pid = self._state.service.keeper_pid
        if pid is None:
            return True
        if self._keeper is None or self._keeper[0] != pid:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                return False
            if self._keeper is not None:
                os.close(self._keeper[1])
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            self._keeper = (pid, fd, poller)
        return not self._keeper[2].poll(0)

    async def channel(self, msg: object = None) -> tuple[str, int, bytes]:
        """The endpoint and token of this service's direct channel (``channel.py``), listening
        on the node's address from the first ask on."""
        node_address: Callable[[], str] = ray.util.get_node_ip_address  # untyped in Ray
        host, port = await self._channel.start(node_address())
        return host, port, self._channel.token

    async def run(self, msg: RunCall) -> RunReply:
        return await self._state.run(msg)

    async def abort(self, msg: CallRef) -> None:
        await self._state.abort(msg)

    async def cancel(self, msg: CallRef) -> None:
        await self._state.cancel(msg)

    async def start(self, msg: RunCall) -> StartReply:
        return await self._state.start(msg)

    async def read(self, msg: ReadCall) -> ReadReply:
        return await self._state.read(msg)

    async def kill(self, msg: HandleRef) -> KillReply:
        return await self._state.kill(msg)

    async def wait(self, msg: HandleRef) -> WaitReply:
        return await self._state.wait(msg)

    async def heartbeat(self, msg: Heartbeat) -> HeartbeatReply:
        return await self._state.heartbeat(msg)

    async def read_spill(self, msg: SpillRead) -> SpillReply:
        return await self._state.read_spill(msg)

    async def info(self, msg: object = None) -> NodeInfo:
        return await self._state.info(msg)

    async def where(self, msg: object = None) -> tuple[str, int]:
        """The Ray node this service really runs on, and its process id."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    async def ping(self, msg: object = None) -> None:
        """An empty round trip (the benchmark's yardstick)."""
        return None


def worker_additions() -> tuple[str, ...]:
    """Names Ray put into this worker's environment that the node's own environment (its
    raylet's, the worker's parent) does not have — ``PYTHONBREAKPOINT`` pointing at Ray's
    debugger, ``OMP_NUM_THREADS`` pinned to the actor's CPU share, ``SPT_NOENV``: commands
    get the node's environment, not the Ray worker's."""
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            parent = {entry.split(b"=", 1)[0] for entry in f.read().split(b"\0") if entry}
    except OSError:
        return ()
    ours = {name for name in os.environb if name not in parent}
    return tuple(sorted(os.fsdecode(name) for name in ours if not name.startswith(b"RAY_")))


_remote_class: Any = None


def get_or_create(node_id: str, *, max_running: int | None = None, lease_s: float = LEASE_S) -> Any:
    """The node's service actor handle, creating it on that node if nobody has yet."""
    global _remote_class
    if _remote_class is None:
        _remote_class = ray.remote(NodeService)
    return _remote_class.options(
        name=actor_name(node_id),
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        num_cpus=0,
        max_restarts=0,
        max_task_retries=0,
        max_concurrency=MAX_CONCURRENCY,
        # Ray's worker would SIGKILL its direct children (the keeper and the commands) as it
        # exits, while the service still answers on its channel: a command Ray killed would
        # then be reported as an ordinary end. The keeper takes the commands down instead,
        # once the worker is gone and nothing can answer any more.
        runtime_env={"env_vars": {"RAY_kill_child_processes_on_worker_exit": "false"}},
    ).remote(node_id, max_running, lease_s)


def existing(node_id: str) -> Any | None:
    """The node's service actor handle if one is alive, else None."""
    try:
        return ray.get_actor(actor_name(node_id), namespace=NAMESPACE)
    except ValueError:
        return None
