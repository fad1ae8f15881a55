"""Expands an experiment's get_sweep(arg) into runs (name, workdir, command line) and reads run status.

Run folders are `<arg>/<overrides>` under the sweep's root, e.g. `dataset=cluener2020/use_rope=False,seed=1`,
so two `:arg`s of one experiment never share a folder. Names keep only filesystem-safe characters; a part that
had to be changed gets a short hash of the original, so two different points never map to one folder.

  python -m launch.sweep finished WORKDIR   # exit 0 when WORKDIR/results.json says "finished" (shell scripts)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import posixpath
import re
import shlex
import sys

import fsspec
from etils import epath

from gp_jax.configs.args import load_experiment
from gp_jax.errors import UserError

from . import command

FINISHED, PREEMPTED, FAILED = "finished", "preempted", "failed"
STARTED, MISSING = "started", "missing"  # a workdir without results.json / no workdir at all

_SAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


@dataclasses.dataclass(frozen=True)
class Run:
  name: str  # "<arg part>/<override part>", relative to the sweep root
  workdir: str
  argv: tuple[str, ...]
  overrides: tuple[tuple[str, object], ...] = ()

  @property
  def command(self) -> str:
    return shlex.join(self.argv)


def load_module(path: str):
  """The experiment file at `path` (gp_jax.configs.args.load_experiment)."""
  return load_experiment(path)


def sweep_points(module, arg: str | None) -> list[dict]:
  """module.get_sweep(arg), or get_sweep() for old experiments that take no argument; [] without get_sweep."""
  fn = getattr(module, "get_sweep", None)
  if fn is None:
    return []
  params = inspect.signature(fn).parameters.values()
  takes_arg = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
  return list((fn(arg) if takes_arg else fn()) or [])


def safe_name(text: str, *, empty: str) -> str:
  """`text` with only [A-Za-z0-9._=,+-]; a hash of the original is appended when anything had to change."""
  if not text:
    return empty
  out = _SAFE.sub("_", text)[:80]
  if out != text or out in (".", "..") or out.startswith("-"):
    out = f"{out.lstrip('-')}+{hashlib.sha1(text.encode()).hexdigest()[:6]}"
  return out


def short_keys(keys) -> dict[str, str]:
  """Full override key -> the shortest dotted suffix that no other key shares ("config." is never kept)."""
  keys = list(dict.fromkeys(keys))
  parts = {k: k.removeprefix("config.").split(".") for k in keys}
  out = {}
  for k in keys:
    for n in range(1, len(parts[k]) + 1):
      cand = ".".join(parts[k][-n:])
      if not any(o != k and ".".join(parts[o][-n:]) == cand for o in keys):
        break
    out[k] = cand
  return out


def _value(v) -> str:
  return str(v)


def run_name(arg: str | None, overrides: dict, short: dict[str, str]) -> str:
  over = ",".join(f"{short[k]}={_value(v)}" for k, v in overrides.items())
  return f"{safe_name(arg or '', empty='default')}/{safe_name(over, empty='base')}"


def join(root: str, name: str) -> str:
  return posixpath.join(root.rstrip("/"), name) if "://" in root else os.path.join(root, name)


def _flag_key(arg: str) -> str | None:
  """The config key an extra flag sets ("--config.a.b=v" / "--config.a.b" -> "config.a.b"), else None."""
  if not arg.startswith("--config."):
    return None
  return arg[2:].partition("=")[0]


def checked_points(path: str, arg: str | None) -> list[dict]:
  """get_sweep(arg)'s points, each a dict of "config.key" -> value ([{}] for an experiment without points); UserError
  for an entry that is not such a dict."""
  points = sweep_points(load_module(path), arg) or [{}]
  for i, point in enumerate(points):
    if not isinstance(point, dict) or not all(isinstance(k, str) for k in point):
      raise UserError(f"{path}: get_sweep({arg!r}) entry {i} is {type(point).__name__} {point!r:.60}; expected a "
                      "dict of 'config.key': value")
  return points


def swept_overrides(path: str, points: list[dict], extra) -> str | None:
  """Why the `extra` flags may not run with `points`: one sets a key the points sweep, which would override the swept
  value in every point while each run keeps its swept name; None when none does."""
  swept = {k for p in points for k in p}
  clash = sorted({k for k in map(_flag_key, extra) if k in swept})
  if not clash:
    return None
  values = sorted({_value(p[clash[0]]) for p in points if clash[0] in p})
  return (f"--{clash[0]} is swept by {path}'s points ({', '.join(values)}): a flag after '--' would set it in every "
          "point while each keeps its swept name; drop the flag or the key from get_sweep"
          + (f" (also: {', '.join(clash[1:])})" if clash[1:] else ""))


def check_root(workdir_root: str) -> None:
  """UserError when a local sweep root exists and is not a folder."""
  if "://" not in workdir_root and os.path.exists(workdir_root) and not os.path.isdir(workdir_root):
    raise UserError(f"--workdir {workdir_root} is a file; expected a folder (the sweep's root) or a path not yet made")


def expand(config_spec: str, workdir_root: str, *, extra=(), python: str = sys.executable,
           command_config: str | None = None, preview: bool = False) -> list[Run]:
  """`config_spec` is "path.py" or "path.py:arg"; one Run per get_sweep(arg) entry (one run if it is empty).

  `command_config` is the --config value written into the commands (default `config_spec`), e.g. a path
  relative to the repository for remote hosts. UserError for a bad point (`checked_points`), a flag that overrides a
  swept key (`swept_overrides`) and a local `workdir_root` that is a file; with `preview` (`launch.compile`: no run
  folders, `workdir_root` a placeholder) the flag is the caller's to report.
  """
  path, _, arg = config_spec.partition(":")
  points = checked_points(path, arg if ":" in config_spec else None)
  if not preview:
    check_root(workdir_root)
    clash = swept_overrides(path, points, extra)
    if clash:
      raise UserError(clash)
  short = short_keys(k for p in points for k in p)
  runs, seen = [], {}
  for overrides in points:
    name = run_name(arg, overrides, short)
    if name in seen:
      raise UserError(f"{path}: sweep points {seen[name]} and {overrides} both map to folder {name!r}")
    seen[name] = overrides
    workdir = join(workdir_root, name)
    argv = [python, "-m", "gp_jax.main", f"--config={command_config or config_spec}", f"--workdir={workdir}"]
    argv += [f"--{k}={_value(v)}" for k, v in overrides.items()]
    argv += list(extra)
    runs.append(Run(name, workdir, tuple(argv), tuple(overrides.items())))
  return runs


def only_pattern(only: str) -> re.Pattern | None:
  """--only compiled; a bad regular expression is a usage error."""
  try:
    return re.compile(only) if only else None
  except re.error as e:
    raise UserError(f"--only {only!r} is not a regular expression: {e}") from None


def select(runs: list[Run], only: str) -> list[Run]:
  """The runs whose folder name matches --only (all without it); none matching is a usage error."""
  pattern = only_pattern(only)
  chosen = [r for r in runs if pattern is None or pattern.search(r.name)]
  if not chosen:
    names = ", ".join(r.name for r in runs[:8]) + (", ..." if len(runs) > 8 else "")
    raise UserError(f"no point matches --only {only!r} ({len(runs)} points: {names})")
  return chosen


# ----------------------------------------------------------------------------- run status (local or gs://)


def read_json(path) -> dict | None:
  """Parsed JSON at `path` (str or epath.Path), None when absent or unreadable (e.g. half-written)."""
  try:
    if str(path).startswith(("gs://", "gcs://")):
      # One GET: epath's buffered reader (fsspec's prefetcher) can hang on small objects.
      return json.loads(fsspec.filesystem("gs").cat_file(str(path)))
    return json.loads(epath.Path(path).read_text())
  except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
    return None


def status_of(results: dict | None, *, workdir_exists: bool = True) -> str:
  """finished|preempted|failed from results.json; started (workdir, no results) or missing (no workdir).

  Older results.json files have no "status": they count as preempted when they say so, else finished.
  """
  if results is None:
    return STARTED if workdir_exists else MISSING
  status = results.get("status")
  if status:
    return str(status)
  return PREEMPTED if results.get("preempted") else FINISHED


def run_status(workdir: str) -> tuple[str, dict | None]:
  results = read_json(epath.Path(workdir) / "results.json")
  exists = results is not None or epath.Path(workdir).exists()
  return status_of(results, workdir_exists=exists), results


def main(argv=None):
  parser = argparse.ArgumentParser(prog=command("sweep"), description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="cmd", required=True)
  p = sub.add_parser("finished", help="exit 0 when WORKDIR/results.json says finished, 1 otherwise")
  p.add_argument("workdir", help="a run's workdir (local or gs://)")
  args = parser.parse_args(argv)
  return 0 if run_status(args.workdir)[0] == FINISHED else 1


if __name__ == "__main__":
  sys.exit(main())
