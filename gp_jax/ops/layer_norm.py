"""LayerNorm with a hand-written backward: the scale and bias gradients as one two-output column reduction.

Forward: flax's `nnx.LayerNorm`, the same values (two-pass variance, statistics and normalisation in float32, scale
and bias rounded to `dtype` first as nnx's dtype promotion does, output in `dtype`); their gradients are not rounded.
Backward, with xhat = (x - mean) * rstd and g the output's cotangent in float32:
  dscale = sum_rows(g * xhat);  dbias = sum_rows(g);  dx = rstd * (g*scale - mean(g*scale) - xhat * mean(g*scale*xhat)).
Autodiff of the forward writes g * xhat to memory and reduces it and g in separate kernels on a GPU (three kernels and
a [rows, D] float32 tensor per LayerNorm); here a variadic `lax.reduce` takes both sums in one. The residuals are x,
mean and rstd: xhat is recomputed where it is read.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _stats(x, epsilon: float):
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  return mean, jax.lax.rsqrt(var + epsilon)


def _sum_rows(*xs):
  """Column sums of same-shaped [..., D] arrays in one variadic reduction (one kernel on a GPU)."""
  axes = tuple(range(xs[0].ndim - 1))
  return jax.lax.reduce(xs, (jnp.float32(0),) * len(xs), lambda a, b: tuple(i + j for i, j in zip(a, b)), axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x, scale, bias, epsilon: float, dtype):
  """LayerNorm over the last axis: (x - mean) * rsqrt(var + epsilon) * scale + bias, in float32, cast to `dtype`."""
  return _fwd(x, scale, bias, epsilon, dtype)[0]


def _affine(v, dtype):
  return v.astype(dtype).astype(jnp.float32)


def _fwd(x, scale, bias, epsilon, dtype):
  mean, rstd = _stats(x, epsilon)
  y = (x.astype(jnp.float32) - mean) * (rstd * _affine(scale, dtype)) + _affine(bias, dtype)
  return y.astype(dtype), (x, scale, bias, mean, rstd)


def _bwd(epsilon, dtype, res, g):
  del epsilon
  x, scale, bias, mean, rstd = res
  g = g.astype(jnp.float32)
  xhat = (x.astype(jnp.float32) - mean) * rstd
  dscale, dbias = _sum_rows(g * xhat, g)
  gs = g * _affine(scale, dtype)
  dx = rstd * (gs - jnp.mean(gs, axis=-1, keepdims=True) - xhat * jnp.mean(gs * xhat, axis=-1, keepdims=True))
  return dx.astype(x.dtype), dscale.astype(scale.dtype), dbias.astype(bias.dtype)


layer_norm.defvjp(_fwd, _bwd)
