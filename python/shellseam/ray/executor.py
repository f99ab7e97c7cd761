"""``RayShellExecutor``: the seam on one node of a Ray cluster (SPEC §6).

The executor binds to one node when built (the given ``node_id``, else the least loaded
alive node) and never moves: a workspace lives on one node. It talks to that node's service
actor (``node``): once the service's direct channel is open (``channel``), on that channel,
and through ``RayTransport`` until then and whenever it broke. ``RayTransport`` maps Ray's
failures onto the protocol's two: ``ActorUnavailableError`` ("may or may not have run") is a
safe re-ask, because every call carries a call id; everything else means the node service is
gone. All executors of one process share one link (one client, one lease) per node.
"""

from __future__ import annotations

import concurrent.futures
import pickle
import random
import threading
from collections.abc import Callable
from typing import Any

import ray
import ray.exceptions

from ..errors import REMOTE_UNAVAILABLE, ShellError
from ..types import SandboxMode
from . import node as _node
from .channel import ChannelClient, ChannelTransport, channel_allowed
from .client import RemoteShellExecutor
from .link import NodeLink
from .protocol import LEASE_S, NodeInfo, NodeLost, RetryDelivery, Transport, WireEncoder

#: How long to wait for a node service's facts when choosing the least loaded node.
_INFO_TIMEOUT_S = 5.0


def _mapped(err: BaseException) -> Exception:
    if isinstance(err, ray.exceptions.ActorUnavailableError):
        return RetryDelivery(str(err))
    return NodeLost(f"{type(err).__name__}: {err}")


class _RayReply(concurrent.futures.Future[Any]):
    """The future of one actor call. A blocking ``result()`` goes straight to ``ray.get``
    (the fast path of ``run_sync``); callbacks hook Ray's own future only when asked for."""

    def __init__(self, ref: Any) -> None:
        super().__init__()
        self._ref = ref
        self._hooked = False
        self._hook_lock = threading.Lock()

    def _settle(self, value: Any = None, error: BaseException | None = None) -> None:
        try:
            if error is not None:
                self.set_exception(_mapped(error))
            else:
                self.set_result(pickle.loads(value))
        except concurrent.futures.InvalidStateError:
            pass  # settled by the other path first

    def _on_ray_done(self, fut: concurrent.futures.Future[Any]) -> None:
        error = fut.exception()
        self._settle(None if error is not None else fut.result(), error)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[Any]], object]) -> None:
        with self._hook_lock:
            hook, self._hooked = not self._hooked, True
        if hook:
            self._ref.future().add_done_callback(self._on_ray_done)
        super().add_done_callback(fn)

    def result(self, timeout: float | None = None) -> Any:
        if not self.done() and not self._hooked:
            try:
                value = ray.get(self._ref, timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise concurrent.futures.TimeoutError() from None
            except Exception as err:
                self._settle(error=err)
            else:
                self._settle(value)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except concurrent.futures.TimeoutError:
            raise
        except BaseException:
            pass
        return super().exception(0)


class RayTransport(Transport):
    """Protocol messages, as ``WireEncoder`` bytes, through one node service actor handle's
    ``call``."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._wire = WireEncoder()

    def submit(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        payload = self._wire.encode(method, message)
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if not ray.is_initialized():  # never let a late call (a heartbeat) start Ray anew
            out.set_exception(NodeLost("Ray is not initialized in this process"))
            return out
        try:
            ref = self.actor.call.remote(payload)
        except Exception as err:
            out.set_exception(_mapped(err))
            return out
        return _RayReply(ref)


def _ensure_ray() -> None:
    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, log_to_driver=False)


def alive_nodes() -> list[str]:
    """The ids of the cluster's alive nodes."""
    nodes_of_cluster: Callable[[], list[dict[str, Any]]] = ray.nodes  # untyped in Ray
    nodes = nodes_of_cluster()
    return [n["NodeID"] for n in nodes if n.get("Alive")]


def _load(node_id: str) -> int:
    actor = _node.existing(node_id)
    if actor is None:
        return 0
    try:
        info: NodeInfo = ray.get(actor.info.remote(), timeout=_INFO_TIMEOUT_S)
    except Exception:
        return 1 << 30  # a service that does not answer is the most loaded of all
    return info.running + info.queued


def least_loaded_node() -> str:
    nodes = alive_nodes()
    if not nodes:
        raise ShellError(REMOTE_UNAVAILABLE, "the Ray cluster has no alive node")
    random.shuffle(nodes)  # ties go to a random node, so executors spread out
    return min(nodes, key=_load)


_links: dict[str, NodeLink] = {}
_links_lock = threading.Lock()


def _connect(node_id: str, max_running: int | None, lease_s: float) -> Transport:
    if not ray.is_initialized():
        raise NodeLost("Ray is not initialized in this process")
    if node_id not in alive_nodes():
        raise NodeLost(f"node {node_id} is not alive")
    actor = _node.get_or_create(node_id, max_running=max_running, lease_s=lease_s)
    through_ray = RayTransport(actor)
    if not channel_allowed():
        return through_ray

    def open_channel() -> ChannelClient:
        host, port, token = ray.get(actor.channel.remote(), timeout=_INFO_TIMEOUT_S)
        return ChannelClient(host, port, token)

    return ChannelTransport(open_channel, through_ray)


def link_for(node_id: str, *, max_running: int | None = None, lease_s: float = LEASE_S) -> NodeLink:
    """This process's link (client, lease) to ``node_id``'s service."""
    with _links_lock:
        link = _links.get(node_id)
        if link is None or link.closed:
            link = _links[node_id] = NodeLink(
                node_id, lambda: _connect(node_id, max_running, lease_s)
            )
        return link


class RayShellExecutor(RemoteShellExecutor):
    """A ``ShellExecutor`` whose commands run on one node of a Ray cluster.

    ``node_id``: the node to bind to (default: the least loaded alive node); ``mode``:
    ``None`` runs unconfined, else Landlock with that mode on the node; ``cwd`` and every
    other keyword are ``LocalShellExecutor`` config, validated here and applied on the node.
    ``max_running`` sizes the node service if this executor is the one that creates it
    (default: 4 x the node's CPU count).
    """

    def __init__(
        self,
        *,
        node_id: str | None = None,
        mode: SandboxMode | None = None,
        cwd: str,
        max_running: int | None = None,
        **config: Any,
    ) -> None:
        if node_id is not None and (not isinstance(node_id, str) or not node_id):
            raise TypeError(f"node_id must be a non-empty str, got {node_id!r}")
        if max_running is not None and (
            isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1
        ):
            raise ValueError(f"max_running must be a positive integer, got {max_running!r}")

        def bind() -> NodeLink:
            _ensure_ray()
            chosen = least_loaded_node() if node_id is None else node_id
            if chosen not in alive_nodes():
                raise ValueError(f"node_id: no alive Ray node has the id {chosen!r}")
            return link_for(chosen, max_running=max_running)

        super().__init__(bind, mode=mode, cwd=cwd, **config)

    def node_info(self) -> NodeInfo:
        """The node service's facts (pid, running, queued, spill directory)."""
        actor = _node.get_or_create(self.node_id)
        info: NodeInfo = ray.get(actor.info.remote(), timeout=_INFO_TIMEOUT_S)
        return info
