"""A forked copy of the harness: threads of the parent may hold any lock when it forks.

The copy has only the forking thread, so a lock held by another thread at the fork is never
released there. The copy must refuse the parent's service at once, without waiting on such a
lock, and its own fresh service must work with executors made before the fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from shellseam import (
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
)
from shellseam import sandbox as sandbox_module
from shellseam.errors import SPAWN_FAILED


def in_a_fork(body: Callable[[], int], within: float = 30.0) -> int | None:
    """``body``'s exit code in a forked copy; None when the copy hung (then killed)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


@contextlib.contextmanager
def held_by_another_thread(
    locks: list[contextlib.AbstractContextManager[object]],
) -> Iterator[None]:
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            holding.set()
            release.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        release.set()
        thread.join()


def child_pids() -> list[int]:
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids += [int(p) for p in f.read().split()]
    return pids


def test_a_forked_copy_refuses_the_parents_service_though_its_locks_were_held(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    svc = SubprocessService()
    read_only = SandboxShellExecutor(mode="read-only", service=svc, cwd=str(workspace))
    writable = SandboxShellExecutor(mode="workspace-write", service=svc, cwd=str(workspace))
    # Bound to the default service, which the copy makes afresh.
    default = SandboxShellExecutor(mode="workspace-write", cwd=str(workspace))
    executors = (read_only, writable, default)
    try:
        for ex in executors:
            assert ex.run_sync(ex.resolve(ShellExecRequest(command="true"))).exit_code == 0
        locks: list[contextlib.AbstractContextManager[object]] = [
            sandbox_module._WRITABLE_LOCK,
            sandbox_module._ServiceCache._lock,
            svc._lock,
        ]
        for ex in executors:
            locks += [ex._pins._lock, ex._rulesets_lock]

        def copy() -> int:
            spec = ShellExecRequest(command="echo parent")
            for ex in (read_only, writable):
                for attempt in ("sync", "async"):
                    try:
                        if attempt == "sync":
                            ex.run_sync(ex.resolve(spec))
                        else:
                            asyncio.run(ex.run(ex.resolve(spec)))
                        return 1
                    except ShellError as err:
                        if err.code != SPAWN_FAILED or "forked child" not in err.reason:
                            return 2
            if child_pids():  # no command, and no keeper started for the parent's service
                return 3
            svc.dispose()
            r = default.run_sync(default.resolve(ShellExecRequest(command="echo copy")))
            return 0 if r.stdout.text == "copy\n" and r.exit_code == 0 else 4

        with held_by_another_thread(locks):
            code = in_a_fork(copy)
        assert code == 0, "hung on a lock held at the fork" if code is None else code
        # The parent's service is untouched by the copy.
        r = writable.run_sync(writable.resolve(ShellExecRequest(command="echo still")))
        assert r.stdout.text == "still\n"
    finally:
        svc.dispose()
