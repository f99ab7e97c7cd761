"""The Ray rows of ``shellseam bench --ray`` (SPEC §9): ``RayShellExecutor`` against its
own yardsticks, on a local cluster of a head and two worker nodes (started here unless an
address is given).

- per-call overhead: ``bash -c true`` through the node service (on its channel, open by
  then), against an empty actor round trip plus a local ``run_sync`` (what the call cannot
  avoid), target <= 1.15x; with diagnostics: a protocol message without a command on the
  channel and as an actor call, a round trip carrying one argument (an async actor
  deserializes arguments on its event loop: one more thread hand-off than an empty call),
  and the same ``run_sync`` through actor calls only (the path without the channel);
- 64 in flight spread over the two worker nodes, against 64 local asyncio ``run`` calls:
  throughput, target >= 0.5x (one machine: this measures overhead, not scale);
- the spill read rate of ``read_spill`` over a large spill file (information).

Entry point for the bench CLI: ``run(quick, address=None, progress=None) -> list[Row]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..local import LocalShellExecutor
from ..service import SubprocessService
from ..types import ShellExecRequest
from .harness import (
    Row,
    info_row,
    interleaved,
    interleaved_async,
    median,
    ratio_row,
    timed,
)

MIB = 1 << 20


@contextmanager
def _cluster(address: str | None) -> Iterator[list[str]]:
    """Worker node ids of the cluster to measure on (a fresh local one by default)."""
    import ray

    if address is not None or ray.is_initialized():
        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=False)
        from ..ray.executor import alive_nodes

        alive = alive_nodes()
        yield alive[-2:]
        return
    from ray.cluster_utils import Cluster

    made = ensure_ray_temp_root()
    try:
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
        )
        try:
            workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
            ray.init(address=cluster.address, log_to_driver=False)
            yield [w.node_id for w in workers]
        finally:
            ray.shutdown()
            shutdown: Callable[[], None] = cluster.shutdown  # untyped in Ray
            shutdown()
    finally:
        if made:
            release_ray_temp_root(made)


def ensure_ray_temp_root() -> str | None:
    """Creates Ray's default temp root (``/tmp/ray``) when it does not exist yet, and returns
    it then (None: it was there). A ``ray.cluster_utils.Cluster`` records the newest cluster's
    address in it even when its nodes get another ``temp_dir``, and fails with
    ``FileNotFoundError`` on a machine that never ran Ray. Undo with
    ``release_ray_temp_root``."""
    try:
        from ray._common.utils import get_default_ray_temp_dir

        root: str = get_default_ray_temp_dir()  # type: ignore[no-untyped-call]
    except ImportError:  # another Ray release: its default
        root = os.path.join(tempfile.gettempdir(), "ray")
    try:
        os.makedirs(root)
    except FileExistsError:
        return None
    return root


def release_ray_temp_root(root: str) -> None:
    """Removes what a cluster of ours left in a temp root we made (its address file), and the
    folder when nothing else (another Ray on this machine) has put anything there since."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(root, "ray_current_cluster"))
    with contextlib.suppress(OSError):
        os.rmdir(root)


def run(
    quick: bool,
    *,
    address: str | None = None,
    progress: Callable[[str], None] | None = None,
    tiny: bool = False,
) -> list[Row]:
    """Measures the Ray rows (interleaved, medians) and returns them; ``tiny`` exercises
    every path in seconds (the smoke test's)."""
    import ray

    from ..ray import RayShellExecutor
    from ..ray import node as ray_node
    from ..ray.channel import ChannelTransport
    from ..ray.client import RemoteShellExecutor
    from ..ray.executor import RayTransport
    from ..ray.link import NodeLink
    from ..ray.protocol import Heartbeat

    sequential_reps = 5 if tiny else 200 if quick else 500
    inflight_rounds = 1 if tiny else 8 if quick else 20
    spill_bytes = (2 if tiny else 64) * MIB  # the default max_spill_bytes
    say = progress or (lambda _m: None)
    rows: list[Row] = []
    with _cluster(address) as workers:
        cwd = tempfile.gettempdir()
        remote = [RayShellExecutor(node_id=n, cwd=cwd) for n in workers]
        service = SubprocessService()
        local = LocalShellExecutor(cwd=cwd, service=service)
        try:
            true_remote = remote[0].resolve(ShellExecRequest(command="true"))
            true_local = local.resolve(ShellExecRequest(command="true"))
            actor = ray_node.get_or_create(remote[0].node_id)

            # A protocol message without a command: what the call costs beyond the bare
            # round trip before any process is spawned (diagnostic).
            beat = Heartbeat(remote[0].link.client_id)
            heartbeat = pickle.dumps(("heartbeat", beat))
            # The same calls through actor calls only: the path without the channel.
            actor_link = NodeLink(remote[0].node_id, lambda: RayTransport(actor))
            actor_only = RemoteShellExecutor(actor_link, mode=None, cwd=cwd)
            true_actor_only = actor_only.resolve(ShellExecRequest(command="true"))
            # Measure the steady state: the channel opens beside the first call.
            remote[0].run_sync(true_remote)
            transport = remote[0].link.transport()
            until = time.monotonic() + 10
            while not (isinstance(transport, ChannelTransport) and transport.channel_open):
                if time.monotonic() > until:
                    raise RuntimeError("the node service's channel did not open")
                time.sleep(0.01)

            say("ray: sequential `bash -c true` ...")
            samples = interleaved(
                {
                    "ray": timed(lambda: remote[0].run_sync(true_remote)),
                    "rtt": timed(lambda: ray.get(actor.ping.remote())),
                    # Any argument costs an async actor one more trip through its event
                    # loop: Ray deserializes arguments on the loop thread (ray#7799).
                    "one_arg": timed(lambda: ray.get(actor.ping.remote(None))),
                    "message": timed(lambda: ray.get(actor.call.remote(heartbeat))),
                    "channel": timed(lambda: transport.submit("heartbeat", beat).result(10)),
                    "actor_only": timed(lambda: actor_only.run_sync(true_actor_only)),
                    "local": timed(lambda: local.run_sync(true_local)),
                },
                sequential_reps,
            )
            actor_link.close()
            ours = median(samples["ray"]) * 1e3
            rtt = median(samples["rtt"]) * 1e3
            message = median(samples["message"]) * 1e3
            on_channel = median(samples["channel"]) * 1e3
            through_actor = median(samples["actor_only"]) * 1e3
            one_arg = median(samples["one_arg"]) * 1e3
            here = median(samples["local"]) * 1e3
            name = "R1 `bash -c true` through RayShellExecutor"
            rows.append(
                ratio_row(
                    name,
                    "run_sync vs empty actor round trip + local run_sync",
                    ours,
                    rtt + here,
                    "ms",
                    1.15,
                    note=f"round trip {rtt:.2f} ms, local {here:.2f} ms",
                )
            )
            # (what, ours, peer, note) of each diagnostic.
            diagnostics = (
                ("protocol message on the channel vs empty actor call", on_channel, rtt, ""),
                (
                    "run_sync through actor calls only vs the same",
                    through_actor,
                    rtt + here,
                    "the path without the channel",
                ),
                (
                    "one-argument round trip vs empty",
                    one_arg,
                    rtt,
                    "the floor of any message to an async actor",
                ),
                ("protocol message as an actor call vs empty", message, rtt, ""),
                ("run_sync vs one-argument round trip + local run_sync", ours, one_arg + here, ""),
            )
            rows.extend(
                ratio_row(name, f"{what} (diagnostic)", value, peer, "ms", None, note=note)
                for what, value, peer, note in diagnostics
            )

            say("ray: 64 in flight ...")
            n = 64
            echo = [ex.resolve(ShellExecRequest(command="echo hi")) for ex in remote]
            echo_local = local.resolve(ShellExecRequest(command="echo hi"))

            async def spread() -> float:
                started = time.perf_counter()
                await asyncio.gather(
                    *(remote[i % len(remote)].run(echo[i % len(remote)]) for i in range(n))
                )
                return time.perf_counter() - started

            async def here_async() -> float:
                started = time.perf_counter()
                await asyncio.gather(*(local.run(echo_local) for _ in range(n)))
                return time.perf_counter() - started

            flight = asyncio.run(
                interleaved_async({"ray": spread, "local": here_async}, inflight_rounds)
            )
            rows.append(
                ratio_row(
                    f"R2 {n} in flight over {len(remote)} nodes (`echo hi`)",
                    "throughput vs local asyncio run",
                    n / median(flight["ray"]),
                    n / median(flight["local"]),
                    "cmd/s",
                    0.5,
                    higher_is_better=True,
                )
            )

            say("ray: spill read rate ...")
            big = remote[0].run_sync(
                remote[0].resolve(
                    ShellExecRequest(
                        command=f"head -c {spill_bytes} /dev/zero", stdout_max_bytes=1000
                    )
                )
            )
            path = big.stdout.spill_path
            if path is None:
                raise RuntimeError("the benchmark command did not spill")
            reads = []
            for _ in range(3):
                started = time.perf_counter()
                data = remote[0].read_spill(path)
                reads.append(time.perf_counter() - started)
                if len(data) != spill_bytes:
                    raise RuntimeError(f"read {len(data)} of {spill_bytes} spill bytes")
                del data
            rows.append(
                info_row(
                    f"R3 read_spill of a {spill_bytes // MIB} MiB spill file",
                    "read rate",
                    spill_bytes / MIB / median(reads),
                    "MiB/s",
                )
            )
        finally:
            service.dispose()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shellseam._bench.ray [--quick] [--ray-address ADDR]``."""
    from .table import format_table

    parser = argparse.ArgumentParser(prog="shellseam bench --ray")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ray-address", default=None)
    args = parser.parse_args(argv)
    rows = run(args.quick, address=args.ray_address, progress=lambda m: print(m, file=sys.stderr))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
