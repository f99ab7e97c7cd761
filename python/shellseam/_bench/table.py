"""The plain-text table: a header, benchmark headings, one fixed-width line per row (so rows
can be printed as their benchmark finishes), and the closing count of targets met.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence

import shellseam

from .harness import Row

HEADER = ("metric", "shellseam", "peer", "value", "target", "verdict")
#: Column widths; wide enough for every metric of the suite (a longer one just shifts).
WIDTHS = (55, 12, 12, 12, 13)


def _fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    if unit == "x":  # three digits: 1.083x must not print as a passing-looking 1.08x
        return f"{value:.3f}x"
    if unit in ("threads",):
        return f"{value:.0f} {unit}"
    digits = 3 if abs(value) < 10 else (1 if abs(value) < 1000 else 0)
    return f"{value:.{digits}f} {unit}"


def describe_machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.node()} · {os.cpu_count()} CPUs · load {load[0]:.2f} · "
        f"Linux {platform.release()} · Python {platform.python_version()} · "
        f"Landlock ABI {shellseam.landlock_abi()}"
    )


def _line(cols: Sequence[str]) -> str:
    first = cols[0].ljust(WIDTHS[0])
    rest = [c.rjust(w) for c, w in zip(cols[1:-1], WIDTHS[1:], strict=True)]
    return "  ".join([first, *rest, cols[-1]]).rstrip()


def format_header() -> str:
    """The column titles and a rule."""
    return _line(HEADER) + "\n" + "-" * (sum(WIDTHS) + 2 * len(WIDTHS) + 7)


def format_row(row: Row) -> str:
    """One metric's line."""
    verdict = row.verdict if not row.note else f"{row.verdict}  ({row.note})"
    return _line(
        (
            "  " + row.metric,
            _fmt(row.ours, row.unit),
            _fmt(row.peer, row.unit),
            _fmt(row.value, row.value_unit),
            row.target,
            verdict,
        )
    )


def format_rows(rows: Sequence[Row], *, after: str | None = None) -> str:
    """Lines for ``rows``, with a heading whenever the benchmark changes (``after``: the
    benchmark of the line printed before them, whose heading is not repeated)."""
    out: list[str] = []
    bench = after
    for row in rows:
        if row.bench != bench:
            bench = row.bench
            out.append(bench)
        out.append(format_row(row))
    return "\n".join(out)


def format_summary(rows: Sequence[Row]) -> str:
    missed = sum(r.verdict == "MISS" for r in rows)
    judged = sum(r.verdict in ("PASS", "MISS") for r in rows)
    return f"{judged - missed}/{judged} targets met; ratios are shellseam / peer (medians)."


def format_table(rows: Sequence[Row]) -> str:
    """The whole table at once."""
    return "\n".join([format_header(), format_rows(rows), "", format_summary(rows)])
