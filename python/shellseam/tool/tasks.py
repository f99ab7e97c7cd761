"""The generic task tools: ``task_output``, ``task_list`` and ``task_kill`` (SPEC §4).

They speak to a ``TaskRuntime`` with the calling session's id as the owner token, so a
model only ever sees its own session's tasks; any other id is "no such task".
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from ..abort import AbortSignal
from ..render import (
    TOOL_CALL_ABORTED,
    render_no_such_task,
    render_task_kill,
    render_task_list,
    render_task_read,
)
from ..tasks import TaskNotFound, TaskRuntime
from ._args import (
    ToolInputError,
    arguments,
    error_result,
    non_empty_string,
    optional_bool,
    optional_timeout_ms,
)
from .context import ToolContext, ToolResult

DEFAULT_BLOCK_TIMEOUT_MS = 30_000

_TASK_ID_SCHEMA = {"type": "string", "description": "The id a background start returned."}


def _task_id(args: Mapping[str, Any]) -> str:
    return non_empty_string(
        arguments(args).get("task_id"), "invalid task_id: expected a non-empty string"
    )


def _not_found(err: TaskNotFound) -> ToolResult:
    return error_result(render_no_such_task(err.task_id))


async def _wait_unless_aborted(
    runtime: TaskRuntime, task_id: str, owner: str, timeout_ms: int, signal: AbortSignal | None
) -> bool:
    """Wait for settlement; returns False when the caller's signal fired first."""
    if signal is None:
        await runtime.wait(task_id, owner, timeout_ms)
        return True
    loop = asyncio.get_running_loop()
    aborted: asyncio.Future[None] = loop.create_future()

    def resolve() -> None:
        if not aborted.done():
            aborted.set_result(None)

    def on_abort() -> None:
        # Listeners run on the aborting thread; the future belongs to this loop.
        loop.call_soon_threadsafe(resolve)

    remove = signal.add_listener(on_abort)
    waiter = asyncio.ensure_future(runtime.wait(task_id, owner, timeout_ms))
    either: set[asyncio.Future[Any]] = {waiter, aborted}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        remove()
        aborted.cancel()
        if not waiter.done():
            waiter.cancel()
    if waiter.done() and not waiter.cancelled():
        waiter.result()  # re-raises TaskNotFound
    return not signal.aborted


class _TaskTool:
    """Shared state of the task tools: the runtime they speak to."""

    name: str

    def __init__(self, runtime: TaskRuntime) -> None:
        self.runtime = runtime


class TaskOutputTool(_TaskTool):
    """``task_output``: the consuming read of one task, optionally after waiting for it."""

    name = "task_output"

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": (
                "Read a background task's status and the output it produced since the last "
                "read. With block=true, first wait up to timeoutMs (default 30000) for the task "
                "to finish."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "task_id": _TASK_ID_SCHEMA,
                    "block": {
                        "type": "boolean",
                        "description": "Wait for the task to finish before reading.",
                    },
                    "timeoutMs": {
                        "type": "number",
                        "description": "How long block waits, in milliseconds (default 30000).",
                    },
                },
                "required": ["task_id"],
            },
        }

    async def execute(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            task_id = _task_id(args)
            block = optional_bool(args.get("block"), "block")
            timeout_ms = optional_timeout_ms(args.get("timeoutMs"))
        except ToolInputError as err:
            return error_result(err.message)
        if timeout_ms is None:
            timeout_ms = DEFAULT_BLOCK_TIMEOUT_MS
        try:
            if block and not await _wait_unless_aborted(
                self.runtime, task_id, ctx.session_id, timeout_ms, ctx.signal
            ):
                return error_result(TOOL_CALL_ABORTED)
            read = self.runtime.read(task_id, ctx.session_id)
        except TaskNotFound as err:
            return _not_found(err)
        return ToolResult(
            render_task_read(read),
            is_error=False,
            details={"kind": "task_output", **dataclasses.asdict(read)},
        )


class TaskListTool(_TaskTool):
    """``task_list``: the caller's tasks, one line each."""

    name = "task_list"

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "List your background tasks with their status and description.",
            "parameters": {"type": "object", "properties": {}},
        }

    async def execute(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        infos = self.runtime.list(ctx.session_id)
        return ToolResult(
            render_task_list(infos),
            is_error=False,
            details={"kind": "task_list", "tasks": [dataclasses.asdict(i) for i in infos]},
        )


class TaskKillTool(_TaskTool):
    """``task_kill``: stop one of the caller's tasks."""

    name = "task_kill"

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "Stop a background task (its process group is terminated).",
            "parameters": {
                "type": "object",
                "properties": {"task_id": _TASK_ID_SCHEMA},
                "required": ["task_id"],
            },
        }

    async def execute(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            task_id = _task_id(args)
            killed = self.runtime.kill(task_id, ctx.session_id)
        except ToolInputError as err:
            return error_result(err.message)
        except TaskNotFound as err:
            return _not_found(err)
        return ToolResult(
            render_task_kill(task_id, killed),
            is_error=False,
            details={"kind": "task_kill", "task_id": task_id, "killed": killed},
        )


def task_tools(runtime: TaskRuntime) -> tuple[TaskOutputTool, TaskListTool, TaskKillTool]:
    """The three task tools over one runtime: ``(task_output, task_list, task_kill)``."""
    return TaskOutputTool(runtime), TaskListTool(runtime), TaskKillTool(runtime)
