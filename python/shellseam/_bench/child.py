"""Measurements that need a pristine process (peak RSS, a parent holding GiBs) run in a
fresh interpreter, ``python -m shellseam._bench --child KIND ARGS``, that prints JSON.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import shellseam
from shellseam import (
    LocalShellExecutor,
    ShellExecRequest,
)

from .harness import (
    BASH,
    TRUE_ARGV,
    Harness,
    checked,
    interleaved,
    spawn_wait,
    timed,
)

# -- child processes ------------------------------------------------------------------------


def _child_argv(kind: str, args: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(shellseam.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return [sys.executable, "-m", "shellseam._bench", "--child", kind, json.dumps(args)], env


def run_child(kind: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Runs one measurement in a fresh interpreter and returns its JSON report."""
    argv, env = _child_argv(kind, args)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench child {kind} failed ({proc.returncode}): {proc.stderr}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


class ChildServer:
    """A fresh interpreter that answers JSON requests, one line each, until stdin closes."""

    def __init__(self, kind: str, args: Mapping[str, Any]) -> None:
        argv, env = _child_argv(kind, args)
        self._proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._kind = kind
        self._reply()  # the child says it is ready once set up (memory touched, warmed up)

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench child {self._kind} exited ({self._proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def __enter__(self) -> ChildServer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _child_rss(args: Mapping[str, Any]) -> dict[str, Any]:
    """Peak RSS growth of this (fresh) process while ``bytes`` flow through a run."""
    size = int(args["bytes"])
    ex = LocalShellExecutor()
    checked(ex.run_sync(ex.resolve(ShellExecRequest(command="true"))))  # supervisor up
    spec = ex.resolve(ShellExecRequest(command=f"head -c {size} /dev/zero"))
    gc.collect()
    try:
        # Writing 5 resets VmHWM to the current RSS, so the peak seen after is this run's.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        how = "VmHWM after reset - VmRSS before"
    except OSError:
        how = "VmHWM after - VmRSS before"
    before = _proc_status_kib("VmRSS")
    if args["via"] == "shellseam":
        checked(ex.run_sync(spec), size)
    else:
        out = subprocess.run(
            ["head", "-c", str(size), "/dev/zero"], capture_output=True, check=True
        ).stdout
        if len(out) != size:
            raise RuntimeError("short read")
        del out
    after = _proc_status_kib("VmHWM")
    return {"growth_kib": max(0, after - before), "how": how}


def _touch(size: int) -> bytearray:
    """A heap of ``size`` bytes with every page written (resident, not just reserved)."""
    heap = bytearray(size)
    page = os.sysconf("SC_PAGE_SIZE")
    heap[::page] = b"\x01" * len(range(0, size, page))
    return heap


def _fork_exec(env: Mapping[bytes, bytes]) -> int:
    """The spawn shellseam refuses to do: ``fork`` copies the parent's page tables."""
    envp = [k + b"=" + v for k, v in env.items()]
    with warnings.catch_warnings():  # 3.12+ warns about forking a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        try:
            os.execve(BASH, TRUE_ARGV, envp)  # type: ignore[arg-type]
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _child_spawn(args: Mapping[str, Any]) -> dict[str, Any]:
    """Serves batches of spawn latencies from a process that touched ``touch`` bytes."""
    heap = _touch(int(args["touch"]))
    h = Harness()
    spec = h.spec("true")
    contenders: dict[str, Callable[[], float]] = {
        "shellseam": timed(lambda: checked(h.local.run_sync(spec))),
        "subprocess": timed(
            lambda: subprocess.run(TRUE_ARGV, env=h.env, capture_output=True, check=True)
        ),
        "floor": timed(lambda: spawn_wait(BASH, TRUE_ARGV, h.env)),
    }
    fork = {"fork": timed(lambda: _fork_exec(h.env))}
    try:
        for fn in contenders.values():
            fn()
        print(json.dumps({"ready": True, "rss_kib": _proc_status_kib("VmRSS")}), flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            samples = interleaved(contenders, int(request["reps"]), warm_up=False)
            samples.update(interleaved(fork, int(request["fork_reps"]), warm_up=False))
            print(json.dumps(samples), flush=True)
    finally:
        h.close()
    del heap
    return {"done": True}


CHILDREN: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "rss": _child_rss,
    "spawn": _child_spawn,
}
