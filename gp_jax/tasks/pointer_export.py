"""The exported program of a task that decodes several pointers on the device (relations, events; model side: imports
flax): hits in buffers whose sizes are inputs, so `host.run_exported` grows a buffer without a new export."""

from __future__ import annotations

from flax import nnx


def buffered_forward(graphdef, params, rest, *, names, num_buffers: int):
  """`(*arrays in names order, *buffers, threshold) ->` every pointer's hits flattened in the host's `OUTPUTS` order
  (`model.decode_hits`), each in a buffer as long as its buffer input's second axis; parameters closed over."""
  def fn(*args):
    *arrays, threshold = args
    arrays, buffers = arrays[:-num_buffers], arrays[-num_buffers:]
    model = nnx.merge(graphdef, nnx.State(params), rest)
    model.eval()
    hits = model.decode_hits(dict(zip(names, arrays)), size=tuple(b.shape[1] for b in buffers), threshold=threshold)
    return tuple(x for pointer in hits for x in pointer)

  return fn


def onnx_refusal(fmt: str, *, task: str) -> str | None:
  """ONNX holds span scores only; these programs decode their pointers inside the function."""
  if fmt == "onnx":
    return (f"--format=onnx exports entity span heads only; a task={task} model decodes its three pointers inside "
            "the function: use --format=stablehlo")
  return None


__all__ = ["buffered_forward", "onnx_refusal"]
