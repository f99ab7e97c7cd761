"""``render_markers``: the markers of a foreground rendering without its output text.

Front ends that show the output themselves (the mini-swe-agent adapter, the CLI's
``--stream``) print these instead of rendering and then stripping the output. The property
test pins the one relation that matters: the markers are exactly what ``render_result``
puts after the output, so the two can never drift apart.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import shellseam
from fakes import collected as out
from fakes import run_result as result
from shellseam.render import join_parts, render_markers, render_result
from shellseam.types import CollectedOutput, ShellRunResult, ShellSandboxInfo


def test_exported_from_the_package() -> None:
    assert shellseam.render_markers is render_markers
    assert "render_markers" in shellseam.__all__


def test_clean_run_is_only_the_status_line() -> None:
    assert render_markers(result("out\n", "err\n", 2)) == "[exit code: 2]"
    assert render_markers(result("x", exit_code=None, signal="SIGKILL")) == (
        "[killed by signal: SIGKILL]"
    )
    assert render_markers(result("out\n"), status=False) == ""


def test_no_output_placeholder_is_not_a_marker() -> None:
    assert render_result(result()) == "(no output)\n[exit code: 0]"
    assert render_markers(result()) == "[exit code: 0]"


def test_never_spawned_run_has_no_markers() -> None:
    assert render_markers(result(exit_code=None, aborted=True)) == ""


def test_every_marker_in_order(tmp_path: Path) -> None:
    capped = tmp_path / "capped"
    capped.write_bytes(b"x" * 100)
    r = result(
        out("tail-out", truncated=True, spill_path="/s/out"),
        out("tail-err", truncated=True, spill_path=str(capped), spill_truncated=True),
        exit_code=1,
        sandbox=ShellSandboxInfo(mode="workspace-write", denied=True, enforcement="full"),
        timed_out=True,
        timeout_ms=1500,
        leftover_killed=1,
    )
    markers = (
        "[output truncated; full output: /s/out]\n"
        f"[output truncated; first 100 bytes saved: {capped}]\n"
        "[sandbox: file access denied under workspace-write mode]\n"
        "[timed out after 1500ms]\n"
        "[stopped 1 leftover background process]"
    )
    assert render_markers(r, status=False) == markers
    assert render_markers(r) == markers + "\n[exit code: 1]"
    assert render_result(r) == "tail-out\n[stderr]\ntail-err\n" + markers + "\n[exit code: 1]"


text_st = st.sampled_from(["", "a", "a\n", "x\ny", "\n"])


@st.composite
def streams(draw: st.DrawFn) -> CollectedOutput:
    text = draw(text_st)
    truncated = draw(st.booleans())
    return out(
        text,
        truncated=truncated,
        spill_path=draw(st.sampled_from([None, "/spill/f"])) if truncated else None,
    )


@st.composite
def results(draw: st.DrawFn) -> ShellRunResult:
    signal = draw(st.sampled_from([None, "SIGTERM"]))
    return result(
        draw(streams()),
        draw(streams()),
        exit_code=None if signal else draw(st.sampled_from([None, 0, 3])),
        signal=signal,
        timed_out=draw(st.booleans()),
        timeout_ms=draw(st.integers(1, 10**6)),
        leftover_killed=draw(st.integers(0, 3)),
        sandbox=draw(
            st.sampled_from(
                [None, ShellSandboxInfo(mode="read-only", denied=True, enforcement="full")]
            )
        ),
    )


@given(r=results())
def test_markers_are_exactly_what_follows_the_output(r: ShellRunResult) -> None:
    body = [r.stdout.text]
    if r.stderr.text:
        body += ["[stderr]", r.stderr.text]
    if not r.stdout.text and not r.stderr.text:
        body.append("(no output)")
    assert render_result(r) == join_parts([*body, render_markers(r)])
    without_status = render_markers(r, status=False)
    assert not without_status.endswith("\n")
    assert "[exit code" not in without_status and "[killed by signal" not in without_status
    status = ""
    if r.signal is not None:
        status = f"[killed by signal: {r.signal}]"
    elif r.exit_code is not None:
        status = f"[exit code: {r.exit_code}]"
    assert render_markers(r) == join_parts([without_status, status])
