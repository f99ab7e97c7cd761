"""Helper program: forks a grandchild that keeps stdout open and sleeps, then exits at once.

Each line is one write(2): print() under PYTHONUNBUFFERED=1 writes the text and its newline
separately, and the two processes' lines could interleave.
"""

import os
import sys
import time

if os.fork() == 0:
    os.write(1, f"grandchild {os.getpid()}\n".encode())
    time.sleep(60)
    sys.exit(0)
os.write(1, b"parent done\n")
