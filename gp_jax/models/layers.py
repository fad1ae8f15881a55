"""The models' Linear layer and embedding lookup."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax import ops


def linear(in_features: int, out_features: int, **kwargs) -> nnx.Linear:
  """`nnx.Linear` whose contraction is `ops.flat_dot_general` (one 2-D matmul); same parameters."""
  return nnx.Linear(in_features, out_features, dot_general=ops.flat_dot_general, **kwargs)


ONE_HOT_MAX_ROWS = 16  # tables this small (token types) are read by a one-hot matmul


def embed(module: nnx.Embed, ids: jax.Array) -> jax.Array:
  """`module(ids)` (same values), with a backward pass that scales on accelerators: rows are gathered from the
  float32 table and cast to the compute dtype afterwards, so the gradient is a float32 scatter-add (nnx.Embed
  casts the table first: a bf16 scatter-add, emulated with compare-and-swap loops on a GPU); a table of at most
  ONE_HOT_MAX_ROWS rows is read by a one-hot matmul, whose gradient is a matmul, not a scatter whose updates all
  hit the same few rows (on a GPU such a bf16 scatter serialises: docs/device/README.md)."""
  table = module.embedding.value
  dtype = module.dtype or table.dtype
  if table.shape[0] <= ONE_HOT_MAX_ROWS:
    one_hot = jax.nn.one_hot(ids, table.shape[0], dtype=table.dtype)
    return jnp.einsum("...n,nd->...d", one_hot, table).astype(dtype)
  return jnp.take(table, ids, axis=0).astype(dtype)


def embed_prefix(module: nnx.Embed, length: int) -> jax.Array:
  """Rows 0..length-1 of the table as `[1, length, D]` in the compute dtype (positions 0..L-1 of every row): a slice,
  whose gradient is a sum over the batch, not a scatter."""
  table = module.embedding.value
  return table[None, :length].astype(module.dtype or table.dtype)
