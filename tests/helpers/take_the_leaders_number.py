"""An escapee that hands its call's leader pid to the next process the harness starts.

Usage: take_the_leaders_number.py LEADER READY [GO]

Runs in a session of its own (``setsid``). It brings the pid allocator round to just before
the leader's number with forks that fail in a pid namespace whose init died (they take a
number and give it back, and no privilege is needed) and creates READY: once the leader's
number is free, the next process created on the machine gets it.

With GO, it holds the call's stdout and stderr, and starts once the leader is gone (reaped by
somebody else: a harness's stray ``waitpid(-1)``); after READY it waits for GO (the harness
started its next process meanwhile), closes the call's pipes so that the call settles, and
sleeps on in the call's cgroup, if it has one, so that the call finds something left to
signal. Without GO it laps while the leader still holds its number, and exits.
"""

import os
import sys
import time

from pid_lap import lap  # beside this script, so on sys.path

leader, ready = int(sys.argv[1]), sys.argv[2]
go = sys.argv[3] if len(sys.argv) > 3 else None
deadline = time.monotonic() + 60
while go and os.path.exists(f"/proc/{leader}"):
    if time.monotonic() > deadline:
        sys.exit("the leader was never reaped")
    time.sleep(0.001)


def just_before(now: int) -> bool:
    """The next pid handed out is the leader's: every number in between is taken."""
    return now < leader and all(os.path.exists(f"/proc/{p}") for p in range(now + 1, leader))


lap(lambda now: leader - 64 < now < leader and just_before(now))
open(ready, "w").close()
if go is None:
    sys.exit(0)
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("never told to go")
    time.sleep(0.001)
os.close(1)
os.close(2)
time.sleep(30)
