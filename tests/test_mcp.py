"""The MCP server in a real subprocess, driven by the official SDK client.

Every test spawns the server the way an MCP client does (``stdio_client``) and talks to it
through ``ClientSession``: the tool list and schemas, foreground and background bash calls,
errors as ``isError``, and the session's lifetime (disconnect or SIGTERM kills what the
session started, checked in /proc).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("mcp", reason="the mcp SDK is not installed (pip install 'shellseam[mcp]')")

import anyio
import mcp_types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from shellseam._mcp_wire import check_line
from shellseam.local import LocalShellExecutor
from shellseam.mcp_server import run
from shellseam.sandbox import SandboxShellExecutor
from shellseam.tasks import TaskRuntime
from shellseam.tool.bash import PROMPT_TEXT, BashTool
from shellseam.tool.managed_env import ManagedEnvRegistry
from shellseam.tool.tasks import task_tools


def server_command(workdir: Path, home: Path, sandbox: str = "") -> list[str]:
    """``shellseam mcp`` exactly as a client configuration would spell it."""
    command = [sys.executable, "-m", "shellseam.cli", "mcp"]
    command += ["--workdir", str(workdir), "--home", str(home)]
    return command + (["--sandbox", sandbox] if sandbox else [])


@asynccontextmanager
async def connect(
    workdir: Path, home: Path, sandbox: str = ""
) -> AsyncIterator[tuple[ClientSession, types.InitializeResult]]:
    executable, *args = server_command(workdir, home, sandbox)
    params = StdioServerParameters(
        command=executable, args=args, env={"PYTHONPATH": os.pathsep.join(sys.path)}
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        yield session, init


def drive(scenario: Callable[[], Awaitable[None]]) -> None:
    anyio.run(scenario, backend="asyncio")


async def bash(session: ClientSession, command: str, **extra: Any) -> types.CallToolResult:
    return await session.call_tool("bash", {"command": command, "description": "test", **extra})


def texts(result: types.CallToolResult) -> list[str]:
    out = []
    for item in result.content:
        assert isinstance(item, types.TextContent)
        out.append(item.text)
    return out


def alive(pid: int) -> bool:
    """Alive unless gone or a zombie (dead, only waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone between open and read: ESRCH
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_dead(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.02)
    return True


async def wait_for_file(path: Path, within_s: float = 10.0) -> str:
    deadline = time.monotonic() + within_s
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} never written"
        await anyio.sleep(0.02)
    return path.read_text()


_INITIALIZE = (
    b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": '
    b'"2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}\n'
)


@contextmanager
def _raw_server(workdir: Path, home: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The server over plain pipes, initialized: its signal handlers are in place."""
    server = subprocess.Popen(
        server_command(workdir, home), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdin.write(_INITIALIZE)
        server.stdin.flush()
        assert b'"serverInfo"' in server.stdout.readline()
        server.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        server.stdin.flush()
        yield server
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        server.stdout.close()
        if not server.stdin.closed:
            server.stdin.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "dsh-home"
    path.mkdir()
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def _expected_schemas(bash_tool: BashTool, tasks: TaskRuntime) -> dict[str, dict[str, Any]]:
    return {t.schema()["name"]: t.schema() for t in (bash_tool, *task_tools(tasks))}


def test_lists_the_four_tools_with_their_own_schemas(workdir: Path, home: Path) -> None:
    tasks = TaskRuntime()
    registry = ManagedEnvRegistry(home=str(home))
    plain = _expected_schemas(
        BashTool(LocalShellExecutor(cwd=str(workdir)), tasks=tasks, env=registry), tasks
    )
    sandboxed = _expected_schemas(
        BashTool(SandboxShellExecutor(cwd=str(workdir)), tasks=tasks, env=registry), tasks
    )
    assert "sandbox_permissions" in sandboxed["bash"]["parameters"]["properties"]

    async def scenario() -> None:
        for sandbox, expected in (("", plain), ("workspace-write", sandboxed)):
            async with connect(workdir, home, sandbox) as (session, init):
                assert init.instructions == PROMPT_TEXT
                listed = (await session.list_tools()).tools
                assert [t.name for t in listed] == ["bash", "task_output", "task_list", "task_kill"]
                for tool in listed:
                    assert tool.description == expected[tool.name]["description"]
                    assert tool.input_schema == expected[tool.name]["parameters"]

    drive(scenario)


def test_foreground_bash_returns_the_rendered_text(workdir: Path, home: Path) -> None:
    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            result = await bash(session, "echo out; echo err >&2; exit 2")
            assert texts(result) == ["out\n[stderr]\nerr\n[exit code: 2]"]
            assert result.is_error is False

            result = await bash(session, "true")
            assert texts(result) == ["(no output)\n[exit code: 0]"]

            result = await bash(session, 'pwd; echo "$DSH_HOME $DSH_SHELL"; echo "$DSH_SESSION_ID"')
            cwd, managed, session_id, marker = texts(result)[0].split("\n")
            assert (cwd, managed, marker) == (str(workdir), f"{home} 1", "[exit code: 0]")
            assert len(session_id) >= 16

            (workdir / "sub").mkdir()
            result = await bash(session, "pwd", workdir="sub")
            assert texts(result) == [f"{workdir / 'sub'}\n[exit code: 0]"]

            result = await bash(session, "sleep 5", timeoutMs=200)
            assert texts(result)[0].endswith("[timed out after 200ms]\n[killed by signal: SIGTERM]")
            assert result.is_error is False

    drive(scenario)


def test_errors_come_back_as_is_error(workdir: Path, home: Path) -> None:
    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            result = await session.call_tool("bash", {"command": "true"})
            assert result.is_error is True
            assert texts(result) == ["Error: invalid description: expected a non-empty string"]

            result = await bash(session, "true", timeoutMs=-1)
            assert texts(result) == ["Error: invalid timeoutMs: expected a positive number, got -1"]

            result = await bash(session, "true", workdir="does-not-exist")
            assert result.is_error is True
            assert texts(result)[0].startswith("Error: spawn failed: ")

            result = await session.call_tool("task_output", {"task_id": "bash-99"})
            assert (result.is_error, texts(result)) == (True, ["Error: no such task: bash-99"])

            result = await session.call_tool("no_such_tool", {})
            assert (result.is_error, texts(result)) == (True, ["Error: unknown tool: no_such_tool"])

            # The connection survives every error.
            assert texts(await bash(session, "echo fine")) == ["fine\n[exit code: 0]"]

    drive(scenario)


def test_background_tasks_and_their_notices(workdir: Path, home: Path) -> None:
    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            started = await bash(session, "echo one; sleep 0.3; echo two", run_in_background=True)
            assert texts(started) == ["started background task bash-1"]
            assert started.is_error is False

            listed = await session.call_tool("task_list", {})
            assert texts(listed) == ["bash-1  running  test"]

            read = await session.call_tool("task_output", {"task_id": "bash-1", "block": True})
            assert texts(read) == ["task bash-1: completed, exit code: 0\none\ntwo\n"]

            # A task nobody read is announced once, on the next result, as its own item.
            await bash(session, "sleep 0.2; exit 3", run_in_background=True)
            result = await bash(session, "sleep 0.5; echo fg")
            assert texts(result) == [
                "fg\n[exit code: 0]",
                "background task bash-2 finished: completed",
            ]
            assert texts(await bash(session, "echo again")) == ["again\n[exit code: 0]"]

            await bash(session, "sleep 300", run_in_background=True)
            killed = await session.call_tool("task_kill", {"task_id": "bash-3"})
            # The kill's own notice may already ride on this result: the task settles fast.
            assert texts(killed)[0] == "killed task bash-3"

    drive(scenario)


async def _start_sleeper(session: ClientSession, pid_file: Path) -> tuple[int, int]:
    """A background task whose grandchild must die with it; returns (shell pid, sleep pid)."""
    command = f"sleep 300 & echo $$ $! > {pid_file}; wait"
    assert texts(await bash(session, command, run_in_background=True))[0].startswith("started")
    shell_pid, sleep_pid = map(int, (await wait_for_file(pid_file)).split())
    assert alive(shell_pid) and alive(sleep_pid)
    return shell_pid, sleep_pid


async def _server_pid(session: ClientSession) -> int:
    # The native core spawns from the server process, so it is every shell's parent.
    return int(texts(await bash(session, "echo $PPID"))[0].split("\n")[0])


def test_disconnect_kills_the_sessions_tasks_and_the_server_exits(
    workdir: Path, home: Path
) -> None:
    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            server_pid = await _server_pid(session)
            pids = await _start_sleeper(session, workdir / "pids")
            disconnected = time.monotonic()
        # stdio_client closes stdin and only escalates to signals after 2 s: a server that
        # exits on EOF by itself is gone well before that.
        assert time.monotonic() - disconnected < 2
        assert not alive(server_pid)
        for pid in pids:
            assert await wait_dead(pid, within_s=1), f"process {pid} outlived the session"

    drive(scenario)


def test_cancelling_a_call_kills_its_process_and_calls_run_concurrently(
    workdir: Path, home: Path
) -> None:
    pid_file = workdir / "pid"

    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            async with anyio.create_task_group() as tg:
                tg.start_soon(bash, session, f"echo $$ > {pid_file}; exec sleep 300")
                pid = int(await wait_for_file(pid_file))
                # A long call does not hold up the session's other calls.
                with anyio.fail_after(5):
                    assert texts(await bash(session, "echo meanwhile")) == [
                        "meanwhile\n[exit code: 0]"
                    ]
                tg.cancel_scope.cancel()  # the SDK client sends notifications/cancelled
            assert await wait_dead(pid, within_s=5)
            assert texts(await bash(session, "echo still")) == ["still\n[exit code: 0]"]

    drive(scenario)


def test_disconnect_during_a_foreground_call_kills_it(workdir: Path, home: Path) -> None:
    # Raw protocol: the SDK client cannot leave with a call still in flight.
    pid_file = workdir / "pid"
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "bash",
            "arguments": {"command": f"echo $$ > {pid_file}; exec sleep 300", "description": "x"},
        },
    }
    with _raw_server(workdir, home) as server:
        assert server.stdin is not None
        server.stdin.write(json.dumps(call).encode() + b"\n")
        server.stdin.flush()
        pid = int(anyio.run(wait_for_file, pid_file))
        server.stdin.close()
        assert server.wait(timeout=10) == 0
    assert not alive(pid)


def test_sigterm_stops_the_server_and_the_sessions_processes(workdir: Path, home: Path) -> None:
    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            server_pid = await _server_pid(session)
            pids = await _start_sleeper(session, workdir / "pids")
            os.kill(server_pid, signal.SIGTERM)
            # The client still holds stdin open: the server must not wait for EOF.
            assert await wait_dead(server_pid, within_s=5)
            for pid in pids:
                assert not alive(pid), f"process {pid} outlived the server"

    drive(scenario)


@pytest.mark.parametrize("stop", ["eof", "sigterm", "sighup"])
def test_the_server_exits_0_on_eof_and_on_sigterm(workdir: Path, home: Path, stop: str) -> None:
    with _raw_server(workdir, home) as server:
        assert server.stdin is not None
        if stop == "eof":
            server.stdin.close()
        else:
            server.send_signal(signal.SIGTERM if stop == "sigterm" else signal.SIGHUP)
        assert server.wait(timeout=10) == 0


def test_bad_arguments_exit_2_before_serving(
    workdir: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(sandbox="bogus", workdir=str(workdir), home=str(home)) == 2
    assert "invalid sandbox mode 'bogus'" in capsys.readouterr().err
    assert run(sandbox=None, workdir=str(workdir / "missing"), home=str(home)) == 2
    assert "workdir is not a directory" in capsys.readouterr().err


# -- conventions: version, annotations, structured content ---------------------------------


def test_server_info_carries_the_package_version(workdir: Path, home: Path) -> None:
    from importlib.metadata import version

    async def scenario() -> None:
        async with connect(workdir, home) as (_session, init):
            assert init.server_info.name == "shellseam"
            assert init.server_info.version == version("shellseam")

    drive(scenario)


def test_tools_carry_annotations_and_bash_an_output_schema(workdir: Path, home: Path) -> None:
    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            tools = {t.name: t for t in (await session.list_tools()).tools}

            bash_tool = tools["bash"]
            assert bash_tool.annotations is not None
            assert bash_tool.annotations.destructive_hint is True
            assert bash_tool.annotations.open_world_hint is True
            assert bash_tool.annotations.read_only_hint is False
            for name in ("task_list", "task_output"):
                annotations = tools[name].annotations
                assert annotations is not None and annotations.read_only_hint is True
            schema = bash_tool.output_schema
            assert schema is not None and schema["type"] == "object"
            for field in (
                "exit_code",
                "signal",
                "timed_out",
                "aborted",
                "stdout_truncated",
                "stderr_truncated",
                "stdout_spill_path",
                "stderr_spill_path",
                "leftover_killed",
                "limit_exceeded",
            ):
                assert field in schema["properties"], field
            assert all(tools[n].output_schema is None for n in ("task_list", "task_kill"))

    drive(scenario)


def test_bash_results_carry_structured_content(workdir: Path, home: Path) -> None:
    async def scenario() -> None:
        async with connect(workdir, home) as (session, _init):
            # The client validates structuredContent against outputSchema on every call.
            result = await bash(session, "echo out; echo err >&2; exit 2")
            assert result.structured_content == {
                "kind": "foreground",
                "exit_code": 2,
                "signal": None,
                "timed_out": False,
                "aborted": False,
                "stdout_truncated": False,
                "stderr_truncated": False,
                "stdout_spill_path": None,
                "stderr_spill_path": None,
                "leftover_killed": 0,
                "limit_exceeded": None,
            }
            result = await bash(session, "seq 1 100000; sleep 5", timeoutMs=300)
            content = result.structured_content
            assert content is not None
            assert (content["timed_out"], content["signal"], content["exit_code"]) == (
                True,
                "SIGTERM",
                None,
            )
            assert content["stdout_truncated"] is True
            assert Path(content["stdout_spill_path"]).read_text().endswith("99999\n100000\n")

            started = await bash(session, "sleep 0.1", run_in_background=True)
            assert started.structured_content == {"kind": "background", "task_id": "bash-1"}
            invalid = await session.call_tool("bash", {"command": ""})
            assert invalid.is_error and invalid.structured_content == {"kind": "error"}

    drive(scenario)


# -- the wire: every bad line gets a JSON-RPC error reply, the server carries on -------------


def _send(server: subprocess.Popen[bytes], line: bytes) -> dict[str, Any]:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(line)
    server.stdin.flush()
    reply: dict[str, Any] = json.loads(server.stdout.readline())
    return reply


_PING = b'{"jsonrpc": "2.0", "id": 99, "method": "ping"}\n'


@pytest.mark.parametrize(
    ("line", "code", "reply_id"),
    [
        (b"{not json\n", -32700, None),
        (b'{"jsonrpc": "2.0", "id": 5, "method": "ping"\n', -32700, None),
        (b'\xff\xfe{"jsonrpc": "2.0", "id": 5, "method": "ping"}\n', -32700, None),
        (b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"x": "\\ud800"}}\n', -32600, 7),
        (b'{"jsonrpc": "2.0", "id": "\\udfff", "method": "ping"}\n', -32600, None),
        (b'{"hello": "world", "id": 8}\n', -32600, 8),
        (b"[1, 2, 3]\n", -32600, None),
        (b"[" * 100_000 + b"\n", -32700, None),
        # An integer past Python's 4,300-digit limit (id or argument): json raises a plain
        # ValueError, which once crashed the server.
        (b'{"jsonrpc": "2.0", "id": 1' + b"0" * 5000 + b', "method": "ping"}\n', -32700, None),
        # Nested deeper than the SDK's own JSON parser allows (but not json's): the SDK
        # dropped the line without a reply.
        (
            b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "bash", '
            b'"arguments": {"x": ' + b"[" * 300 + b"]" * 300 + b"}}}\n",
            -32700,
            4,
        ),
        # Ids that are neither strings nor integers were taken for notifications: no reply.
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}\n', -32600, None),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}\n', -32600, None),
    ],
)
def test_a_bad_line_gets_an_error_reply_and_the_server_carries_on(
    workdir: Path, home: Path, line: bytes, code: int, reply_id: int | None
) -> None:
    with _raw_server(workdir, home) as server:
        reply = _send(server, line)
        assert reply["jsonrpc"] == "2.0" and reply["id"] == reply_id
        assert reply["error"]["code"] == code and reply["error"]["message"]
        assert _send(server, _PING) == {"jsonrpc": "2.0", "id": 99, "result": {}}


def test_an_over_long_line_is_answered_and_skipped(workdir: Path, home: Path) -> None:
    with _raw_server(workdir, home) as server:
        assert server.stdin is not None and server.stdout is not None
        # 65 MiB of a request that never ends, written in pieces, then its newline.
        server.stdin.write(b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"x": "')
        piece = b"a" * 2**20
        for _ in range(65):
            server.stdin.write(piece)
        reply = _send(server, b'"}}\n')
        assert reply["id"] is None and reply["error"]["code"] == -32600
        assert "64 MiB" in reply["error"]["message"]
        assert _send(server, _PING) == {"jsonrpc": "2.0", "id": 99, "result": {}}
        server.stdin.close()
        assert server.wait(timeout=10) == 0


def test_no_network_needs_a_confining_sandbox_and_takes_tcp_away(workdir: Path, home: Path) -> None:
    unconfined = subprocess.run(
        [*server_command(workdir, home), "--no-network"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert unconfined.returncode == 2 and unconfined.stdout == ""
    assert unconfined.stderr == (
        "shellseam mcp: --no-network needs a confining mode: read-only or workspace-write\n"
    )

    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        connect_tcp = (
            f"{sys.executable} -c 'import socket; "
            f'socket.create_connection(("127.0.0.1", {port}))\''
        )

        async def scenario() -> None:
            for extra, expected_exit in (("", 0), ("--no-network", 1)):
                executable, *args = server_command(workdir, home, "workspace-write")
                params = StdioServerParameters(
                    command=executable,
                    args=[*args, *([extra] if extra else [])],
                    env={"PYTHONPATH": os.pathsep.join(sys.path)},
                )
                async with (
                    stdio_client(params) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    result = await bash(session, connect_tcp)
                    assert result.structured_content is not None
                    assert result.structured_content["exit_code"] == expected_exit, texts(result)

        drive(scenario)


def test_ray_address_without_the_ray_backend_is_a_one_line_hint(workdir: Path) -> None:
    code = (
        "import sys; sys.modules['shellseam.ray'] = None; sys.modules['ray'] = None; "
        "from shellseam.cli import main; "
        f"sys.exit(main(['mcp', '--workdir', {str(workdir)!r}, '--ray-address', 'auto']))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == (
        "shellseam: running commands on a Ray cluster needs the 'ray' extra: "
        "pip install 'shellseam[ray]'\n"
    )


# -- the line checker as a pure function (hypothesis) ----------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    st.binary(max_size=64) | st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_check_line_never_raises_and_every_refusal_is_a_json_rpc_error(line: bytes) -> None:
    text, reply = check_line(line)
    assert text is None or reply is None
    if reply is not None:
        parsed = json.loads(reply)
        assert parsed["jsonrpc"] == "2.0" and set(parsed) == {"jsonrpc", "id", "error"}
        assert parsed["error"]["code"] in (-32700, -32600)
        assert reply.encode("utf-8")  # the reply itself is always valid UTF-8
    elif text is not None:
        types.jsonrpc_message_adapter.validate_json(text, by_name=False)


@given(
    st.one_of(st.integers(min_value=-(2**53), max_value=2**53), st.text(max_size=8)),
    st.sampled_from(["ping", "tools/list", "tools/call"]),
    st.dictionaries(st.text(max_size=5), _json_values, max_size=3),
)
def test_check_line_passes_every_well_formed_request(
    request_id: int | str, method: str, params: dict[str, Any]
) -> None:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    line = json.dumps(message).encode()
    assert check_line(line) == (line.decode(), None)


def test_a_workspace_holding_the_cache_still_gets_spill_files(workdir: Path, home: Path) -> None:
    executable, *args = server_command(workdir, home, "workspace-write")
    params = StdioServerParameters(
        command=executable,
        args=args,
        env={"PYTHONPATH": os.pathsep.join(sys.path), "XDG_CACHE_HOME": str(workdir / ".cache")},
    )

    async def scenario() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await bash(session, "seq 1 100000")
            content = result.structured_content
            assert content is not None and content["exit_code"] == 0, texts(result)
            spill = Path(content["stdout_spill_path"])
            assert not spill.is_relative_to(workdir)
            assert spill.read_text().endswith("99999\n100000\n")

    fallback = Path(f"/var/tmp/shellseam-{os.geteuid()}")
    made = not fallback.exists()
    try:
        drive(scenario)
    finally:
        if made:  # the server removes its spill directory, not the parent it made for it
            with contextlib.suppress(OSError):
                fallback.rmdir()
