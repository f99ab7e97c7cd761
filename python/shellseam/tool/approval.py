"""Sandbox escalation vocabulary: the approval service protocol and per-session mode overrides.

The bash tool never widens a sandbox on its own: an escalation is one exact call that a
human (through an ``ApprovalService``) allows once, and a session may carry a standing mode
override in a ``SandboxModeStore``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from ..types import SANDBOX_MODES, SandboxMode

ApprovalDecision = Literal["allowed-once", "denied", "cancelled"]
APPROVAL_DECISIONS: tuple[ApprovalDecision, ...] = get_args(ApprovalDecision)


@dataclass(frozen=True)
class ApprovalRequest:
    """One call asking to run under a wider sandbox mode, with the model's one-line reason."""

    session_id: str
    command: str
    workdir: str
    mode: SandboxMode
    justification: str


class ApprovalService(Protocol):
    """Asks someone to approve exactly one escalated call."""

    async def request(self, req: ApprovalRequest) -> ApprovalDecision: ...


class SandboxModeStore:
    """Per-session sandbox mode overrides (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._modes: dict[str, SandboxMode] = {}

    def get(self, session_id: str) -> SandboxMode | None:
        with self._lock:
            return self._modes.get(session_id)

    def set(self, session_id: str, mode: SandboxMode) -> None:
        if mode not in SANDBOX_MODES:
            raise ValueError(f"unknown sandbox mode: {mode!r}")
        with self._lock:
            self._modes[session_id] = mode

    def clear(self, session_id: str) -> None:
        with self._lock:
            self._modes.pop(session_id, None)
