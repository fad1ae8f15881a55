"""GPLinker for events, host half of decoding: argument and link hits -> events, as Su's `extract_events`.

Within one row and one event type, two decoded arguments are linked when their head-pair cell (min of the starts,
max of the starts) and tail-pair cell (ends) are both hits. Su splits the arguments into events with
`clique_search` (all linked: one event; else, for each unlinked pair, recurse on each of the two nodes with its
neighbours; duplicates removed). That recursion yields exactly the maximal cliques of the link graph: every set it
returns is a clique that no argument of the group extends, and every maximal clique holds a node with a non-neighbour
(unless the group is one clique), whose neighbourhood the recursion enters. So the events are enumerated here with
Bron-Kerbosch (Tomita's pivot) on bitmasks, linear in the output for the graphs a trained model gives; the tests
check it against Su's recursion. A group with more arguments than `max_arguments_per_type` gives no events and is
counted (an untrained model decodes hundreds; the number of maximal cliques grows as 3^(n/3) at worst).

NumPy and plain Python only (no jax, no flax): exported folders decode with it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from gp_jax.tasks.base import trimmed

TRIGGER_ROLE = "trigger"
# At most 3^(24/3) = 6561 maximal cliques in a group: milliseconds of Python at worst.
MAX_ARGUMENTS_PER_TYPE = 24


class Argument(NamedTuple):
  role: str
  start: int  # window token, as the hit's coords
  end: int  # inclusive
  score: float  # its argument-pointer cell


class Event(NamedTuple):
  """One decoded event of a row: its arguments sorted by (role, start, end), the trigger among them (role
  `trigger_role`; a clique may hold more than one trigger, as in Su's output)."""

  row: int
  type: str
  arguments: tuple[Argument, ...]
  score: float  # the smallest cell that decided it: its arguments' cells and every pair's head and tail link cells


class Grouping(NamedTuple):
  events: list[Event]  # sorted by (row, type, arguments)
  over_bound: int  # (row, event type) groups with more arguments than the bound: no events from them
  over_bound_arguments: int  # the decoded arguments in those groups
  triggerless: int  # events dropped for want of a trigger (require_trigger=True)


def class_pairs(classes: Sequence) -> tuple[tuple[str, str], ...]:
  """Argument classes -> (event type, role) per class id: a pair stays as it is, a name "Type.role" is split at its
  first "." (roles may hold dots: "Treatment.Drug")."""
  out = []
  for c, x in enumerate(classes):
    if isinstance(x, str):
      etype, sep, role = x.partition(".")
      if not sep or not etype or not role:
        raise ValueError(f"argument class {c} is {x!r}: expected 'EventType.role' (or pass (type, role) pairs)")
      out.append((etype, role))
    else:
      etype, role = x
      out.append((str(etype), str(role)))
  return tuple(out)


def maximal_cliques(adjacency: Sequence[int]) -> list[int]:
  """All maximal cliques of a graph given as neighbour bitmasks (`adjacency[v]` bit u set when u, v linked; no
  self loops) -> bitmasks, in no particular order. Bron-Kerbosch with a pivot of most neighbours in P."""
  n = len(adjacency)
  out: list[int] = []
  if n == 0:
    return out
  stack = [(0, (1 << n) - 1, 0)]  # (clique R, candidates P, excluded X); iterative: no recursion limit
  while stack:
    r, p, x = stack.pop()
    if not p:
      if not x:
        out.append(r)
      continue
    px, pivot, best = p | x, 0, -1
    while px:
      low = px & -px
      u = low.bit_length() - 1
      k = (p & adjacency[u]).bit_count()
      if k > best:
        pivot, best = u, k
      px ^= low
    cand = p & ~adjacency[pivot]
    while cand:
      low = cand & -cand
      v = low.bit_length() - 1
      stack.append((r | low, p & adjacency[v], x & adjacency[v]))
      p ^= low
      x |= low
      cand ^= low
  return out


def _members(mask: int) -> list[int]:
  out = []
  while mask:
    low = mask & -mask
    out.append(low.bit_length() - 1)
    mask ^= low
  return out


def _links(row: int, args: list[Argument], head: dict, tail: dict) -> tuple[dict, list[int]]:
  """The link graph of one row and type's sorted arguments: ({(a, b), a < b, linked: (head score, tail score)},
  per argument the bit mask of those linked to it). Linked: (row, min starts, max starts) is a head hit and
  (row, min ends, max ends) a tail hit."""
  cells, adjacency = {}, [0] * len(args)
  for a in range(len(args)):
    ha, ta = args[a].start, args[a].end
    for b in range(a + 1, len(args)):
      hb, tb = args[b].start, args[b].end
      h = head.get((row, min(ha, hb), max(ha, hb)))
      t = None if h is None else tail.get((row, min(ta, tb), max(ta, tb)))
      if t is not None:
        cells[a, b] = (h, t)
        adjacency[a] |= 1 << b
        adjacency[b] |= 1 << a
  return cells, adjacency


def group_events(argument_hits, head_hits, tail_hits, *, classes: Sequence, trigger_role: str = TRIGGER_ROLE,
                 require_trigger: bool = True, max_arguments_per_type: int = MAX_ARGUMENTS_PER_TYPE) -> Grouping:
  """Hits (`ops.events.event_hits`: (count, coords, scores) each) -> the events of every row (`Grouping`).

  `classes`: per argument class id its (event type, role) pair or "Type.role" name (`class_pairs`). Arguments of
  one row and type are linked when (row, 0, min starts, max starts) is a head hit and (row, 0, min ends, max ends) a
  tail hit; each maximal clique of that graph is an event (Su's `clique_search`). `require_trigger`: drop (and count)
  the events with no argument of role `trigger_role`, as Su's `extract_events` at prediction; False keeps them (Su's
  `evaluate` scores arguments on those too).
  """
  pairs = class_pairs(classes)
  arg_coords, arg_scores = trimmed(argument_hits)
  head_coords, head_scores = trimmed(head_hits)
  tail_coords, tail_scores = trimmed(tail_hits)
  head = {(r, i, j): s for (r, _, i, j), s in zip(head_coords.tolist(), head_scores.tolist())}
  tail = {(r, i, j): s for (r, _, i, j), s in zip(tail_coords.tolist(), tail_scores.tolist())}
  groups: dict[tuple[int, str], list[Argument]] = defaultdict(list)
  for (row, c, start, end), score in zip(arg_coords.tolist(), arg_scores.tolist()):
    if not 0 <= c < len(pairs):
      raise ValueError(f"argument hit of class {c} at row {row}: the classes name {len(pairs)} (pass the model's "
                       f"argument classes, in its order)")
    etype, role = pairs[c]
    groups[row, etype].append(Argument(role, start, end, float(score)))
  events, over, over_args, triggerless = [], 0, 0, 0
  for (row, etype), args in sorted(groups.items()):
    n = len(args)
    if n > max_arguments_per_type:
      over += 1
      over_args += n
      continue
    args.sort()
    cells, adjacency = _links(row, args, head, tail)
    for mask in maximal_cliques(adjacency):
      members = _members(mask)
      if require_trigger and not any(args[m].role == trigger_role for m in members):
        triggerless += 1
        continue
      link_scores = [s for i, a in enumerate(members) for b in members[i + 1:] for s in cells[a, b]]
      score = min([args[m].score for m in members] + link_scores)  # an event is as sure as its least sure part
      events.append(Event(row, etype, tuple(args[m] for m in members), score))
  events.sort(key=lambda e: (e.row, e.type, [a[:3] for a in e.arguments]))
  return Grouping(events, over, over_args, triggerless)


__all__ = ["Argument", "Event", "Grouping", "group_events", "class_pairs", "maximal_cliques", "TRIGGER_ROLE",
           "MAX_ARGUMENTS_PER_TYPE"]
