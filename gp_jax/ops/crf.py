"""Linear-chain CRF in log space: partition function, path score, Viterbi (pure jax.numpy).

Tags are ids 0..T-1. The scheme layout (gp_jax.data.tagging) is
  BIO:   O = 0, B-t = 1 + 2t, I-t = 2 + 2t                          (T = 1 + 2H)
  BIOES: O = 0, B-t, I-t, E-t, S-t = 1 + 4t + 0, 1, 2, 3             (T = 1 + 4H)
but nothing here depends on it.

Masks are prefix masks (valid positions first). A masked position leaves the recursion state
unchanged, so `end_T` scores the last valid tag; a row with no valid position scores 0.
All arithmetic is float32 whatever the input dtype.

Constraints: `allowed_TT[i, j]` (bool) says whether tag i may be followed by tag j; forbidden
moves score -inf inside the recursions (no large finite constant). Forbidden first or last tags
(I-X first in BIO; B-X/I-X last in BIOES) are folded into the boundary scores:

  start_T = constrain_scores(start_T, allowed_T=allowed_start_T)   # -inf where not allowed
  end_T = constrain_scores(end_T, allowed_T=allowed_end_T)

Paths with a forbidden move get probability 0: they drop out of the partition function and of
Viterbi, and `crf_sequence_score` gives them -inf (their NLL is +inf). Log-sum-exp is written so
that an unreachable state (every term -inf) yields -inf with zero, not NaN, gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def constrain_scores(scores_T, *, allowed_T):
  """Boundary scores (or None = zeros) with -inf where `allowed_T` is False; float32."""
  allowed_T = jnp.asarray(allowed_T, bool)
  if scores_T is None:
    scores_T = jnp.zeros(allowed_T.shape, jnp.float32)
  return jnp.where(allowed_T, jnp.asarray(scores_T).astype(jnp.float32), -jnp.inf)


def _logsumexp(x, axis):
  """log(sum(exp(x))) over `axis`; all -inf gives -inf with finite (zero) gradients."""
  m = jnp.max(x, axis=axis, keepdims=True)
  m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
  s = jnp.sum(jnp.exp(x - m), axis=axis)
  some = s > 0
  return jnp.where(some, jnp.log(jnp.where(some, s, 1.0)) + jnp.squeeze(m, axis), -jnp.inf)


def _prepare(emissions_BLT, transitions_TT, mask_BL, start_T, end_T, allowed_TT):
  f32 = jnp.float32
  emissions_BLT = jnp.asarray(emissions_BLT).astype(f32)
  num_tags = emissions_BLT.shape[-1]
  transitions_TT = jnp.asarray(transitions_TT).astype(f32)
  if allowed_TT is not None:
    transitions_TT = jnp.where(jnp.asarray(allowed_TT, bool), transitions_TT, -jnp.inf)
  start_T = jnp.zeros(num_tags, f32) if start_T is None else jnp.asarray(start_T).astype(f32)
  end_T = jnp.zeros(num_tags, f32) if end_T is None else jnp.asarray(end_T).astype(f32)
  return emissions_BLT, transitions_TT, jnp.asarray(mask_BL).astype(bool), start_T, end_T


def _time_major(emissions_BLT, mask_BL):
  """Positions 1..L-1 as scan inputs: ([L-1, B, T], [L-1, B])."""
  return jnp.swapaxes(emissions_BLT[:, 1:], 0, 1), jnp.swapaxes(mask_BL[:, 1:], 0, 1)


def crf_log_partition(emissions_BLT, transitions_TT, *, mask_BL, start_T=None, end_T=None, allowed_TT=None):
  """log sum over tag paths of exp(path score) -> `[B]` float32 (forward algorithm)."""
  emissions_BLT, transitions_TT, mask_BL, start_T, end_T = _prepare(
      emissions_BLT, transitions_TT, mask_BL, start_T, end_T, allowed_TT)

  def step(alpha_BT, xs):
    emissions_BT, mask_B = xs
    next_BT = _logsumexp(alpha_BT[:, :, None] + transitions_TT, axis=1) + emissions_BT
    return jnp.where(mask_B[:, None], next_BT, alpha_BT), None

  alpha_BT = start_T + emissions_BLT[:, 0]
  alpha_BT, _ = jax.lax.scan(step, alpha_BT, _time_major(emissions_BLT, mask_BL))
  return jnp.where(mask_BL[:, 0], _logsumexp(alpha_BT + end_T, axis=-1), 0.0)


def crf_sequence_score(emissions_BLT, tags_BL, transitions_TT, *, mask_BL, start_T=None, end_T=None,
                       allowed_TT=None):
  """Score of the given tag path -> `[B]` float32; tags at masked positions (-1 too) are ignored."""
  emissions_BLT, transitions_TT, mask_BL, start_T, end_T = _prepare(
      emissions_BLT, transitions_TT, mask_BL, start_T, end_T, allowed_TT)
  tags_BL = jnp.where(mask_BL, jnp.asarray(tags_BL), 0).astype(jnp.int32)
  emit_BL = jnp.take_along_axis(emissions_BLT, tags_BL[..., None], axis=-1)[..., 0]
  move_BL = transitions_TT[tags_BL[:, :-1], tags_BL[:, 1:]]  # [B, L-1]
  last_B = jnp.maximum(jnp.sum(mask_BL, axis=1) - 1, 0)
  last_tag_B = jnp.take_along_axis(tags_BL, last_B[:, None], axis=1)[:, 0]
  score_B = (start_T[tags_BL[:, 0]] + end_T[last_tag_B]
             + jnp.sum(jnp.where(mask_BL, emit_BL, 0.0), axis=1)
             + jnp.sum(jnp.where(mask_BL[:, 1:], move_BL, 0.0), axis=1))
  return jnp.where(mask_BL[:, 0], score_B, 0.0)


def viterbi_decode(emissions_BLT, transitions_TT, *, mask_BL, start_T=None, end_T=None, allowed_TT=None):
  """Best tag path -> (tags int32 `[B, L]` with -1 at masked positions, its score `[B]` float32)."""
  emissions_BLT, transitions_TT, mask_BL, start_T, end_T = _prepare(
      emissions_BLT, transitions_TT, mask_BL, start_T, end_T, allowed_TT)
  num_tags = emissions_BLT.shape[-1]
  stay_T = jnp.arange(num_tags, dtype=jnp.int32)

  def forward(delta_BT, xs):
    emissions_BT, mask_B = xs
    cand_BTT = delta_BT[:, :, None] + transitions_TT
    next_BT = jnp.max(cand_BTT, axis=1) + emissions_BT
    back_BT = jnp.argmax(cand_BTT, axis=1).astype(jnp.int32)
    # Masked steps keep the state and point each tag to itself.
    return jnp.where(mask_B[:, None], next_BT, delta_BT), jnp.where(mask_B[:, None], back_BT, stay_T)

  def backward(tag_B, back_BT):
    return jnp.take_along_axis(back_BT, tag_B[:, None], axis=1)[:, 0], tag_B

  delta_BT = start_T + emissions_BLT[:, 0]
  delta_BT, back_LBT = jax.lax.scan(forward, delta_BT, _time_major(emissions_BLT, mask_BL))
  final_BT = delta_BT + end_T
  last_B = jnp.argmax(final_BT, axis=-1).astype(jnp.int32)
  first_B, rest_LB = jax.lax.scan(backward, last_B, back_LBT, reverse=True)
  tags_BL = jnp.concatenate([first_B[:, None], jnp.swapaxes(rest_LB, 0, 1)], axis=1)
  tags_BL = jnp.where(mask_BL, tags_BL, -1)
  return tags_BL, jnp.where(mask_BL[:, 0], jnp.max(final_BT, axis=-1), 0.0)


__all__ = ["crf_log_partition", "crf_sequence_score", "viterbi_decode", "constrain_scores"]
