"""A client's link to one node service: call ids, acknowledgements, the lease and the
watchdog.

A ``NodeLink`` is one client (one lease) towards one node: it numbers calls, piggybacks
acknowledgements on later messages, keeps the lease alive from one heartbeat thread per
process, re-asks a call whose delivery may have failed (call ids make that safe), and tells
a lost node (``NodeLost``) from a silent one (the watchdog's ``TimeoutError``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import REMOTE_UNAVAILABLE, ShellError
from .protocol import (
    HEARTBEAT_S,
    WATCHDOG_SLACK_S,
    Heartbeat,
    HeartbeatReply,
    NodeLost,
    RetryDelivery,
    Transport,
)

_log = logging.getLogger("shellseam.ray")


def lost_message(node_id: str) -> str:
    """The one delta a background handle of a lost node delivers."""
    return f"remote node lost: {node_id}"


def _unavailable(reason: str) -> ShellError:
    return ShellError(REMOTE_UNAVAILABLE, reason)


class NodeLink:
    """One client of one node service: call ids, acks, lease, watchdog (module docstring)."""

    def __init__(
        self,
        node_id: str,
        connect: Callable[[], Transport],
        *,
        heartbeat_s: float = HEARTBEAT_S,
        slack_s: float = WATCHDOG_SLACK_S,
    ) -> None:
        self.node_id = node_id
        self.client_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
        self.slack_s = slack_s
        self._connect = connect
        self._lock = threading.Lock()
        self._transport: Transport | None = None
        self._ids = itertools.count(1)
        self._acks: list[str] = []
        self._releases: list[str] = []
        self._queued_seen: dict[str, float] = {}
        self.incarnation: str | None = None
        self.closed = False
        self.heartbeat_s = heartbeat_s
        _heartbeats.add(self, heartbeat_s)

    # -- plumbing ----------------------------------------------------------------------

    def transport(self) -> Transport:
        with self._lock:
            if self._transport is None:
                try:
                    self._transport = self._connect()
                except NodeLost as err:
                    raise _unavailable(f"{lost_message(self.node_id)} ({err})") from None
            return self._transport

    def forget_transport(self, transport: Transport) -> None:
        """After a loss: the next call connects afresh (a new incarnation, maybe); what the
        lost transport holds (a channel to the dead service) is released."""
        with self._lock:
            if self._transport is transport:
                self._transport = None
        transport.close()

    def new_id(self) -> str:
        return f"{self.client_id}#{next(self._ids)}"

    def take_acks(self) -> tuple[str, ...]:
        with self._lock:
            acks, self._acks = tuple(self._acks), []
            return acks

    def ack(self, call_id: str) -> None:
        with self._lock:
            self._acks.append(call_id)
            self._queued_seen.pop(call_id, None)

    def release(self, handle_id: str) -> None:
        """A background handle was dropped: the next heartbeat lets the node forget it
        once settled (its command runs on, as locally). Called from a finalizer: no I/O."""
        self._releases.append(handle_id)

    def renew_identity(self) -> None:
        """After the node declared this client's lease expired: a new client id (a new
        lease); handles of the old one are gone with it."""
        with self._lock:
            self.client_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
            self._acks.clear()
            self._queued_seen.clear()

    def seen(self, reply_incarnation: str) -> None:
        self.incarnation = reply_incarnation

    def heartbeat(self) -> None:
        """Renews the lease (and delivers acks) without waiting for the reply."""
        with self._lock:
            transport = self._transport
        if self.closed or transport is None:
            return  # nothing to renew: no call went out since the last loss
        acks = self.take_acks()
        with self._lock:
            releases, self._releases = tuple(self._releases), []
        fut = transport.submit("heartbeat", Heartbeat(self.client_id, acks, releases))

        def done(f: concurrent.futures.Future[Any]) -> None:
            error = f.exception()
            if error is not None:
                with self._lock:
                    self._acks.extend(acks)
                    self._releases.extend(releases)
                if isinstance(error, NodeLost):  # stop renewing a dead incarnation
                    self.forget_transport(transport)
                return
            reply: HeartbeatReply = f.result()
            if reply.expired:
                self.renew_identity()
                return
            now = time.monotonic()
            with self._lock:
                for call_id in reply.queued:
                    self._queued_seen[call_id] = now

        fut.add_done_callback(done)

    def deadline(self, call_id: str, sent_at: float, budget_s: float) -> float:
        """The watchdog: the budget counts from the send, or from the last heartbeat that
        still saw the call waiting for admission (queueing is not silence)."""
        with self._lock:
            return max(sent_at, self._queued_seen.get(call_id, sent_at)) + budget_s

    def close(self) -> None:
        self.closed = True
        _heartbeats.discard(self)
        with self._lock:
            transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    # -- delivery --------------------------------------------------------------------

    def call_sync(
        self,
        transport: Transport,
        method: str,
        message: object,
        deadline: Callable[[], float],
    ) -> Any:
        """Delivers ``message`` and waits for the reply, re-asking on ``RetryDelivery``;
        raises ``NodeLost`` or ``TimeoutError`` (the watchdog)."""
        for pause in _backoff():
            fut = transport.submit(method, message)
            while True:
                remaining = deadline() - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(method)
                try:
                    return fut.result(timeout=min(remaining, 1.0))
                except RetryDelivery:
                    break
                except concurrent.futures.TimeoutError:
                    continue
            time.sleep(min(pause, max(deadline() - time.monotonic(), 0)))
        raise AssertionError("unreachable")  # pragma: no cover

    async def call_async(
        self,
        transport: Transport,
        method: str,
        message: object,
        deadline: Callable[[], float],
    ) -> Any:
        """``call_sync`` on the running loop; cancelling it leaves the call in flight."""
        for pause in _backoff():
            fut = asyncio.wrap_future(transport.submit(method, message))
            while True:
                remaining = deadline() - time.monotonic()
                if remaining <= 0:
                    fut.cancel()
                    raise TimeoutError(method)
                done, _ = await asyncio.wait([fut], timeout=min(remaining, 1.0))
                if not done:
                    continue
                try:
                    return fut.result()
                except RetryDelivery:
                    break
            await asyncio.sleep(min(pause, max(deadline() - time.monotonic(), 0)))
        raise AssertionError("unreachable")  # pragma: no cover

    def fire(self, transport: Transport, method: str, message: object) -> None:
        """Fire and forget (an abort) on the call's own transport: a failure only means
        that incarnation is gone, and its commands with it."""
        try:
            transport.submit(method, message)
        except Exception:
            _log.debug("could not deliver %s to %s", method, self.node_id, exc_info=True)


def _backoff() -> Iterator[float]:
    """Pauses between re-asks of a call whose delivery may have failed."""
    pause = 0.01
    while True:
        yield pause
        pause = min(pause * 2, 1.0)


# -- the process-wide heartbeat ------------------------------------------------------------


class _Heartbeats:
    """One daemon thread renews every live link's lease, each at its own period."""

    def __init__(self) -> None:
        self._due: weakref.WeakKeyDictionary[NodeLink, float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, link: NodeLink, period_s: float) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the thread is the parent's
                self._thread, self._pid = None, os.getpid()
            link.heartbeat_s = period_s
            self._due[link] = time.monotonic() + period_s
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="shellseam-ray-heartbeat", daemon=True
                )
                self._thread.start()
            else:
                self._wake.set()

    def discard(self, link: NodeLink) -> None:
        with self._lock:
            self._due.pop(link, None)

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            with self._lock:
                due = [link for link, at in self._due.items() if at <= now]
                for link in due:
                    self._due[link] = now + link.heartbeat_s
                next_at = min(self._due.values(), default=now + HEARTBEAT_S)
            for link in due:
                try:
                    link.heartbeat()
                except Exception:
                    _log.debug("heartbeat to %s failed", link.node_id, exc_info=True)
            self._wake.wait(max(next_at - time.monotonic(), 0.0))
            self._wake.clear()


_heartbeats = _Heartbeats()
