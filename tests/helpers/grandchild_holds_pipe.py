"""Helper program: forks a grandchild that keeps stdout open and sleeps, then exits at once.

Each line goes out in one write(2): under PYTHONUNBUFFERED print() writes the text and the
newline separately, and the two processes' lines could interleave.
"""

import os
import sys
import time

if os.fork() == 0:
    os.write(sys.stdout.fileno(), f"grandchild {os.getpid()}\n".encode())
    time.sleep(60)
    sys.exit(0)
os.write(sys.stdout.fileno(), b"parent done\n")
