"""The relation task's host half (gp_jax.tasks.relations.host) against plain-Python references written from the
definitions: roles passed into the join by name (either type order), the candidate budget counting role-respecting
candidates only, the entity pointer's F1, the by-triples row "0", an exported folder's manifest read back."""

from __future__ import annotations

import numpy as np
import pytest

from gp_jax.data import batching
from gp_jax.tasks.relations import host
from tests.data.fakes import CharTok
from tests.ops.test_relations import device_decode, planted_case, su_decode


def hits_of(rng, shape, p):
  coords = np.argwhere(rng.random(shape) < p).astype(np.int32)
  return len(coords), coords, rng.random(len(coords)).astype(np.float32)


@pytest.mark.parametrize("types", [("subject", "object"), ("object", "subject"), ("ORG", "object", "subject")])
def test_window_hits_join_with_the_roles_by_name(types):
  """Roles are names: whichever ids the entity types give them, the join keeps Su's role-respecting triples."""
  entity, head, tail, am, _ = planted_case()
  if len(types) == 3:  # a third, unrelated type in front: the roles' ids are 1 and 2
    entity = np.concatenate([np.full_like(entity[:, :1], -3.0), entity], axis=1)
  hits = device_decode(entity, head, tail, am, sizes=(1024, 4096, 4096))
  window_B = np.arange(entity.shape[0])
  roles = {"roles": ("subject", "object")}
  got = host.window_hits(hits, window_B, types=types, options=roles)["triples"]
  got = {(int(w), *(int(got[k][n]) for k in host.TRIPLE_KEYS[1:])): float(got["score"][n])
         for n, w in enumerate(got["window"])}
  ids = {t: i for i, t in enumerate(types)}
  want = su_decode(entity, head, tail, am, subject_types={ids["subject"]}, object_types={ids["object"]})
  assert got == pytest.approx(want) and len(want) > 5
  free = host.window_hits(hits, window_B, types=types, options={"roles": ()})["triples"]
  assert len(free["window"]) == len(su_decode(entity, head, tail, am)) > len(want)
  with pytest.raises(ValueError, match="types="):
    host.window_hits(hits, window_B, options=roles)


def candidates_reference(ent, head, row, subject_types=None, object_types=None):
  """Plain Python: per head hit (row, r, i, j), the subjects starting at i times the objects starting at j."""
  ents = [c for c in ent[1][:ent[0]].tolist() if c[0] == row]
  n = lambda i, types: sum(1 for c in ents if c[2] == i and (types is None or c[1] in types))  # noqa: E731
  return sum(n(i, subject_types) * n(j, object_types) for r, _, i, j in head[1][:head[0]].tolist() if r == row)


def test_the_budget_counts_role_respecting_candidates_only():
  rng = np.random.default_rng(1)
  B, E, R, L = 8, 3, 2, 10
  ent, head, tail = hits_of(rng, (B, E, L, L), 0.06), hits_of(rng, (B, R, L, L), 0.3), hits_of(rng, (B, R, L, L), 0.3)
  roles = dict(subject_types={0}, object_types={1})
  free = [candidates_reference(ent, head, r) for r in range(B)]
  held = [candidates_reference(ent, head, r, {0}, {1}) for r in range(B)]
  budget = sorted(held)[B // 2]
  assert any(h <= budget < f for h, f in zip(held, free))  # rows the role-free count would drop
  for kw, counts in ((roles, held), ({}, free)):
    over = {r for r in range(B) if counts[r] > budget}
    h, t, dropped = host.bounded_rows(ent, head, tail, budget=budget, **kw)
    assert dropped.dtype == np.int64 and dropped.tolist() == sorted(over) and over
    keep_h = ~np.isin(head[1][:, 0], list(over))
    np.testing.assert_array_equal(h[1], head[1][keep_h])
    assert h[0] == int(keep_h.sum()) and not set(t[1][:, 0].tolist()) & over


def prepared(recs, types=("LOC", "PER")):
  return host.prepare(recs, CharTok(), list(types), ("in", "likes"), name="t", max_len=40, stride=8)


RECORDS = [
    {"id": "a", "text": "Ab_likes_XY", "entities": [{"start": 0, "end": 2, "type": "PER"},
                                                   {"start": 9, "end": 11, "type": "LOC"}],
     "relations": [{"head": 0, "tail": 1, "type": "likes"}]},
    {"id": "b", "text": "Cd_in_Ef", "entities": [{"start": 0, "end": 2, "type": "PER"}], "relations": []},
    {"id": "c", "text": "nothing_here", "entities": [], "relations": []},
]


def test_entity_f1_is_the_entity_pointers_and_sentences_without_gold_get_row_zero():
  p = prepared(RECORDS)
  ab, xy = {"start": 0, "end": 2, "type": "PER", "score": 1.0}, {"start": 9, "end": 11, "type": "LOC", "score": 1.0}
  cd, ef = {"start": 0, "end": 2, "type": "PER", "score": 1.0}, {"start": 6, "end": 8, "type": "LOC", "score": 1.0}
  nh = {"start": 0, "end": 7, "type": "LOC", "score": 1.0}
  predictions = [
      # XY came from the triple alone (assembly added it after the pointer's one entity).
      {"entities": [ab, xy], "relations": [{"head": 0, "tail": 1, "type": "likes", "score": 1.0}], "decoded": 1},
      {"entities": [cd, ef], "relations": [{"head": 0, "tail": 1, "type": "in", "score": 1.0}], "decoded": 2},
      {"entities": [nh, nh], "relations": [{"head": 0, "tail": 1, "type": "in", "score": 1.0},
                                           {"head": 1, "tail": 0, "type": "likes", "score": 1.0}], "decoded": 2},
  ]
  result = host.score(p, predictions, options={"match": "boundaries"})
  # Plain counts: the pointer decoded Ab (gold), Cd (gold), Ef (not gold), nh (not gold, once): 2 of 4; gold 3.
  assert {k: result["entities"][k] for k in ("tp", "pred", "gold")} == {"tp": 2, "pred": 4, "gold": 3}
  assert result["by_triples"]["0"] == {"tp": 0, "pred": 3, "gold": 0}  # records b and c: their false positives
  assert result["by_triples"]["1"] == {"tp": 1, "pred": 1, "gold": 1}
  assert sum(v["pred"] for v in result["by_triples"].values()) == result["pred"] == 4
  assert list(result["by_triples"]) == ["0", "1", "2", "3", "4", "5+"]


def test_overlap_breakdown_counts_a_sentence_in_both_seo_and_epo():
  gold = {(0, "a", "b", "r1"), (0, "a", "b", "r2"), (0, "a", "c", "r3"), (1, "d", "e", "r1")}
  pred = {(0, "a", "b", "r1"), (0, "a", "c", "r1"), (1, "d", "e", "r1")}
  overlap, by_count = host.breakdowns(2, pred, gold)
  assert overlap["epo"] == overlap["seo"] == {"tp": 1, "pred": 2, "gold": 3}
  assert overlap["normal"] == {"tp": 1, "pred": 1, "gold": 1}
  assert by_count["3"] == {"tp": 1, "pred": 2, "gold": 3} and by_count["0"] == {"tp": 0, "pred": 0, "gold": 0}


def test_assemble_marks_the_pointers_entities_and_output_record_writes_the_fields():
  p = prepared(RECORDS)
  assert p.texts == tuple(r["text"] for r in RECORDS) and p.table.types == ("in", "likes")
  batch = next(iter(batching.eval_batches(p, batch_size=4, buckets=())))
  window_B = batch["window_index"]
  b = int(np.nonzero(window_B == 0)[0][0])  # the row of record a's one window
  # The pointer decodes Ab (PER = 1) and XY (LOC = 0); the head / tail pointers link them as "likes" (1).
  (ss, se, os_, oe, _), = p.table.window_relations(0).tolist()
  ent = (2, np.asarray([[b, 1, ss, se], [b, 0, os_, oe]], np.int32), np.asarray([2.0, 3.0], np.float32))
  head = (1, np.asarray([[b, 1, ss, os_]], np.int32), np.asarray([1.5], np.float32))
  tail = (1, np.asarray([[b, 1, se, oe]], np.int32), np.asarray([1.0], np.float32))
  out = host.assemble(p, host.concat_hits([host.window_hits((ent, head, tail), window_B)]))
  assert [x["decoded"] for x in out] == [2, 0, 0]
  row = host.output_record(RECORDS[0]["text"], out[0])
  assert row == {"entities": [{"start": 0, "end": 2, "type": "PER", "text": "Ab", "score": 2.0},
                              {"start": 9, "end": 11, "type": "LOC", "text": "XY", "score": 3.0}],
                 "relations": [{"head": 0, "tail": 1, "type": "likes", "score": 1.0}]}


def test_casrel_roles_are_subject_then_object_as_su_and_the_ops_tests_number_them():
  from gp_jax.data.relations import ROLES

  assert host.role_ids(ROLES, ROLES) == ({0}, {1})
  assert host.role_ids(("LOC", "PER"), ()) == (None, None)
  with pytest.raises(ValueError, match="two of the entity types"):
    host.role_ids(("LOC", "PER"), ("subject", "object"))


def test_manifest_settings_read_old_and_new_folders():
  assert host.manifest_settings({"labels": ["a"], "task_options": {"roles": ["s", "o"], "match": "string"}},
                                ["s", "o"]) == (("a",), {"roles": ["s", "o"], "match": "string"})
  # Written before "labels": the relation types apart, roles where the types were the CasRel roles.
  assert host.manifest_settings({"relation_types": ["a"]}, ["object", "subject"]) == (
      ("a",), {"roles": ("subject", "object")})
  assert host.manifest_settings({"relation_types": ["a"]}, ["LOC", "PER"]) == (("a",), {"roles": ()})
