"""The PHEE paper's scoring (Sun et al. 2022) on char-offset events: EM and token F1 for Trigger, MainArgs, SubArgs.

Why: PHEE's published figures (trigger EM F1 70.09, main-argument 68.60, sub-argument 76.16) are computed by the
repository's scorer (ZhaoyueSun/PHEE evaluate/phee_metric.py, `compute_metric`); this module applies the same rules
to our events so our figures compare with them. Written from the rules below, checked against that file in
tests/tasks/test_phee_score.py. Plain Python, no jax.

Rules, as the reference applies them:
- An answer is the text of one argument or trigger (`text[start:end]`; each piece of a discontinuous mention is its
  own argument, as the reader makes them). Its key is "{type}.Trigger" or "{type}.{role}" with roles as our records
  name them ("Subject", "Treatment.Drug", ...); "Treatment.Combination.Drug" is keyed "{type}.Combination.Drug", the
  paper's name for it (PHEE preprocess/produce_genqa_stage2_gold.py), a sub-argument.
- Answers are grouped by (sentence, key): same-type events of one sentence are pooled; offsets and event grouping
  play no part.
- A string is normalised: lower case; each whitespace token split at punctuation (`string.punctuation`), the
  punctuation dropped; the words "a", "an", "the" removed (regex word boundaries); whitespace collapsed.
- EM: per group the multiset intersection of normalised strings (empty ones included), summed over groups;
  P = tp / predicted, R = tp / gold, F1 their harmonic mean (0 when a side is 0). Token F1: the same over the bags
  of whitespace tokens of a group's normalised strings.
- Classification groups ("CLS"): each key; "Trigger"; "MainArgs" (two-part keys of Subject, Treatment, Effect) and
  each main role; "SubArgs" (three-part keys) and each "Main.Sub"; "Arguments" (main + sub); "Attributes";
  "Overall" (all). Identification ("IDT"): answers pooled per (sentence, "{type}.{Trigger|MainArg|SubArg|Attribute}")
  regardless of role, then summed per class and "Overall".
- Attributes (Speculated, Negated, Severity) are not in Trigger / MainArgs / SubArgs: the paper's headline groups
  leave them out. The reference names them Speculation / Negation / Severity; on the data's Speculated / Negated
  keys it falls to its unknown-type warning, whose format string raises ValueError. Here all three count under
  "Attributes" and "Overall" (comparable with the reference only for Severity).
- Roles outside this scheme (other two-part roles, keys of four or more parts, sub-event triggers such as
  "Treatment.Combination.Trigger", which the paper's headline trigger figure does not score) are skipped and counted
  under "skipped".
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

from gp_jax.tasks.events.metrics import checked_events

MAIN_ROLES = ("Subject", "Treatment", "Effect")
ATTRIBUTE_ROLES = ("Speculated", "Negated", "Severity", "Speculation", "Negation")
HEADLINE = ("Trigger", "MainArgs", "SubArgs")
_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_STATS = ("em_tp", "em_pred", "em_gold", "tok_tp", "tok_pred", "tok_gold")


def normalize_answer(s: str) -> str:
  """The reference's normalisation: lower case, punctuation splits tokens and goes, articles go, spaces collapse."""
  s = "".join(" " if ch in _PUNCT else ch for ch in s.lower())
  return " ".join(_ARTICLES.sub(" ", " ".join(s.split())).split())


def answer_key(etype: str, role: str) -> tuple[str, str] | None:
  """(key, class) of an argument role: class "Trigger" | "MainArg" | "SubArg" | "Attribute", or None to skip."""
  parts = role.split(".")
  if parts[:2] == ["Treatment", "Combination"]:
    parts = parts[1:]
  if parts[-1] == "Trigger" or len(parts) > 2:
    return None
  key = ".".join([etype, *parts])
  if len(parts) == 2:
    return key, "SubArg"
  if parts[0] in MAIN_ROLES:
    return key, "MainArg"
  if parts[0] in ATTRIBUTE_ROLES:
    return key, "Attribute"
  return None


def _answers(texts, events, skipped: collections.Counter, kinds: dict) -> dict[tuple[str, int, str], list[str]]:
  """{("cls", record, key) and ("idt", record, "{type}.{class}"): [answer text]}; `kinds[key]` = (class, role)."""
  out = collections.defaultdict(list)
  for r, (text, evs) in enumerate(zip(texts, events)):
    for etype, trig, args in evs:
      found = [(f"{etype}.Trigger", "Trigger", "Trigger", trig)] if trig is not None else []
      for role, a, b in args:
        kc = answer_key(etype, role)
        if kc is None:
          skipped[role] += 1
        else:
          found.append((*kc, kc[0][len(etype) + 1:], (a, b)))
      for key, cls, name, (a, b) in found:
        kinds[key] = (cls, name)
        out["cls", r, key].append(text[a:b])
        out["idt", r, f"{etype}.{cls}"].append(text[a:b])
  return out


def _group_stats(preds: list[str], golds: list[str]) -> tuple[int, ...]:
  """(em tp, em pred, em gold, token tp, token pred, token gold) of one group."""
  p, g = [normalize_answer(x) for x in preds], [normalize_answer(x) for x in golds]
  pt, gt = [t for s in p for t in s.split()], [t for s in g for t in s.split()]
  em = sum((collections.Counter(p) & collections.Counter(g)).values())
  tok = sum((collections.Counter(pt) & collections.Counter(gt)).values())
  return em, len(p), len(g), tok, len(pt), len(gt)


def _prf(tp: int, pred: int, gold: int) -> dict:
  precision = tp / pred if pred else 0.0
  recall = tp / gold if gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1, "tp": tp, "pred": pred, "gold": gold}


def _cls_groups(key: str, cls: str, role: str) -> list[str]:
  """The reference's CLS names a key's counts add to, the key itself first."""
  return [key, *{"Trigger": ["Trigger"], "MainArg": ["MainArgs", "Arguments", role],
                 "SubArg": ["SubArgs", "Arguments", role], "Attribute": ["Attributes"]}[cls], "Overall"]


def phee_score(texts: Sequence[str], pred_events: Sequence[Sequence[dict]], gold_events: Sequence[Sequence[dict]]):
  """EM and token P/R/F1 of the PHEE paper per group; events as `metrics.event_prf` takes them (fractions, not %).

  Returns {"classification": {name: {"em": six, "token": six}}, "identification": {...}, "headline":
  {"Trigger" | "MainArgs" | "SubArgs": {"em_f1", "token_f1"}}, "skipped": {"pred" | "gold": {role: count}}}, six
  being {"precision", "recall", "f1", "tp", "pred", "gold"}; names as the reference's (`as_reference`).
  """
  skipped, kinds = {"pred": collections.Counter(), "gold": collections.Counter()}, {}
  pred = _answers(texts, checked_events(texts, pred_events, "predictions"), skipped["pred"], kinds)
  gold = _answers(texts, checked_events(texts, gold_events, "gold"), skipped["gold"], kinds)
  totals = {"cls": collections.defaultdict(lambda: [0] * 6), "idt": collections.defaultdict(lambda: [0] * 6)}
  for part, r, key in set(pred) | set(gold):
    stats = _group_stats(pred.get((part, r, key), []), gold.get((part, r, key), []))
    names = _cls_groups(key, *kinds[key]) if part == "cls" else [key, key.rsplit(".", 1)[1], "Overall"]
    for name in names:
      totals[part][name] = [x + y for x, y in zip(totals[part][name], stats)]

  def figures(t):
    return {"em": _prf(*t[:3]), "token": _prf(*t[3:])}

  result = {"classification": {k: figures(v) for k, v in sorted(totals["cls"].items())},
            "identification": {k: figures(v) for k, v in sorted(totals["idt"].items())}}
  cls = result["classification"]
  result["headline"] = {g: {"em_f1": cls[g]["em"]["f1"] if g in cls else 0.0,
                            "token_f1": cls[g]["token"]["f1"] if g in cls else 0.0} for g in HEADLINE}
  result["skipped"] = {side: dict(sorted(c.items())) for side, c in skipped.items()}
  return result


def as_reference(result: dict) -> dict[str, float]:
  """`phee_score`'s figures under the reference's `compute_metric` names and scale ("CLS_Trigger_EM_F1", percent)."""
  out = {}
  for part, prefix in (("classification", "CLS"), ("identification", "IDT")):
    for name, fig in result[part].items():
      for kind, tag in (("em", "EM"), ("token", "MICRO")):
        for stat, s in (("precision", "P"), ("recall", "R"), ("f1", "F1")):
          out[f"{prefix}_{name}_{tag}_{s}"] = 100.0 * fig[kind][stat]
  return out


__all__ = ["phee_score", "as_reference", "normalize_answer", "answer_key", "MAIN_ROLES", "ATTRIBUTE_ROLES",
           "HEADLINE"]
