"""The one command line of the suite: ``shellseam bench``, ``benches/bench.py`` and
``python -m shellseam._bench`` all land here. Each benchmark's rows are printed as soon as it
finishes; a missed target is a row, never a nonzero exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

from .child import CHILDREN
from .harness import BENCHES, Row
from .suites import run
from .table import describe_machine, format_header, format_rows, format_summary


def main(argv: Sequence[str] | None = None) -> int:
    """``shellseam bench [--quick] [--only NAME ...] [--json]``; exits 0 even on a miss."""
    parser = argparse.ArgumentParser(
        prog="shellseam bench", description="shellseam side by side with its peers."
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument(
        "--only", action="extend", nargs="+", choices=BENCHES, help="run only these benchmarks"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON at the end")
    parser.add_argument("--ray", action="store_true", help="the Ray rows (shellseam[ray])")
    parser.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster for --ray")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ARGS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, raw = args.child
        print(json.dumps(CHILDREN[kind](json.loads(raw))))
        return 0
    started = time.perf_counter()

    def note(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.json:
        rows = run(args.quick, only=args.only, progress=note)
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    mode = "quick" if args.quick else "full"
    print(f"shellseam bench ({mode}) — {describe_machine()}")
    print(format_header(), flush=True)
    shown: list[Row] = []

    def show(new_rows: Sequence[Row]) -> None:
        after = shown[-1].bench if shown else None
        print(format_rows(new_rows, after=after), flush=True)
        shown.extend(new_rows)

    if args.ray or args.ray_address:
        from . import ray

        try:
            rows = ray.run(args.quick, address=args.ray_address, progress=note)
        except ImportError:
            print("shellseam: the Ray rows need Ray: pip install 'shellseam[ray]'", file=sys.stderr)
            return 2
        show(rows)
    else:
        rows = run(args.quick, only=args.only, progress=note, on_rows=show)
    print()
    print(format_summary(rows))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0
