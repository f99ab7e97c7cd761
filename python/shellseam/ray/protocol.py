"""The node protocol: plain messages between a harness and a node service, and the transport
they travel on.

Nothing here knows Ray: the messages are frozen dataclasses of the seam's own vocabulary, and
a ``Transport`` is anything that delivers ``(method, message)`` to a node service and hands
back a future of its reply. Ray is one transport (``shellseam.ray.executor``); an in-process
one (``InProcessTransport``) drives the same node state machine in the tests, and a websocket
or HTTP transport could carry the same messages later.

The guarantees live in the messages, not in the transport:
- every call has a client-chosen ``call_id``, so a call delivered twice runs once and a call
  whose reply was lost can be asked again (the node answers from its record);
- an abort names its call id and is remembered when it arrives before the call itself;
- background reads carry a cursor: the node drops a read's bytes only when a later read
  confirms it arrived, so a lost reply never loses output and a duplicate never repeats it;
- every reply names the node service's incarnation, and requests about a background handle
  name the incarnation that issued it: a handle from a dead incarnation is refused;
- a client's messages renew its lease; a node kills the commands of a client whose lease ran
  out (the harness died or was cut off).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, cast

from ..checks import unmark
from ..types import (
    ProcessStatus,
    ShellExecSpec,
    ShellProcessRead,
    ShellResources,
    ShellRunResult,
    ShellSandboxInfo,
)

_T = TypeVar("_T")

#: How long a node keeps a silent client's commands alive (seconds).
LEASE_S: Final = 8.0
#: How often a client renews its lease.
HEARTBEAT_S: Final = 2.0
#: Extra slack of the client's watchdog beyond ``timeout + 2 x grace``.
WATCHDOG_SLACK_S: Final = 10.0
#: Largest piece of a spill file one reply carries.
SPILL_CHUNK_BYTES: Final = 4 * 2**20

FaultCode = Literal[
    "STALE_INCARNATION",
    "UNKNOWN_HANDLE",
    "LEASE_EXPIRED",
    "DUPLICATE",
    "SPAWN_FAILED",
    "SANDBOX_UNAVAILABLE",
    "INVALID_REQUEST",
    "DISPOSED",
]


# -- transport -----------------------------------------------------------------------------


class TransportError(Exception):
    """Base of the two ways a delivery can fail."""


class NodeLost(TransportError):
    """The node service is gone (dead incarnation, removed node): nothing will answer."""


class RetryDelivery(TransportError):
    """The call may or may not have reached the node; asking again is safe (call ids)."""


class Transport(ABC):
    """Delivers one message to one node service incarnation and returns a future reply.

    A future fails with ``NodeLost`` or ``RetryDelivery``; anything else is a bug.
    ``submit`` must not block and may be called from any thread.
    """

    @abstractmethod
    def submit(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        """Send ``message`` to the node's ``method``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the transport holds (nothing by default)."""


# -- wire values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A refusal or infrastructure failure, as data (never a remote traceback)."""

    code: FaultCode
    reason: str


@dataclass(frozen=True)
class ExecConfig:
    """How the node builds the executor for a call: the caller's mode and executor config."""

    mode: str | None
    config: tuple[tuple[str, Any], ...]

    def kwargs(self) -> dict[str, Any]:
        return dict(self.config)


@dataclass(frozen=True)
class HandleState:
    """A background handle's settlement facts, stamped by the node."""

    status: ProcessStatus
    exit_code: int | None
    signal: str | None
    sandbox: ShellSandboxInfo | None
    resources: ShellResources | None = None


@dataclass(frozen=True)
class RunCall:
    client_id: str
    call_id: str
    spec: ShellExecSpec  # with signal=None: the abort travels as its own message
    config: ExecConfig
    acks: tuple[str, ...] = ()  # earlier call ids whose replies arrived (records can go)


@dataclass(frozen=True)
class RunReply:
    incarnation: str
    result: ShellRunResult | None
    fault: Fault | None = None


@dataclass(frozen=True)
class CallRef:
    """Names a foreground call (abort, cancel)."""

    client_id: str
    call_id: str


@dataclass(frozen=True)
class StartReply:
    incarnation: str
    handle_id: str
    fault: Fault | None = None


@dataclass(frozen=True)
class HandleRef:
    """Names a background handle of one incarnation; ``request_id`` dedupes kills."""

    client_id: str
    incarnation: str
    handle_id: str
    request_id: str = ""


@dataclass(frozen=True)
class ReadCall:
    client_id: str
    incarnation: str
    handle_id: str
    cursor: int  # the sequence number of the last read reply the client received (0: none)


@dataclass(frozen=True)
class ReadReply:
    incarnation: str
    seq: int
    read: ShellProcessRead | None
    state: HandleState | None
    fault: Fault | None = None


@dataclass(frozen=True)
class KillReply:
    incarnation: str
    killed: bool
    fault: Fault | None = None


@dataclass(frozen=True)
class WaitReply:
    incarnation: str
    state: HandleState | None
    fault: Fault | None = None


@dataclass(frozen=True)
class Heartbeat:
    client_id: str
    acks: tuple[str, ...] = ()
    releases: tuple[str, ...] = ()  # background handles the client dropped


@dataclass(frozen=True)
class HeartbeatReply:
    incarnation: str
    queued: tuple[str, ...]  # this client's call ids still waiting for admission
    expired: bool = False  # the lease had run out: this client id is refused from now on


@dataclass(frozen=True)
class SpillRead:
    path: str
    offset: int
    size: int


@dataclass(frozen=True)
class SpillReply:
    incarnation: str
    data: bytes
    fault: Fault | None = None


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    incarnation: str
    pid: int
    running: int
    queued: int
    max_running: int
    spill_dir: str | None
    clients: int


def wire_spec(spec: ShellExecSpec) -> ShellExecSpec:
    """The spec as it travels: no abort signal (a local object), env as plain dicts."""
    return ShellExecSpec(
        **{
            **{name: getattr(spec, name) for name in spec.__dataclass_fields__},
            "signal": None,
            "env": _plain(spec.env),
            "managed_env": _plain(spec.managed_env),
        }
    )


def _plain(env: Mapping[str, str] | None) -> dict[str, str] | None:
    return None if env is None else dict(env)


# -- bytes on the wire ------------------------------------------------------------------------

#: Distinct specs and configs a ``WireEncoder`` or ``WireDecoder`` keeps (then starts over).
_WIRE_CACHE_SIZE: Final = 256


class WireEncoder:
    """Messages as bytes for a transport that carries bytes (the Ray one), sender side.

    A ``RunCall`` travels as ``(method, client_id, call_id, spec, config, acks)`` with its
    spec and config as pickled blobs made once per spec and config object: every call of one
    executor repeats them, and pickling them again and unpickling them on the node cost more
    than the rest of the message (a few us each warm, several times that after each child
    runs). Every other message is the pickled ``(method, message)``. Thread-safe: a race
    pickles one object twice."""

    def __init__(self) -> None:
        self._blobs: dict[int, tuple[object, bytes]] = {}

    def _blob(self, obj: object) -> bytes:
        entry = self._blobs.get(id(obj))
        if entry is not None and entry[0] is obj:  # holding obj keeps its id unique
            return entry[1]
        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(self._blobs) >= _WIRE_CACHE_SIZE:
            self._blobs.clear()
        self._blobs[id(obj)] = (obj, blob)
        return blob

    def encode(self, method: str, message: object) -> bytes:
        if type(message) is RunCall:
            parts: tuple[object, ...] = (
                method,
                message.client_id,
                message.call_id,
                self._blob(message.spec),
                self._blob(message.config),
                message.acks,
            )
        else:
            parts = (method, message)
        return pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)


class WireDecoder:
    """``WireEncoder``'s bytes back into ``(method, message)``, node side: one spec and one
    config object per distinct blob, so that the node checks a spec once
    (``checks.with_signal``) and finds its executor by the same config object."""

    def __init__(self) -> None:
        self._objects: dict[bytes, object] = {}

    def _object(self, blob: object, kind: type[_T]) -> _T:
        if not isinstance(blob, bytes):
            raise ValueError(f"malformed message: {kind.__name__} is not bytes")
        obj = self._objects.get(blob)
        if obj is None:
            obj = pickle.loads(blob)
            if type(obj) is not kind:
                raise ValueError(f"malformed message: expected {kind.__name__}")
            if isinstance(obj, ShellExecSpec):
                unmark(obj)  # the node checks every spec it is sent itself, once
            if len(self._objects) >= _WIRE_CACHE_SIZE:
                self._objects.clear()
            self._objects[blob] = obj
        return cast(_T, obj)

    def decode(self, payload: bytes) -> tuple[str, object]:
        parts = pickle.loads(payload)
        if type(parts) is not tuple or not parts or type(parts[0]) is not str:
            raise ValueError("malformed message")
        if len(parts) == 6:
            method, client_id, call_id, spec, config, acks = parts
            call = RunCall(
                client_id,
                call_id,
                self._object(spec, ShellExecSpec),
                self._object(config, ExecConfig),
                acks,
            )
            return method, call
        if len(parts) != 2:
            raise ValueError("malformed message")
        return parts[0], parts[1]


# -- in-process transport ------------------------------------------------------------------


class LoopThread:
    """An event loop on a thread of its own: the stand-in for an actor's loop."""

    def __init__(self, name: str = "shellseam-node") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        """Cancels what is still pending, then stops and closes the loop."""

        async def cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.submit(cancel_all()).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class InProcessTransport(Transport):
    """Delivers messages to a node object's coroutine methods on a ``LoopThread``."""

    def __init__(self, node: object, loop: LoopThread) -> None:
        self.node = node
        self.loop_thread = loop
        self.lost = False

    def submit(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        if self.lost:
            return failed(NodeLost("node service is gone"))
        handler: Callable[[object], Coroutine[Any, Any, Any]] = getattr(self.node, method)
        coro = handler(message)
        try:
            return self.loop_thread.submit(coro)
        except RuntimeError:  # the loop is closed: the node is gone
            coro.close()
            return failed(NodeLost("node loop is closed"))


def failed(exc: BaseException) -> concurrent.futures.Future[Any]:
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_exception(exc)
    return fut
