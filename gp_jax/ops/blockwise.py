"""Blockwise (and banded) GlobalPointer loss and decoding without a `[B, H, L, L]` score tensor.

Scores s[b, h, i, j] = q_i . k_j / sqrt(d) (+ start_bias[b, h, i]) (+ end_bias[b, h, j]) are built
one tile at a time over the upper triangle (flash-attention style): tiles below the diagonal are
never visited, and with `max_span_width=W` only the band j - i < W is (a `[bs, bs + W - 1]` window per
row block, cost O(L * W)). The loss keeps an online log-sum-exp in float32 for the negatives; its
backward pass (a `jax.custom_vjp`) recomputes each tile instead of storing scores (banded: it keeps the
forward's O(L * W) band of exponentials instead). Positives are gathered directly from q and k.
`implementation="pallas"` computes the negative term with the kernels of `ops.pallas_zlpr` instead of the scan.

q/k may carry one head shared by all H types (Efficient GlobalPointer): q, k `[B, L, 1, d]` with
`[B, H, L]` biases broadcast the shared score over the types.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from gp_jax.ops import pallas_zlpr
from gp_jax.ops.losses import _log1p_sum_exp


_STEP_CELLS = 1 << 21  # banded: row blocks per loop step so that a step holds about this many scores
IMPLEMENTATIONS = ("auto", "xla", "pallas")  # loss.implementation
# Platforms where the Pallas kernel was timed faster than the XLA op ("auto" picks it there): none yet, the kernel
# has only run interpreted on CPU and been lowered (not compiled) for TPU; see docs/benchmarks.md.
PALLAS_FASTER_ON: frozenset[str] = frozenset()
# Platforms the kernel has a body for when compiled (elsewhere it would run the Pallas interpreter): a cuda or rocm
# target refuses implementation="pallas" (`pallas_refusal`).
PALLAS_GPU_PLATFORMS = ("cuda", "rocm", "gpu")
PALLAS_GPU_REFUSED = "has no GPU kernel (on a GPU it would run the Pallas interpreter)"


def pallas_refusal(platform: str | None) -> str | None:
  """Why implementation="pallas" is refused for the target `platform`, or None."""
  if platform in PALLAS_GPU_PLATFORMS:
    return f"loss.implementation=pallas {PALLAS_GPU_REFUSED}: use loss.implementation=xla or auto on {platform}"
  return None


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Static tiling. Loop step t covers `group` row blocks of `rows` rows from row_starts[t]; row block g
  meets the `cols` columns from col_starts[t] + g * rows. Full triangle: group 1, square tiles."""

  length: int  # L of the unpadded input (flat span ids are i * L + j)
  rows: int
  cols: int
  group: int
  row_starts: tuple[int, ...]
  col_starts: tuple[int, ...]
  max_span_width: int | None

  @property
  def pieces(self):  # row-block-sized pieces of one column window
    return -(-self.cols // self.rows)

  @property
  def k_span(self):  # columns a step reads
    return (self.group + self.pieces - 1) * self.rows

  @property
  def banded(self):  # O(L * W) cells: cheap enough to keep for the backward pass
    return self.group > 1 or self.cols != self.rows

  @property
  def q_len(self):
    return max(self.row_starts) + self.group * self.rows

  @property
  def k_len(self):
    return max(self.col_starts) + self.k_span


def _check_sizes(block_size: int, max_span_width: int | None):
  if block_size < 1:
    raise ValueError(f"block_size must be >= 1, got {block_size}")
  if max_span_width is not None and max_span_width < 1:
    raise ValueError(f"max_span_width must be >= 1, got {max_span_width}")


def _make_plan(length: int, block_size: int, max_span_width: int | None, cells_per_block: int) -> _Plan:
  _check_sizes(block_size, max_span_width)
  bs = max(1, min(block_size, length))
  n = -(-length // bs)
  W = max_span_width
  # Upper-triangle tiles (bs x bs), restricted to those touching the band when W is set.
  tiles = [(r, c) for r in range(n) for c in range(r, n) if W is None or (c - r) * bs <= bs + W - 2]
  plan = _Plan(length, bs, bs, 1, tuple(r * bs for r, _ in tiles), tuple(c * bs for _, c in tiles), W)
  if W is not None and n * (bs + W - 1) <= len(tiles) * bs:
    # Banded: a window of bs + W - 1 columns per row block (fewer cells visited), G blocks per step.
    cols = bs + W - 1
    group = max(1, min(n, _STEP_CELLS // max(1, cells_per_block * bs * cols)))
    steps = -(-n // group)
    group = -(-n // steps)
    starts = tuple(t * group * bs for t in range(steps))
    plan = _Plan(length, bs, cols, group, starts, starts, W)
  return plan


def _windows(plan, x, start, axis):
  """Slice of x along `axis` from `start` -> per row block windows: that axis becomes (group, cols)."""
  G, R, C = plan.group, plan.rows, plan.cols
  xs = jax.lax.dynamic_slice_in_dim(x, start, plan.k_span, axis=axis)
  blocks = xs.reshape(xs.shape[:axis] + (G + plan.pieces - 1, R) + xs.shape[axis + 1 :])
  pieces = [
      jax.lax.slice_in_dim(jax.lax.slice_in_dim(blocks, p, p + G, axis=axis), 0, min(R, C - p * R), axis=axis + 1)
      for p in range(plan.pieces)
  ]
  return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=axis + 1)


def _add_windows(plan, acc, upd, start, axis):
  """The transpose of `_windows`: adds per-block windows `upd` back into `acc` from `start`."""
  G, R, C, P = plan.group, plan.rows, plan.cols, plan.pieces
  total = 0
  for p in range(P):
    w = min(R, C - p * R)
    piece = jax.lax.slice_in_dim(upd, p * R, p * R + w, axis=axis + 1)
    pad = [(0, 0)] * upd.ndim
    pad[axis], pad[axis + 1] = (p, P - 1 - p), (0, R - w)
    total = total + (jnp.pad(piece, pad) if P > 1 or w < R else piece)
  total = total.reshape(upd.shape[:axis] + ((G + P - 1) * R,) + upd.shape[axis + 2 :])
  old = jax.lax.dynamic_slice_in_dim(acc, start, total.shape[axis], axis=axis)
  return jax.lax.dynamic_update_slice_in_dim(acc, old + total, start, axis=axis)


def _rows(plan, x, start, axis):
  """Slice of x along `axis` from `start` -> that axis becomes (group, rows)."""
  xs = jax.lax.dynamic_slice_in_dim(x, start, plan.group * plan.rows, axis=axis)
  return xs.reshape(xs.shape[:axis] + (plan.group, plan.rows) + xs.shape[axis + 1 :])


def _add_rows(plan, acc, upd, start, axis):
  upd = upd.reshape(upd.shape[:axis] + (plan.group * plan.rows,) + upd.shape[axis + 2 :])
  old = jax.lax.dynamic_slice_in_dim(acc, start, upd.shape[axis], axis=axis)
  return jax.lax.dynamic_update_slice_in_dim(acc, old + upd, start, axis=axis)


def _tile_scores(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, r0, c0):
  """float32 scores of one step `[B, H, G, rows, cols]` and the q/k slices it used."""
  q_BHGRD = _rows(plan, q_BHLD, r0, 2)
  k_BHGCD = _windows(plan, k_BHLD, c0, 2)
  s_BHGRC = jnp.einsum("bhgrd,bhgcd->bhgrc", q_BHGRD, k_BHGCD, preferred_element_type=jnp.float32)
  s_BHGRC = s_BHGRC / math.sqrt(q_BHLD.shape[-1])
  if sb_BHL is not None:
    s_BHGRC = s_BHGRC + _rows(plan, sb_BHL, r0, 2)[..., :, None]
  if eb_BHL is not None:
    s_BHGRC = s_BHGRC + _windows(plan, eb_BHL, c0, 2)[..., None, :]
  return s_BHGRC, q_BHGRD, k_BHGCD


def _tile_valid(plan, valid_q_BL, valid_k_BL, r0, c0):
  """bool `[B, 1, G, rows, cols]`: both tokens valid, i <= j, j - i < W."""
  # j - i = (c0 - r0) + c - r for every row block of the step.
  diff_RC = (c0 - r0) + jnp.arange(plan.cols)[None, :] - jnp.arange(plan.rows)[:, None]
  allowed_RC = diff_RC >= 0
  if plan.max_span_width is not None:
    allowed_RC &= diff_RC < plan.max_span_width
  vr_BGR = _rows(plan, valid_q_BL, r0, 1)
  vc_BGC = _windows(plan, valid_k_BL, c0, 1)
  return (vr_BGR[..., :, None] & vc_BGC[..., None, :] & allowed_RC)[:, None]


GOLD_CHUNK = 32  # sorted gold ids scattered per loop iteration of a step


@dataclasses.dataclass(frozen=True)
class _Gold:
  """Each (b, h)'s gold ids sorted by (i, j) (`pallas_zlpr.sorted_gold`: invalid ids as L*L at the end) and, per
  loop step t, the [lo, hi) range of those whose row lies in the step's rows: a step scatters only them, in chunks
  of GOLD_CHUNK, so the -1 padding of `span_ids` (K = L from the pipeline) costs nothing per step."""

  keys_BHK: jax.Array
  lo_TBH: jax.Array
  hi_TBH: jax.Array

  @classmethod
  def of(cls, plan, span_ids_BHK):
    L = plan.length
    keys_BHK, _ = pallas_zlpr.sorted_gold(span_ids_BHK, length=L, tile=L, blocks=1, by_column=False)
    starts = jnp.asarray(plan.row_starts, jnp.int32)
    ends = jnp.minimum(starts + plan.group * plan.rows, L)
    search = lambda k, x: jnp.searchsorted(k, x, side="left")  # noqa: E731
    rows = lambda x: jnp.moveaxis(jax.vmap(jax.vmap(lambda k: search(k, x * L)))(keys_BHK), -1, 0)  # noqa: E731
    return cls(keys_BHK, rows(starts).astype(jnp.int32), rows(ends).astype(jnp.int32))


jax.tree_util.register_dataclass(_Gold, data_fields=["keys_BHK", "lo_TBH", "hi_TBH"], meta_fields=[])


def _tile_gold(plan, keys_BHK, lo_BH, hi_BH, r0, c0):
  """bool `[B, H, G, rows, cols]`: the gold cells of this step, scattered from the sorted ids of its rows only."""
  B, H, K = keys_BHK.shape
  L, R = plan.length, plan.rows
  b = jnp.arange(B)[:, None, None]
  h = jnp.arange(H)[None, :, None]
  chunks = (jnp.max(hi_BH - lo_BH) + GOLD_CHUNK - 1) // GOLD_CHUNK

  def scatter(c, gold):
    idx_BHC = lo_BH[..., None] + c * GOLD_CHUNK + jnp.arange(GOLD_CHUNK)
    key_BHC = jnp.take_along_axis(keys_BHK, jnp.minimum(idx_BHC, K - 1), axis=-1)
    li = key_BHC // L - r0
    g = li // R
    lc = key_BHC % L - c0 - g * R
    inside = (idx_BHC < hi_BH[..., None]) & (lc >= 0) & (lc < plan.cols)
    g = jnp.where(inside, g, plan.group)  # out of range: dropped
    return gold.at[b, h, g, li % R, jnp.where(inside, lc, 0)].set(True, mode="drop")

  return jax.lax.fori_loop(0, chunks, scatter, jnp.zeros((B, H, plan.group, R, plan.cols), bool))


def _num_types(q_BHLD, sb_BHL, eb_BHL):
  for bias in (sb_BHL, eb_BHL):
    if bias is not None:
      return bias.shape[1]
  return q_BHLD.shape[1]


def _neg_scan(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, gold: _Gold, *, save: bool):
  """Online log-sum-exp over the steps -> (`[B, H]` log(1 + sum e^s), per step (e^(s - m_t), m_t) if save)."""
  B = q_BHLD.shape[0]
  H = _num_types(q_BHLD, sb_BHL, eb_BHL)
  starts = (jnp.asarray(plan.row_starts, jnp.int32), jnp.asarray(plan.col_starts, jnp.int32), gold.lo_TBH,
            gold.hi_TBH)

  def body(carry, step):
    m_BH, rest_BH = carry
    r0, c0, lo_BH, hi_BH = step
    s_BHGRC, _, _ = _tile_scores(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, r0, c0)
    neg_BHGRC = (_tile_valid(plan, valid_q_BL, valid_k_BL, r0, c0)
                 & ~_tile_gold(plan, gold.keys_BHK, lo_BH, hi_BH, r0, c0))
    s_BHGRC = jnp.where(neg_BHGRC, s_BHGRC, -jnp.inf)
    m_new = jnp.maximum(m_BH, jnp.max(s_BHGRC, axis=(2, 3, 4)))  # m starts at 0: always finite
    e_BHGRC = jnp.exp(s_BHGRC - m_new[..., None, None, None])
    rest_BH = rest_BH * jnp.exp(m_BH - m_new) + jnp.sum(e_BHGRC, axis=(2, 3, 4))
    return (m_new, rest_BH), ((e_BHGRC, m_new) if save else None)

  zeros_BH = jnp.zeros((B, H), jnp.float32)
  (m_BH, rest_BH), saved = jax.lax.scan(body, (zeros_BH, zeros_BH), starts)
  # log(1 + sum e^s) = m + log(e^-m + rest); log1p keeps precision when m == 0.
  out_BH = jnp.where(m_BH > 0, m_BH + jnp.log(jnp.exp(-m_BH) + rest_BH), jnp.log1p(rest_BH))
  return out_BH, saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _neg_term(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, gold):
  """`[B, H]` float32: log(1 + sum over valid, non-gold cells of e^s)."""
  return _neg_scan(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, gold, save=False)[0]


def _neg_fwd(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, gold):
  # Banded: keep the O(L * W) band of e^(s - m_t); full triangle: keep nothing, recompute tiles.
  out_BH, saved = _neg_scan(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, gold, save=plan.banded)
  return out_BH, (q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, gold, out_BH, saved)


def _neg_bwd(plan, res, g_BH):
  q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, gold, out_BH, saved = res
  Hq = q_BHLD.shape[1]
  scale = 1.0 / math.sqrt(q_BHLD.shape[-1])
  starts = (jnp.asarray(plan.row_starts, jnp.int32), jnp.asarray(plan.col_starts, jnp.int32), gold.lo_TBH,
            gold.hi_TBH)
  g_BH = g_BH.astype(jnp.float32)

  def body(carry, xs):
    dq, dk, dsb, deb = carry
    (r0, c0, lo_BH, hi_BH), saved_t = xs
    if saved_t is None:  # recompute the tile
      s_BHGRC, q_BHGRD, k_BHGCD = _tile_scores(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, r0, c0)
      neg_BHGRC = (_tile_valid(plan, valid_q_BL, valid_k_BL, r0, c0)
                   & ~_tile_gold(plan, gold.keys_BHK, lo_BH, hi_BH, r0, c0))
      # d/ds log(1 + sum e^s) = e^(s - out); masked cells get exp(-inf) = 0, never inf * 0.
      p_BHGRC = jnp.exp(jnp.where(neg_BHGRC, s_BHGRC - out_BH[..., None, None, None], -jnp.inf))
    else:  # e^(s - out) = e^(s - m_t) e^(m_t - out); masked cells hold 0
      e_BHGRC, m_BH = saved_t
      q_BHGRD, k_BHGCD = _rows(plan, q_BHLD, r0, 2), _windows(plan, k_BHLD, c0, 2)
      p_BHGRC = e_BHGRC * jnp.exp(m_BH - out_BH)[..., None, None, None]
    ds_BHGRC = p_BHGRC * g_BH[..., None, None, None]
    if sb_BHL is not None:
      dsb = _add_rows(plan, dsb, jnp.sum(ds_BHGRC, axis=4), r0, 2)
    if eb_BHL is not None:
      deb = _add_windows(plan, deb, jnp.sum(ds_BHGRC, axis=3), c0, 2)
    if Hq != ds_BHGRC.shape[1]:  # one shared q/k head for all types
      ds_BHGRC = jnp.sum(ds_BHGRC, axis=1, keepdims=True)
    ds_BHGRC = ds_BHGRC * scale
    dq = _add_rows(plan, dq, jnp.einsum("bhgrc,bhgcd->bhgrd", ds_BHGRC, k_BHGCD.astype(jnp.float32)), r0, 2)
    dk = _add_windows(plan, dk, jnp.einsum("bhgrc,bhgrd->bhgcd", ds_BHGRC, q_BHGRD.astype(jnp.float32)), c0, 2)
    return (dq, dk, dsb, deb), None

  zeros = lambda x: None if x is None else jnp.zeros(x.shape, jnp.float32)  # noqa: E731
  init = (zeros(q_BHLD), zeros(k_BHLD), zeros(sb_BHL), zeros(eb_BHL))
  (dq, dk, dsb, deb), _ = jax.lax.scan(body, init, (starts, saved))
  cast = lambda d, x: None if x is None else d.astype(x.dtype)  # noqa: E731
  no_grad = jax.tree.map(lambda _: None, gold)
  return (cast(dq, q_BHLD), cast(dk, k_BHLD), cast(dsb, sb_BHL), cast(deb, eb_BHL), None, None, no_grad)


_neg_term.defvjp(_neg_fwd, _neg_bwd)


def _check_qk(q_BLHD, k_BLHD):
  if q_BLHD.shape != k_BLHD.shape or q_BLHD.ndim != 4:
    raise ValueError(f"expected q, k of equal shape [B, L, H, d], got {q_BLHD.shape} and {k_BLHD.shape}")


def _prepare(q_BLHD, k_BLHD, attention_mask, start_bias_BHL, end_bias_BHL, plan):
  """Heads-major, padded copies: q rows to plan.q_len, k columns to plan.k_len (padding is invalid)."""
  _check_qk(q_BLHD, k_BLHD)
  L = q_BLHD.shape[1]
  pad = lambda x, n, axis: jnp.pad(x, [(0, n - L if a == axis else 0) for a in range(x.ndim)])  # noqa: E731
  q_BHLD = pad(jnp.swapaxes(q_BLHD, 1, 2), plan.q_len, 2)
  k_BHLD = pad(jnp.swapaxes(k_BLHD, 1, 2), plan.k_len, 2)
  sb_BHL = None if start_bias_BHL is None else pad(jnp.asarray(start_bias_BHL, jnp.float32), plan.q_len, 2)
  eb_BHL = None if end_bias_BHL is None else pad(jnp.asarray(end_bias_BHL, jnp.float32), plan.k_len, 2)
  valid_BL = jnp.asarray(attention_mask).astype(bool)
  return q_BHLD, k_BHLD, sb_BHL, eb_BHL, pad(valid_BL, plan.q_len, 1), pad(valid_BL, plan.k_len, 1)


def blockwise_zlpr_loss(
    q_BLHD,
    k_BLHD,
    *,
    span_ids,
    attention_mask,
    start_bias_BHL=None,
    end_bias_BHL=None,
    max_span_width: int | None = None,
    block_size: int = 128,
    implementation: str = "auto",
):
  """Sparse ZLPR loss of GlobalPointer scores, built tile by tile.

  Args:
    q_BLHD, k_BLHD: rotated queries/keys `[B, L, Hq, d]`; Hq is H, or 1 shared by H biased types.
    span_ids: int `[B, H, K]`, flat gold cells `i * L + j`, padded with -1; ids outside the span mask
      are ignored.
    attention_mask: `[B, L]` {0,1} (the mask given to `span_mask`).
    start_bias_BHL, end_bias_BHL: optional per-type biases added at the start i / end j.
    max_span_width: only cells with j - i < W exist (banded: cost O(L * W)).
    block_size: rows (and columns) per tile.
    implementation: "xla" (a `lax.scan` over tiles), "pallas" (`ops.pallas_zlpr` kernels: Mosaic when lowered
      for TPU, interpreted elsewhere; not auto-partitioned, call it under `jax.shard_map` on a mesh) or "auto"
      (pallas on the platforms in `PALLAS_FASTER_ON`, which is empty: xla everywhere for now).

  Returns:
    The value of `sparse_zlpr_loss(logits, span_ids=span_ids, mask=span_mask(attention_mask,
    max_span_width=W))`: mean over B*H. Extra memory O(B * H * block_size^2) per tile; banded, the
    backward pass keeps O(B * H * L * (block_size + W)).
  """
  span_ids_BHK = jnp.asarray(span_ids, jnp.int32)
  neg_BH = _negatives(q_BLHD, k_BLHD, span_ids_BHK, attention_mask, start_bias_BHL, end_bias_BHL,
                      max_span_width=max_span_width, block_size=block_size, implementation=implementation)
  pos_BH = _positives(q_BLHD, k_BLHD, span_ids_BHK, attention_mask, start_bias_BHL, end_bias_BHL,
                      max_span_width=max_span_width)
  return jnp.mean(neg_BH + pos_BH)


def _negatives(q_BLHD, k_BLHD, span_ids_BHK, attention_mask, start_bias_BHL, end_bias_BHL, *, max_span_width,
               block_size, implementation):
  """log(1 + sum over negative cells of e^s) [B, H], tile by tile (Pallas kernels or a scan)."""
  if _use_pallas(implementation):
    _check_sizes(block_size, max_span_width)
    _check_qk(q_BLHD, k_BLHD)
    return pallas_zlpr.neg_term(
        q_BLHD, k_BLHD, span_ids_BHK=span_ids_BHK, valid_BL=jnp.asarray(attention_mask).astype(bool),
        start_bias_BHL=start_bias_BHL, end_bias_BHL=end_bias_BHL, max_span_width=max_span_width,
        block_size=block_size,
    )
  B, L = q_BLHD.shape[:2]
  plan = _make_plan(L, block_size, max_span_width, B * span_ids_BHK.shape[1])
  q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL = _prepare(
      q_BLHD, k_BLHD, attention_mask, start_bias_BHL, end_bias_BHL, plan
  )
  return _neg_term(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL, _Gold.of(plan, span_ids_BHK))


def _positives(q_BLHD, k_BLHD, span_ids_BHK, attention_mask, start_bias_BHL, end_bias_BHL, *, max_span_width):
  """log(1 + sum over gold cells of e^-s) [B, H]: the K gold scores gathered directly (plain autodiff)."""
  B, L = q_BLHD.shape[:2]
  H = span_ids_BHK.shape[1]
  has_id = (span_ids_BHK >= 0) & (span_ids_BHK < L * L)
  ids = jnp.where(has_id, span_ids_BHK, 0)
  i_BHK, j_BHK = ids // L, ids % L
  b = jnp.arange(B)[:, None, None]
  h = jnp.arange(H)[None, :, None] if q_BLHD.shape[2] == H else jnp.zeros((1, 1, 1), jnp.int32)
  q_BHKD = q_BLHD[b, i_BHK, h].astype(jnp.float32)
  k_BHKD = k_BLHD[b, j_BHK, h].astype(jnp.float32)
  pos_BHK = jnp.sum(q_BHKD * k_BHKD, axis=-1) / math.sqrt(q_BLHD.shape[-1])
  hb = jnp.arange(H)[None, :, None]
  if start_bias_BHL is not None:
    pos_BHK = pos_BHK + jnp.asarray(start_bias_BHL, jnp.float32)[b, hb, i_BHK]
  if end_bias_BHL is not None:
    pos_BHK = pos_BHK + jnp.asarray(end_bias_BHL, jnp.float32)[b, hb, j_BHK]
  valid_BL = jnp.asarray(attention_mask).astype(bool)
  pos_valid = has_id & (i_BHK <= j_BHK) & valid_BL[b, i_BHK] & valid_BL[b, j_BHK]
  if max_span_width is not None:
    pos_valid &= (j_BHK - i_BHK) < max_span_width
  return _log1p_sum_exp(-pos_BHK, pos_valid)


def _use_pallas(implementation: str) -> bool:
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be 'auto', 'xla' or 'pallas', got {implementation!r}")
  # auto: decided on the tracing machine's backend, the only one the op can know; the model resolves "auto" for
  # its target platform before it gets here (factory.build_model).
  return implementation == "pallas" or (implementation == "auto" and jax.default_backend() in PALLAS_FASTER_ON)


def blockwise_decode_hits(
    q_BLHD,
    k_BLHD,
    *,
    attention_mask,
    start_bias_BHL=None,
    end_bias_BHL=None,
    max_span_width: int | None = None,
    block_size: int = 128,
    size: int,
    threshold: float = 0.0,
    hit_sharding=None,
):
  """Cells with score > threshold inside the span mask, tile by tile, in `gather_hits`' format.

  Returns (count int32, coords int32 `[size, 4]` as (b, type, start, end), scores float32 `[size]`),
  hits sorted by (b, type, start, end) like `gather_hits`. `count` may exceed `size` (extra hits are
  cut: retry larger). Unused rows hold zeros. `hit_sharding`: a sharding constraint for the boolean
  tile masks before `jnp.nonzero` (nonzero on a batch-sharded mask partitions badly).
  """
  B, L, Hq, _ = q_BLHD.shape
  H = next((x.shape[1] for x in (start_bias_BHL, end_bias_BHL) if x is not None), Hq)
  plan = _make_plan(L, block_size, max_span_width, B * H)
  q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_q_BL, valid_k_BL = _prepare(
      q_BLHD, k_BLHD, attention_mask, start_bias_BHL, end_bias_BHL, plan
  )
  tile_size = min(size, B * H * plan.group * plan.rows * plan.cols)
  r0s, c0s = jnp.asarray(plan.row_starts, jnp.int32), jnp.asarray(plan.col_starts, jnp.int32)

  def body(t, carry):
    count, coords_N4, scores_N = carry
    r0, c0 = r0s[t], c0s[t]
    s_BHGRC, _, _ = _tile_scores(plan, q_BHLD, k_BHLD, sb_BHL, eb_BHL, r0, c0)
    hit_BHGRC = (s_BHGRC > threshold) & _tile_valid(plan, valid_q_BL, valid_k_BL, r0, c0)
    if hit_sharding is not None:
      hit_BHGRC = jax.lax.with_sharding_constraint(hit_BHGRC, hit_sharding)
    n = jnp.sum(hit_BHGRC, dtype=jnp.int32)

    def gather(buffers):
      coords_N4, scores_N = buffers
      b, h, g, i, j = jnp.nonzero(hit_BHGRC, size=tile_size, fill_value=0)
      slot = count + jnp.arange(tile_size, dtype=jnp.int32)
      slot = jnp.where((jnp.arange(tile_size) < n) & (slot < size), slot, size)  # size: dropped
      start, end = r0 + g * plan.rows + i, c0 + g * plan.rows + j
      coords_N4 = coords_N4.at[slot].set(jnp.stack([b, h, start, end], axis=-1).astype(jnp.int32), mode="drop")
      return coords_N4, scores_N.at[slot].set(s_BHGRC[b, h, g, i, j], mode="drop")

    # nonzero is the slow part on CPU: only tiles with hits (and room left) pay for it.
    coords_N4, scores_N = jax.lax.cond((n > 0) & (count < size), gather, lambda x: x, (coords_N4, scores_N))
    return count + n, coords_N4, scores_N

  init = (jnp.int32(0), jnp.zeros((size, 4), jnp.int32), jnp.zeros((size,), jnp.float32))
  count, coords_N4, scores_N = jax.lax.fori_loop(0, len(plan.row_starts), body, init)
  # Tiles come in tile order; sort the kept hits row-major like gather_hits (unused rows last).
  unused_N = jnp.arange(size) >= count
  order_N = jnp.lexsort((coords_N4[:, 3], coords_N4[:, 2], coords_N4[:, 1], coords_N4[:, 0], unused_N))
  return count, coords_N4[order_N], scores_N[order_N]


__all__ = ["blockwise_zlpr_loss", "blockwise_decode_hits"]
