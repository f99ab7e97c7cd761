"""Helper program: prints what its memory cgroup already holds as it starts (bytes, -1 when
the cgroup's files are not visible here), then allocates and touches N MiB (argv[1])."""

import os
import sys

V2 = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"


def charge() -> int:
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            candidate = f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"
            break
    else:
        path = next(p for h, c, p in lines if h == "0")
        candidate = f"{V2}{path}/memory.current"
    try:
        with open(candidate) as f:
            return int(f.read())
    except OSError:
        return -1


print("charge", charge(), flush=True)
block = bytearray(int(sys.argv[1]) << 20)
block[::4096] = b"x" * len(block[::4096])
print("allocated", flush=True)
