"""Pallas kernels for the negative term of the blockwise ZLPR loss: log(1 + sum over valid, non-gold cells of e^s).

Scores s[b, h, i, j] = q_i . k_j / sqrt(d) (+ start_bias[b, h, i]) (+ end_bias[b, h, j]) exist for i <= j (and
j - i < W when banded). The grid is (B, G, T): G = H programs of one type each (fewer for a shared head, see
below), T upper-triangle tiles of `bs x bs` cells (only those touching the band when W is set), their row/column
block numbers prefetched as scalars. Gold cells are left out inside each tile
from the gold ids of its own row block only: the op sorts each (b, h)'s ids by (i, j) (by (j, i) for the dk pass,
whose tiles are walked by column block) and prefetches, per (b, h) and block, the [lo, hi) range of sorted ids that
start (end) in it; a tile marks those of them inside its columns (rows) in a `[bs, bs]` VMEM mask, one row update
per id. Work per tile: O(bs^2 + bs * gold ids of its block), whatever the -1 padding of `span_ids` (K = L from the
pipeline).

Forward: an online max / sum-exp in float32 per (b, h), kept in VMEM scratch across the T steps; the result
`[B, H]` is all the backward pass keeps besides the inputs. Backward: one kernel body, called twice. The dq pass
visits tiles row block by row block and accumulates dq and d(start bias) of that row block; the dk pass visits the
transposed tiles (k rows, q columns) column block by column block for dk and d(end bias). Both recompute
e^(s - out) * g from the saved `out`; their dots take bf16 operands when q and k are bf16 (f32 accumulation).
With one q/k head shared by all H types (Efficient GlobalPointer) a program covers up to SHARED_TYPES_PER_PROGRAM
types: each tile's q.k is computed once for them and every type's biases and gold cells applied to it in a loop (and
the types' ds summed before the one d(a) dot); with per-type q/k a program is one type. Every pallas_call carries a `pl.CostEstimate`, so a
compiled program's cost analysis counts the kernels.

Interpret or compiled is decided by the platform the op is lowered for (`lax.platform_dependent`): TPU gets the
Mosaic kernel with tiles rounded up to multiples of 128; every other platform runs the interpreted kernel with the
caller's block size (there is no Mosaic GPU body yet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Deferred import below: jax.experimental.pallas.tpu (Mosaic lowering, ~0.15 s), only when a kernel is built, so
# that predict and the XLA loss path do not pay for it at start-up.

log = logging.getLogger(__name__)
SHARED_TYPES_PER_PROGRAM = 16  # shared q/k head: types per program (one q.k dot each), bounded by VMEM
_LANES = 128  # TPU lane width: tiles and per-(b, h) outputs are multiples of it when compiled


@dataclasses.dataclass(frozen=True)
class _Spec:
  """Static description of one kernel launch."""

  length: int  # unpadded L (gold ids are i * L + j)
  tile: int  # bs: rows and columns per tile
  blocks: int  # n = ceil(L / bs)
  max_span_width: int | None
  shared: bool  # q/k have one head for all H types: each tile's q.k is computed once for all of them
  types: int  # H
  has_sb: bool
  has_eb: bool
  interpret: bool

  @property
  def padded(self):
    return self.blocks * self.tile

  @property
  def types_per_step(self):
    """Types one program covers: 1 for per-type q/k; for a shared head the largest divisor of H up to
    SHARED_TYPES_PER_PROGRAM (its H bias columns sit in VMEM at once)."""
    if not self.shared:
      return 1
    return max(n for n in range(1, min(self.types, SHARED_TYPES_PER_PROGRAM) + 1) if self.types % n == 0)

  def tiles(self, by_column: bool):
    """(row block, column block) of every visited tile; sorted by column block when `by_column`."""
    n, bs, W = self.blocks, self.tile, self.max_span_width
    tiles = [(r, c) for r in range(n) for c in range(r, n) if W is None or (c - r) * bs <= bs + W - 2]
    return sorted(tiles, key=lambda rc: (rc[1], rc[0])) if by_column else tiles



def _pltpu():
  from jax.experimental.pallas import tpu  # pylint: disable=g-import-not-at-top

  return tpu

def _tile_size(length: int, block_size: int, compiled: bool) -> int:
  bs = max(1, min(block_size, length))
  return -(-bs // _LANES) * _LANES if compiled else bs


def sorted_gold(span_ids_BHK, *, length: int, tile: int, blocks: int, by_column: bool):
  """(keys `[B, H, K]` int32 ascending, ranges `[B, H, blocks + 1]` int32): keys are i * L + j of the gold ids (j * L
  + i when `by_column`), invalid ids (-1 padding, outside [0, L*L)) as L*L at the end; the keys whose first
  coordinate lies in block g (rows g*tile .. g*tile + tile - 1) are keys[ranges[g]:ranges[g + 1]]."""
  L = length
  valid = (span_ids_BHK >= 0) & (span_ids_BHK < L * L)
  ids = jnp.where(valid, span_ids_BHK, 0)
  keys = (ids % L) * L + ids // L if by_column else ids
  keys = jnp.sort(jnp.where(valid, keys, L * L), axis=-1).astype(jnp.int32)
  bounds = jnp.minimum(jnp.arange(blocks + 1) * tile, L) * L
  search = lambda k: jnp.searchsorted(k, bounds, side="left")  # noqa: E731
  ranges = jax.vmap(jax.vmap(search))(keys)
  return keys, ranges.astype(jnp.int32)


def _tile_base(spec, a_blk, b_blk, a_ref, b_ref, va_ref, vb_ref, *, transposed):
  """(float32 `[bs, bs]` scores q.k / sqrt(d) without biases, bool mask of the valid cells i <= j (j - i < W)).

  Plain tiles: rows are q positions i (block a_blk), columns k positions j (block b_blk). Transposed tiles (the dk
  pass): rows are k positions j, columns q positions i; `a` is then k and `b` q."""
  bs = spec.tile
  a, b = a_ref[...], b_ref[...]
  # Default matmul precision, as the XLA op's einsum (on TPU: bf16 passes for float32 inputs).
  s = jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  s = s / math.sqrt(a.shape[-1])
  pos_a = a_blk * bs + jax.lax.broadcasted_iota(jnp.int32, (bs, bs), 0)
  pos_b = b_blk * bs + jax.lax.broadcasted_iota(jnp.int32, (bs, bs), 1)
  i, j = (pos_b, pos_a) if transposed else (pos_a, pos_b)
  keep = (va_ref[...] != 0) & (vb_ref[...] != 0) & (j >= i)
  if spec.max_span_width is not None:
    keep &= (j - i) < spec.max_span_width
  return s, keep


def _first_range(spec, a_blk):
  """Index in the flat ranges of (b, first type of this program, block a_blk); read program ids outside loops."""
  h0 = pl.program_id(1) * spec.types_per_step
  return (pl.program_id(0) * spec.types + h0) * (spec.blocks + 1) + a_blk


def _type_scores(spec, s, keep, a_blk, b_blk, hl, first, abias_ref, bbias_ref, ids_ref, rng_ref, gold_ref):
  """Scores of local type `hl` with its biases, the cells that are not negatives at -inf (`first`: `_first_range`).
  Gold cells come from the sorted keys of this block's range only ((a position) * L + (b position)), marked in
  `gold_ref` one row update per key."""
  bs = spec.tile
  if abias_ref is not None:
    s = s + abias_ref[hl]  # [bs, 1]
  if bbias_ref is not None:
    s = s + bbias_ref[hl]  # [1, bs]
  gold_ref[...] = jnp.zeros_like(gold_ref)
  first = first + hl * (spec.blocks + 1)
  col = jax.lax.broadcasted_iota(jnp.int32, (1, bs), 1)

  def mark(kk, carry):
    key = ids_ref[hl, kk]  # >= 0: truncating div/rem (floor division would lower through sign())
    r = jax.lax.div(key, jnp.int32(spec.length)) - a_blk * bs  # in [0, bs): the range holds this block's keys
    c = jax.lax.rem(key, jnp.int32(spec.length)) - b_blk * bs

    @pl.when((c >= 0) & (c < bs))
    def _():
      gold_ref[pl.ds(r, 1), :] = jnp.where(col == c, 1, gold_ref[pl.ds(r, 1), :])

    return carry

  jax.lax.fori_loop(rng_ref[first], rng_ref[first + 1], mark, 0)
  return jnp.where(keep & (gold_ref[...] == 0), s, -jnp.inf)


def _split_refs(spec, refs, transposed):
  """Kernel refs -> ((a, b, abias | None, bbias | None, va, vb, ids), the remaining refs)."""
  refs = list(refs)
  a_ref, b_ref = refs.pop(0), refs.pop(0)
  abias_ref = refs.pop(0) if (spec.has_eb if transposed else spec.has_sb) else None
  bbias_ref = refs.pop(0) if (spec.has_sb if transposed else spec.has_eb) else None
  va_ref, vb_ref, ids_ref = refs.pop(0), refs.pop(0), refs.pop(0)
  return (a_ref, b_ref, abias_ref, bbias_ref, va_ref, vb_ref, ids_ref), refs


def _fwd_kernel(spec, a_blk_ref, b_blk_ref, rng_ref, *refs):
  (a_ref, b_ref, abias_ref, bbias_ref, va_ref, vb_ref, ids_ref), (out_ref, m_ref, l_ref, gold_ref) = _split_refs(
      spec, refs, False)
  t = pl.program_id(2)
  a_blk, b_blk = a_blk_ref[t], b_blk_ref[t]

  @pl.when(t == 0)
  def _():
    m_ref[...] = jnp.zeros_like(m_ref)  # m starts at 0: log(1 + sum) needs no -inf start
    l_ref[...] = jnp.zeros_like(l_ref)

  s0, keep = _tile_base(spec, a_blk, b_blk, a_ref, b_ref, va_ref, vb_ref, transposed=False)  # once for all types
  first = _first_range(spec, a_blk)

  def one_type(hl, carry):
    s = _type_scores(spec, s0, keep, a_blk, b_blk, hl, first, abias_ref, bbias_ref, ids_ref, rng_ref, gold_ref)
    m_prev = m_ref[pl.ds(hl, 1), :]
    m_new = jnp.maximum(m_prev, jnp.max(jnp.max(s, axis=1, keepdims=True), axis=0, keepdims=True))
    e = jnp.exp(s - m_new[:, :1])
    l_ref[pl.ds(hl, 1), :] = (l_ref[pl.ds(hl, 1), :] * jnp.exp(m_prev - m_new)
                              + jnp.sum(jnp.sum(e, axis=1, keepdims=True), axis=0, keepdims=True))
    m_ref[pl.ds(hl, 1), :] = m_new
    return carry

  jax.lax.fori_loop(0, spec.types_per_step, one_type, 0)

  @pl.when(t == pl.num_programs(2) - 1)
  def _():
    m, rest = m_ref[...], l_ref[...]
    # log(1 + sum e^s) = m + log(e^-m + rest); log1p keeps precision when m == 0.
    out_ref[...] = jnp.where(m > 0, m + jnp.log(jnp.exp(-m) + rest), jnp.log1p(rest))


def _bwd_kernel(spec, transposed, a_blk_ref, b_blk_ref, rng_ref, *refs):
  """Accumulates d(a) `[bs, d]` (summed over the step's types: one q/k head for them) and per type d(a-side bias)
  `[bs, 1]` of the tile row block a_blk over its tiles."""
  (a_ref, b_ref, abias_ref, bbias_ref, va_ref, vb_ref, ids_ref), rest = _split_refs(spec, refs, transposed)
  stats_ref, da_ref = rest[0], rest[1]
  dbias_ref = rest[2] if len(rest) > 3 else None
  gold_ref = rest[-1]
  t = pl.program_id(2)
  a_blk, b_blk = a_blk_ref[t], b_blk_ref[t]

  @pl.when((t == 0) | (a_blk != a_blk_ref[jnp.maximum(t - 1, 0)]))
  def _():  # first tile of this row block: tiles come sorted by it
    da_ref[...] = jnp.zeros_like(da_ref)
    if dbias_ref is not None:
      dbias_ref[...] = jnp.zeros_like(dbias_ref)

  s0, keep = _tile_base(spec, a_blk, b_blk, a_ref, b_ref, va_ref, vb_ref, transposed=transposed)
  first = _first_range(spec, a_blk)

  def one_type(hl, ds_sum):
    s = _type_scores(spec, s0, keep, a_blk, b_blk, hl, first, abias_ref, bbias_ref, ids_ref, rng_ref, gold_ref)
    # d/ds log(1 + sum e^s) = e^(s - out); left-out cells are exp(-inf) = 0.
    ds = jnp.exp(s - stats_ref[hl, 0]) * stats_ref[hl, 1]
    if dbias_ref is not None:
      dbias_ref[hl] += jnp.sum(ds, axis=1, keepdims=True)
    return ds_sum + ds

  ds = jax.lax.fori_loop(0, spec.types_per_step, one_type, jnp.zeros((spec.tile, spec.tile), jnp.float32))
  b = b_ref[...]
  if b.dtype != jnp.bfloat16:  # bf16 inputs: bf16 operands, f32 accumulation; anything else in f32
    b = b.astype(jnp.float32)
  da = jax.lax.dot_general(ds.astype(b.dtype), b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
  da_ref[...] += da / math.sqrt(b.shape[-1])


def _smem_rows_spec(spec, n):
  """Rows of the step's types of a `[B * G, types_per_step, n]` array (G = H / types_per_step), in SMEM (scalars
  read one by one)."""
  G = spec.types // spec.types_per_step
  return pl.BlockSpec((None, spec.types_per_step, n), lambda b, g, t, *_: (b * G + g, 0, 0),
                      memory_space=_pltpu().SMEM)


def _operands(spec, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_BL, ids_BHK, *, transposed):
  """Padded operands and their BlockSpecs, and the prefetched gold ranges (flat `[B * H * (blocks + 1)]`). Plain: a =
  q (row blocks), b = k; transposed: a = k, b = q. Grid (B, G, T): program g covers types g*n .. g*n + n - 1 with
  n = types_per_step (1 per type; all H for a shared q/k head, whose q/k head index g is then 0)."""
  Lp, bs, n = spec.padded, spec.tile, spec.types_per_step
  L = spec.length
  pad = lambda x, axis: jnp.pad(x, [(0, Lp - L if i == axis else 0) for i in range(x.ndim)])  # noqa: E731
  a_BHLD, b_BHLD = (k_BHLD, q_BHLD) if transposed else (q_BHLD, k_BHLD)
  abias, bbias = (eb_BHL, sb_BHL) if transposed else (sb_BHL, eb_BHL)
  d = q_BHLD.shape[-1]
  ops = [pad(a_BHLD, 2), pad(b_BHLD, 2)]
  hq = (lambda g: 0) if spec.shared else (lambda g: g)  # noqa: E731
  specs = [pl.BlockSpec((None, None, bs, d), lambda b, g, t, ab, bb, *_: (b, hq(g), ab[t], 0)),
           pl.BlockSpec((None, None, bs, d), lambda b, g, t, ab, bb, *_: (b, hq(g), bb[t], 0))]
  # Biases and validity: the a side as columns [.., Lp, 1], the b side as rows [.., 1, Lp].
  for bias, column in ((abias, True), (bbias, False)):
    if bias is not None:
      bias = pad(bias.astype(jnp.float32), 2)
      ops.append(bias[..., None] if column else bias[:, :, None, :])
      specs.append(pl.BlockSpec((None, n, bs, 1), lambda b, g, t, ab, bb, *_: (b, g, ab[t], 0)) if column else
                   pl.BlockSpec((None, n, 1, bs), lambda b, g, t, ab, bb, *_: (b, g, 0, bb[t])))
  valid_BL = pad(valid_BL.astype(jnp.int32), 1)
  # SMEM rows flattened to [B * G, n, K]: Mosaic wants the last two block dims whole (or tiled).
  B, H, K = ids_BHK.shape
  keys_BHK, ranges_BHN = sorted_gold(ids_BHK, length=L, tile=bs, blocks=spec.blocks, by_column=transposed)
  ops += [valid_BL[:, :, None], valid_BL[:, None, :], keys_BHK.reshape(B * (H // n), n, K)]
  specs += [pl.BlockSpec((None, bs, 1), lambda b, g, t, ab, bb, *_: (b, ab[t], 0)),
            pl.BlockSpec((None, 1, bs), lambda b, g, t, ab, bb, *_: (b, 0, bb[t])),
            _smem_rows_spec(spec, K)]
  return ops, specs, ranges_BHN.reshape(-1)


def _blocks(spec, by_column):
  tiles = spec.tiles(by_column)
  a_blk = [c if by_column else r for r, c in tiles]
  b_blk = [r if by_column else c for r, c in tiles]
  return jnp.asarray(a_blk, jnp.int32), jnp.asarray(b_blk, jnp.int32), len(tiles)


def _compiler_params(spec):
  return None if spec.interpret else _pltpu().CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def cost_estimate(spec, *, B: int, d: int, itemsize: int, backward: bool) -> pl.CostEstimate:
  """What one pass does: per program (b, g) and tile the q.k^T dot (and in a backward pass the d(a) dot), computed
  once for the g's types; per type and cell a few elementwise ops and one exp. It reads both [bs, d] operands per
  tile and writes its output once."""
  T, bs, H = len(spec.tiles(False)), spec.tile, spec.types
  G = H // spec.types_per_step
  dots = 2 if backward else 1
  flops = B * G * T * dots * 2 * bs * bs * d + B * H * T * 6 * bs * bs
  out_bytes = B * G * spec.padded * d * 4 + B * H * spec.padded * 4 if backward else B * H * 4
  return pl.CostEstimate(flops=int(flops), transcendentals=int(B * H * T * bs * bs),
                         bytes_accessed=int(B * G * T * 2 * bs * d * itemsize + out_bytes))


def _forward(spec, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_BL, ids_BHK):
  B, H = ids_BHK.shape[:2]
  n = spec.types_per_step
  ops, specs, ranges = _operands(spec, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_BL, ids_BHK, transposed=False)
  a_blk, b_blk, T = _blocks(spec, by_column=False)
  grid = _pltpu().PrefetchScalarGridSpec(
      num_scalar_prefetch=3, grid=(B, H // n, T), in_specs=specs,
      out_specs=pl.BlockSpec((None, None, n, _LANES), lambda b, g, t, *_: (b, g, 0, 0)),
      scratch_shapes=[_pltpu().VMEM((n, _LANES), jnp.float32), _pltpu().VMEM((n, _LANES), jnp.float32),
                      _pltpu().VMEM((spec.tile, spec.tile), jnp.int32)],
  )
  out = pl.pallas_call(
      functools.partial(_fwd_kernel, spec), grid_spec=grid,
      out_shape=jax.ShapeDtypeStruct((B, H // n, n, _LANES), jnp.float32),  # last two block dims whole (Mosaic)
      interpret=spec.interpret, compiler_params=_compiler_params(spec), name="zlpr_neg_fwd",
      cost_estimate=cost_estimate(spec, B=B, d=q_BHLD.shape[-1], itemsize=q_BHLD.dtype.itemsize, backward=False),
  )(a_blk, b_blk, ranges, *ops)
  return out.reshape(B, H, _LANES)[:, :, 0]


def _backward_pass(spec, res, stats_BH2, *, transposed):
  """(d(a) `[B, Hq, L, d]`, d(a-side bias) `[B, H, L]` | None), float32; d(a) summed over the types that share a
  q/k head."""
  q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_BL, ids_BHK = res
  B, H = ids_BHK.shape[:2]
  L, d, bs, n = spec.length, q_BHLD.shape[-1], spec.tile, spec.types_per_step
  G = H // n
  ops, specs, ranges = _operands(spec, *res, transposed=transposed)
  a_blk, b_blk, T = _blocks(spec, by_column=transposed)
  has_bias = spec.has_eb if transposed else spec.has_sb
  out_shape = [jax.ShapeDtypeStruct((B, G, spec.padded, d), jnp.float32)]
  out_specs = [pl.BlockSpec((None, None, bs, d), lambda b, g, t, ab, bb, *_: (b, g, ab[t], 0))]
  if has_bias:
    out_shape.append(jax.ShapeDtypeStruct((B, H, spec.padded, 1), jnp.float32))
    out_specs.append(pl.BlockSpec((None, n, bs, 1), lambda b, g, t, ab, bb, *_: (b, g, ab[t], 0)))
  grid = _pltpu().PrefetchScalarGridSpec(num_scalar_prefetch=3, grid=(B, G, T), in_specs=specs + [_smem_rows_spec(spec, 2)],
                                      out_specs=out_specs, scratch_shapes=[_pltpu().VMEM((bs, bs), jnp.int32)])
  outs = pl.pallas_call(
      functools.partial(_bwd_kernel, spec, transposed), grid_spec=grid, out_shape=out_shape,
      interpret=spec.interpret, compiler_params=_compiler_params(spec),
      name="zlpr_neg_bwd_dk" if transposed else "zlpr_neg_bwd_dq",
      cost_estimate=cost_estimate(spec, B=B, d=d, itemsize=q_BHLD.dtype.itemsize, backward=True),
  )(a_blk, b_blk, ranges, *ops, stats_BH2.reshape(B * G, n, 2))
  da_BHLD = outs[0][:, :, :L]
  return da_BHLD, (outs[1][:, :, :L, 0] if has_bias else None)


def _backward(spec, res, out_BH, g_BH):
  q_BHLD, k_BHLD, sb_BHL, eb_BHL = res[:4]
  stats_BH2 = jnp.stack([out_BH, g_BH.astype(jnp.float32)], axis=-1)
  dq_BHLD, dsb_BHL = _backward_pass(spec, res, stats_BH2, transposed=False)
  dk_BHLD, deb_BHL = _backward_pass(spec, res, stats_BH2, transposed=True)
  if spec.shared:  # per program g: sum the programs' parts of the one shared head
    dq_BHLD, dk_BHLD = jnp.sum(dq_BHLD, axis=1, keepdims=True), jnp.sum(dk_BHLD, axis=1, keepdims=True)
  cast = lambda dx, x: None if x is None else dx.astype(x.dtype)  # noqa: E731
  return cast(dq_BHLD, q_BHLD), cast(dk_BHLD, k_BHLD), cast(dsb_BHL, sb_BHL), cast(deb_BHL, eb_BHL)


def _per_platform(fn, spec_of, *args):
  """fn(spec, *args) with the compiled Mosaic kernel when lowered for TPU, the interpreted one elsewhere."""
  return jax.lax.platform_dependent(
      *args, tpu=lambda *a: fn(spec_of(True), *a), default=lambda *a: fn(spec_of(False), *a))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _neg_term(spec_of, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_BL, ids_BHK):
  return _per_platform(_forward, spec_of, q_BHLD, k_BHLD, sb_BHL, eb_BHL, valid_BL, ids_BHK)


def _neg_fwd(spec_of, *res):
  out_BH = _per_platform(_forward, spec_of, *res)
  return out_BH, (res, out_BH)


def _neg_bwd(spec_of, saved, g_BH):
  res, out_BH = saved
  grads = _per_platform(lambda spec, *a: _backward(spec, a[:-2], a[-2], a[-1]), spec_of, *res, out_BH, g_BH)
  return (*grads, None, None)


_neg_term.defvjp(_neg_fwd, _neg_bwd)


# The largest tile (of 128, 256, 512, 1024) whose loss + gradient compiles inside one chip's scoped VMEM, per TPU
# generation and head (per-type q/k, or one shared head whose H per-type bias columns a program holds at once); how
# it was measured: docs/benchmarks/span_head.md, "TPU tiles". A compiled kernel uses min(loss.block_size, this).
TPU_MAX_TILE: dict[tuple[str, str], int] = {
    ("v4", "per_type"): 1024, ("v5e", "per_type"): 1024, ("v5p", "per_type"): 1024, ("v6e", "per_type"): 1024,
    ("v4", "shared"): 256, ("v5e", "shared"): 512, ("v5p", "shared"): 256, ("v6e", "shared"): 512,
}
TPU_GENERATIONS = ("v4", "v5e", "v5p", "v6e")
_target = {"generation": None}
_logged: set[tuple] = set()


def tpu_generation(device_kind: str) -> str | None:
  """"TPU v4" -> v4, "TPU v5 lite" / "TPU v5e" -> v5e, "TPU v5" / "TPU v5p" -> v5p, "TPU v6 lite" / "TPU v6e" -> v6e."""
  kind = device_kind.lower().replace("tpu", "").strip()
  if kind.startswith("v4"):
    return "v4"
  if kind.startswith("v5") and ("lite" in kind or "e" in kind[2:]):
    return "v5e"
  if kind.startswith("v5"):
    return "v5p"
  if kind.startswith("v6"):
    return "v6e"
  return None


@contextlib.contextmanager
def tpu_target(generation: str | None):
  """Compile the kernel's tiles for this TPU generation (lowering from a machine without that chip)."""
  before = _target["generation"]
  _target["generation"] = generation
  try:
    yield
  finally:
    _target["generation"] = before


def target_generation() -> str | None:
  """The generation set by `tpu_target`, else this machine's TPU, else None (unknown)."""
  if _target["generation"]:
    return _target["generation"]
  device = jax.devices()[0]
  return tpu_generation(device.device_kind) if device.platform == "tpu" else None


def clamp_tile(tile: int, *, shared: bool) -> int:
  """min(tile, the generation's largest tile for this head); an unknown generation takes the smallest of them.
  Logs once when it clamps."""
  head = "shared" if shared else "per_type"
  gen = target_generation()
  fits = [v for (g, h), v in TPU_MAX_TILE.items() if h == head and (gen is None or g == gen)]
  if not fits or tile <= min(fits):
    return tile
  key = (tile, head, gen)
  if key not in _logged:
    _logged.add(key)
    log.info("loss.block_size %d clamped to %d for TPU %s (%s q/k head): the largest tile that fits its scoped VMEM",
             tile, min(fits), gen or "of unknown generation", head.replace("_", "-"))
  return min(fits)


@dataclasses.dataclass(frozen=True)
class _SpecOf:
  """Hashable `compiled -> _Spec` (a custom_vjp non-differentiable argument)."""

  length: int
  block_size: int
  max_span_width: int | None
  shared: bool
  types: int
  has_sb: bool
  has_eb: bool

  def __call__(self, compiled: bool) -> _Spec:
    bs = _tile_size(self.length, self.block_size, compiled)
    if compiled:
      bs = clamp_tile(bs, shared=self.shared)
    return _Spec(self.length, bs, -(-self.length // bs), self.max_span_width, self.shared, self.types, self.has_sb,
                 self.has_eb, interpret=not compiled)


def neg_term(q_BLHD, k_BLHD, *, span_ids_BHK, valid_BL, start_bias_BHL=None, end_bias_BHL=None,
             max_span_width=None, block_size=128):
  """`[B, H]` float32: log(1 + sum over valid, non-gold cells of e^s), differentiable in q, k and the biases.

  q_BLHD, k_BLHD `[B, L, Hq, d]` with Hq = H or 1; span_ids_BHK int32 flat gold ids (any value outside
  [0, L*L) is no id); valid_BL bool. Tiles are `block_size` square (TPU: rounded up to a multiple of 128)."""
  B, L, Hq, _ = q_BLHD.shape
  H = span_ids_BHK.shape[1]
  ids = jnp.where((span_ids_BHK >= 0) & (span_ids_BHK < L * L), span_ids_BHK, -1).astype(jnp.int32)
  if ids.shape[-1] == 0:  # SMEM blocks need one id at least
    ids = jnp.full((B, H, 1), -1, jnp.int32)
  spec_of = _SpecOf(L, block_size, max_span_width, Hq != H, H, start_bias_BHL is not None, end_bias_BHL is not None)
  f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)  # noqa: E731
  return _neg_term(spec_of, jnp.swapaxes(q_BLHD, 1, 2), jnp.swapaxes(k_BLHD, 1, 2), f32(start_bias_BHL),
                   f32(end_bias_BHL), valid_BL, ids)


__all__ = ["TPU_MAX_TILE", "clamp_tile", "cost_estimate", "neg_term", "sorted_gold", "tpu_generation", "tpu_target"]
