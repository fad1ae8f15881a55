"""The task seam (gp_jax.tasks): relation batch targets against a plain-Python construction from the records; the
relation task's host path (window hits -> records -> triple P/R/F1) on gold hits; the seam's choices."""

from __future__ import annotations

import numpy as np
import pytest

from gp_jax import aot, factory, tasks
from gp_jax.data import batching, windows
from gp_jax.data.sources import relation_records, relation_types
from gp_jax.errors import UserError
from gp_jax.evaluate import model_batch
from gp_jax.metrics import triple_prf
from tests import helpers_train as ht
from tests.data.fakes import CharTok

TYPES = ("LOC", "ORG", "PER")


def records(n=40, seed=3):
  recs = relation_records(n, seed=seed, prefix="t")
  # A repeated triple and an entity pair holding two relations (EPO).
  recs.append({"id": "epo", "text": "Ab_lives_in_XY", "entities": [
      {"start": 0, "end": 2, "type": "PER"}, {"start": 12, "end": 14, "type": "LOC"}],
               "relations": [{"head": 0, "tail": 1, "type": "lives_in"}, {"head": 0, "tail": 1, "type": "works_at"},
                             {"head": 0, "tail": 1, "type": "lives_in"}]})
  return recs


def prepare(recs, max_len):
  task = tasks.get("relations")()
  rel = relation_types(train=recs, dev=[], test=[])
  return task, task.prepare(recs, CharTok(), list(TYPES), rel, name="t", max_len=max_len, stride=8)


def target_batches(p, task, batch_size, buckets):
  """Training batches (the task's targets) of every window in order."""
  assemble = batching._Assembler(p, buckets, batch_size, 0, 1, targets=task.batch_targets)
  return [assemble(win_B) for win_B in batching._to_batches(np.arange(p.num_windows), batch_size)]


def reference_targets(recs, p, L):
  """{(window, name, relation type): set of flat ids} from the records alone: a window holds a relation when both
  entities lie inside its content tokens; cells (subject start, object start) and (subject end, object end)."""
  tok = CharTok()
  out = {}
  for w in range(p.num_windows):
    r = int(p.window_record[w])
    rec = recs[r]
    offsets = tok.encode(rec["text"]).offsets
    start, width = int(p.window_start[w]), int(p.window_content_len[w])

    def token(char, side):
      col = 0 if side == "start" else 1
      return [i for i, o in enumerate(offsets.tolist()) if o[col] == char][0]

    for rel in rec["relations"]:
      s, o = rec["entities"][rel["head"]], rec["entities"][rel["tail"]]
      cells = [(token(e["start"], "start"), token(e["end"], "end")) for e in (s, o)]
      if not all(start <= a and b < start + width for a, b in cells):
        continue
      (ss, se), (os_, oe) = [(a - start + tok.num_prefix, b - start + tok.num_prefix) for a, b in cells]
      out.setdefault((w, "head_ids", rel["type"]), set()).add(ss * L + os_)
      out.setdefault((w, "tail_ids", rel["type"]), set()).add(se * L + oe)
  return out


@pytest.mark.parametrize("max_len", [64, 24])  # 24: records cut into several windows, some relations split
def test_relation_targets_match_a_plain_python_construction(max_len):
  recs = records()
  task, p = prepare(recs, max_len)
  if max_len == 24:
    assert p.table.stats["relations_split"] > 0 and p.stats.split_records > 0
  rel_types = p.table.types
  got_any = 0
  entity_it = target_batches(p, tasks.get("entities")(), 8, (16,))
  rel_it = target_batches(p, task, 8, (16,))
  assert len(entity_it) == len(rel_it) > 1
  for ent_batch, batch in zip(entity_it, rel_it):
    L = batch["attention_mask"].shape[1]
    want = reference_targets(recs, p, L)
    assert "span_ids" not in batch
    np.testing.assert_array_equal(batch["entity_ids"], ent_batch["span_ids"])  # the entity pointer's targets
    for name in ("head_ids", "tail_ids"):
      ids = batch[name]
      assert ids.dtype == np.int32 and ids.shape == (8, len(rel_types), L)
      for row, w in enumerate(batch["window_index"].tolist()):
        for k, rtype in enumerate(rel_types):
          cell = ids[row, k]
          n = int((cell >= 0).sum())
          assert (cell[:n] >= 0).all() and (cell[n:] == -1).all()  # ids first, then -1
          expect = want.get((w, name, rtype), set()) if w >= 0 else set()
          assert sorted(cell[:n].tolist()) == sorted(expect), (w, name, rtype)
          got_any += n
  assert got_any > 0


def test_relation_batch_structure_is_what_the_pipeline_builds():
  task, p = prepare(records(), 64)
  batch = model_batch(target_batches(p, task, 4, ())[0])
  shapes = task.target_shapes(p.table.types, num_types=len(TYPES), batch=4, length=64)
  want = aot.batch_structure(CharTok.feature_names, batch=4, length=64, targets=shapes)
  assert {k: (v.shape, v.dtype) for k, v in want.items()} == {k: (v.shape, v.dtype) for k, v in batch.items()}
  # Eval batches carry no targets, and their structure is the eval program's.
  batch = model_batch(next(iter(batching.eval_batches(p, batch_size=4, buckets=()))))
  want = aot.batch_structure(CharTok.feature_names, batch=4, length=64)
  assert {k: (v.shape, v.dtype) for k, v in want.items()} == {k: (v.shape, v.dtype) for k, v in batch.items()}
  assert not {"span_ids", "entity_ids", "head_ids", "tail_ids", "tags"} & set(batch)


def gold_window_out(p, window_B):
  """Eval step outputs of a batch whose model fires exactly the gold cells of its windows."""
  ents, heads, tails = [], [], []
  for row, w in enumerate(window_B.tolist()):
    if w < 0:
      continue
    for s, e, t in p.window_spans(w).tolist():
      ents.append((row, t, s, e))
    for ss, se, os_, oe, r in p.table.window_relations(w).tolist():
      heads.append((row, r, ss, os_))
      tails.append((row, r, se, oe))

  def buffer(coords):
    coords = sorted(set(coords))
    return (len(coords), np.asarray(coords, np.int32).reshape(-1, 4), np.ones(len(coords), np.float32))

  return (buffer(ents), buffer(heads), buffer(tails), window_B)


@pytest.mark.parametrize("max_len", [64, 24])
def test_gold_hits_assemble_into_records_that_score_one(max_len):
  recs = [r for r in records() if r["id"] != "epo"]
  task, p = prepare(recs, max_len)
  hits = []
  for batch in batching.eval_batches(p, batch_size=8, buckets=()):
    hits.append(task.window_hits(gold_window_out(p, batch["window_index"]), types=p.types))
  predictions = task.assemble(p, task.concat_hits(hits))
  assert len(predictions) == len(recs)
  result = task.score(p, predictions)
  held = int(np.sum(p.table.status == windows.OK))
  split = int(np.sum(p.table.status == windows.LOST))
  assert result["gold"] == held + split and result["tp"] == result["pred"] == held
  for form in ("boundaries", "strict", "string"):
    assert result["triples"][form]["tp"] == held
  if not split:
    assert result["f1"] == 1.0 and result["entities"]["f1"] == 1.0
  # Each predicted relation names two of its record's entities, by index, as predict writes them.
  for rec, pred in zip(recs, predictions):
    got = {(pred["entities"][x["head"]]["start"], pred["entities"][x["tail"]]["start"], x["type"])
           for x in pred["relations"]}
    gold = {(rec["entities"][x["head"]]["start"], rec["entities"][x["tail"]]["start"], x["type"])
            for x in rec["relations"]}
    assert got <= gold
  counts = result["per_record"]
  assert sum(counts["tp"]) == result["tp"] and sum(counts["fn"]) == result["gold"] - result["tp"]


def test_triple_metric_forms_and_macro():
  gold = {(0, (0, 2), (5, 7), "a"), (0, (0, 2), (9, 9), "b"), (1, (1, 2), (3, 4), "a")}
  pred = {(0, (0, 2), (5, 7), "a"), (1, (1, 2), (3, 5), "a"), (1, (0, 1), (3, 4), "c")}
  r = triple_prf(pred, gold)
  assert (r["tp"], r["pred"], r["gold"]) == (1, 3, 3)
  f1_a = 2 * (1 / 2) * (1 / 2) / (1 / 2 + 1 / 2)
  assert r["macro_f1"] == pytest.approx((f1_a + 0.0) / 2)  # relations with gold triples: a, b


def test_run_spec_resolves_the_task_and_refuses_what_relations_cannot_train():
  assert factory.run_spec(ht.tiny_config()).task == "entities"
  spec = factory.run_spec(ht.tiny_config(task="relations"))
  assert spec.task == "relations"
  assert spec.task_options == (("match", "boundaries"), ("pointer_rope", False), ("roles", ()))
  casrel = factory.run_spec(ht.tiny_config(task="relations", **{"data.name": "casrel", "model.pointer_rope": True}))
  assert dict(casrel.task_options) == {"match": "string", "roles": ("subject", "object"), "pointer_rope": True}
  hash(casrel)  # the spec stays hashable
  # A jsonl corpus states what a CasRel file implies with data fields; they decide the same options.
  stated = factory.run_spec(ht.tiny_config(task="relations", **{"data.name": "jsonl", "data.roles": "subject,object",
                                                                 "data.match": "string"}))
  assert dict(stated.task_options) == dict(casrel.task_options, pointer_rope=False)
  assert tasks.of(casrel).options == dict(casrel.task_options)
  assert factory.run_spec(ht.tiny_config()).task_options == ()
  for bad in ({"data.roles": "subject"}, {"data.roles": "a,a"}, {"data.match": "strings"}):
    with pytest.raises(UserError, match="data.roles|data.match"):
      factory.run_spec(ht.tiny_config(task="relations", **bad))
  assert isinstance(tasks.of(spec), tasks.get("relations")) and isinstance(tasks.of(factory.run_spec(ht.tiny_config())),
                                                                       tasks.get("entities"))
  with pytest.raises(UserError, match="task='triples'"):
    factory.run_spec(ht.tiny_config(task="triples"))
  with pytest.raises(UserError, match="tagger"):
    factory.run_spec(ht.tiny_config(task="relations", **{"model.head": "crf"}))
  with pytest.raises(UserError, match="sparse_zlpr"):
    factory.run_spec(ht.tiny_config(task="relations", **{"loss.kind": "zlpr"}))


def test_rows_over_the_candidate_budget_give_no_triples_and_the_others_are_unchanged():
  from gp_jax.ops.relations import assemble_triples
  from gp_jax.tasks.relations.host import bounded_rows

  rng = np.random.default_rng(0)
  B, E, R, L = 6, 2, 3, 12

  def hits(shape, p):
    coords = np.argwhere(rng.random(shape) < p).astype(np.int32)
    return (len(coords), coords, rng.random(len(coords)).astype(np.float32))

  ent = hits((B, E, L, L), 0.05)
  ent_rows = ent[1][:, 0]
  dense = ent_rows < 3  # rows 0-2 get many more entities: their candidates explode
  extra = hits((3, E, L, L), 0.4)
  ent_coords = np.concatenate([ent[1][~dense], extra[1]])
  ent = (len(ent_coords), ent_coords, rng.random(len(ent_coords)).astype(np.float32))
  head, tail = hits((B, R, L, L), 0.3), hits((B, R, L, L), 0.3)

  def candidates(row):  # plain Python: per head hit, entities starting at its two tokens
    starts = [tuple(c) for c in ent[1].tolist() if c[0] == row]
    n = lambda i: sum(1 for c in starts if c[2] == i)  # noqa: E731
    return sum(n(i) * n(j) for r, _, i, j in head[1].tolist() if r == row)

  budget = sorted(candidates(r) for r in range(B))[B // 2]
  over = {r for r in range(B) if candidates(r) > budget}
  assert over and len(over) < B
  h, t, dropped = bounded_rows(ent, head, tail, budget=budget)
  assert dropped.dtype == np.int64 and dropped.tolist() == sorted(over)
  assert not set(h[1][:, 0].tolist()) & over and not set(t[1][:, 0].tolist()) & over
  got, _ = assemble_triples(ent, h, t)
  want, _ = assemble_triples(ent, head, tail)
  np.testing.assert_array_equal(got, want[~np.isin(want[:, 0], list(over))])


def test_relations_on_a_corpus_without_relations_is_refused():
  with pytest.raises(UserError, match="holds no relations"):
    factory.prepare_data(ht.tiny_config(task="relations"))


@pytest.mark.parametrize("types", [("object", "subject"), ("LOC", "PER")])
def test_roles_hold_on_role_typed_corpora_only(types):
  """A head and tail hit that pair an entity decoded only as "object" as a subject (and a "subject" as an object)
  give no triple when the entity types are the roles; with other types the pair stands."""
  first, second = types[1], types[0]  # subject role / PER first, object role / LOC second
  recs = [{"id": "r", "text": "Ab_likes_XY", "entities": [
      {"start": 0, "end": 2, "type": first}, {"start": 9, "end": 11, "type": second}],
           "relations": [{"head": 0, "tail": 1, "type": "likes"}]}]
  task = tasks.get("relations")(roles=("subject", "object") if types == ("object", "subject") else ())
  p = task.prepare(recs, CharTok(), list(types), ("likes",), name="t", max_len=32, stride=8)
  batch = next(iter(batching.eval_batches(p, batch_size=2, buckets=())))
  (ne, ent, es), (nh, head, hs), (nt, tail, ts), window_B = gold_window_out(p, batch["window_index"])
  (ss, se, os_, oe, _), = p.table.window_relations(0).tolist()
  head = np.concatenate([head[:nh], [[0, 0, os_, ss]]]).astype(np.int32)  # the reversed pair
  tail = np.concatenate([tail[:nt], [[0, 0, oe, se]]]).astype(np.int32)
  out = ((ne, ent, es), (2, head, np.ones(2, np.float32)), (2, tail, np.ones(2, np.float32)), window_B)
  pred = task.assemble(p, task.concat_hits([task.window_hits(out, types=p.types)]))[0]
  got = {(pred["entities"][x["head"]]["start"], pred["entities"][x["tail"]]["start"]) for x in pred["relations"]}
  assert got == ({(0, 9)} if types == ("object", "subject") else {(0, 9), (9, 0)})
