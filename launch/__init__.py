"""Launching sweeps: sweep.py (points and run folders), local.py (this machine), worker.py (lease-based workers),
tpu.py (TPU slices), report/ (tables and figures)."""
