"""event_prf: figures computed by hand on overlapping events; Su's and CasEE's loops re-written, on random events."""

import random

import pytest

from gp_jax.tasks.events.metrics import event_prf


def ev(etype, trigger, *args):
  """An event; trigger (start, end) or None, args (role, start, end)."""
  return {"type": etype, "trigger": None if trigger is None else {"start": trigger[0], "end": trigger[1]},
          "arguments": [{"start": a, "end": b, "role": role, "score": 0.5} for role, a, b in args]}


TEXTS = [
  "Ann gave Bob aspirin and Cat gave Dan ibuprofen.",  # Ann 0-3 gave 4-8 Bob 9-12 aspirin 13-20 Cat 25-28
  # gave 29-33 Dan 34-37 ibuprofen 38-47
  "Aspirin therapy caused rash and relieved pain.",  # Aspirin 0-7 "Aspirin therapy" 0-15 caused 16-22 rash 23-27
  # relieved 32-40 pain 41-45
  "Both Eve and Fay took the pill.",  # Eve 5-8 Fay 13-16 took 17-21 pill 26-30
  "No events here.",  # events 3-9 here 10-14
  "Gil ate.",  # Gil 0-3 ate 4-7
]
GOLD = [
  # Same-type events side by side.
  [ev("Give", (4, 8), ("giver", 0, 3), ("recipient", 9, 12), ("thing", 13, 20)),
   ev("Give", (29, 33), ("giver", 25, 28), ("recipient", 34, 37), ("thing", 38, 47))],
  # Nested arguments (Treatment.Drug inside Treatment), one argument in two events of different types.
  [ev("Adverse", (16, 22), ("Treatment", 0, 15), ("Treatment.Drug", 0, 7), ("Effect", 23, 27)),
   ev("Therapeutic", (32, 40), ("Treatment", 0, 15), ("Treatment.Drug", 0, 7), ("Effect", 41, 45))],
  # Two same-type events sharing their trigger and an argument.
  [ev("Take", (17, 21), ("agent", 5, 8), ("thing", 26, 30)),
   ev("Take", (17, 21), ("agent", 13, 16), ("thing", 26, 30))],
  [],  # no gold events
  [ev("Eat", None, ("agent", 0, 3))],  # a gold event without trigger
]
PRED = [
  [ev("Give", (4, 8), ("thing", 13, 20), ("giver", 0, 3), ("recipient", 9, 12)),  # E1, arguments reordered: hit
   ev("Give", (29, 33), ("giver", 25, 28), ("recipient", 34, 37), ("thing", 13, 20)),  # wrong thing: event miss
   ev("Give", (4, 8), ("giver", 0, 3), ("recipient", 9, 12), ("thing", 13, 20)),  # duplicate of the first
   ev("Give", None, ("thing", 38, 47), ("recipient", 9, 12), ("giver", 34, 37))],  # no trigger
  [ev("Adverse", (16, 22), ("Treatment", 0, 15), ("Treatment.Drug", 0, 7), ("Effect", 23, 27)),  # hit
   ev("Therapeutic", (32, 40), ("Treatment", 0, 15), ("Treatment.Drug", 0, 15), ("Effect", 41, 45))],  # drug too long
  [ev("Take", (17, 21), ("agent", 5, 8), ("agent", 13, 16), ("thing", 26, 30))],  # both events merged into one
  [ev("Take", (3, 9), ("agent", 10, 14))],  # a false positive in a sentence without gold
  [ev("Eat", (4, 7), ("agent", 0, 3)), ev("Drink", (4, 7))],  # trigger where gold has none; a second type
]


def counts(r):
  return r["tp"], r["pred"], r["gold"]


@pytest.fixture(scope="module")
def result():
  return event_prf(TEXTS, PRED, GOLD)


def test_argument_level_by_hand(result):
  # Su's (type, role, text, start) per sentence, deduplicated, triggers excluded:
  # 0: gold Ann/Bob/aspirin/Cat/Dan/ibuprofen (6). pred: the first event's 3 (its duplicate adds none), Cat, Dan as
  #    recipient, (thing, aspirin) again (deduplicated: the wrong assignment is invisible here), ibuprofen and Bob
  #    from the trigger-less event (it counts at this level: Su decodes with trigger=False), Dan as giver (wrong):
  #    7, tp 6.
  # 1: gold 6 (Treatment / Drug / Effect per type: the shared "Aspirin therapy" counts once per event type);
  #    pred 6, tp 5 (Therapeutic Treatment.Drug "Aspirin therapy" is wrong).
  # 2: gold Eve, Fay, pill (pill shared: once) = 3; pred the same 3, tp 3.
  # 3: gold 0, pred 1 (here). 4: gold 1, pred 1, tp 1 (the trigger plays no part).
  assert counts(result) == (6 + 5 + 3 + 0 + 1, 7 + 6 + 3 + 1 + 1, 6 + 6 + 3 + 0 + 1)  # 15, 18, 16
  assert result["precision"] == pytest.approx(15 / 18) and result["recall"] == pytest.approx(15 / 16)
  assert result["f1"] == pytest.approx(2 * 15 / (18 + 16))  # Su's 2 ex / (ey + ez)
  assert result["level"] == "argument"


def test_event_level_by_hand(result):
  # Predicted events with a trigger, deduplicated, against all gold events:
  # 0: R = {first, second} (the duplicate once, the trigger-less one left out); T = 2; tp 1 (the first: same multiset
  #    of tuples in another order).
  # 1: R 2, T 2, tp 1 (Adverse). 2: R 1 (merged), T 2, tp 0. 3: R 1, T 0. 4: R 2 (Eat, Drink), T 1, tp 0 (the gold
  #    event has no trigger, so no predicted event, which always has one, equals it).
  e = result["event_level"]
  assert counts(e) == (2, 2 + 2 + 1 + 1 + 2, 2 + 2 + 2 + 0 + 1)  # 2, 8, 7
  assert e["f1"] == pytest.approx(2 * 2 / (8 + 7))
  assert e["per_record"] == {"tp": [1, 1, 0, 0, 0], "fp": [1, 1, 1, 1, 2], "fn": [1, 1, 2, 0, 1]}
  assert counts(e["per_type"]["Give"]) == (1, 2, 2) and counts(e["per_type"]["Eat"]) == (0, 1, 1)
  assert counts(e["per_type"]["Drink"]) == (0, 1, 0)
  assert {k: counts(v) for k, v in e["by_events"].items()} == {"0": (0, 1, 0), "1": (0, 2, 1), "2": (2, 5, 6),
                                                             "3+": (0, 0, 0)}


def test_ti_tc_ai_ac_by_hand(result):
  # CasEE's sets per sentence.
  # TI (start, end) of triggers: gold {4-8, 29-33}, {16-22, 32-40}, {17-21} (two events, one trigger), {}, {} = 5;
  #    pred the same 5 plus 3-9 and 4-7 (Eat and Drink share it) = 7; tp 5.
  # TC (+ type): as TI except sentence 4 gives (Eat, 4-7) and (Drink, 4-7): pred 8.
  # AI (type, start, end): 0: gold 6; pred Ann, Bob, aspirin, Cat, ibuprofen, and Dan-as-recipient and Dan-as-giver
  #    are one tuple: 6, tp 6. 1: gold 6; pred Adverse 3 + Therapeutic 0-15 (Treatment and the wrong Drug are one
  #    tuple) and pain = 5, tp 5. 2: 3/3/3. 3: pred 1. 4: 1/1/1. -> tp 15, pred 16, gold 16.
  # AC (+ role): the argument level's tuples with offsets in place of text: 15, 18, 16.
  assert counts(result["ti"]) == (5, 7, 5)
  assert counts(result["tc"]) == (5, 8, 5)
  assert counts(result["ai"]) == (15, 16, 16)
  assert counts(result["ac"]) == (15, 18, 16)
  assert result["ti"]["f1"] == pytest.approx(2 * 5 / (7 + 5))


def test_per_role_macro_breakdowns_by_hand(result):
  pt = result["per_type"]
  assert counts(pt["Give:giver"]) == (2, 3, 2)  # Ann, Cat; Dan wrong
  assert counts(pt["Give:recipient"]) == (2, 2, 2)
  assert counts(pt["Therapeutic:Treatment.Drug"]) == (0, 1, 1)
  assert counts(pt["Take:agent"]) == (2, 3, 2)  # Eve, Fay; "here" wrong
  assert counts(pt["Eat:agent"]) == (1, 1, 1)
  assert len(pt) == 12 and sum(v["tp"] for v in pt.values()) == 15
  # F1s: giver 0.8 (P 2/3, R 1), Take:agent 0.8, Therapeutic Drug 0, the other nine 1.
  assert result["macro_f1"] == pytest.approx((0.8 + 0.8 + 0 + 9) / 12)
  # Gold events per sentence: 2, 2, 2, 0, 1.
  assert {k: counts(v) for k, v in result["by_events"].items()} == {"0": (0, 1, 0), "1": (1, 1, 1),
                                                                    "2": (14, 16, 15), "3+": (0, 0, 0)}
  assert result["per_record"] == {"tp": [6, 5, 3, 0, 1], "fp": [1, 1, 0, 1, 0], "fn": [0, 1, 0, 0, 0]}


def test_three_plus_and_empty():
  text = ["a b c d"]
  gold = [[ev("X", (0, 1)), ev("X", (2, 3)), ev("Y", (4, 5), ("r", 6, 7))]]
  r = event_prf(text, [[]], gold)
  assert counts(r["by_events"]["3+"]) == (0, 0, 1) and counts(r["event_level"]["by_events"]["3+"]) == (0, 0, 3)
  assert r["f1"] == 0.0 and r["precision"] == 0.0 and r["event_level"]["recall"] == 0.0
  e = event_prf(["a"], [[]], [[]])
  assert counts(e) == (0, 0, 0) and e["f1"] == 0.0 and e["macro_f1"] == 0.0


def test_bad_input_names_record_and_event():
  with pytest.raises(ValueError, match=r"gold record 1 event 0 argument 0: span \[3, 9\)"):
    event_prf(["abc", "abc"], [[], []], [[], [ev("X", (0, 1), ("r", 3, 9))]])
  with pytest.raises(ValueError, match="predictions record 0 event 0 trigger"):
    event_prf(["abc"], [[ev("X", (2, 2))]], [[]])
  with pytest.raises(ValueError, match="1 records of events for 2 texts"):
    event_prf(["a", "b"], [[], []], [[]])
  with pytest.raises(ValueError, match="no 'role'"):
    event_prf(["abc"], [[{"type": "X", "trigger": None, "arguments": [{"start": 0, "end": 1}]}]], [[]])


# --- Su's evaluate (bojone/GPLinker duee_v1.py) and CasEE's score (utils/metric.py), re-written from their loops ---


class DedupList(list):
  def append(self, x):
    if x not in self:
      super().append(x)


def su_events(text, events):
  """Su's format: an event is a list of (type, role, argument text, start), the trigger of role 触发词."""
  out = []
  for e in events:
    out.append([])
    if e["trigger"] is not None:
      s, t = e["trigger"]["start"], e["trigger"]["end"]
      out[-1].append((e["type"], "触发词", text[s:t], s))
    for a in e["arguments"]:
      out[-1].append((e["type"], a["role"], text[a["start"]:a["end"]], a["start"]))
  return out


def su_evaluate(texts, preds, golds):
  ex = ey = ez = ax = ay = az = 0
  for text, p, g in zip(texts, preds, golds):
    pred_events, gold_events = su_events(text, p), su_events(text, g)
    R, T = DedupList(), DedupList()
    for event in pred_events:
      if any(argu[1] == "触发词" for argu in event):
        R.append(list(sorted(event)))
    for event in gold_events:
      T.append(list(sorted(event)))
    ex += sum(event in T for event in R)
    ey += len(R)
    ez += len(T)
    R, T = DedupList(), DedupList()
    for event in pred_events:
      for argu in event:
        if argu[1] != "触发词":
          R.append(argu)
    for event in gold_events:
      for argu in event:
        if argu[1] != "触发词":
          T.append(argu)
    ax += sum(argu in T for argu in R)
    ay += len(R)
    az += len(T)
  return (ex, ey, ez), (ax, ay, az)


def casee_counts(preds, golds):
  def tuples(events):
    ti, tc, ai, ac = [], [], [], []
    for e in events:
      if e["trigger"] is not None:
        ti.append((e["trigger"]["start"], e["trigger"]["end"]))
        tc.append((e["type"], e["trigger"]["start"], e["trigger"]["end"]))
      for a in e["arguments"]:
        ai.append((e["type"], a["start"], a["end"]))
        ac.append((e["type"], a["start"], a["end"], a["role"]))
    return ti, tc, ai, ac

  out = [[0, 0, 0] for _ in range(4)]
  for p, g in zip(preds, golds):
    for k, (pt, gt) in enumerate(zip(tuples(p), tuples(g))):
      pt, gt = set(pt), set(gt)
      out[k][0] += len(pt & gt)
      out[k][1] += len(pt)
      out[k][2] += len(gt)
  return [tuple(c) for c in out]


def random_corpus(rng, n):
  """Random texts and events with shared, nested and repeated parts; every event has a trigger or an argument (Su's
  empty list would equal an empty event of any type; here an event keeps its type)."""
  texts, golds, preds = [], [], []
  for _ in range(n):
    L = rng.randint(4, 14)
    text = "".join(rng.choice("abcdefgh") for _ in range(L))
    spans = [(a, rng.randint(a + 1, min(L, a + 4))) for a in (rng.randrange(L) for _ in range(5))]

    def event():
      trig = rng.choice(spans) if rng.random() < 0.85 else None
      args = [(rng.choice("rs"), *rng.choice(spans)) for _ in range(rng.randint(0 if trig else 1, 3))]
      return ev(rng.choice("XY"), trig, *args)

    gold = [event() for _ in range(rng.choice([0, 1, 1, 2, 3, 4]))]
    pred = []
    for e in gold:
      if rng.random() < 0.6:
        pred.append(e)  # kept
      elif rng.random() < 0.5:
        pred.append(dict(e, arguments=e["arguments"][1:]))  # an argument dropped
    pred += [event() for _ in range(rng.choice([0, 0, 1, 2]))]
    pred += [rng.choice(pred)] if pred and rng.random() < 0.2 else []  # a duplicate
    texts.append(text)
    golds.append(gold)
    preds.append(pred)
  return texts, preds, golds


def test_matches_su_and_casee_loops_on_random_events():
  rng = random.Random(0)
  texts, preds, golds = random_corpus(rng, 400)
  r = event_prf(texts, preds, golds)
  (ex, ey, ez), (ax, ay, az) = su_evaluate(texts, preds, golds)
  assert ex > 20 and ey > ex and ax > 100 and ay > ax  # the corpus exercises hits and misses
  assert counts(r["event_level"]) == (ex, ey, ez)
  assert counts(r) == (ax, ay, az)
  assert r["f1"] == pytest.approx(2 * ax / (ay + az), rel=1e-12)
  assert r["event_level"]["f1"] == pytest.approx(2 * ex / (ey + ez), rel=1e-12)
  assert [counts(r[k]) for k in ("ti", "tc", "ai", "ac")] == casee_counts(preds, golds)
  for part in (r, r["event_level"]):
    assert [sum(part["per_record"][k]) for k in ("tp", "fp", "fn")] == [
      part["tp"], part["pred"] - part["tp"], part["gold"] - part["tp"]]
    assert [sum(v[k] for v in part["by_events"].values()) for k in ("tp", "pred", "gold")] == list(counts(part))
  assert sum(v["tp"] for v in r["per_type"].values()) == r["tp"]
