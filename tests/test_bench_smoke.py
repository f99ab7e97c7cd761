"""The benchmark suite runs end to end on a tiny configuration and yields judged rows.

Benchmarks are not timed tests: this only checks that every benchmark (including the ones
measured in a fresh child interpreter) produces finite figures and a printable table, in
seconds. The real tables come from ``shellseam bench [--quick]``.
"""

from __future__ import annotations

import json
import math

import pytest

from shellseam import _bench as bench


@pytest.fixture(scope="module")
def rows() -> list[bench.Row]:
    return bench.run(False, config=bench.TINY)


def test_every_benchmark_yields_rows(rows: list[bench.Row]) -> None:
    prefixes = {row.bench.split()[0] for row in rows}
    assert prefixes == {str(i) for i in range(1, len(bench.BENCHES) + 1)}


def test_figures_are_finite_and_judged(rows: list[bench.Row]) -> None:
    for row in rows:
        assert row.verdict in ("PASS", "MISS", "info", "skip"), row
        if row.verdict == "skip":
            assert row.note, row
            continue
        assert row.value is not None and math.isfinite(row.value), row
        assert row.ours is not None and math.isfinite(row.ours) and row.ours >= 0, row
        if row.value_unit == "x":
            assert row.peer is not None and row.peer > 0, row
            assert row.value > 0, row
        if row.verdict in ("PASS", "MISS"):
            assert row.target != "-", row


def test_table_lists_every_row(rows: list[bench.Row]) -> None:
    table = bench.format_table(rows)
    for row in rows:
        assert row.metric in table
    assert "targets met" in table


def test_only_selects_and_rejects_unknown_names() -> None:
    rows = bench.run(False, config=bench.TINY, only=["sequential"])
    assert {row.bench for row in rows} == {rows[0].bench}
    with pytest.raises(ValueError, match="unknown"):
        bench.run(False, config=bench.TINY, only=["nope"])


def test_child_measurement_reports_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--child", "rss", json.dumps({"bytes": 1 << 20, "via": "shellseam"})]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["growth_kib"] >= 0


def test_rows_are_handed_over_as_each_benchmark_finishes() -> None:
    batches: list[list[bench.Row]] = []
    rows = bench.run(
        False, config=bench.TINY, only=["sequential", "sandbox"], on_rows=batches.append
    )
    assert [batch[0].bench.split()[0] for batch in batches] == ["1", "6"]
    assert [row for batch in batches for row in batch] == rows
