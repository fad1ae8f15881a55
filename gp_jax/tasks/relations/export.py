"""The relation task's exported program (model side: imports flax): the three pointers decoded on the device as
the eval step decodes them, in hit buffers whose sizes are inputs (`gp_jax.tasks.pointer_export`)."""

from __future__ import annotations

from gp_jax.tasks import pointer_export


def export_forward(graphdef, params, rest, *, names, sizes=None):
  """`(*arrays in names order, entity_buffer, head_buffer, tail_buffer, threshold) ->` the three pointers' hits
  flattened in `host.OUTPUTS` order (`sizes`, the initial buffers, is not read: the inputs' shapes say them)."""
  return pointer_export.buffered_forward(graphdef, params, rest, names=names, num_buffers=3)


def export_refusal(fmt: str) -> str | None:
  return pointer_export.onnx_refusal(fmt, task="relations")


__all__ = ["export_forward", "export_refusal"]
