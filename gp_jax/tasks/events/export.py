"""The event task's exported program (model side: imports flax): the three pointers decoded on the device as the
eval step decodes them, in hit buffers whose sizes are inputs (`gp_jax.export` writes it; `host.run_exported` calls
it back and grows a buffer without a new export)."""

from __future__ import annotations

from flax import nnx


def export_forward(graphdef, params, rest, *, names, sizes=None):
  """`(*arrays in names order, argument_buffer, head_buffer, tail_buffer, threshold) ->` the three pointers' hits
  flattened in `host.OUTPUTS` order (`model.decode_hits`), in buffers as long as the buffer inputs' second axis
  (`sizes`, the initial ones, is not read); parameters closed over."""
  def fn(*args):
    *arrays, argument_buffer, head_buffer, tail_buffer, threshold = args
    model = nnx.merge(graphdef, nnx.State(params), rest)
    model.eval()
    buffers = (argument_buffer.shape[1], head_buffer.shape[1], tail_buffer.shape[1])
    hits = model.decode_hits(dict(zip(names, arrays)), size=buffers, threshold=threshold)
    return tuple(x for pointer in hits for x in pointer)

  return fn


def export_refusal(fmt: str) -> str | None:
  """ONNX holds span scores only; this program decodes its three pointers inside the function."""
  if fmt == "onnx":
    return ("--format=onnx exports entity span heads only; a task=events model decodes its three pointers inside "
            "the function: use --format=stablehlo")
  return None


__all__ = ["export_forward", "export_refusal"]
