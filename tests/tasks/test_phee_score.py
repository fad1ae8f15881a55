"""phee_score: the PHEE paper's EM / token F1, by hand and against the reference scorer (phee_metric.py.txt)."""

import collections
import json
import random

import pytest

from gp_jax.tasks.events.phee_score import as_reference, normalize_answer, phee_score

REFERENCE = "phee/phee_metric.py.txt"


def at(text, s, k=0):
  """{"start", "end"} of the k-th occurrence of s in text."""
  i = -1
  for _ in range(k + 1):
    i = text.index(s, i + 1)
  return {"start": i, "end": i + len(s)}


def ev(text, etype, trigger, *args):
  """An event of `text`; trigger and arguments given as strings (or (string, occurrence)) found in it."""
  def span(x):
    return at(text, *x) if isinstance(x, tuple) else at(text, x)
  return {"type": etype, "trigger": None if trigger is None else span(trigger),
          "arguments": [dict(span(x), role=role, score=0.9) for role, x in args]}


@pytest.mark.parametrize("raw, want", [
  ("The Aspirin-induced rash.", "aspirin induced rash"),  # lower, '-' and '.' split and go, "the" goes
  ("A 54-year-old man", "54 year old man"),
  ("theory of an anthem", "theory of anthem"),  # whole words only
  ("  (the)  ", ""),
  ("5 mg/kg/day", "5 mg kg day"),
  ("Drug's", "drug s"),
  ("it\u2019s", "it\u2019s"),  # a curly apostrophe is not in string.punctuation
])
def test_normalize_answer_by_hand(raw, want):
  assert normalize_answer(raw) == want


T0 = "The man took aspirin and the woman took aspirin; both got rash."
T1 = "Aspirin therapy relieved pain in a 5-year-old girl."
AE, PTE = "Adverse_event", "Potential_therapeutic_event"
GOLD = [
  [ev(T0, AE, "got", ("Subject", "The man"), ("Treatment", "aspirin"), ("Treatment.Drug", "aspirin"),
      ("Effect", "rash")),
   ev(T0, AE, "got", ("Subject", "the woman"), ("Treatment", ("aspirin", 1)), ("Treatment.Drug", ("aspirin", 1)),
      ("Effect", "rash"))],
  [ev(T1, PTE, "relieved", ("Treatment", "Aspirin therapy"), ("Treatment.Drug", "Aspirin"), ("Effect", "pain"),
      ("Subject", "a 5-year-old girl"), ("Subject.Age", "5-year-old"), ("Subject.Gender", "girl"))],
]
PRED = [
  [ev(T0, AE, "got", ("Subject", "man took"), ("Treatment", ("aspirin", 1)), ("Treatment.Drug", ("aspirin;", 0)),
      ("Effect", "rash."))],
  [ev(T1, PTE, "relieved", ("Treatment", "Aspirin"), ("Treatment.Drug", "Aspirin"), ("Subject", "5-year-old girl"),
      ("Subject.Age", "5-year-old"), ("Effect", "pain in")),
   ev(T1, PTE, None, ("Treatment.Drug", "Aspirin"), ("Foo", "girl"))],
]


def counts(fig):
  return fig["tp"], fig["pred"], fig["gold"]


def test_groups_by_hand():
  # Groups (sentence, key) pool the sentence's same-type events; strings normalised; EM the multiset intersection.
  # Sentence 0 (two Adverse events, one predicted):           EM tp/pred/gold   tokens tp/pred/gold
  #   Trigger   pred [got]          gold [got, got]            1 1 2             1 1 2
  #   Subject   [man took]          [man, woman]               0 1 2             1 2 2  (man)
  #   Treatment [aspirin]           [aspirin, aspirin]         1 1 2             1 1 2
  #   T.Drug    ["aspirin;"->aspirin] [aspirin, aspirin]       1 1 2             1 1 2
  #   Effect    ["rash."->rash]     [rash, rash]               1 1 2             1 1 2
  # Sentence 1 (one therapeutic event; the trigger-less prediction adds a second Drug, "Foo" is skipped):
  #   Trigger   [relieved]          [relieved]                 1 1 1             1 1 1
  #   Treatment [aspirin]           [aspirin therapy]          0 1 1             1 1 2
  #   T.Drug    [aspirin, aspirin]  [aspirin]                  1 2 1             1 2 1
  #   Effect    [pain in]           [pain]                     0 1 1             1 2 1
  #   Subject   [5 year old girl]   [5 year old girl] ("a" goes) 1 1 1           4 4 4
  #   S.Age     [5 year old]        [5 year old]               1 1 1             3 3 3
  #   S.Gender  []                  [girl]                     0 0 1             0 0 1
  r = phee_score([T0, T1], PRED, GOLD)
  cls = r["classification"]
  assert counts(cls["Trigger"]["em"]) == (2, 2, 3) and counts(cls["Trigger"]["token"]) == (2, 2, 3)
  assert counts(cls["MainArgs"]["em"]) == (0 + 1 + 1 + 0 + 0 + 1, 6, 2 + 2 + 2 + 1 + 1 + 1)  # 3, 6, 9
  assert counts(cls["MainArgs"]["token"]) == (1 + 1 + 1 + 1 + 1 + 4, 2 + 1 + 1 + 1 + 2 + 4, 2 + 2 + 2 + 2 + 1 + 4)
  assert counts(cls["SubArgs"]["em"]) == (1 + 1 + 1 + 0, 1 + 2 + 1 + 0, 2 + 1 + 1 + 1)  # 3, 4, 5
  assert counts(cls["SubArgs"]["token"]) == (1 + 1 + 3 + 0, 1 + 2 + 3 + 0, 2 + 1 + 3 + 1)  # 5, 6, 7
  assert counts(cls["Arguments"]["em"]) == (6, 10, 14)
  assert counts(cls["Subject"]["em"]) == (1, 2, 3) and counts(cls["Treatment.Drug"]["em"]) == (2, 3, 3)
  assert counts(cls[f"{PTE}.Subject.Gender"]["em"]) == (0, 0, 1)
  assert counts(cls["Overall"]["em"]) == (8, 12, 17)
  assert "Attributes" not in cls
  # Trigger EM: P 2/2, R 2/3 -> F1 0.8; MainArgs EM: P 1/2, R 1/3 -> 0.4; SubArgs EM: P 3/4, R 3/5 -> 2/3.
  # Token F1 = 2 tp / (pred + tokens gold): MainArgs 18/24, SubArgs 10/13.
  h = r["headline"]
  assert h["Trigger"]["em_f1"] == pytest.approx(0.8) and h["MainArgs"]["em_f1"] == pytest.approx(0.4)
  assert h["SubArgs"]["em_f1"] == pytest.approx(2 / 3)
  assert h["MainArgs"]["token_f1"] == pytest.approx(0.75) and h["SubArgs"]["token_f1"] == pytest.approx(10 / 13)
  main_em = cls["MainArgs"]["em"]
  assert main_em["precision"] == pytest.approx(0.5) and main_em["recall"] == pytest.approx(1 / 3)
  assert r["skipped"] == {"pred": {"Foo": 1}, "gold": {}}


def test_identification_pools_roles():
  # "aspirin" predicted as Effect, gold Treatment: classification misses it, identification (MainArg, any role) not.
  t = "aspirin caused rash"
  pred = [[ev(t, AE, "caused", ("Effect", "aspirin"))]]
  gold = [[ev(t, AE, "caused", ("Treatment", "aspirin"), ("Effect", "rash"))]]
  r = phee_score([t], pred, gold)
  assert counts(r["classification"]["MainArgs"]["em"]) == (0, 1, 2)
  assert counts(r["identification"]["MainArg"]["em"]) == (1, 1, 2)
  assert counts(r["identification"][f"{AE}.MainArg"]["em"]) == (1, 1, 2)
  assert counts(r["identification"]["Overall"]["em"]) == (2, 2, 3)  # the trigger too


def test_attributes_and_combination_keys():
  t = "The drug may cause severe rash with warfarin."
  gold = [[ev(t, AE, "cause", ("Speculated", "may"), ("Severity", "severe"), ("Negated", "may"),
              ("Treatment.Combination.Drug", "warfarin"), ("Treatment.Combination.Trigger", "with"))]]
  r = phee_score([t], gold, gold)
  cls = r["classification"]
  assert counts(cls["Attributes"]["em"]) == (3, 3, 3) and f"{AE}.Speculated" in cls
  assert counts(cls["Combination.Drug"]["em"]) == (1, 1, 1) and f"{AE}.Combination.Drug" in cls
  assert counts(cls["SubArgs"]["em"]) == (1, 1, 1) and "MainArgs" not in cls
  assert counts(cls["Overall"]["em"]) == (5, 5, 5)  # trigger, 3 attributes, the combination drug
  assert r["skipped"]["gold"] == {"Treatment.Combination.Trigger": 1}


# --- against the reference scorer ---------------------------------------------------------------------------------


def reference(shared_data):
  path = shared_data / REFERENCE
  if not path.is_file():
    pytest.skip(f"{path} not found (the PHEE repository's evaluate/phee_metric.py, staged in shared/data/phee)")
  ns = {"__name__": "phee_metric_reference"}
  exec(compile(path.read_text(), str(path), "exec"), ns)  # pylint: disable=exec-used
  return ns["compute_metric"]


def test_reference_raises_on_the_data_attribute_names(shared_data):
  """Why Speculated / Negated stay out of the comparison: the reference's unknown-type warning raises on them."""
  compute_metric = reference(shared_data)
  with pytest.raises(ValueError, match="unsupported format character"):
    compute_metric([{"id": "0", "type": f"{AE}.Speculated", "predictions": ["may"], "golds": ["may"]}])


MAIN = ("Subject", "Treatment", "Effect")


def pieces(text, arg):
  """(start, end) of every piece of every mention of a PHEE ARG, checked against the text."""
  out = []
  for mention_text, mention_start in zip(arg["text"], arg["start"]):
    for piece, s in zip(mention_text, mention_start):
      assert text[s:s + len(piece)] == piece, (text, piece, s)
      out.append((s, s + len(piece)))
  return out


def our_events(rec):
  """A dev.json record as our events: Trigger, main and sub arguments, combination drugs, Severity."""
  text, out = rec["context"], []
  for e in rec["annotations"][0]["events"]:
    (trig,) = pieces(text, e["Trigger"])
    args = []
    for main in MAIN:
      if main not in e:
        continue
      args += [(main, s, t) for s, t in pieces(text, e[main])]
      for sub, v in e[main].items():
        if sub == "Combination":
          args += [("Treatment.Combination.Drug", s, t) for c in v if "Drug" in c for s, t in pieces(text, c["Drug"])]
        elif isinstance(v, dict):
          args += [(f"{main}.{sub}", s, t) for s, t in pieces(text, v)]
    if "Severity" in e:
      args += [("Severity", s, t) for s, t in pieces(text, e["Severity"])]
    out.append({"type": e["event_type"], "trigger": {"start": trig[0], "end": trig[1]},
                "arguments": [{"start": s, "end": t, "role": role} for role, s, t in args]})
  return out


def reference_answers_from_json(rec):
  """{key: [strings]} of a dev.json record built as the PHEE repository builds them (evaluate/compute_iaa.py's
  get_event_entities, the combination drugs keyed as produce_genqa_stage2_gold.py keys them): the pieces' own text."""
  out = collections.defaultdict(list)
  for e in rec["annotations"][0]["events"]:
    et = e["event_type"]

    def add(key, arg):
      out[key] += [piece for mention in arg["text"] for piece in mention]

    add(f"{et}.Trigger", e["Trigger"])
    for main in MAIN:
      if main in e:
        add(f"{et}.{main}", e[main])
        for sub, v in e[main].items():
          if sub == "Combination":
            for c in v:
              if "Drug" in c:
                add(f"{et}.Combination.Drug", c["Drug"])
          elif isinstance(v, dict):
            add(f"{et}.{main}.{sub}", v)
    if "Severity" in e:
      add(f"{et}.Severity", e["Severity"])
  return out


def answers_from_events(text, events):
  """{key: [strings]} of our events, keyed as the paper keys them."""
  out = collections.defaultdict(list)
  for e in events:
    if e["trigger"] is not None:
      out[f"{e['type']}.Trigger"].append(text[e["trigger"]["start"]:e["trigger"]["end"]])
    for a in e["arguments"]:
      role = a["role"].replace("Treatment.Combination.", "Combination.")
      out[f"{e['type']}.{role}"].append(text[a["start"]:a["end"]])
  return out


def perturbed(rng, text, events, roles):
  """Predictions: events dropped, retyped, their spans shifted, arguments dropped, duplicated and added."""
  L = len(text)

  def shift(a, b):
    a = min(max(0, a + rng.choice([-3, -1, 0, 1, 2])), b - 1)
    return a, max(a + 1, min(L, b + rng.choice([-2, -1, 0, 1, 4])))

  out = []
  for e in events:
    if rng.random() < 0.07:
      continue
    etype = e["type"] if rng.random() > 0.05 else rng.choice(["Adverse_event", "Potential_therapeutic_event"])
    trig = e["trigger"]
    if rng.random() < 0.15:
      trig = dict(zip(("start", "end"), shift(trig["start"], trig["end"])))
    args = []
    for a in e["arguments"]:
      x = rng.random()
      if x < 0.15:
        continue
      if x < 0.35:
        a = dict(a, **dict(zip(("start", "end"), shift(a["start"], a["end"]))))
      args.append(a)
      if rng.random() < 0.04:
        args.append(a)
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
      s = rng.randrange(L)
      args.append({"start": s, "end": min(L, s + rng.randint(1, 25)), "role": rng.choice(roles)})
    out.append({"type": etype, "trigger": trig, "arguments": args})
  return out


def test_matches_reference_scorer_on_perturbed_dev(shared_data):
  compute_metric = reference(shared_data)
  path = shared_data / "phee" / "dev.json"
  if not path.is_file():
    pytest.skip(f"{path} not found")
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  texts = [r["context"] for r in records]
  gold = [our_events(r) for r in records]
  # Our events carry the same answers as the repository builds from the file (multisets per sentence and key).
  for r, (rec, evs) in enumerate(zip(records, gold)):
    want, got = reference_answers_from_json(rec), answers_from_events(texts[r], evs)
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}, r

  roles = sorted({a["role"] for evs in gold for e in evs for a in e["arguments"]})
  rng = random.Random(0)
  pred = [perturbed(rng, t, evs, roles) for t, evs in zip(texts, gold)]

  instances = []
  for r, (t, p, g) in enumerate(zip(texts, pred, gold)):
    pa, ga = answers_from_events(t, p), answers_from_events(t, g)
    instances += [{"id": str(r), "type": k, "predictions": pa.get(k, []), "golds": ga.get(k, [])}
                  for k in sorted(set(pa) | set(ga))]
  want = compute_metric(instances)
  ours = phee_score(texts, pred, gold)
  got = as_reference(ours)

  assert set(got) == set(want)
  assert len(want) > 100 and 0.2 < want["CLS_MainArgs_EM_F1"] / 100 < 0.95  # perturbed, neither empty nor perfect
  assert want["CLS_SubArgs_MICRO_F1"] != want["CLS_SubArgs_EM_F1"]
  for k, v in want.items():
    assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
  # The same figures through the headline.
  assert ours["headline"]["Trigger"]["em_f1"] * 100 == pytest.approx(want["CLS_Trigger_EM_F1"], rel=1e-12)
  assert ours["headline"]["SubArgs"]["token_f1"] * 100 == pytest.approx(want["CLS_SubArgs_MICRO_F1"], rel=1e-12)
  assert ours["skipped"] == {"pred": {}, "gold": {}}
