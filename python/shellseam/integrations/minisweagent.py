"""A mini-swe-agent environment whose commands run through a shellseam executor.

Configure it with ``environment_class: shellseam.integrations.minisweagent.ShellseamEnvironment``.
It keeps mini-swe-agent's own ``LocalEnvironment`` contract (it subclasses it, so the
submission sentinel, ``get_template_vars`` and ``serialize`` are mini-swe-agent's code): an
action ``{"command": ...}`` becomes ``{"output", "returncode", "exception_info"}`` with stderr
merged into the output in write order, the config's ``env`` over the harness's environment, a
timeout in seconds reported as ``returncode == -1`` with a ``TimeoutExpired`` exception entry,
and ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` raising ``Submitted``. What shellseam adds: the
process group is torn down on timeout and after the shell exits, credentials matching the scrub
patterns do not reach the command, output is bounded (a truncated output ends with the marker
naming its spill file), and ``sandbox`` confines commands with Landlock.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
from dataclasses import replace
from typing import Any

from minisweagent.environments.local import LocalEnvironment
from pydantic import BaseModel

from ..executor import ShellExecutor
from ..local import LocalShellExecutor
from ..render import join_parts, parse_exit_status, render_result
from ..sandbox import SandboxShellExecutor
from ..types import SandboxMode, ShellExecRequest, ShellRunResult

# mini-swe-agent sees one stream (LocalEnvironment spawns with stderr=STDOUT). Redirecting
# inside the shell keeps the interleaving exact; the newline matters, because bash parses a
# -c string command by command, so even a syntax error in the action lands on stdout.
_MERGE_STDERR = "exec 2>&1\n"

# mini-swe-agent's timeout is the authority and LocalEnvironment caps nothing, so the
# executor's own cap is lifted to a day.
_MAX_TIMEOUT_MS = 24 * 3600 * 1000


class ShellseamEnvironmentConfig(BaseModel):
    """LocalEnvironment's fields (same names, defaults and meaning) plus shellseam's knobs."""

    cwd: str = ""
    env: dict[str, str] = {}
    timeout: int = 30
    """Seconds per action when ``execute`` is not given one."""
    sandbox: SandboxMode | None = None
    """Landlock mode for every action; None runs unconfined (LocalShellExecutor)."""
    max_output_bytes: int = 4 * 2**20
    """Output kept in memory per action; the rest is in a spill file named in the output.
    Generous on purpose: the submission sentinel must stay in a large final diff."""
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
        """Run ``action["command"]`` in a fresh ``bash -c`` and return mini-swe-agent's dict."""
        command = action.get("command", "")
        cwd = cwd or self.config.cwd or os.getcwd()
        timeout_s = timeout or self.config.timeout
        try:
            output = self._run(command, cwd, timeout_s)
        except Exception as e:
            # The same shape LocalEnvironment gives any failure (spawn errors, timeouts), so
            # observation templates and trajectory tooling see no difference.
            raw_output = getattr(e, "output", None)
            output = {
                "output": raw_output if isinstance(raw_output, str) else "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        self._check_finished(output)
        return output

    def _run(self, command: str, cwd: str, timeout_s: float) -> dict[str, Any]:
        spec = self._executor.resolve(
            ShellExecRequest(
                command=_MERGE_STDERR + command,
                workdir=cwd,
                timeout_ms=math.ceil(timeout_s * 1000),
                env=self.config.env,
            )
        )
        result = self._executor.run_sync(spec)
        text = _output_text(result)
        if result.timed_out:
            # LocalEnvironment reports a timeout as this exception (message included); the
            # process group is already gone, reaped by the executor.
            raise subprocess.TimeoutExpired(command, timeout_s, output=text)
        return {"output": text, "returncode": _returncode(result), "exception_info": ""}


def _build_executor(config: ShellseamEnvironmentConfig) -> ShellExecutor:
    cwd = config.cwd or os.getcwd()
    if config.sandbox is None:
        return LocalShellExecutor(
            cwd=cwd,
            max_timeout_ms=_MAX_TIMEOUT_MS,
            max_output_bytes=config.max_output_bytes,
            grace_ms=config.grace_ms,
        )
    return SandboxShellExecutor(
        mode=config.sandbox,
        cwd=cwd,
        max_timeout_ms=_MAX_TIMEOUT_MS,
        max_output_bytes=config.max_output_bytes,
        grace_ms=config.grace_ms,
    )


def _output_text(result: ShellRunResult) -> str:
    """The output verbatim, then shellseam's markers; no exit-status marker, no placeholder.

    The status travels in ``returncode``; the other markers (truncation with its spill path,
    stopped leftover processes, timeout) are facts the model needs and LocalEnvironment has no
    field for. They are rendered by the tool's renderer from the result with its texts blanked,
    so the strings have one home and the output itself keeps its exact bytes (a submitted diff
    keeps its final newline); silence stays "", not the tool's ``(no output)``.
    """
    blank = replace(
        result, stdout=replace(result.stdout, text=""), stderr=replace(result.stderr, text="")
    )
    body, _status = parse_exit_status(render_result(blank))
    markers = body.removeprefix("(no output)").removeprefix("\n")
    parts = [result.stdout.text]
    if result.stderr.text:
        # bash's own start-up warnings (a bad locale, say) precede the redirection.
        parts += ["[stderr]", result.stderr.text]
    return join_parts([*parts, markers])


def _returncode(result: ShellRunResult) -> int:
    """Popen's convention: the exit code, or minus the signal number that killed the shell."""
    if result.exit_code is not None:
        return result.exit_code
    if result.signal is not None and result.signal in signal.Signals.__members__:
        return -signal.Signals[result.signal].value
    return -1
