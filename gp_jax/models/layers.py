"""The models' Linear layer."""

from __future__ import annotations

from flax import nnx

from gp_jax import ops


def linear(in_features: int, out_features: int, **kwargs) -> nnx.Linear:
  """`nnx.Linear` whose contraction is `ops.flat_dot_general` (one 2-D matmul); same parameters."""
  return nnx.Linear(in_features, out_features, dot_general=ops.flat_dot_general, **kwargs)
