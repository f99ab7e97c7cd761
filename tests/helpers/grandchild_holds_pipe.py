"""Helper program: forks a grandchild that keeps stdout open and sleeps, then exits at once."""

import os
import sys
import time

if os.fork() == 0:
    # One write per line: print() writes the text and the newline separately when
    # PYTHONUNBUFFERED is set, and the two processes' writes would interleave.
    sys.stdout.write(f"grandchild {os.getpid()}\n")
    sys.stdout.flush()
    time.sleep(60)
    sys.exit(0)
sys.stdout.write("parent done\n")
sys.stdout.flush()
