"""The node side of the protocol: one state machine per node service incarnation.

It owns one ``SubprocessService`` and runs every call through an ordinary local (or
sandboxed) executor built from the caller's config, so results are the very dataclasses a
local run returns. On top it keeps what the protocol promises (``protocol`` module
docstring): call records keyed by call id, early aborts, read cursors, leases, admission.

Everything runs on one asyncio loop (the actor's); done callbacks of background processes
come back to it through ``ShellProcess.wait``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ..abort import AbortController
from ..checks import with_signal
from ..errors import ShellError
from ..local import LocalShellExecutor
from ..process import ShellProcess
from ..sandbox import SandboxShellExecutor
from ..service import SubprocessService
from ..types import SandboxMode, ShellExecRequest, ShellExecSpec, ShellProcessRead, ShellRunResult
from .protocol import (
    LEASE_S,
    SPILL_CHUNK_BYTES,
    CallRef,
    ExecConfig,
    Fault,
    HandleRef,
    HandleState,
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
)

_log = logging.getLogger("shellseam.ray")

#: Environment names a node never passes on: they would point a command at the cluster.
RAY_ENV_PATTERN = "RAY_*"
#: How many finished call ids a client's record remembers (duplicate deliveries, aborts).
_REMEMBERED_IDS = 4096

_DEFAULT_SCRUB: tuple[str, ...] = tuple(
    inspect.signature(LocalShellExecutor).parameters["scrub_patterns"].default
)
_EMPTY_READ = ShellProcessRead(delta="", lossy=False)


class _Bounded:
    """An insertion-ordered set that forgets its oldest members."""

    def __init__(self, limit: int = _REMEMBERED_IDS) -> None:
        self._items: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._limit = limit

    def add(self, item: str) -> None:
        self._items[item] = None
        if len(self._items) > self._limit:
            self._items.popitem(last=False)

    def discard(self, item: str) -> None:
        self._items.pop(item, None)

    def __contains__(self, item: object) -> bool:
        return item in self._items


@dataclass(eq=False)
class _Call:
    """One foreground call: its abort controller, its task and, once done, its reply."""

    call_id: str
    controller: AbortController = field(default_factory=AbortController)
    reply: asyncio.Future[RunReply] | None = None
    admit_task: asyncio.Task[None] | None = None
    queued: bool = True
    lease_expired: bool = False

    @property
    def stopped(self) -> bool:
        return self.controller.signal.aborted

    def stop(self, reason: str) -> None:
        self.controller.abort(reason)
        if self.admit_task is not None:
            self.admit_task.cancel()


@dataclass(eq=False)
class _Handle:
    """One background command: queued until admitted, then a local ``ShellProcess``."""

    handle_id: str
    proc: ShellProcess | None = None
    killed_while_queued: bool = False
    admit_task: asyncio.Task[None] | None = None
    released: bool = False  # the client dropped its handle: forget it once settled
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    state: HandleState | None = None  # stamped once settled
    pending: tuple[int, ReadReply] | None = None  # the last read, until confirmed
    kill_answers: dict[str, bool] = field(default_factory=dict)

    @property
    def stopped(self) -> bool:
        return self.killed_while_queued


@dataclass(eq=False)
class _Client:
    client_id: str
    last_seen: float
    calls: dict[str, _Call] = field(default_factory=dict)
    handles: dict[str, _Handle] = field(default_factory=dict)
    early_aborts: _Bounded = field(default_factory=_Bounded)
    finished: _Bounded = field(default_factory=_Bounded)
    waiting: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)


class Admission:
    """At most ``limit`` commands at once; waiters are served round-robin across clients."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self._rotation: collections.deque[_Client] = collections.deque()

    @property
    def queued(self) -> int:
        return sum(len(c.waiting) for c in self._rotation)

    def try_acquire(self) -> bool:
        """Takes a slot at once if one is free and nobody is waiting."""
        if self.running < self.limit and not self._rotation:
            self.running += 1
            return True
        return False

    async def acquire(self, client: _Client) -> None:
        if self.try_acquire():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        client.waiting.append(fut)
        if client not in self._rotation:
            self._rotation.append(client)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # admitted and cancelled in the same instant
            else:
                self._forget(client, fut)
            raise

    def release(self) -> None:
        self.running -= 1
        self._admit()

    def _forget(self, client: _Client, fut: asyncio.Future[None]) -> None:
        if fut in client.waiting:
            client.waiting.remove(fut)
        if not client.waiting and client in self._rotation:
            self._rotation.remove(client)

    def _admit(self) -> None:
        while self.running < self.limit and self._rotation:
            client = self._rotation.popleft()
            fut = client.waiting.popleft()
            if client.waiting:
                self._rotation.append(client)  # the next turn goes to another client
            if not fut.done():
                self.running += 1
                fut.set_result(None)


def _request_from(spec: ShellExecSpec, controller: AbortController) -> ShellExecRequest:
    """The spec as a request again: the node's executor resolves it afresh (idempotent on
    an already resolved spec), so node-side facts — ``$TMPDIR``, pinned roots — are the
    node's own."""
    names = ShellExecRequest.__dataclass_fields__
    values = {name: getattr(spec, name) for name in spec.__dataclass_fields__ if name in names}
    values["signal"] = controller.signal
    return ShellExecRequest(**values)


def _fault(err: ShellError) -> Fault:
    code = err.code if err.code in ("SPAWN_FAILED", "SANDBOX_UNAVAILABLE", "DISPOSED") else None
    return Fault(code or "INVALID_REQUEST", err.reason)


def _handle_state(proc: ShellProcess) -> HandleState:
    return HandleState(
        status=proc.status,
        exit_code=proc.exit_code,
        signal=proc.signal,
        sandbox=proc.sandbox,
        resources=proc.resources,
    )


_KILLED_QUEUED = HandleState(status="killed", exit_code=None, signal=None, sandbox=None)


class NodeState:
    """The node service's state machine (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: str,
        max_running: int | None = None,
        lease_s: float = LEASE_S,
        service: SubprocessService | None = None,
        clock: Callable[[], float] = time.monotonic,
        strip_env: tuple[str, ...] = (),
    ) -> None:
        if max_running is None:
            max_running = 4 * (os.cpu_count() or 1)
        if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
            raise ValueError(f"max_running must be a positive integer, got {max_running!r}")
        self.node_id = node_id
        self.strip_env = strip_env  # exact names the node's host process added to its env
        self.incarnation = secrets.token_hex(8)
        self.lease_s = lease_s
        self.service = service if service is not None else SubprocessService()
        self._clock = clock
        self._clients: dict[str, _Client] = {}
        self._executors: dict[ExecConfig, LocalShellExecutor] = {}
        self._admission = Admission(max_running)
        self._reaper: asyncio.Task[None] | None = None
        self._expired = _Bounded()  # clients whose lease ran out: their work is refused

    # -- clients and leases ------------------------------------------------------------

    def _client(self, client_id: str) -> _Client:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_leases())
        client = self._clients.get(client_id)
        if client is None:
            client = self._clients[client_id] = _Client(client_id, self._clock())
        client.last_seen = self._clock()
        return client

    def _ack(self, client: _Client, acks: tuple[str, ...]) -> None:
        for call_id in acks:
            call = client.calls.get(call_id)
            if call is not None and call.reply is not None and call.reply.done():
                del client.calls[call_id]

    async def _reap_leases(self) -> None:
        period = max(min(self.lease_s / 8, 1.0), 0.01)
        while True:
            await asyncio.sleep(period)
            self.expire_leases()

    def expire_leases(self) -> None:
        """Kills the commands of every client silent for longer than the lease."""
        now = self._clock()
        for client in list(self._clients.values()):
            if now - client.last_seen > self.lease_s:
                self._expire(client)

    def _expire(self, client: _Client) -> None:
        del self._clients[client.client_id]
        self._expired.add(client.client_id)
        for call in client.calls.values():
            call.lease_expired = True
            call.stop("lease expired")
        for handle in client.handles.values():
            self._kill_handle(handle)

    # -- foreground ------------------------------------------------------------------

    async def run(self, msg: RunCall) -> RunReply:
        if msg.client_id in self._expired:  # a late retry must never run a call again
            return RunReply(self.incarnation, None, Fault("LEASE_EXPIRED", self.node_id))
        client = self._client(msg.client_id)
        self._ack(client, msg.acks)
        call = client.calls.get(msg.call_id)
        if call is None:
            if msg.call_id in client.finished:
                return RunReply(self.incarnation, None, Fault("DUPLICATE", msg.call_id))
            call = client.calls[msg.call_id] = _Call(msg.call_id)
            client.finished.add(msg.call_id)
            if msg.call_id in client.early_aborts:
                call.controller.abort("aborted before start")
            # The first delivery runs the call inline (no task: this is the hot path);
            # duplicates and re-asks wait for its reply.
            call.reply = asyncio.get_running_loop().create_future()
            try:
                reply = await self._run(client, call, msg)
            except BaseException:
                call.reply.cancel()
                raise
            call.reply.set_result(reply)
            return reply
        assert call.reply is not None
        return await asyncio.shield(call.reply)

    async def _run(self, client: _Client, call: _Call, msg: RunCall) -> RunReply:
        try:
            executor = self._executor(msg.config)
            spec = self._node_spec(executor, msg, call.controller)
        except ShellError as err:
            return RunReply(self.incarnation, None, _fault(err))
        except (TypeError, ValueError) as err:
            return RunReply(self.incarnation, None, Fault("INVALID_REQUEST", str(err)))
        admitted = await self._admit(client, call)
        call.queued = False
        try:
            # An abort that came while queued makes this return "aborted" without a spawn.
            result: ShellRunResult = await executor.run(spec)
        except ShellError as err:
            return RunReply(self.incarnation, None, _fault(err))
        finally:
            if admitted:
                self._admission.release()
        if call.lease_expired:
            return RunReply(self.incarnation, None, Fault("LEASE_EXPIRED", self.node_id))
        return RunReply(self.incarnation, result)

    def _node_spec(
        self, executor: LocalShellExecutor, msg: RunCall, controller: AbortController
    ) -> ShellExecSpec:
        """The spec the node runs. A sandboxing executor resolves it afresh, so that its
        node-side facts (``$TMPDIR``, pinned roots) are the node's; an unconfined one has
        nothing node-specific to add to what the client's twin resolved."""
        if isinstance(executor, SandboxShellExecutor):
            return executor.resolve(_request_from(msg.spec, controller))
        return with_signal(msg.spec, controller.signal)

    async def _admit(self, client: _Client, record: _Call | _Handle) -> bool:
        """Waits for a slot; False when the record was aborted or killed while queued."""
        if record.stopped:
            return False
        if self._admission.try_acquire():
            return True
        record.admit_task = asyncio.get_running_loop().create_task(self._admission.acquire(client))
        try:
            await record.admit_task
        except asyncio.CancelledError:
            if not record.stopped:
                raise
            return False
        finally:
            record.admit_task = None
        return True

    async def abort(self, msg: CallRef) -> None:
        client = self._client(msg.client_id)
        call = client.calls.get(msg.call_id)
        if call is not None:
            call.stop("aborted by the caller")
        elif msg.call_id not in client.finished:
            client.early_aborts.add(msg.call_id)

    async def cancel(self, msg: CallRef) -> None:
        """Aborts the call and answers once its process has been reaped."""
        client = self._client(msg.client_id)
        call = client.calls.get(msg.call_id)
        if call is None:
            # Cancelled before it arrived: the caller has stopped waiting, so the call, when
            # it comes, is refused like a duplicate (nothing runs, no record is kept).
            client.finished.add(msg.call_id)
            return
        call.stop("cancelled by the caller")
        if call.reply is not None:
            await asyncio.wait([call.reply])
        client.calls.pop(msg.call_id, None)

    # -- background --------------------------------------------------------------------

    async def start(self, msg: RunCall) -> StartReply:
        if msg.client_id in self._expired:
            return StartReply(self.incarnation, msg.call_id, Fault("LEASE_EXPIRED", self.node_id))
        client = self._client(msg.client_id)
        self._ack(client, msg.acks)
        if msg.call_id in client.handles or msg.call_id in client.finished:
            return StartReply(self.incarnation, msg.call_id)  # a duplicate: already started
        try:
            executor = self._executor(msg.config)
            spec = executor.resolve(_request_from(msg.spec, AbortController()))
        except ShellError as err:
            return StartReply(self.incarnation, msg.call_id, _fault(err))
        except (TypeError, ValueError) as err:
            return StartReply(self.incarnation, msg.call_id, Fault("INVALID_REQUEST", str(err)))
        handle = client.handles[msg.call_id] = _Handle(msg.call_id)
        client.finished.add(msg.call_id)
        asyncio.get_running_loop().create_task(self._background(client, handle, executor, spec))
        return StartReply(self.incarnation, msg.call_id)

    async def _background(
        self, client: _Client, handle: _Handle, executor: LocalShellExecutor, spec: ShellExecSpec
    ) -> None:
        admitted = False
        try:
            admitted = await self._admit(client, handle)
            if not admitted:
                handle.state = _KILLED_QUEUED
                return
            try:
                handle.proc = executor.start(spec)
            except Exception:  # DISPOSED (the service is going away) or a bug: nothing ran
                _log.exception("background start failed on node %s", self.node_id)
                handle.state = _KILLED_QUEUED
                return
            await handle.proc.wait()
            handle.state = _handle_state(handle.proc)
        finally:
            if admitted:
                self._admission.release()
            handle.settled.set()
            if handle.released:
                client.handles.pop(handle.handle_id, None)

    def _lookup(self, client_id: str, incarnation: str, handle_id: str) -> _Handle | Fault:
        if incarnation != self.incarnation:
            return Fault("STALE_INCARNATION", f"handle of incarnation {incarnation}")
        client = self._client(client_id)
        handle = client.handles.get(handle_id)
        if handle is None:
            return Fault("UNKNOWN_HANDLE", handle_id)
        return handle

    def _current_state(self, handle: _Handle) -> HandleState:
        if handle.state is not None:
            return handle.state
        if handle.proc is not None and handle.proc.status != "running":
            return _handle_state(handle.proc)
        return HandleState(status="running", exit_code=None, signal=None, sandbox=None)

    async def read(self, msg: ReadCall) -> ReadReply:
        handle = self._lookup(msg.client_id, msg.incarnation, msg.handle_id)
        if isinstance(handle, Fault):
            return ReadReply(self.incarnation, 0, None, None, handle)
        if handle.pending is not None:
            seq, reply = handle.pending
            if seq == msg.cursor + 1:
                return reply  # the client never got it: the same bytes again, not new ones
            if seq != msg.cursor:
                return ReadReply(
                    self.incarnation, 0, None, None, Fault("UNKNOWN_HANDLE", "cursor mismatch")
                )
        seq = handle.pending[0] + 1 if handle.pending is not None else 1
        # The state is sampled before the output, so a settled state comes with the final
        # output (as TaskRuntime.read relies on).
        state = self._current_state(handle)
        read = handle.proc.read_output() if handle.proc is not None else _EMPTY_READ
        reply = ReadReply(self.incarnation, seq, read, state)
        handle.pending = (seq, reply)
        return reply

    async def kill(self, msg: HandleRef) -> KillReply:
        handle = self._lookup(msg.client_id, msg.incarnation, msg.handle_id)
        if isinstance(handle, Fault):
            return KillReply(self.incarnation, False, handle)
        answer = handle.kill_answers.get(msg.request_id) if msg.request_id else None
        if answer is None:
            answer = self._kill_handle(handle)
            if msg.request_id:
                handle.kill_answers[msg.request_id] = answer
        return KillReply(self.incarnation, answer)

    def _kill_handle(self, handle: _Handle) -> bool:
        if handle.proc is not None:
            return handle.proc.kill()
        if handle.settled.is_set() or handle.killed_while_queued:
            return False
        handle.killed_while_queued = True
        if handle.admit_task is not None:
            handle.admit_task.cancel()
        return True

    async def wait(self, msg: HandleRef) -> WaitReply:
        handle = self._lookup(msg.client_id, msg.incarnation, msg.handle_id)
        if isinstance(handle, Fault):
            return WaitReply(self.incarnation, None, handle)
        await handle.settled.wait()
        return WaitReply(self.incarnation, self._current_state(handle))

    # -- leases, spill files, facts ----------------------------------------------------

    async def heartbeat(self, msg: Heartbeat) -> HeartbeatReply:
        if msg.client_id in self._expired:
            return HeartbeatReply(self.incarnation, (), expired=True)
        client = self._client(msg.client_id)
        self._ack(client, msg.acks)
        for handle_id in msg.releases:
            # A dropped handle's command keeps running, as locally; its record goes once
            # it has settled.
            handle = client.handles.get(handle_id)
            if handle is not None:
                handle.released = True
                if handle.settled.is_set():
                    del client.handles[handle_id]
        queued = tuple(call.call_id for call in client.calls.values() if call.queued)
        return HeartbeatReply(self.incarnation, queued)

    async def read_spill(self, msg: SpillRead) -> SpillReply:
        try:
            data = self._read_spill(msg.path, msg.offset, msg.size)
        except ShellError as err:
            return SpillReply(self.incarnation, b"", _fault(err))
        return SpillReply(self.incarnation, data)

    def _read_spill(self, path: object, offset: object, size: object) -> bytes:
        if not isinstance(path, str) or not path or "\0" in path:
            raise ShellError("INVALID_REQUEST", "path must be a non-empty string")
        for name, value in (("offset", offset), ("size", size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ShellError("INVALID_REQUEST", f"{name} must be a non-negative integer")
        assert isinstance(offset, int) and isinstance(size, int)
        spill_dir = self.service.spill_dir
        refused = ShellError("INVALID_REQUEST", f"not a spill file of this node service: {path}")
        if spill_dir is None or not os.path.isabs(path):
            raise refused
        # Every component must be the real one (no symlink anywhere), the file a direct
        # child of the spill directory; O_NOFOLLOW closes the race for the last component.
        real_dir = os.path.realpath(spill_dir)
        if os.path.realpath(path) != os.path.normpath(path):
            raise refused
        if os.path.dirname(os.path.normpath(path)) != real_dir:
            raise refused
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as err:
            raise ShellError("INVALID_REQUEST", f"cannot open {path}: {err.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise refused
            if offset >= info.st_size:
                # The end (an offset past what pread takes would raise, not read nothing).
                return b""
            return os.pread(fd, min(size, SPILL_CHUNK_BYTES), offset)
        finally:
            os.close(fd)

    async def info(self, _msg: object = None) -> NodeInfo:
        return NodeInfo(
            node_id=self.node_id,
            incarnation=self.incarnation,
            pid=os.getpid(),
            running=self._admission.running,
            queued=self._admission.queued,
            max_running=self._admission.limit,
            spill_dir=self.service.spill_dir,
            clients=len(self._clients),
        )

    def dispose(self) -> None:
        """Kills and reaps everything (the service's own dispose), stops the lease reaper."""
        if self._reaper is not None:
            self._reaper.cancel()
        self.service.dispose()

    # -- executors ---------------------------------------------------------------------

    def _executor(self, config: ExecConfig) -> LocalShellExecutor:
        executor = self._executors.get(config)
        if executor is None:
            kwargs: dict[str, Any] = config.kwargs()
            kwargs.pop("service", None)
            scrub = tuple(kwargs.pop("scrub_patterns", _DEFAULT_SCRUB))
            kwargs["scrub_patterns"] = (*scrub, RAY_ENV_PATTERN, *self.strip_env)
            if config.mode is None:
                executor = LocalShellExecutor(service=self.service, **kwargs)
            else:
                executor = SandboxShellExecutor(
                    mode=cast(SandboxMode, config.mode), service=self.service, **kwargs
                )
            self._executors[config] = executor
        return executor
