"""Launching sweeps: sweep.py (points and run folders), local.py (this machine), tpu.py (pod slices), report.py."""
