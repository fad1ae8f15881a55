"""A synthetic corpus of overlapping events (task=events): smoke runs and end-to-end tests.

Clauses of a person ("Abc") who "_hit_" / "_kicked_" someone (type Attack) or "_met_" someone (type Meet), joined
with "_and_". The overlaps PHEE rarely has are frequent here: two events sharing a trigger and an agent ("Abc_hit_Def
_and_Ghi": one Attack per patient), one person in two events (the next clause's agent is the same span), same-type
events side by side, and nested arguments (a patient "Def_of_XYZ" holds its place "XYZ", role "patient.place").
Words joined with "_" as in `sources.synthetic_records`.
"""

from __future__ import annotations

import random
import string

from gp_jax.data.types import Record

EVENT_VERBS = {"Attack": ("hit", "kicked"), "Meet": ("met",)}
EVENT_ROLES = ("agent", "patient", "patient.place")


def event_records(n: int, *, seed: int, prefix: str = "evt") -> list[Record]:
  """`n` records {"id", "text", "entities": [], "events"}; event types EVENT_VERBS, roles EVENT_ROLES."""
  rng = random.Random(seed)
  records = []

  def name():
    return rng.choice(string.ascii_uppercase) + "".join(rng.choice(string.ascii_lowercase)
                                                        for _ in range(rng.randint(1, 3)))

  for r in range(n):
    text, events = "", []

    def add(piece):
      nonlocal text
      start = len(text)
      text += piece
      return {"start": start, "end": len(text)}

    def patient():
      span = add(name())
      if rng.random() < 0.3:
        add("_of_")
        place = add("".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(2, 3))))
        span = {"start": span["start"], "end": place["end"]}
        return [dict(span, role="patient"), dict(place, role="patient.place")]
      return [dict(span, role="patient")]

    agent = None
    for k in range(rng.randint(1, 3)):
      if k:
        add("_and_")
      if agent is None or rng.random() < 0.5:
        agent = add(name())
      else:
        add("then")  # the previous clause's agent acts again: one span in two events
      etype = rng.choice(sorted(EVENT_VERBS))
      add("_")
      trigger = add(rng.choice(EVENT_VERBS[etype]))
      add("_")
      patients = [patient()]
      while rng.random() < 0.3 and len(patients) < 3:  # "X_hit_Y_and_Z": one event per patient, trigger shared
        add("_and_")
        patients.append(patient())
      for args in patients:
        events.append({"type": etype, "trigger": trigger,
                       "arguments": [dict(agent, role="agent"), *args]})
    records.append({"id": f"{prefix}-{r}", "text": text, "entities": [], "events": events})
  return records


__all__ = ["event_records", "EVENT_VERBS", "EVENT_ROLES"]
