"""A minimal agent harness around shellseam: BashTool + TaskRuntime + task tools in a tool loop.

The "model" here is scripted (no LLM): each step looks at the previous tool result and
returns the next call, the way a real model would answer a tool result. Everything else is
what a real harness does: expose the tools' schemas and prompt section, hand each call a
``ToolContext`` for its session, inject completion notices before every model turn, render
cards with the pure presenters, and dispose the session's tasks at the end.

Run it: ``python examples/agent_loop.py [WORKDIR]`` (default: a fresh temporary directory).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

from shellseam import (
    BashTool,
    LocalShellExecutor,
    ManagedEnvRegistry,
    SubprocessService,
    TaskRuntime,
    ToolContext,
    ToolResult,
    task_tools,
)

# A model step: sees the last tool result (None before the first call), returns the next
# call as (tool name, arguments), or None when it is done.
Step = Callable[[ToolResult | None], tuple[str, dict[str, Any]] | None]


def task_id_of(result: ToolResult | None) -> str:
    assert result is not None and result.details is not None
    task_id: str = result.details["task_id"]
    return task_id


SCRIPT: list[Step] = [
    lambda _: ("bash", {"command": 'echo "hello from $DSH_SESSION_ID"', "description": "Greet"}),
    lambda _: ("bash", {"command": "ls no-such-file", "description": "List a missing file"}),
    lambda _: (
        "bash",
        {
            "command": "for i in 1 2 3; do echo tick $i; sleep 0.1; done",
            "description": "Tick three times",
            "run_in_background": True,
        },
    ),
    lambda last: ("task_output", {"task_id": task_id_of(last), "block": True}),
    lambda _: (
        "bash",
        {"command": "sleep 30", "description": "Wait for a long time", "run_in_background": True},
    ),
    lambda last: ("task_kill", {"task_id": task_id_of(last)}),
    # The kill's completion notice reaches the model in a later turn.
    lambda _: ("bash", {"command": "sleep 0.5; echo later", "description": "Do other work"}),
    lambda _: ("task_list", {}),
    lambda _: None,
]


async def run_session(workdir: str, home: str) -> list[str]:
    """Drive the scripted model through one session; returns the transcript lines."""
    service = SubprocessService()
    runtime = TaskRuntime()
    bash = BashTool(
        LocalShellExecutor(cwd=workdir, service=service),
        tasks=runtime,
        env=ManagedEnvRegistry(home=home),
    )
    tools = {tool.name: tool for tool in (bash, *task_tools(runtime))}
    ctx = ToolContext(session_id=f"session-{uuid.uuid4().hex[:8]}", session_cwd=workdir)

    transcript = [f"system: {bash.prompt_section().text}"]
    transcript.append(f"tools: {', '.join(t.schema()['name'] for t in tools.values())}")
    last: ToolResult | None = None
    try:
        for step in SCRIPT:
            # Notices go into the model's next turn, each exactly once.
            transcript += [f"notice: {n}" for n in runtime.drain_notices(ctx.session_id)]
            call = step(last)
            if call is None:
                break
            name, args = call
            if name == "bash":
                card = bash.present_call(args, ctx)
                transcript.append(f"$ {card['command']}    # {card['description']}")
            else:
                transcript.append(f"> {name} {json.dumps(args)}")
            last = await tools[name].execute(args, ctx)
            transcript.append(last.text)
            if name == "bash" and last.details and last.details["kind"] == "foreground":
                status = bash.present_result(last)["status"]
                transcript.append(f"  (card status pill: {status})")
    finally:
        await runtime.dispose_owner(ctx.session_id)
        await service.aclose()
    return transcript


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="shellseam-example-") as scratch:
        workdir = argv[1] if len(argv) > 1 else scratch
        for line in asyncio.run(run_session(workdir, home=scratch)):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
