"""Model-facing rendering of shell results: the exact strings a model reads (SPEC §5).

``render_result`` turns a foreground ``ShellRunResult`` into text whose last line is the
exit-status marker; ``render_markers`` gives the same markers without the output text, for
front ends that show the output themselves; ``parse_exit_status`` inverts the status marker
for presenters (terminal cards show the status as a separate pill). The background strings
(start acknowledgement, status details, lossy-read markers), the task tools' lines, completion
notices, tool errors and the ``bash`` tool's prompt text live here too, so every model-facing
string has one home.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypedDict

from .errors import DISPOSED, INVALID_REQUEST, SANDBOX_UNAVAILABLE, SPAWN_FAILED
from .types import CollectedOutput, ShellResources, ShellRunResult

if TYPE_CHECKING:
    from .tasks import TaskInfo, TaskRead

#: The ``tool:bash`` system-prompt section (SPEC §5).
PROMPT_TEXT = (
    "Check the [exit code: N] marker on every bash result; investigate failures before moving on."
)
#: What a background read puts between new stdout and new stderr.
STDERR_SECTION = "\n[stderr]\n"
NO_OUTPUT = "(no output)"
TOOL_CALL_ABORTED = "tool call aborted"

_SHELL_ERROR_PREFIX = {
    SPAWN_FAILED: "spawn failed",
    SANDBOX_UNAVAILABLE: "sandbox unavailable",
    INVALID_REQUEST: "invalid request",
    DISPOSED: "shell service disposed",
}

#: An exit code has at most 19 digits here: a longer "code" is not a marker (and would pass
#: ``int``'s digit limit: ``ValueError`` out of a presenter, found by attacking).
_EXIT_MARKER = re.compile(r"\[exit code: (-?[0-9]{1,19})\]")
_SIGNAL_MARKER = re.compile(r"\[killed by signal: (.+)\]")
EXIT_STATUS_UNKNOWN_MARKER = "[exit status unknown]"


class ExitStatus(TypedDict, total=False):
    """A parsed final marker: exactly one key, ``exit_code``, ``signal`` or ``unknown``."""

    exit_code: int
    signal: str
    unknown: bool


def join_parts(parts: Iterable[str]) -> str:
    """Concatenate ``parts``, inserting ``\\n`` after any part (but the last) lacking one.

    This is the one joining rule of model-facing text: output that already ends with a
    newline is not followed by a blank line, and the final part keeps its exact ending.
    """
    pieces = [part for part in parts if part]
    out: list[str] = []
    for i, part in enumerate(pieces):
        out.append(part)
        if i < len(pieces) - 1 and not part.endswith("\n"):
            out.append("\n")
    return "".join(out)


def _truncation_marker(stream: CollectedOutput) -> str:
    if stream.spill_path is None:
        return "[output truncated; full output unavailable]"
    if not stream.spill_truncated:
        return f"[output truncated; full output: {stream.spill_path}]"
    saved = _saved_head(stream.spill_path)
    if saved is None:
        return "[output truncated; full output unavailable]"
    return f"[output truncated; {saved}]"


def _saved_head(spill_path: str) -> str | None:
    """``first <n> bytes saved: <path>`` for a spill file that holds only the stream's head;
    None when the file is already gone (it cannot be offered to the model)."""
    # The result does not carry the spill cap, so the saved head's size is read from the
    # file itself.
    try:
        saved_bytes = os.stat(spill_path).st_size
    except OSError:
        return None
    return f"first {saved_bytes} bytes saved: {spill_path}"


def _exit_status_marker(
    exit_code: int | None, signal: str | None, unknown: bool = False
) -> str | None:
    """The final marker line for a termination, or None when there is nothing to report.

    A status reaped by someone else is said to be unknown; a signal wins over an exit
    code. Neither is set otherwise only for a run that never spawned (its abort signal had
    already fired): no status is invented for it.
    """
    if unknown:
        return EXIT_STATUS_UNKNOWN_MARKER
    if signal is not None:
        return f"[killed by signal: {signal}]"
    if exit_code is not None:
        return f"[exit code: {exit_code}]"
    return None


def _limit_marker(resources: ShellResources | None) -> str | None:
    """The marker of the limit a call hit, quoting the call's effective limit."""
    if resources is None or resources.limit_exceeded is None:
        return None
    limits = resources.limits
    match resources.limit_exceeded:
        case "memory":
            return f"[killed: memory limit of {limits.memory_bytes} bytes exceeded]"
        case "cpu":
            return f"[killed: cpu limit of {limits.cpu_ms}ms exceeded]"
        case "processes":
            return f"[process limit of {limits.max_processes} reached; some forks failed]"
        case "file_size":
            return f"[file size limit of {limits.file_size_bytes} bytes reached]"


def _markers(result: ShellRunResult, *, status: bool) -> list[str]:
    """Every marker a foreground rendering puts after the output text, in SPEC §5 order.

    The one list of them: ``render_result`` (after the output) and ``render_markers``
    (alone) both use it, so a marker added here shows in both.
    """
    stdout, stderr = result.stdout, result.stderr
    parts = [_truncation_marker(s) for s in (stdout, stderr) if s.truncated]
    if result.sandbox is not None and result.sandbox.denied:
        parts.append(f"[sandbox: file access denied under {result.sandbox.mode} mode]")
    if result.timed_out:
        parts.append(f"[timed out after {result.timeout_ms}ms]")
    limit = _limit_marker(result.resources)
    if limit is not None:
        parts.append(limit)
    if result.leftover_killed == 1:
        parts.append("[stopped 1 leftover background process]")
    elif result.leftover_killed > 1:
        parts.append(f"[stopped {result.leftover_killed} leftover background processes]")
    final = (
        _exit_status_marker(result.exit_code, result.signal, result.exit_status_unknown)
        if status
        else None
    )
    if final is not None:
        parts.append(final)
    return parts


def render_result(result: ShellRunResult) -> str:
    """Render a foreground result exactly as SPEC §5 "Rendering" orders it.

    stdout; ``[stderr]`` + stderr; ``(no output)`` when both are empty; truncation markers
    (stdout first); the sandbox-denial, timeout, limit and leftover-process markers; and last the
    exit-status marker, without a trailing newline. The only I/O: a capped spill file's
    saved size is read from the file, since the result does not carry the spill cap.
    """
    stdout, stderr = result.stdout, result.stderr
    parts: list[str] = [stdout.text]
    if stderr.text:
        parts += ["[stderr]", stderr.text]
    if not stdout.text and not stderr.text:
        parts.append(NO_OUTPUT)
    return join_parts([*parts, *_markers(result, status=True)])


def render_markers(result: ShellRunResult, *, status: bool = True) -> str:
    """The markers of ``render_result(result)`` without the output text, one per line.

    For front ends that show the output themselves (live, or in a field of their own): the
    truncation, sandbox-denial, timeout and leftover-process markers and, unless ``status``
    is False (a front end that reports the exit status in a field of its own), the final
    exit-status line. ``(no output)`` is not a marker and never appears. Empty when there
    is nothing to mark (``status=False`` on a clean run, or a run that never spawned).
    """
    return join_parts(_markers(result, status=status))


def parse_exit_status(text: str) -> tuple[str, ExitStatus | None]:
    """Split ``text`` into ``(body, status)`` by inverting its final exit-status marker.

    Only the last line is examined. When it is exactly ``[exit code: N]`` the status is
    ``{"exit_code": N}``; when it is exactly ``[killed by signal: NAME]`` it is
    ``{"signal": NAME}``; when it is exactly ``[exit status unknown]`` it is
    ``{"unknown": True}``; ``body`` is then the text before that line without the newline
    preceding it. Otherwise the status is None and ``body`` is ``text`` unchanged.

    Output that ends in a newline gets no second one before the marker, so its own final
    newline is the one removed: ``"a\\n[exit code: 0]"`` gives ``"a"`` whether stdout was
    ``"a"`` or ``"a\\n"`` (the rendering cannot tell them apart; SPEC §5 fixes both strings).

    Known presentation-only residue (as in the seed): the parser cannot tell a rendered
    marker from output whose own last line looks like one. Text that did not come from
    ``render_result`` but ends in such a line has that line consumed as the status. Output
    rendered by ``render_result`` is always followed by the real marker, which is the one
    consumed, so a marker-looking output line stays in the body there.
    """
    head, newline, last = text.rpartition("\n")
    body = head if newline else ""
    if m := _EXIT_MARKER.fullmatch(last):
        return body, {"exit_code": int(m.group(1))}
    if m := _SIGNAL_MARKER.fullmatch(last):
        return body, {"signal": m.group(1)}
    if last == EXIT_STATUS_UNKNOWN_MARKER:
        return body, {"unknown": True}
    return text, None


def signal_number(name: str) -> int | None:
    """The number of a signal as results name it (``SIGTERM``, ``SIGRTMAX``, or ``SIG35`` for
    a real-time signal without a name of its own); None for any other string."""
    if name in signal.Signals.__members__:
        return int(signal.Signals[name])
    digits = name.removeprefix("SIG")
    if digits.isascii() and digits.isdigit() and len(digits) <= 3:
        return int(digits)
    return None


def render_background_started(task_id: str) -> str:
    """The acknowledgement of a background start."""
    return f"started background task {task_id}"


def render_termination(exit_code: int | None, signal: str | None) -> str:
    """Background status details: ``exit code: <n>`` and/or ``signal: <SIGNAME>``, comma-joined.

    Empty when neither is known (a running task, or one whose spawn failed).
    """
    details: list[str] = []
    if exit_code is not None:
        details.append(f"exit code: {exit_code}")
    if signal is not None:
        details.append(f"signal: {signal}")
    return ", ".join(details)


def render_lossy_markers(
    lossy: bool,
    stdout_spill_path: str | None,
    stderr_spill_path: str | None,
    stdout_spill_truncated: bool = False,
    stderr_spill_truncated: bool = False,
) -> list[str]:
    """One marker per spilled stream of a lossy background read (stdout first).

    A lossy read whose streams left no spill file still says that output was dropped, so
    the loss is never silent; a spill file that holds only the stream's head (its cap was
    reached) is offered as such, as in a foreground result, never as the full output.
    """
    if not lossy:
        return []
    streams = [
        (path, truncated)
        for path, truncated in (
            (stdout_spill_path, stdout_spill_truncated),
            (stderr_spill_path, stderr_spill_truncated),
        )
        if path is not None
    ]
    if not streams:
        return ["[some output was dropped from memory; full output unavailable]"]
    dropped = "[some output was dropped from memory; "
    markers = []
    for path, truncated in streams:
        saved = _saved_head(path) if truncated else f"full output: {path}"
        markers.append(dropped + (saved or "full output unavailable") + "]")
    return markers


def render_delta(stdout: str, stderr: str) -> str:
    """A background read's delta: stdout, then stderr in a marked section if any."""
    return stdout + (STDERR_SECTION + stderr if stderr else "")


def render_spawn_failure(reason: str) -> str:
    """The one delta of a background start whose spawn failed."""
    return f"spawn failed: {reason}"


def render_shell_error(code: str, reason: str) -> str:
    """An infrastructure failure as the tool reports it: ``spawn failed: <reason>`` etc."""
    prefix = _SHELL_ERROR_PREFIX.get(code, code.lower().replace("_", " "))
    return f"{prefix}: {reason}"


def render_error(message: str) -> str:
    """A tool error as the model sees it."""
    return f"Error: {message}"


def bash_tool_description(prefix: str) -> str:
    """The ``bash`` tool's description; ``prefix`` is the managed-environment prefix."""
    return (
        "Run a bash command in a fresh non-interactive shell and return its stdout, a "
        "[stderr] section and a final [exit code: N] or [killed by signal: NAME] "
        "marker. Long output keeps its tail and links the full output file. Commands "
        f"receive trusted ${prefix}* environment variables (such as ${prefix}HOME and "
        f"${prefix}SESSION_ID) that identify the harness and the session."
    )


# -- task tools and notices --------------------------------------------------------------


def render_notice(task_id: str, status: str) -> str:
    """The completion notice a harness injects for the model."""
    return f"background task {task_id} finished: {status}"


def render_no_such_task(task_id: str) -> str:
    return f"no such task: {task_id}"


def render_task_read(read: TaskRead) -> str:
    """Status line, the new output, then one lossy marker per lossy stream."""
    status = f"task {read.id}: {read.status}"
    termination = render_termination(read.exit_code, read.signal)
    if termination:
        status += f", {termination}"
    markers = render_lossy_markers(
        read.lossy,
        read.stdout_spill_path,
        read.stderr_spill_path,
        read.stdout_spill_truncated,
        read.stderr_spill_truncated,
    )
    return join_parts([status, read.delta, *markers])


def render_task_list(infos: Sequence[TaskInfo]) -> str:
    """One line per task (id, status, description), or ``(no tasks)``."""
    lines = [f"{i.id}  {i.status}  {i.description}" for i in infos]
    return "\n".join(lines) if lines else "(no tasks)"


def render_task_kill(task_id: str, killed: bool) -> str:
    return f"killed task {task_id}" if killed else f"task {task_id} had already finished"
