"""``RemoteShellExecutor``: the seam over any ``Transport``, through a ``NodeLink``.

It resolves locally (a local twin with the same config makes exactly the checks a local
executor makes), checks every spec before sending it, as a local executor does, and runs on
the node; results are the node's own dataclasses. Aborts are forwarded by call id,
cancellation returns only once the node reports the process reaped, and a lost or silent
node is ``ShellError(REMOTE_UNAVAILABLE)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..checks import check_spec
from ..errors import REMOTE_UNAVAILABLE, ShellError
from ..executor import ShellExecutor
from ..local import LocalShellExecutor
from ..process import ShellProcess
from ..sandbox import SandboxShellExecutor
from ..types import (
    SandboxMode,
    ShellExecRequest,
    ShellExecSpec,
    ShellRunResult,
    aborted_before_start,
)
from .handle import RemoteShellProcess
from .link import NodeLink, _unavailable, lost_message
from .protocol import (
    SPILL_CHUNK_BYTES,
    CallRef,
    ExecConfig,
    Fault,
    NodeLost,
    RunCall,
    RunReply,
    SpillRead,
    SpillReply,
    StartReply,
    Transport,
    wire_spec,
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
        self,
        link: NodeLink | Callable[[], NodeLink],
        *,
        mode: SandboxMode | None = None,
        cwd: str,
        **config: Any,
    ) -> None:
        """``link`` may be a factory: it is called once the config has been validated, so
        that a bad config fails before any remote work (choosing a node, connecting)."""
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
        self._link = link if isinstance(link, NodeLink) else link()
        self.sandbox_mode = mode
        self.cwd = self._twin.cwd
        items = {**config, "cwd": self.cwd}
        self._config = ExecConfig(mode, tuple(sorted((k, _hashable(v)) for k, v in items.items())))
        self._grace_s = self._twin.grace_ms / 1000
        self._last_wire: tuple[ShellExecSpec, ShellExecSpec] | None = None

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

    def _message(self, spec: ShellExecSpec) -> RunCall:
        return RunCall(
            self._link.client_id,
            self._link.new_id(),
            self._wire_spec(spec),
            self._config,
            self._link.take_acks(),
        )

    def _wire_spec(self, spec: ShellExecSpec) -> ShellExecSpec:
        """The spec as it travels, one object per spec run again and again (the transport
        sends it once per object: ``WireEncoder``). A spec with ``env`` mappings, which
        its caller may still change, is copied at every call."""
        last = self._last_wire
        if last is not None and last[0] is spec:
            return last[1]
        wire = wire_spec(spec)
        if spec.env is None and spec.managed_env is None:
            self._last_wire = (spec, wire)
        return wire

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
        check_spec(spec)
        if spec.signal is not None and spec.signal.aborted:
            return aborted_before_start(spec)
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
        check_spec(spec)
        if spec.signal is not None and spec.signal.aborted:
            return aborted_before_start(spec)
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
        check_spec(spec)
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
