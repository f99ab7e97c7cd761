"""The client side of the protocol: a link to one node service, the remote background
handle, and an executor that speaks the seam over any ``Transport``.

A ``NodeLink`` is one client (one lease) towards one node: it numbers calls, piggybacks
acknowledgements, keeps the lease alive from one heartbeat thread per process, and turns a
lost or silent node into ``ShellError(REMOTE_UNAVAILABLE)``. ``RemoteShellExecutor`` resolves
locally (the same checks as a local executor with the same config) and runs on the node;
``RemoteShellProcess`` is a ``ShellProcess`` whose status, reads and kill go to the node.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import math
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from ..errors import REMOTE_UNAVAILABLE, ShellError
from ..executor import ShellExecutor
from ..local import LocalShellExecutor
from ..process import ShellProcess
from ..sandbox import SandboxShellExecutor
from ..types import (
    CollectedOutput,
    ProcessStatus,
    SandboxMode,
    ShellExecRequest,
    ShellExecSpec,
    ShellProcessRead,
    ShellRunResult,
    ShellSandboxInfo,
)
from .protocol import (
    HEARTBEAT_S,
    SPILL_CHUNK_BYTES,
    WATCHDOG_SLACK_S,
    CallRef,
    ExecConfig,
    Fault,
    HandleRef,
    HandleState,
    Heartbeat,
    HeartbeatReply,
    KillReply,
    NodeLost,
    ReadCall,
    ReadReply,
    RetryDelivery,
    RunCall,
    RunReply,
    SpillRead,
    SpillReply,
    StartReply,
    Transport,
    WaitReply,
    wire_spec,
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
        """After a loss: the next call connects afresh (a new incarnation, maybe)."""
        with self._lock:
            if self._transport is transport:
                self._transport = None

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
    """One daemon thread renews every live link's lease."""

    def __init__(self) -> None:
        self._links: weakref.WeakSet[NodeLink] = weakref.WeakSet()
        self._period = HEARTBEAT_S
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, link: NodeLink, period_s: float) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the thread is the parent's
                self._thread, self._pid = None, os.getpid()
            self._links.add(link)
            self._period = min(self._period, period_s)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="shellseam-ray-heartbeat", daemon=True
                )
                self._thread.start()
            else:
                self._wake.set()

    def discard(self, link: NodeLink) -> None:
        with self._lock:
            self._links.discard(link)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._period)
            self._wake.clear()
            with self._lock:
                links = list(self._links)
            for link in links:
                try:
                    link.heartbeat()
                except Exception:
                    _log.debug("heartbeat to %s failed", link.node_id, exc_info=True)


_heartbeats = _Heartbeats()


# -- the remote background handle ----------------------------------------------------------


class RemoteShellProcess(ShellProcess):
    """A background handle whose status, reads and kill go to the node (SPEC §6)."""

    def __init__(
        self, link: NodeLink, transport: Transport, incarnation: str, handle_id: str
    ) -> None:
        # The local ShellProcess state is not used: everything lives on the node.
        self._link = link
        self._client_id = link.client_id  # the lease this handle was started under
        self._transport = transport
        self._incarnation = incarnation
        self._handle_id = handle_id
        self._lock = threading.Lock()  # state; never held across a round trip
        self._read_lock = threading.Lock()  # one read at a time (the cursor)
        self._settled = threading.Event()
        self._state: HandleState | None = None
        self._lost = False
        self._lost_delivered = False
        self._cursor = 0
        self._callbacks: list[Callable[[ShellProcess], None]] = []
        weakref.finalize(self, link.release, handle_id)
        self._watch()

    @property
    def node_id(self) -> str:
        return self._link.node_id

    def _ref(self, request_id: str = "") -> HandleRef:
        return HandleRef(self._client_id, self._incarnation, self._handle_id, request_id)

    def _watch(self) -> None:
        fut = self._transport.submit("wait", self._ref())

        def done(f: concurrent.futures.Future[Any]) -> None:
            exc = f.exception()
            if isinstance(exc, RetryDelivery):
                self._watch()
                return
            if exc is not None:
                self._settle_lost()
                return
            reply: WaitReply = f.result()
            if reply.fault is not None or reply.state is None:
                self._settle_lost()
            else:
                self._settle(reply.state)

        fut.add_done_callback(done)

    def _settle(self, state: HandleState) -> None:
        with self._lock:
            if self._settled.is_set():
                return
            self._state = state
            self._settled.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # one bad callback must not stop the others
                _log.exception("exception in a ShellProcess done callback")

    def _settle_lost(self) -> None:
        # Whatever the node still held for this handle is gone with it: the next read
        # says so once, even for a handle that had settled normally before.
        with self._lock:
            self._lost = True
        self._link.forget_transport(self._transport)
        self._settle(HandleState(status="killed", exit_code=None, signal=None, sandbox=None))

    # -- state -------------------------------------------------------------------------

    @property
    def status(self) -> ProcessStatus:
        state = self._state
        return "running" if state is None else state.status

    @property
    def exit_code(self) -> int | None:
        state = self._state
        return None if state is None else state.exit_code

    @property
    def signal(self) -> str | None:
        state = self._state
        return None if state is None else state.signal

    @property
    def sandbox(self) -> ShellSandboxInfo | None:
        state = self._state
        return None if state is None else state.sandbox

    @property
    def resources(self) -> object | None:
        state = self._state
        return None if state is None else state.resources

    # -- reading -----------------------------------------------------------------------

    def _deadline(self) -> Callable[[], float]:
        until = time.monotonic() + self._link.slack_s
        return lambda: until

    def read_output(self) -> ShellProcessRead:
        """Output since the previous read, exactly once, even across lost replies."""
        with self._read_lock:
            if self._lost:
                first = not self._lost_delivered
                self._lost_delivered = True
                delta = lost_message(self._link.node_id) if first else ""
                return ShellProcessRead(delta=delta, lossy=False)
            cursor = self._cursor
            message = ReadCall(self._client_id, self._incarnation, self._handle_id, cursor)
            try:
                reply: ReadReply = self._link.call_sync(
                    self._transport, "read", message, self._deadline()
                )
            except (NodeLost, TimeoutError):
                reply = ReadReply("", 0, None, None, Fault("UNKNOWN_HANDLE", "lost"))
            if reply.fault is None and reply.read is not None and reply.seq > cursor:
                self._cursor = reply.seq
                read = reply.read
                state = reply.state
            else:
                read = None
                state = None
        if read is None:
            if reply.fault is not None:
                self._settle_lost()
                return self.read_output()
            return ShellProcessRead(delta="", lossy=False)  # a duplicate reply: nothing new
        if state is not None and state.status != "running":
            self._settle(state)
        return read

    # -- control -----------------------------------------------------------------------

    def kill(self) -> bool:
        """Kills the remote group; False once settled or while a kill is under way."""
        if self._settled.is_set():
            return False
        message = self._ref(self._link.new_id())
        try:
            reply: KillReply = self._link.call_sync(
                self._transport, "kill", message, self._deadline()
            )
        except (NodeLost, TimeoutError):
            self._settle_lost()
            return True
        if reply.fault is not None:
            self._settle_lost()
            return True
        return reply.killed

    async def wait(self) -> None:
        if self._settled.is_set():
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not fut.done():
                fut.set_result(None)

        def wake(_p: ShellProcess) -> None:
            loop.call_soon_threadsafe(resolve)

        self.add_done_callback(wake)
        await fut

    def wait_sync(self, timeout: float | None = None) -> bool:
        if timeout is not None and math.isinf(timeout):
            timeout = None
        return self._settled.wait(timeout)

    def add_done_callback(self, cb: Callable[[ShellProcess], None]) -> None:
        with self._lock:
            if not self._settled.is_set():
                self._callbacks.append(cb)
                return
        cb(self)

    def __repr__(self) -> str:
        return (
            f"RemoteShellProcess(node={self._link.node_id!r}, "
            f"handle={self._handle_id!r}, status={self.status!r})"
        )


# -- the executor --------------------------------------------------------------------------

_EMPTY = CollectedOutput(
    text="", truncated=False, spill_path=None, total_bytes=0, spill_truncated=False
)


#: Configuration attributes a remote executor answers from its local twin.
_CONFIG_NAMES = frozenset(
    {
        "timeout_ms",
        "max_timeout_ms",
        "max_output_bytes",
        "max_spill_bytes",
        "grace_ms",
        "scrub_patterns",
        "allow_env",
        "managed_prefix",
        "limits",
        "containment",
        "default_mode",
    }
)


def _hashable(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


class RemoteShellExecutor(ShellExecutor):
    """The seam on a node service reached through a ``NodeLink`` (any transport)."""

    def __init__(
        self, link: NodeLink, *, mode: SandboxMode | None = None, cwd: str, **config: Any
    ) -> None:
        if "service" in config:
            raise TypeError(
                "service: a remote executor runs on its node service; it takes no local one"
            )
        # The local twin validates the config exactly as a local executor would and
        # resolves requests; it never spawns anything.
        self._twin: LocalShellExecutor = (
            LocalShellExecutor(cwd=cwd, **config)
            if mode is None
            else SandboxShellExecutor(mode=mode, cwd=cwd, **config)
        )
        self._link = link
        self.sandbox_mode = mode
        self.cwd = self._twin.cwd
        items = {**config, "cwd": self.cwd}
        self._config = ExecConfig(mode, tuple(sorted((k, _hashable(v)) for k, v in items.items())))
        self._grace_s = self._twin.grace_ms / 1000

    @property
    def node_id(self) -> str:
        return self._link.node_id

    def __getattr__(self, name: str) -> Any:
        # The executor's configuration reads as a local executor's (``ex.timeout_ms``);
        # nothing else of the twin (its service, its spawning) is reachable.
        if name in _CONFIG_NAMES and "_twin" in self.__dict__:
            return getattr(self._twin, name)
        raise AttributeError(name)

    @property
    def link(self) -> NodeLink:
        return self._link

    def resolve(self, request: ShellExecRequest) -> ShellExecSpec:
        return self._twin.resolve(request)

    # -- foreground --------------------------------------------------------------------

    def _budget_s(self, spec: ShellExecSpec) -> float:
        return spec.timeout_ms / 1000 + 2 * self._grace_s + self._link.slack_s

    def _aborted_before_start(self, spec: ShellExecSpec) -> ShellRunResult:
        return ShellRunResult(
            exit_code=None,
            signal=None,
            timed_out=False,
            aborted=True,
            timeout_ms=spec.timeout_ms,
            stdout=_EMPTY,
            stderr=_EMPTY,
            duration_ms=0.0,
        )

    def _message(self, spec: ShellExecSpec) -> RunCall:
        return RunCall(
            self._link.client_id,
            self._link.new_id(),
            wire_spec(spec),
            self._config,
            self._link.take_acks(),
        )

    def _watch_signal(
        self, spec: ShellExecSpec, call: RunCall, transport: Transport
    ) -> Callable[[], None]:
        if spec.signal is None:
            return lambda: None
        ref = CallRef(call.client_id, call.call_id)
        return spec.signal.add_listener(lambda: self._link.fire(transport, "abort", ref))

    def _finish(self, call: RunCall, reply: RunReply) -> ShellRunResult:
        self._link.ack(call.call_id)
        self._link.seen(reply.incarnation)
        if reply.fault is not None:
            self._raise_fault(reply.fault)
        assert reply.result is not None
        return reply.result

    def _raise_fault(self, fault: Fault) -> NoReturn:
        code = fault.code
        if code in ("SPAWN_FAILED", "SANDBOX_UNAVAILABLE", "INVALID_REQUEST", "DISPOSED"):
            raise ShellError(code, fault.reason)
        if code == "LEASE_EXPIRED":
            self._link.renew_identity()
            raise _unavailable(f"lease on node {self.node_id} expired; the call was killed")
        raise _unavailable(f"{lost_message(self.node_id)} ({code.lower()})")

    def _lost(self, transport: Transport, err: BaseException) -> ShellError:
        if isinstance(err, NodeLost):
            self._link.forget_transport(transport)
            return _unavailable(lost_message(self.node_id))
        return _unavailable(f"node {self.node_id} stopped answering (watchdog)")

    def run_sync(self, spec: ShellExecSpec) -> ShellRunResult:
        if spec.signal is not None and spec.signal.aborted:
            return self._aborted_before_start(spec)
        call = self._message(spec)
        transport = self._link.transport()
        sent_at = time.monotonic()
        budget = self._budget_s(spec)
        remove = self._watch_signal(spec, call, transport)
        try:
            reply = self._link.call_sync(
                transport,
                "run",
                call,
                lambda: self._link.deadline(call.call_id, sent_at, budget),
            )
        except (NodeLost, TimeoutError) as err:
            self._link.fire(transport, "cancel", CallRef(call.client_id, call.call_id))
            raise self._lost(transport, err) from None
        except BaseException:
            # KeyboardInterrupt while waiting: nothing may be left running.
            self._cancel_sync(transport, call, budget)
            raise
        finally:
            remove()
        return self._finish(call, reply)

    def _cancel_sync(self, transport: Transport, call: RunCall, budget: float) -> None:
        until = time.monotonic() + budget
        with contextlib.suppress(NodeLost, TimeoutError):
            self._link.call_sync(
                transport, "cancel", CallRef(call.client_id, call.call_id), lambda: until
            )

    async def run(self, spec: ShellExecSpec) -> ShellRunResult:
        if spec.signal is not None and spec.signal.aborted:
            return self._aborted_before_start(spec)
        call = self._message(spec)
        transport = self._link.transport()
        sent_at = time.monotonic()
        budget = self._budget_s(spec)
        remove = self._watch_signal(spec, call, transport)
        try:
            reply = await self._link.call_async(
                transport,
                "run",
                call,
                lambda: self._link.deadline(call.call_id, sent_at, budget),
            )
        except (NodeLost, TimeoutError) as err:
            self._link.fire(transport, "cancel", CallRef(call.client_id, call.call_id))
            raise self._lost(transport, err) from None
        except asyncio.CancelledError:
            await self._cancel_async(transport, call, budget)
            raise
        finally:
            remove()
        return self._finish(call, reply)

    async def _cancel_async(self, transport: Transport, call: RunCall, budget: float) -> None:
        """Kills the call and returns only once the node reports it reaped (or is gone)."""
        until = time.monotonic() + budget
        task = asyncio.ensure_future(
            self._link.call_async(
                transport, "cancel", CallRef(call.client_id, call.call_id), lambda: until
            )
        )
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                continue
            except (NodeLost, TimeoutError):
                return

    # -- background --------------------------------------------------------------------

    def start(self, spec: ShellExecSpec) -> ShellProcess:
        call = self._message(spec)
        transport = self._link.transport()
        until = time.monotonic() + self._link.slack_s
        try:
            reply: StartReply = self._link.call_sync(transport, "start", call, lambda: until)
        except (NodeLost, TimeoutError) as err:
            raise self._lost(transport, err) from None
        self._link.seen(reply.incarnation)
        if reply.fault is not None:
            self._raise_fault(reply.fault)
        return RemoteShellProcess(self._link, transport, reply.incarnation, reply.handle_id)

    # -- spill files -------------------------------------------------------------------

    def _watchdog(self) -> Callable[[], float]:
        until = time.monotonic() + self._link.slack_s
        return lambda: until

    def read_spill(self, path: str, offset: int = 0, size: int | None = None) -> bytes:
        """Reads one of the node service's own spill files, in chunks; anything else (a
        path outside its spill directory, a symlink) is ``INVALID_REQUEST``."""
        if not isinstance(path, str):
            raise ShellError("INVALID_REQUEST", "path must be a string")
        for name, value in (("offset", offset), ("size", size)):
            if value is None and name == "size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ShellError("INVALID_REQUEST", f"{name} must be a non-negative integer")
        transport = self._link.transport()
        parts: list[bytes] = []
        position = offset
        wanted = math.inf if size is None else size
        got = 0
        while got < wanted:
            chunk = int(min(SPILL_CHUNK_BYTES, wanted - got))
            try:
                reply: SpillReply = self._link.call_sync(
                    transport, "read_spill", SpillRead(path, position, chunk), self._watchdog()
                )
            except (NodeLost, TimeoutError) as err:
                raise self._lost(transport, err) from None
            if reply.fault is not None:
                code = reply.fault.code
                raise ShellError(
                    code if code == "INVALID_REQUEST" else REMOTE_UNAVAILABLE, reply.fault.reason
                )
            if not reply.data:
                break
            parts.append(reply.data)
            got += len(reply.data)
            position += len(reply.data)
        return b"".join(parts)
