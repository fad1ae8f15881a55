"""Predict with a trained workdir: the Predictor API and the CLI (stdin -> JSON lines), sliding windows, empty lines."""

import json
import subprocess
import sys


from gp_jax import predict
from gp_jax.data import windows
from tests import helpers_train as ht
from tests import zygote

BASE = "abc_[12_Xyz]_qq_777"
BASE_ENTITIES = [(4, 12, "BOX", "[12_Xyz]"), (5, 7, "NUM", "12"), (8, 11, "CAP", "Xyz"), (16, 19, "NUM", "777")]
# Longer than max_len (48 chars = 48 tokens): plain words, then entities near the end.
FILLER = "_".join(["zz", "qwe", "rty", "uio", "pas", "dfg", "hjk", "lzx", "cvb", "nmq", "wer", "tyu", "iop", "asd"] * 2)
LONG = FILLER + "_Kite_[Ab_55]_9876"
_T = len(FILLER) + 1
LONG_ENTITIES = [(_T, _T + 4, "CAP", "Kite"), (_T + 5, _T + 12, "BOX", "[Ab_55]"), (_T + 6, _T + 8, "CAP", "Ab"),
                 (_T + 9, _T + 11, "NUM", "55"), (_T + 13, _T + 17, "NUM", "9876")]
CASES = [
    (BASE, BASE_ENTITIES),
    ("", []),
    ("Hello_world_4521", [(0, 5, "CAP", "Hello"), (12, 16, "NUM", "4521")]),
    ("[Ab_cd_99]", [(0, 10, "BOX", "[Ab_cd_99]"), (1, 3, "CAP", "Ab"), (7, 9, "NUM", "99")]),
    (LONG, LONG_ENTITIES),
    ("just_plain_words", []),
]


def _triples(entities):
  return sorted((e["start"], e["end"], e["type"], e["text"]) for e in entities)


def _check(texts, results):
  assert len(results) == len(texts)
  for (text, want), got in zip(CASES, results):
    assert _triples(got) == sorted(want), text
    for e in got:
      assert text[e["start"]:e["end"]] == e["text"] and e["score"] > 0


def test_predictor_api(trained_workdir):
  workdir, summary = trained_workdir
  p = predict.Predictor(workdir)
  assert p.step == summary["best_step"]  # the best checkpoint by dev F1
  assert p.config.data.max_len == 48 < len(LONG)
  # The long text really goes through several windows, and its entities sit in the last one.
  prepared = windows.prepare_split([{"id": "x", "text": LONG, "entities": []}], p.tokenizer, types=p.types,
                                    max_len=p.config.data.max_len, stride=p.config.data.stride or None)
  assert prepared.num_windows >= 3
  texts = [t for t, _ in CASES]
  rows = p.predict(texts)
  assert [set(r) for r in rows] == [{"entities"}] * len(texts)  # records with the entity task's one field
  _check(texts, [r["entities"] for r in rows])
  assert p.predict([]) == []
  assert p.predict([""]) == [{"entities": []}]


def test_cli_stdin_to_json_lines(trained_workdir):
  workdir, _ = trained_workdir
  texts = [t for t, _ in CASES]
  proc = zygote.run([sys.executable, "-m", "gp_jax.predict", f"--workdir={workdir}", "--batch_size=4"],
                    input="".join(t + "\n" for t in texts), cwd=ht.REPO, env=ht.subprocess_env(devices=1),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = proc.stdout.splitlines()
  assert len(lines) == len(texts), proc.stdout
  rows = [json.loads(line) for line in lines]
  assert [r["text"] for r in rows] == texts
  _check(texts, [r["entities"] for r in rows])


def test_cblue_in_cmeee_and_cluener_out(trained_workdir, tmp_path):
  """CMeEE test file in (streamed), the CMeEE and CLUENER submissions out: same records, order and spans."""
  import io

  workdir, _ = trained_workdir
  p = predict.Predictor(workdir)
  records = [{"text": text, "entities": [], "source": n} for n, (text, _) in enumerate(CASES)]
  path = tmp_path / "CMeEE_test.json"
  path.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
  with open(path, encoding="utf-8") as f:
    rows = list(predict.predict_stream(p, predict.read_cblue(f, source=str(path)), chunk_size=2))
  cmeee, cluener = io.StringIO(), io.StringIO()
  predict.write_cmeee(cmeee, rows)
  predict.write_cluener(cluener, rows)
  got = json.loads(cmeee.getvalue())
  assert [r["source"] for r in got] == list(range(len(CASES)))  # same count and order, other keys kept
  lines = [json.loads(line) for line in cluener.getvalue().splitlines()]
  assert [x["id"] for x in lines] == list(range(len(CASES)))
  for (text, want), rec, line in zip(CASES, got, lines):
    want = sorted((s, e - 1, t, m) for s, e, t, m in want)
    assert sorted((e["start_idx"], e["end_idx"], e["type"], e["entity"]) for e in rec["entities"]) == want
    assert sorted((s, e, t, m) for t, ms in line["label"].items() for m, ses in ms.items() for s, e in ses) == want
    assert line["label"] or not want
