"""``shellseam mcp``: the bash and task tools served over Model Context Protocol on stdio.

Built on the official ``mcp`` SDK's low-level ``Server``. The tools are the library's own
(``BashTool`` and the task tools) with their JSON schemas unchanged; a call's result is the
tool's text as one ``TextContent`` plus ``isError``, and for ``bash`` also
``structuredContent`` (the foreground result's fields, matching the tool's ``outputSchema``).
Tools carry annotations (``bash`` may destroy and reaches the open world; ``task_list`` and
``task_output`` only read). ``serverInfo.version`` is the package version.

A stdio server has exactly one client connection, and that connection is one session: a
fresh session id is the owner of every background task it starts. When the client
disconnects (EOF on stdin) or the server is told to stop (SIGTERM, SIGINT, SIGHUP), the session's
tasks are killed, the subprocess service is disposed (every process it still owns killed and
reaped, spill files removed) and ``run`` returns, so nothing the server started outlives it.
The wire itself (error replies for bad lines, the line limit) is ``_mcp_wire``.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from . import __version__
from ._mcp_wire import stdio_wire
from .executor import ShellExecutor
from .factory import make_executor
from .paths import spill_parent_outside
from .service import SubprocessService
from .tasks import TaskRuntime
from .tool.bash import BashTool
from .tool.context import ToolContext, ToolResult
from .tool.managed_env import ManagedEnvRegistry
from .tool.tasks import task_tools
from .types import SANDBOX_MODES

_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}

#: ``outputSchema`` of ``bash``: a foreground result's fields (``kind: "foreground"``), a
#: background start (``kind: "background"`` + ``task_id``), or ``kind: "error"``.
BASH_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "enum": ["foreground", "background", "error"]},
        "exit_code": _NULLABLE_INT,
        "signal": _NULLABLE_STR,
        "timed_out": {"type": "boolean"},
        "aborted": {"type": "boolean"},
        "stdout_truncated": {"type": "boolean"},
        "stderr_truncated": {"type": "boolean"},
        "stdout_spill_path": _NULLABLE_STR,
        "stderr_spill_path": _NULLABLE_STR,
        "leftover_killed": {"type": "integer", "minimum": 0},
        "limit_exceeded": {
            "type": ["string", "null"],
            "enum": ["memory", "processes", "cpu", "file_size", None],
        },
        "task_id": {"type": "string"},
    },
    "required": ["kind"],
    "additionalProperties": False,
}

_ANNOTATIONS: dict[str, types.ToolAnnotations] = {
    "bash": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, open_world_hint=True
    ),
    "task_output": types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    "task_list": types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    "task_kill": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
}


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


def run(
    *,
    sandbox: str | None,
    workdir: str,
    home: str,
    network: bool = True,
    ray_address: str | None = None,
) -> int:
    """Serve MCP on stdin/stdout until the client disconnects or SIGTERM/SIGINT; exit status.

    ``sandbox`` None runs commands unconfined, else in that Landlock mode (``make_executor``);
    ``network=False`` takes sockets away (needs a confining mode); ``ray_address`` runs the
    commands on a Ray cluster. ``workdir`` is the session's cwd (and sandbox workspace);
    ``home`` becomes ``DSH_HOME``. A bad argument prints one line on stderr and returns 2; a
    missing extra raises ``MissingExtra`` before anything is served.
    """
    if sandbox is not None and sandbox not in SANDBOX_MODES:
        choices = ", ".join(SANDBOX_MODES)
        return _usage(f"invalid sandbox mode {sandbox!r} (choose from {choices})")
    workdir = os.path.abspath(os.path.expanduser(workdir))
    if not os.path.isdir(workdir):
        return _usage(f"workdir is not a directory: {workdir}")
    home = os.path.abspath(os.path.expanduser(home))
    # A confined session may write anywhere under workdir (workspace-write, or escalated to
    # it): spill files live outside it.
    roots = [workdir] if sandbox in ("read-only", "workspace-write") else []
    service = SubprocessService(spill_parent=spill_parent_outside(*roots))
    config: dict[str, Any] = {"cwd": workdir}
    if ray_address is None:
        config["service"] = service
    try:
        executor = make_executor(sandbox, network=network, ray_address=ray_address, **config)
    except ValueError as err:
        service.dispose()
        return _usage(str(err).replace("network=False", "--no-network"))
    except BaseException:
        service.dispose()
        raise
    anyio.run(_serve, executor, service, workdir, home, backend="asyncio")
    return 0


def _usage(message: str) -> int:
    print(f"shellseam mcp: {message}", file=sys.stderr)
    return 2


async def _serve(
    executor: ShellExecutor, service: SubprocessService, workdir: str, home: str
) -> None:
    tasks = TaskRuntime()
    session_id = uuid.uuid4().hex
    try:
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
            async with (
                stdio_wire() as (stdin, stdout),
                stdio_server(stdin=stdin, stdout=stdout) as (read, write),
            ):
                await server.run(read, write, server.create_initialization_options())
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
            output_schema=BASH_OUTPUT_SCHEMA if name == "bash" else None,
            annotations=_ANNOTATIONS.get(name),
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
        structured = bash_structured_content(result) if params.name == "bash" else None
        return _text_result(parts, is_error=result.is_error, structured=structured)

    return Server(
        "shellseam",
        version=__version__,
        instructions=instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def bash_structured_content(result: ToolResult) -> dict[str, Any]:
    """``structuredContent`` of a bash result (see ``BASH_OUTPUT_SCHEMA``)."""
    details = result.details or {}
    kind = details.get("kind")
    if kind == "background":
        return {"kind": "background", "task_id": details["task_id"]}
    if kind != "foreground" or result.is_error:
        return {"kind": "error"}
    stdout, stderr = details["stdout"], details["stderr"]
    resources = details.get("resources") or {}
    return {
        "kind": "foreground",
        "exit_code": details["exit_code"],
        "signal": details["signal"],
        "timed_out": details["timed_out"],
        "aborted": details["aborted"],
        "stdout_truncated": stdout["truncated"],
        "stderr_truncated": stderr["truncated"],
        "stdout_spill_path": stdout["spill_path"],
        "stderr_spill_path": stderr["spill_path"],
        "leftover_killed": details["leftover_killed"],
        "limit_exceeded": resources.get("limit_exceeded"),
    }


def _text_result(
    texts: list[str], *, is_error: bool, structured: dict[str, Any] | None = None
) -> types.CallToolResult:
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text=text) for text in texts],
        is_error=is_error,
    )
    if structured is not None:
        result.structured_content = structured
    return result


async def _cancel_on_stop_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _signum in signals:
            scope.cancel()
            return
