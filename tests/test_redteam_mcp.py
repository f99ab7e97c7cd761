"""Red team on the MCP server's wire: messages a hostile or broken client sends.

Before the fix, a line the SDK could not parse (malformed JSON, a lone surrogate, JSON that
is not JSON-RPC) got no reply at all: the client waited forever for its request's answer.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_INITIALIZE = (
    b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": '
    b'"2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}\n'
)


class Wire:
    def __init__(self, server: subprocess.Popen[bytes]) -> None:
        self.server = server

    def send(self, line: bytes) -> None:
        assert self.server.stdin is not None
        self.server.stdin.write(line + b"\n")
        self.server.stdin.flush()

    def reply(self, within_s: float = 20.0) -> dict[str, Any]:
        assert self.server.stdout is not None
        ready, _, _ = select.select([self.server.stdout], [], [], within_s)
        assert ready, "no reply from the server"
        message: dict[str, Any] = json.loads(self.server.stdout.readline())
        return message


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[Wire]:
    workdir, home = tmp_path / "ws", tmp_path / "home"
    workdir.mkdir()
    command = [sys.executable, "-m", "shellseam.cli", "mcp", "--workdir", str(workdir)]
    server = subprocess.Popen(
        [*command, "--home", str(home)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        w = Wire(server)
        w.send(_INITIALIZE.rstrip(b"\n"))
        assert "serverInfo" in w.reply()["result"]
        w.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        yield w
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        assert server.stdout is not None and server.stdin is not None
        server.stdout.close()
        server.stdin.close()


def tool_call(request_id: int, arguments: bytes) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"bash",'
        b'"arguments":%s}}' % (request_id, arguments)
    )


@pytest.mark.parametrize(
    ("line", "reply_id", "code"),
    [
        # A lone surrogate in a tool argument: the request id is known, so it is answered.
        (tool_call(5, b'{"command":"echo \\ud800","description":"d"}'), 5, -32700),
        (b'{"jsonrpc":"2.0","id":"s","method":"tools/list","params":{"x":"\\udc80"}}', "s", -32700),
        (b"{not json", None, -32700),
        (b"\xff\xfe{", None, -32700),
        (b'{"id": 9, "hello": 1}', 9, -32600),
        (b"[1, 2]", None, -32600),
        # A null id (MCP forbids it): the SDK took it for a notification and never
        # answered, so the client waited forever (red team).
        (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', None, -32600),
        (
            tool_call(0, b'{"command":"echo x","description":"d"}').replace(
                b'"id":0', b'"id":null'
            ),
            None,
            -32600,
        ),
    ],
)
def test_every_malformed_message_gets_an_error_reply(
    wire: Wire, line: bytes, reply_id: object, code: int
) -> None:
    wire.send(line)
    reply = wire.reply()
    # SPEC asks for a JSON-RPC error reply; a line whose JSON carries an id is answered with
    # it. (A lone surrogate in valid JSON may be called a parse error or an invalid request.)
    assert reply["jsonrpc"] == "2.0" and reply["id"] == reply_id
    assert reply["error"]["code"] in ({code} if reply_id is None else {-32700, -32600})
    assert reply["error"]["message"]
    # ... and the connection keeps serving.
    wire.send(tool_call(6, b'{"command":"echo ok","description":"d"}'))
    reply = wire.reply()
    assert reply["id"] == 6
    assert reply["result"]["content"][0]["text"] == "ok\n[exit code: 0]"


def test_model_arguments_of_odd_types_over_the_wire(wire: Wire) -> None:
    cases = [
        (
            b'{"command":"echo hi","description":"d","timeoutMs":1' + b"0" * 400 + b"}",
            "hi\n[exit code: 0]",
        ),
        (
            b'{"command":"echo hi","description":"d","timeoutMs":"abc"}',
            'Error: invalid timeoutMs: expected a positive number, got "abc"',
        ),
        (
            b'{"command":"echo hi","description":"d","workdir":7}',
            "Error: invalid workdir: expected a string",
        ),
        (
            b'{"command":"echo \\u0000x","description":"d"}',
            "Error: invalid request: command contains a NUL byte",
        ),
        (
            b'{"command":["echo"],"description":"d"}',
            "Error: invalid command: expected a non-empty string",
        ),
    ]
    for n, (arguments, text) in enumerate(cases):
        wire.send(tool_call(100 + n, arguments))
        reply = wire.reply()
        assert reply["id"] == 100 + n
        assert reply["result"]["content"][0]["text"] == text


def test_an_over_long_line_is_answered_and_skipped(wire: Wire) -> None:
    # SPEC §6: over 64 MiB is answered with an error and skipped, never a crash. Before the
    # fix the limit was 256 MiB and a longer line ended the connection.
    filler = b"x" * (64 * 2**20 + 10)
    wire.send(tool_call(41, b'{"command":"echo %s","description":"d"}' % filler))
    reply = wire.reply(60)
    assert reply["id"] in (41, None)
    assert reply["error"]["code"] in (-32700, -32600)
    assert "64 MiB" in reply["error"]["message"]
    wire.send(tool_call(42, b'{"command":"echo ok","description":"d"}'))
    reply = wire.reply()
    assert reply["id"] == 42
    assert reply["result"]["content"][0]["text"] == "ok\n[exit code: 0]"


def test_a_long_line_under_the_limit_still_runs(wire: Wire) -> None:
    payload = b"y" * (8 * 2**20)
    wire.send(tool_call(43, b'{"command":"printf %%s %s | wc -c","description":"d"}' % payload))
    reply = wire.reply(60)
    assert reply["result"]["content"][0]["text"] == f"{len(payload)}\n[exit code: 0]"


def test_a_file_on_stdin_gets_the_same_replies(tmp_path: Path) -> None:
    # Found by attacking: with a regular file on stdin the SDK read it itself, and its bad
    # lines got no reply at all.
    workdir, home = tmp_path / "ws", tmp_path / "home"
    workdir.mkdir()
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(
        _INITIALIZE
        + b"{not json\n"
        + b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}\n'
        + b'{"jsonrpc":"2.0","id":2,"method":"ping"}\n'
    )
    command = [sys.executable, "-m", "shellseam.cli", "mcp", "--workdir", str(workdir)]
    with requests.open("rb") as stdin:
        done = subprocess.run(
            [*command, "--home", str(home)], stdin=stdin, capture_output=True, timeout=60
        )
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    # The wire answers a bad line at once, the SDK a good one when it gets to it.
    errors = sorted(r["error"]["code"] for r in replies if r.get("id") is None)
    assert errors == [-32700, -32600], replies
    answered = {r["id"]: r for r in replies if r.get("id") is not None}
    assert sorted(answered) == [1, 2], replies
    assert "serverInfo" in answered[1]["result"] and answered[2]["result"] == {}


def assert_ray_address_refused(tmp_path: Path, address: str, reason: str) -> None:
    """``shellseam mcp --ray-address <address>`` exits 125 at once with one line, the
    REMOTE_UNAVAILABLE message ending in ``reason``, and no traceback."""
    command = [sys.executable, "-m", "shellseam.cli", "mcp", "--ray-address", address]
    done = subprocess.run(
        [*command, "--workdir", str(tmp_path), "--home", str(tmp_path / "home")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 125, done.stderr
    assert done.stdout == b""
    assert done.stderr.decode().endswith(
        f"REMOTE_UNAVAILABLE: cannot reach the Ray cluster at {address}: {reason}\n"
    )
    assert b"Traceback" not in done.stderr


def test_an_unreachable_ray_address_is_one_line_at_once(tmp_path: Path) -> None:
    # Found by attacking: `ray.init` retried an address nothing listens on for minutes,
    # printing Ray's log lines, and SIGTERM did not end it.
    pytest.importorskip("ray")
    with socket.socket() as s:  # a loopback port surely closed: bound, never listening
        s.bind(("127.0.0.1", 0))
        assert_ray_address_refused(
            tmp_path, f"127.0.0.1:{s.getsockname()[1]}", "Connection refused"
        )


class _FakeServer:
    """A loopback TCP server that accepts and then stays silent, or answers one fixed reply
    and closes: something that listens on the address but is not a Ray cluster."""

    def __init__(self, reply: bytes | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply = reply
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.reply is None:
                self.held.append(conn)
            else:
                with conn:
                    conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (None, "no answer as a Ray (gRPC) server within 5 s"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not a Ray (gRPC) server"),
        (b"", "not a Ray (gRPC) server"),
    ],
    ids=["silent", "http1", "closes"],
)
def test_a_ray_address_that_is_not_a_ray_cluster_is_one_line(
    tmp_path: Path, reply: bytes | None, reason: str
) -> None:
    # Found by attacking: an address that accepts TCP but is not Ray passed the reachability
    # check, and `ray.init` then waited on it for minutes (5 min here before SIGTERM ended it).
    pytest.importorskip("ray")
    server = _FakeServer(reply)
    try:
        assert_ray_address_refused(tmp_path, server.address, reason)
    finally:
        server.close()
