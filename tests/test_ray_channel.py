"""The node service's direct channel (``shellseam.ray.channel``), on loopback, without Ray.

What users rely on: messages arrive and replies come back to the call that sent them, many in
flight at once; a peer without the token gets nothing run and nothing unpickled, on either
side; a frame altered on the way runs nothing; a broken channel fails its calls with the
protocol's safe re-ask and the transport falls back to the actor calls."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import pickle
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shellseam.ray.channel import (
    _HEADER,
    _MAGIC,
    _NONCE,
    MAX_FRAME,
    ChannelClient,
    ChannelDown,
    ChannelServer,
    ChannelTransport,
)
from shellseam.ray.protocol import (
    LoopThread,
    NodeLost,
    RetryDelivery,
    Transport,
    WireDecoder,
)


class Node:
    """A stand-in node service: decodes the message and answers what it got."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, object]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self._wire = WireDecoder()

    async def call(self, body: bytes) -> bytes:
        method, message = self._wire.decode(body)
        self.handled.append((method, message))
        if method == "boom":
            raise ValueError("boom")
        if method == "slow":
            await asyncio.sleep(random.random() / 100)
        if method == "held":
            await self.gate.wait()
        return pickle.dumps(("got", method, message))


@pytest.fixture
def node() -> Iterator[tuple[Node, ChannelServer, tuple[str, int], LoopThread]]:
    loop = LoopThread("channel-test")
    node = Node()

    async def make() -> tuple[ChannelServer, tuple[str, int]]:
        server = ChannelServer(node.call)
        return server, await server.start("127.0.0.1")

    server, address = loop.submit(make()).result(10)
    try:
        yield node, server, address, loop
    finally:
        loop.loop.call_soon_threadsafe(server.close)
        loop.stop()


def _client(server: ChannelServer, address: tuple[str, int]) -> ChannelClient:
    return ChannelClient(address[0], address[1], server.token)


def _body(method: str, message: object) -> bytes:
    return pickle.dumps((method, message))


def _wait_for(predicate: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_replies_reach_their_own_calls_with_many_in_flight(node: Any) -> None:
    _node, server, address, _loop = node
    client = _client(server, address)
    try:
        futures = [client.submit(_body("slow", i)) for i in range(64)]
        assert [f.result(10) for f in futures] == [("got", "slow", i) for i in range(64)]
    finally:
        client.close()


def test_a_handler_error_is_node_lost_with_its_message(node: Any) -> None:
    _node, server, address, _loop = node
    client = _client(server, address)
    try:
        err = client.submit(_body("boom", None)).exception(10)
        assert isinstance(err, NodeLost) and str(err) == "ValueError: boom"
        assert client.submit(_body("ping", 1)).result(10) == ("got", "ping", 1)  # still open
    finally:
        client.close()


def _raw(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_peer_without_the_token_runs_nothing(node: Any) -> None:
    nd, _server, address, _loop = node
    frame = _body("run", "rm -rf ~")
    header = _HEADER.pack(1, len(frame))
    # 1. Frames straight away, no handshake.
    sock = _raw(address)
    sock.sendall(header + frame + b"\0" * 32)
    assert _closed_by_peer(sock)
    sock.close()
    # 2. A handshake with a wrong proof, then a frame.
    sock = _raw(address)
    sock.sendall(_MAGIC + b"n" * _NONCE)
    sock.settimeout(5)
    got = b""
    while len(got) < _NONCE + 32:
        got += sock.recv(64)
    sock.sendall(b"x" * 32 + header + frame + b"\0" * 32)
    assert _closed_by_peer(sock)
    sock.close()
    # 3. The right magic but a frame's worth of garbage where the proof goes.
    with _raw(address) as sock:
        sock.sendall(_MAGIC + b"n" * _NONCE + b"\0" * 64)
        assert _closed_by_peer(sock)
    assert nd.handled == []


def test_the_client_refuses_a_peer_that_lacks_the_token() -> None:
    # A process that took the address of a dead node service: it answers the handshake
    # with bytes of its own and would send a pickle next. The client never gets that far.
    listener = socket.create_server(("127.0.0.1", 0))
    sent: list[bytes] = []

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(len(_MAGIC) + _NONCE)
            reply = b"s" * _NONCE + b"p" * 32
            conn.sendall(reply)
            sent.append(reply)
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                conn.recv(64)

    thread = threading.Thread(target=impostor)
    thread.start()
    try:
        with pytest.raises(ConnectionError, match="lacks its token"):
            ChannelClient(*listener.getsockname(), b"t" * 32)
    finally:
        thread.join(10)
        listener.close()
    assert sent


def test_an_altered_frame_runs_nothing_and_breaks_the_channel(node: Any) -> None:
    nd, server, address, _loop = node
    client = _client(server, address)
    assert client.submit(_body("ping", 1)).result(10) == ("got", "ping", 1)
    nd.gate.clear()
    held = client.submit(_body("held", 2))  # in flight when the channel breaks
    _wait_for(lambda: len(nd.handled) == 2)
    body = _body("run", "evil")
    with client._lock:  # a frame with a wrong MAC, as if injected on the way
        client._sock.sendall(_HEADER.pack(99, len(body)) + body + b"\0" * 32)
    _wait_for(lambda: not client.alive)
    assert isinstance(held.exception(10), RetryDelivery)
    with pytest.raises(ChannelDown):
        client.submit(_body("ping", 3))
    assert [m for m, _ in nd.handled] == ["ping", "held"]
    nd.gate.set()


def test_an_oversized_frame_is_refused_unread(node: Any) -> None:
    nd, server, address, _loop = node
    client = _client(server, address)
    with client._lock:
        client._sock.sendall(_HEADER.pack(1, MAX_FRAME + 1))
    _wait_for(lambda: not client.alive)
    assert nd.handled == []


def test_a_closed_client_fails_what_is_in_flight_with_a_safe_re_ask(node: Any) -> None:
    nd, server, address, _loop = node
    nd.gate.clear()
    client = _client(server, address)
    held = client.submit(_body("held", 1))
    _wait_for(lambda: len(nd.handled) == 1)
    client.close()
    assert isinstance(held.exception(10), RetryDelivery)
    nd.gate.set()


class RecordingTransport(Transport):
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.closed = False

    def submit(self, method: str, message: object) -> concurrent.futures.Future[Any]:
        self.sent.append((method, message))
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        out.set_result(("fallback", method, message))
        return out

    def close(self) -> None:
        self.closed = True


def test_the_transport_uses_the_actor_calls_until_the_channel_is_open(node: Any) -> None:
    _node, server, address, _loop = node
    fallback = RecordingTransport()
    opened = threading.Event()

    def open_channel() -> ChannelClient:
        opened.wait(10)
        return _client(server, address)

    transport = ChannelTransport(open_channel, fallback)
    try:
        assert transport.submit("ping", 1).result(10) == ("fallback", "ping", 1)
        assert not transport.channel_open
        opened.set()
        _wait_for(lambda: transport.channel_open)
        assert transport.submit("ping", 2).result(10) == ("got", "ping", 2)
        assert fallback.sent == [("ping", 1)]
    finally:
        transport.close()
    assert fallback.closed and not transport.channel_open


def test_a_channel_that_cannot_open_leaves_the_actor_calls_and_tries_again_later() -> None:
    fallback = RecordingTransport()
    attempts: list[float] = []

    def open_channel() -> ChannelClient:
        attempts.append(time.monotonic())
        raise ConnectionRefusedError("nobody listens")

    transport = ChannelTransport(open_channel, fallback, retry_after_s=0.2)
    try:
        for i in range(20):
            assert transport.submit("ping", i).result(10) == ("fallback", "ping", i)
            time.sleep(0.02)
        assert 1 <= len(attempts) <= 3  # not one attempt per message
        assert len(fallback.sent) == 20
    finally:
        transport.close()


def _on_channel(
    server: ChannelServer, address: tuple[str, int]
) -> tuple[ChannelTransport, RecordingTransport]:
    """A transport whose messages travel on its (open) channel, and its recorded fallback."""
    fallback = RecordingTransport()
    transport = ChannelTransport(lambda: _client(server, address), fallback, retry_after_s=60)
    transport.submit("ping", 0).result(10)  # through the fallback, while the channel opens
    _wait_for(lambda: transport.channel_open)
    return transport, fallback


def test_a_broken_channel_sends_the_next_message_through_the_actor(node: Any) -> None:
    _node, server, address, _loop = node
    transport, _fallback = _on_channel(server, address)
    try:
        client = transport._client
        assert client is not None
        client.close()
        assert transport.submit("ping", 1).result(10) == ("fallback", "ping", 1)
    finally:
        transport.close()


def _freeze(loop: LoopThread, seconds: float) -> None:
    """Blocks the node's event loop for ``seconds``, from when this returns (a node that
    stops answering, its connection still open: a path lost without a reset looks the same
    to the client)."""
    frozen = threading.Event()

    def block() -> None:
        frozen.set()
        time.sleep(seconds)

    loop.loop.call_soon_threadsafe(block)
    frozen.wait(5)


def test_a_stalled_channel_is_given_up_and_its_calls_asked_again(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by attacking: a channel whose peer stopped answering stayed "open" for good;
    # every call waited for the watchdog and failed as REMOTE_UNAVAILABLE while the actor
    # answered fine. A reply overdue with nothing heard is a dead channel.
    import shellseam.ray.channel as channel

    monkeypatch.setattr(channel, "STALL_S", 0.5)
    _node, server, address, loop = node
    transport, _fallback = _on_channel(server, address)
    try:
        _freeze(loop, 2.0)
        waiting = transport.submit("ping", 1)  # on the channel: no answer comes
        time.sleep(0.7)
        # The next message (the heartbeat, in the product) finds the channel stalled.
        assert transport.submit("ping", 2).result(10) == ("fallback", "ping", 2)
        assert isinstance(waiting.exception(10), RetryDelivery)  # asked again by the link
        assert not transport.channel_open
    finally:
        transport.close()


def test_submit_does_not_block_for_good_on_a_peer_that_stops_reading(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by attacking: with the peer's buffers full, sendall blocked submit (and its lock,
    # and every other caller) without end. A send gives up after SEND_TIMEOUT_S.
    import shellseam.ray.channel as channel

    monkeypatch.setattr(channel, "SEND_TIMEOUT_S", 0.5)
    _node, server, address, loop = node
    client = _client(server, address)
    _freeze(loop, 4.0)
    big = _body("ping", b"x" * (8 << 20))
    started = time.monotonic()
    with pytest.raises(ChannelDown):
        for _ in range(16):  # far more than the socket buffers hold
            client.submit(big)
    assert time.monotonic() - started < 3.5
    assert not client.alive


def test_a_forged_length_allocates_nothing_ahead() -> None:
    # Found by attacking: a 12-byte header claiming 1 GiB made the client allocate 1 GiB
    # before any of it (or its MAC) arrived.
    import tracemalloc

    from shellseam.ray.channel import _recv_exactly

    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(b"y" * 1000)
        theirs.close()
        tracemalloc.start()
        try:
            with pytest.raises(ConnectionError):
                _recv_exactly(ours, 1 << 30)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20
    finally:
        ours.close()
