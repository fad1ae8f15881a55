"""Parses config args like "quick,head=efficient,lr=1e-3" into typed fields."""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys

import ml_collections

from gp_jax.errors import UserError


def _coerce(value: str, default):
  if isinstance(default, bool):
    low = value.lower()
    if low in ("1", "true", "yes", "on", ""):
      return True
    if low in ("0", "false", "no", "off"):
      return False
    raise UserError(f"expected a boolean, got {value!r}")
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
      raise UserError(f"unknown config arg {key!r}; known: {', '.join(sorted(defaults))}")
    try:
      out[key] = _coerce(value if eq else "true", defaults[key])
    except ValueError as e:
      raise UserError(f"config arg {item!r}: {e}") from None
  return ml_collections.ConfigDict(out)


def _flat_keys(c, prefix=""):
  for k, v in c.items():
    yield prefix + k
    if isinstance(v, ml_collections.ConfigDict):
      yield from _flat_keys(v, prefix + k + ".")


def check_override_keys(argv) -> str | None:
  """The first `--config.KEY=...` of argv whose KEY the config lacks, as one line naming the closest keys."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None:
    return None
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_gp_jax_config", path)
  module = importlib.util.module_from_spec(module_spec)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if repo not in sys.path:
    sys.path.insert(0, repo)
  module_spec.loader.exec_module(module)
  config = module.get_config(arg or None)
  keys = list(_flat_keys(config))
  for a in argv:
    if a.startswith("--config.") and "=" in a:
      key = a[len("--config."):].split("=", 1)[0]
      if key not in keys:
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
        hint = f"; closest: {', '.join(close)}" if close else ""
        return f"unknown config key {key!r} in {a!r}{hint}"
  return None
