"""``shellseam run``: one command through an executor, under the CLI's own event loop.

The loop owns the stop signals: SIGINT, SIGTERM or SIGHUP to the CLI aborts the call (the
executor kills the command's processes with its usual escalation) and the CLI exits 128+n
once they are gone. ``--stream`` starts the command in the background and copies its output
to the CLI's stdout and stderr as it arrives, then prints the markers on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from . import render
from .abort import AbortController
from .errors import SANDBOX_UNAVAILABLE, SPAWN_FAILED, ShellError
from .executor import ShellExecutor
from .factory import make_executor
from .paths import cli_spill_parent, logical_cwd
from .process import ShellProcess
from .render import STDERR_SECTION
from .service import SubprocessService
from .types import CollectedOutput, ResourceLimits, ShellExecRequest, ShellExecSpec, ShellRunResult

EXIT_USAGE = 2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How often an idle ``--stream`` looks for new output (the live view's latency).
STREAM_POLL_S = 0.03
#: Unread output ``--stream`` may fall behind by before bytes are dropped from the live view
#: (they stay in the spill file, and the markers say so).
STREAM_BUFFER_BYTES = 8 * 2**20


def _fail(code: int, message: str) -> int:
    print("shellseam: " + " ".join(message.split()), file=sys.stderr)
    return code


def exit_status(exit_code: int | None, signal_name: str | None) -> int:
    """The CLI's exit status for a command's outcome: its code, or 128+n for signal n."""
    if exit_code is not None:
        return exit_code
    number = render.signal_number(signal_name) if signal_name else None
    return 128 + (number or signal.SIGKILL)


#: The most of its own stdin the CLI passes on (the call's stdin is bytes written up front).
STDIN_LIMIT_BYTES = 64 * 2**20


def _stdin_bytes() -> bytes | None:
    """The CLI's stdin for the command when it is not a terminal (and is open at all), read
    to its end; more than ``STDIN_LIMIT_BYTES`` is a usage error (``yes | shellseam run``
    grew the CLI until the host's memory ran out: found by attacking)."""
    if sys.stdin is None:
        return None
    try:
        if os.isatty(0):
            return None
        data = sys.stdin.buffer.read(STDIN_LIMIT_BYTES + 1)
    except (OSError, ValueError):
        return None
    if len(data) > STDIN_LIMIT_BYTES:
        raise _Usage(
            f"stdin is over {STDIN_LIMIT_BYTES // 2**20} MiB (the CLI passes its stdin on as "
            "bytes, read to its end first): let the command read the file itself"
        )
    return data


def _limits(args: argparse.Namespace) -> ResourceLimits | None:
    """The request's ``ResourceLimits`` from the limit flags, or None when none was given."""
    fields = {
        "memory_bytes": args.memory,
        "max_processes": args.max_processes,
        "cpu_ms": args.cpu_ms,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    return ResourceLimits(**fields) if fields else None


def _request(
    args: argparse.Namespace, stdin: bytes | None, controller: AbortController
) -> ShellExecRequest:
    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise _Usage("run: expected a command after --")
    fields: dict[str, Any] = {}
    limits = _limits(args)
    if limits is not None:
        fields["limits"] = limits
    return ShellExecRequest(
        command=" ".join(words),
        workdir=args.workdir,
        timeout_ms=args.timeout_ms,
        stdin=stdin,
        signal=controller.signal,
        **fields,
    )


class _Usage(Exception):
    """A usage error found after parsing: one line, exit 2."""


def run_command(args: argparse.Namespace) -> int:
    """``shellseam run``: the exit status (see ``shellseam run --help``)."""
    # stdin is read before the stop signals are taken over: Ctrl-C while it is still open
    # interrupts the read (exit 130) instead of waiting for its end.
    try:
        stdin = _stdin_bytes()
        return asyncio.run(_run(args, stdin))
    except _Usage as err:
        return _fail(EXIT_USAGE, str(err))


async def _run(args: argparse.Namespace, stdin: bytes | None) -> int:
    loop = asyncio.get_running_loop()
    controller = AbortController()
    received: list[int] = []

    def on_stop(signum: int) -> None:
        received.append(signum)
        controller.abort(f"shellseam received {signal.Signals(signum).name}")

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_stop, signum)
    # A workspace-write call may write anywhere under the cwd (its workspace root): the spill
    # files must live outside it.
    cwd = logical_cwd()
    roots = [cwd] if args.sandbox == "workspace-write" else []
    service = SubprocessService(spill_parent=cli_spill_parent(*roots), keep_spill=True)
    try:
        try:
            # --stream reads in the background, where a stream keeps at most
            # max_output_bytes unread: a larger buffer lets the live view keep up.
            config: dict[str, Any] = (
                {"max_output_bytes": STREAM_BUFFER_BYTES} if args.stream else {}
            )
            executor = make_executor(
                args.sandbox, network=not args.no_network, service=service, cwd=cwd, **config
            )
        except ValueError as err:
            raise _Usage(str(err).replace("network=False", "--no-network")) from None
        spec = executor.resolve(_request(args, stdin, controller))
        if args.stream:
            result = await _stream(executor, spec)
            print(render.render_markers(result), file=sys.stderr)
        else:
            result = await executor.run(spec)
            if args.json:
                print(json.dumps(dataclasses.asdict(result), ensure_ascii=False))
            else:
                print(render.render_result(result))
    finally:
        await service.aclose()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
    sys.stdout.flush()
    if received:
        return 128 + received[0]
    return exit_status(result.exit_code, result.signal)


def _split_delta(delta: str) -> tuple[str, str]:
    """A background read's (stdout, stderr): the read merges them as stdout + ``[stderr]``
    section. Output that itself prints the section line can be attributed to the wrong
    stream in the live view (the final markers and spill files are unaffected)."""
    out, marker, err = delta.partition(STDERR_SECTION)
    return (out, err) if marker else (delta, "")


async def _stream(executor: ShellExecutor, spec: ShellExecSpec) -> ShellRunResult:
    """Runs ``spec`` in the background, copying its output live; a foreground-like result.

    The background handle has no timeout and no abort signal of its own: both are applied
    here (the first cause wins, as in a foreground run).
    """
    started = time.monotonic()
    proc = executor.start(spec)
    _raise_spawn_failure(proc)
    cause: list[str] = []
    cause_lock = threading.Lock()

    def stop(why: str) -> None:
        with cause_lock:
            first = not cause
            if first:
                cause.append(why)
        if first:
            proc.kill()

    remove = spec.signal.add_listener(lambda: stop("abort")) if spec.signal else None
    # The timeout fires on a thread of its own: the copy below blocks while the CLI's own
    # stdout is full (a reader that does not read), and must not hold it up.
    timer = threading.Timer(spec.timeout_ms / 1000, stop, ("timeout",))
    timer.daemon = True
    timer.start()
    spills: dict[str, str] = {}
    waiter = asyncio.ensure_future(proc.wait())
    try:
        while True:
            copied = _copy_output(proc, spills)
            if waiter.done():
                _copy_output(proc, spills)
                break
            # Idle: wait for the end or the next poll; busy: read again right away.
            await asyncio.wait({waiter}, timeout=0 if copied else STREAM_POLL_S)
    finally:
        timer.cancel()
        if remove is not None:
            remove()
        if not waiter.done():
            proc.kill()
            await waiter
    return ShellRunResult(
        exit_code=proc.exit_code,
        signal=proc.signal,
        timed_out=cause[:1] == ["timeout"],
        aborted=cause[:1] == ["abort"],
        timeout_ms=spec.timeout_ms,
        stdout=_dropped(spills.get("stdout")),
        stderr=_dropped(spills.get("stderr")),
        duration_ms=(time.monotonic() - started) * 1000,
        sandbox=proc.sandbox,
        resources=proc.resources,
    )


def _raise_spawn_failure(proc: ShellProcess) -> None:
    """A background start that could not spawn settles at once as ``killed`` with neither
    exit code nor signal and one ``spawn failed: <reason>`` delta; ``--stream`` reports it
    as a foreground run would: ``ShellError`` (exit 125), never as the command's output."""
    if proc.status != "killed" or proc.exit_code is not None or proc.signal is not None:
        return
    reason = proc.read_output().delta.removeprefix(render.render_spawn_failure(""))
    sandbox = proc.sandbox
    if sandbox is not None and sandbox.runner_failed:
        raise ShellError(SANDBOX_UNAVAILABLE, reason)
    raise ShellError(SPAWN_FAILED, reason)


def _copy_output(proc: ShellProcess, spills: dict[str, str]) -> bool:
    """Copies new output to the CLI's stdout/stderr; True when there was any."""
    read = proc.read_output()
    out, err = _split_delta(read.delta)
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()
    # A stream that outran the live view dropped bytes from memory; its spill file has them.
    if read.stdout_spill_path:
        spills["stdout"] = read.stdout_spill_path
    if read.stderr_spill_path:
        spills["stderr"] = read.stderr_spill_path
    return bool(read.delta)


def _dropped(spill_path: str | None) -> CollectedOutput:
    """A stream already shown live: no text, truncated when the live view lost bytes."""
    return CollectedOutput(
        text="",
        truncated=spill_path is not None,
        spill_path=spill_path,
        total_bytes=0,
        spill_truncated=False,
    )
