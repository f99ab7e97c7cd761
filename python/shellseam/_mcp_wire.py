"""The stdio wire of ``shellseam mcp``: JSON-RPC lines in, JSON-RPC lines out, never a crash.

The SDK's own stdio transport drops a line it cannot parse without answering (the client then
waits forever) and reads lines of any length into memory. Here every incoming line is checked
before the SDK sees it: malformed JSON, invalid UTF-8, a lone surrogate, something that is not
a JSON-RPC message, or a line over ``MAX_LINE_BYTES`` gets a JSON-RPC error reply and is
skipped (an over-long line is discarded as it streams in, never buffered whole). Replies of
the SDK and of this checker share one writer, so lines never interleave.

Reading goes through the event loop, not a worker thread: a pending read is cancellable, so
SIGTERM while the client keeps stdin open does not hang.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import mcp_types as types

#: Longest JSON-RPC line accepted (a tool argument can carry a whole file).
MAX_LINE_BYTES = 64 * 2**20
_CHUNK = 2**20

PARSE_ERROR = -32700
INVALID_REQUEST = -32600


def error_line(code: int, message: str, request_id: int | str | None = None) -> str:
    """One JSON-RPC error response line (without the newline)."""
    reply = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(reply, ensure_ascii=False)


def _request_id(message: object) -> int | str | None:
    """The id to answer, when the message carries a usable one."""
    if not isinstance(message, dict):
        return None
    value = message.get("id")
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return value


def check_line(line: bytes) -> tuple[str | None, str | None]:
    """``(text, None)`` for a line the SDK can take, ``(None, error reply)`` for one it
    cannot, ``(None, None)`` for a blank line (ignored, as JSON-RPC over stdio does)."""
    if not line.strip():
        return None, None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, error_line(PARSE_ERROR, f"Parse error: invalid UTF-8 at byte {err.start}")
    try:
        message = json.loads(text)
    except json.JSONDecodeError as err:
        return None, error_line(PARSE_ERROR, f"Parse error: {err.msg}")
    except RecursionError:
        return None, error_line(PARSE_ERROR, "Parse error: nested too deeply")
    except ValueError:  # an integer literal past Python's digit limit
        return None, error_line(PARSE_ERROR, "Parse error: a number is too long")
    request_id = _request_id(message)
    has_id = isinstance(message, dict) and message.get("id") is not None
    # A float, bool, array or object id is no usable id; a request with a null id (MCP
    # forbids it) the SDK would take for a notification and never answer.
    null_id_request = (
        isinstance(message, dict) and "method" in message and "id" in message and not has_id
    )
    if (has_id and request_id is None) or null_id_request:
        reason = "Invalid Request: id must be a string or an integer"
        return None, error_line(INVALID_REQUEST, reason)
    try:
        json.dumps(message, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        reason = "Invalid Request: a string holds a lone surrogate (not valid Unicode)"
        return None, error_line(INVALID_REQUEST, reason, request_id)
    try:
        # The very parse the SDK runs on the line: its JSON parser has a lower nesting
        # limit than json's, and a line it refuses would otherwise get no reply at all.
        types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except Exception as err:  # pydantic's ValidationError, whatever the message's shape
        if _json_refused(err):
            return None, error_line(PARSE_ERROR, "Parse error: nested too deeply", request_id)
        return None, error_line(
            INVALID_REQUEST, "Invalid Request: not a JSON-RPC message", request_id
        )
    return text, None


def _json_refused(err: Exception) -> bool:
    """Whether pydantic refused the JSON text itself (not the message's shape)."""
    errors = getattr(err, "errors", None)
    try:
        return callable(errors) and any(e.get("type") == "json_invalid" for e in errors())
    except Exception:
        return False


class StdoutLines(anyio.AsyncFile[str]):
    """The server's output: whole lines written to a private duplicate of fd 1.

    fd 1 itself points at stderr while serving, so nothing else can write into the wire.
    """

    def __init__(self, fd: int) -> None:
        super().__init__(io.StringIO())
        self._fd = fd
        self._lock = anyio.Lock()

    async def write(self, text: str) -> int:
        data = text.encode("utf-8", errors="replace")
        async with self._lock:
            await anyio.to_thread.run_sync(self._write_all, data)
        return len(text)

    async def flush(self) -> None:
        return None

    async def send(self, line: str) -> None:
        await self.write(line + "\n")

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


class _FileReader:
    """A regular file on fd 0, read on a worker thread: such a read never waits for a
    writer, and the file is not made non-blocking (that would change it for every other
    process sharing it)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def read(self, n: int) -> bytes:
        return await anyio.to_thread.run_sync(os.read, self._fd, n)


class StdinLines(anyio.AsyncFile[str]):
    """The client's requests: checked lines read by the event loop (see the module doc)."""

    def __init__(self, reader: asyncio.StreamReader | _FileReader, out: StdoutLines) -> None:
        super().__init__(io.StringIO())
        self._reader = reader
        self._out = out

    async def readline(self) -> str:  # pragma: no cover - the SDK only iterates
        async for line in self:
            return line
        return ""

    async def __aiter__(self) -> AsyncIterator[str]:
        pending = bytearray()
        skipping = False  # inside a line already answered as too long
        while chunk := await self._reader.read(_CHUNK):
            start = 0
            while start < len(chunk):
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                start = len(chunk) if end < 0 else end + 1
                if not skipping:
                    pending += piece
                    if len(pending) > MAX_LINE_BYTES:
                        pending.clear()
                        skipping = True
                        limit = f"{MAX_LINE_BYTES // 2**20} MiB"
                        await self._out.send(
                            error_line(INVALID_REQUEST, f"Invalid Request: line over {limit}")
                        )
                if end < 0:
                    continue
                if skipping:
                    skipping = False
                    continue
                text = await self._checked(bytes(pending))
                pending.clear()
                if text is not None:
                    yield text
        if pending and not skipping:
            text = await self._checked(bytes(pending))
            if text is not None:
                yield text

    async def _checked(self, line: bytes) -> str | None:
        text, reply = check_line(line)
        if reply is not None:
            await self._out.send(reply)
        return text


@asynccontextmanager
async def stdio_wire() -> AsyncIterator[tuple[StdinLines | None, StdoutLines]]:
    """Checked stdin lines (None when fd 0 is a terminal or no file: the SDK reads it) and
    the line writer; fd 1 is diverted to stderr while serving and restored after.

    Pipes and sockets are read through the loop, a regular file on a worker thread: making
    a terminal or file non-blocking would change it for every other process sharing it.
    """
    wire_fd = os.dup(1)
    os.dup2(2, 1)
    out = StdoutLines(wire_fd)
    transport: asyncio.BaseTransport | None = None
    file_fd: int | None = None
    try:
        try:
            mode = os.fstat(0).st_mode
        except OSError:
            mode = 0
        lines: StdinLines | None = None
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=_CHUNK)
            # A duplicate, so closing the transport never closes the process's own fd 0.
            pipe = os.fdopen(os.dup(0), "rb", buffering=0)
            transport, _protocol = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), pipe
            )
            lines = StdinLines(reader, out)
        elif stat.S_ISREG(mode):
            file_fd = os.dup(0)
            lines = StdinLines(_FileReader(file_fd), out)
        yield lines, out
    finally:
        if transport is not None:
            transport.close()
        if file_fd is not None:
            os.close(file_fd)
        os.dup2(wire_fd, 1)
        os.close(wire_fd)
