"""`python -m gp_jax.configs`: every --config field of gp_jax/configs/base.py with its default and its comment."""

import os
import re
import subprocess
import sys

import ml_collections
import pytest

from gp_jax.configs import __main__ as fields_cli
from gp_jax.configs import base

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _leaves(config, prefix=""):
  for k, v in config.items():
    if isinstance(v, ml_collections.ConfigDict):
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def _source_comment(key: str) -> str | None:
  """The comment on the line of base.py that first assigns `c.<key>` (read here with a regex, not the CLI's parser)."""
  pattern = re.compile(rf"^\s*c\.{re.escape(key)}\s*=[^#]*#\s*(.*?)\s*$")
  with open(base.__file__, encoding="utf-8") as f:
    for line in f:
      if re.match(rf"^\s*c\.{re.escape(key)}\s*=", line):
        m = pattern.match(line)
        return m.group(1) if m else None
  return None


def test_every_leaf_field_is_listed_with_its_default_and_comment(capsys):
  assert fields_cli.main([]) == 0
  lines = capsys.readouterr().out.splitlines()
  by_key = {}
  for line in lines:
    m = re.match(r"^  --config\.(\S+)\s{2,}(.*)$", line)
    if m:
      by_key[m.group(1)] = m.group(2)
  leaves = dict(_leaves(base.get_config()))
  assert sorted(by_key) == sorted(leaves)
  no_comment = []
  for key, default in leaves.items():
    rest = by_key[key]
    assert rest.startswith(repr(default)), (key, rest)
    comment = _source_comment(key)
    if not comment:
      no_comment.append(key)
    else:
      assert rest.endswith(comment), (key, rest, comment)
  assert not no_comment, f"fields of gp_jax/configs/base.py without a one-line comment: {no_comment}"


@pytest.mark.e2e  # runs python -m gp_jax.configs
def test_bert_defaults_and_an_experiments_values():
  text = "\n".join(fields_cli.listing())
  bert = base.get_config(encoder="bert")
  assert re.search(rf"--config\.optimizer\.lr\s+{re.escape(repr(base.get_config().optimizer.lr))} "
                   rf"\(bert: {re.escape(repr(bert.optimizer.lr))}\)", text)
  out = subprocess.run([sys.executable, "-m", "gp_jax.configs", "experiments/rope_ablation.py:dataset=msra"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  line = next(ln for ln in out.stdout.splitlines() if ln.startswith("  --config.model.hidden_size "))
  assert re.search(r"\s128 \*  \(default 256\)\s", line), line
  line = next(ln for ln in out.stdout.splitlines() if ln.startswith("  --config.seed "))
  assert "*" not in line
  missing = subprocess.run([sys.executable, "-m", "gp_jax.configs", "nope.py"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
  assert missing.returncode == 2 and missing.stderr.startswith("error: no experiment file ")
  assert missing.stderr.count("\n") == 1


def test_comments_come_from_the_source():
  source = ("def get_config(arg=None):\n  a = 1\n  c = ml_collections.ConfigDict()\n  c.x = 1  # the x\n"
            "  c.g = ml_collections.ConfigDict()  # a group\n  c.g.y = (1,\n         2)  # y, two lines\n"
            "  c.z = 3\n  if a:\n    c.x = 2  # not this one\n  return c\n")
  assert fields_cli.source_comments(source) == {"x": "the x", "g": "a group", "g.y": "y, two lines", "z": ""}
