"""The training loop's input: groups of same-bucket batches, one jitted call each, built and placed ahead.

A group is `steps_per_execution` (k) consecutive batches of one length bucket, or one batch where a bucket change,
an evaluation or checkpoint step, an epoch's end or the last step comes before k same-bucket batches are reached.
Group boundaries fall on multiples of k of the absolute step, so a resumed run groups its steps as an unresumed one
does. The plan is a pure function of the
batch order; a thread builds each group's batches from a clone of the iterator while the current call runs, and the
loop's thread places the next group on the devices before it dispatches the current one, so the iterator the
checkpoint saves moves only as groups are trained on.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterator

import numpy as np

from gp_jax import sharding as shd
from gp_jax.evaluate import model_batch

AUTO_STEPS = {"cpu": 4, "cuda": 8, "rocm": 8, "tpu": 16}  # steps_per_execution=0, by platform (docs/benchmarks/pipeline.md)


@dataclasses.dataclass(frozen=True)
class Group:
  first: int  # absolute step of its first batch
  size: int
  length: int  # the bucket

  @property
  def end(self) -> int:
    return self.first + self.size


def steps_per_execution(value: int, platform: str) -> int:
  """`steps_per_execution`: k as set, or for 0 (auto) the platform's (`AUTO_STEPS`)."""
  k = int(value)
  if k < 0:
    raise ValueError(f"steps_per_execution must be >= 0 (0 = auto), got {k}")
  return k or AUTO_STEPS.get(platform, 1)


def group_limit(step: int, *, k: int, every: tuple[int, ...], total: int) -> int:
  """The step a group starting at `step` ends at, at the latest: the next multiple of k or of any of `every`
  (evaluation, checkpoint, epoch), or `total`."""
  return min([total] + [(step // m + 1) * m for m in (k, *every) if m > 0])


def plan(lengths: np.ndarray, *, start: int, k: int, every: tuple[int, ...], total: int) -> list[Group]:
  """Groups covering steps [start, total); `lengths[i]` is the bucket of step start + i. A run of same-bucket steps
  shorter than k goes one step per call, so a run compiles two train programs per bucket at most (1 and k steps)."""
  groups, step = [], start
  while step < total:
    limit = group_limit(step, k=k, every=every, total=total)
    length = int(lengths[step - start])
    n = 1
    while step + n < limit and lengths[step + n - start] == length:
      n += 1
    if n == k:
      groups.append(Group(step, n, length))
    else:
      groups.extend(Group(s, 1, length) for s in range(step, step + n))
    step += n
  return groups


@dataclasses.dataclass
class Fed:
  """One group: its batch (host numpy from the thread, device arrays once placed; stacked [k, ...] when k > 1) and
  what the host counts of it."""

  group: Group
  batch: dict
  tokens: int  # real tokens of this process's rows
  examples: int
  span_overflow: int


class Feed:
  """Yields `Fed` groups in plan order: a thread builds up to `depth` groups ahead on the host, the iterating thread
  places each on the devices one group ahead."""

  _DONE = object()

  def __init__(self, train_it, groups: list[Group], mesh, *, depth: int = 2):
    self.groups, self.mesh = groups, mesh
    self._source = train_it.clone()
    self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._fill, name="gp_jax-feed", daemon=True)
    self._thread.start()

  def _build(self, group: Group) -> Fed:
    """The group's host batch (numpy; stacked [k, ...] when k > 1): built on the thread."""
    before = self._source.span_overflow
    batches = [next(self._source) for _ in range(group.size)]
    lengths = {b["attention_mask"].shape[1] for b in batches}
    if lengths != {group.length}:
      raise RuntimeError(f"feed: group {group} got buckets {sorted(lengths)}")
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    examples = sum(int((b["example_index"] >= 0).sum()) for b in batches)
    rows = [model_batch(b) for b in batches]
    host = rows[0] if group.size == 1 else {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    return Fed(group, host, tokens, examples, self._source.span_overflow - before)

  def _place(self, fed: Fed) -> Fed:
    """The group's batch on the devices (the calling thread: every call into the runtime stays on one thread; on a
    multi-device CPU a placement from a second thread beside a running collective can starve its rendezvous)."""
    place = shd.global_batch if fed.group.size == 1 else shd.global_stacked_batch
    return dataclasses.replace(fed, batch=place(fed.batch, self.mesh))

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _fill(self) -> None:
    try:
      for group in self.groups:
        if self._stop.is_set() or not self._put(self._build(group)):
          return
    except BaseException as e:  # pylint: disable=broad-except
      self._put(e)
      return
    self._put(self._DONE)

  def __iter__(self) -> Iterator[Fed]:
    """Groups in order, each placed on the devices one group ahead of its use (transfers are asynchronous: the next
    group's copy overlaps the current call)."""
    ready = None
    while True:
      item = self._queue.get()
      if isinstance(item, BaseException):
        raise item
      if item is self._DONE:
        if ready is not None:
          yield ready
        return
      placed = self._place(item)
      if ready is not None:
        yield ready
      ready = placed

  def close(self) -> None:
    self._stop.set()
    self._thread.join()
