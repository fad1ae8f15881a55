"""data.truncate: one window per record, its first max_len tokens (Su's training data), counts logged."""

import logging

from gp_jax.data import windows
from tests.data.fakes import CharTok

RECORDS = [
    {"id": "a", "text": "abcdefghij", "entities": [{"start": 1, "end": 3, "type": "PER"},   # inside
                                                  {"start": 5, "end": 7, "type": "LOC"},   # crosses the cut
                                                  {"start": 8, "end": 10, "type": "ORG"}]},  # beyond it
    {"id": "b", "text": "abc", "entities": [{"start": 0, "end": 3, "type": "PER"}]},
    {"id": "c", "text": "", "entities": []},
]


def test_truncate_keeps_the_first_window_and_counts(caplog):
  tok = CharTok()
  with caplog.at_level(logging.INFO):
    cut = windows.prepare_split(RECORDS, tok, types=("PER", "LOC", "ORG"), max_len=8, truncate=True, name="train")
  s = cut.stats
  assert (s.records, s.windows, s.truncated_records, s.split_records) == (3, 2, 1, 0)
  assert (s.targets, s.lost_to_truncation, s.entities) == (2, 2, 4)
  assert cut.window_record.tolist() == [0, 1] and cut.window_start.tolist() == [0, 0]
  assert cut.window_content_len.tolist() == [6, 3]
  assert "truncate=True: 1 of 3 records cut to their first 6 content tokens, 2 of 4 entities dropped" in caplog.text
  # The default cuts sliding windows and loses nothing here.
  slid = windows.prepare_split(RECORDS, tok, types=("PER", "LOC", "ORG"), max_len=8, name="train")
  assert slid.stats.windows == 4 and slid.stats.lost_to_truncation == 0 and slid.stats.truncated_records == 0
