"""Exact model-facing strings of ``shellseam.render`` and the parse/render round trip."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from fakes import collected as out
from fakes import run_result as result
from shellseam.render import (
    join_parts,
    parse_exit_status,
    render_background_started,
    render_lossy_markers,
    render_result,
    render_termination,
)
from shellseam.types import ShellRunResult, ShellSandboxInfo


def test_spec_examples() -> None:
    assert render_result(result("out\n", "err\n", 2)) == "out\n[stderr]\nerr\n[exit code: 2]"
    assert render_result(result()) == "(no output)\n[exit code: 0]"


def test_newline_inserted_only_where_missing() -> None:
    assert render_result(result("out", "err", 1)) == "out\n[stderr]\nerr\n[exit code: 1]"
    assert render_result(result("a\n\n")) == "a\n\n[exit code: 0]"
    assert render_result(result("", "only err")) == "[stderr]\nonly err\n[exit code: 0]"


def test_signal_marker_replaces_exit_code() -> None:
    r = result("partial", exit_code=None, signal="SIGKILL")
    assert render_result(r) == "partial\n[killed by signal: SIGKILL]"


def test_never_spawned_result_has_no_status_marker() -> None:
    r = result(exit_code=None, aborted=True)
    assert render_result(r) == "(no output)"
    assert parse_exit_status(render_result(r)) == ("(no output)", None)


def test_all_markers_in_order(tmp_path: Path) -> None:
    capped = tmp_path / "capped"
    capped.write_bytes(b"x" * 4096)
    r = result(
        out("tail-out\n", truncated=True, spill_path="/s/out"),
        out("tail-err\n", truncated=True, spill_path=str(capped), spill_truncated=True),
        exit_code=1,
        sandbox=ShellSandboxInfo(mode="read-only", denied=True, enforcement="full"),
        timed_out=True,
        timeout_ms=500,
        leftover_killed=3,
    )
    assert render_result(r) == (
        "tail-out\n"
        "[stderr]\n"
        "tail-err\n"
        "[output truncated; full output: /s/out]\n"
        f"[output truncated; first 4096 bytes saved: {capped}]\n"
        "[sandbox: file access denied under read-only mode]\n"
        "[timed out after 500ms]\n"
        "[stopped 3 leftover background processes]\n"
        "[exit code: 1]"
    )


def test_truncation_without_file_and_single_leftover() -> None:
    r = result(
        out("x", truncated=True, spill_path=None),
        leftover_killed=1,
        signal="SIGTERM",
        exit_code=None,
    )
    assert render_result(r) == (
        "x\n"
        "[output truncated; full output unavailable]\n"
        "[stopped 1 leftover background process]\n"
        "[killed by signal: SIGTERM]"
    )


def test_capped_spill_that_vanished_is_reported_unavailable(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    r = result(out("x", truncated=True, spill_path=str(gone), spill_truncated=True))
    assert render_result(r) == "x\n[output truncated; full output unavailable]\n[exit code: 0]"


def test_sandbox_not_denied_adds_nothing() -> None:
    r = result("ok", sandbox=ShellSandboxInfo(mode="workspace-write", denied=False))
    assert render_result(r) == "ok\n[exit code: 0]"


def test_parse_exit_status_cases() -> None:
    assert parse_exit_status("out\n[stderr]\nerr\n[exit code: 2]") == (
        "out\n[stderr]\nerr",
        {"exit_code": 2},
    )
    assert parse_exit_status("[exit code: 0]") == ("", {"exit_code": 0})
    assert parse_exit_status("a\n\n[killed by signal: SIGTERM]") == ("a\n", {"signal": "SIGTERM"})
    assert parse_exit_status("[exit code: -1]") == ("", {"exit_code": -1})
    assert parse_exit_status("started background task bash-1") == (
        "started background task bash-1",
        None,
    )
    assert parse_exit_status("x\n[exit code: 2] ") == ("x\n[exit code: 2] ", None)
    assert parse_exit_status("x\n[exit code: two]") == ("x\n[exit code: two]", None)
    assert parse_exit_status("[exit code: 1]\n") == ("[exit code: 1]\n", None)
    assert parse_exit_status("") == ("", None)


def test_marker_looking_output_line_is_kept_when_rendered() -> None:
    rendered = render_result(result("[exit code: 0]\n", exit_code=7))
    assert rendered == "[exit code: 0]\n[exit code: 7]"
    assert parse_exit_status(rendered) == ("[exit code: 0]", {"exit_code": 7})


def test_marker_looking_last_line_of_foreign_text_is_consumed() -> None:
    # The documented residue: text not produced by render_result whose own last line looks
    # like a marker loses that line to the status.
    assert parse_exit_status("log line\n[killed by signal: SIGHUP]") == (
        "log line",
        {"signal": "SIGHUP"},
    )


def test_background_strings() -> None:
    assert render_background_started("bash-3") == "started background task bash-3"
    assert render_termination(0, None) == "exit code: 0"
    assert render_termination(None, "SIGTERM") == "signal: SIGTERM"
    assert render_termination(None, None) == ""
    assert render_lossy_markers(False, "/a", "/b") == []
    assert render_lossy_markers(True, "/a", None) == [
        "[some output was dropped from memory; full output: /a]"
    ]
    assert render_lossy_markers(True, "/a", "/b") == [
        "[some output was dropped from memory; full output: /a]",
        "[some output was dropped from memory; full output: /b]",
    ]
    assert render_lossy_markers(True, None, None) == [
        "[some output was dropped from memory; full output unavailable]"
    ]
    # A spill file that stopped at its cap holds only the head; one already gone cannot be
    # offered at all.
    assert render_lossy_markers(True, "/nonexistent/spill", None, True) == [
        "[some output was dropped from memory; full output unavailable]"
    ]


def test_join_parts() -> None:
    assert join_parts(["a", "", "b\n", "c"]) == "a\nb\nc"
    assert join_parts(["a\n"]) == "a\n"
    assert join_parts([]) == ""


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
signal_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\n"), min_size=1, max_size=12
)


@st.composite
def run_results(draw: st.DrawFn) -> ShellRunResult:
    ending = draw(st.sampled_from(["exit", "signal", "unknown"]))
    return result(
        stdout=draw(texts),
        stderr=draw(texts),
        exit_code=draw(st.integers(-255, 255)) if ending == "exit" else None,
        signal=draw(signal_names) if ending == "signal" else None,
        exit_status_unknown=ending == "unknown",
        timed_out=draw(st.booleans()),
        timeout_ms=draw(st.integers(1, 10**9)),
        leftover_killed=draw(st.integers(0, 5)),
        sandbox=draw(
            st.none()
            | st.builds(
                ShellSandboxInfo,
                mode=st.sampled_from(["read-only", "workspace-write"]),
                denied=st.booleans(),
            )
        ),
    )


@given(run_results())
# Newline-only and all-whitespace streams, pinned: the output's own final newline is the line
# break before the marker, so the body ends without it (SPEC §5).
@example(result("\n"))
@example(result("a\n"))
@example(result("\n\n", exit_code=None, signal="SIGTERM"))
@example(result(" \n", exit_code=None, exit_status_unknown=True))
@example(result("", "\n"))
@example(result("\n", "\n", 1))
@example(result(" ", " \t"))
@example(result("\n", timed_out=True, timeout_ms=5))
def test_parse_inverts_render(r: ShellRunResult) -> None:
    rendered = render_result(r)
    body, status = parse_exit_status(rendered)
    if r.exit_status_unknown:
        assert status == {"unknown": True}
        marker = "[exit status unknown]"
    elif r.signal is not None:
        assert status == {"signal": r.signal}
        marker = f"[killed by signal: {r.signal}]"
    else:
        assert status == {"exit_code": r.exit_code}
        marker = f"[exit code: {r.exit_code}]"
    assert rendered.endswith(marker)
    assert body + "\n" + marker == rendered
    # Everything but the final marker survives, including every other marker: the body is
    # the status-free rendering less the line break before the marker. Output ending in a
    # newline is not followed by another (SPEC §5), so its own final newline is that break
    # ("a" and "a\n" render alike): the body keeps the stream up to that newline.
    unstated = replace(r, exit_code=None, signal=None, exit_status_unknown=False)
    assert body == render_result(unstated).removesuffix("\n")
    assert (body + "\n").startswith(r.stdout.text)
    if r.timed_out:
        assert f"[timed out after {r.timeout_ms}ms]" in body


@given(texts, st.one_of(st.none(), st.integers(-300, 300), signal_names))
def test_parse_consumes_only_a_final_marker(text: str, status: int | str | None) -> None:
    if status is None:
        body, parsed = parse_exit_status(text)
        if parsed is None:
            assert body == text
        return
    marker = (
        f"[exit code: {status}]" if isinstance(status, int) else f"[killed by signal: {status}]"
    )
    expected = {"exit_code": status} if isinstance(status, int) else {"signal": status}
    assert parse_exit_status(text + "\n" + marker) == (text, expected)
    assert parse_exit_status(marker) == ("", expected)


def test_an_exit_code_past_ints_digit_limit_is_not_a_marker() -> None:
    # Found by attacking: 5,000 digits raised ValueError (int's digit limit) out of
    # parse_exit_status, and so out of BashTool.present_result; replayed text must never raise.
    text = "x\n[exit code: 1" + "0" * 5000 + "]"
    assert parse_exit_status(text) == (text, None)
    longest = "x\n[exit code: " + "9" * 19 + "]"
    assert parse_exit_status(longest) == ("x", {"exit_code": 10**19 - 1})
