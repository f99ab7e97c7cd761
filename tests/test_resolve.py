"""resolve(): defaults, caps and INVALID_REQUEST for bad input."""

from __future__ import annotations

import os

import pytest

from shellseam import (
    LocalShellExecutor,
    SandboxPolicy,
    ShellError,
    ShellExecRequest,
    ShellExecSpec,
)


def resolve(ex: LocalShellExecutor, **fields: object) -> ShellExecSpec:
    return ex.resolve(ShellExecRequest(**fields))  # type: ignore[arg-type]


def test_defaults(tmp_path: object) -> None:
    ex = LocalShellExecutor(cwd=str(tmp_path))
    spec = resolve(ex, command="ls")
    assert spec.workdir == str(tmp_path) and os.path.isabs(spec.workdir)
    assert spec.timeout_ms == 120_000 and spec.stdout_max_bytes == 64_000
    assert spec.signal is None and spec.stdin is None and spec.env is None
    assert spec.managed_env is None and spec.sandbox_policy is None


def test_caps_and_relative_workdir(tmp_path: object) -> None:
    ex = LocalShellExecutor(cwd=str(tmp_path), max_timeout_ms=1000, max_spill_bytes=5000)
    spec = resolve(ex, command="ls", workdir="a/b", timeout_ms=10**9, stdout_max_bytes=10**9)
    assert spec.workdir == os.path.join(str(tmp_path), "a", "b")
    assert spec.timeout_ms == 1000 and spec.stdout_max_bytes == 5000
    assert resolve(ex, command="ls", workdir="/abs").workdir == "/abs"


def test_policy_is_carried_through_by_local() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/w")
    ex = LocalShellExecutor()
    assert resolve(ex, command="ls", sandbox_policy=policy).sandbox_policy is policy


@pytest.mark.parametrize(
    "fields",
    [
        {"command": ""},
        {"command": "   \n\t"},
        {"command": "echo a\0b"},
        {"command": "ls", "timeout_ms": 0},
        {"command": "ls", "timeout_ms": -5},
        {"command": "ls", "timeout_ms": 1.5},
        {"command": "ls", "timeout_ms": True},
        {"command": "ls", "timeout_ms": "100"},
        {"command": "ls", "stdout_max_bytes": 0},
        {"command": "ls", "workdir": "a\0b"},
        {"command": "ls", "env": {"A=B": "x"}},
        {"command": "ls", "env": {"A": "x\0y"}},
        {"command": "ls", "managed_env": {"": "x"}},
    ],
)
def test_invalid_requests(fields: dict[str, object]) -> None:
    with pytest.raises(ShellError) as info:
        resolve(LocalShellExecutor(), **fields)
    assert info.value.code == "INVALID_REQUEST"


@pytest.mark.parametrize(
    "fields",
    [
        {"command": "echo \ud800"},
        {"command": "ls", "workdir": "\udcff"},
        {"command": "cat", "stdin": "\ud800"},
        {"command": "ls", "env": {"A": "\ud800"}},
        {"command": "ls", "managed_env": {"DSH_\ud800": "x"}},
    ],
)
def test_lone_surrogates_are_invalid_requests_not_crashes(fields: dict[str, object]) -> None:
    # Valid JSON from a model ("\ud800") but not encodable: refused at resolve, clearly.
    with pytest.raises(ShellError) as info:
        resolve(LocalShellExecutor(), **fields)
    assert info.value.code == "INVALID_REQUEST" and "UTF-8" in info.value.reason


def test_bash_tool_reports_a_surrogate_command_as_invalid_request(tmp_path: object) -> None:
    import asyncio
    import json

    from shellseam import BashTool, ManagedEnvRegistry, ToolContext

    tool = BashTool(
        LocalShellExecutor(cwd=str(tmp_path)), tasks=None, env=ManagedEnvRegistry(home="/h")
    )
    args = json.loads('{"command": "echo \\ud800", "description": "d"}')
    result = asyncio.run(tool.execute(args, ToolContext("s", str(tmp_path))))
    assert result.is_error and result.text.startswith("Error: invalid request: command is not")
