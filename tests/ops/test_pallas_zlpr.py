"""The Pallas ZLPR kernels (interpreted on CPU) against the XLA blockwise op, the dense loss and the NumPy formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax.ops import blockwise_zlpr_loss
from tests.ops.test_blockwise import dense_loss, make_case, zlpr_brute_force


def loss_and_grads(impl, q, k, sb, eb, *, ids, am, W, block_size):
  """jitted (loss, grads w.r.t. q, k and the biases that are given) of one implementation."""
  argnums = tuple(i for i, x in enumerate((q, k, sb, eb)) if x is not None)

  def loss(q, k, sb, eb):
    if impl == "dense":
      return dense_loss(q, k, sb, eb, span_ids=ids, attention_mask=am, max_span_width=W)
    return blockwise_zlpr_loss(q, k, span_ids=ids, attention_mask=am, start_bias_BHL=sb, end_bias_BHL=eb,
                               max_span_width=W, block_size=block_size, implementation=impl)

  return jax.jit(jax.value_and_grad(loss, argnums))(q, k, sb, eb)


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
  from benchmarks.lowering_loss import export_loss, loss_lines

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
    out = loss_and_grads("pallas", q, k, sb, eb, **kw)
  assert_same(out, loss_and_grads("xla", q, k, sb, eb, **kw))
