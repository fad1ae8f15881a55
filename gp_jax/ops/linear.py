"""`nnx.Linear`'s contraction as one 2-D matmul."""

from __future__ import annotations

import jax


def flat_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
  """`lax.dot_general` that runs `[..., K] @ [K, N]` as `[M, K] @ [K, N]` (leading axes flattened).

  Same value. On XLA:CPU the weight gradient of a `[B, L, K]` input otherwise contracts two axes, which
  XLA lowers with a transposed copy of the `[B, L, N]` cotangent and a slower dot (docs/design.md, "Ops").
  Any other contraction, or an explicit `out_sharding`, goes to `lax.dot_general` unchanged.
  """
  (lhs_contract, rhs_contract), (lhs_batch, _) = dimension_numbers
  if (
      lhs.ndim > 2 and rhs.ndim == 2 and not lhs_batch and out_sharding is None
      and tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) == (0,)
  ):
    out = jax.lax.dot_general(
        lhs.reshape(-1, lhs.shape[-1]), rhs, (((1,), (0,)), ((), ())), precision=precision,
        preferred_element_type=preferred_element_type,
    )
    return out.reshape(lhs.shape[:-1] + rhs.shape[1:])
  return jax.lax.dot_general(
      lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type,
      out_sharding=out_sharding,
  )


__all__ = ["flat_dot_general"]
