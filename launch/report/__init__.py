"""Summarises finished runs: mean +- sample std over seeds per dataset x encoder x head x RoPE.

  python -m launch.report runs/rope
  python -m launch.report gs://BUCKET/runs/rope gs://BUCKET/runs/heads --out docs/figures/rope

A run is a folder holding config.json or results.json (found recursively; local or gs:// via etils.epath).
Finished runs fall into cells: runs whose configs differ in the seed only, after resolving defaults (a key an
older config.json lacks takes its default from gp_jax.configs.base.get_config(); model.dtype=auto is what it
resolved to, float32 on CPU runs; keys that only say how a run logs or saves, runs.BOOKKEEPING_KEYS, are left
out). Cells are shown (as the resolved config has them) by data.name, model.encoder, model.head and model.use_rope
("n/a" for tagger heads, which
have no RoPE), by model.pointer_rope too when some run is a relation or event run (config.task=relations or events,
GPLinker: use_rope is RoPE on its entity / (event type, role) argument pointer, pointer_rope on its two link
pointers; "n/a" for entity runs, and configs without a task are entity runs; task names are the registry's,
gp_jax.tasks.NAMES), by data.max_len when one dataset's runs differ in it, by the training tricks when some run
used them, and, when cells shown alike differ in other keys, by a variant naming those keys (e.g.
tune_threshold=True). Each cell shows n (distinct seeds: when runs of a cell share a seed, e.g. one point run twice
under two folder names, only the first, DIRs as given then by path, counts; the others are flagged and named) and
mean +- std (statistics.stdev; "-" when n = 1) of dev/test F1, precision, recall (in %; for relation runs those of
(subject, relation, object) triples in the form results.json's "match" names, for event runs Su's argument level,
as lines under the table say), train tokens/s and parameter count, then epochs trained and whether training stopped
early. Preempted, failed and unfinished runs are listed apart, never averaged; a failed run without config.json is
named by its folder (config unknown), never made a cell; a finished run whose dev or test F1 is not a number (NaN:
a diverged run) is left out of its cell and flagged. F1/P/R columns name the split as the runs' config does
(data.dev_split, data.test_split; splits.py): "official dev" for a corpus's dev reported as the test figure
(data.test_split=dev), "holdout" for a dev held out of the training split (data.dev_split=holdout).

Significance, for the study's comparisons within a dataset x encoder (x max_len) x variant: RoPE on vs off per
head, GP vs CRF, EGP vs GP, each trick vs plain (for relation and event runs each among cells of one pointer RoPE
setting, named with it), pointer RoPE on vs off per head and RoPE (relation and event runs), and where a study
has length arms (max_len) each comparison's difference at the longer arm minus that at the shorter. Runs are paired by seed; on
the test split (dev when a run has no test F1) the table gives the mean over seeds of F1(A) - F1(B) with a 95%
t-interval and a paired t-test, and the p of a paired bootstrap over records when every run has results.json's
per-record counts (`"per_record": {"tp", "fp", "fn", optionally "id"}`; see stats.contrast_bootstrap). The
family of each study (one DIR, or each subfolder of a DIR whose runs sit in subfolders: a folder of studies) gets
Holm-adjusted p values at both levels; the influence check (stats.influence) leaves the --influence_k records that
carry the difference most out of both cells and flags a difference that this halves or flips. "Significant": both
adjusted p < 0.05 and not flagged. A comparison that cannot be paired (its cells differ in more than the compared
setting, two runs of a cell share a seed, no seed in common) is skipped with a line saying why, as is a planned one
(the study ran the settings it combines) whose arm has no finished run in the study, naming that cell and its runs
that failed, stopped or gave an F1 that is not a number (contrasts.py); a comparison with a non-finite F1 has no p.
Under the table, per study: over how many comparisons Holm adjusted each p, and the planned ones untested.

Event runs (task=events, e.g. experiments/phee_minilm.py's get_sweep: use_rope on/off x seeds) get a section of
their own (events.py): per cell and split the argument F1 beside the event-level F1 and the PHEE paper's EM and
token F1 of Trigger, MainArgs and SubArgs (results.json's "phee"), and each comparison of event cells in the paper's
EM F1s, paired by seed (t-interval and paired t-test over seeds, Holm within the study over that table; the PHEE
scorer keeps no per-record counts, so no bootstrap there: the argument F1's is in the significance table).

results.json says which heads are taggers (head_kind), the by-length buckets (length_buckets) and the dev F1 of
every evaluation (dev_history). Older results.json files lack these: tagger heads are then those in
gp_jax.models.taggers.TAGGERS, the buckets gp_jax.evaluate.LENGTH_BUCKETS, and the dev history comes from the
run's metrics.jsonl ("split": "dev" lines; by epoch when the steps per epoch are known, else by step).

With --out PREFIX it also writes PREFIX.md (the same tables; a PREFIX ending in '/' or naming an existing folder is
FOLDER/report: FOLDER/report.md, FOLDER/report_f1.png, ...), PREFIX_f1.png (one panel per dataset: heads on
the x axis, a head's relation or event cells once per pointer RoPE setting, RoPE on/off side by side, bar = mean
over seeds, dots = seeds), when some run has dev F1 by length (relation and event runs have none, and are left out)
PREFIX_by_length.png (dev F1 by gold entity length in encoder tokens, tp/pred/gold pooled over seeds; a bucket
without gold entities is left empty, and the axis gives the gold entities per bucket) and, when some run has a dev
history, PREFIX_epochs.png (dev F1 by epoch per head x RoPE (x pointer RoPE) cell: mean over all seeds, band =
min..max, faint where early-stopped seeds have dropped out: the mean of those still training). In the line figures
no two cells share colour and line style (past the palette's 10 colours the RoPE's dash gets dots).
Plots need matplotlib: pip install -e '.[plots]'.

Exit status 2 (one line on stderr) when a DIR does not exist or holds no run folder; 1 when --out cannot draw its
figures (no matplotlib); else 0.

Modules: runs.py (find run folders, read config/results/history, resolve configs), stats.py (cells, mean +- std,
pooled by-length F1), cells.py (a cell's keys, name and flags), contrasts.py (the planned comparisons, Holm families),
splits.py (what a run's dev and test splits are), events.py (the events section), paired.py (t-interval, t-test, paired
bootstrap, Holm, influence; numpy and scipy.stats), tables.py (markdown), plots.py (figures), power.py (seeds for a
paired t-test to reach a Holm-adjusted p < 0.05, `python -m launch.report.power`), headline.py (the "Does RoPE matter?" table of docs/results.md,
`python -m launch.report.headline`); this file is the CLI (`python -m launch.report`).
"""

from __future__ import annotations

import argparse
import sys

from etils import epath

from .. import prog

# The package's API: `from launch import report; report.collect(...)`.
from .plots import plot_by_length, plot_epochs, plot_f1, variant_tags, write_plots  # noqa: F401
from .runs import MAX_DEPTH, collect, find_runs, last_metrics  # noqa: F401
from .stats import INFLUENCE_K
from .stats import compare, holm, influence, pooled_by_length, summarize  # noqa: F401
from .tables import groups_table, influence_table, length_table, markdown  # noqa: F401


def missing_roots(roots) -> str | None:
  """One line naming the first DIR that does not exist or holds no run folder; None when every one holds runs."""
  for root in roots:
    if not epath.Path(root).is_dir():
      return f"{root} is not a folder: give the sweep folder a launcher wrote (e.g. runs/rope)"
    if not find_runs(root):
      return (f"{root} holds no run folder (a folder with config.json or results.json, up to {MAX_DEPTH} levels "
              "down): nothing has run there yet, or the runs are in another folder")
  return None


def out_prefix(prefix: str) -> str:
  """--out PREFIX as the files' prefix: FOLDER/report for a PREFIX ending in '/' or naming an existing folder."""
  if prefix.endswith("/") or epath.Path(prefix).is_dir():
    return str(epath.Path(prefix) / "report")
  return prefix


def main(argv=None):
  parser = argparse.ArgumentParser(prog=prog("report"), description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("roots", nargs="+", metavar="DIR", help="sweep folders holding run workdirs (local or gs://)")
  parser.add_argument("--out", default=None, metavar="PREFIX",
                      help="also write PREFIX.md and the PREFIX_*.png figures (e.g. docs/figures/rope); a PREFIX "
                      "ending in '/' or naming an existing folder means FOLDER/report (FOLDER/report.md, ...)")
  parser.add_argument("--influence_k", type=int, default=INFLUENCE_K, metavar="K",
                      help=f"records the influence check leaves out of both cells (default {INFLUENCE_K})")
  args = parser.parse_args(argv)
  if args.influence_k < 1:
    parser.error("--influence_k must be at least 1")
  problem = missing_roots(args.roots)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    return 2
  rows = collect(args.roots)
  summary = summarize(rows)
  text = markdown(rows, summary, influence_k=args.influence_k)
  print(text, end="")
  if not args.out:
    return 0
  out = out_prefix(args.out)
  epath.Path(out).parent.mkdir(parents=True, exist_ok=True)
  written = []
  try:
    if summary:
      written = write_plots(rows, summary, out)
      text += "\n" + "".join(f"![{title}]({name})\n\n" for title, name in written)
      if not any(name.endswith("_by_length.png") for _, name in written):
        text += ("(No dev F1 by entity length figure: no finished run recorded by_length; relation and event runs "
                 "do not.)\n")
      if not any(name.endswith("_epochs.png") for _, name in written):
        text += "(No dev F1 by epoch figure: no finished run recorded a per-epoch dev history.)\n"
      tags = variant_tags(summary)
      if tags:
        text += "\nVariants on the figures: " + "; ".join(f"{t} = {v}" for v, t in tags.items()) + ".\n"
  except ImportError as e:
    epath.Path(f"{out}.md").write_text(text)
    print(f"wrote {out}.md; no plots: {e}", file=sys.stderr)
    return 1
  epath.Path(f"{out}.md").write_text(text)
  folder = epath.Path(out).parent
  print(f"wrote {out}.md" + "".join(f", {folder / name}" for _, name in written), file=sys.stderr)
  return 0
