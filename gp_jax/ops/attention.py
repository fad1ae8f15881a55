"""Multi-head self-attention over padded batches: one entry point, `attention`, for every platform's kernel.

Implementations (`model.attention`):
  xla     einsum scores accumulated in float32, masked keys at the float32 minimum, float32 softmax, optional
          dropout on the probabilities, einsum with v. Any platform, any key mask.
  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")` with per-row sequence lengths (the mask's row
          sums, at least 1 so an all-padding filler row stays finite). bf16/fp16 only, head dim a multiple of 8.
  splash  Pallas splash attention (TPU) under `jax.shard_map` over `sharding.BATCH_AXES` of the context mesh;
          padding through segment ids (real tokens 1, padding 0). L a multiple of 128 (else the XLA path).
  auto    cudnn for a cuda target under bf16/fp16, splash for a tpu target, xla otherwise.

Probability dropout (train mode, rate > 0): splash has none, so a tpu target takes the XLA path. cuDNN applies it
inside its kernel (`dropout_rate` and a static `seed` of jax's cuDNN module, a distinct seed per layer), but a static
seed can repeat one mask at every step; a cuda target uses it only where a GPU run of `benchmarks.device_check`
(stage attention) saw the masks differ between steps and between layers with this jax minor version
(`CUDNN_DROPOUT_VERIFIED`); elsewhere the XLA path, with the reason logged once. GP_JAX_CUDNN_DROPOUT=1|0 overrides
(the device check measures with it). Evaluation (no dropout) uses the fused kernel. With the platform deferred
(None), dropout takes the XLA path. cudnn and splash read the mask as right padding (real tokens first), the
pipeline's layout. A target platform of None defers the cpu/cuda/tpu choice to lowering time (`lax.platform_dependent`); it
lowers for one platform at a time: in JAX 0.10 a multi-platform lowering (cpu + tpu in one `jax.export`) runs the
Pallas call's CPU lowering rule on the TPU branch and fails, so multi-platform artifacts use the XLA path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from gp_jax import jax_private
from gp_jax.errors import UserError
from gp_jax.sharding import BATCH_AXES

log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")
FUSED_PLATFORM = {"cudnn": "cuda", "splash": "tpu"}
SPLASH_BLOCK = 128
# jax minor version -> whether cuDNN's fused dropout masks differed between steps and between layers on a GPU
# (benchmarks.device_check, stage attention; docs/device/). Unlisted: not checked, so the XLA path.
CUDNN_DROPOUT_VERIFIED: dict[str, bool] = {}
CUDNN_DROPOUT_ENV = "GP_JAX_CUDNN_DROPOUT"
_logged: set[str] = set()


def _log_once(msg: str) -> None:
  if msg not in _logged:
    _logged.add(msg)
    log.info(msg)


def choose(requested: str, *, platform: str, dtype, length: int, head_dim: int, dropout: bool) -> tuple[str, str]:
  """-> (implementation, why it is not the requested/fused one, or ""). Raises on an explicit request the target
  cannot run (cudnn on a non-cuda target or in float32, splash on a non-tpu target)."""
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f"model.attention must be one of {IMPLEMENTATIONS}, got {requested!r}")
  if requested == "xla":
    return "xla", ""
  if requested == "auto":
    fused = {"cuda": "cudnn", "tpu": "splash"}.get(platform)
    if fused is None:
      return "xla", ""
  else:
    fused = requested
    if platform != FUSED_PLATFORM[fused]:
      raise ValueError(f"model.attention={fused} runs on {FUSED_PLATFORM[fused]}, not on {platform}")
  if fused == "cudnn" and jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    if requested == "cudnn":
      raise ValueError(f"model.attention=cudnn needs bfloat16/float16 compute, got {jnp.dtype(dtype).name}")
    return "xla", f"cuDNN needs bf16/fp16, compute is {jnp.dtype(dtype).name}"
  if fused == "cudnn" and head_dim % 8:
    if requested == "cudnn":
      raise ValueError(f"model.attention=cudnn needs a head dim multiple of 8, got {head_dim}")
    return "xla", f"cuDNN needs a head dim multiple of 8, got {head_dim}"
  if dropout and fused == "splash":
    return "xla", "attention dropout is on (splash has no probability dropout)"
  if dropout:
    ok, why = cudnn_dropout_status()
    if not ok and requested == "cudnn":
      raise UserError(f"model.attention=cudnn with attention dropout: {why}; use model.attention=auto or xla (or "
                      f"model.attention_dropout=0)")
    if not ok:
      return "xla", f"attention dropout is on and {why}"
  if fused == "splash" and length % SPLASH_BLOCK:
    return "xla", f"L={length} is not a multiple of {SPLASH_BLOCK}"
  return fused, ""


@jax.custom_vjp
def _scores_low_grad(q_BLHK, k_BLHK):
  """q . k accumulated and returned in float32, whose gradient is cast to q's dtype before the two matmuls that read
  it (the reference gradient stays float32: a [B, H, L, L] float32 tensor written and read twice, and two float32
  matmuls)."""
  return jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK, preferred_element_type=jnp.float32)


def _scores_fwd(q_BLHK, k_BLHK):
  return _scores_low_grad(q_BLHK, k_BLHK), (q_BLHK, k_BLHK)


def _scores_bwd(res, g_BHLL):
  q_BLHK, k_BLHK = res
  g_BHLL = g_BHLL.astype(q_BLHK.dtype)
  return (jnp.einsum("bhqs,bshk->bqhk", g_BHLL, k_BLHK, preferred_element_type=jnp.float32).astype(q_BLHK.dtype),
          jnp.einsum("bhqs,bqhk->bshk", g_BHLL, q_BLHK, preferred_element_type=jnp.float32).astype(k_BLHK.dtype))


_scores_low_grad.defvjp(_scores_fwd, _scores_bwd)


def xla_attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL, probs_dropout: Callable | None = None,
                  low_precision_grad: bool = False):
  """The einsum path; the output has v's dtype. `low_precision_grad`: the logits' gradient in q's dtype (bf16 under
  mixed precision) where the matmuls read it, as fused attention kernels keep it (`_scores_low_grad`)."""
  B, L, H, K = q_BLHK.shape
  # Scores and softmax in f32 (also under bf16 compute); masked keys get the f32 minimum, so a row with no
  # valid key (an all-padding filler row) is uniform, never NaN.
  if low_precision_grad and q_BLHK.dtype != jnp.float32:
    logits_BHLL = _scores_low_grad(q_BLHK, k_BLHK)
  else:
    logits_BHLL = jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK, preferred_element_type=jnp.float32)
  logits_BHLL = logits_BHLL / np.sqrt(K).astype(np.float32)
  logits_BHLL = jnp.where(mask_BL[:, None, None, :], logits_BHLL, jnp.finfo(jnp.float32).min)
  probs_BHLL = jax.nn.softmax(logits_BHLL, axis=-1).astype(v_BLHK.dtype)
  if probs_dropout is not None:
    probs_BHLL = probs_dropout(probs_BHLL)
  return jnp.einsum("bhqs,bshk->bqhk", probs_BHLL, v_BLHK)


def cudnn_dropout_status(version: str | None = None) -> tuple[bool, str]:
  """(whether a cuda target may use cuDNN's fused dropout, why not): GP_JAX_CUDNN_DROPOUT=1|0, else
  `CUDNN_DROPOUT_VERIFIED` for this jax minor version (`version`: default jax.__version__)."""
  env = os.environ.get(CUDNN_DROPOUT_ENV, "auto").strip().lower()
  if env in ("1", "on", "true", "yes"):
    return True, ""
  if env in ("0", "off", "false", "no"):
    return False, f"{CUDNN_DROPOUT_ENV}={env}"
  minor = ".".join((version or jax.__version__).split(".")[:2])
  verified = CUDNN_DROPOUT_VERIFIED.get(minor)
  if verified is None:
    return False, f"cuDNN's fused dropout is not yet checked on a GPU with jax {minor} (benchmarks.device_check)"
  if not verified:
    return False, f"cuDNN's fused dropout repeats its masks across steps or layers with jax {minor} (docs/device)"
  return True, ""


def cudnn_attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL, dropout_rate: float = 0.0, seed: int = 0):
  """cuDNN flash attention with per-row lengths (right padding); empty rows get length 1 so they stay finite.
  `dropout_rate` > 0: cuDNN drops probabilities inside the kernel, masks from the static `seed`."""
  lengths_B = jnp.maximum(jnp.sum(mask_BL.astype(jnp.int32), axis=-1), 1)
  if not dropout_rate:
    return jax.nn.dot_product_attention(q_BLHK, k_BLHK, v_BLHK, query_seq_lengths=lengths_B,
                                        key_value_seq_lengths=lengths_B, implementation="cudnn")
  fa = jax_private.cudnn_fused_attention()
  if fa is None:
    raise RuntimeError("cuDNN fused attention with dropout: this jax has no jax._src.cudnn module")
  scale = float(1.0 / np.sqrt(q_BLHK.shape[-1]))
  return fa.dot_product_attention(q_BLHK, k_BLHK, v_BLHK, q_seqlen=lengths_B, kv_seqlen=lengths_B, scale=scale,
                                  mask_type=fa.MaskType.PADDING, seed=int(seed), dropout_rate=float(dropout_rate))


def splash_attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL, interpret: bool = False):
  """Splash attention per example, under `jax.shard_map` over the batch axes of the context mesh (none: one
  device). `interpret=True` runs the kernel in the Pallas interpreter (CPU tests)."""
  # Deferred: splash attention loads Pallas' TPU lowering (~0.15 s), needed only on this path.
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top

  _, L, H, K = q_BLHK.shape
  kernel = splash.make_splash_mha(splash.MultiHeadMask([splash.FullMask((L, L))] * H), head_shards=1,
                                  q_seq_shards=1, interpret=interpret)
  scale = np.float32(1.0 / np.sqrt(K))

  def local(q_BLHK, k_BLHK, v_BLHK, mask_BL):
    seg_BL = mask_BL.astype(jnp.int32)  # padding only attends padding: no empty rows
    q_BHLK = (jnp.swapaxes(q_BLHK, 1, 2).astype(jnp.float32) * scale).astype(q_BLHK.dtype)
    run = lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s))  # noqa: E731
    out_BHLK = jax.vmap(run)(q_BHLK, jnp.swapaxes(k_BLHK, 1, 2), jnp.swapaxes(v_BLHK, 1, 2), seg_BL)
    return jnp.swapaxes(out_BHLK, 1, 2)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return local(q_BLHK, k_BLHK, v_BLHK, mask_BL)
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  spec = P(axes)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, spec), out_specs=spec,
                       check_vma=False)(q_BLHK, k_BLHK, v_BLHK, mask_BL)


def _run(impl: str, q_BLHK, k_BLHK, v_BLHK, mask_BL, probs_dropout, dropout_rate: float = 0.0,
         dropout_seed: int = 0, low_precision_grad: bool = False):
  if impl == "cudnn":
    rate = dropout_rate if probs_dropout is not None else 0.0
    return cudnn_attention(q_BLHK, k_BLHK, v_BLHK, mask_BL=mask_BL, dropout_rate=rate, seed=dropout_seed)
  if impl == "splash":
    return splash_attention(q_BLHK, k_BLHK, v_BLHK, mask_BL=mask_BL)
  return xla_attention(q_BLHK, k_BLHK, v_BLHK, mask_BL=mask_BL, probs_dropout=probs_dropout,
                       low_precision_grad=low_precision_grad)


def attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL, implementation: str = "xla", platform: str | None = "cpu",
              probs_dropout: Callable | None = None, dropout_rate: float = 0.0, dropout_seed: int = 0,
              low_precision_grad: bool = False):
  """Self-attention `[B, L, H, K]` x3 -> `[B, L, H, K]` (v's dtype); `mask_BL` bool, True on real keys.

  `platform` is the target the program is compiled for; None defers the choice to lowering time. `probs_dropout`:
  a function applied to the probabilities by the XLA path (its presence means dropout is active); the cuDNN path
  drops with `dropout_rate` and the static `dropout_seed` instead. `low_precision_grad`: the XLA path's logits
  gradient in q's dtype where the matmuls read it (`xla_attention`; a known platform only)."""
  B, L, H, K = q_BLHK.shape
  pick = lambda p: choose(implementation, platform=p, dtype=q_BLHK.dtype, length=L, head_dim=K,  # noqa: E731
                          dropout=probs_dropout is not None)
  if platform is not None:
    impl, why = pick(platform)
    if why:
      _log_once(f"attention={implementation} on {platform}: {impl} ({why})")
    return _run(impl, q_BLHK, k_BLHK, v_BLHK, mask_BL, probs_dropout, dropout_rate, dropout_seed, low_precision_grad)
  impls = {p: (pick(p)[0] if implementation in ("auto", "xla") or FUSED_PLATFORM.get(implementation) == p
               else "xla") for p in ("cuda", "tpu")}
  if impls["cuda"] == "cudnn" and (not cudnn_detected() or probs_dropout is not None):
    impls["cuda"] = "xla"  # tracing the cuDNN call needs cuDNN here; dropout is drawn outside the branches
  if set(impls.values()) == {"xla"}:
    return _run("xla", q_BLHK, k_BLHK, v_BLHK, mask_BL, probs_dropout)
  branches = {p: (lambda q, k, v, m, impl=impl: _run(impl, q, k, v, m, None)) for p, impl in impls.items()}
  default = lambda q, k, v, m: _run("xla", q, k, v, m, None)  # noqa: E731
  return lax.platform_dependent(q_BLHK, k_BLHK, v_BLHK, mask_BL, default=default, **branches)


def cudnn_detected() -> bool:
  """Whether this machine's jaxlib can trace a cuDNN attention call (it raises "cuDNN is not detected" if not)."""
  fa = jax_private.cudnn_fused_attention()
  try:
    fa.check_cudnn_version()
  except (AttributeError, RuntimeError):  # None too
    return False
  return True


__all__ = ["IMPLEMENTATIONS", "attention", "choose", "cudnn_detected", "cudnn_dropout_status", "xla_attention", "cudnn_attention",
           "splash_attention"]
