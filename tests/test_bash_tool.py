"""BashTool over a recording executor: schema, validation texts, the injection guard,
rendering, errors, background starts and the pure presenters."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import FakeExecutor, run_result
from shellseam import (
    LocalShellExecutor,
    ManagedEnvContributor,
    ManagedEnvRegistry,
    SubprocessService,
    parse_exit_status,
)
from shellseam.abort import AbortController
from shellseam.errors import (
    DISPOSED,
    INVALID_REQUEST,
    SANDBOX_UNAVAILABLE,
    SPAWN_FAILED,
    ShellError,
)
from shellseam.tasks import TaskRuntime
from shellseam.tool import BashTool, PromptSection, ToolContext, ToolResult

CWD = "/home/agent/project"
CTX = ToolContext(session_id="sess-1", session_cwd=CWD)
MANAGED = {"DSH_HOME": "/h", "DSH_SHELL": "1", "DSH_SESSION_ID": "sess-1"}


def make(
    executor: FakeExecutor | None = None, **kw: Any
) -> tuple[BashTool, FakeExecutor, TaskRuntime]:
    executor = executor or FakeExecutor()
    tasks = kw.pop("tasks", TaskRuntime())
    tool = BashTool(executor, tasks=tasks, env=ManagedEnvRegistry(home="/h"), **kw)
    return tool, executor, tasks


def call(tool: BashTool, args: Mapping[str, Any], ctx: ToolContext = CTX) -> ToolResult:
    return asyncio.run(tool.execute(args, ctx))


def ok(command: str = "echo hi", **extra: Any) -> dict[str, Any]:
    return {"command": command, "description": "Print a greeting", **extra}


def test_schema_default_composition() -> None:
    tool, _, _ = make()
    schema = tool.schema()
    assert schema["name"] == "bash"
    assert isinstance(schema["description"], str)
    assert "$DSH_*" in schema["description"]
    assert "SESSION_JSONL" not in schema["description"]
    params = schema["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["command", "description"]
    assert list(params["properties"]) == [
        "command",
        "description",
        "timeoutMs",
        "workdir",
        "run_in_background",
    ]
    assert params["properties"]["timeoutMs"]["type"] == "number"
    assert params["properties"]["run_in_background"]["type"] == "boolean"


def test_schema_follows_background_and_sandbox_capabilities() -> None:
    tool, _, _ = make(enable_run_in_background=False)
    assert "run_in_background" not in tool.schema()["parameters"]["properties"]
    tool, _, _ = make(FakeExecutor(sandbox_mode="read-only"))
    props = tool.schema()["parameters"]["properties"]
    assert props["sandbox_permissions"]["enum"] == ["workspace-write", "danger-full-access"]
    assert props["justification"]["type"] == "string"
    assert "sandbox_permissions" not in make()[0].schema()["parameters"]["properties"]


def test_prompt_section() -> None:
    assert make()[0].prompt_section() == PromptSection(
        name="tool:bash",
        order=105,
        text=(
            "Check the [exit code: N] marker on every bash result; "
            "investigate failures before moving on."
        ),
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "invalid command: expected a non-empty string"),
        ({"command": "", "description": "d"}, "invalid command: expected a non-empty string"),
        ({"command": "  \n", "description": "d"}, "invalid command: expected a non-empty string"),
        ({"command": ["ls"], "description": "d"}, "invalid command: expected a non-empty string"),
        ({"command": "ls"}, "invalid description: expected a non-empty string"),
        ({"command": "ls", "description": ""}, "invalid description: expected a non-empty string"),
        ({"command": "ls", "description": 3}, "invalid description: expected a non-empty string"),
        (ok(timeoutMs=-1), "invalid timeoutMs: expected a positive number, got -1"),
        (ok(timeoutMs=0), "invalid timeoutMs: expected a positive number, got 0"),
        (ok(timeoutMs=-0.5), "invalid timeoutMs: expected a positive number, got -0.5"),
        # JSON.stringify writes integral numbers without a fraction, as the model sent them.
        (ok(timeoutMs=0.0), "invalid timeoutMs: expected a positive number, got 0"),
        (ok(timeoutMs=-1.0), "invalid timeoutMs: expected a positive number, got -1"),
        (ok(timeoutMs=[2.0]), "invalid timeoutMs: expected a positive number, got [2]"),
        (ok(timeoutMs="abc"), 'invalid timeoutMs: expected a positive number, got "abc"'),
        (ok(timeoutMs="5000"), 'invalid timeoutMs: expected a positive number, got "5000"'),
        (ok(timeoutMs=True), "invalid timeoutMs: expected a positive number, got true"),
        (ok(timeoutMs=[1]), "invalid timeoutMs: expected a positive number, got [1]"),
        (ok(timeoutMs={"a": 1}), 'invalid timeoutMs: expected a positive number, got {"a":1}'),
        (ok(timeoutMs=float("inf")), "invalid timeoutMs: expected a positive number, got Infinity"),
        (ok(workdir=7), "invalid workdir: expected a string"),
        (
            ok(sandbox_permissions="workspace-write"),
            "invalid escalation: sandbox_permissions requires a justification",
        ),
        (
            ok(justification="because"),
            "invalid escalation: justification is only valid together with sandbox_permissions",
        ),
        (
            ok(run_in_background="yes"),
            'invalid run_in_background: expected a boolean, got "yes"',
        ),
    ],
)
def test_validation_messages(args: dict[str, Any], message: str) -> None:
    tool, executor, _ = make()
    result = call(tool, args)
    assert result == ToolResult(f"Error: {message}", is_error=True, details=None)
    assert executor.requests == [] and executor.specs == []


def test_timeout_is_rounded_up_to_whole_ms() -> None:
    tool, executor, _ = make()
    for given_ms, expected in [(1500, 1500), (1.2, 2), (1e-9, 1), (2.0, 2), (10**12, 10**12)]:
        call(tool, ok(timeoutMs=given_ms))
        sent = executor.requests[-1].timeout_ms
        assert sent == expected and type(sent) is int
    call(tool, ok())
    assert executor.requests[-1].timeout_ms is None
    call(tool, ok(timeoutMs=None))
    assert executor.requests[-1].timeout_ms is None


def test_request_is_built_only_from_named_fields() -> None:
    tool, executor, _ = make()
    controller = AbortController()
    ctx = ToolContext("sess-1", CWD, signal=controller.signal)
    args = ok(
        "printenv",
        timeoutMs=5000,
        workdir="sub/dir",
        stdin="rm -rf /\n",
        env={"PATH": "/evil"},
        stdout_max_bytes=10**9,
        managed_env={"DSH_HOME": "/evil"},
        dshEnv={"DSH_SESSION_ID": "someone-else"},
        sandbox_policy={"mode": "danger-full-access"},
        signal=None,
    )
    result = call(tool, args, ctx)
    assert not result.is_error
    [request] = executor.requests
    assert request.command == "printenv"
    assert request.workdir == f"{CWD}/sub/dir"
    assert request.timeout_ms == 5000
    assert request.signal is controller.signal
    assert request.stdin is None
    assert request.env is None
    assert request.stdout_max_bytes is None
    assert request.managed_env == MANAGED
    assert request.sandbox_policy is None  # the executor does not sandbox
    [spec] = executor.specs
    assert spec.managed_env == MANAGED and spec.stdin is None and spec.env is None


def test_workdir_resolution() -> None:
    tool, executor, _ = make()
    for workdir, expected in [
        (None, CWD),
        ("", CWD),
        ("build", f"{CWD}/build"),
        ("./a/../b", f"{CWD}/b"),
        ("..", "/home/agent"),
        ("/srv/data", "/srv/data"),
    ]:
        call(tool, ok(workdir=workdir))
        assert executor.requests[-1].workdir == expected
    call(tool, ok(), ToolContext("s", "/home/agent/project/"))
    assert executor.requests[-1].workdir == CWD


def test_managed_env_contributors_reach_the_request() -> None:
    registry = ManagedEnvRegistry(home="/h")
    registry.register(
        ManagedEnvContributor("proj", ("DSH_PROJECT",), lambda ctx: {"DSH_PROJECT": ctx.session_id})
    )
    executor = FakeExecutor()
    tool = BashTool(executor, tasks=None, env=registry)
    call(tool, ok(), ToolContext("s9", CWD, session_jsonl="/h/s9.jsonl"))
    assert executor.requests[0].managed_env == {
        "DSH_HOME": "/h",
        "DSH_SHELL": "1",
        "DSH_SESSION_ID": "s9",
        "DSH_SESSION_JSONL": "/h/s9.jsonl",
        "DSH_PROJECT": "s9",
    }


def test_foreground_result_text_and_details() -> None:
    result = run_result("out\n", "err\n", 2, duration_ms=3.25)
    tool, _, _ = make(FakeExecutor(result=result))
    answer = call(tool, ok())
    assert answer.text == "out\n[stderr]\nerr\n[exit code: 2]"
    assert answer.is_error is False  # a nonzero exit is a normal result
    assert answer.details == {"kind": "foreground", **dataclasses.asdict(result)}
    assert answer.details["stdout"] == {
        "text": "out\n",
        "truncated": False,
        "spill_path": None,
        "total_bytes": 4,
        "spill_truncated": False,
    }
    json.dumps(answer.details)  # details are plain JSON data


def test_timed_out_and_signal_results_are_not_errors() -> None:
    result = run_result(exit_code=None, signal="SIGTERM", timed_out=True, timeout_ms=1000)
    answer = call(make(FakeExecutor(result=result))[0], ok())
    assert answer.text == "(no output)\n[timed out after 1000ms]\n[killed by signal: SIGTERM]"
    assert answer.is_error is False


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (SPAWN_FAILED, "Error: spawn failed: workdir /nope does not exist"),
        (SANDBOX_UNAVAILABLE, "Error: sandbox unavailable: workdir /nope does not exist"),
        (INVALID_REQUEST, "Error: invalid request: workdir /nope does not exist"),
        (DISPOSED, "Error: shell service disposed: workdir /nope does not exist"),
    ],
)
def test_infrastructure_failures(code: Any, text: str) -> None:
    err = ShellError(code, "workdir /nope does not exist")
    for executor in (FakeExecutor(run_error=err), FakeExecutor(start_error=err)):
        tool, _, _ = make(executor)
        args = ok(run_in_background=executor.start_error is not None)
        assert call(tool, args) == ToolResult(text, is_error=True, details=None)


def test_resolve_failure_is_an_invalid_request() -> None:
    tool, executor, _ = make()
    answer = call(tool, ok("echo \0 nul"))
    assert answer == ToolResult(
        "Error: invalid request: command must be a non-empty string without NUL", True, None
    )
    assert executor.specs == []


def test_already_aborted_signal_runs_nothing() -> None:
    tool, executor, tasks = make()
    controller = AbortController()
    controller.abort("user pressed stop")
    ctx = ToolContext("sess-1", CWD, signal=controller.signal)
    for args in (ok(), ok(run_in_background=True)):
        assert call(tool, args, ctx) == ToolResult("Error: tool call aborted", True, None)
    assert executor.specs == []
    assert tasks.list("sess-1") == []


def test_aborted_result_is_an_error() -> None:
    aborted = run_result("partial", exit_code=None, signal="SIGTERM", aborted=True)
    answer = call(make(FakeExecutor(result=aborted))[0], ok())
    assert answer == ToolResult("Error: tool call aborted", True, None)


def test_abort_during_run_is_an_error_even_if_the_command_finished() -> None:
    controller = AbortController()

    def finish_then_abort(_spec: Any) -> Any:
        controller.abort()
        return run_result("done\n")

    tool, _, _ = make(FakeExecutor(result=finish_then_abort))
    ctx = ToolContext("sess-1", CWD, signal=controller.signal)
    assert call(tool, ok(), ctx).text == "Error: tool call aborted"


def test_background_start_registers_a_task() -> None:
    tool, executor, tasks = make()
    controller = AbortController()
    ctx = ToolContext("sess-1", CWD, signal=controller.signal)
    answer = call(tool, ok("sleep 100", run_in_background=True, timeoutMs=5), ctx)
    assert answer == ToolResult(
        "started background task bash-1", False, {"kind": "background", "task_id": "bash-1"}
    )
    [spec] = executor.specs
    assert spec.command == "sleep 100"
    assert spec.signal is None  # the task outlives this call's abort signal
    assert spec.managed_env == MANAGED
    [info] = tasks.list("sess-1")
    assert (info.id, info.kind, info.status, info.description) == (
        "bash-1",
        "bash",
        "running",
        "Print a greeting",
    )
    assert tasks.list("sess-2") == []
    controller.abort()
    assert executor.started[0].status == "running"
    second = call(tool, ok(run_in_background=True))
    assert second.details == {"kind": "background", "task_id": "bash-2"}
    # run_in_background=false is an ordinary foreground call.
    assert call(tool, ok(run_in_background=False)).text == "(no output)\n[exit code: 0]"


def test_background_refused_when_disabled_or_without_runtime() -> None:
    tool, executor, _ = make(enable_run_in_background=False)
    assert call(tool, ok(run_in_background=True)) == ToolResult(
        "Error: background execution is disabled for this bash tool", True, None
    )
    assert call(tool, ok(run_in_background=False)).is_error is False
    tool, executor, _ = make(tasks=None)
    assert call(tool, ok(run_in_background=True)) == ToolResult(
        "Error: background tasks unavailable: no task runtime is configured", True, None
    )
    assert executor.specs == []


def test_present_call_is_pure_and_resolves_cwd() -> None:
    tool, executor, _ = make()
    args = ok("make test", workdir="pkg")
    card = tool.present_call(args, CTX)
    assert card == {"command": "make test", "description": "Print a greeting", "cwd": f"{CWD}/pkg"}
    assert tool.present_call(args, CTX) == card
    assert tool.present_call({"command": 5}, CTX) == {
        "command": "",
        "description": "",
        "cwd": CWD,
    }
    assert executor.requests == []


def test_present_result_of_a_forged_huge_exit_code_does_not_raise() -> None:
    # Found by attacking: ValueError (int's 4,300-digit limit) out of the presenter.
    tool, _, _ = make()
    text = "x\n[exit code: 1" + "0" * 5000 + "]"
    assert tool.present_result(ToolResult(text, False, None)) == {"output": text, "status": None}


def test_present_result_strips_only_the_status_marker() -> None:
    tool, _, _ = make()
    text = (
        "x\n[output truncated; full output: /s]\n[timed out after 5ms]\n[killed by signal: SIGKILL]"
    )
    assert tool.present_result(ToolResult(text, False, None)) == {
        "output": "x\n[output truncated; full output: /s]\n[timed out after 5ms]",
        "status": {"signal": "SIGKILL"},
    }
    assert tool.present_result(ToolResult("Error: tool call aborted", True, None)) == {
        "output": "Error: tool call aborted",
        "status": None,
    }
    started = ToolResult("started background task bash-1", False, None)
    assert tool.present_result(started) == {
        "output": "started background task bash-1",
        "status": None,
    }


@settings(max_examples=60, deadline=None)
@given(
    stdout=st.text(max_size=30),
    stderr=st.text(max_size=30),
    exit_code=st.integers(-1, 255),
)
def test_present_result_round_trips_execute(stdout: str, stderr: str, exit_code: int) -> None:
    result = run_result(stdout, stderr, exit_code)
    tool, _, _ = make(FakeExecutor(result=result))
    answer = call(tool, ok())
    card = tool.present_result(answer)
    assert card["status"] == {"exit_code": exit_code}
    assert card["output"] + f"\n[exit code: {exit_code}]" == answer.text
    # The body loses only the newline that preceded the marker.
    assert (card["output"] + "\n").startswith(stdout)
    if stderr:
        assert f"[stderr]\n{stderr}" in card["output"] + "\n"
    if not stdout and not stderr:
        assert card["output"] == "(no output)"


# --- end to end, with the real LocalShellExecutor (``service`` comes from conftest) -------


def real_tool(
    service: SubprocessService, cwd: Path, **config: Any
) -> tuple[BashTool, ToolContext, TaskRuntime]:
    executor = LocalShellExecutor(cwd="/", service=service, **config)
    tasks = TaskRuntime()
    tool = BashTool(executor, tasks=tasks, env=ManagedEnvRegistry(home=str(cwd / "home")))
    return tool, ToolContext("sess-e2e", str(cwd)), tasks


def test_real_foreground_rendering(service: SubprocessService, tmp_path: Path) -> None:
    tool, ctx, _ = real_tool(service, tmp_path)
    script = "printf 'out\\n'; printf 'err\\n' >&2; exit 2"
    answer = call(tool, {"command": script, "description": "Fail on purpose"}, ctx)
    assert answer.text == "out\n[stderr]\nerr\n[exit code: 2]"
    assert answer.is_error is False
    assert answer.details is not None and answer.details["exit_code"] == 2
    assert call(tool, ok("true"), ctx).text == "(no output)\n[exit code: 0]"
    assert tool.present_result(answer) == {
        "output": "out\n[stderr]\nerr",
        "status": {"exit_code": 2},
    }


def test_real_workdir_env_and_injection_guard(
    service: SubprocessService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.setenv("DSH_SESSION_ID", "stale-parent-session")
    tool, ctx, _ = real_tool(service, tmp_path)
    script = 'pwd; echo "$DSH_SESSION_ID $DSH_SHELL ${FOO:-unset}"; cat; echo end'
    args = ok(script, workdir="sub", env={"FOO": "injected"}, stdin="smuggled\n")
    answer = call(tool, args, ctx)
    assert answer.text == f"{tmp_path}/sub\nsess-e2e 1 unset\nend\n[exit code: 0]"


def test_real_timeout_truncation_and_spawn_failure(
    service: SubprocessService, tmp_path: Path
) -> None:
    tool, ctx, _ = real_tool(service, tmp_path, max_output_bytes=100)
    timed = call(tool, ok("sleep 5", timeoutMs=200), ctx)
    assert timed.text == "(no output)\n[timed out after 200ms]\n[killed by signal: SIGTERM]"
    assert timed.is_error is False
    big = call(tool, ok("seq 1 5000"), ctx)
    body, status = parse_exit_status(big.text)
    assert status == {"exit_code": 0}
    assert body.endswith("4999\n5000\n" + body.rpartition("\n")[2])
    marker = body.rpartition("\n")[2]
    assert marker.startswith("[output truncated; full output: ") and marker.endswith("]")
    spill = marker.removeprefix("[output truncated; full output: ")[:-1]
    assert Path(spill).read_text() == "".join(f"{i}\n" for i in range(1, 5001))
    missing = call(tool, ok("true", workdir="does-not-exist"), ctx)
    assert missing.is_error is True
    assert missing.text.startswith("Error: spawn failed: ")
    assert f"{tmp_path}/does-not-exist" in missing.text


def test_real_abort_kills_the_command(service: SubprocessService, tmp_path: Path) -> None:
    tool, _, _ = real_tool(service, tmp_path)
    controller = AbortController()
    ctx = ToolContext("sess-e2e", str(tmp_path), signal=controller.signal)

    async def main() -> ToolResult:
        asyncio.get_running_loop().call_later(0.2, controller.abort)
        return await tool.execute(ok("sleep 30"), ctx)

    started = time.monotonic()
    assert asyncio.run(main()) == ToolResult("Error: tool call aborted", True, None)
    assert time.monotonic() - started < 10
    assert service.running == 0


def test_real_capped_spill_marker(service: SubprocessService, tmp_path: Path) -> None:
    tool, ctx, _ = real_tool(service, tmp_path, max_output_bytes=1000, max_spill_bytes=5000)
    answer = call(tool, ok("head -c 20000 /dev/zero | tr '\\0' x"), ctx)
    assert answer.details is not None
    spill = answer.details["stdout"]["spill_path"]
    assert answer.text == (
        "x" * 1000 + f"\n[output truncated; first 5000 bytes saved: {spill}]\n[exit code: 0]"
    )
    assert Path(spill).read_text() == "x" * 5000
