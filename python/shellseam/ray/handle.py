"""``RemoteShellProcess``: a background handle whose status, reads and kill go to the node.

Settlement comes from one long ``wait`` call per handle (no polling, no thread); reads carry
the cursor of the last reply received, so a lost reply is answered again with the same bytes
and nothing is delivered twice. A handle whose node service is lost settles ``killed`` and
delivers exactly one delta, ``remote node lost: <node_id>``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..checks import wait_timeout
from ..process import ShellProcess
from ..types import (
    ProcessStatus,
    ShellProcessRead,
    ShellResources,
    ShellSandboxInfo,
)
from .link import NodeLink, lost_message
from .protocol import (
    Fault,
    HandleRef,
    HandleState,
    KillReply,
    NodeLost,
    ReadCall,
    ReadReply,
    RetryDelivery,
    Transport,
    WaitReply,
)

_log = logging.getLogger("shellseam.ray")


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

    def _give_up(self, err: BaseException) -> None:
        """A node that stopped answering counts as lost; should it only be slow, the kill
        sent here makes "killed" true there too."""
        if isinstance(err, TimeoutError):
            self._link.fire(self._transport, "kill", self._ref(self._link.new_id()))

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
    def resources(self) -> ShellResources | None:
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
            except (NodeLost, TimeoutError) as err:
                self._give_up(err)
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
        except (NodeLost, TimeoutError) as err:
            self._give_up(err)
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
        return self._settled.wait(wait_timeout(timeout))

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
