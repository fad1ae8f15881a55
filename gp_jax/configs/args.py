"""Parses config args like "quick,head=efficient,lr=1e-3" into typed fields."""

from __future__ import annotations

import ml_collections


def _coerce(value: str, default):
  if isinstance(default, bool):
    low = value.lower()
    if low in ("1", "true", "yes", "on", ""):
      return True
    if low in ("0", "false", "no", "off"):
      return False
    raise ValueError(f"expected a boolean, got {value!r}")
  if isinstance(default, int):
    return int(value)
  if isinstance(default, float):
    return float(value)
  return value


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """"a,b=2" -> {a: True, b: 2}, typed by `defaults`; unknown keys are an error listing the known ones."""
  out = dict(defaults)
  for item in filter(None, (s.strip() for s in (arg or "").split(","))):
    key, eq, value = item.partition("=")
    if key not in defaults:
      raise ValueError(f"unknown config arg {key!r}; known: {', '.join(sorted(defaults))}")
    out[key] = _coerce(value if eq else "true", defaults[key])
  return ml_collections.ConfigDict(out)
