"""launch.local as a user meets it: --only's mistakes, the summary of --workers, why a point failed, repeated errors.
In-process: the runs and the workers are stand-ins (no trainer, no process)."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from launch import local, sweep, worker
from tests.test_launch import _write_experiment

# A point per "+"-separated mode of the arg: finish, fail (results.json with "error"), crash (no results.json),
# preempt, usage (gp_jax.main's one line, exit 2), mute (killed: nothing said).
STANDIN_EXPERIMENT = """
    import ml_collections
    def get_config(arg=None):
      return ml_collections.ConfigDict({"mode": "finish", "x": 0})
    def get_sweep(arg=None):
      return [{"config.mode": m, "config.x": i} for i, m in enumerate(arg.split("+"))]
    """


def _results(workdir, **results):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f)


def standin(config, workdir: str) -> dict:
  """launch.worker's runner: a point by config.mode."""
  if config.mode == "fail":
    _results(workdir, status="failed", error="RuntimeError: stand-in failure")
    raise RuntimeError("stand-in failure")
  if config.mode == "crash":
    raise ValueError("crashed before results.json")
  status = {"preempt": "preempted"}.get(config.mode, "finished")
  _results(workdir, status=status)
  return {"status": status}


class InProcessWorker:
  """subprocess.Popen of a `launch.worker` command, run in this process with the stand-in runner."""

  def __init__(self, cmd, env=None, stdout=None, stderr=None, start_new_session=False):
    assert cmd[1:3] == ["-m", "launch.worker"], cmd
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      self.rc = worker.main([*cmd[3:5], "--runner=tests.test_local_usage:standin", *cmd[5:]])
    stdout.write(out.getvalue().encode())
    self.pid = 0

  def wait(self):
    return self.rc

  poll = wait


class StandinRun:
  """subprocess.Popen of a point's `python -m gp_jax.main` command: writes what a run of config.mode would."""

  SAYS = {"fail": "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n",
          "usage": "I1206 12:00:00 logging line\nerror: unknown config key 'model.hed' (closest: model.head)\n"}

  def __init__(self, argv, start_new_session=False, stderr=None):
    flags = dict(a[2:].split("=", 1) for a in argv[3:] if a.startswith("--"))
    mode, workdir = flags["config.mode"], flags["workdir"]
    read, write = os.pipe()
    self.stderr, self.pid = os.fdopen(read, "rb"), 0
    os.write(write, self.SAYS.get(mode, "").encode())
    os.close(write)
    self.rc = {"finish": 0, "usage": 2, "mute": 137}.get(mode, 1)
    if mode == "finish":
      _results(workdir, status="finished")
    elif mode in ("fail", "silent"):
      _results(workdir, status="failed", error=f"RuntimeError: {'boom' if mode == 'fail' else 'recorded only'}")

  def wait(self):
    return self.rc

  def poll(self):
    return self.rc


def _usage_error(capsys, argv) -> str:
  """The one stderr line of a usage error (exit 2, no traceback)."""
  assert local.main(argv) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and err.startswith("error: "), err
  return err.strip()


def test_only_that_is_no_regex_or_matches_nothing_is_one_line(tmp_path, capsys):
  """A bad --only raised re.error; one matching nothing ended in `max() arg is an empty sequence`."""
  base = ["--config=experiments/synthetic.py:quick", f"--workdir={tmp_path / 'sweep'}"]
  for mode in (["--dry_run"], ["--dry_run", "--workers=2"], ["--workers=2"]):
    err = _usage_error(capsys, [*base, "--only=seed=(", *mode])
    assert err == "error: --only 'seed=(' is not a regular expression: missing ), unterminated subpattern at position 5"
  for mode in (["--dry_run"], [], ["--dry_run", "--workers=2"], ["--workers=2"]):
    err = _usage_error(capsys, [*base, "--only=seed=7", *mode])
    assert err == "error: no point matches --only 'seed=7' (2 points: quick/head=standard, quick/head=efficient)"
  assert not (tmp_path / "sweep").exists()


def test_workers_summarize_the_selected_points_and_say_why_one_failed(tmp_path, capsys, monkeypatch):
  """--workers counted the points --only left out (missing -> new -> missing, rc 1) and named no failure's reason."""
  exp = _write_experiment(tmp_path, STANDIN_EXPERIMENT)
  root = str(tmp_path / "runs")
  spec = f"{exp}:finish+fail+crash+preempt+finish+finish"
  names = [r.name for r in sweep.expand(spec, root)]
  monkeypatch.setattr(subprocess, "Popen", InProcessWorker)
  assert local.main([f"--config={spec}", f"--workdir={root}", "--workers=1", "--only=x=[0-4]$"]) == 1
  out = capsys.readouterr().out
  summary = out[out.index("sweep summary"):].splitlines()
  rows = [" ".join(line.split()) for line in summary[1:6]]
  assert summary[0] == "sweep summary (5 points):" and names[5] not in out
  assert rows == [f"{names[0]} missing -> new -> finished",
                  f"{names[1]} missing -> new -> failed: RuntimeError: stand-in failure",
                  f"{names[2]} missing -> new -> failed: ValueError: crashed before results.json",
                  f"{names[3]} missing -> new -> preempted",
                  f"{names[4]} missing -> not run -> missing"], out
  assert summary[6] == "summary: finished 1 | preempted 1 | failed 2 | skipped 0 | resumed 0 | new 4 | unfinished 1"
  assert summary[7].startswith("Rerun the same command to resume unfinished points")

  # The user's case: the one selected point finishes; the others are not counted; exit 0.
  capsys.readouterr()
  assert local.main([f"--config={spec}", f"--workdir={tmp_path / 'one'}", "--workers=2", "--only=x=5$"]) == 0
  out = capsys.readouterr().out
  assert "sweep summary (1 points):" in out and "unfinished" not in out and "Rerun" not in out, out


def test_serial_summary_names_why_each_point_failed(tmp_path, capsys, monkeypatch):
  """The reason was printed inline only (and only results.json's); a run that died before writing it had none."""
  exp = _write_experiment(tmp_path, STANDIN_EXPERIMENT)
  spec = f"{exp}:finish+fail+usage+silent+mute"
  names = [r.name for r in sweep.expand(spec, str(tmp_path))]
  monkeypatch.setattr(subprocess, "Popen", StandinRun)
  assert local.main([f"--config={spec}", f"--workdir={tmp_path}"]) == 1
  captured = capsys.readouterr()
  assert "RuntimeError: boom" in captured.err and "logging line" in captured.err  # the runs' stderr still shows
  out = captured.out
  rows = [" ".join(line.split()) for line in out[out.index("sweep summary"):].splitlines()[1:6]]
  assert rows == [f"{names[0]} missing -> new -> finished",
                  f"{names[1]} missing -> new -> failed: RuntimeError: boom",
                  f"{names[2]} missing -> new -> failed: unknown config key 'model.hed' (closest: model.head)",
                  f"{names[3]} missing -> new -> failed: RuntimeError: recorded only",
                  f"{names[4]} missing -> new -> failed: exit 137, no error line"], out
  assert "  failed (exit 2): unknown config key 'model.hed' (closest: model.head)" in out
  # On a terminal the run keeps it (its progress bar): the reason is results.json's, else the output above.
  kept = []
  monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: kept.append(kw.get("stderr")) or StandinRun(argv, **kw))
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  assert local.main([f"--config={spec}", f"--workdir={tmp_path / 'tty'}"]) == 1
  out = capsys.readouterr().out
  assert kept == [None] * 5
  rows = [" ".join(line.split()) for line in out[out.index("sweep summary"):].splitlines()[1:6]]
  assert rows[1:] == [f"{names[1]} missing -> new -> failed: RuntimeError: boom",
                      f"{names[2]} missing -> new -> failed: exit 2: see its output above",
                      f"{names[3]} missing -> new -> failed: RuntimeError: recorded only",
                      f"{names[4]} missing -> new -> failed: exit 137: see its output above"], out


REFUSES_ARG = """
    from gp_jax.configs import base
    from gp_jax.errors import UserError
    def get_config(arg=None):
      if "nosuch" in (arg or ""):
        raise UserError("unknown config arg 'nosuch'; known: quick")
      return base.get_config("quick")
    def get_sweep(arg=None):
      return [{"config.seed": s} for s in range(5)] + [{"config.model.hed": "crf"}, {"config.model.dtype": "float8"}]
    """


@pytest.mark.parametrize("workers", [[], ["--workers=2"]])
def test_dry_run_says_a_reason_shared_by_points_once(tmp_path, capsys, workers):
  """A bad experiment arg printed the same line for every point (30 lines for 30 points)."""
  exp = _write_experiment(tmp_path, REFUSES_ARG)
  root = str(tmp_path / "runs")
  assert local.main([f"--config={exp}:quick,nosuch=1", f"--workdir={root}", "--dry_run", *workers]) == 2
  captured = capsys.readouterr()
  names = [r.name for r in sweep.expand(f"{exp}:quick", root)]
  assert captured.err.splitlines() == [
      "error: 7 points (quick,nosuch=1/seed=0, quick,nosuch=1/seed=1, quick,nosuch=1/seed=2, ...): unknown config "
      "arg 'nosuch'; known: quick"]
  assert "7 of 7 points would stop before their first step" in captured.out
  # Different reasons stay a line each.
  assert local.main([f"--config={exp}:quick", f"--workdir={root}", "--dry_run", *workers]) == 2
  err = capsys.readouterr().err.splitlines()
  assert [ln.split(": ")[1] for ln in err] == names[5:], err
  assert "unknown config key 'model.hed'" in err[0] and "model.dtype must be one of" in err[1], err
