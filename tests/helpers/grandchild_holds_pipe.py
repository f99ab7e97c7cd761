"""Helper program: forks a grandchild that keeps stdout open and sleeps, then exits at once."""

import os
import sys
import time

if os.fork() == 0:
    print(f"grandchild {os.getpid()}", flush=True)
    time.sleep(60)
    sys.exit(0)
print("parent done", flush=True)
