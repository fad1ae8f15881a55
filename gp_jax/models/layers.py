"""The models' Linear layer."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from gp_jax import ops


def linear(in_features: int, out_features: int, **kwargs) -> nnx.Linear:
  """`nnx.Linear` whose contraction is `ops.flat_dot_general` (one 2-D matmul); same parameters."""
  return nnx.Linear(in_features, out_features, dot_general=ops.flat_dot_general, **kwargs)


def fused_linear(x, layers) -> list:
  """`[layer(x) for layer in layers]` for Linear layers that read the same input, as one matmul against their
  kernels side by side (one `[M, K] @ [K, sum N]` instead of several narrow ones, forward and backward). The
  parameters stay the layers' own, so checkpoints and their names do not change."""
  kernel = jnp.concatenate([layer.kernel[...] for layer in layers], axis=-1)
  bias = jnp.concatenate([layer.bias[...] for layer in layers], axis=-1)
  x, kernel, bias = layers[0].promote_dtype((x, kernel, bias), dtype=layers[0].dtype)
  y = ops.flat_dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=layers[0].precision) + bias
  return jnp.split(y, np.cumsum([layer.out_features for layer in layers])[:-1].tolist(), axis=-1)
