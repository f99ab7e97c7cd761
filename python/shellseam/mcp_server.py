"""``shellseam mcp``: the bash and task tools served over Model Context Protocol on stdio.

Built on the official ``mcp`` SDK's low-level ``Server``. The tools are the library's own
(``BashTool`` and the task tools) with their JSON schemas unchanged; a call's result is the
tool's text as one ``TextContent`` plus ``isError``. A stdio server has exactly one client
connection, and that connection is one session: a fresh session id is the owner of every
background task it starts. When the client disconnects (EOF on stdin) or the server is told
to stop (SIGTERM, SIGINT), the session's tasks are killed, the subprocess service is disposed
(every process it still owns killed and reaped, spill files removed) and ``run`` returns, so
nothing the server started outlives it.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import stat
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage

from .env import ManagedEnvRegistry
from .local import LocalShellExecutor
from .sandbox import SandboxShellExecutor
from .service import SubprocessService
from .tasks import TaskRuntime
from .tool.bash import BashTool
from .tool.context import ToolContext, ToolResult
from .tool.tasks import task_tools
from .types import SANDBOX_MODES, SandboxMode

# A JSON-RPC line from a client can carry a whole file; asyncio's default 64 KiB line limit
# would kill the connection on the first large tool argument. A longer line is answered with
# an error and skipped (SPEC §6).
_MAX_MESSAGE_BYTES = 64 * 2**20
_TOO_LONG = f"Parse error: message longer than {_MAX_MESSAGE_BYTES} bytes"

# A line the SDK will refuse, in order: its request id when known, and the error to answer
# (None: decided from the SDK's exception).
_Rejection = tuple["types.RequestId | None", "types.ErrorData | None"]


class _Tool(Protocol):
    """What the server needs from a tool: ``BashTool`` and the task tools have this shape."""

    def schema(self) -> dict[str, Any]: ...
    async def execute(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult: ...


@dataclass(frozen=True)
class _Session:
    """The one session a stdio connection is: its tools, task runtime and calling context."""

    tools: Mapping[str, _Tool]
    tasks: TaskRuntime
    ctx: ToolContext


def run(*, sandbox: str | None, workdir: str, home: str) -> int:
    """Serve MCP on stdin/stdout until the client disconnects or SIGTERM/SIGINT; exit status.

    ``sandbox`` None runs commands unconfined (``LocalShellExecutor``), else a Landlock mode
    for ``SandboxShellExecutor``; ``workdir`` is the session's cwd (and sandbox workspace);
    ``home`` becomes ``DSH_HOME``. A bad argument prints one line on stderr and returns 2.
    """
    if sandbox is not None and sandbox not in SANDBOX_MODES:
        choices = ", ".join(SANDBOX_MODES)
        print(
            f"shellseam mcp: invalid sandbox mode {sandbox!r} (choose from {choices})",
            file=sys.stderr,
        )
        return 2
    workdir = os.path.abspath(os.path.expanduser(workdir))
    if not os.path.isdir(workdir):
        print(f"shellseam mcp: workdir is not a directory: {workdir}", file=sys.stderr)
        return 2
    home = os.path.abspath(os.path.expanduser(home))
    anyio.run(_serve, sandbox, workdir, home, backend="asyncio")
    return 0


async def _serve(mode: SandboxMode | None, workdir: str, home: str) -> None:
    service = SubprocessService()
    tasks = TaskRuntime()
    session_id = uuid.uuid4().hex
    try:
        executor = (
            LocalShellExecutor(cwd=workdir, service=service)
            if mode is None
            else SandboxShellExecutor(mode=mode, cwd=workdir, service=service)
        )
        bash = BashTool(executor, tasks=tasks, env=ManagedEnvRegistry(home=home))
        tools: dict[str, _Tool] = {}
        for tool in (bash, *task_tools(tasks)):
            tools[tool.schema()["name"]] = tool
        session = _Session(tools, tasks, ToolContext(session_id, session_cwd=workdir))
        server = _build_server(session, instructions=bash.prompt_section().text)
        async with anyio.create_task_group() as tg:
            # A stop signal cancels the serving below (an in-flight bash call kills its
            # process group on cancellation); the disposal in `finally` does the rest.
            tg.start_soon(_cancel_on_stop_signal, tg.cancel_scope)
            rejected: deque[_Rejection] = deque()
            async with (
                _cancellable_stdin(rejected) as stdin,
                stdio_server(stdin=stdin) as (read, write),
                _answer_malformed(read, write, rejected) as messages,
            ):
                await server.run(messages, write, server.create_initialization_options())
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await tasks.dispose_owner(session_id)
            await tasks.dispose()
            await service.aclose()


def _build_server(session: _Session, *, instructions: str) -> Server[Any]:
    tool_list = [
        types.Tool(
            name=name,
            description=tool.schema().get("description"),
            input_schema=tool.schema()["parameters"],
        )
        for name, tool in session.tools.items()
    ]

    async def list_tools(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list)

    async def call_tool(
        _ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = session.tools.get(params.name)
        if tool is None:
            return _text_result([f"Error: unknown tool: {params.name}"], is_error=True)
        result = await tool.execute(params.arguments or {}, session.ctx)
        # Completion notices of background tasks ride on the next result, as a content
        # item of their own so the tool's text stays exactly the tool's text.
        notices = session.tasks.drain_notices(session.ctx.session_id)
        parts = [result.text, "\n".join(notices)] if notices else [result.text]
        return _text_result(parts, is_error=result.is_error)

    return Server(
        "shellseam",
        instructions=instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _text_result(texts: list[str], *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text) for text in texts],
        is_error=is_error,
    )


async def _cancel_on_stop_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _signum in signals:
            scope.cancel()
            return


class _StreamLines(anyio.AsyncFile[str]):
    """stdin lines read by the event loop instead of a worker thread.

    The SDK's default reader blocks a thread in ``readline``, and anyio waits for that
    thread before a cancellation completes: SIGTERM while the client keeps stdin open
    would hang. Reading through the loop makes the pending read cancellable.
    """

    def __init__(self, reader: asyncio.StreamReader, rejected: deque[_Rejection]) -> None:
        # The base class wants a file object; every read is overridden to use the reader.
        super().__init__(io.StringIO())
        self._reader = reader
        self._rejected = rejected

    async def readline(self) -> str:
        try:
            raw = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as eof:
            raw = eof.partial  # the last line without a newline, or b"" at EOF
        except asyncio.LimitOverrunError as overrun:
            # Over the limit: keep the head (for the id), drop the rest of the line, and
            # hand the SDK an empty line it refuses, so the client gets its error reply.
            head = await self._reader.readexactly(min(overrun.consumed, 4096))
            await self._skip_line()
            request_id = _request_id_in_head(head)
            error = types.ErrorData(code=types.PARSE_ERROR, message=_TOO_LONG)
            self._rejected.append((request_id, error))
            return "\n"
        line = raw.decode("utf-8", errors="replace")
        if line:  # "" is EOF, which ends the iteration; a blank line is refused like others
            # The SDK will refuse this line with an exception that no longer knows its
            # request id: remember the id (in order) so the error reply can carry it.
            try:
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValueError:
                self._rejected.append((_request_id(line), None))
        return line

    async def _skip_line(self) -> None:
        """Consume the rest of an over-long line, up to and including its newline (or EOF)."""
        while True:
            try:
                await self._reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as overrun:
                await self._reader.readexactly(overrun.consumed)
            except asyncio.IncompleteReadError:
                return

    async def __aiter__(self) -> AsyncIterator[str]:
        while line := await self.readline():
            yield line


def _request_id_in_head(head: bytes) -> types.RequestId | None:
    """The id of an over-long message, when its first bytes carry it before any params."""
    head = head.split(b'"params"', 1)[0]
    found = re.search(rb'"id"\s*:\s*(-?\d+|"[^"\\]*")\s*[,}]', head)
    if found is None:
        return None
    request_id: types.RequestId = json.loads(found.group(1))
    return request_id


def _request_id(line: str) -> types.RequestId | None:
    """The id of a message the SDK could not take, when the line is JSON carrying one."""
    try:
        message = json.loads(line)  # unlike the SDK's parser, accepts lone surrogates
    except ValueError:
        return None
    request_id = message.get("id") if isinstance(message, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return request_id


@asynccontextmanager
async def _answer_malformed(
    read: ReadStream[SessionMessage | Exception],
    write: WriteStream[SessionMessage],
    rejected: deque[_Rejection],
) -> AsyncIterator[ReadStream[SessionMessage | Exception]]:
    """The client's messages, where every line the SDK could not parse (malformed JSON, a
    lone surrogate, not JSON-RPC) is answered with a JSON-RPC error instead of silence (the
    SDK only logs it, and the client would wait for its reply forever)."""
    send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def pump() -> None:
        async with send:
            async for item in read:
                if not isinstance(item, Exception):
                    await send.send(item)
                    continue
                request_id, error = rejected.popleft() if rejected else (None, None)
                if error is None and "json_invalid" in str(item):  # malformed, a lone surrogate
                    error = types.ErrorData(code=types.PARSE_ERROR, message="Parse error")
                elif error is None:  # JSON, but not a JSON-RPC message
                    error = types.ErrorData(code=types.INVALID_REQUEST, message="Invalid request")
                reply = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
                await write.send(SessionMessage(reply))

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        yield receive
        tg.cancel_scope.cancel()


@asynccontextmanager
async def _cancellable_stdin(
    rejected: deque[_Rejection],
) -> AsyncIterator[anyio.AsyncFile[str] | None]:
    """A loop-driven reader over fd 0 when it is a pipe or socket, else None (SDK default).

    Only pipes and sockets: making a terminal or file non-blocking would change it for
    every other process sharing it. (On a terminal, SIGTERM then waits for the next line
    or EOF; MCP clients always connect through pipes.)
    """
    try:
        fd_mode = os.fstat(0).st_mode
    except OSError:
        fd_mode = 0
    if not (stat.S_ISFIFO(fd_mode) or stat.S_ISSOCK(fd_mode)):
        yield None
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_MAX_MESSAGE_BYTES)
    # A duplicate, so closing the transport never closes the process's own fd 0.
    pipe = os.fdopen(os.dup(0), "rb", buffering=0)
    transport, _protocol = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    try:
        yield _StreamLines(reader, rejected)
    finally:
        transport.close()
