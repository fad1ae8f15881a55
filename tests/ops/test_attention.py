"""ops.attention: the XLA path against the encoders' old einsum code and NumPy, the per-platform choice, splash
attention (Pallas interpreter) and a deferred choice lowered for two platforms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax.ops import attention as attn


def _qkv(B=2, L=16, H=12, K=32, seed=0, dtype=np.float32):
  """MiniLM's attention shape by default (D=384, 12 heads of 32); rows of lengths L, L-5, ..., a filler row of 0."""
  rng = np.random.default_rng(seed)
  q, k, v = (rng.standard_normal((B, L, H, K)).astype(dtype) for _ in range(3))
  lengths = [max(L - 5 * b, 0) for b in range(B - 1)] + [0]
  mask = np.arange(L)[None] < np.array(lengths)[:, None]
  return q, k, v, mask


def _numpy_attention(q, k, v, mask):
  """Independent reference in float64: masked keys dropped; an empty row attends all keys uniformly."""
  q, k, v = (x.astype(np.float64) for x in (q, k, v))
  s = np.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
  s = np.where(mask[:, None, None, :], s, -np.inf)
  s = np.where(mask.any(-1)[:, None, None, None], s, 0.0)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bhqs,bshk->bqhk", p, v)


def _old_bert_attention(q_BLHK, k_BLHK, v_BLHK, mask_BL):
  """BertLayer's attention as it was before ops.attention (fe2a992), without dropout."""
  K = q_BLHK.shape[-1]
  logits_BHLL = jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK, preferred_element_type=jnp.float32)
  logits_BHLL = logits_BHLL / np.sqrt(K).astype(np.float32)
  logits_BHLL = jnp.where(mask_BL[:, None, None, :], logits_BHLL, jnp.finfo(jnp.float32).min)
  probs_BHLL = jax.nn.softmax(logits_BHLL, axis=-1).astype(v_BLHK.dtype)
  return jnp.einsum("bhqs,bshk->bqhk", probs_BHLL, v_BLHK)


def test_xla_path_equals_the_old_einsum_path_and_numpy():
  q, k, v, mask = _qkv()
  new = np.asarray(jax.jit(lambda *a: attn.attention(*a[:3], mask_BL=a[3], implementation="auto",
                                                     platform="cpu"))(q, k, v, mask))
  old = np.asarray(jax.jit(_old_bert_attention)(q, k, v, mask))
  assert np.max(np.abs(new - old)) <= 1e-6
  ref = _numpy_attention(q, k, v, mask)
  assert np.max(np.abs(new - ref)) < 1e-5
  assert np.isfinite(new[-1]).all()  # the filler row (length 0)


def test_probability_dropout_applies_on_the_xla_path_only_when_given():
  q, k, v, mask = _qkv(B=1, L=8, H=2, K=8)
  zero = lambda p: jnp.zeros_like(p)  # noqa: E731  a dropout that drops everything
  out = attn.attention(q, k, v, mask_BL=mask, implementation="xla", probs_dropout=zero)
  assert np.all(np.asarray(out) == 0)


# requested platform dtype L dropout -> expected
CHOICES = """auto cpu float32 128 0 xla | auto cpu bfloat16 128 0 xla | auto cuda bfloat16 64 0 cudnn
auto cuda float32 64 0 xla | auto tpu bfloat16 256 0 splash | auto tpu float32 128 0 splash
auto tpu bfloat16 96 0 xla | auto tpu bfloat16 256 1 xla | auto cuda bfloat16 64 1 xla
splash tpu bfloat16 64 0 xla | xla tpu bfloat16 256 0 xla"""


@pytest.mark.parametrize("case", [c.strip() for c in CHOICES.replace("\n", "|").split("|")])
def test_choose(case):
  requested, platform, dtype, length, dropout, expected = case.split()
  impl, why = attn.choose(requested, platform=platform, dtype=jnp.dtype(dtype), length=int(length), head_dim=64,
                          dropout=dropout == "1")
  assert impl == expected
  fused = {"cuda": "cudnn", "tpu": "splash"}.get(platform)
  assert bool(why) == (impl == "xla" and requested != "xla" and fused is not None)


def test_cuda_dropout_takes_cudnn_only_where_its_masks_were_seen_to_vary(monkeypatch):
  """Attention dropout on a cuda target: cuDNN's fused dropout only for a jax version the device check verified
  (or GP_JAX_CUDNN_DROPOUT=1); otherwise XLA with the reason; cuDNN's own refusals (f32, head dim) still fall back."""
  pick = lambda **kw: attn.choose("auto", platform="cuda", dtype=jnp.bfloat16, length=64, head_dim=64,  # noqa: E731
                                  dropout=True, **kw)
  monkeypatch.delenv(attn.CUDNN_DROPOUT_ENV, raising=False)
  minor = ".".join(jax.__version__.split(".")[:2])
  monkeypatch.setattr(attn, "CUDNN_DROPOUT_VERIFIED", {})
  impl, why = pick()
  assert impl == "xla" and "not yet checked on a GPU" in why and minor in why
  monkeypatch.setattr(attn, "CUDNN_DROPOUT_VERIFIED", {minor: False})
  impl, why = pick()
  assert impl == "xla" and "repeats its masks" in why
  monkeypatch.setattr(attn, "CUDNN_DROPOUT_VERIFIED", {minor: True})
  assert pick() == ("cudnn", "")
  assert attn.choose("auto", platform="cuda", dtype=jnp.bfloat16, length=64, head_dim=12, dropout=True)[0] == "xla"
  assert attn.choose("auto", platform="cuda", dtype=jnp.float32, length=64, head_dim=64, dropout=True)[0] == "xla"
  assert attn.choose("auto", platform="tpu", dtype=jnp.bfloat16, length=128, head_dim=64, dropout=True)[0] == "xla"
  monkeypatch.setattr(attn, "CUDNN_DROPOUT_VERIFIED", {})
  monkeypatch.setenv(attn.CUDNN_DROPOUT_ENV, "1")
  assert pick() == ("cudnn", "")
  monkeypatch.setattr(attn, "CUDNN_DROPOUT_VERIFIED", {minor: True})
  monkeypatch.setenv(attn.CUDNN_DROPOUT_ENV, "0")
  impl, why = pick()
  assert impl == "xla" and attn.CUDNN_DROPOUT_ENV in why


def test_dropout_with_a_deferred_platform_takes_the_xla_path(monkeypatch):
  """platform=None with dropout: no platform_dependent branches (the masks are drawn outside them)."""
  monkeypatch.setenv(attn.CUDNN_DROPOUT_ENV, "1")
  q, k, v, mask = _qkv(B=1, L=8, H=2, K=8, dtype=jnp.bfloat16)
  zero = lambda p: jnp.zeros_like(p)  # noqa: E731
  out = jax.jit(lambda *a: attn.attention(*a[:3], mask_BL=a[3], implementation="auto", platform=None,
                                          probs_dropout=zero, dropout_rate=0.1))(q, k, v, mask)
  assert np.all(np.asarray(out, np.float32) == 0)


def test_choose_rejects_what_the_target_cannot_run():
  with pytest.raises(ValueError, match="runs on cuda"):
    attn.choose("cudnn", platform="cpu", dtype=jnp.bfloat16, length=64, head_dim=64, dropout=False)
  with pytest.raises(ValueError, match="bfloat16/float16"):
    attn.choose("cudnn", platform="cuda", dtype=jnp.float32, length=64, head_dim=64, dropout=False)
  with pytest.raises(ValueError, match="runs on tpu"):
    attn.choose("splash", platform="cuda", dtype=jnp.bfloat16, length=128, head_dim=64, dropout=False)
  with pytest.raises(ValueError, match="one of"):
    attn.choose("flash", platform="cuda", dtype=jnp.bfloat16, length=128, head_dim=64, dropout=False)


def test_explicit_cudnn_with_dropout_on_an_unverified_jax_is_a_one_line_user_error(monkeypatch):
  """Not a silent fallback and never the process abort: model.attention=cudnn with dropout where the fused dropout
  is unverified refuses in one line; verified (or GP_JAX_CUDNN_DROPOUT=1) it is cuDNN."""
  from gp_jax.errors import UserError

  monkeypatch.delenv(attn.CUDNN_DROPOUT_ENV, raising=False)
  monkeypatch.setattr(attn, "CUDNN_DROPOUT_VERIFIED", {})
  with pytest.raises(UserError, match="model.attention=cudnn with attention dropout: .*not yet checked") as e:
    attn.choose("cudnn", platform="cuda", dtype=jnp.bfloat16, length=64, head_dim=64, dropout=True)
  assert "\n" not in str(e.value)
  minor = ".".join(jax.__version__.split(".")[:2])
  monkeypatch.setattr(attn, "CUDNN_DROPOUT_VERIFIED", {minor: True})
  assert attn.choose("cudnn", platform="cuda", dtype=jnp.bfloat16, length=64, head_dim=64, dropout=True) == ("cudnn", "")


def test_splash_kernel_in_the_interpreter_matches_numpy():
  """The splash path itself (segment ids for padding, pre-scaled q), run by the Pallas interpreter on CPU."""
  q, k, v, mask = _qkv(B=2, L=128, H=2, K=64, seed=1)
  out = np.asarray(jax.jit(lambda *a: attn.splash_attention(*a[:3], mask_BL=a[3], interpret=True))(q, k, v, mask))
  ref = _numpy_attention(q, k, v, mask)
  real = mask[:, :, None, None]  # padding rows attend padding (segment 0): only real rows are compared
  assert np.max(np.abs(np.where(real, out - ref, 0))) < 2e-3
  assert np.isfinite(out).all()


@pytest.mark.skipif(attn.cudnn_detected(), reason="this machine has cuDNN")
def test_cudnn_cannot_be_traced_without_cudnn():
  q, k, v, mask = _qkv(B=1, L=8, H=2, K=8, dtype=jnp.bfloat16)
  with pytest.raises(RuntimeError, match="cuDNN is not detected"):
    jax.jit(lambda *a: attn.attention(*a[:3], mask_BL=a[3], implementation="auto", platform="cuda"))(q, k, v, mask)


def test_deferred_choice_lowers_per_platform():
  """platform=None: lax.platform_dependent stages both paths; lowering for tpu keeps splash, for cpu the XLA path."""
  q, k, v, mask = _qkv(B=2, L=128, H=2, K=64, dtype=jnp.bfloat16)
  fn = jax.jit(lambda *a: attn.attention(*a[:3], mask_BL=a[3], implementation="auto", platform=None))
  assert "platform_index" in str(jax.make_jaxpr(fn)(q, k, v, mask))
  assert "tpu_custom_call" in jax.export.export(fn, platforms=["tpu"])(q, k, v, mask).mlir_module()
  assert "tpu_custom_call" not in jax.export.export(fn, platforms=["cpu"])(q, k, v, mask).mlir_module()
  out = np.asarray(fn(q, k, v, mask), np.float32)
  ref = np.asarray(_old_bert_attention(q, k, v, mask), np.float32)
  np.testing.assert_array_equal(out, ref)  # on CPU it is the XLA path


def _numpy_attention_grads(q, k, v, mask, w, h=1e-6):
  """Central differences, float64, of sum(w * attention) w.r.t. q, k and v (the NumPy reference above)."""
  q, k, v = (x.astype(np.float64) for x in (q, k, v))
  f = lambda q_, k_, v_: np.sum(w * _numpy_attention(q_, k_, v_, mask))  # noqa: E731
  grads = []
  for which in range(3):
    args = [q, k, v]
    g = np.zeros_like(args[which])
    for i in np.ndindex(g.shape):
      up, down = [a.copy() for a in args], [a.copy() for a in args]
      up[which][i] += h
      down[which][i] -= h
      g[i] = (f(*up) - f(*down)) / (2 * h)
    grads.append(g)
  return grads


def test_low_precision_logits_gradient():
  """float32: the same function and gradients as the reference path, the gradients NumPy's central differences;
  bfloat16: within bf16 rounding of the float32 gradients."""
  q, k, v, mask = _qkv(B=2, L=5, H=2, K=4, seed=3)
  w = np.random.default_rng(4).standard_normal(q.shape)

  def grads(dtype, low):
    def loss(q_, k_, v_):
      out = attn.xla_attention(q_, k_, v_, mask_BL=jnp.asarray(mask), low_precision_grad=low)
      return jnp.sum(out.astype(jnp.float32) * jnp.asarray(w, jnp.float32))
    args = [jnp.asarray(x, dtype) for x in (q, k, v)]
    return [np.asarray(g, np.float64) for g in jax.grad(loss, argnums=(0, 1, 2))(*args)]

  want = _numpy_attention_grads(q, k, v, mask, w)
  ref32, low32 = grads(jnp.float32, False), grads(jnp.float32, True)
  for a, b, n in zip(ref32, low32, want):
    np.testing.assert_array_equal(b, a)  # float32 inputs: nothing to round
    np.testing.assert_allclose(a, n, rtol=1e-3, atol=1e-4)
  low16 = grads(jnp.bfloat16, True)
  for g, n in zip(low16, want):
    np.testing.assert_allclose(g, n, rtol=0, atol=0.05 * np.max(np.abs(n)))
  out = attn.attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), mask_BL=jnp.asarray(mask),
                       implementation="xla", platform="cuda", low_precision_grad=True)
  ref = attn.attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), mask_BL=jnp.asarray(mask),
                       implementation="xla", platform="cuda")
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))  # the forward is unchanged
