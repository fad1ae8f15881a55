"""Records for a training config: corpora, user files, or synthetic tasks (nested spans; pairs told by distance)."""

from __future__ import annotations

import logging
import os
import random
import string

from gp_jax.data import events as events_lib
from gp_jax.data.cblue import read_cblue
from gp_jax.data.corpora import corpus_types, load_split
from gp_jax.data.readers import DataError, read_conll, read_jsonl
from gp_jax.data.relations import OBJECT, ROLES, SUBJECT, read_casrel
from gp_jax.data.synthetic_events import EVENT_ROLES, EVENT_VERBS, event_records
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


DISTANCE_TYPES = ("SPAN",)
DISTANCE_LENGTHS = range(9, 13)  # entity length in characters, brackets included
DISTANCE_GAPS = range(2, 6)  # letters between two entities
DISTANCE_FILLER = string.ascii_lowercase


def distance_records(n: int, *, seed: int, prefix: str = "dist") -> list[Record]:
  """Random letters holding one to three "[...]" entities: only the distance between brackets says which pairs are.

  An entity runs from a "[" to the "]" 8-11 characters later (DISTANCE_LENGTHS); every other "]" after that "["
  is at least 2 * 9 + 2 - 1 = 19 characters away. Inside and outside the brackets are the same uniform random
  letters, and 8 characters are more than a small char CNN sees around a bracket, so a span score q_i . k_j
  without RoPE cannot tell an entity from a cross pair ("[" of one entity, "]" of a later one); with RoPE it
  depends on j - i and can.
  """
  rng = random.Random(seed)
  records = []

  def letters(k):
    return "".join(rng.choice(DISTANCE_FILLER) for _ in range(k))

  for r in range(n):
    text, ents = letters(rng.randint(1, 4)), []
    for k in range(rng.randint(1, 3)):
      if k:
        text += letters(rng.choice(DISTANCE_GAPS))
      length = rng.choice(DISTANCE_LENGTHS)
      ents.append({"start": len(text), "end": len(text) + length, "type": DISTANCE_TYPES[0]})
      text += "[" + letters(length - 2) + "]"
    text += letters(rng.randint(1, 4))
    records.append({"id": f"{prefix}-{r}", "text": text, "entities": ents})
  return records


RELATION_ENTITY_TYPES = ("LOC", "ORG", "PER")
SYNTHETIC_RELATIONS = ("lives_in", "works_at")


def relation_records(n: int, *, seed: int, prefix: str = "rel") -> list[Record]:
  """Short texts of clauses with typed entities and relations (task=relations): a person (PER, "Abc") who
  "_lives_in_" a place (LOC, "XYZ") or "_works_at_" an organisation (ORG, "#abc"), or "_naps" (no relation).

  One to three clauses joined by "_and_"; a clause may reuse the previous clause's person (a single entity
  overlap). Relation types SYNTHETIC_RELATIONS; words joined with "_" as in `synthetic_records`.
  """
  rng = random.Random(seed)
  records = []

  def letters(k, alphabet=string.ascii_lowercase):
    return "".join(rng.choice(alphabet) for _ in range(k))

  for r in range(n):
    text, ents, rels = "", [], []

    def add(piece, etype=None):
      nonlocal text
      start = len(text)
      text += piece
      if etype is None:
        return None
      ents.append({"start": start, "end": len(text), "type": etype})
      return len(ents) - 1

    person = None
    for k in range(rng.randint(1, 3)):
      if k:
        add("_and_")
      if person is not None and rng.random() < 0.4:
        add("she")
      else:
        person = add(letters(1, string.ascii_uppercase) + letters(rng.randint(1, 3)), "PER")
      kind = rng.random()
      if kind < 0.4:
        add("_lives_in_")
        rels.append({"head": person, "tail": add(letters(rng.randint(2, 4), string.ascii_uppercase), "LOC"),
                     "type": "lives_in"})
      elif kind < 0.8:
        add("_works_at_")
        rels.append({"head": person, "tail": add("#" + letters(rng.randint(2, 3)), "ORG"), "type": "works_at"})
      else:
        add("_naps")
    records.append({"id": f"{prefix}-{r}", "text": text, "entities": ents, "relations": rels})
  return records


# data.name -> (generator(n, seed=, prefix=), entity types); data.synthetic_records sets the training size.
SYNTHETIC_CORPORA = {
    "synthetic": (synthetic_records, SYNTHETIC_TYPES),
    "synthetic_distance": (distance_records, DISTANCE_TYPES),
    "synthetic_relations": (relation_records, RELATION_ENTITY_TYPES),
    "synthetic_events": (event_records, tuple(sorted(events_lib.event_class(t, r) for t in EVENT_VERBS
                                                     for r in (events_lib.TRIGGER, *EVENT_ROLES)))),
}


def _split_off(records: list[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
  order = list(range(len(records)))
  random.Random(seed).shuffle(order)
  n_dev = max(1, int(round(len(records) * fraction))) if records else 0
  dev_ids = set(order[:n_dev])
  return [r for i, r in enumerate(records) if i not in dev_ids], [r for i, r in enumerate(records) if i in dev_ids]


HOLDOUT = "holdout"  # data.dev_split value: carve data.dev_fraction out of the corpus' training split
USER_FORMATS = ("jsonl", "conll", "cblue", "casrel")  # data.name values that read data.train_file/dev_file/test_file


def read_user_file(data_cfg, path) -> list[Record]:
  """One jsonl/conll/cblue file as the config says (conll: scheme, tag columns, joiner; strictness).

  The list is a `readers.Records`, whose `report` says what the read kept and skipped."""
  if os.path.isdir(path):
    raise DataError(path, None, f"is a folder, not a file: give data.{_file_field(data_cfg, path)} a "
                    f"{data_cfg.name} file", reason="not_a_file")
  if not os.path.isfile(path):
    raise DataError(path, None, f"no such file (data.name={data_cfg.name})", reason="missing_file")
  if data_cfg.name == "cblue":
    return read_cblue(path, strict=data_cfg.strict, allow_unlabelled=path == data_cfg.test_file)
  if data_cfg.name == "casrel":
    return read_casrel(path, strict=data_cfg.strict, allow_unlabelled=path == data_cfg.test_file)
  if data_cfg.name == "jsonl":
    return read_jsonl(path, strict=data_cfg.strict)
  tag_cols = tuple(int(c) for c in data_cfg.conll_tag_cols) or None  # () = the last column
  return read_conll(path, scheme=data_cfg.conll_scheme or None, strict=data_cfg.strict, tag_cols=tag_cols,
                    joiner=data_cfg.conll_joiner)


# What a user file of each format holds, for messages.
FORMAT_EXPECTED = {
    "jsonl": ('one JSON object {"text", "entities"} per line (or {"text", "events": [{"type", "trigger": {"start", '
              '"end"} | null, "arguments": [{"start", "end", "role"}]}]} for task=events)'),
    "conll": "one token and its tag per line, a blank line between sentences",
    "cblue": 'a JSON array of records [{"text", "entities"}, ...]',
    "casrel": 'a JSON array of records [{"text", "triple_list": [[subject, relation, object], ...]}, ...]',
}


def _file_field(data_cfg, path) -> str:
  """Which of data.train_file / dev_file / test_file names `path` (for messages)."""
  return next((k for k in ("train_file", "dev_file", "test_file") if data_cfg.get(k) == path), "train_file")


def empty_file_error(data_cfg, path, records) -> DataError:
  """Why a user file (data.train_file, dev_file or test_file) gave no records (empty, all skipped, or, for the
  training file, too few to hold out a dev split)."""
  report = getattr(records, "report", None)
  expected = f"expected {FORMAT_EXPECTED[data_cfg.name]}"
  if report is not None and report.num_skipped:
    return DataError(path, None, f"all {report.num_skipped} records were skipped {dict(report.skipped)} "
                     f"(data.strict=False; the first: {report.errors[0] if report.errors else '?'}): {expected}",
                     reason="empty_split")
  if not records:
    size = os.path.getsize(path)
    what = "is empty (0 bytes)" if not size else f"holds no records ({size} bytes)"
    return DataError(path, None, f"{what}: {expected}; is data.{_file_field(data_cfg, path)} the file you meant?",
                     reason="empty_split")
  return DataError(path, None, f"{len(records)} record(s), all held out as dev (no data.dev_file; "
                   f"data.dev_fraction={data_cfg.dev_fraction}): give data.dev_file or more training records",
                   reason="empty_split")


def _union_types(kind: str, splits: dict[str, list[Record]], types_of) -> list[str]:
  """Sorted union of `types_of(record)` over the splits; warns about types train lacks."""
  seen = {split: {t for r in recs for t in types_of(r)} for split, recs in splits.items()}
  types = sorted(set().union(*seen.values()))
  missing = [t for t in types if t not in seen["train"]]
  if missing:
    where = {t: [s for s in ("dev", "test") if t in seen[s]] for t in missing}
    log.warning("%s types absent from train (never trained, their F1 is 0): %s", kind, where)
  return types


def user_types(*, train: list[Record], dev: list[Record], test: list[Record]) -> list[str]:
  """Sorted union of the entity types of every labelled split; warns about types train lacks."""
  return _union_types("Entity", {"train": train, "dev": dev, "test": test},
                      lambda r: (e["type"] for e in r["entities"]))


def relation_types(*, train: list[Record], dev: list[Record], test: list[Record]) -> list[str]:
  """Sorted union of the relation types of every labelled split (records' "relations"; unlabelled splits have
  none), as `user_types` is for entity types; warns about types train lacks."""
  return _union_types("Relation", {"train": train, "dev": dev, "test": test},
                      lambda r: (x["type"] for x in r.get("relations", ())))


CASREL_FORMATS = ("casrel", "webnlg_star")  # corpora of triples: entity types are the roles, triples are strings
MATCH_FORMS = ("string", "boundaries")  # how predictions are matched to gold for the selection F1


def conventions(data_cfg) -> dict:
  """What the corpus implies, decided once here: {"roles": (subject type, object type) or None, "match": "string" |
  "boundaries"}. CasRel-format corpora: the roles ("subject", "object") and the string form (as their published
  tables compare); other corpora: none and boundaries, unless `data.roles` / `data.match` state them."""
  casrel = data_cfg.name in CASREL_FORMATS
  roles = str(data_cfg.get("roles", "") or "")
  roles = tuple(x.strip() for x in roles.split(",")) if roles else ((SUBJECT, OBJECT) if casrel else None)
  if roles is not None and (len(roles) != 2 or not all(roles) or roles[0] == roles[1]):
    raise UserError(f"data.roles={data_cfg.roles!r}: expected two entity types, the subject's then the object's "
                    '(e.g. "subject,object")')
  match = str(data_cfg.get("match", "") or "") or ("string" if casrel else "boundaries")
  if match not in MATCH_FORMS:
    raise UserError(f"data.match={match!r}: expected one of {MATCH_FORMS} (or \"\": the corpus's)")
  return {"roles": roles, "match": match}


def record_cap(data_cfg, key: str) -> int:
  """`data.<key>` (max_train_records, max_eval_records): 0 keeps every record, N > 0 the first N; else a UserError."""
  value = data_cfg.get(key, 0)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
    raise UserError(f"data.{key}={value!r}: expected an integer >= 0 (0 = every record; N = the first N)")
  return int(value)


def cap_records(splits: dict[str, list[Record]], caps: dict[str, tuple[str, int]]) -> tuple[dict, list[str]]:
  """(each split cut to its cap, one note per split the cap cut: how many of how many it kept and dropped).
  `caps`: split -> (config key, cap; 0 = none)."""
  out, notes = {}, []
  for split, records in splits.items():
    key, cap = caps[split]
    out[split] = records[:cap] if cap else records
    if len(out[split]) < len(records):
      notes.append(f"{split}: first {cap} of {len(records)} ({len(records) - cap} dropped by data.{key})")
  return out, notes


def load_records(data_cfg, *, seed: int = 0):
  """Returns (train, dev, test, types); test is [] when the config has none. The log line names what the record caps
  (data.max_train_records, data.max_eval_records) dropped."""
  name = data_cfg.name
  caps = {"train": ("max_train_records", record_cap(data_cfg, "max_train_records"))}
  caps["dev"] = caps["test"] = ("max_eval_records", record_cap(data_cfg, "max_eval_records"))
  if name in SYNTHETIC_CORPORA:
    train, dev, test, types, origin = _synthetic_records(data_cfg, seed)
  elif name in USER_FORMATS:
    train, dev, test, types, origin = _user_file_records(data_cfg)
  else:
    train, dev, test, types, origin = _corpus_records(data_cfg)
  kept, cut = cap_records({"train": train, "dev": dev, "test": test}, caps)
  train, dev, test = kept["train"], kept["dev"], kept["test"]
  if events_lib.has_events(train):  # the span classes are the "type:role" pairs; records in span form (entities)
    types = list(events_lib.event_classes(train=train, dev=dev, test=test))
    train, dev, test = (events_lib.as_span_records(x, types) for x in (train, dev, test))
  if not train:  # a corpus split all held out as dev
    raise UserError(f"data.name={name!r}: no training records left after data.dev_split={data_cfg.dev_split!r} "
                    f"({origin}): expected at least one")
  log.info("Data %s: %d train / %d dev / %d test records, %d types %s; %s%s", name, len(train), len(dev), len(test),
           len(types), types, origin, f"; capped: {', '.join(cut)}" if cut else "")
  return train, dev, test, types


def _synthetic_records(data_cfg, seed: int):
  name = data_cfg.name
  make, types = SYNTHETIC_CORPORA[name]
  n = int(data_cfg.synthetic_records)
  if n < 1:
    raise UserError(f"data.synthetic_records={n}: expected at least 1 training record for data.name={name!r}")
  train = make(n, seed=seed, prefix="train")
  dev = make(max(1, n // 4), seed=seed + 1, prefix="dev")
  test = make(max(1, n // 4), seed=seed + 2, prefix="test")
  return train, dev, test, list(types), f"generated ({name}, data.synthetic_records={n}, seed {seed})"


def _user_file_records(data_cfg):
  name = data_cfg.name
  if not data_cfg.train_file:
    raise UserError(f"data.name={name!r} needs data.train_file")
  read = _nonempty_file(data_cfg, data_cfg.train_file)
  train = list(read)
  if data_cfg.dev_file:
    dev = list(_nonempty_file(data_cfg, data_cfg.dev_file))
  else:
    train, dev = _split_off(train, data_cfg.dev_fraction, seed=1234)
    log.info("No dev_file: %d training records held out as dev (fraction %.3f)", len(dev), data_cfg.dev_fraction)
    if not train:
      raise empty_file_error(data_cfg, data_cfg.train_file, read)
  test = list(_nonempty_file(data_cfg, data_cfg.test_file)) if data_cfg.test_file else []
  # A CasRel file's entity types are the roles, subject first (ids 0 and 1, as `conventions` names them).
  types = list(ROLES) if name == "casrel" else user_types(train=train, dev=dev, test=test)
  origin = "train from " + data_cfg.train_file + (f", dev from {data_cfg.dev_file}" if data_cfg.dev_file else
                                                   ", dev held out of it")
  origin += f", test from {data_cfg.test_file}" if data_cfg.test_file else ""
  return train, dev, test, types, origin


def _nonempty_file(data_cfg, path) -> list[Record]:
  """A user file's records (a `readers.Records`); one that gives none (empty, blank, all skipped) is refused, the
  dev and test files as the training file: a run without its dev or test evaluation is not what a user who named
  the file meant."""
  read = read_user_file(data_cfg, path)
  if not read:
    raise empty_file_error(data_cfg, path, read)
  return read


def _corpus_records(data_cfg):
  name = data_cfg.name
  kw = dict(manual_dir=data_cfg.manual_dir or None, data_dir=data_cfg.tfds_dir or None)
  source = load_split(name, data_cfg.train_split, **kw)
  origin = source.origin()
  train = list(source)
  if not train:
    raise UserError(f"corpus {name}: its {data_cfg.train_split!r} split has no records ({origin}): expected "
                    "a training split; delete that TFDS folder to rebuild it from its files")
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
  return train, dev, test, list(corpus_types(name)), origin
