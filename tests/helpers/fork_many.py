"""Helper program: forks N sleeping children (same process group), then exits."""

import os
import sys
import time

count = int(sys.argv[1])
for _ in range(count):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print(f"forked {count}", flush=True)
