"""``make_executor``: the one way front ends build an executor from a mode and a config.

The CLI, the MCP server and the mini-swe-agent adapter all need "unconfined, or Landlock with
this mode, or on a Ray cluster" from the same few settings; they call this instead of each
choosing a class. An optional front end whose extra is not installed is reported as
``MissingExtra``: one line naming the ``pip install 'shellseam[...]'`` command.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
from types import ModuleType
from typing import Any

from .errors import REMOTE_UNAVAILABLE, ShellError
from .executor import ShellExecutor
from .local import LocalShellExecutor
from .process import ShellProcess
from .sandbox import SandboxShellExecutor
from .types import (
    SANDBOX_MODES,
    SandboxMode,
    SandboxPolicy,
    ShellExecRequest,
    ShellExecSpec,
    ShellRunResult,
)


class MissingExtra(ImportError):
    """An optional dependency of a front end is not installed; ``str()`` is the hint."""

    def __init__(self, extra: str, feature: str) -> None:
        super().__init__(f"{feature} needs the '{extra}' extra: pip install 'shellseam[{extra}]'")
        self.extra = extra


def require_extra(module: str, *, extra: str, feature: str) -> ModuleType:
    """Imports ``module``, turning its absence (or a missing dependency) into ``MissingExtra``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(extra, feature) from err


def make_executor(
    mode: SandboxMode | None = None,
    *,
    network: bool = True,
    ray_address: str | None = None,
    **config: Any,
) -> ShellExecutor:
    """An executor for ``mode``: ``None`` runs unconfined (``LocalShellExecutor``), a
    ``SandboxMode`` confines with Landlock (``SandboxShellExecutor``).

    ``config`` is the ``LocalShellExecutor`` configuration (``cwd``, ``timeout_ms``,
    ``service``, ...). ``network=False`` (only with ``read-only`` or ``workspace-write``)
    takes sockets away from every call, whatever policy its request carries, except a call
    escalated to ``danger-full-access``, where nothing is confined. With ``ray_address``
    the commands run on a Ray cluster through ``shellseam.ray.RayShellExecutor`` (``"auto"``:
    the cluster this machine belongs to); that needs the ``ray`` extra, else
    ``MissingExtra``.
    """
    if mode is not None and mode not in SANDBOX_MODES:
        choices = ", ".join(SANDBOX_MODES)
        raise ValueError(f"mode must be None or one of {choices}; got {mode!r}")
    if not network and mode in (None, "danger-full-access"):
        raise ValueError("network=False needs a confining mode: read-only or workspace-write")
    executor: ShellExecutor
    if ray_address is not None:
        executor = _ray_executor(mode, ray_address, config)
    elif mode is None:
        executor = LocalShellExecutor(**config)
    else:
        executor = SandboxShellExecutor(mode=mode, **config)
    return executor if network else _NetworkOff(executor, cwd=config.get("cwd"))


class _NetworkOff(ShellExecutor):
    """Every call's sandbox policy gets ``network=False`` (the rest is the inner executor)."""

    def __init__(self, inner: ShellExecutor, *, cwd: str | None) -> None:
        self._inner = inner
        self._cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        self.sandbox_mode = inner.sandbox_mode

    def resolve(self, request: ShellExecRequest) -> ShellExecSpec:
        policy = request.sandbox_policy
        if policy is None and self.sandbox_mode is not None:
            policy = SandboxPolicy(mode=self.sandbox_mode, workspace_root=self._cwd)
        if policy is not None:
            policy = dataclasses.replace(policy, network=False)
        return self._inner.resolve(dataclasses.replace(request, sandbox_policy=policy))

    async def run(self, spec: ShellExecSpec) -> ShellRunResult:
        return await self._inner.run(spec)

    def run_sync(self, spec: ShellExecSpec) -> ShellRunResult:
        return self._inner.run_sync(spec)

    def start(self, spec: ShellExecSpec) -> ShellProcess:
        return self._inner.start(spec)


def _ray_executor(mode: SandboxMode | None, address: str, config: dict[str, Any]) -> ShellExecutor:
    feature = "running commands on a Ray cluster"
    ray = require_extra("ray", extra="ray", feature=feature)
    backend = require_extra("shellseam.ray", extra="ray", feature=feature)
    if not ray.is_initialized():
        _check_reachable(address)
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    executor: ShellExecutor = backend.RayShellExecutor(mode=mode, **config)
    return executor


#: How long the cluster's address may take to accept a connection, and then to answer.
_REACH_TIMEOUT_S = 5.0

#: An HTTP/2 client's connection preface and an empty SETTINGS frame. A Ray address (the GCS,
#: or a Ray client server for ``ray://``) is a gRPC server: it answers with a SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4


def _check_reachable(address: str) -> None:
    """Refuses a ``host:port`` (or ``ray://host:port``) address that is not a Ray cluster, at
    once: ``ray.init`` retried an address nothing listens on, or one where something else
    listens, for minutes, deaf to SIGTERM (both found by attacking). The probe connects and
    asks for an HTTP/2 SETTINGS frame, what any gRPC server sends first; with Ray's TLS on
    (``RAY_USE_TLS``) only the connection is checked. Other forms (``auto``, ``local``) are
    Ray's to resolve."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), _REACH_TIMEOUT_S)
    except (OSError, OverflowError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
    else:
        with sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            reason = _grpc_refusal(sock)
        if reason is None:
            return
    raise ShellError(REMOTE_UNAVAILABLE, f"cannot reach the Ray cluster at {address}: {reason}")


def _grpc_refusal(sock: socket.socket) -> str | None:
    """Why the server on ``sock`` is not a gRPC server, or None when it answers as one."""
    try:
        sock.settimeout(_REACH_TIMEOUT_S)
        sock.sendall(_H2_PREFACE)
        head = sock.recv(9, socket.MSG_WAITALL)
    except TimeoutError:
        return f"no answer as a Ray (gRPC) server within {_REACH_TIMEOUT_S:g} s"
    except OSError:
        return "not a Ray (gRPC) server"
    return None if len(head) == 9 and head[3] == _H2_SETTINGS else "not a Ray (gRPC) server"
