"""The one exception type of the seam: ``ShellError`` with a stable ``.code``.

Callers branch on ``.code`` (the contract), never on the message or the subclass.
"""

from __future__ import annotations

from typing import Final, Literal

ShellErrorCode = Literal[
    "SPAWN_FAILED", "SANDBOX_UNAVAILABLE", "INVALID_REQUEST", "DISPOSED", "REMOTE_UNAVAILABLE"
]

SPAWN_FAILED: Final = "SPAWN_FAILED"
SANDBOX_UNAVAILABLE: Final = "SANDBOX_UNAVAILABLE"
INVALID_REQUEST: Final = "INVALID_REQUEST"
DISPOSED: Final = "DISPOSED"
REMOTE_UNAVAILABLE: Final = "REMOTE_UNAVAILABLE"


class ShellError(Exception):
    """An infrastructure or request failure of the shell seam.

    ``code`` is one of ``SPAWN_FAILED``, ``SANDBOX_UNAVAILABLE``, ``INVALID_REQUEST``,
    ``DISPOSED``, ``REMOTE_UNAVAILABLE`` (a remote node or its service was lost or stopped
    answering: the outcome is unknown); ``reason`` is the human text without the code.
    """

    code: ShellErrorCode
    reason: str

    def __init__(self, code: ShellErrorCode, reason: str = "") -> None:
        super().__init__(f"{code}: {reason}" if reason else code)
        self.code = code
        self.reason = reason
