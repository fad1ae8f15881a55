"""The relation and event tasks' label files (`tasks.base.save_label_file` / `load_label_file`): the file each task
writes beside types.json, its content, and the message when it is missing."""

from __future__ import annotations

import json

import pytest

from gp_jax import tasks
from gp_jax.errors import UserError


@pytest.mark.parametrize("name, filename, what", [("relations", "relation_types.json", "relation types"),
                                                  ("events", "event_labels.json", "event types")])
def test_labels_round_trip_in_the_tasks_file_and_a_missing_file_says_which(tmp_path, name, filename, what):
  task = tasks.get(name)()
  labels = ("b", "a:x", "c")
  task.save_labels(str(tmp_path), labels)
  assert json.loads((tmp_path / filename).read_text()) == list(labels)
  assert task.load_labels(str(tmp_path)) == labels
  (tmp_path / filename).unlink()
  with pytest.raises(UserError) as e:
    task.load_labels(str(tmp_path))
  assert str(e.value) == f"{tmp_path / filename}: missing: a task={name} workdir keeps its {what} there"
