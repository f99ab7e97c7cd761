"""Shared pieces of the containment tests: marker tokens, survivor scans, escaper forms."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time

MARK = "SHELLSEAM_CONTAIN_MARK"

#: Every way a command can leave its session or process group (SPEC §3 Containment).
PY = sys.executable
ESCAPERS: dict[str, str] = {
    "setsid": "setsid sleep 300 > /dev/null 2>&1 &",
    "setsid -f": "setsid -f sleep 300 > /dev/null 2>&1",
    "double-fork": (
        f"{PY} -c 'import os, sys\n"
        "if os.fork(): sys.exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): sys.exit(0)\n"
        'os.execvp("sleep", ["sleep", "300"])\' > /dev/null 2>&1'
    ),
    "set -m": "set -m; sleep 300 > /dev/null 2>&1 &",
    "setpgid": (
        f"{PY} -c 'import os; os.setpgid(0, 0); "
        'os.execvp("sleep", ["sleep", "300"])\' > /dev/null 2>&1 &'
    ),
    # A cgroup below the call's (any process may make one in a cgroup its user owns, as a
    # nested container runtime does), and a process moved into it. Found by attacking: it
    # was not in the call cgroup's own cgroup.procs, so never counted nor killed.
    "child cgroup": (
        "m=$(awk '$3==\"cgroup2\"{print $2; exit}' /proc/mounts); "
        'cg="$m$(sed -n "s/^0:://p" /proc/self/cgroup)"; mkdir "$cg/inner" && '
        'setsid -f sh -c \'echo $$ > "$1/inner/cgroup.procs" || exit; exec sleep 300\' sh "$cg" '
        "> /dev/null 2>&1"
    ),
}


#: Runs helpers/clone_parent.py: children made with clone(CLONE_PARENT), siblings of the
#: call's leader, i.e. children of the harness.
CLONE_PARENT = f"{PY} {os.path.join(os.path.dirname(__file__), 'helpers', 'clone_parent.py')}"
#: The raw clone syscall's number is known (helpers/clone_parent.py) on these machines only.
CLONE_MACHINES = ("x86_64", "aarch64")


def cloned(stdout: str) -> tuple[list[int], list[int]]:
    """(children that exited, lingerers) from clone_parent.py's output."""
    words = [line.split() for line in stdout.splitlines()]
    exited = [int(w[1]) for w in words if w and w[0] == "exited"]
    lingering = [int(w[1]) for w in words if w and w[0] == "lingerer"]
    return exited, lingering


def kill_and_reap(pids: list[int]) -> None:
    """Clean-up of clone_parent.py's children (ours, so ours to reap), whatever is left."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.waitpid(pid, os.WNOHANG)


#: Tokens this test process handed out: its clean-up kills only processes marked with one of
#: them, never those of another test run on the same machine.
_ISSUED: set[str] = set()


def new_token() -> str:
    token = secrets.token_hex(8)
    _ISSUED.add(token)
    return token


def marked_env(token: str) -> dict[str, str]:
    return {MARK: token}


def survivors(token: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``token``."""
    return _live_marked({token})


def any_marked() -> list[int]:
    """Every live process carrying a marker this test process handed out."""
    return _live_marked(_ISSUED)


def _live_marked(tokens: set[str]) -> list[int]:
    """Live processes whose environment carries one of ``tokens``. A process is live while
    any of its threads is: one whose main thread exited shows a zombie's state and no
    environment, but its other threads run on."""
    wanted = {f"{MARK}={token}".encode() for token in tokens}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{name}/task")
        except OSError:
            continue
        for tid in tids:
            task = f"/proc/{name}/task/{tid}"
            try:
                with open(f"{task}/stat") as f:
                    stat = f.read()
                if stat[stat.rfind(")") + 2] in "ZX":
                    continue
                with open(f"{task}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if not wanted.isdisjoint(environ.split(b"\0")):
                found.append(int(name))
            break
    return found


def kill_marked() -> None:
    for pid in any_marked():
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


def wait_gone(token: str, timeout: float = 3.0) -> list[int]:
    """Survivors after waiting up to ``timeout`` for them to vanish."""
    deadline = time.monotonic() + timeout
    while True:
        left = survivors(token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def new_cgroup_dirs(before: list[str], pid: int | None = None) -> list[str]:
    """Service cgroup parents that appeared since ``before`` (other services of this
    process, e.g. the default one, may legitimately hold theirs)."""
    return sorted(set(own_cgroup_dirs(pid)) - set(before))


def own_cgroup_dirs(pid: int | None = None) -> list[str]:
    """Service cgroup parents of ``pid`` (default: this process) under any hierarchy."""
    prefix = f"shellseam-{os.getpid() if pid is None else pid}-"
    found = []
    for root, dirs, _files in os.walk("/sys/fs/cgroup"):
        for d in dirs:
            if d.startswith(prefix):
                found.append(os.path.join(root, d))
        dirs[:] = [d for d in dirs if not d.startswith("shellseam-")]
    return found
