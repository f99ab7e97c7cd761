"""``SandboxShellExecutor``: the local executor with a Landlock ruleset per call.

The ruleset is built here, in the harness, and enforced by the child between clone and
exec (the harness itself is never restricted). A confined mode without Landlock fails
closed: ``run`` raises ``ShellError(SANDBOX_UNAVAILABLE)`` and a background start settles
``killed`` with ``runner_failed``. ``denied`` is a conservative reading of the result.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from . import service
from .errors import INVALID_REQUEST, SANDBOX_UNAVAILABLE, ShellError
from .local import LocalShellExecutor
from .service import Ruleset
from .types import (
    SANDBOX_MODES,
    SandboxEnforcement,
    SandboxMode,
    SandboxPolicy,
    ShellExecRequest,
    ShellExecSpec,
    ShellSandboxInfo,
)

#: Filesystem-permission signatures that mark a failure as a sandbox denial.
DENIAL_SIGNATURES = ("Permission denied", "Read-only file system", "Operation not permitted")


_RULESET_CACHE_SIZE = 64
_TMPDIR_ATTR = "_shellseam_tmpdir"


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of a root, None when it does not exist (then it grants nothing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def landlock_abi() -> int:
    """The running kernel's Landlock ABI (0: none)."""
    return service.landlock_abi()


def enforcement_for(mode: SandboxMode, network: bool = True) -> SandboxEnforcement | None:
    """``"full"``/``"partial"`` for a confined mode on this kernel (``"partial"`` when some
    requested feature, or Landlock altogether, is missing); None when nothing is confined."""
    if mode == "danger-full-access":
        return None
    return "partial" if service.landlock_missing(network) else "full"


class SandboxShellExecutor(LocalShellExecutor):
    """Confines each command with Landlock according to its ``SandboxPolicy``."""

    def __init__(self, *, mode: SandboxMode = "workspace-write", **config: Any) -> None:
        if mode not in SANDBOX_MODES:
            raise ShellError(INVALID_REQUEST, f"unknown sandbox mode {mode!r}")
        super().__init__(**config)
        self.default_mode: SandboxMode = mode
        self.sandbox_mode = mode
        self._rulesets: dict[object, Ruleset] = {}
        self._rulesets_lock = threading.Lock()

    def _stamp_policy(self, policy: SandboxPolicy | None) -> SandboxPolicy:
        if policy is not None:
            if policy.mode not in SANDBOX_MODES:
                raise ShellError(INVALID_REQUEST, f"unknown sandbox mode {policy.mode!r}")
            if not os.path.isabs(policy.workspace_root):
                raise ShellError(INVALID_REQUEST, "workspace_root must be absolute")
            return policy
        return SandboxPolicy(mode=self.default_mode, workspace_root=self.cwd)

    def resolve(self, request: ShellExecRequest) -> ShellExecSpec:
        spec = super().resolve(request)
        # "$TMPDIR" means the harness's value at resolve time: remember it on the spec
        # (outside its compared fields) for the ruleset built at spawn.
        object.__setattr__(spec, _TMPDIR_ATTR, os.environ.get("TMPDIR"))
        return spec

    def _policy(self, spec: ShellExecSpec) -> SandboxPolicy:
        return spec.sandbox_policy or self._stamp_policy(None)

    def _ruleset(self, spec: ShellExecSpec) -> Ruleset | None:
        policy = self._policy(spec)
        if policy.mode == "danger-full-access":
            return None
        if landlock_abi() < 1:
            raise ShellError(SANDBOX_UNAVAILABLE, "Landlock is not available on this kernel")
        roots: list[str] = []
        if policy.mode == "workspace-write":
            roots = [policy.workspace_root, *policy.writable_roots, "/tmp"]
            tmpdir = getattr(spec, _TMPDIR_ATTR, os.environ.get("TMPDIR"))
            if tmpdir:
                roots.append(tmpdir)
        # A ruleset fd can be enforced by any number of children: reuse it while the roots
        # are the same inodes (a replaced directory gets a fresh ruleset, never a stale grant).
        key = (tuple((root, _identity(root)) for root in roots), policy.network)
        with self._rulesets_lock:
            cached = self._rulesets.get(key)
        if cached is not None:
            return cached
        ruleset = service.build_ruleset(roots, policy.network)
        with self._rulesets_lock:
            if len(self._rulesets) >= _RULESET_CACHE_SIZE:
                self._rulesets.pop(next(iter(self._rulesets)))
            self._rulesets[key] = ruleset
        return ruleset

    def _sandbox_info(
        self, spec: ShellExecSpec, exit_code: int | None, stderr_tail: str
    ) -> ShellSandboxInfo:
        policy = self._policy(spec)
        confined = policy.mode != "danger-full-access"
        denied = (
            confined
            and exit_code is not None
            and exit_code != 0
            and any(sig in stderr_tail for sig in DENIAL_SIGNATURES)
        )
        return ShellSandboxInfo(
            mode=policy.mode,
            denied=denied,
            enforcement=enforcement_for(policy.mode, policy.network),
        )

    def _runner_failed_info(self, spec: ShellExecSpec) -> ShellSandboxInfo:
        # The command never ran: no exit code, so never a denial.
        return dataclasses.replace(self._sandbox_info(spec, None, ""), runner_failed=True)
