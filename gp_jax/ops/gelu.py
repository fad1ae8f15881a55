"""Exact (erf) GELU whose backward reads only the saved pre-activation.

gelu(x) = x * Phi(x), Phi the standard normal CDF = (1 + erf(x / sqrt 2)) / 2;  gelu'(x) = Phi(x) + x * phi(x),
phi(x) = exp(-x^2 / 2) / sqrt(2 pi). Autodiff of `jax.nn.gelu` keeps two [rows, F] intermediates of the forward for
the backward (on a GPU, BERT-base's FFN wrote three [4096, 3072] bf16 tensors per layer where one is needed); this
keeps x and recomputes Phi and phi, in float32, where the gradient is formed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@jax.custom_vjp
def gelu(x):
  """x * Phi(x) in float32, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  return (x32 * (0.5 * (1.0 + jax.lax.erf(x32 * _INV_SQRT2)))).astype(x.dtype)


def _fwd(x):
  return gelu(x), x


def _bwd(x, g):
  x32 = x.astype(jnp.float32)
  cdf = 0.5 * (1.0 + jax.lax.erf(x32 * _INV_SQRT2))
  pdf = jnp.exp(-0.5 * jnp.square(x32)) * _INV_SQRT_2PI
  return ((g.astype(jnp.float32) * (cdf + x32 * pdf)).astype(x.dtype),)


gelu.defvjp(_fwd, _bwd)
