"""A mini-swe-agent environment whose commands run through a shellseam executor.

Configure it with ``environment_class: shellseam.integrations.minisweagent.ShellseamEnvironment``.
It is a drop-in for mini-swe-agent's ``LocalEnvironment`` (it subclasses it, so
``get_template_vars`` and ``serialize`` are mini-swe-agent's code): an action
``{"command": ...}`` runs as ``/bin/sh -c <command>`` with the config's ``env`` over the
harness's environment and becomes ``{"output", "returncode", "exception_info"}`` with stderr
merged into the output in write order and ``\\r``/``\\r\\n`` read as newlines (Popen's text
mode); a timeout in seconds is ``returncode == -1`` with a ``TimeoutExpired`` exception entry;
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` on the first line of a successful action raises
``Submitted`` with the rest of the output. What shellseam adds: the process group is torn down
on timeout and after the shell exits, credentials matching the scrub patterns do not reach the
command, output is bounded (a spill file keeps it whole), ``sandbox`` confines commands with
Landlock, and shellseam's markers (truncation, sandbox denial, timeout, stopped leftovers) end
the observation but never a submission.
"""

from __future__ import annotations

import math
import os
import subprocess
from typing import Any, Literal

from minisweagent.environments.local import LocalEnvironment
from pydantic import BaseModel

from ..executor import ShellExecutor
from ..factory import make_executor
from ..render import join_parts, render_markers, signal_number
from ..types import SandboxMode, ShellExecRequest, ShellRunResult

# LocalEnvironment gives the shell one pipe for stdout and stderr. shellseam keeps two, so the
# action's shell redirects its own stderr first. On the action's first line, not a line of
# its own: $LINENO and the shell's "line N:" messages stay the action's. The shell reads a -c
# string command by command, so everything after this redirect is merged in write order, and
# all that can reach the stderr pipe is what the shell wrote before it: start-up warnings and
# a syntax error on the action's first line (then nothing ran). Putting the stderr text
# first therefore restores the write order exactly.
_MERGE_STDERR = "exec 2>&1; "

# bash quotes a line it cannot parse ("bash: -c: line 1: `exec 2>&1; if then'"); the quote
# of the first line is given back its original text. dash quotes nothing.
_QUOTED_PREFIX = "`" + _MERGE_STDERR

# mini-swe-agent's timeout is the authority and LocalEnvironment caps nothing, so the
# executor's own cap is lifted to a day.
_MAX_TIMEOUT_MS = 24 * 3600 * 1000

# "sh" is what LocalEnvironment runs (Popen shell=True): /bin/sh with argv[0] "/bin/sh".
_SHELL_PROGRAMS = {"sh": "/bin/sh", "bash": "bash"}

# The submission sentinel LocalEnvironment._check_finished looks for on the first line.
_SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

# How much of a spill file is read to decide whether a truncated output is a submission.
_SPILL_HEAD_BYTES = 64 * 1024


class ShellseamEnvironmentConfig(BaseModel):
    """LocalEnvironment's fields (same names, defaults and meaning) plus shellseam's knobs."""

    cwd: str = ""
    env: dict[str, str] = {}
    timeout: int = 30
    """Seconds per action when ``execute`` is not given one."""
    shell: Literal["sh", "bash"] = "sh"
    """``sh``: ``/bin/sh -c``, as LocalEnvironment; ``bash``: ``bash -c``."""
    sandbox: SandboxMode | None = None
    """Landlock mode for every action; None runs unconfined (LocalShellExecutor)."""
    max_output_bytes: int = 4 * 2**20
    """Output kept in memory per action; beyond it the observation keeps the tail and names
    the spill file holding the whole (a submission is read from that file)."""
    grace_ms: int = 3_000
    """SIGTERM-to-SIGKILL grace on timeout, and the post-exit pipe-drain grace."""


class ShellseamEnvironment(LocalEnvironment):
    """mini-swe-agent's local environment with shellseam as the process layer."""

    config: ShellseamEnvironmentConfig

    def __init__(
        self,
        *,
        config_class: type[ShellseamEnvironmentConfig] = ShellseamEnvironmentConfig,
        **kwargs: Any,
    ) -> None:
        # LocalEnvironment.__init__ only builds the config; doing it here keeps the type.
        self.config = config_class(**kwargs)
        self._executor = _build_executor(self.config)

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Run ``action["command"]`` in a fresh shell and return mini-swe-agent's dict."""
        command = action.get("command", "")
        cwd = cwd or self.config.cwd or os.getcwd()
        timeout_s = timeout or self.config.timeout
        try:
            result = self._run(command, cwd, timeout_s)
        except Exception as e:
            output = _exception_entry(e)
            self._check_finished(output)
            return output
        text = _merged_output(result, result.stdout.text)
        observation = join_parts([text, render_markers(result, status=False)])
        if result.timed_out:
            # LocalEnvironment reports a timeout as this exception (message included); the
            # process group is already gone, reaped by the executor.
            return _exception_entry(
                subprocess.TimeoutExpired(command, timeout_s, output=observation)
            )
        returncode = _returncode(result)
        # The submission is decided on the output alone: a marker is never submitted.
        self._check_finished(
            {
                "output": _submission_candidate(result, text),
                "returncode": returncode,
                "exception_info": "",
            }
        )
        return {"output": observation, "returncode": returncode, "exception_info": ""}

    def _run(self, command: str, cwd: str, timeout_s: float) -> ShellRunResult:
        spec = self._executor.resolve(
            ShellExecRequest(
                command=_MERGE_STDERR + command,
                workdir=cwd,
                timeout_ms=math.ceil(timeout_s * 1000),
                env=self.config.env,
            )
        )
        return self._executor.run_sync(spec)


def _build_executor(config: ShellseamEnvironmentConfig) -> ShellExecutor:
    shared: dict[str, Any] = {
        "cwd": config.cwd or os.getcwd(),
        "max_timeout_ms": _MAX_TIMEOUT_MS,
        "max_output_bytes": config.max_output_bytes,
        "grace_ms": config.grace_ms,
        "shell": _SHELL_PROGRAMS[config.shell],
    }
    return make_executor(config.sandbox, **shared)


def _exception_entry(e: Exception) -> dict[str, Any]:
    """The shape LocalEnvironment gives any failure (spawn errors, timeouts), so observation
    templates and trajectory tooling see no difference."""
    raw_output = getattr(e, "output", None)
    return {
        "output": raw_output if isinstance(raw_output, str) else "",
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {e}",
        "extra": {"exception_type": type(e).__name__, "exception": str(e)},
    }


def _merged_output(result: ShellRunResult, stdout_text: str) -> str:
    """One stream, as LocalEnvironment reads it: what the shell wrote to stderr before its
    redirect (see ``_MERGE_STDERR``), then stdout, with Popen text mode's newlines."""
    early = result.stderr.text.replace(_QUOTED_PREFIX, "`", 1)
    return (early + stdout_text).replace("\r\n", "\n").replace("\r", "\n")


def _submission_candidate(result: ShellRunResult, text: str) -> str:
    """The output LocalEnvironment would test for the submission sentinel: the whole of it.

    ``text`` is whole unless stdout was truncated; then the sentinel (on the first line) is
    in the spill file, which holds the complete stream. Only when the file's head begins
    with the sentinel is the whole file read. A stream too large even for its spill file
    cannot be submitted whole, and a partial submission would be worse than none: the
    action then stays an observation, whose truncation marker says what happened.
    """
    stdout = result.stdout
    if not stdout.truncated:
        return text
    if stdout.spill_path is None or stdout.spill_truncated:
        return ""
    try:
        # The service created the file O_NOFOLLOW; it is read the same way.
        fd = os.open(stdout.spill_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as spill:
            head = spill.read(_SPILL_HEAD_BYTES)
            if not _may_submit(_merged_output(result, _decode(head))):
                return ""
            whole = head + spill.read()
    except OSError:
        return ""
    return _merged_output(result, _decode(whole))


def _may_submit(head: str) -> bool:
    """Whether an output starting with ``head`` can pass LocalEnvironment's sentinel test
    (its first non-blank line, stripped, is the sentinel): the head, blanks skipped, is
    empty, starts with the sentinel, or is the start of it."""
    stripped = head.lstrip()
    return stripped.startswith(_SUBMIT_SENTINEL) or _SUBMIT_SENTINEL.startswith(stripped)


def _decode(data: bytes) -> str:
    # LocalEnvironment's decoding (Popen encoding="utf-8", errors="replace").
    return data.decode("utf-8", errors="replace")


def _returncode(result: ShellRunResult) -> int:
    """Popen's convention: the exit code, or minus the signal number that killed the shell."""
    if result.exit_code is not None:
        return result.exit_code
    number = signal_number(result.signal) if result.signal is not None else None
    return -number if number else -1
