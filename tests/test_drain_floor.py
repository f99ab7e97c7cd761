"""The drain floor (``_core.bench_minimal_reader``) the benchmark shows beside shellseam.

A diagnostic, not a product feature: it must drain a child's stdout completely, report a
wall time, and refuse bad input with a clear error instead of a panic.
"""

from __future__ import annotations

import math

import pytest

from shellseam import _core


def test_drains_a_stream_and_reports_seconds() -> None:
    seconds = _core.bench_minimal_reader(["head", "-c", "5000000", "/dev/zero"], 65536, 4096)
    assert math.isfinite(seconds) and seconds > 0


def test_waits_for_the_child_to_exit() -> None:
    # The pipe closes early (exec of sleep keeps it; `exec >&-` closes it) yet the call
    # returns only once the child is reaped.
    seconds = _core.bench_minimal_reader(["sh", "-c", "exec >&-; sleep 0.2"])
    assert seconds >= 0.2


def test_empty_argv_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="argv"):
        _core.bench_minimal_reader([])


def test_missing_program_is_an_os_error() -> None:
    with pytest.raises(OSError):
        _core.bench_minimal_reader(["/nonexistent/shellseam-floor"])
