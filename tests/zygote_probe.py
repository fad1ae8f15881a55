"""`python -m tests.zygote_probe [wait]`: prints what a process sees of itself as one JSON line (tests/e2e/
test_zygote.py runs it fresh and forked); with `wait`, then blocks until a signal ends it."""

import gc
import json
import os
import signal
import sys

import jax

print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "env": os.environ.get("PROBE"),
                  "devices": jax.device_count(), "stdin": sys.stdin.readline(),
                  "session_leader": os.getsid(0) == os.getpid(), "main": __name__,
                  "sigint": str(signal.getsignal(signal.SIGINT)), "gc_thresholds": gc.get_threshold()}), flush=True)
print("stderr line", file=sys.stderr, flush=True)
if sys.argv[1:] == ["wait"]:
  signal.pause()
sys.exit(3)
