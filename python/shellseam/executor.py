"""The seam itself: ``ShellExecutor``, the abstract provider every front end talks to.

A provider fills and caps requests (``resolve``), runs resolved specs in the foreground
(``run``/``run_sync``) and starts background processes (``start``). Only infrastructure
failures raise; nonzero exits, timeouts and aborts are results.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from .process import ShellProcess
from .types import SandboxMode, ShellExecRequest, ShellExecSpec, ShellRunResult


class ShellExecutor(ABC):
    """Abstract bash execution seam (the seeds' ``ctx.shell``)."""

    #: The configured default mode when this executor sandboxes, else None.
    sandbox_mode: SandboxMode | None = None

    @abstractmethod
    def resolve(self, request: ShellExecRequest) -> ShellExecSpec:
        """Apply this provider's defaults and caps; raise ``ShellError(INVALID_REQUEST)``."""

    @abstractmethod
    async def run(self, spec: ShellExecSpec) -> ShellRunResult:
        """Run in the foreground; cancellation kills the process group before re-raising."""

    @abstractmethod
    def run_sync(self, spec: ShellExecSpec) -> ShellRunResult:
        """``run`` for callers without an event loop (blocks, GIL released while waiting)."""

    @abstractmethod
    def start(self, spec: ShellExecSpec) -> ShellProcess:
        """Start a background process (no timeout) and return its handle at once."""
