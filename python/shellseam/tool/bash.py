"""The model-facing ``bash`` tool: schema, validation, escalation, execution and presenters.

``BashTool`` turns untrusted model arguments into a ``ShellExecRequest`` built only from
named fields (command, workdir, timeout, abort signal, sandbox policy and the managed
environment), runs it through a ``ShellExecutor`` in the foreground or as a task of the
``TaskRuntime``, and renders the outcome as the exact text of SPEC §5. Validation runs in
the order the spec fixes, so the first failure the model sees is always the same one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ShellError
from ..executor import ShellExecutor
from ..render import (
    PROMPT_TEXT,
    TOOL_CALL_ABORTED,
    bash_tool_description,
    parse_exit_status,
    render_background_started,
    render_result,
    render_shell_error,
)
from ..tasks import TaskRuntime
from ..types import SANDBOX_MODES, SandboxMode, SandboxPolicy, ShellExecRequest
from ._args import (
    ToolInputError,
    arguments,
    error_result,
    non_empty_string,
    optional_bool,
    optional_timeout_ms,
)
from .approval import ApprovalRequest, ApprovalService, SandboxModeStore
from .context import PromptSection, ToolContext, ToolResult
from .managed_env import ManagedEnvRegistry

_ESCALATION_TARGETS: tuple[SandboxMode, ...] = ("workspace-write", "danger-full-access")


def _wider(mode: SandboxMode, than: SandboxMode) -> bool:
    return SANDBOX_MODES.index(mode) > SANDBOX_MODES.index(than)


def call_workdir(workdir: object, session_cwd: str) -> str:
    """The call's working directory: the session cwd, or ``workdir`` resolved against it.

    The session cwd is normalized once and used both as this base and as the sandbox's
    workspace root, so confinement and spawn agree on one spelling of the session path.
    """
    base = os.path.abspath(session_cwd)
    if not isinstance(workdir, str) or not workdir:
        return base
    return os.path.normpath(os.path.join(base, workdir))


@dataclass(frozen=True)
class _Escalation:
    mode: SandboxMode
    justification: str


@dataclass(frozen=True)
class _Call:
    command: str
    description: str
    timeout_ms: int | None
    workdir: object
    background: bool
    escalation: _Escalation | None
    mode: SandboxMode | None  # the call's effective mode before escalation; None: no sandbox


class BashTool:
    """The ``bash`` tool over one executor, shared by every session of a harness."""

    name = "bash"

    def __init__(
        self,
        executor: ShellExecutor,
        *,
        tasks: TaskRuntime | None = None,
        env: ManagedEnvRegistry,
        approval: ApprovalService | None = None,
        modes: SandboxModeStore | None = None,
        enable_run_in_background: bool = True,
    ) -> None:
        self.executor = executor
        self.tasks = tasks
        self.env = env
        self.approval = approval
        self.modes = modes
        self.enable_run_in_background = enable_run_in_background

    def schema(self) -> dict[str, Any]:
        """The tool definition the model sees; optional fields follow the composition."""
        p = self.env.prefix
        properties: dict[str, Any] = {
            "command": {
                "type": "string",
                "description": (
                    "The command, run with `bash -c`. No state is kept between calls: "
                    "use `workdir` instead of `cd`."
                ),
            },
            "description": {
                "type": "string",
                "description": (
                    "A one-line, active-voice summary of the command (5-10 words), shown in "
                    "the UI and logs only; it does not affect execution."
                ),
            },
            "timeoutMs": {
                "type": "number",
                "description": (
                    "Timeout override in milliseconds. The executor applies its configured "
                    "default and cap."
                ),
            },
            "workdir": {
                "type": "string",
                "description": (
                    "Working directory for this call. Defaults to the session's working "
                    "directory; a relative path is resolved against it."
                ),
            },
        }
        if self.enable_run_in_background:
            properties["run_in_background"] = {
                "type": "boolean",
                "description": (
                    "Start the command as a background task and return its task id at once; "
                    "no timeout applies. Read it with task_output, stop it with task_kill."
                ),
            }
        if self.executor.sandbox_mode is not None:
            properties["sandbox_permissions"] = {
                "type": "string",
                "enum": list(_ESCALATION_TARGETS),
                "description": (
                    "Only after the sandbox denied a command: the wider mode this one call "
                    "needs. It must be strictly wider than the current mode; the user is asked "
                    "to approve the call before it runs. Use the narrowest mode that works."
                ),
            }
            properties["justification"] = {
                "type": "string",
                "description": (
                    "Required with sandbox_permissions: one sentence telling the user why this "
                    "command needs the wider permission."
                ),
            }
        return {
            "name": self.name,
            "description": bash_tool_description(p),
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": ["command", "description"],
            },
        }

    def prompt_section(self) -> PromptSection:
        """The ``tool:bash`` system-prompt section (order 105)."""
        return PromptSection(name="tool:bash", order=105, text=PROMPT_TEXT)

    async def execute(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        """Validate, (maybe) obtain approval, then run in the foreground or start a task."""
        try:
            call = self._validate(args, ctx)
        except ToolInputError as err:
            return error_result(err.message)
        if ctx.signal is not None and ctx.signal.aborted:
            return error_result(TOOL_CALL_ABORTED)

        workdir = call_workdir(call.workdir, ctx.session_cwd)
        policy = None
        if call.mode is not None:
            mode = call.escalation.mode if call.escalation is not None else call.mode
            policy = SandboxPolicy(mode=mode, workspace_root=os.path.abspath(ctx.session_cwd))
        request = ShellExecRequest(
            command=call.command,
            workdir=workdir,
            timeout_ms=call.timeout_ms,
            # A background task outlives this call: its lifetime belongs to task_kill and
            # disposal, not to the abort signal of the turn that started it.
            signal=None if call.background else ctx.signal,
            managed_env=self.env.collect(ctx),
            sandbox_policy=policy,
        )
        try:
            spec = self.executor.resolve(request)
        except ShellError as err:
            return _shell_error_result(err)

        if call.escalation is not None:
            denial = await self._approve(call.escalation, spec.command, spec.workdir, ctx)
            if denial is not None:
                return error_result(denial)
            if ctx.signal is not None and ctx.signal.aborted:
                return error_result(TOOL_CALL_ABORTED)

        if call.background:
            assert self.tasks is not None  # checked by _validate
            try:
                handle = self.executor.start(spec)
            except ShellError as err:
                return _shell_error_result(err)
            task_id = self.tasks.start("bash", ctx.session_id, handle, call.description)
            return ToolResult(
                render_background_started(task_id),
                is_error=False,
                details={"kind": "background", "task_id": task_id},
            )

        try:
            result = await self.executor.run(spec)
        except ShellError as err:
            return _shell_error_result(err)
        if result.aborted or (ctx.signal is not None and ctx.signal.aborted):
            return error_result(TOOL_CALL_ABORTED)
        return ToolResult(
            render_result(result),
            is_error=False,
            details={"kind": "foreground", **dataclasses.asdict(result)},
        )

    def present_call(self, args: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """The terminal card's header for a call: command, description and resolved cwd."""
        if not isinstance(args, Mapping):  # a model's non-object arguments: an empty card
            args = {}
        command = args.get("command")
        description = args.get("description")
        return {
            "command": command if isinstance(command, str) else "",
            "description": description if isinstance(description, str) else "",
            "cwd": call_workdir(args.get("workdir"), ctx.session_cwd),
        }

    def present_result(self, result: ToolResult) -> dict[str, Any]:
        """The card body: output without the consumed exit-status marker, plus that status."""
        output, status = parse_exit_status(result.text)
        return {"output": output, "status": status}

    def _validate(self, args: Mapping[str, Any], ctx: ToolContext) -> _Call:
        args = arguments(args)
        command = non_empty_string(
            args.get("command"), "invalid command: expected a non-empty string"
        )
        description = non_empty_string(
            args.get("description"), "invalid description: expected a non-empty string"
        )
        timeout_ms = optional_timeout_ms(args.get("timeoutMs"))
        workdir = args.get("workdir")
        if workdir is not None and not isinstance(workdir, str):
            raise ToolInputError("invalid workdir: expected a string")

        wanted = args.get("sandbox_permissions")
        justification = args.get("justification")
        if wanted is not None and justification is None:
            raise ToolInputError("invalid escalation: sandbox_permissions requires a justification")
        if justification is not None and wanted is None:
            raise ToolInputError(
                "invalid escalation: justification is only valid together with sandbox_permissions"
            )
        # Pairing is checked, so a justification is present exactly when an escalation is.
        reason = (
            non_empty_string(justification, "invalid justification: expected a non-empty sentence")
            if wanted is not None
            else ""
        )

        background = optional_bool(args.get("run_in_background"), "run_in_background")
        if background and not self.enable_run_in_background:
            raise ToolInputError("background execution is disabled for this bash tool")
        if background and self.tasks is None:
            raise ToolInputError("background tasks unavailable: no task runtime is configured")

        mode = self._session_mode(ctx)
        escalation = None
        if wanted is not None:
            if mode is None:
                raise ToolInputError(
                    "sandbox_permissions is not available in this composition "
                    "(no sandboxing executor to escalate)"
                )
            if wanted not in _ESCALATION_TARGETS:
                raise ToolInputError(
                    'invalid sandbox_permissions: expected "workspace-write" or '
                    '"danger-full-access"'
                )
            if not _wider(wanted, mode):
                raise ToolInputError(
                    f'sandbox escalation to "{wanted}" is not strictly wider than this '
                    f'call\'s current "{mode}" mode'
                )
            if self.approval is None:
                raise ToolInputError(
                    "sandbox escalation needs approval, but no approval service is available"
                )
            escalation = _Escalation(wanted, reason)
        return _Call(command, description, timeout_ms, workdir, background, escalation, mode)

    def _session_mode(self, ctx: ToolContext) -> SandboxMode | None:
        """The session override, else the executor default; None when nothing sandboxes."""
        default = self.executor.sandbox_mode
        if default is None:
            return None
        override = self.modes.get(ctx.session_id) if self.modes is not None else None
        return override if override is not None else default

    async def _approve(
        self, escalation: _Escalation, command: str, workdir: str, ctx: ToolContext
    ) -> str | None:
        """Ask for this exact call; None when allowed once, else the error message."""
        assert self.approval is not None  # checked by _validate
        decision = await self.approval.request(
            ApprovalRequest(
                session_id=ctx.session_id,
                command=command,
                workdir=workdir,
                mode=escalation.mode,
                justification=escalation.justification,
            )
        )
        if decision == "allowed-once":
            return None
        if decision == "cancelled":
            return "sandbox escalation approval was cancelled"
        # "denied", and anything unexpected: an approval that did not say yes is a no.
        return "sandbox escalation was denied"


def _shell_error_result(err: ShellError) -> ToolResult:
    return error_result(render_shell_error(err.code, err.reason))
