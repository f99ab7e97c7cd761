"""What a model-facing tool receives and returns: ``ToolContext``, ``ToolResult``, prompt parts.

These are the harness-neutral shapes every tool in ``shellseam.tool`` speaks, so an agent
loop (or the MCP server) can drive ``bash`` and the task tools the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..abort import AbortSignal


@dataclass(frozen=True)
class ToolContext:
    """The calling session: its id (the task owner token), cwd, abort signal and transcript."""

    session_id: str
    session_cwd: str
    signal: AbortSignal | None = None
    session_jsonl: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer: the model-facing text, whether it is an error, typed details."""

    text: str
    is_error: bool = False
    details: dict[str, Any] | None = None


@dataclass(frozen=True)
class PromptSection:
    """A system-prompt section a tool contributes; sections are sorted by ``order``."""

    name: str
    order: int
    text: str
