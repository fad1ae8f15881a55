"""Launching sweeps: sweep.py (points and run folders), local.py (this machine), worker.py (lease-based workers),
tpu.py (TPU slices; tpu_commands.py), compile.py (every point compiled for its slice first; compiler.py, points.py,
failures.py, accelerators.py), report/ (tables and figures)."""
