"""Two builds of shellseam side by side: rows 1 and 6 of the bench, interleaved by batch.

A change worth 10 us per call is below what one table run resolves on a noisy machine (rows
1 and 6 move 1-3 % between runs). This keeps two worker processes alive, each importing one
build, and asks them in alternating order for batches of interleaved `posix_spawn` floor /
`run_sync` / sandboxed `run_sync` calls; each worker's ratios are against its own floor, and
the medians over the batches compare the builds.

    pip install --no-deps --target /tmp/old <wheel of the old build>
    pip install --no-deps --target /tmp/new <wheel of the new build>
    python benches/ab_builds.py /tmp/old /tmp/new [batches]

Prints, per build: row 1 (`run_sync` / floor), row 6 (sandboxed / local) and the sandbox's
extra microseconds, medians over the batches.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

BATCH = 60


def worker(site: str) -> None:
    """Serves batches on stdin/stdout with the build installed in ``site``."""
    sys.path.insert(0, site)
    import shellseam
    from shellseam import LocalShellExecutor, SandboxShellExecutor, ShellExecRequest
    from shellseam.service import SubprocessService

    if not shellseam.__file__ or not shellseam.__file__.startswith(site):
        raise SystemExit(f"{site}: imported {shellseam.__file__} instead")
    service = SubprocessService()
    local = LocalShellExecutor(cwd="/tmp", service=service)
    sandboxed = SandboxShellExecutor(mode="workspace-write", cwd="/tmp", service=service)
    local_spec = local.resolve(ShellExecRequest(command="true"))
    sandbox_spec = sandboxed.resolve(ShellExecRequest(command="true"))
    env = dict(local.child_env(local_spec))

    def floor() -> None:
        pid = os.posix_spawn("/bin/bash", ["bash", "-c", "true"], env)
        os.waitpid(pid, 0)

    calls: dict[str, Callable[[], object]] = {
        "floor": floor,
        "local": lambda: local.run_sync(local_spec),
        "sandbox": lambda: sandboxed.run_sync(sandbox_spec),
    }
    for _ in range(50):  # page cache, the spawner thread, the ruleset cache
        for call in calls.values():
            call()
    for _ in sys.stdin:
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(BATCH):
            for name, call in calls.items():
                started = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - started)
        m = {name: statistics.median(values) for name, values in samples.items()}
        row = {
            "row1": m["local"] / m["floor"],
            "row6": m["sandbox"] / m["local"],
            "sandbox_extra_us": (m["sandbox"] - m["local"]) * 1e6,
        }
        print(json.dumps(row), flush=True)


def main(old: str, new: str, batches: int) -> None:
    workers = {
        name: subprocess.Popen(
            [sys.executable, __file__, "--worker", site],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, site in (("old", old), ("new", new))
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in workers}
    try:
        for i in range(batches):
            for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
                proc = workers[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                results[name].append(json.loads(proc.stdout.readline()))
    finally:
        for proc in workers.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
    for name, rows in results.items():
        medians = {key: round(statistics.median(r[key] for r in rows), 4) for key in rows[0]}
        print(name, medians)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2])
    elif len(sys.argv) in (3, 4):
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 40)
    else:
        raise SystemExit(__doc__)
