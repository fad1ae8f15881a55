"""Token-tagging baselines with the span heads' interface: a softmax tagger and a linear-chain CRF.

Both project hidden states to per-token tag scores with one `nnx.Linear(hidden, T)`; the tag
layout is gp_jax.data.tagging's (BIO: O=0, B-t=1+2t, I-t=2+2t; BIOES: O=0, B/I/E/S-t=1+4t+0..3).
They run over content tokens only: each row is shifted left by its first content column (the
argmax of `span_mask_BL`), so the tagger sees a prefix mask and [CLS]/[SEP] drop out; decoded
coordinates are shifted back to the window's columns. Decoding returns hits in
`gp_jax.ops.gather_hits` format, spans read from the tags on device (`tags_to_hits`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax.data import tagging
from gp_jax.models.layers import linear
from gp_jax.ops import crf


def _content(x_BL, offset_B):
  """Rows of `x` ([B, L, ...]) shifted left by `offset_B`; the tail repeats the last column."""
  L = x_BL.shape[1]
  idx_BL = jnp.minimum(jnp.arange(L)[None] + offset_B[:, None], L - 1)
  idx = idx_BL.reshape(idx_BL.shape + (1,) * (x_BL.ndim - 2))
  return jnp.take_along_axis(x_BL, idx, axis=1)


def content_window(emissions_BLT, span_mask_BL):
  """-> (emissions over content tokens [B, L, T], prefix mask_BL, offset_B = first content column)."""
  span_mask_BL = jnp.asarray(span_mask_BL).astype(bool)
  L = span_mask_BL.shape[1]
  offset_B = jnp.argmax(span_mask_BL, axis=1).astype(jnp.int32)
  inside_BL = jnp.arange(L)[None] + offset_B[:, None] < L
  mask_BL = _content(span_mask_BL, offset_B) & inside_BL
  return _content(emissions_BLT, offset_B), mask_BL, offset_B


def tags_to_hits(tags_BL, *, scheme: str, size: int, offset_B=None, token_scores_BL=None, hit_sharding=None):
  """Tag ids `[B, L]` (negative = O) -> (count, coords `[size, 4]` (b, type, start, end), scores `[size]`).

  Vectorised twin of `tagging.tags_to_spans` (same lenient repairs). `offset_B` is added to
  start/end; a span's score is the mean of `token_scores_BL` over it (1.0 when None). As in
  `gather_hits`, count may exceed size; unused rows hold zeros.
  """
  width = len(tagging.PREFIXES[tagging.normalize_scheme(scheme)])
  B, L = tags_BL.shape
  inside_BL = tags_BL > 0
  code_BL = jnp.where(inside_BL, (tags_BL - 1) % width, -1)  # 0 B, 1 I, 2 E, 3 S
  kind_BL = jnp.where(inside_BL, (tags_BL - 1) // width, -1)
  opens_BL = (code_BL == 0) | (code_BL == 1)  # B-X / I-X leave an X entity open
  shift = lambda x, fill: jnp.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=fill)
  continues_BL = (((code_BL == 1) | (code_BL == 2)) & shift(opens_BL, False)
                  & (shift(kind_BL, -1) == kind_BL))
  starts_BL = inside_BL & ~continues_BL
  next_continues_BL = jnp.pad(continues_BL[:, 1:], ((0, 0), (0, 1)), constant_values=False)
  ends_BL = inside_BL & ((code_BL >= 2) | ~next_continues_BL)
  pos_BL = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
  next_end_BL = jax.lax.cummin(jnp.where(ends_BL, pos_BL, L), axis=1, reverse=True)

  if hit_sharding is not None:
    starts_BL = jax.lax.with_sharding_constraint(starts_BL, hit_sharding)
  count = jnp.sum(starts_BL, dtype=jnp.int32)
  b, s = jnp.nonzero(starts_BL, size=size, fill_value=0)
  e = next_end_BL[b, s]
  if token_scores_BL is None:
    scores = jnp.ones((size,), jnp.float32)
  else:
    cum_BL = jnp.pad(jnp.cumsum(token_scores_BL.astype(jnp.float32), axis=1), ((0, 0), (1, 0)))
    scores = (cum_BL[b, e + 1] - cum_BL[b, s]) / (e - s + 1).astype(jnp.float32)
  offset = 0 if offset_B is None else offset_B[b]
  used = jnp.arange(size) < count
  coords = jnp.stack([b, kind_BL[b, s], s + offset, e + offset], axis=-1)
  return count, jnp.where(used[:, None], coords, 0), jnp.where(used, scores, 0.0)


class _Tagger(nnx.Module):
  """Emission projection and settings shared by both taggers."""

  def __init__(self, hidden_size: int, num_types: int, *, scheme: str = "BIO", dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.num_types = num_types
    self.scheme = tagging.normalize_scheme(scheme)
    self.num_tags = tagging.num_tags(num_types, self.scheme)
    self.dense = linear(hidden_size, self.num_tags, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, hidden_BLD, span_mask_BL=None, *, positions=None):
    """Per-token tag scores `[B, L, T]`, float32 (window coordinates, not shifted)."""
    del span_mask_BL, positions
    return self.dense(hidden_BLD).astype(jnp.float32)

  def _decode_tags(self, emissions_BLT, mask_BL):
    raise NotImplementedError

  def decode_hits(self, hidden_BLD, span_mask_BL, *, positions=None, size: int, block_size=None,
                  threshold: float = 0.0, hit_sharding=None):
    """Tagged spans as `gather_hits` hits, in window columns. positions/block_size/threshold: unused."""
    del positions, block_size, threshold
    emissions_BLT, mask_BL, offset_B = content_window(self(hidden_BLD), span_mask_BL)
    tags_BL, token_scores_BL = self._decode_tags(emissions_BLT, mask_BL)
    return tags_to_hits(tags_BL, scheme=self.scheme, size=size, offset_B=offset_B,
                        token_scores_BL=token_scores_BL, hit_sharding=hit_sharding)


class SoftmaxTagger(_Tagger):
  """Independent per-token softmax over tags; decoding is the argmax tag, repaired leniently.

  A decoded span scores the mean probability of its tokens' argmax tags.
  """

  def tag_loss(self, hidden_BLD, span_mask_BL, *, tags_BL):
    """Token cross-entropy averaged over content tokens (tokens with tag < 0 are skipped too)."""
    logp_BLT = jax.nn.log_softmax(self(hidden_BLD), axis=-1)
    valid_BL = jnp.asarray(span_mask_BL).astype(bool) & (tags_BL >= 0)
    gold_BL = jnp.take_along_axis(logp_BLT, jnp.where(valid_BL, tags_BL, 0)[..., None], axis=-1)[..., 0]
    return -jnp.sum(jnp.where(valid_BL, gold_BL, 0.0)) / jnp.maximum(jnp.sum(valid_BL), 1)

  def _decode_tags(self, emissions_BLT, mask_BL):
    probs_BLT = jax.nn.softmax(emissions_BLT, axis=-1)
    tags_BL = jnp.where(mask_BL, jnp.argmax(emissions_BLT, axis=-1), -1).astype(jnp.int32)
    return tags_BL, jnp.max(probs_BLT, axis=-1)


class CrfTagger(_Tagger):
  """Linear-chain CRF over the emissions, with the scheme's transition constraints.

  Parameters besides the projection: `transitions` [T, T], `start` [T], `end` [T] (zeros init).
  Forbidden moves, first tags and last tags score -inf in the loss and in Viterbi, so decoded
  tags always form a valid sequence. Gold tags must be valid too (`tagging.spans_to_tags` output
  is); a forbidden gold move makes that row's NLL +inf. Decoded spans score 1.0.
  """

  def __init__(self, hidden_size: int, num_types: int, *, scheme: str = "BIO", dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    super().__init__(hidden_size, num_types, scheme=scheme, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    T = self.num_tags
    self.transitions = nnx.Param(jnp.zeros((T, T), param_dtype))
    self.start = nnx.Param(jnp.zeros((T,), param_dtype))
    self.end = nnx.Param(jnp.zeros((T,), param_dtype))

  def _crf_scores(self):
    """Keyword arguments for the ops.crf functions, constraints folded in."""
    allowed_TT, allowed_start_T = tagging.transition_constraints(self.num_types, self.scheme)
    allowed_end_T = tagging.end_constraints(self.num_types, self.scheme)
    return dict(start_T=crf.constrain_scores(self.start[...], allowed_T=allowed_start_T),
                end_T=crf.constrain_scores(self.end[...], allowed_T=allowed_end_T),
                allowed_TT=allowed_TT)

  def tag_loss(self, hidden_BLD, span_mask_BL, *, tags_BL):
    """Negative log-likelihood averaged over rows with at least one content token."""
    emissions_BLT, mask_BL, offset_B = content_window(self(hidden_BLD), span_mask_BL)
    tags_BL = jnp.where(mask_BL, _content(tags_BL, offset_B), -1)
    kwargs = dict(mask_BL=mask_BL, **self._crf_scores())
    transitions_TT = self.transitions[...]
    log_z_B = crf.crf_log_partition(emissions_BLT, transitions_TT, **kwargs)
    gold_B = crf.crf_sequence_score(emissions_BLT, tags_BL, transitions_TT, **kwargs)
    rows_B = mask_BL[:, 0]
    return jnp.sum(jnp.where(rows_B, log_z_B - gold_B, 0.0)) / jnp.maximum(jnp.sum(rows_B), 1)

  def _decode_tags(self, emissions_BLT, mask_BL):
    tags_BL, _ = crf.viterbi_decode(emissions_BLT, self.transitions[...], mask_BL=mask_BL,
                                    **self._crf_scores())
    return tags_BL, None


TAGGERS = {"softmax": SoftmaxTagger, "crf": CrfTagger}

__all__ = ["SoftmaxTagger", "CrfTagger", "TAGGERS", "tags_to_hits", "content_window"]
