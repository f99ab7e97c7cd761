"""Submission decisions on truncated outputs: the spill file decides, as the whole output would.

When stdout outgrew the memory budget, ShellseamEnvironment reads the head of the spill file
(the complete stream) to decide whether the action submits, and the whole file only when it
does. The property: for any output, truncated anywhere, with the head read in chunks of any
size, the decision and the submitted text are what ``LocalEnvironment`` gives for the whole
output. The streams are fabricated (a scripted executor), the spill files real.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip(
    "minisweagent", reason="mini-swe-agent is not installed (pip install 'shellseam[minisweagent]')"
)

from minisweagent.environments.local import LocalEnvironment
from minisweagent.exceptions import Submitted

from fakes import FakeExecutor, collected, run_result
from shellseam.integrations import minisweagent as adapter
from shellseam.integrations.minisweagent import ShellseamEnvironment

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

line_st = st.sampled_from(
    [SENTINEL, f"  {SENTINEL} ", SENTINEL + "x", "patch line", "", " ", "é✓", "\t"]
)
ending_st = st.sampled_from(["\n", "\r\n", "\r", ""])


@st.composite
def outputs(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(st.tuples(line_st, ending_st), max_size=8))
    text = "".join(line + end for line, end in lines)
    data = text.encode()
    if draw(st.booleans()):
        data += b"\xff\xfe"  # not UTF-8: replaced, as LocalEnvironment decodes it
    return data


def _decide(env: Any, **kw: Any) -> tuple[str, Any]:
    try:
        result = env.execute({"command": "the action"}, **kw)
    except Submitted as submitted:
        (message,) = submitted.messages
        return "submitted", message["extra"]["submission"]
    return "observation", result["returncode"]


def _local_decision(data: bytes, returncode: int) -> tuple[str, Any]:
    # LocalEnvironment's own check, on the whole output as Popen's text mode reads it.
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    output = {"output": text, "returncode": returncode, "exception_info": ""}
    try:
        LocalEnvironment()._check_finished(output)
    except Submitted as submitted:
        (message,) = submitted.messages
        return "submitted", message["extra"]["submission"]
    return "observation", returncode


@settings(max_examples=300, deadline=None)
@given(
    data=outputs(),
    kept=st.integers(0, 60),
    head_bytes=st.integers(1, 70),
    returncode=st.sampled_from([0, 1]),
    early=st.sampled_from(["", " \n", "sh: warning\n"]),
)
def test_truncated_output_submits_exactly_as_the_whole_would(
    data: bytes, kept: int, head_bytes: int, returncode: int, early: str
) -> None:
    # ``early``: what the shell wrote to stderr before its redirect; it comes first.
    with tempfile.NamedTemporaryFile() as spill:
        spill.write(data)
        spill.flush()
        tail = data[len(data) - min(kept, len(data)) :].decode("utf-8", errors="replace")
        stdout = collected(
            tail, truncated=kept < len(data), spill_path=spill.name, total_bytes=len(data)
        )
        env = ShellseamEnvironment()
        result = run_result(stdout, early, exit_code=returncode)
        env._executor = FakeExecutor(result=result)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(adapter, "_SPILL_HEAD_BYTES", head_bytes)
            decision = _decide(env)
    assert decision == _local_decision(early.encode() + data, returncode)


def test_a_spill_file_that_vanished_is_not_a_submission(tmp_path: Any) -> None:
    stdout = collected("tail", truncated=True, spill_path=str(tmp_path / "gone"), total_bytes=10**6)
    env = ShellseamEnvironment()
    env._executor = FakeExecutor(result=run_result(stdout))
    assert _decide(env) == ("observation", 0)


def test_a_spill_path_that_became_a_symlink_is_not_followed(tmp_path: Any) -> None:
    planted = tmp_path / "planted"
    planted.write_text(f"{SENTINEL}\nnot what the action printed\n")
    link = tmp_path / "spill"
    link.symlink_to(planted)
    stdout = collected("tail", truncated=True, spill_path=str(link), total_bytes=10**6)
    env = ShellseamEnvironment()
    env._executor = FakeExecutor(result=run_result(stdout))
    assert _decide(env) == ("observation", 0)
