"""Helper program: ignores SIGTERM, says it is ready, then sleeps (optionally exits 0 on TERM)."""

import signal
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "exit0":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
