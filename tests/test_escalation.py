"""Sandbox policy per call, per-session modes, one-shot escalation and the approval flow."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fakes import FakeExecutor
from shellseam import ManagedEnvRegistry, SandboxShellExecutor, SubprocessService, landlock_abi
from shellseam.abort import AbortController
from shellseam.tasks import TaskRuntime
from shellseam.tool import (
    ApprovalDecision,
    ApprovalRequest,
    BashTool,
    SandboxModeStore,
    ToolContext,
    ToolResult,
)
from shellseam.types import SandboxMode, SandboxPolicy

CWD = "/home/agent/ws"
CTX = ToolContext("sess-1", CWD)


class ScriptedApproval:
    def __init__(self, decision: str, side_effect: Callable[[], None] | None = None) -> None:
        self.decision = decision
        self.side_effect = side_effect
        self.requests: list[ApprovalRequest] = []

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        self.requests.append(req)
        if self.side_effect is not None:
            self.side_effect()
        return self.decision  # type: ignore[return-value]


def make(
    mode: SandboxMode | None = "read-only",
    approval: ScriptedApproval | None = None,
    modes: SandboxModeStore | None = None,
    **kw: Any,
) -> tuple[BashTool, FakeExecutor]:
    executor = FakeExecutor(sandbox_mode=mode)
    tool = BashTool(
        executor,
        tasks=kw.pop("tasks", TaskRuntime()),
        env=ManagedEnvRegistry(home="/h"),
        approval=approval,
        modes=modes,
        **kw,
    )
    return tool, executor


def call(tool: BashTool, args: Mapping[str, Any], ctx: ToolContext = CTX) -> ToolResult:
    return asyncio.run(tool.execute(args, ctx))


def cmd(**extra: Any) -> dict[str, Any]:
    return {"command": "touch out.txt", "description": "Create the output file", **extra}


def escalate(mode: str = "workspace-write", **extra: Any) -> dict[str, Any]:
    return cmd(sandbox_permissions=mode, justification="It must write the build output.", **extra)


def err(message: str) -> ToolResult:
    return ToolResult(f"Error: {message}", is_error=True, details=None)


def test_policy_uses_session_cwd_as_workspace_root() -> None:
    tool, executor = make("workspace-write")
    call(tool, cmd(workdir="build"))
    [request] = executor.requests
    assert request.workdir == f"{CWD}/build"
    assert request.sandbox_policy == SandboxPolicy(mode="workspace-write", workspace_root=CWD)
    assert executor.specs[0].sandbox_policy == request.sandbox_policy


def test_session_override_beats_executor_default() -> None:
    modes = SandboxModeStore()
    tool, executor = make("read-only", modes=modes)
    modes.set("sess-1", "danger-full-access")
    call(tool, cmd())
    call(tool, cmd(), ToolContext("sess-2", CWD))
    modes.clear("sess-1")
    modes.clear("never-set")
    call(tool, cmd())
    assert [r.sandbox_policy.mode for r in executor.requests if r.sandbox_policy] == [
        "danger-full-access",
        "read-only",
        "read-only",
    ]
    assert modes.get("sess-1") is None
    with pytest.raises(ValueError):
        modes.set("sess-1", "everything")  # type: ignore[arg-type]


def test_no_policy_without_a_sandboxing_executor() -> None:
    modes = SandboxModeStore()
    modes.set("sess-1", "read-only")
    tool, executor = make(None, modes=modes)
    call(tool, cmd())
    assert executor.requests[0].sandbox_policy is None


def test_approved_escalation_applies_to_that_call_only() -> None:
    approval = ScriptedApproval("allowed-once")
    tool, executor = make("read-only", approval)
    answer = call(tool, escalate(workdir="sub"))
    assert answer.text == "(no output)\n[exit code: 0]"
    assert approval.requests == [
        ApprovalRequest(
            session_id="sess-1",
            command="touch out.txt",
            workdir=f"{CWD}/sub",
            mode="workspace-write",
            justification="It must write the build output.",
        )
    ]
    assert executor.specs[0].sandbox_policy == SandboxPolicy(
        mode="workspace-write", workspace_root=CWD
    )
    call(tool, cmd())
    assert executor.specs[1].sandbox_policy == SandboxPolicy(mode="read-only", workspace_root=CWD)


def test_approved_escalation_for_a_background_task() -> None:
    approval = ScriptedApproval("allowed-once")
    tool, executor = make("workspace-write", approval)
    answer = call(tool, escalate("danger-full-access", run_in_background=True))
    assert answer.text == "started background task bash-1"
    assert executor.specs[0].sandbox_policy == SandboxPolicy(
        mode="danger-full-access", workspace_root=CWD
    )


@pytest.mark.parametrize(
    ("decision", "message"),
    [
        ("denied", "sandbox escalation was denied"),
        ("cancelled", "sandbox escalation approval was cancelled"),
        ("maybe", "sandbox escalation was denied"),
    ],
)
def test_refused_approval_runs_nothing(decision: str, message: str) -> None:
    approval = ScriptedApproval(decision)
    tool, executor = make("read-only", approval)
    for args in (escalate(), escalate(run_in_background=True)):
        assert call(tool, args) == err(message)
    assert len(approval.requests) == 2
    assert executor.specs == []
    assert executor.started == []


def test_no_approval_service_runs_nothing() -> None:
    tool, executor = make("read-only", None)
    assert call(tool, escalate()) == err(
        "sandbox escalation needs approval, but no approval service is available"
    )
    assert executor.requests == [] and executor.specs == []


def test_abort_during_approval_runs_nothing() -> None:
    controller = AbortController()
    approval = ScriptedApproval("allowed-once", side_effect=controller.abort)
    tool, executor = make("read-only", approval)
    ctx = ToolContext("sess-1", CWD, signal=controller.signal)
    assert call(tool, escalate(), ctx) == err("tool call aborted")
    assert executor.specs == []


@pytest.mark.parametrize(
    ("default", "override", "wanted"),
    [
        ("workspace-write", None, "workspace-write"),
        ("danger-full-access", None, "workspace-write"),
        ("danger-full-access", None, "danger-full-access"),
        ("read-only", "workspace-write", "workspace-write"),
        ("read-only", "danger-full-access", "workspace-write"),
    ],
)
def test_escalation_must_be_strictly_wider(
    default: SandboxMode, override: SandboxMode | None, wanted: str
) -> None:
    modes = SandboxModeStore()
    if override is not None:
        modes.set("sess-1", override)
    approval = ScriptedApproval("allowed-once")
    tool, executor = make(default, approval, modes)
    current = override or default
    assert call(tool, escalate(wanted)) == err(
        f'sandbox escalation to "{wanted}" is not strictly wider than this call\'s current '
        f'"{current}" mode'
    )
    assert approval.requests == [] and executor.specs == []


def test_hidden_escalation_fields_are_still_validated() -> None:
    tool, executor = make(None, ScriptedApproval("allowed-once"))
    assert "sandbox_permissions" not in tool.schema()["parameters"]["properties"]
    assert call(tool, escalate()) == err(
        "sandbox_permissions is not available in this composition "
        "(no sandboxing executor to escalate)"
    )
    assert call(tool, cmd(justification="why")) == err(
        "invalid escalation: justification is only valid together with sandbox_permissions"
    )
    assert executor.specs == []


@pytest.mark.parametrize("wanted", ["read-only", "root", 5, ""])
def test_escalation_value_is_checked(wanted: object) -> None:
    tool, _ = make("read-only", ScriptedApproval("allowed-once"))
    assert call(tool, escalate(wanted)) == err(  # type: ignore[arg-type]
        'invalid sandbox_permissions: expected "workspace-write" or "danger-full-access"'
    )


@pytest.mark.parametrize("justification", ["", "   ", 7, ["a"]])
def test_justification_must_be_a_sentence(justification: object) -> None:
    tool, _ = make("read-only", ScriptedApproval("allowed-once"))
    args = cmd(sandbox_permissions="workspace-write", justification=justification)
    assert call(tool, args) == err("invalid justification: expected a non-empty sentence")


J = "It must write the build output."
NO_RUNTIME = "no-runtime"

# Each case breaks at least two rules; the one earliest in the validation order must win.
# Columns: arguments, executor default mode, approval service?, background enabled?, message.
ORDER_CASES: list[tuple[dict[str, Any], SandboxMode | None, bool, bool | str, str]] = [
    (
        {"command": "", "description": ""},
        "read-only",
        True,
        True,
        "invalid command: expected a non-empty string",
    ),
    (
        {"command": "ls", "description": "", "timeoutMs": 0},
        "read-only",
        True,
        True,
        "invalid description: expected a non-empty string",
    ),
    (
        cmd(timeoutMs="soon", sandbox_permissions="workspace-write"),
        "read-only",
        True,
        True,
        'invalid timeoutMs: expected a positive number, got "soon"',
    ),
    (
        cmd(sandbox_permissions="workspace-write", run_in_background=True),
        "read-only",
        True,
        False,
        "invalid escalation: sandbox_permissions requires a justification",
    ),
    (
        cmd(justification=J, run_in_background=True),
        None,
        True,
        False,
        "invalid escalation: justification is only valid together with sandbox_permissions",
    ),
    (
        cmd(sandbox_permissions="workspace-write", justification=" ", run_in_background=True),
        None,
        True,
        False,
        "invalid justification: expected a non-empty sentence",
    ),
    (
        escalate(run_in_background=True),
        None,
        True,
        False,
        "background execution is disabled for this bash tool",
    ),
    (
        escalate(run_in_background=True),
        None,
        True,
        NO_RUNTIME,
        "background tasks unavailable: no task runtime is configured",
    ),
    (
        escalate("everything"),
        None,
        False,
        True,
        "sandbox_permissions is not available in this composition "
        "(no sandboxing executor to escalate)",
    ),
    (
        escalate("read-only"),
        "danger-full-access",
        False,
        True,
        'invalid sandbox_permissions: expected "workspace-write" or "danger-full-access"',
    ),
    (
        escalate("workspace-write"),
        "danger-full-access",
        False,
        True,
        'sandbox escalation to "workspace-write" is not strictly wider than this call\'s '
        'current "danger-full-access" mode',
    ),
]


@pytest.mark.parametrize(("args", "default", "approves", "background", "message"), ORDER_CASES)
def test_validation_order(
    args: dict[str, Any],
    default: SandboxMode | None,
    approves: bool,
    background: bool | str,
    message: str,
) -> None:
    approval = ScriptedApproval("allowed-once") if approves else None
    tool, executor = make(
        default,
        approval,
        enable_run_in_background=background is not False,
        tasks=None if background == NO_RUNTIME else TaskRuntime(),
    )
    assert call(tool, args) == err(message)
    assert executor.requests == [] and executor.specs == []
    assert approval is None or approval.requests == []


# --- end to end, with the real Landlock SandboxShellExecutor ------------------------------


@pytest.fixture
def workspace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A session workspace outside /tmp and $TMPDIR, which workspace-write always allows."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    path = Path(tempfile.mkdtemp(prefix="shellseam-ws-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


@pytest.mark.skipif(landlock_abi() == 0, reason="the kernel has no Landlock")
def test_real_denial_then_approved_escalation(workspace: Path) -> None:
    service = SubprocessService()
    approval = ScriptedApproval("allowed-once")
    modes = SandboxModeStore()
    tool = BashTool(
        SandboxShellExecutor(mode="read-only", cwd="/", service=service),
        tasks=TaskRuntime(),
        env=ManagedEnvRegistry(home=str(workspace)),
        approval=approval,
        modes=modes,
    )
    (workspace / "build").mkdir()
    made = workspace / "made"
    ctx = ToolContext("sess-e2e", str(workspace))
    touch = {"command": "touch ../made && echo ok", "description": "Touch a file"}
    denial = "[sandbox: file access denied under read-only mode]\n[exit code: 1]"
    try:
        denied = call(tool, {**touch, "workdir": "build"}, ctx)
        assert denied.text == (
            f"[stderr]\ntouch: cannot touch '../made': Permission denied\n{denial}"
        )
        assert denied.is_error is False
        assert not made.exists()

        escalated = {**touch, "workdir": "build", "sandbox_permissions": "workspace-write"}
        allowed = call(tool, {**escalated, "justification": "It writes the marker file."}, ctx)
        # workspace_root is the session cwd, so workdir="build" may still write above it.
        assert allowed.text == "ok\n[exit code: 0]"
        assert made.exists()
        assert [r.mode for r in approval.requests] == ["workspace-write"]

        made.unlink()
        assert call(tool, {**touch, "workdir": "build"}, ctx).text.endswith(denial)
        assert not made.exists()

        modes.set("sess-e2e", "workspace-write")
        assert call(tool, {**touch, "workdir": "build"}, ctx).text == "ok\n[exit code: 0]"
        assert made.exists()
    finally:
        service.dispose()
