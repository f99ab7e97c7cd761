"""The drain floor (``_core.bench_minimal_reader``) the benchmark shows beside shellseam.

A diagnostic, not a product feature: it must drain a child's stdout completely, report a
wall time, and refuse bad input with a clear error instead of a panic.
"""

from __future__ import annotations

import math
import pathlib
import stat

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


def test_writes_the_head_of_the_stream_to_a_new_spill_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "spill"
    seconds = _core.bench_minimal_reader(
        ["seq", "1", "200000"], 4096, 64, spill_path=path, spill_bytes=5000
    )
    whole = "".join(f"{i}\n" for i in range(1, 200_001)).encode()
    assert math.isfinite(seconds) and path.read_bytes() == whole[:5000]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_existing_spill_file_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "spill"
    path.write_bytes(b"kept")
    with pytest.raises(FileExistsError):
        _core.bench_minimal_reader(["true"], spill_path=path)
    assert path.read_bytes() == b"kept"


def test_a_spawn_that_fails_leaves_no_spill_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "spill"
    with pytest.raises(OSError):
        _core.bench_minimal_reader(["/nonexistent/shellseam-floor"], spill_path=path)
    assert not path.exists()
