import json
import os
import subprocess
import sys

import pytest

from gp_jax.configs import base
from gp_jax.configs.args import parse_arg
from launch import report, sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(REPO, "experiments")) if f.endswith(".py") and not f.startswith("_")))
def test_every_experiment_builds_and_sweeps(name):
  module = sweep.load_module(os.path.join(REPO, "experiments", name))
  config = module.get_config(None)
  assert config.model.head in ("standard", "efficient")
  for overrides in module.get_sweep():
    for key in overrides:
      node = config
      parts = key.split(".")[1:]
      for p in parts[:-1]:
        node = node[p]
      assert parts[-1] in node, f"{name}: sweep key {key} is not a config field"


def test_sweep_expansion_and_report(tmp_path):
  runs = sweep.expand(os.path.join(REPO, "experiments", "msra_scratch.py"), str(tmp_path))
  assert len(runs) == 4 and len({r.workdir for r in runs}) == 4
  assert any("--config.model.use_rope=False" in r.argv for r in runs)
  os.makedirs(runs[0].workdir)
  with open(os.path.join(runs[0].workdir, "results.json"), "w") as f:
    json.dump({"steps": 10, "dev": {"f1": 0.5}, "test": {"f1": 0.25}, "wall_minutes": 1.0}, f)
  table = report.markdown_table(report.collect(str(tmp_path)))
  assert "0.2500" in table and "0.5000" in table


def test_cli_help():
  for mod in ("launch.local", "launch.tpu", "launch.report"):
    out = subprocess.run([sys.executable, "-m", mod, "--help"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "usage" in out.stdout.lower()
