"""The Pallas ZLPR kernels (interpreted on CPU) against the XLA blockwise op, the dense loss and the NumPy formula."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax.ops import blockwise_zlpr_loss
from tests.ops.test_blockwise import dense_loss, make_case, zlpr_brute_force


def _value_and_grad(impl, W, block_size, argnums):
  """jitted (loss, grads w.r.t. the arguments in `argnums`) of one implementation; ids and mask are traced."""

  def loss(q, k, sb, eb, ids, am):
    if impl == "dense":
      return dense_loss(q, k, sb, eb, span_ids=ids, attention_mask=am, max_span_width=W)
    return blockwise_zlpr_loss(q, k, span_ids=ids, attention_mask=am, start_bias_BHL=sb, end_bias_BHL=eb,
                               max_span_width=W, block_size=block_size, implementation=impl)

  return jax.jit(jax.value_and_grad(loss, argnums))


# One program per implementation and static arguments: tests of the same shapes (the K = L layouts) share compiles.
_cached_value_and_grad = functools.lru_cache(maxsize=None)(_value_and_grad)


def loss_and_grads(impl, q, k, sb, eb, *, ids, am, W, block_size, fresh=False):
  """jitted (loss, grads w.r.t. q, k and the biases that are given) of one implementation. `fresh`: a program of
  its own, traced now (for tests that patch how the kernel is traced)."""
  argnums = tuple(i for i, x in enumerate((q, k, sb, eb)) if x is not None)
  build = _value_and_grad if fresh else _cached_value_and_grad
  return build(impl, W, block_size, argnums)(q, k, sb, eb, jnp.asarray(ids), jnp.asarray(am))


def assert_same(out, ref, rtol=1e-5, atol=1e-6):
  assert float(out[0]) == pytest.approx(float(ref[0]), rel=rtol)
  assert len(out[1]) == len(ref[1])
  for g, r in zip(out[1], ref[1]):
    assert g.shape == r.shape and g.dtype == r.dtype
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=rtol, atol=atol)


CASES = [
    # (Hq, biases, max_span_width, block_size); L = 19 is never a multiple of the block
    ("H", None, None, 8),  # standard head, full triangle, ragged last block
    (1, "both", 5, 4),  # efficient head (shared q/k + biases), banded
    ("H", "start", None, 5),  # per-type q/k, start bias only
    (1, "end", 12, 8),  # shared q/k, end bias only, wide band
]


@pytest.mark.parametrize("Hq,biases,W,block_size", CASES)
def test_value_and_gradients_equal_xla_dense_and_formula(Hq, biases, W, block_size):
  q, k, am, sb, eb, ids = make_case(1, Hq=3 if Hq == "H" else Hq, biases=biases is not None)
  sb = sb if biases in ("both", "start") else None
  eb = eb if biases in ("both", "end") else None
  kw = dict(ids=jnp.asarray(ids), am=jnp.asarray(am), W=W, block_size=block_size)
  out = loss_and_grads("pallas", q, k, sb, eb, **kw)
  assert_same(out, loss_and_grads("xla", q, k, sb, eb, **kw))
  assert_same(out, loss_and_grads("dense", q, k, sb, eb, **kw))
  assert float(out[0]) == pytest.approx(zlpr_brute_force(q, k, sb, eb, am, ids, W), rel=1e-5)


def test_empty_rows_no_positives_and_all_positive():
  """Row 0: every valid cell gold; row 1: no gold ids; row 2: no valid token at all."""
  B, L, H, d = 3, 6, 2, 4
  rng = np.random.default_rng(5)
  q, k = (rng.normal(size=(B, L, H, d)).astype(np.float32) for _ in range(2))
  sb, eb = (rng.normal(size=(B, H, L)).astype(np.float32) for _ in range(2))
  am = np.array([[1, 1, 1, 1, 0, 0], [1] * L, [0] * L], np.int32)
  cells = [i * L + j for i in range(4) for j in range(i, 4)]
  ids = np.full((B, H, len(cells)), -1, np.int32)
  ids[0, :] = cells
  ids[2, 0, :3] = cells[:3]  # gold ids on an empty row are ignored
  kw = dict(ids=jnp.asarray(ids), am=jnp.asarray(am), W=None, block_size=4)
  out = loss_and_grads("pallas", q, k, sb, eb, **kw)
  assert_same(out, loss_and_grads("xla", q, k, sb, eb, **kw))
  assert_same(out, loss_and_grads("dense", q, k, sb, eb, **kw))
  assert float(out[0]) == pytest.approx(zlpr_brute_force(q, k, sb, eb, am, ids), rel=1e-5)
  for g in out[1]:
    assert not np.any(np.asarray(g)[2]), "a row without valid cells has no gradient"


def test_bfloat16_finite_and_close():
  q, k, am, sb, eb, ids = make_case(2, Hq=1, biases=True)
  q, k = jnp.asarray(q, jnp.bfloat16), jnp.asarray(k, jnp.bfloat16)
  kw = dict(ids=jnp.asarray(ids), am=jnp.asarray(am), W=6, block_size=4)
  out = loss_and_grads("pallas", q, k, sb, eb, **kw)
  assert out[1][0].dtype == jnp.bfloat16
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in out[1])
  assert_same(out, loss_and_grads("dense", q, k, sb, eb, **kw), rtol=2e-2, atol=5e-2)


def test_auto_is_xla_and_names_are_checked():
  q, k, am, _, _, ids = make_case(3)

  def jaxpr(impl):
    return str(jax.make_jaxpr(lambda q, k: blockwise_zlpr_loss(
        q, k, span_ids=ids, attention_mask=am, block_size=8, implementation=impl))(q, k))

  assert "pallas_call" in jaxpr("pallas")
  assert "pallas_call" not in jaxpr("auto") and "pallas_call" not in jaxpr("xla")
  with pytest.raises(ValueError, match="implementation"):
    jaxpr("triton")
  with pytest.raises(ValueError, match="block_size"):
    blockwise_zlpr_loss(q, k, span_ids=ids, attention_mask=am, block_size=0, implementation="pallas")


def test_tpu_export_holds_mosaic_kernel_and_cpu_export_none():
  """Lowered for TPU from this CPU: the Mosaic kernels (fwd, dq, dk) as tpu_custom_call; for CPU: interpreted."""
  from benchmarks.lowering import export_loss, loss_lines

  assert loss_lines(("tpu",), L=200, H=2, max_span_width=40) == ["tpu loss: lowered (pallas, 3 tpu_custom_call)"]
  assert loss_lines(("tpu",), head="standard", L=200, H=2) == ["tpu loss: lowered (pallas, 3 tpu_custom_call)"]
  assert "tpu_custom_call" not in export_loss("cpu", L=200, H=2).mlir_module()


def test_tpu_tiling_in_the_tpu_interpreter(monkeypatch):
  """The branch Mosaic compiles (tiles rounded up to 128 lanes, SMEM ids, accumulators in revisited output blocks)
  run by Pallas' TPU interpreter, which fills never-written memory with NaN."""
  from jax.experimental.pallas import tpu as pltpu

  from gp_jax.ops import pallas_zlpr

  monkeypatch.setattr(pallas_zlpr, "_per_platform", lambda fn, spec_of, *args: fn(spec_of(True), *args))
  q, k, am, sb, eb, ids = make_case(6, L=140, Hq=1, H=2, biases=True, lengths=(131, 60))
  kw = dict(ids=jnp.asarray(ids), am=jnp.asarray(am), W=None, block_size=100)  # 2 x 2 blocks of 128
  with pltpu.force_tpu_interpret_mode():
    out = loss_and_grads("pallas", q, k, sb, eb, fresh=True, **kw)
  assert_same(out, loss_and_grads("xla", q, k, sb, eb, **kw))


# ----------------------------------------------------------------------------- realistic K (the pipeline pads to L)


def _ids_case(layout: str, *, B=2, H=3, L=40, seed=0):
  """`[B, H, L]` gold ids padded with -1 to K = L, as the pipeline sends them, in a given layout."""
  rng = np.random.default_rng(seed)
  cells = [(i, j) for i in range(L) for j in range(i, L)]
  ids = np.full((B, H, L), -1, np.int32)
  for b in range(B):
    for h in range(H):
      if layout == "spread":  # a few dozen real ids anywhere, in any order
        pick = rng.choice(len(cells), size=30, replace=False)
      elif layout == "one_block":  # all in rows 8..15 (one row block of 8)
        pick = rng.choice([n for n, (i, _) in enumerate(cells) if 8 <= i < 16], size=20, replace=False)
      else:  # "last_blocks": the last row block and the last column block
        pick = rng.choice([n for n, (i, j) in enumerate(cells) if i >= L - 8 or j >= L - 8], size=25, replace=False)
      chosen = np.array([cells[n][0] * L + cells[n][1] for n in pick], np.int32)
      ids[b, h, :len(chosen)] = rng.permutation(chosen)
  return rng.permuted(ids, axis=-1)  # -1 padding mixed in, not only at the end


@pytest.mark.parametrize("layout", ["spread", "one_block", "last_blocks"])
@pytest.mark.parametrize("Hq", ["H", 1])
def test_k_equals_l_padding_matches_xla_dense_and_formula(layout, Hq):
  B, H, L = 2, 3, 40
  q, k, am, sb, eb, _ = make_case(7, B=B, L=L, Hq=H if Hq == "H" else 1, H=H, biases=Hq == 1, lengths=(40, 33))
  ids = _ids_case(layout, B=B, H=H, L=L)
  kw = dict(ids=jnp.asarray(ids), am=jnp.asarray(am), W=None, block_size=8)
  out = loss_and_grads("pallas", q, k, sb, eb, **kw)
  assert_same(out, loss_and_grads("xla", q, k, sb, eb, **kw))
  assert_same(out, loss_and_grads("dense", q, k, sb, eb, **kw))
  assert float(out[0]) == pytest.approx(zlpr_brute_force(q, k, sb, eb, am, ids), rel=1e-5)


def test_every_cell_gold_at_a_small_length():
  B, H, L = 1, 2, 9
  rng = np.random.default_rng(8)
  q, k = (rng.normal(size=(B, L, H, 8)).astype(np.float32) for _ in range(2))
  am, sb, eb = np.ones((B, L), np.int32), None, None
  cells = np.array([i * L + j for i in range(L) for j in range(i, L)], np.int32)
  ids = np.stack([np.stack([np.random.default_rng(h).permutation(cells) for h in range(H)])])
  kw = dict(ids=jnp.asarray(ids), am=jnp.asarray(am), W=None, block_size=4)
  out = loss_and_grads("pallas", q, k, sb, eb, **kw)
  assert_same(out, loss_and_grads("dense", q, k, sb, eb, **kw))
  assert_same(out, loss_and_grads("xla", q, k, sb, eb, **kw))


@pytest.mark.parametrize("by_column", [False, True])
def test_gold_work_per_block_does_not_grow_with_padding(by_column):
  """The kernel visits, per tile, only the ids of its block's range: padding K from 30 to L leaves every range as
  it was, and each valid id falls in exactly one block's range. The XLA op's per-step ranges likewise."""
  from gp_jax.ops import blockwise, pallas_zlpr

  L, bs = 40, 8
  ids = _ids_case("spread", L=L)
  tight = np.sort(ids, axis=-1)[..., ::-1][..., :30]  # the same ids, K = 30 (no padding left)
  got = [pallas_zlpr.sorted_gold(jnp.asarray(x), length=L, tile=bs, blocks=L // bs, by_column=by_column)
         for x in (ids, tight)]
  np.testing.assert_array_equal(np.asarray(got[0][1]), np.asarray(got[1][1]))
  ranges = np.asarray(got[0][1])
  assert (ranges[..., -1] - ranges[..., 0] == (ids >= 0).sum(-1)).all()
  keys = np.asarray(got[0][0])
  for b, h, g in np.ndindex(*ranges.shape[:2], L // bs):  # each range holds its block's ids, by first coordinate
    block = keys[b, h, ranges[b, h, g]:ranges[b, h, g + 1]] // L
    assert ((block >= g * bs) & (block < (g + 1) * bs)).all()
  plan = blockwise._make_plan(L, bs, None, 1)
  spans = [blockwise._Gold.of(plan, jnp.asarray(x)) for x in (ids, tight)]
  np.testing.assert_array_equal(np.asarray(spans[0].lo_TBH), np.asarray(spans[1].lo_TBH))
  np.testing.assert_array_equal(np.asarray(spans[0].hi_TBH), np.asarray(spans[1].hi_TBH))


def test_cost_estimate_scales_with_tiles_and_types():
  from gp_jax.ops import pallas_zlpr

  def flops(L, H, backward=False, shared=False):
    spec = pallas_zlpr._SpecOf(L, 128, None, shared, H, shared, shared)(True)
    return pallas_zlpr.cost_estimate(spec, B=1, d=64, itemsize=2, backward=backward)

  base, more_types, longer = flops(1024, 10), flops(1024, 20), flops(2048, 10)
  assert more_types.flops == 2 * base.flops and more_types.transcendentals == 2 * base.transcendentals
  n1, n2 = 1024 // 128, 2048 // 128  # upper-triangle tiles: n (n + 1) / 2
  assert longer.flops * n1 * (n1 + 1) == base.flops * n2 * (n2 + 1)
  assert flops(1024, 10, backward=True).flops > base.flops
  assert base.bytes_accessed > 0
  # A shared head computes each tile's dot once per program of 10 types (the largest divisor of 50 up to 16).
  shared, per_type = flops(1024, 50, shared=True), flops(1024, 50)
  tiles = n1 * (n1 + 1) // 2
  assert per_type.flops - shared.flops == 45 * tiles * 2 * 128 * 128 * 64
  assert shared.transcendentals == per_type.transcendentals


def test_cost_estimate_counts_each_tile_once():
  from gp_jax.ops import pallas_zlpr

  spec = pallas_zlpr._SpecOf(256, 128, None, False, 2, False, False)(True)
  est = pallas_zlpr.cost_estimate(spec, B=1, d=64, itemsize=4, backward=False)
  assert est.flops == 1 * 2 * 3 * (2 * 128 * 128 * 64 + 6 * 128 * 128)  # 3 upper-triangle tiles of 128
  assert est.transcendentals == 2 * 3 * 128 * 128


def test_tiles_read_gold_only_through_their_ranges(monkeypatch):
  """With every prefetched range emptied, the kernel leaves no gold cell out of the negatives: it reads the ids
  only through the ranges (so -1 padding, outside every range, is never visited)."""
  from gp_jax.ops import pallas_zlpr

  B, H, L = 2, 3, 40
  q, k, am, _, _, _ = make_case(9, B=B, L=L, Hq=H, H=H, lengths=(40, 33))
  ids = _ids_case("spread", B=B, H=H, L=L)
  no_ids = np.full_like(ids, -1)
  neg = lambda x: pallas_zlpr.neg_term(jnp.asarray(q), jnp.asarray(k), span_ids_BHK=x,  # noqa: E731
                                       valid_BL=jnp.asarray(am).astype(bool), block_size=8)
  run = jax.jit(neg)  # one program for both id sets
  with_gold, without_gold = np.asarray(run(jnp.asarray(ids))), np.asarray(run(jnp.asarray(no_ids)))
  assert (with_gold < without_gold).all()
  real = pallas_zlpr.sorted_gold
  monkeypatch.setattr(pallas_zlpr, "sorted_gold",
                      lambda *a, **kw: (real(*a, **kw)[0], jnp.zeros_like(real(*a, **kw)[1])))
  patched = jax.jit(lambda x: neg(x))  # noqa: PLW0108 (a new function: traced again, with the patch)
  np.testing.assert_allclose(np.asarray(patched(jnp.asarray(ids))), without_gold, rtol=1e-6)


def test_shared_head_over_several_programs():
  """34 types share one q/k head: programs of 2 types each (34 = 2 x 17), their d(q), d(k) summed afterwards."""
  from gp_jax.ops import pallas_zlpr

  assert pallas_zlpr._SpecOf(24, 8, None, True, 34, True, True)(False).types_per_step == 2
  q, k, am, sb, eb, ids = make_case(10, B=2, L=24, Hq=1, H=34, biases=True, lengths=(24, 17))
  kw = dict(ids=jnp.asarray(ids), am=jnp.asarray(am), W=None, block_size=8)
  assert_same(loss_and_grads("pallas", q, k, sb, eb, **kw), loss_and_grads("xla", q, k, sb, eb, **kw))


def test_compiled_tile_is_clamped_to_what_the_generation_fits(monkeypatch, caplog):
  from gp_jax.ops import pallas_zlpr

  assert [pallas_zlpr.tpu_generation(k) for k in ("TPU v4", "TPU v5 lite", "TPU v5e", "TPU v5", "TPU v5p",
                                                   "TPU v6 lite", "cpu")] == ["v4", "v5e", "v5e", "v5p", "v5p",
                                                                              "v6e", None]
  monkeypatch.setattr(pallas_zlpr, "TPU_MAX_TILE", {("v4", "shared"): 128, ("v6e", "shared"): 256,
                                                    ("v4", "per_type"): 1024, ("v6e", "per_type"): 1024})
  spec = lambda shared: pallas_zlpr._SpecOf(4096, 512, None, shared, 10, shared, shared)  # noqa: E731
  with pallas_zlpr.tpu_target("v6e"):
    assert spec(True)(True).tile == 256 and spec(False)(True).tile == 512
  with pallas_zlpr.tpu_target("v4"), caplog.at_level("INFO", logger="gp_jax.ops.pallas_zlpr"):
    assert spec(True)(True).tile == 128
  assert "clamped to 128 for TPU v4" in caplog.text
  assert spec(True)(True).tile == 128  # unknown generation (this CPU): the smallest that fits every generation
  assert spec(True)(False).tile == 512  # the interpreter keeps the caller's tile
