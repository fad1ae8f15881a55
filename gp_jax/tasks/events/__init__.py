"""The event task (GPLinker for events, Su 2022): every (event type, role) pair is a class of one span pointer (the
trigger one more role, "type:trigger"), and two one-head pointers link the arguments of one event by their starts
and by their ends (model side; the host half, `host`, groups, assembles and scores).

The span classes (`Setup.types`) are the "type:role" names (`data.events.event_classes`); the task's labels are the
event types (event_labels.json beside types.json). Batch targets as flat ids (`targets.event_targets`): the
argument pointer's are the batch's `span_ids`. Decoding fills three hit buffers (argument, head link, tail link),
grown each on its own; events are Su's cliques, grouped on the host per window (`host.window_hits`) and merged over
windows (`host.assemble`). Model: `models.events.EventModel` around `EventHead` (argument pointer RoPE from
`model.use_rope`, link pointers' from `model.pointer_rope`, `model.head` efficient or standard).
"""

from __future__ import annotations

from gp_jax.data.events import event_types
from gp_jax.errors import UserError
from gp_jax.tasks.base import PointerTask, count_missing_key, load_label_file, pointer_config_refusal, save_label_file
from gp_jax.tasks.events import host, targets

LABELS_FILE = "event_labels.json"  # a task=events workdir's event types, beside types.json


class EventTask(PointerTask):
  """Events: what the trainer, the steps, the compiler and evaluation call for `task=events`.

  `pointer_rope`: RoPE on the two link pointers (Su: none). `event_grouping`: "cliques" (Su: each maximal clique
  of the link graph one event) or "trigger" (then the cliques of one type and trigger merged: one event per trigger,
  `host.merge_by_trigger`).
  """

  name = "events"
  host = host  # the host half (`PointerTask` reads it)
  threshold_refusal = "task=events decodes three pointers at one threshold; tuning it is not built"

  def __init__(self, pointer_rope: bool = False, event_grouping: str = "cliques"):
    if event_grouping not in host.GROUPINGS:
      raise UserError(f"task=events: model.event_grouping must be one of {host.GROUPINGS}, got {event_grouping!r}")
    self.pointer_rope, self.event_grouping = bool(pointer_rope), event_grouping
    self.options = {"pointer_rope": self.pointer_rope, "event_grouping": self.event_grouping}

  # Construction: the options a run spec keeps (`RunSpec.task_options`).
  @classmethod
  def options(cls, config, conventions) -> dict:
    """model.pointer_rope (default False), model.event_grouping (default "cliques", Su's)."""
    return cls(pointer_rope=bool(config.model.get("pointer_rope", False)),
               event_grouping=str(config.model.get("event_grouping", "cliques"))).options

  @classmethod
  def config_refusal(cls, config) -> str | None:
    """A tagger head or a loss other than sparse ZLPR is refused (`base.pointer_config_refusal`); tune_threshold is
    refused by `factory.task_name` (`threshold_refusal`)."""
    return pointer_config_refusal(config, task="events", pointers="event")

  @classmethod
  def from_spec(cls, spec) -> EventTask:
    return cls(**dict(spec.task_options))

  # Label space: the event types (event_labels.json).
  def labels(self, *, train, dev, test) -> tuple[str, ...]:
    """The event types, union over labelled splits; none is the user's error (the corpus holds no events). Records
    without an "events" key are read as holding none, counted in the log."""
    out = tuple(event_types(train=train, dev=dev, test=test))
    if not out:
      raise UserError('task=events: the corpus holds no events: expected records with "events": [{"type", '
                      '"trigger": {"start", "end"} | null, "arguments": [{"start", "end", "role"}]}] (jsonl), phee '
                      "or synthetic_events")
    count_missing_key("events", {"train": train, "dev": dev, "test": test}, "events")
    return out

  def split_labels(self, prepared) -> tuple[str, ...]:
    return tuple(prepared.table.types)

  def save_labels(self, workdir, labels) -> None:
    save_label_file(workdir, LABELS_FILE, labels)

  def load_labels(self, workdir) -> tuple[str, ...]:
    return load_label_file(workdir, LABELS_FILE, task="events", what="event types")

  def prepare(self, records, tokenizer, types, labels, **options):
    """Span form, `windows.prepare_split` and the split's event table (`PreparedSplit.table`; `host.prepare`)."""
    return host.prepare(records, tokenizer, types, labels, **options)

  @staticmethod
  def batch_targets(p, rows, w, span_ids_BHK, L):
    return targets.event_targets(p, rows, w, span_ids_BHK, L)

  def target_shapes(self, labels, *, num_types: int, batch: int, length: int) -> dict[str, tuple]:
    return targets.target_shapes(num_classes=num_types, batch=batch, length=length)

  def build_model(self, encoder, spec, labels, *, num_types: int, feature_names, dtype, rngs):
    """`EventModel` around `EventHead`: the argument pointer over the `num_types` "type:role" classes as
    `spec.head` / `spec.use_rope`, the link pointers' RoPE from `pointer_rope`."""
    from gp_jax.models.events import EventHead, EventModel  # pylint: disable=g-import-not-at-top
    from gp_jax.models.heads import HEADS  # pylint: disable=g-import-not-at-top

    if spec.head not in HEADS:
      raise UserError(f"task=events: model.head must be one of {sorted(HEADS)}, got {spec.head!r}")
    module = EventHead(encoder.hidden_size, num_types, head_size=spec.head_size, efficient=spec.head == "efficient",
                       use_rope=spec.use_rope, pointer_rope=self.pointer_rope, max_span_width=spec.max_span_width,
                       dtype=dtype, rngs=rngs)
    return EventModel(encoder, module, feature_names, loss_implementation=spec.loss_implementation)

  # Device decoding: three hit buffers (argument, head link, tail link), read by `host` (`PointerTask`).
  # Host: records ({"events": [...]}, char offsets), the argument-level F1 ("f1" selects), event level, TI / TC / AI /
  # AC, PHEE's figures where they apply.
  def final_fields(self, result: dict) -> dict:
    return host.final_fields(result)

  def result_lines(self, result: dict) -> list[str]:
    return host.result_lines(result)

  @staticmethod
  def pointer_head():
    from gp_jax.models.events import EventHead  # pylint: disable=g-import-not-at-top

    return EventHead


TASK = EventTask

__all__ = ["TASK", "EventTask", "LABELS_FILE"]
