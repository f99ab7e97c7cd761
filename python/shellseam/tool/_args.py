"""Argument checks shared by the model-facing tools, with their exact error texts.

Model input is untrusted JSON: each check either returns the typed value or raises
``ToolInputError`` carrying the message the model sees after ``Error: ``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..render import render_error
from .context import ToolResult


class ToolInputError(Exception):
    """A validation or policy failure; ``message`` is shown as ``Error: <message>``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def error_result(message: str) -> ToolResult:
    """The one shape of every tool error the model sees."""
    return ToolResult(render_error(message), is_error=True, details=None)


def json_repr(value: object) -> str:
    """``value`` as the model wrote it (JSON), falling back to ``repr`` for non-JSON values."""
    # Compact and unescaped, as JSON.stringify renders it: [1,2], {"a":1}, "é".
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=repr)


def non_empty_string(value: Any, message: str) -> str:
    """``value`` when it is a string with non-blank content, else ``ToolInputError``."""
    if not isinstance(value, str) or not value.strip():
        raise ToolInputError(message)
    return value


def optional_timeout_ms(value: Any) -> int | None:
    """A positive JSON number as whole milliseconds (fractions round up); None when absent."""
    if value is None:
        return None
    # bool is an int subclass in Python, but JSON true is not a number.
    valid = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
    if not valid:
        raise ToolInputError(
            f"invalid timeoutMs: expected a positive number, got {json_repr(value)}"
        )
    whole_ms: int = math.ceil(value)
    return whole_ms


def optional_bool(value: Any, name: str) -> bool:
    """A JSON boolean; absent (None) is False."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ToolInputError(f"invalid {name}: expected a boolean, got {json_repr(value)}")
    return value
