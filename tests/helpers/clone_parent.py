"""Helper program: makes children with clone(CLONE_PARENT), whose parent is therefore this
program's parent (the harness, for a call's leader), and prints their pids.

argv: <count> [linger | linger-setsid]. `count` children exit at once with status 7; with a
second argument one more stays (for 30 s), in this process group or in a session of its own.
A refused clone (a confined mode may forbid CLONE_PARENT) prints `refused <errno>`.
"""

import ctypes
import os
import signal
import sys
import time

CLONE_PARENT = 0x8000
SYS_CLONE = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)


def clone_parent() -> int:
    # flags first on both architectures; no new stack: the child runs on a copy of ours.
    pid = libc.syscall(SYS_CLONE, CLONE_PARENT | signal.SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        print("refused", ctypes.get_errno(), flush=True)
        sys.exit(0)
    return pid


for _ in range(int(sys.argv[1])):
    pid = clone_parent()
    if pid == 0:
        os._exit(7)
    print("exited", pid, flush=True)
if len(sys.argv) > 2:
    pid = clone_parent()
    if pid == 0:
        if sys.argv[2] == "linger-setsid":
            os.setsid()
        time.sleep(30)
        os._exit(0)
    print("lingerer", pid, flush=True)
