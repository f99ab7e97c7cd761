"""Argument checks shared by the model-facing tools, with their exact error texts.

Model input is untrusted JSON: each check either returns the typed value or raises
``ToolInputError`` carrying the message the model sees after ``Error: ``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..render import render_error
from .context import ToolResult

MAX_WAIT_MS = 2**53


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
    # Compact and unescaped, as JSON.stringify renders it: [1,2], {"a":1}, "é", and numbers
    # as JavaScript writes integral ones (0.0 -> 0, -1.0 -> -1).
    return json.dumps(_as_js(value), separators=(",", ":"), ensure_ascii=False, default=repr)


def _as_js(value: object) -> object:
    if isinstance(value, float):
        integral = math.isfinite(value) and value.is_integer() and abs(value) < 1e21
        return int(value) if integral else value
    if isinstance(value, (list, tuple)):
        return [_as_js(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_js(v) for k, v in value.items()}
    return value


def arguments(args: object) -> Mapping[str, Any]:
    """The call's arguments; a model that sent a JSON array, string or null gets an error."""
    if not isinstance(args, Mapping):
        raise ToolInputError(f"invalid arguments: expected an object, got {json_repr(args)}")
    return args


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
    # A JSON integer may be arbitrarily large (10**400 is valid JSON): test ints as ints,
    # since math.isfinite would raise OverflowError converting them to float.
    valid = not isinstance(value, bool) and (
        (isinstance(value, int) and value > 0)
        or (isinstance(value, float) and math.isfinite(value) and value > 0)
    )
    if not valid:
        raise ToolInputError(
            f"invalid timeoutMs: expected a positive number, got {json_repr(value)}"
        )
    # Executors clamp to their max_timeout_ms; the cap only keeps later float arithmetic
    # (seconds for asyncio) from overflowing on a 400-digit integer. 2**53 ms: 285,000 years.
    whole_ms: int = min(math.ceil(value), MAX_WAIT_MS)
    return whole_ms


def optional_bool(value: Any, name: str) -> bool:
    """A JSON boolean; absent (None) is False."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ToolInputError(f"invalid {name}: expected a boolean, got {json_repr(value)}")
    return value
