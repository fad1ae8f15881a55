import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax.data.tagging import end_constraints, spans_to_tags, transition_constraints
from gp_jax.ops.crf import constrain_scores, crf_log_partition, crf_sequence_score, viterbi_decode


def path_scores_np(em_LT, paths_PN, trans, start, end, allowed=None, a_start=None, a_end=None):
  """Scores of `paths_PN` (length n each) under the CRF, -inf for forbidden paths."""
  n = paths_PN.shape[1]
  s = start[paths_PN[:, 0]] + end[paths_PN[:, -1]] + em_LT[np.arange(n), paths_PN].sum(1)
  s = s + trans[paths_PN[:, :-1], paths_PN[:, 1:]].sum(1)
  ok = np.ones(len(paths_PN), bool)
  if allowed is not None:
    ok &= allowed[paths_PN[:, :-1], paths_PN[:, 1:]].all(1) & a_start[paths_PN[:, 0]] & a_end[paths_PN[:, -1]]
  return np.where(ok, s, -np.inf)


def brute_force(em_LT, n, trans, start, end, allowed=None, a_start=None, a_end=None):
  """(log Z, best path, best score) by enumerating every tag path of length n."""
  if n == 0:
    return 0.0, np.zeros(0, int), 0.0
  T = em_LT.shape[-1]
  paths = np.array(list(itertools.product(range(T), repeat=n)))
  s = path_scores_np(em_LT, paths, trans, start, end, allowed, a_start, a_end)
  m = s.max()
  return m + np.log(np.exp(s - m).sum()), paths[s.argmax()], m


def make_case(rng, *, T, L, lengths, bounds, scheme=None, H=None):
  B = len(lengths)
  em = rng.normal(size=(B, L, T)).astype(np.float32)
  trans = rng.normal(size=(T, T)).astype(np.float32)
  start = rng.normal(size=T).astype(np.float32) if bounds else np.zeros(T, np.float32)
  end = rng.normal(size=T).astype(np.float32) if bounds else np.zeros(T, np.float32)
  mask = np.arange(L)[None] < np.array(lengths)[:, None]
  cons = None
  if scheme:
    allowed, a_start = transition_constraints(H, scheme)
    cons = (allowed, a_start, end_constraints(H, scheme))
  return em, trans, start, end, mask, cons


@jax.jit
def run_all(em, tags, trans, mask, start, end, allowed):
  """All three ops in one compiled call (one compile per shape keeps the tests fast)."""
  kw = dict(mask_BL=mask, start_T=start, end_T=end, allowed_TT=allowed)
  best_tags, best = viterbi_decode(em, trans, **kw)
  return (crf_log_partition(em, trans, **kw), best_tags, best, crf_sequence_score(em, tags, trans, **kw),
          crf_sequence_score(em, best_tags, trans, **kw))


def run_case(em, tags, trans, mask, start, end, cons):
  """Folds constraints like the CRF tagger does; none -> everything allowed."""
  T = em.shape[-1]
  allowed, a_start, a_end = cons or (np.ones((T, T), bool), np.ones(T, bool), np.ones(T, bool))
  out = run_all(em, tags, trans, mask, constrain_scores(start, allowed_T=a_start),
                constrain_scores(end, allowed_T=a_end), allowed)
  return [np.asarray(x) for x in out]


# All brute-force cases share one shape: B=4, L=6, T=5.
CASES = [
    dict(T=5, L=6, lengths=[5, 2, 1, 0], bounds=False),
    dict(T=5, L=6, lengths=[6, 3, 0, 1], bounds=True),
    dict(T=5, L=6, lengths=[6, 4, 1, 0], bounds=True, scheme="BIO", H=2),
    dict(T=5, L=6, lengths=[6, 2, 1, 0], bounds=False, scheme="BIOES", H=1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c['T']}L{c['L']}-{c.get('scheme')}-b{int(c['bounds'])}")
def test_partition_and_viterbi_match_brute_force(case):
  rng = np.random.default_rng(0)
  em, trans, start, end, mask, cons = make_case(rng, **case)
  log_z, tags, best, _, path_score = run_case(em, np.zeros(mask.shape, int), trans, mask, start, end, cons)
  for b, n in enumerate(case["lengths"]):
    ref_z, ref_path, ref_best = brute_force(em[b], n, trans, start, end, *(cons or ()))
    assert log_z[b] == pytest.approx(ref_z, rel=1e-5, abs=1e-4)
    np.testing.assert_array_equal(tags[b, :n], ref_path)
    assert (tags[b, n:] == -1).all()
    assert best[b] == pytest.approx(ref_best, rel=1e-5, abs=1e-4)
    assert path_score[b] == pytest.approx(ref_best, rel=1e-5, abs=1e-4)


def test_sequence_score_matches_loop():
  rng = np.random.default_rng(1)
  B, L, T = 4, 6, 5
  em, trans, start, end, mask, _ = make_case(rng, T=T, L=L, lengths=[6, 3, 1, 0], bounds=True)
  tags = np.where(mask, rng.integers(0, T, size=(B, L)), -1)
  got = run_case(em, tags, trans, mask, start, end, None)[3]
  for b in range(B):
    n = int(mask[b].sum())
    ref = 0.0
    for t in range(n):
      ref += em[b, t, tags[b, t]] + (start[tags[b, t]] if t == 0 else trans[tags[b, t - 1], tags[b, t]])
    if n:
      ref += end[tags[b, n - 1]]
    assert got[b] == pytest.approx(ref, rel=1e-5, abs=1e-5)


def test_bfloat16_input_and_forbidden_gold():
  rng = np.random.default_rng(2)
  em = jnp.asarray(rng.normal(size=(4, 6, 5)), jnp.bfloat16)
  mask = np.arange(6)[None] < np.array([6, 3, 2, 0])[:, None]
  allowed, a_start = transition_constraints(2, "BIO")
  # Row 0: I-0 (2) after O (0) is forbidden; row 1: I-0 first; rows 2, 3 are valid.
  tags = np.array([[0, 2, 2, 0, 0, 0], [2, 2, 0, -1, -1, -1], [1, 2, -1, -1, -1, -1], [-1] * 6])
  out = run_all(em, tags, jnp.zeros((5, 5), jnp.bfloat16), mask, constrain_scores(None, allowed_T=a_start),
                jnp.zeros(5), allowed)
  assert all(x.dtype in (jnp.float32, jnp.int32) for x in out)
  s = np.asarray(out[3])
  assert np.isneginf(s[:2]).all() and np.isfinite(s[2:]).all() and s[3] == 0


@jax.jit
def nll_and_grads(em, trans, start, end, *, gold, mask, allowed):
  allowed_TT, a_start, a_end = allowed

  def nll(em, trans, start, end):
    kw = dict(mask_BL=mask, start_T=constrain_scores(start, allowed_T=a_start),
              end_T=constrain_scores(end, allowed_T=a_end), allowed_TT=allowed_TT)
    return jnp.sum(crf_log_partition(em, trans, **kw) - crf_sequence_score(em, gold, trans, **kw))

  return jax.value_and_grad(nll, argnums=(0, 1, 2, 3))(em, trans, start, end)


@pytest.mark.parametrize("scheme,H", [("BIO", 2), ("BIOES", 1)])
def test_gradients_finite(scheme, H):
  rng = np.random.default_rng(3)
  T = 1 + (2 if scheme == "BIO" else 4) * H
  B, L = 4, 6
  mask = np.arange(L)[None] < np.array([6, 3, 0, 1])[:, None]
  gold = np.stack([spans_to_tags([[0, 1, 0]], length=L, num_types=H, scheme=scheme)[0]] * B)
  gold = np.where(mask, gold, -1)
  gold[3, 0] = 0  # a one-token row: O
  allowed, a_start = transition_constraints(H, scheme)
  a_end = end_constraints(H, scheme)
  args = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(B, L, T), (T, T), (T,), (T,)]]

  value, grads = nll_and_grads(*args, gold=gold, mask=mask, allowed=(allowed, a_start, a_end))
  assert np.isfinite(value) and value > 0
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()
  assert not np.asarray(grads[0])[2].any()  # the empty row gets no gradient


@pytest.mark.parametrize("scheme,H", [("BIO", 4), ("BIOES", 2)])
def test_constrained_decoding_is_valid_and_bounded(scheme, H):
  rng = np.random.default_rng(4)
  allowed, a_start = transition_constraints(H, scheme)
  a_end = end_constraints(H, scheme)
  T, B, L = allowed.shape[0], 256, 8  # T = 9 for both
  em = 3 * rng.normal(size=(B, L, T)).astype(np.float32)
  trans = rng.normal(size=(T, T)).astype(np.float32)
  mask = np.arange(L)[None] < rng.integers(0, L + 1, size=B)[:, None]
  # Valid gold paths: random spans encoded as tags.
  gold = np.full((B, L), -1)
  for b in range(B):
    n = int(mask[b].sum())
    s = np.sort(rng.integers(0, max(n, 1), size=2))
    gold[b, :n] = spans_to_tags([[s[0], s[1], rng.integers(H)]] if n else np.zeros((0, 3)), length=n,
                                num_types=H, scheme=scheme)[0]
  log_z, tags, _, gold_score, best_score = run_case(em, gold, trans, mask, None, None, (allowed, a_start, a_end))
  for b in range(B):
    n = int(mask[b].sum())
    path = tags[b, :n]
    assert (tags[b, n:] == -1).all()
    if n:
      assert a_start[path[0]] and a_end[path[-1]] and allowed[path[:-1], path[1:]].all()
  # log Z bounds the score of every valid path (Viterbi's and the encoded spans').
  for score in (gold_score, best_score):
    assert np.isfinite(score).all() and (log_z >= score - 1e-4).all()


def test_unreachable_tag_gives_finite_gradients():
  # Tag 4 can never be entered (nor start): its forward scores are -inf at every step.
  rng = np.random.default_rng(5)
  allowed = np.ones((5, 5), bool)
  allowed[:, 4] = False
  a_start = np.array([True] * 4 + [False])
  mask = np.arange(6)[None] < np.array([6, 3, 0, 1])[:, None]
  gold = np.where(mask, rng.integers(0, 4, size=(4, 6)), -1)
  args = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(4, 6, 5), (5, 5), (5,), (5,)]]
  value, grads = nll_and_grads(*args, gold=gold, mask=mask, allowed=(allowed, a_start, np.ones(5, bool)))
  assert np.isfinite(value)
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()
  assert not np.asarray(grads[1])[:, 4].any()
