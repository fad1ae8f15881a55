"""Predict's compiles: a second call loads its programs from the persistent compilation cache that the workdir's
config names; only the length buckets the input's batches take are compiled (a file's all before its first text,
standard input's as each chunk first needs them); quiet stderr unless --verbosity is given."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests import helpers_train as ht
from tests import zygote

BUCKETS = (8, 16, 24, 32)  # the tiny model's max_len (48) is the last bucket
# Char tokenizer: one token per character, so a text of n characters is one window of length n (n <= 48).
TEXTS = ["Xyz_42", "Hello_world_4521_qq", "ab_7", "[Ab_cd_99]_zz_qwe_rty_uio_Kite_[Ab_55]_98"]
COMPILED = re.compile(r"compiled ahead: eval L(\d+) B\d+ hits \d+: [\d.]+ s \((cache hit|cache miss)\)")
TOTAL = re.compile(r"compiled ahead: \d+ programs? in ")


def _bucket(text: str, max_len: int) -> int:
  return min(b for b in (*BUCKETS, max_len) if b >= len(text))


def _workdir(src: str, dst, **config) -> str:
  """A copy of the trained workdir with BUCKETS and `config` fields set (parameters do not depend on them)."""
  shutil.copytree(src, dst)
  c = json.loads((dst / "config.json").read_text())
  c["data"]["buckets"] = list(BUCKETS)
  c.update(config)
  (dst / "config.json").write_text(json.dumps(c))
  return str(dst)


@pytest.fixture(scope="module")
def bucketed(trained_workdir, tmp_path_factory):
  workdir, _ = trained_workdir
  out = _workdir(workdir, tmp_path_factory.mktemp("bucketed") / "w")
  return out, json.loads(open(f"{out}/config.json").read())["data"]["max_len"]


def _predict(*flags, stdin: str = "", env=None, merged: bool = False) -> subprocess.CompletedProcess:
  """`python -m gp_jax.predict FLAGS`, one device; `merged`: stderr into stdout, in the order written."""
  return zygote.run([sys.executable, "-m", "gp_jax.predict", *flags], input=stdin, cwd=ht.REPO,
                    env=env or ht.subprocess_env(devices=1), text=True, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT if merged else subprocess.PIPE, timeout=180)


def _entries(folder) -> set[str]:
  return {p.name for p in folder.iterdir() if p.name.endswith("-cache")} if folder.exists() else set()


def test_second_call_loads_every_program_from_the_workdirs_cache(trained_workdir, tmp_path):
  cache = tmp_path / "cache"
  workdir = _workdir(trained_workdir[0], tmp_path / "w", compilation_cache=str(cache))
  env = ht.subprocess_env(devices=1)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the folder is the config's, nothing else
  env.pop("GP_JAX_COMPILATION_CACHE", None)
  stdin = "".join(t + "\n" for t in TEXTS)
  runs = []
  for _ in range(2):
    proc = _predict(f"--workdir={workdir}", "--verbosity=0", stdin=stdin, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs.append((proc, COMPILED.findall(proc.stderr), _entries(cache)))
  (first, compiled1, entries1), (second, compiled2, entries2) = runs
  assert compiled1 and {hit for _, hit in compiled1} == {"cache miss"}, first.stderr[-4000:]
  assert entries1  # jax wrote them into the config's folder
  assert [L for L, _ in compiled2] == [L for L, _ in compiled1]
  assert {hit for _, hit in compiled2} == {"cache hit"}, second.stderr[-4000:]
  assert entries2 == entries1  # nothing compiled the second time that the first did not write
  assert second.stdout == first.stdout and len(first.stdout.splitlines()) == len(TEXTS)


def test_a_file_compiles_the_buckets_of_all_its_batches_before_its_first_text(bucketed, tmp_path):
  workdir, max_len = bucketed
  path = tmp_path / "in.txt"
  path.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
  proc = _predict(f"--workdir={workdir}", f"--input={path}", "--batch_size=1", "--chunk_size=1", "--verbosity=0",
                  merged=True)
  assert proc.returncode == 0, proc.stdout[-4000:]
  lines = proc.stdout.splitlines()
  rows = [n for n, line in enumerate(lines) if line.startswith("{")]
  compiled = [(n, int(m.group(1))) for n, line in enumerate(lines) if (m := COMPILED.search(line))]
  assert [json.loads(lines[n])["text"] for n in rows] == TEXTS
  assert sorted(L for _, L in compiled) == sorted({_bucket(t, max_len) for t in TEXTS})
  assert len(compiled) < len(BUCKETS) + 1  # not every bucket
  assert max(n for n, _ in compiled) < rows[0]  # all of them before the first text, in one go
  assert sum(bool(TOTAL.search(line)) for line in lines) == 1
  assert not any("not compiled ahead" in line for line in lines), proc.stdout[-4000:]


def test_stdin_compiles_each_bucket_when_a_chunk_first_needs_it(bucketed):
  workdir, max_len = bucketed
  proc = _predict(f"--workdir={workdir}", "--batch_size=1", "--chunk_size=1", "--verbosity=0",
                  stdin="".join(t + "\n" for t in TEXTS), merged=True)
  assert proc.returncode == 0, proc.stdout[-4000:]
  want, seen = [], set()
  for t in TEXTS:
    if _bucket(t, max_len) not in seen:
      seen.add(_bucket(t, max_len))
      want.append(f"L{_bucket(t, max_len)}")
    want.append(t)
  got = []
  for line in proc.stdout.splitlines():
    if line.startswith("{"):
      got.append(json.loads(line)["text"])
    elif m := COMPILED.search(line):
      got.append(f"L{m.group(1)}")
  assert got == want, proc.stdout[-4000:]


def test_split_compiles_the_buckets_of_its_chunks_ahead(bucketed):
  from gp_jax import predict

  workdir, max_len = bucketed
  chunk = 7
  proc = _predict(f"--workdir={workdir}", "--split=test", f"--chunk_size={chunk}", "--verbosity=0", merged=True)
  assert proc.returncode == 0, proc.stdout[-4000:]
  lines = proc.stdout.splitlines()
  rows = [n for n, line in enumerate(lines) if line.startswith("{")]
  compiled = [(n, int(m.group(1))) for n, line in enumerate(lines) if (m := COMPILED.search(line))]
  assert rows and compiled and max(n for n, _ in compiled) < rows[0]
  # A chunk of 7 texts is one batch (eval_batch_size 64 windows), as long as its longest window (<= max_len).
  texts = [r["text"] for r in predict._split_records(workdir, "test")]
  want = {_bucket("x" * min(max_len, max(map(len, texts[i:i + chunk]))), max_len) for i in range(0, len(texts), chunk)}
  assert sorted(L for _, L in compiled) == sorted(want)
  assert sum(bool(TOTAL.search(line)) for line in lines) == 1
  assert not any("not compiled ahead" in line for line in lines), proc.stdout[-4000:]


def test_quiet_unless_verbosity_is_given(bucketed):
  workdir, _ = bucketed
  quiet = _predict(f"--workdir={workdir}", stdin=TEXTS[0] + "\n")
  loud = _predict(f"--workdir={workdir}", "-v", "0", stdin=TEXTS[0] + "\n")
  for proc in (quiet, loud):
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [json.loads(line)["text"] for line in proc.stdout.splitlines()] == [TEXTS[0]]  # stdout: JSON lines only
  assert quiet.stderr == "", quiet.stderr[-4000:]
  assert COMPILED.search(loud.stderr) and "orbax" in loud.stderr.lower(), loud.stderr[-4000:]
