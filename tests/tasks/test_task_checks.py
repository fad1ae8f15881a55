"""What the tasks refuse or count on a user's data and config, in one line and before training: roles that are not
entity types, tune_threshold for the pointer tasks, untyped entities for task=entities (file and line), records
without the task's key (counted), events written without a trigger (counted), records that lost their relations or
events to the decoding caps (named in one warning)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from gp_jax import factory
from gp_jax.data import batching
from gp_jax.data.readers import DataError
from gp_jax.data.sources import load_records
from gp_jax.errors import UserError
from gp_jax.tasks import entities as entity_task
from gp_jax.tasks import events as event_task
from gp_jax.tasks import relations as relation_task
from gp_jax.tasks.events import host as event_host
from gp_jax.tasks.relations import host as relation_host
from tests import helpers_train as ht
from tests.data.fakes import CharTok

PER, LOC = {"start": 0, "end": 3, "type": "PER"}, {"start": 7, "end": 11, "type": "LOC"}
LINKED = {"text": "Ann in Rome", "entities": [PER, LOC], "relations": [{"head": 0, "tail": 1, "type": "in"}]}
NO_KEY = {"text": "Bob naps", "entities": [PER]}  # no "relations" key: read as no relations


def write_jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
  return str(path)


def relations_config(tmp_path, **overrides):
  train = write_jsonl(tmp_path / "train.jsonl", [LINKED, NO_KEY] * 4)
  return ht.tiny_config(task="relations", data__name="jsonl", data__train_file=train, **overrides)


def test_roles_that_are_not_entity_types_are_refused_once_the_data_is_read(tmp_path):
  """data.roles names PERSON where the data says PER: one line from the task's label space, before any split is
  prepared or compiled (it was a ValueError traceback at the first dev evaluation)."""
  with pytest.raises(UserError, match=r"^data.roles=PERSON,LOC: 'PERSON' is not an entity type of the data "
                                      r"\('LOC', 'PER'\)"):
    factory.prepare_data(relations_config(tmp_path, data__roles="PERSON,LOC"))
  splits, _, types = factory.prepare_data(relations_config(tmp_path, data__roles="PER,LOC"))
  assert types == ["LOC", "PER"] and set(splits) == {"train", "dev"}


@pytest.mark.parametrize("task", ["relations", "events"])
def test_tune_threshold_is_refused_at_config_time_for_the_pointer_tasks(task):
  """docs/tasks.md: "refused in one line"; it ran the whole training and said so at the end in an INFO line."""
  with pytest.raises(UserError, match=rf"^tune_threshold=True: task={task} decodes three pointers"):
    factory.task_name(ht.tiny_config(task=task, tune_threshold=True))
  assert factory.task_name(ht.tiny_config(task=task)) == task
  assert factory.task_name(ht.tiny_config(task="entities", tune_threshold=True)) == "entities"


def test_untyped_entities_are_a_data_error_for_task_entities_naming_file_and_line(tmp_path):
  untyped = {"text": "Ann in Rome", "entities": [{"start": 0, "end": 3}, LOC],
             "relations": [{"head": 0, "tail": 1, "type": "in"}]}
  path = write_jsonl(tmp_path / "train.jsonl", [LINKED, untyped, LINKED])
  train = load_records(ht.tiny_config(data__name="jsonl", data__train_file=path,
                                      data__dev_file=path).data)[0]
  with pytest.raises(DataError, match=rf"^{path}:2: an entity without a \"type\": task=entities"):
    entity_task.TASK().labels(train=train, dev=[], test=[])
  assert relation_task.TASK().labels(train=train, dev=[], test=[]) == ("in",)  # relations read them


def test_records_without_the_tasks_key_are_counted(caplog):
  ev = {"text": "Ann hit Bob", "entities": [],
        "events": [{"type": "Attack", "trigger": {"start": 4, "end": 7}, "arguments": []}]}
  with caplog.at_level(logging.INFO, logger="gp_jax.tasks.base"):
    relation_task.TASK().labels(train=[LINKED, NO_KEY, NO_KEY], dev=[LINKED], test=[])
    event_task.TASK().labels(train=[ev, NO_KEY], dev=[], test=[NO_KEY])
  lines = [r.getMessage() for r in caplog.records]
  assert lines == ['task=relations: 2 of 3 train records have no "relations" key: read as no relations',
                   'task=events: 1 of 2 train records have no "events" key: read as no events',
                   'task=events: 1 of 1 test records have no "events" key: read as no events']


def test_events_without_a_trigger_are_counted_when_predict_leaves_them_out(caplog):
  arg = {"start": 0, "end": 3, "role": "agent", "score": 0.8}
  with_trigger = {"type": "A", "trigger": {"start": 4, "end": 7, "score": 0.9}, "arguments": [arg], "score": 0.7}
  without = {"type": "A", "trigger": None, "arguments": [arg], "score": 0.6}
  predictions = [{"events": [with_trigger, without, without]}, {"events": [with_trigger]}, {"events": []}]
  with caplog.at_level(logging.WARNING, logger="gp_jax.tasks.events.host"):
    rows = event_host.output_records(["Abc_hit_Def"] * 3, predictions)
  assert [len(r["events"]) for r in rows] == [1, 1, 0]
  assert [r.getMessage() for r in caplog.records] == [
      "2 of 4 predicted events have no trigger: not written (an event is written with its trigger, as Su's "
      "extract_events; 1 of 3 texts had such events)"]
  caplog.clear()
  event_host.output_records(["x"], [{"events": [with_trigger]}])
  assert not caplog.records


def _warnings(caplog) -> list[str]:
  """The warnings gp_jax's tasks logged (other records a handler set up by an earlier test may pass are not ours)."""
  return [r.getMessage() for r in caplog.records
          if r.levelno >= logging.WARNING and r.name.startswith("gp_jax.tasks")]


def test_records_that_lost_their_relations_to_the_candidate_cap_are_named(caplog, monkeypatch):
  records = [dict(LINKED, id="a"), dict(NO_KEY, id="b"), {"id": "c", "text": "nothing", "entities": []}]
  p = relation_host.prepare(records, CharTok(), ["LOC", "PER"], ("in",), name="dev", max_len=40, stride=8)
  batch = next(iter(batching.eval_batches(p, batch_size=4, buckets=())))
  window_B = batch["window_index"]
  row = int(np.nonzero(window_B == 0)[0][0])  # record a's window
  (ss, se, os_, oe, _), = p.table.window_relations(0).tolist()
  ent = (2, np.asarray([[row, 1, ss, se], [row, 0, os_, oe]], np.int32), np.ones(2, np.float32))
  head = (1, np.asarray([[row, 0, ss, os_]], np.int32), np.ones(1, np.float32))
  tail = (1, np.asarray([[row, 0, se, oe]], np.int32), np.ones(1, np.float32))
  monkeypatch.setattr(relation_host, "MAX_CANDIDATES_PER_ROW", 0)  # the one candidate is over the cap
  with caplog.at_level(logging.WARNING):
    hits = relation_host.window_hits((ent, head, tail), window_B, types=("LOC", "PER"))
    assert not _warnings(caplog)  # per batch nothing: the records are named once, by assemble
    out = relation_host.assemble(p, relation_host.concat_hits([hits]))
  assert out[0]["relations"] == []
  (message,) = _warnings(caplog)
  assert message.startswith("dev: 1 of 3 records lost relations: 1 of their windows held more than 0 candidate "
                            "triples, so none were assembled there")
  assert "an untrained model, or text unlike its training data" in message and message.endswith("records 'a'")


def test_records_that_lost_their_events_to_the_argument_bound_are_named(caplog):
  from tests.tasks.test_events_task import gold_cell_hits, prepared_synthetic

  _, p = prepared_synthetic(12)
  hits = event_host.window_hits(gold_cell_hits(p), np.arange(p.num_windows), types=p.types,
                                options={"max_arguments_per_type": 1})  # every window with an event is capped
  capped = [p.record_ids[r] for r in sorted({int(p.window_record[w]) for w in hits["capped"]})]
  assert len(capped) > 5
  with caplog.at_level(logging.WARNING, logger="gp_jax.tasks.base"):
    event_host.assemble(p, event_host.concat_hits([hits]))
  (message,) = _warnings(caplog)
  assert message.startswith(f"t: {len(capped)} of {p.num_records} records lost events: ")
  assert message.endswith(", ".join(map(repr, capped[:5])) + f" and {len(capped) - 5} more")
