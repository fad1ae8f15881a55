"""Mesh, batch and parameter shardings. The batch is split over both axes; parameters over `fsdp`."""

from __future__ import annotations

import logging

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from gp_jax.errors import UserError

log = logging.getLogger(__name__)

BATCH_AXES = ("data", "fsdp")


def make_mesh(data: int = -1, fsdp: int = 1, *, devices=None) -> jax.sharding.Mesh:
  """A ("data", "fsdp") mesh over all devices; -1 on one axis fills it."""
  n = len(devices) if devices is not None else jax.device_count()
  if data == -1 and fsdp == -1:
    raise UserError("mesh: at most one axis may be -1")
  if data == -1:
    data = n // fsdp
  if fsdp == -1:
    fsdp = n // data
  if data * fsdp != n:
    raise UserError(f"mesh data={data} x fsdp={fsdp} does not match {n} devices: set config.mesh to sizes whose "
                    "product is the device count (-1 takes the rest)")
  auto = (jax.sharding.AxisType.Auto,) * 2
  return jax.make_mesh((data, fsdp), BATCH_AXES, axis_types=auto, devices=devices)


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh, ndim: int) -> NamedSharding:
  """Leading (batch) axis split over every mesh axis."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def stacked_batch_sharding(mesh, ndim: int) -> NamedSharding:
  """Batches stacked on a leading step axis [k, B, ...]: the step axis whole, B split over every mesh axis."""
  return NamedSharding(mesh, P(None, BATCH_AXES, *([None] * (ndim - 2))))


def param_spec(shape, fsdp: int) -> P:
  """Shards the largest axis divisible by `fsdp`; small or indivisible arrays stay replicated."""
  if fsdp <= 1 or not shape or int(np.prod(shape)) < 1024:
    return P()
  for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
    if shape[axis] % fsdp == 0:
      spec = [None] * len(shape)
      spec[axis] = "fsdp"
      return P(*spec)
  return P()


def tree_shardings(mesh, abstract_tree):
  fsdp = mesh.shape["fsdp"]
  return jax.tree.map(lambda x: NamedSharding(mesh, param_spec(getattr(x, "shape", ()), fsdp)), abstract_tree)


def global_batch(batch: dict, mesh) -> dict:
  """Host-local numpy rows -> global jax.Arrays sharded on the batch axis (multi-host safe)."""

  def put(x):
    x = np.asarray(x)
    sharding = batch_sharding(mesh, x.ndim)
    return jax.make_array_from_process_local_data(sharding, x)

  return jax.tree.map(put, batch)


def global_stacked_batch(batch: dict, mesh) -> dict:
  """Host-local numpy [k, rows, ...] -> global jax.Arrays [k, B, ...] sharded on the batch axis."""

  def put(x):
    x = np.asarray(x)
    return jax.make_array_from_process_local_data(stacked_batch_sharding(mesh, x.ndim), x)

  return jax.tree.map(put, batch)
