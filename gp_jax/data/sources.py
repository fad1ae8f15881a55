"""Records for a training config: corpora, user files, or a synthetic nested-span task."""

from __future__ import annotations

import logging
import os
import random
import string

from gp_jax.data.cblue import read_cblue
from gp_jax.data.corpora import corpus_types, load_split
from gp_jax.data.readers import DataError, read_conll, read_jsonl
from gp_jax.data.types import Record
from gp_jax.errors import UserError

log = logging.getLogger(__name__)

SYNTHETIC_TYPES = ("BOX", "NUM", "CAP")


def synthetic_records(n: int, *, seed: int, prefix: str = "syn") -> list[Record]:
  """Short texts with nested spans: BOX = "[...]" that may hold NUM (digits) and CAP (capitalised words).

  Words are joined with "_" (not spaces) so that a tokenizer that drops whitespace still sees the boundaries.
  """
  rng = random.Random(seed)
  records = []

  def word():
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 5)))

  for r in range(n):
    text, ents = "", []

    def add(piece, etype=None):
      nonlocal text
      start = len(text)
      text += piece
      if etype:
        ents.append({"start": start, "end": len(text), "type": etype})
      return start

    for _ in range(rng.randint(2, 6)):
      if text:
        add("_")
      kind = rng.random()
      if kind < 0.2:
        add(str(rng.randint(10, 99999)), "NUM")
      elif kind < 0.35:
        add(word().capitalize(), "CAP")
      elif kind < 0.55:
        start = add("[")
        for k in range(rng.randint(1, 3)):
          if k:
            add("_")
          inner = rng.random()
          if inner < 0.4:
            add(str(rng.randint(10, 999)), "NUM")
          elif inner < 0.6:
            add(word().capitalize(), "CAP")
          else:
            add(word())
        add("]")
        ents.append({"start": start, "end": len(text), "type": "BOX"})
      else:
        add(word())
    records.append({"id": f"{prefix}-{r}", "text": text, "entities": sorted(ents, key=lambda e: (e["start"], e["end"]))})
  return records


def _split_off(records: list[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
  order = list(range(len(records)))
  random.Random(seed).shuffle(order)
  n_dev = max(1, int(round(len(records) * fraction))) if records else 0
  dev_ids = set(order[:n_dev])
  return [r for i, r in enumerate(records) if i not in dev_ids], [r for i, r in enumerate(records) if i in dev_ids]


HOLDOUT = "holdout"  # data.dev_split value: carve data.dev_fraction out of the corpus' training split
USER_FORMATS = ("jsonl", "conll", "cblue")  # data.name values that read data.train_file/dev_file/test_file


def read_user_file(data_cfg, path) -> list[Record]:
  """One jsonl/conll/cblue file as the config says (conll: scheme, tag columns, joiner; strictness)."""
  if not os.path.isfile(path):
    raise DataError(path, None, f"no such file (data.name={data_cfg.name})", reason="missing_file")
  if data_cfg.name == "cblue":
    return list(read_cblue(path, strict=data_cfg.strict, allow_unlabelled=path == data_cfg.test_file))
  if data_cfg.name == "jsonl":
    return list(read_jsonl(path, strict=data_cfg.strict))
  tag_cols = tuple(int(c) for c in data_cfg.conll_tag_cols) or None  # () = the last column
  return list(read_conll(path, scheme=data_cfg.conll_scheme or None, strict=data_cfg.strict, tag_cols=tag_cols,
                         joiner=data_cfg.conll_joiner))


def user_types(*, train: list[Record], dev: list[Record], test: list[Record]) -> list[str]:
  """Sorted union of the entity types of every labelled split; warns about types train lacks."""
  seen = {split: {e["type"] for r in recs for e in r["entities"]}
          for split, recs in (("train", train), ("dev", dev), ("test", test))}
  types = sorted(set().union(*seen.values()))
  missing = [t for t in types if t not in seen["train"]]
  if missing:
    where = {t: [s for s in ("dev", "test") if t in seen[s]] for t in missing}
    log.warning("Entity types absent from train (never trained, their F1 is 0): %s", where)
  return types


def load_records(data_cfg, *, seed: int = 0):
  """Returns (train, dev, test, types); test is [] when the config has none."""
  name = data_cfg.name
  if name == "synthetic":
    n = int(data_cfg.synthetic_records)
    train = synthetic_records(n, seed=seed, prefix="train")
    dev = synthetic_records(max(1, n // 4), seed=seed + 1, prefix="dev")
    test = synthetic_records(max(1, n // 4), seed=seed + 2, prefix="test")
    types = list(SYNTHETIC_TYPES)
  elif name in USER_FORMATS:
    if not data_cfg.train_file:
      raise UserError(f"data.name={name!r} needs data.train_file")
    train = read_user_file(data_cfg, data_cfg.train_file)
    if data_cfg.dev_file:
      dev = read_user_file(data_cfg, data_cfg.dev_file)
    else:
      train, dev = _split_off(train, data_cfg.dev_fraction, seed=1234)
      log.info("No dev_file: %d training records held out as dev (fraction %.3f)", len(dev), data_cfg.dev_fraction)
    test = read_user_file(data_cfg, data_cfg.test_file) if data_cfg.test_file else []
    types = user_types(train=train, dev=dev, test=test)
  else:
    kw = dict(manual_dir=data_cfg.manual_dir or None, data_dir=data_cfg.tfds_dir or None)
    train = list(load_split(name, data_cfg.train_split, **kw))
    if data_cfg.dev_split == HOLDOUT:
      train, dev = _split_off(train, data_cfg.dev_fraction, seed=1234)
      log.info("dev_split=holdout: %d of the %r split's records held out as dev (fraction %.3f)", len(dev),
               data_cfg.train_split, data_cfg.dev_fraction)
    else:
      dev = list(load_split(name, data_cfg.dev_split, **kw)) if data_cfg.dev_split else []
    test = list(load_split(name, data_cfg.test_split, **kw)) if data_cfg.test_split else []
    if data_cfg.test_split and data_cfg.test_split == data_cfg.train_split:
      raise UserError(f"data.test_split={data_cfg.test_split!r} is also the training split: test figures would "
                      "be measured on training data")
    types = list(corpus_types(name))
  if data_cfg.max_train_records:
    train = train[: data_cfg.max_train_records]
  if data_cfg.max_eval_records:
    dev, test = dev[: data_cfg.max_eval_records], test[: data_cfg.max_eval_records]
  if not train:
    raise UserError(f"data.name={name!r}: the training split is empty")
  log.info("Data %s: %d train / %d dev / %d test records, %d types %s", name, len(train), len(dev), len(test),
           len(types), types)
  return train, dev, test, types
