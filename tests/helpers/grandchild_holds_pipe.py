"""Helper program: forks a grandchild that keeps stdout open and sleeps, then exits at once."""

import os
import sys
import time

if os.fork() == 0:
    # One write(2) per line: under PYTHONUNBUFFERED print() writes the text and its newline
    # separately, and the two processes' lines could interleave mid-line.
    os.write(1, f"grandchild {os.getpid()}\n".encode())
    time.sleep(60)
    sys.exit(0)
os.write(1, b"parent done\n")
