"""The entity task's exported program (model side: imports flax): the eval-mode forward with hits decoded on the
device and the span logits beside them (`gp_jax.export` writes it; `host.run_exported` calls it back)."""

from __future__ import annotations

from flax import nnx


def model_outputs(model, batch, *, threshold, size: int):
  """Eval-mode model -> (count, coords [size, 4] (row, type, start, end), hit_scores [size], scores).

  scores: span heads' logits [B, H, L, L] (masked cells hold the dtype's min); taggers' emissions
  [B, L, T]. Hits are `ops.gather_hits`' (count may exceed size: the caller falls back)."""
  hidden_BLD = model.encode(batch)
  head = model.head
  count, coords, hit_scores = head.decode_hits(hidden_BLD, batch["span_mask"], positions=batch["positions"],
                                               size=size, threshold=threshold)
  scores = head(hidden_BLD, batch["span_mask"], positions=batch["positions"])
  return count, coords, hit_scores, scores


def export_forward(graphdef, params, rest, *, names, sizes):
  """`(*arrays in names order, threshold) -> model_outputs(...)` in a buffer of `sizes[0]` hits, parameters
  closed over (`host.OUTPUTS` order)."""
  (size,) = sizes

  def fn(*args):
    *arrays, threshold = args
    model = nnx.merge(graphdef, nnx.State(params), rest)
    model.eval()
    return model_outputs(model, dict(zip(names, arrays)), threshold=threshold, size=size)

  return fn


def export_refusal(fmt: str) -> str | None:
  """Why `fmt` cannot hold this task's program: None (StableHLO and, for span heads, ONNX)."""
  return None


__all__ = ["model_outputs", "export_forward", "export_refusal"]
