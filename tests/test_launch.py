"""launch/: sweep folders, the local runner (a real sweep, SIGTERM, rerun), the TPU pod commands and workers script."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest

from gp_jax.configs import base
from gp_jax.configs.args import parse_arg
from launch import local, sweep, tpu, tpu_commands
from tests import helpers_train as ht

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(REPO, "experiments")


def _write_experiment(folder, body: str, name: str = "exp.py") -> str:
  path = os.path.join(folder, name)
  with open(path, "w") as f:
    f.write(textwrap.dedent(body))
  return path


def _write_results(workdir, **results):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f)


# ----------------------------------------------------------------------------- configs and sweeps


def test_parse_arg_types_and_errors():
  a = parse_arg("quick,head=efficient,rope=False,epochs=2.5", quick=False, head="standard", rope=True, epochs=0.0)
  assert (a.quick, a.head, a.rope, a.epochs) == (True, "efficient", False, 2.5)
  with pytest.raises(ValueError, match="unknown config arg 'hed'"):
    parse_arg("hed=x", head="standard")
  with pytest.raises(ValueError, match="boolean"):
    parse_arg("rope=maybe", rope=True)


def test_base_config_quick_and_args():
  c = base.get_config("quick,head=efficient,rope=False")
  assert c.model.head == "efficient" and c.model.use_rope is False and c.num_train_steps > 0


EXPERIMENT_FILES = sorted(f for f in os.listdir(EXPERIMENTS) if f.endswith(".py") and not f.startswith("_"))


@pytest.mark.parametrize("name", EXPERIMENT_FILES)
def test_every_experiment_builds_and_sweeps(name):
  module = sweep.load_module(os.path.join(EXPERIMENTS, name))
  config = module.get_config(None)
  assert config.model.head in ("standard", "efficient")
  for overrides in sweep.sweep_points(module, None):
    for key in overrides:
      node = config
      parts = key.split(".")[1:]
      for p in parts[:-1]:
        node = node[p]
      assert parts[-1] in node, f"{name}: sweep key {key} is not a config field"
  assert len({r.workdir for r in sweep.expand(os.path.join(EXPERIMENTS, name), "/r")}) >= 1


ROPE_LIKE = """
    def get_config(arg=None):
      return None
    def get_sweep(arg=None):
      seeds = (0, 1) if arg and "cluener" in arg else (0,)
      return [{"config.model.use_rope": r, "config.seed": s} for r in (True, False) for s in seeds]
    """


def test_run_folders_come_from_arg_and_overrides(tmp_path):
  exp = _write_experiment(tmp_path, ROPE_LIKE)
  plain = sweep.expand(exp, str(tmp_path))
  cluener = sweep.expand(exp + ":dataset=cluener2020", str(tmp_path))
  want = [f"dataset=cluener2020/use_rope={b},seed={s}" for b in (True, False) for s in (0, 1)]
  assert [r.name for r in cluener] == want
  assert [r.name for r in plain] == [f"default/use_rope={b},seed=0" for b in (True, False)]
  r = cluener[3]
  assert r.argv[1:] == ("-m", "gp_jax.main", f"--config={exp}:dataset=cluener2020", f"--workdir={tmp_path}/{r.name}",
                        "--config.model.use_rope=False", "--config.seed=1")
  assert sweep.expand(exp, "gs://b/runs/")[0].workdir == "gs://b/runs/default/use_rope=True,seed=0"
  # The real experiment: two datasets under one root never share a folder.
  rope = os.path.join(EXPERIMENTS, "rope_ablation.py")
  a, b = sweep.expand(rope, "/r"), sweep.expand(rope + ":dataset=cluener2020", "/r")
  assert not {r.workdir for r in a} & {r.workdir for r in b}


def test_sweep_names_short_keys_safe_chars_and_signatures(tmp_path):
  path = _write_experiment(tmp_path, """
      SEEN = []
      def get_config(arg=None):
        return None
      def get_sweep(arg):
        SEEN.append(arg)
        return [{"config.model.dropout": 0.1, "config.data.dropout": 0.2, "config.seed": 1},
                {"config.model.dropout": 0.3, "config.data.dropout": 0.2, "config.seed": 1},
                {"config.data.train_file": "a b/c's \\"x\\".jsonl"}]
      """)
  runs = sweep.expand(path + ":quick,head=x y", "/root")
  names = [r.name for r in runs]
  assert names[0] == names[0].split("/")[0] + "/model.dropout=0.1,data.dropout=0.2,seed=1"
  assert names[1].endswith("/model.dropout=0.3,data.dropout=0.2,seed=1")
  arg_part = names[0].split("/")[0]
  assert arg_part.startswith("quick,head=x_y+") and len({n.split("/")[0] for n in names}) == 1
  assert all(re.fullmatch(r"[A-Za-z0-9._=,+-]+/[A-Za-z0-9._=,+-]+", n) for n in names), names
  assert len(set(names)) == 3
  # Two args that sanitise alike still get different folders.
  other = sweep.expand(path + ":quick,head=x_y", "/root")[0].name.split("/")[0]
  assert other == "quick,head=x_y" and other != arg_part
  # get_sweep receives the arg; "" for "file.py:", None without a colon.
  mod = sweep.load_module(path)
  sweep.sweep_points(mod, "dataset=a")
  assert mod.SEEN[-1] == "dataset=a"

  old = _write_experiment(tmp_path, """
      def get_config(arg=None):
        return None
      def get_sweep():
        return [{"config.seed": 0}, {"config.seed": 1}]
      """, "old.py")
  assert [r.name for r in sweep.expand(old + ":", "/r")] == ["default/seed=0", "default/seed=1"]
  dup = _write_experiment(tmp_path, """
      def get_sweep(arg=None):
        return [{"config.seed": 0}, {"config.seed": 0}]
      """, "dup.py")
  with pytest.raises(ValueError, match="both map to folder"):
    sweep.expand(dup, "/r")
  none = _write_experiment(tmp_path, "def get_config(arg=None):\n  return None\n", "none.py")
  assert [r.name for r in sweep.expand(none, "/r")] == ["default/base"]


def test_status_of_results():
  assert sweep.status_of(None, workdir_exists=False) == sweep.MISSING
  assert sweep.status_of(None) == sweep.STARTED
  for s in ("finished", "preempted", "failed"):
    assert sweep.status_of({"status": s}) == s
  assert sweep.status_of({"preempted": True, "steps": 3}) == "preempted"  # files from before "status"


# ROPE_LIKE with configs that build: the dry run builds every unfinished point's config.
ROPE_LIKE_BUILDS = """
    from gp_jax.configs import base
    def get_config(arg=None):
      return base.get_config("quick")
    def get_sweep(arg=None):
      seeds = (0, 1) if arg and "cluener" in arg else (0,)
      return [{"config.model.use_rope": r, "config.seed": s} for r in (True, False) for s in seeds]
    """


def test_local_dry_run_reports_plan(tmp_path, capsys):
  exp = _write_experiment(tmp_path, ROPE_LIKE_BUILDS)
  root = str(tmp_path / "runs")
  runs = sweep.expand(exp + ":cluener", root)
  _write_results(runs[0].workdir, status="finished")
  _write_results(runs[1].workdir, status="preempted")
  _write_results(runs[2].workdir, status="failed", error="boom")
  assert local.main([f"--config={exp}:cluener", f"--workdir={root}", "--dry_run"]) == 0
  out = capsys.readouterr().out
  assert f"{runs[0].name} (finished, skipped)" in out and f"{runs[1].name} (preempted, resumed)" in out
  assert f"{runs[2].name} (failed, resumed)" in out and f"{runs[3].name} (missing, new)" in out
  assert "skipped 1 | resumed 2 | new 1" in out
  assert "checking the configs of 3 unfinished points ...\nevery config builds" in out

  # --only keeps the points whose folder matches.
  assert local.main([f"--config={exp}:cluener", f"--workdir={root}", "--dry_run", f"--only={runs[3].name}$"]) == 0
  out = capsys.readouterr().out
  assert f"{runs[3].name} (missing, new)" in out and runs[0].name not in out


BAD_POINTS = """
    from gp_jax.configs import base
    from gp_jax.errors import UserError
    def get_config(arg=None):
      if arg == "refuse":
        raise UserError("exp.py: this experiment refuses arg 'refuse'; use quick")
      return base.get_config("quick")
    def get_sweep(arg=None):
      return [{"config.seed": 0}, {"config.model.dtype": "float8"}, {"config.model.hed": "crf"},
              {"config.model.head": "crf", "config.loss.implementation": "pallas"}, {"config.seed": 1}]
    """


def test_dry_run_names_each_point_that_would_not_start(tmp_path, capsys):
  """One error line per bad point, with the reason the run itself would give; the good points pass; exit 2."""
  exp = _write_experiment(tmp_path, BAD_POINTS)
  root = str(tmp_path / "runs")
  runs = sweep.expand(exp, root)
  # The last point's folder holds a run of another config: resuming it would be refused.
  saved = base.get_config("quick")
  saved.model.hidden_size = 96
  os.makedirs(runs[4].workdir)
  with open(os.path.join(runs[4].workdir, "config.json"), "w") as f:
    f.write(saved.to_json_best_effort())
  assert local.main([f"--config={exp}", f"--workdir={root}", "--dry_run"]) == 2
  captured = capsys.readouterr()
  errors = captured.err.splitlines()
  assert [ln.split(": ")[1] for ln in errors] == [r.name for r in runs[1:]], captured.err
  assert "model.dtype must be one of" in errors[0] and "'float8'" in errors[0]
  assert "unknown config key 'model.hed'" in errors[1] and "closest: model.head" in errors[1]
  assert "loss.implementation=pallas is the blockwise span loss's kernel" in errors[2]
  assert "holds a run of another config" in errors[3] and "model.hidden_size: 96 -> 64" in errors[3]
  assert "4 of 5 points would stop before their first step" in captured.out

  # An experiment that refuses its arg: every point, in one line with the experiment's own; the worker plan too.
  args = [f"--config={exp}:refuse", f"--workdir={tmp_path / 'other'}", "--dry_run"]
  assert local.main(args) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("error: 5 points (refuse/") and err[0].endswith(
      ": exp.py: this experiment refuses arg 'refuse'; use quick"), err
  assert local.main([*args, "--workers=2"]) == 2
  assert len(capsys.readouterr().err.splitlines()) == 1
  assert not (tmp_path / "other").exists()  # a dry run writes nothing

  # A missing experiment file is one line, exit 2.
  assert local.main([f"--config={tmp_path / 'nope.py'}", f"--workdir={root}", "--dry_run"]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"error: no experiment file {tmp_path / 'nope.py'}: --config takes a Python file with get_config(arg), e.g. "
      "experiments/synthetic.py:quick"]


def test_tpu_run_refuses_a_point_that_would_not_start(tmp_path, capsys):
  exp = _write_experiment(tmp_path, BAD_POINTS)
  rc = tpu.main(["run", "--tpu=pod", "--zone=z", f"--config={exp}", "--workdir=gs://b/runs", "--dry_run"])
  assert rc == 2
  captured = capsys.readouterr()
  assert "gcloud" not in captured.out and "refused: 3 of 5 points" in captured.err
  assert len([ln for ln in captured.err.splitlines() if ln.startswith("error: ")]) == 3
  # The flags after `--` reach every point, in the check as on the hosts.
  rc = tpu.main(["run", "--tpu=pod", "--zone=z", "--config=experiments/synthetic.py:quick", "--workdir=gs://b/r",
                 "--dry_run", "--", "--config.model.dtype=float8"])
  assert rc == 2 and "refused: 2 of 2 points" in capsys.readouterr().err


@pytest.mark.e2e  # a fresh interpreter
def test_experiment_files_load_from_any_folder_without_sys_path(tmp_path):
  """A file of a package folder imports its siblings (experiments/head_ablation.py imports rope_ablation) from
  another working directory, and nothing is added to sys.path; a plain file loads afresh on every call."""
  code = textwrap.dedent(f"""\
      import sys
      from gp_jax.configs.args import build_config, load_experiment
      before = list(sys.path)
      config = build_config({os.path.join(EXPERIMENTS, "head_ablation.py")!r} + ":quick")
      assert sys.path == before, (before, sys.path)
      print(config.model.head, sys.modules["experiments"].__path__[0])
      """)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["standard", EXPERIMENTS]

  from gp_jax.configs.args import load_experiment

  path = _write_experiment(tmp_path, "N = 1\n", "plain.py")
  first = load_experiment(path)
  stamp = os.stat(path).st_mtime_ns
  _write_experiment(tmp_path, "N = 2\n", "plain.py")
  os.utime(path, ns=(stamp, stamp))  # an edit within the same second, same size: a cached .pyc would still match
  assert (first.N, load_experiment(path).N) == (1, 2)


# ----------------------------------------------------------------------------- a real local sweep


SWEEP_STEPS = 120  # the SIGTERM sent on the first logged step lands within a step or two (step 2 of 300 when
# measured): over a hundred steps to spare


def _status(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


@pytest.mark.e2e
def test_local_sweep_sigterm_then_rerun_resumes_and_skips(tmp_path):
  env = ht.subprocess_env(devices=1)
  root = str(tmp_path / "sweep")
  cmd = [sys.executable, "-m", "launch.local", f"--config={ht.CONFIG_FILE}", f"--workdir={root}", "--",
         *ht.flag_args(num_train_steps=SWEEP_STEPS)]
  runs = sweep.expand(ht.CONFIG_FILE, root)
  assert len(runs) == 2

  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    out = ht.LogWatcher(proc)
    i, line = out.wait_for_match(r"^  pid \d+$")
    pid = int(line.split()[-1])
    out.wait_for_match(r"\bstep \d+", after=i + 1)  # the first point is training
    os.kill(pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, "".join(out.lines)[-4000:]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  first = "".join(out.lines)
  assert "summary: finished 1 | preempted 1 | failed 0 | skipped 0 | resumed 0 | new 2" in first, first[-4000:]
  stopped = _status(runs[0].workdir)
  assert stopped["status"] == "preempted" and stopped["steps"] < SWEEP_STEPS
  assert _status(runs[1].workdir)["status"] == "finished"
  finished_before = open(os.path.join(runs[1].workdir, "results.json")).read()

  again = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120)
  assert again.returncode == 0, again.stdout[-4000:]
  text = again.stdout
  assert f"{runs[0].name} (preempted, resumed)" in text and f"{runs[1].name} (finished, skipped)" in text
  assert "summary: finished 2 | preempted 0 | failed 0 | skipped 1 | resumed 1 | new 0" in text, text[-4000:]
  resumed = _status(runs[0].workdir)
  assert resumed["status"] == "finished" and resumed["steps"] == SWEEP_STEPS
  with open(os.path.join(runs[0].workdir, "metrics.jsonl")) as f:
    train_steps = [json.loads(ln)["step"] for ln in f if '"train"' in ln]
  assert train_steps.count(1) == 1 and max(train_steps) >= SWEEP_STEPS - 1  # resumed, not restarted
  assert open(os.path.join(runs[1].workdir, "results.json")).read() == finished_before  # not rerun
  assert again.stdout.count("  pid ") == 1


# ----------------------------------------------------------------------------- TPU pod commands


def test_pod_commands_exact():
  cmds = tpu_commands.start_workers_commands(name="pod", zone="us-central2-b", project=None, sha="abc123",
                                             tarball="/t/x.tar.gz", script_file="/t/workers-pod.sh")
  g = ["gcloud", "compute", "tpus", "tpu-vm"]
  unpack = ("--command=set -e; mkdir -p ~/gp_jax-abc123 && tar -xzf ~/gp_jax-abc123.tar.gz -C ~/gp_jax-abc123 && "
            "cd ~/gp_jax-abc123 && ")
  assert cmds == [
      g + ["scp", "/t/x.tar.gz", "pod:~/gp_jax-abc123.tar.gz", "--worker=all", "--zone=us-central2-b"],
      g + ["ssh", "pod", "--worker=all", "--zone=us-central2-b",
           unpack + "{ [ -x ~/.local/bin/uv ] || curl -LsSf https://astral.sh/uv/install.sh | sh; } && rm -rf .venv && "
           "~/.local/bin/uv venv --python 3.11 .venv && ~/.local/bin/uv pip install --python .venv/bin/python -q "
           "'.[tpu]'"],
      g + ["scp", "/t/workers-pod.sh", "pod:~/gp_jax-abc123/workers.sh", "--worker=all", "--zone=us-central2-b"],
      g + ["ssh", "pod", "--worker=all", "--zone=us-central2-b",
           "--command=cd ~/gp_jax-abc123 && nohup setsid bash workers.sh > ~/gp_jax-abc123/queue.log 2>&1 "
           "< /dev/null &"],
  ]
  with_project = tpu_commands.start_workers_commands(name="pod", zone="z", project="proj", sha="abc123",
                                                     tarball="t", script_file="s", python="~/venv/bin/python")
  assert all(c.count("--project=proj") == 1 and "--worker=all" in c and "--zone=z" in c for c in with_project)
  assert with_project[1][-1] == (unpack.replace("us-central2-b", "z")
                                 + '"$HOME"/venv/bin/python -m pip install -q \'.[tpu]\'')
  assert tpu_commands.archive_command("v1", "/t/a.tar.gz") == ["git", "archive", "--format=tar.gz", "-o",
                                                                "/t/a.tar.gz", "v1"]


TRICKY = """
    import ml_collections
    def get_config(arg=None):
      return ml_collections.ConfigDict({"note": "", "x": 0})
    def get_sweep(arg=None):
      return [{"config.note": "my file's, \\"quoted\\"", "config.x": 0},
              {"config.note": "plain", "config.x": 1},
              {"config.note": "$HOME `x` ;|&", "config.x": 2}]
    """


def test_workers_script_quotes_config_workdir_and_flags(tmp_path):
  config = "experiments/exp.py:name=a b,c='d' \"e\""
  extra = ["--config.note=it's, a \"note\""]
  script = tpu_commands.worker_script(sha="abc123", slice_name="gp", config=config, workdir="gs://bucket/runs x",
                                      extra=extra, python="~/venv/bin/python")
  path = tmp_path / "workers.sh"
  path.write_text(script)
  check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
  assert check.returncode == 0, check.stderr
  [line] = [ln for ln in script.splitlines() if " -m launch.worker " in ln]
  words = shlex.split(line.replace('"$HOME"', "HOME").replace('"--name=$NAME"', "--name=NAME"))
  assert words == ["HOME/venv/bin/python", "-m", "launch.worker", f"--config={config}", "--workdir=gs://bucket/runs x",
                   "--name=NAME", "--multihost", "--", *extra, ">>logs/worker.log", "2>&1", "&"]


@pytest.mark.e2e
def test_workers_script_runs_points_skipping_finished(tmp_path):
  """Runs the generated workers.sh with bash and --python a stand-in that runs launch.worker with a stand-in
  point runner (tests.test_launch_lease.standin): finished points skipped, the others (a preempted one too) run
  once each, the worker's log lands in WORKDIR/_launch/logs/."""
  _write_experiment(tmp_path, TRICKY)
  root = str(tmp_path / "runs")
  runs = sweep.expand(str(tmp_path / "exp.py"), root)
  _write_results(runs[1].workdir, status="finished")
  _write_results(runs[2].workdir, status="preempted")
  fake = tmp_path / "fake_python"
  fake.write_text(textwrap.dedent(f"""\
      #!{sys.executable}
      import json, os, sys
      args = sys.argv[1:]
      with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
      # One process here, not a slice: no jax.distributed; the stand-in runner instead of training.
      args = [a for a in args if a != "--multihost"] + ["--runner=tests.test_launch_lease:standin"]
      os.execv(sys.executable, [sys.executable, *args])
      """))
  fake.chmod(0o755)
  code = tmp_path / "gp_jax-abc"
  os.makedirs(code)
  (code / "workers.sh").write_text(tpu_commands.worker_script(sha="abc", slice_name="gp",
                                                              config=str(tmp_path / "exp.py"), workdir=root,
                                                              python=str(fake)))
  events = tmp_path / "events.jsonl"
  env = dict(os.environ, HOME=str(tmp_path), FAKE_LOG=str(tmp_path / "calls.jsonl"), PYTHONPATH=REPO,
             STANDIN_EVENTS=str(events), STANDIN_S="0.1")
  with open(code / "queue.log", "w") as log:
    done = subprocess.run(["bash", str(code / "workers.sh")], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                          timeout=120)
  out = (code / "queue.log").read_text()
  assert done.returncode == 0, out
  assert "nothing left" in out and "giving up" not in out
  [call] = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]  # one worker, no crash
  assert call[:3] == ["-m", "launch.worker", f"--config={tmp_path / 'exp.py'}"] and "--multihost" in call
  started = [json.loads(ln)["point"] for ln in events.read_text().splitlines() if '"start"' in ln]
  assert started == [runs[0].workdir, runs[2].workdir]
  logs = os.listdir(os.path.join(root, "_launch", "logs"))
  [worker_log] = [f for f in logs if f.startswith("gp-w") and not f.endswith("-queue.log")]
  assert "nothing left (every point finished)" in open(os.path.join(root, "_launch", "logs", worker_log)).read()


@pytest.mark.e2e  # the preflight runs launch.compile (libtpu)
def test_tpu_dry_run_prints_commands(tmp_path, capsys):
  config = "tests/sweeps/seeds.py:quick"
  # Two seeds build one program, which the preflight compiles once (train and eval) instead of twice.
  extra = ["--config.num_epochs=1"]

  def head():
    return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()

  before = head()
  rc = tpu.main(["run", "--tpu=pod", "--zone=z", "--project=p", f"--config={config}", "--workdir=/local/runs",
                 "--python=~/gp_venv/bin/python", "--dry_run", "--", *extra])
  assert rc == 0
  captured = capsys.readouterr()
  assert "not gs://" in captured.err
  lines = [shlex.split(ln) for ln in captured.out.splitlines() if ln.startswith(("gcloud ", "git "))]
  assert [ln[:5] for ln in lines] == [["git", "archive", "--format=tar.gz", "-o", lines[0][4]]] + [
      ["gcloud", "compute", "tpus", "tpu-vm", c] for c in ("scp", "ssh", "scp", "ssh")]
  # HEAD when the dry run read it: a commit made meanwhile (another process's) moves it
  sha = next((s for s in (before, head()) if s in lines[1][6]), None)
  assert lines[0][-1] == "HEAD" and sha, (before, lines[1])
  script_file = lines[3][5]
  assert lines[1:] == tpu_commands.start_workers_commands(name="pod", zone="z", project="p", sha=sha,
                                                          tarball=lines[0][4], script_file=script_file,
                                                          python="~/gp_venv/bin/python")
  assert not os.path.exists(lines[0][4]) and not os.path.exists(script_file)  # nothing was written or run
  script = captured.out.split(f"--- {script_file}:\n")[1].split(f"--- end of {script_file}")[0]
  assert script == tpu_commands.worker_script(sha=sha, slice_name="pod", config=config, workdir="/local/runs",
                                              extra=extra, python="~/gp_venv/bin/python")
  assert "compiled 2 programs" in captured.out and "same program as quick/seed=0" in captured.out, captured.out
  assert f"{len(sweep.expand(os.path.join(REPO, config), '/local/runs'))} points, code HEAD = {sha}" in captured.out


def test_tpu_run_finds_its_checkout_from_any_folder_and_refuses_without_one(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)  # not a git checkout: the one holding launch/ is shipped
  assert tpu._repo_root() == REPO
  installed = tmp_path / "site-packages" / "launch"  # a regular install, outside any checkout
  installed.mkdir(parents=True)
  monkeypatch.setattr(tpu, "__file__", str(installed / "tpu.py"))
  rc = tpu.main(["run", "--tpu=pod", "--zone=z", "--config=experiments/synthetic.py:quick", "--workdir=gs://b/r",
                 "--dry_run", "--nopreflight"])
  assert rc == 2 and "ships a git checkout of gp_jax" in capsys.readouterr().err


@pytest.mark.parametrize("main, flags, says", [
    ("local", ["--workers=-1"], "--workers=-1: expected a count >= 0"),
    ("local", ["--workers=2", "--devices_per_worker=-3"], "--devices_per_worker=-3: expected a count >= 0"),
    ("worker", ["--poll_s=0"], "--poll_s=0.0: expected seconds > 0")])
def test_launcher_counts_out_of_range_are_usage_errors(tmp_path, capsys, main, flags, says):
  """--workers=-1 and --devices_per_worker=-3 passed the dry run's checks; --poll_s=-1 was taken."""
  from launch import worker

  cli = {"local": local.main, "worker": worker.main}[main]
  with pytest.raises(SystemExit) as e:
    cli(["--config=experiments/synthetic.py:quick", f"--workdir={tmp_path / 'sweep'}", *flags,
         *(["--dry_run"] if main == "local" else [])])  # the worker has no dry run: it would train
  assert e.value.code == 2 and says in capsys.readouterr().err
  assert not (tmp_path / "sweep").exists()


def test_tpu_status_table(tmp_path, capsys):
  exp = _write_experiment(tmp_path, ROPE_LIKE)
  root = str(tmp_path / "runs")
  runs = sweep.expand(exp + ":cluener", root)
  _write_results(runs[0].workdir, status="finished", steps=100, dev={"f1": 0.5})
  _write_results(runs[1].workdir, status="preempted", steps=40)
  with open(os.path.join(runs[1].workdir, "metrics.jsonl"), "w") as f:
    f.write('{"step": 20, "split": "dev", "f1": 0.25}\n{"step": 40, "split": "train", "loss": 1.0}\n')
  os.makedirs(runs[2].workdir)
  with open(os.path.join(runs[2].workdir, "metrics.jsonl"), "w") as f:
    f.write('{"step": 7, "split": "train", "loss": 1.0}\n{"step": 8, "spl')  # a line being written
  with open(os.path.join(runs[2].workdir, "config.json"), "w") as f:
    f.write("{}")
  rows = tpu.status_rows(root, exp + ":cluener")
  assert [(r["status"], r["step"], r["dev_f1"]) for r in rows] == [
      ("finished", 100, 0.5), ("preempted", 40, 0.25), ("started", 7, None), ("not started", None, None)]
  assert sorted(r["point"] for r in tpu.status_rows(root)) == sorted(r.name for r in runs[:3])
  assert tpu.main(["status", f"--workdir={root}"]) == 0
  out = capsys.readouterr().out
  assert f"| {runs[0].name} | finished | 100 | 50.00 |" in out and f"| {runs[2].name} | started | 7 | - |" in out


def _declared_flags(module) -> list[str]:
  """The --flags a module's source declares (every add_argument call), each asserted to carry a help text."""
  import ast  # pylint: disable=g-import-not-at-top

  out = []
  for node in ast.walk(ast.parse(open(module.__file__).read())):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
      assert any(k.arg == "help" for k in node.keywords), f"{module.__name__}: {ast.unparse(node)} has no help"
      out += [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
  return out


@pytest.mark.e2e  # runs three CLIs
def test_every_cli_help_lists_its_own_flags(capsys):
  from launch import compile as compile_cli
  from launch import report, worker

  for module, commands in ((local, [[]]), (worker, [[]]), (report, [[]]), (compile_cli, [[]]),
                           (tpu, [[], ["run"], ["create"], ["watch"], ["status"]])):
    text = ""
    for command in commands:
      with pytest.raises(SystemExit) as e:
        module.main([*command, "--help"])
      assert e.value.code == 0
      text += capsys.readouterr().out
    name = module.__name__.split(".")[-1]
    assert text.startswith(f"usage: python -m launch.{name}"), text[:200]
    missing = [f for f in _declared_flags(module) if not re.search(rf"(^|[\s\[,]){re.escape(f)}\b", text)]
    assert not missing, f"{module.__name__} --help lacks {missing}"
  for args in (["launch.report"], ["launch.worker"], ["launch.tpu", "status"]):  # python -m ..., as users type it
    out = subprocess.run([sys.executable, "-m", *args, "--help"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith(f"usage: python -m {args[0]}"), out.stderr


def test_gpu_workers_each_get_their_own_gpus(tmp_path, monkeypatch, capsys):
  from launch import local

  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,3,5,6")
  args = [f"--config={ht.CONFIG_FILE}", f"--workdir={tmp_path}", "--workers=2", "--gpus_per_worker=2", "--dry_run"]
  assert local.main(args) == 0
  out = capsys.readouterr().out
  assert "  worker 0: CUDA_VISIBLE_DEVICES=0,1 " in out and "  worker 1: CUDA_VISIBLE_DEVICES=3,5 " in out
  assert local.worker_gpus(5, 1) == ["0", "1", "3", "5", "6"]
  with pytest.raises(SystemExit):
    local.main([*args[:2], "--workers=3", "--gpus_per_worker=2", "--dry_run"])
  assert "needs 6 GPUs; 5 visible (0,1,3,5,6)" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    local.main([*args[:2], "--gpus_per_worker=1", "--dry_run"])  # without --workers
  assert "--gpus_per_worker goes with --workers=N" in capsys.readouterr().err
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
  with pytest.raises(ValueError, match="0 visible"):
    local.worker_gpus(1, 1)


@pytest.mark.e2e  # a fresh interpreter: what it imports
def test_the_launchers_import_no_jax():
  """Launchers, the sweep worker and the SLURM task wrapper import jax only where a point trains: a worker with
  nothing left to run, `--help` and the attempt accounting start in a fraction of a second."""
  assert ht.jax_modules_imported_by("launch.worker", "launch.local", "launch.tpu", "launch.slurm", "launch.slurm_task",
                                    "launch.report", "launch.compile", "gp_jax.workdir", "gp_jax.models.locate") == []
