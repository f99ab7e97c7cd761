"""A direct channel from a client to its node service, beside Ray's actor calls.

Every protocol message sent as an actor call pays Ray's per-call path: the task is
scheduled, its one argument is deserialized on the actor's event loop (one more thread
hand-off than an empty call), and Ray's threads in the driver and the actor wait alongside
the command on the node's CPUs. The messages themselves are plain bytes (``WireEncoder``),
so they can travel on a connection of their own: the node service listens on its node's
address, and a client that asked the actor for the endpoint (through Ray, as any other
message) sends its frames there. Ray keeps placement, identity, failure detection and
cleanup; when the channel cannot be opened or breaks, messages go through the actor again.

The channel trusts no one who does not hold the node service's token, a random 32 bytes
handed out only through Ray (the trust boundary Ray already has: whoever can call the actor
can run commands through it):

- *Handshake, both ways.* The client sends a nonce; the node answers with its own nonce and
  an HMAC of both under the token; the client checks it and answers with the mirror HMAC.
  Nothing is unpickled before both proofs passed, on either side: a peer without the token
  (a confined command that connects, a process that took the port of a dead service) gets
  nothing and gives nothing.
- *Every frame* after it carries an HMAC-SHA256 under a session key derived from the token
  and both nonces, over its direction, its sequence number and its bytes: a frame injected,
  altered, replayed or reordered on the way closes the connection.
- Confidentiality is Ray's: frames are not encrypted, as Ray's own gRPC traffic is not unless
  Ray runs with TLS; with ``RAY_USE_TLS`` set the channel is not used at all.

A reply that cannot arrive because the connection broke fails its future with
``RetryDelivery``: asking again is safe (call ids), and the next delivery goes through Ray
while a new connection is opened in the background.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import hmac
import itertools
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from .protocol import NodeLost, RetryDelivery, Transport, WireEncoder

_log = logging.getLogger("shellseam.ray")

_MAGIC: Final = b"shellseam-channel-1\n"
_NONCE: Final = 16
_MAC: Final = 32
#: A frame's header: request id, body length.
_HEADER: Final = struct.Struct("!QI")
#: Largest frame body either side accepts (a spill chunk or a run's tails are far below).
MAX_FRAME: Final = 1 << 30
#: Handshakes a node service runs at once; more connections are closed unanswered.
MAX_HANDSHAKES: Final = 64
#: How long a peer may take over its half of the handshake (seconds).
HANDSHAKE_S: Final = 5.0
#: After a failed attempt, or a channel that broke, messages go through Ray for this long
#: before the next attempt.
RETRY_AFTER_S: Final = 5.0
#: A channel with a message waiting this long for its reply, and nothing at all received in
#: that time, is taken for stalled (a path lost without a reset): the heartbeat every 2 s
#: keeps a healthy channel talking. Its calls are asked again through Ray.
STALL_S: Final = 6.0
#: Longest a ``submit`` may block on a full send buffer before the channel is given up.
SEND_TIMEOUT_S: Final = 5.0
#: Slice in which the reader looks whether its connection was given up.
_READ_SLICE_S: Final = 1.0
#: Largest piece read at once: memory grows with what arrives, not with what a header says.
_READ_CHUNK: Final = 1 << 20

_OK: Final = b"\0"
_ERR: Final = b"\1"


class ChannelDown(Exception):
    """The connection is gone (or never came up): send through Ray instead."""


def _proof(token: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(token, label + first + second, hashlib.sha256).digest()


def _frame_mac(key: bytes, direction: bytes, seq: int, header: bytes, body: bytes) -> bytes:
    mac = hmac.new(key, direction + seq.to_bytes(8, "big") + header, hashlib.sha256)
    mac.update(body)
    return mac.digest()


def channel_allowed() -> bool:
    """Whether the channel may carry messages here: not when Ray encrypts its own traffic."""
    return os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true", "yes")


# -- node side -----------------------------------------------------------------------------


class ChannelServer:
    """The node service's listener: frames in, ``handle(body)`` on the service's own event
    loop (many at once), replies out in whatever order they finish."""

    def __init__(
        self,
        handle: Callable[[bytes], Awaitable[bytes]],
        healthy: Callable[[], bool] = lambda: True,
    ) -> None:
        """``healthy`` is asked before every reply: once it says no, the service is going
        down (its process is being torn down around it) and the channel closes instead of
        answering, so that a client learns the outcome from Ray, as an actor call would."""
        self.token = secrets.token_bytes(32)
        self._handle = handle
        self._healthy = healthy
        self._server: asyncio.Server | None = None
        self._start_lock = asyncio.Lock()
        self._handshaking = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str) -> tuple[str, int]:
        """Listens on ``host`` (an ephemeral port) once; the address it listens on."""
        async with self._start_lock:
            if self._server is None:
                self._server = await asyncio.start_server(self._serve, host, 0)
        address = self._server.sockets[0].getsockname()
        return str(address[0]), int(address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            key = await self._accept(reader, writer)
            if key is not None:
                await self._frames(reader, writer, key)
        except (asyncio.IncompleteReadError, OSError):  # timeouts and resets among them
            pass
        finally:
            writer.close()

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes | None:
        """The session key once the peer proved it holds the token; None otherwise."""
        if self._handshaking >= MAX_HANDSHAKES:
            return None
        self._handshaking += 1
        try:
            async with asyncio.timeout(HANDSHAKE_S):
                hello = await reader.readexactly(len(_MAGIC) + _NONCE)
                if not hello.startswith(_MAGIC):
                    return None
                theirs, ours = hello[len(_MAGIC) :], secrets.token_bytes(_NONCE)
                writer.write(ours + _proof(self.token, b"node", theirs, ours))
                await writer.drain()
                answer = await reader.readexactly(_MAC)
        finally:
            self._handshaking -= 1
        if not hmac.compare_digest(answer, _proof(self.token, b"client", ours, theirs)):
            return None
        return _proof(self.token, b"session", theirs, ours)

    async def _frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes
    ) -> None:
        send_lock = asyncio.Lock()
        sent = itertools.count()
        for seq in itertools.count():
            header = await reader.readexactly(_HEADER.size)
            request, size = _HEADER.unpack(header)
            if size > MAX_FRAME:
                return
            body = await reader.readexactly(size)
            mac = await reader.readexactly(_MAC)
            if not hmac.compare_digest(mac, _frame_mac(key, b"C", seq, header, body)):
                return  # injected or altered: nothing of it runs, the connection ends
            task = asyncio.create_task(self._answer(request, body, writer, key, send_lock, sent))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(
        self,
        request: int,
        body: bytes,
        writer: asyncio.StreamWriter,
        key: bytes,
        send_lock: asyncio.Lock,
        sent: itertools.count[int],
    ) -> None:
        try:
            reply = _OK + await self._handle(body)
        except Exception as err:  # the actor call would raise it to the client: NodeLost
            reply = _ERR + f"{type(err).__name__}: {err}".encode("utf-8", "replace")
        async with send_lock:  # the sequence number is the frame's place on the wire
            if not self._healthy():
                writer.close()
            if writer.is_closing():
                return  # the client asks again elsewhere (RetryDelivery)
            if len(reply) > MAX_FRAME:
                writer.close()  # the client asks again, through Ray
                return
            header = _HEADER.pack(request, len(reply))
            writer.writelines([header, reply, _frame_mac(key, b"N", next(sent), header, reply)])
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()


# -- client side ---------------------------------------------------------------------------


def _recv_exactly(
    sock: socket.socket, size: int, alive: Callable[[], bool] = lambda: False
) -> bytes:
    """``size`` bytes from ``sock``, read in pieces (never allocated ahead of what arrived);
    a read that times out is tried again while ``alive()`` (by default, never: the timeout
    is the caller's limit)."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        try:
            piece = sock.recv(min(size - got, _READ_CHUNK))
        except TimeoutError:
            if not alive():
                raise ConnectionError("the channel was given up") from None
            continue
        if not piece:
            raise ConnectionError("the node service closed the channel")
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


class ChannelClient:
    """One authenticated connection to a node service. ``submit`` from any thread; one reader
    thread per connection settles the futures."""

    def __init__(self, host: str, port: int, token: bytes, *, timeout: float = HANDSHAKE_S):
        self.pid = os.getpid()
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ours = secrets.token_bytes(_NONCE)
            sock.sendall(_MAGIC + ours)
            answer = _recv_exactly(sock, _NONCE + _MAC)
            theirs, proof = answer[:_NONCE], answer[_NONCE:]
            if not hmac.compare_digest(proof, _proof(token, b"node", ours, theirs)):
                raise ConnectionError("the peer at the node service's address lacks its token")
            sock.sendall(_proof(token, b"client", theirs, ours))
            # Sends give up after SEND_TIMEOUT_S; the reader wakes every _READ_SLICE_S.
            sock.settimeout(_READ_SLICE_S)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._key = _proof(token, b"session", ours, theirs)
        self._lock = threading.Lock()
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._sent = itertools.count()
        self._sent_at: dict[int, float] = {}
        self.last_heard = time.monotonic()
        self.alive = True
        self._reader = threading.Thread(
            target=self._read_loop, name="shellseam-channel", daemon=True
        )
        self._reader.start()

    def submit(self, body: bytes) -> concurrent.futures.Future[Any]:
        """Sends one message; its future settles with the unpickled reply. Raises
        ``ChannelDown`` when the message could not be sent (it did not reach the node)."""
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if not self.alive:
                raise ChannelDown("closed")
            request = next(self._ids)
            header = _HEADER.pack(request, len(body))
            mac = _frame_mac(self._key, b"C", next(self._sent), header, body)
            self._pending[request] = out
            self._sent_at[request] = time.monotonic()
            try:
                self._send(header + body + mac)
            except OSError as err:  # a timeout too: part of the frame may be on the wire
                del self._pending[request]
                del self._sent_at[request]
                self._down_locked()
                raise ChannelDown(str(err)) from None
        return out

    def _send(self, data: bytes) -> None:
        """All of ``data``, or OSError (``TimeoutError`` after ``SEND_TIMEOUT_S``)."""
        view = memoryview(data)
        until = time.monotonic() + SEND_TIMEOUT_S
        while view:
            try:
                sent = self._sock.send(view)
            except TimeoutError:
                if time.monotonic() >= until:
                    raise
                continue
            view = view[sent:]

    @property
    def usable(self) -> bool:
        """Open, and this process's own (a forked child's copy shares the parent's socket)."""
        return self.alive and self.pid == os.getpid()

    def stalled(self, now: float | None = None) -> bool:
        """A message has waited ``STALL_S`` for its reply and nothing came in meanwhile."""
        now = time.monotonic() if now is None else now
        with self._lock:
            oldest = min(self._sent_at.values(), default=now)
        return now - oldest >= STALL_S and now - self.last_heard >= STALL_S

    def close(self) -> None:
        if self.pid != os.getpid():
            # A forked child's copy: shutting it down would cut the parent's connection.
            self.alive = False
            self._sock.close()
            return
        with self._lock:
            self._down_locked()

    def _down_locked(self) -> None:
        if self.alive:
            self.alive = False
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def _read_loop(self) -> None:
        def alive() -> bool:
            return self.alive

        try:
            for seq in itertools.count():
                header = _recv_exactly(self._sock, _HEADER.size, alive)
                request, size = _HEADER.unpack(header)
                if size > MAX_FRAME:
                    return
                body = _recv_exactly(self._sock, size, alive)
                mac = _recv_exactly(self._sock, _MAC, alive)
                if not hmac.compare_digest(mac, _frame_mac(self._key, b"N", seq, header, body)):
                    return  # never unpickle what the node service did not send
                self.last_heard = time.monotonic()
                with self._lock:
                    out = self._pending.pop(request, None)
                    self._sent_at.pop(request, None)
                if out is None or not out.set_running_or_notify_cancel():
                    continue
                if body[:1] == _OK:
                    try:
                        out.set_result(pickle.loads(body[1:]))
                    except Exception as err:
                        out.set_exception(NodeLost(f"undecodable reply: {err}"))
                else:
                    out.set_exception(NodeLost(body[1:].decode("utf-8", "replace")))
        except OSError:  # ConnectionError among them
            pass
        finally:
            with self._lock:
                self._down_locked()
                pending, self._pending = self._pending, {}
                self._sent_at.clear()
            self._sock.close()
            for out in pending.values():
                if out.set_running_or_notify_cancel():
                    out.set_exception(RetryDelivery("the channel to the node service broke"))


class ChannelTransport(Transport):
    """Messages on the node service's channel once it is open, through ``fallback`` (the
    actor calls) until then, while it is being opened, and after it broke."""

    def __init__(
        self,
        open_channel: Callable[[], ChannelClient],
        fallback: Transport,
        *,
        retry_after_s: float = RETRY_AFTER_S,
    ) -> None:
        """``open_channel`` connects (called on a thread of its own); ``fallback`` carries
        the messages whenever the channel does not."""
        self._open = open_channel
        self._fallback = fallback
        self._retry_after_s = retry_after_s
        self._wire = WireEncoder()
        self._lock = threading.Lock()
        self._client: ChannelClient | None = None
        self._opening = False
        self._next_try = 0.0
        self._closed = False

    @property
    def channel_open(self) -> bool:
        """Whether messages travel on the channel now."""
        client = self._client
        return client is not None and client.usable

    def submit(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        client = self._usable()
        if client is not None:
            try:
                return client.submit(self._wire.encode(method, message))
            except ChannelDown:
                pass  # never reached the node: the actor call carries it
        return self._fallback.submit(method, message)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()
        self._fallback.close()

    def _usable(self) -> ChannelClient | None:
        client = self._client
        if client is not None and client.usable:
            if not client.stalled():
                return client
            # Silent for too long with a reply due: its calls are asked again through Ray.
            client.close()
        with self._lock:
            if client is not None and client is self._client:
                # It broke (or stalled): some time on Ray before the next attempt, so that a
                # channel that keeps breaking does not cost a reconnect per message.
                self._client = None
                self._next_try = time.monotonic() + self._retry_after_s
            if self._closed or self._opening or time.monotonic() < self._next_try:
                return None
            self._opening = True
        # Opening asks the actor for the endpoint and connects: never on the caller's thread
        # (``submit`` must not block; it may run on an event loop).
        threading.Thread(target=self._open_now, name="shellseam-channel-open", daemon=True).start()
        return None

    def _open_now(self) -> None:
        client: ChannelClient | None
        try:
            client = self._open()
        except Exception as err:
            _log.debug("shellseam: channel to the node service not opened: %s", err)
            client = None
        with self._lock:
            self._opening = False
            if client is None:
                self._next_try = time.monotonic() + self._retry_after_s
                return
            if self._closed:
                client.close()
                return
            old, self._client = self._client, client
        if old is not None:
            old.close()
