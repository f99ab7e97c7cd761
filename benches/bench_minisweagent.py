"""Per-command cost of ShellseamEnvironment.execute against mini-swe-agent's LocalEnvironment.

Both environments run the same action with the same contract (merged output, returncode),
so the difference is what each process layer costs per call: ``true`` shows the fixed
overhead, ``seq 1 100000`` (~589 KB of output) adds the cost of draining and decoding it.
Repetitions are interleaved (local, shellseam, local, ...) so drift in machine load hits both
sides alike; medians are reported, and a ratio above 1 means shellseam is slower. Both sides
run the same shell, ``/bin/sh -c`` (dash on Debian-likes), ShellseamEnvironment's default;
a third row per command shows ``shell="bash"``, whose start-up costs about 0.5 ms more.

Run: ``python benches/bench_minisweagent.py [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# mini-swe-agent prints a banner on import unless told not to.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from minisweagent.environments.local import LocalEnvironment

from shellseam.integrations.minisweagent import ShellseamEnvironment

COMMANDS = ("true", "seq 1 100000")


def _time_ms(execute: Callable[[], dict[str, Any]]) -> float:
    started = time.perf_counter()
    result = execute()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if result["returncode"] != 0:
        raise RuntimeError(f"benchmark action failed: {result}")
    return elapsed_ms


def _measure(command: str, repetitions: int) -> list[dict[str, Any]]:
    action = {"command": command}
    # The shellseam side must not truncate: both sides return the full output.
    envs: dict[str, Any] = {
        "local": LocalEnvironment(),
        "sh": ShellseamEnvironment(max_output_bytes=8 * 2**20),
        "bash": ShellseamEnvironment(max_output_bytes=8 * 2**20, shell="bash"),
    }
    samples: dict[str, list[float]] = {name: [] for name in envs}
    for env in envs.values():  # warm-up: imports, the native supervisor, page cache
        env.execute(action)
    for _ in range(repetitions):
        for name, env in envs.items():
            samples[name].append(_time_ms(functools.partial(env.execute, action)))
    local_ms = statistics.median(samples["local"])
    rows = []
    for shell in ("sh", "bash"):
        ours_ms = statistics.median(samples[shell])
        # Field names follow shellseam._bench.Row, so `shellseam bench` can fold these rows in.
        rows.append(
            {
                "bench": "minisweagent",
                "metric": f"execute {command!r} (shell={shell})",
                "ours": ours_ms,
                "peer": local_ms,
                "unit": "ms",
                "value": ours_ms / local_ms,
                "value_unit": "x",
                "note": f"peer: LocalEnvironment (/bin/sh -c); median of {repetitions}",
            }
        )
    return rows


def main(quick: bool) -> list[dict[str, Any]]:
    """Measure every command, print the ratio table, and return its rows."""
    repetitions = {"true": 30, "seq 1 100000": 10} if quick else {"true": 300, "seq 1 100000": 60}
    rows = [row for command in COMMANDS for row in _measure(command, repetitions[command])]
    print(f"{'minisweagent execute':<40} {'shellseam ms':>12} {'local ms':>10} {'ratio':>7}")
    for row in rows:
        print(
            f"{row['metric']:<40} {row['ours']:>12.3f} {row['peer']:>10.3f} {row['value']:>6.2f}x"
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    main(quick=parser.parse_args().quick)
