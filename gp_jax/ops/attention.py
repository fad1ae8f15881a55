"""Multi-head self-attention over padded batches: one entry point, `attention`, for every platform's kernel.

Implementations (`model.attention`):
  xla     einsum scores accumulated in float32, masked keys at the float32 minimum, float32 softmax, optional
          dropout on the probabilities, einsum with v. Any platform, any key mask; the only one with probability
          dropout. Exactly the encoders' attention before this module existed.
  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")` with per-row sequence lengths (the mask's row
          sums, at least 1 so an all-padding filler row stays finite). bf16/fp16 only, head dim a multiple of 8.
  splash  Pallas splash attention (TPU) under `jax.shard_map` over `sharding.BATCH_AXES` of the context mesh;
          padding through segment ids (real tokens 1, padding 0). L a multiple of 128 (else the XLA path).
  auto    cudnn for a cuda target under bf16/fp16, splash for a tpu target, xla otherwise.

The fused kernels have no probability dropout: while it is active (train mode, rate > 0) every request takes the
XLA path, so a run with BERT's 0.1 attention dropout (Su's settings) trains exactly as before; evaluation (no
dropout) uses the fused kernel. cudnn and splash read the mask as right padding (real tokens first), the pipeline's
layout. A target platform of None defers the cpu/cuda/tpu choice to lowering time (`lax.platform_dependent`); it
lowers for one platform at a time: in JAX 0.10 a multi-platform lowering (cpu + tpu in one `jax.export`) runs the
Pallas call's CPU lowering rule on the TPU branch and fails, so multi-platform artifacts use the XLA path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")
FUSED_PLATFORM = {"cudnn": "cuda", "splash": "tpu"}
SPLASH_BLOCK = 128
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
  if dropout:
    return "xla", f"attention dropout is on ({fused} has no probability dropout)"
  if fused == "splash" and length % SPLASH_BLOCK:
    return "xla", f"L={length} is not a multiple of {SPLASH_BLOCK}"
  return fused, ""


def xla_attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL, probs_dropout: Callable | None = None):
  """The einsum path; the output has v's dtype."""
  B, L, H, K = q_BLHK.shape
  # Scores and softmax in f32 (also under bf16 compute); masked keys get the f32 minimum, so a row with no
  # valid key (an all-padding filler row) is uniform, never NaN.
  logits_BHLL = jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK, preferred_element_type=jnp.float32)
  logits_BHLL = logits_BHLL / np.sqrt(K).astype(np.float32)
  logits_BHLL = jnp.where(mask_BL[:, None, None, :], logits_BHLL, jnp.finfo(jnp.float32).min)
  probs_BHLL = jax.nn.softmax(logits_BHLL, axis=-1).astype(v_BLHK.dtype)
  if probs_dropout is not None:
    probs_BHLL = probs_dropout(probs_BHLL)
  return jnp.einsum("bhqs,bshk->bqhk", probs_BHLL, v_BLHK)


def cudnn_attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL):
  """cuDNN flash attention with per-row lengths (right padding); empty rows get length 1 so they stay finite."""
  lengths_B = jnp.maximum(jnp.sum(mask_BL.astype(jnp.int32), axis=-1), 1)
  return jax.nn.dot_product_attention(q_BLHK, k_BLHK, v_BLHK, query_seq_lengths=lengths_B,
                                      key_value_seq_lengths=lengths_B, implementation="cudnn")


def splash_attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL, interpret: bool = False):
  """Splash attention per example, under `jax.shard_map` over the batch axes of the context mesh (none: one
  device). `interpret=True` runs the kernel in the Pallas interpreter (CPU tests)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top

  from gp_jax.sharding import BATCH_AXES  # pylint: disable=g-import-not-at-top

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


def _run(impl: str, q_BLHK, k_BLHK, v_BLHK, mask_BL, probs_dropout):
  if impl == "cudnn":
    return cudnn_attention(q_BLHK, k_BLHK, v_BLHK, mask_BL=mask_BL)
  if impl == "splash":
    return splash_attention(q_BLHK, k_BLHK, v_BLHK, mask_BL=mask_BL)
  return xla_attention(q_BLHK, k_BLHK, v_BLHK, mask_BL=mask_BL, probs_dropout=probs_dropout)


def attention(q_BLHK, k_BLHK, v_BLHK, *, mask_BL, implementation: str = "xla", platform: str | None = "cpu",
              probs_dropout: Callable | None = None):
  """Self-attention `[B, L, H, K]` x3 -> `[B, L, H, K]` (v's dtype); `mask_BL` bool, True on real keys.

  `platform` is the target the program is compiled for; None defers the choice to lowering time. `probs_dropout`:
  a function applied to the probabilities (its presence means dropout is active); only the XLA path has one."""
  B, L, H, K = q_BLHK.shape
  pick = lambda p: choose(implementation, platform=p, dtype=q_BLHK.dtype, length=L, head_dim=K,  # noqa: E731
                          dropout=probs_dropout is not None)
  if platform is not None:
    impl, why = pick(platform)
    if why:
      _log_once(f"attention={implementation} on {platform}: {impl} ({why})")
    return _run(impl, q_BLHK, k_BLHK, v_BLHK, mask_BL, probs_dropout)
  impls = {p: (pick(p)[0] if implementation in ("auto", "xla") or FUSED_PLATFORM.get(implementation) == p
               else "xla") for p in ("cuda", "tpu")}
  if impls["cuda"] == "cudnn" and not cudnn_detected():
    impls["cuda"] = "xla"  # tracing the cuDNN call needs cuDNN on this machine
  if set(impls.values()) == {"xla"}:
    return _run("xla", q_BLHK, k_BLHK, v_BLHK, mask_BL, probs_dropout)
  branches = {p: (lambda q, k, v, m, impl=impl: _run(impl, q, k, v, m, None)) for p, impl in impls.items()}
  default = lambda q, k, v, m: _run("xla", q, k, v, m, None)  # noqa: E731
  return lax.platform_dependent(q_BLHK, k_BLHK, v_BLHK, mask_BL, default=default, **branches)


def cudnn_detected() -> bool:
  """Whether this machine's jaxlib can trace a cuDNN attention call (it raises "cuDNN is not detected" if not)."""
  try:
    from jax._src.cudnn import fused_attention_stablehlo as fa  # pylint: disable=g-import-not-at-top

    fa.check_cudnn_version()
  except (ImportError, RuntimeError):
    return False
  return True


__all__ = ["IMPLEMENTATIONS", "attention", "choose", "cudnn_detected", "xla_attention", "cudnn_attention",
           "splash_attention"]
