"""task_output / task_list / task_kill: exact texts, owner fencing, blocking and aborts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fakes import FakeExecutor, FakeProcess
from shellseam import LocalShellExecutor, ManagedEnvRegistry, SubprocessService
from shellseam.abort import AbortController
from shellseam.tasks import TaskRuntime
from shellseam.tool import BashTool, ToolContext, ToolResult, task_tools

CTX = ToolContext("sess-1", "/w")
OTHER = ToolContext("sess-2", "/w")


class RecordingRuntime(TaskRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.wait_timeouts: list[float | None] = []

    async def wait(self, task_id: str, owner: str, timeout_ms: float | None) -> bool:
        self.wait_timeouts.append(timeout_ms)
        return await super().wait(task_id, owner, timeout_ms)


def setup() -> tuple[RecordingRuntime, Any, Any, Any]:
    runtime = RecordingRuntime()
    output, listing, kill = task_tools(runtime)
    return runtime, output, listing, kill


def run(tool: Any, args: Mapping[str, Any], ctx: ToolContext = CTX) -> ToolResult:
    result: ToolResult = asyncio.run(tool.execute(args, ctx))
    return result


def test_names_and_schemas() -> None:
    _, output, listing, kill = setup()
    assert [t.name for t in (output, listing, kill)] == ["task_output", "task_list", "task_kill"]
    out_schema = output.schema()
    assert out_schema["name"] == "task_output"
    assert out_schema["parameters"]["required"] == ["task_id"]
    assert set(out_schema["parameters"]["properties"]) == {"task_id", "block", "timeoutMs"}
    assert listing.schema()["parameters"]["properties"] == {}
    assert kill.schema()["parameters"]["required"] == ["task_id"]


def test_task_output_running_then_completed() -> None:
    runtime, output, _, _ = setup()
    proc = FakeProcess()
    tid = runtime.start("bash", "sess-1", proc, "build")
    assert run(output, {"task_id": tid}).text == "task bash-1: running"
    proc.feed("compiling\n")
    first = run(output, {"task_id": tid})
    assert first.text == "task bash-1: running\ncompiling\n"
    assert first.is_error is False
    assert first.details is not None and first.details["delta"] == "compiling\n"
    proc.feed("done\n", "warning: x\n")
    proc.finish(0)
    assert run(output, {"task_id": tid}).text == (
        "task bash-1: completed, exit code: 0\ndone\n\n[stderr]\nwarning: x\n"
    )
    assert run(output, {"task_id": tid}).text == "task bash-1: completed, exit code: 0"


def test_task_output_killed_and_spawn_failure() -> None:
    runtime, output, _, _ = setup()
    proc = FakeProcess()
    tid = runtime.start("bash", "sess-1", proc)
    runtime.kill(tid, "sess-1")
    assert run(output, {"task_id": tid}).text == "task bash-1: killed, signal: SIGTERM"
    failed = FakeProcess()
    failed.feed("spawn failed: no such directory")
    failed.finish(exit_code=None, killed=True)
    tid = runtime.start("bash", "sess-1", failed)
    assert run(output, {"task_id": tid}).text == (
        "task bash-2: killed\nspawn failed: no such directory"
    )


def test_task_output_lossy_markers_per_stream() -> None:
    runtime, output, _, _ = setup()
    proc = FakeProcess()
    tid = runtime.start("bash", "sess-1", proc)
    proc.feed("tail\n")
    proc.drop("/spill/out", "/spill/err")
    assert run(output, {"task_id": tid}).text == (
        "task bash-1: running\n"
        "tail\n"
        "[some output was dropped from memory; full output: /spill/out]\n"
        "[some output was dropped from memory; full output: /spill/err]"
    )
    proc.drop(None, "/spill/err")
    assert run(output, {"task_id": tid}).text == (
        "task bash-1: running\n[some output was dropped from memory; full output: /spill/err]"
    )


def test_block_waits_for_completion() -> None:
    runtime, output, _, _ = setup()
    proc = FakeProcess()
    tid = runtime.start("bash", "sess-1", proc)
    proc.feed("x")
    proc.finish_later(0.05, exit_code=4)
    started = time.monotonic()
    assert run(output, {"task_id": tid, "block": True}).text == (
        "task bash-1: completed, exit code: 4\nx"
    )
    assert time.monotonic() - started >= 0.04
    assert runtime.wait_timeouts == [30_000]


def test_block_times_out_and_reports_running() -> None:
    runtime, output, _, _ = setup()
    tid = runtime.start("bash", "sess-1", FakeProcess())
    started = time.monotonic()
    answer = run(output, {"task_id": tid, "block": True, "timeoutMs": 50.5})
    assert answer.text == "task bash-1: running"
    assert 0.04 <= time.monotonic() - started < 5
    assert runtime.wait_timeouts == [51]


def test_timeout_without_block_does_not_wait() -> None:
    runtime, output, _, _ = setup()
    tid = runtime.start("bash", "sess-1", FakeProcess())
    assert run(output, {"task_id": tid, "timeoutMs": 10_000}).text == "task bash-1: running"
    assert runtime.wait_timeouts == []


def test_block_is_cut_short_by_abort_without_consuming() -> None:
    runtime, output, _, _ = setup()
    proc = FakeProcess()
    tid = runtime.start("bash", "sess-1", proc)
    proc.feed("kept\n")
    controller = AbortController()
    threading.Timer(0.05, controller.abort).start()
    ctx = ToolContext("sess-1", "/w", signal=controller.signal)
    started = time.monotonic()
    answer = run(output, {"task_id": tid, "block": True}, ctx)
    assert answer == ToolResult("Error: tool call aborted", True, None)
    assert time.monotonic() - started < 5
    assert run(output, {"task_id": tid}).text == "task bash-1: running\nkept\n"


def test_block_with_signal_still_completes_normally() -> None:
    runtime, output, _, _ = setup()
    proc = FakeProcess()
    tid = runtime.start("bash", "sess-1", proc)
    proc.finish_later(0.02, exit_code=0)
    ctx = ToolContext("sess-1", "/w", signal=AbortController().signal)
    answer = run(output, {"task_id": tid, "block": True}, ctx)
    assert answer.text == "task bash-1: completed, exit code: 0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "invalid task_id: expected a non-empty string"),
        ({"task_id": ""}, "invalid task_id: expected a non-empty string"),
        ({"task_id": 1}, "invalid task_id: expected a non-empty string"),
        ({"task_id": "bash-1", "block": "yes"}, 'invalid block: expected a boolean, got "yes"'),
        (
            {"task_id": "bash-1", "block": True, "timeoutMs": -5},
            "invalid timeoutMs: expected a positive number, got -5",
        ),
    ],
)
def test_task_output_validation(args: dict[str, Any], message: str) -> None:
    runtime, output, _, _ = setup()
    runtime.start("bash", "sess-1", FakeProcess())
    assert run(output, args) == ToolResult(f"Error: {message}", True, None)


def test_unknown_and_foreign_ids_are_no_such_task() -> None:
    runtime, output, listing, kill = setup()
    proc = FakeProcess()
    tid = runtime.start("bash", "sess-1", proc)
    proc.feed("secret\n")
    for task_id in (tid, "bash-42", "nonsense"):
        expected = ToolResult(f"Error: no such task: {task_id}", True, None)
        assert run(output, {"task_id": task_id}, OTHER) == expected
        assert run(output, {"task_id": task_id, "block": True}, OTHER) == expected
        assert run(kill, {"task_id": task_id}, OTHER) == expected
    assert run(listing, {}, OTHER).text == "(no tasks)"
    assert proc.status == "running"
    assert run(output, {"task_id": tid}).text == "task bash-1: running\nsecret\n"


def test_task_list_lines() -> None:
    runtime, _, listing, _ = setup()
    assert run(listing, {}) == ToolResult("(no tasks)", False, {"kind": "task_list", "tasks": []})
    a, b, c = FakeProcess(), FakeProcess(), FakeProcess()
    runtime.start("bash", "sess-1", a, "Run the test suite")
    runtime.start("bash", "sess-2", b, "someone else's")
    runtime.start("bash", "sess-1", c)
    a.finish(1)
    listed = run(listing, {"ignored": True}).text
    # SPEC §4: "<id>  <status>  <description>", literally (an empty description leaves the
    # separator).
    assert listed == "bash-1  completed  Run the test suite\nbash-3  running  "


def test_task_kill_texts() -> None:
    runtime, _, _, kill = setup()
    tid = runtime.start("bash", "sess-1", FakeProcess())
    assert run(kill, {"task_id": tid}) == ToolResult(
        "killed task bash-1", False, {"kind": "task_kill", "task_id": "bash-1", "killed": True}
    )
    assert run(kill, {"task_id": tid}).text == "task bash-1 had already finished"
    assert run(kill, {"task_id": ""}) == ToolResult(
        "Error: invalid task_id: expected a non-empty string", True, None
    )


def test_reading_a_finished_task_drops_its_notice() -> None:
    runtime, output, _, _ = setup()
    seen, unseen = FakeProcess(), FakeProcess()
    t_seen = runtime.start("bash", "sess-1", seen)
    t_unseen = runtime.start("bash", "sess-1", unseen)
    seen.finish(0)
    unseen.finish(None, "SIGKILL")
    run(output, {"task_id": t_seen})
    assert runtime.drain_notices("sess-1") == [f"background task {t_unseen} finished: killed"]


def test_bash_background_then_task_tools() -> None:
    runtime = TaskRuntime()
    executor = FakeExecutor()
    bash = BashTool(executor, tasks=runtime, env=ManagedEnvRegistry(home="/h"))
    output, listing, kill = task_tools(runtime)

    async def main() -> list[str]:
        started = await bash.execute(
            {"command": "tail -f log", "description": "Follow the log", "run_in_background": True},
            CTX,
        )
        task_id = started.details["task_id"] if started.details else ""
        proc = executor.started[0]
        proc.feed("line 1\n")
        texts = [
            started.text,
            (await output.execute({"task_id": task_id}, CTX)).text,
            (await listing.execute({}, CTX)).text,
            (await kill.execute({"task_id": task_id}, CTX)).text,
            (await output.execute({"task_id": task_id, "block": True}, CTX)).text,
        ]
        return texts

    assert asyncio.run(main()) == [
        "started background task bash-1",
        "task bash-1: running\nline 1\n",
        "bash-1  running  Follow the log",
        "killed task bash-1",
        "task bash-1: killed, signal: SIGTERM",
    ]
    assert runtime.drain_notices("sess-1") == []


# --- end to end, with the real LocalShellExecutor ----------------------------------------


def test_real_background_lifecycle(tmp_path: Path) -> None:
    service = SubprocessService()
    runtime = TaskRuntime()
    bash = BashTool(
        LocalShellExecutor(cwd=str(tmp_path), service=service),
        tasks=runtime,
        env=ManagedEnvRegistry(home=str(tmp_path)),
    )
    output, listing, kill = task_tools(runtime)
    ctx = ToolContext("sess-e2e", str(tmp_path))

    async def start(command: str, description: str) -> str:
        args = {"command": command, "description": description, "run_in_background": True}
        answer = await bash.execute(args, ctx)
        assert answer.details is not None
        task_id: str = answer.details["task_id"]
        assert answer.text == f"started background task {task_id}"
        return task_id

    async def text(tool: Any, args: Mapping[str, Any], c: ToolContext = ctx) -> str:
        answer: ToolResult = await tool.execute(args, c)
        return answer.text

    async def main() -> None:
        quick = await start("echo one; echo two >&2; echo $DSH_SESSION_ID", "Print two lines")
        slow = await start("echo started; exec sleep 30", "Sleep for a while")
        forever = await start("sleep 60", "Sleep longer")
        assert await text(output, {"task_id": quick, "block": True}) == (
            f"task {quick}: completed, exit code: 0\none\nsess-e2e\n\n[stderr]\ntwo\n"
        )
        assert await text(output, {"task_id": slow, "block": True, "timeoutMs": 300}) == (
            f"task {slow}: running\nstarted\n"
        )
        assert await text(listing, {}) == (
            f"{quick}  completed  Print two lines\n"
            f"{slow}  running  Sleep for a while\n"
            f"{forever}  running  Sleep longer"
        )
        assert await text(output, {"task_id": slow}, ToolContext("intruder", "/")) == (
            f"Error: no such task: {slow}"
        )
        assert await text(kill, {"task_id": slow}) == f"killed task {slow}"
        # The supervisor settles the task on its own thread; the notice is queued there.
        assert await runtime.wait(slow, "sess-e2e", 10_000) is True
        assert runtime.drain_notices("sess-e2e") == [f"background task {slow} finished: killed"]
        assert await text(kill, {"task_id": slow}) == f"task {slow} had already finished"
        assert await text(output, {"task_id": slow}) == f"task {slow}: killed, signal: SIGTERM"
        await runtime.dispose_owner("sess-e2e")
        assert service.running == 0
        assert await text(listing, {}) == "(no tasks)"

    try:
        asyncio.run(main())
    finally:
        service.dispose()
