"""PHEE pharmacovigilance event extraction (GPLinker for events, task=events) with the pretrained all-MiniLM-L6-v2
encoder.

Needs ../shared/data/phee (or --config.data.manual_dir; TFDS builder phee: train / dev / test). The span classes
are the (event type, role) pairs, "Adverse_event:Treatment.Drug" ...; the argument-level F1 (Su's) selects
checkpoints; the final results also hold the PHEE paper's EM / token F1 for Trigger, MainArgs and SubArgs
(results.json "phee", `tasks.events.phee_score`). Attributes (Speculated / Negated / Severity) are left out by the
reader (docs/studies/phee.md).
Settings, chosen on dev on this 2-core CPU (2026-11-28, docs/studies/phee.md; one seed each):
one epoch first (`:epochs=1`, encoder lr 1e-4): 286 s whole command, dev argument F1 0.4716 (all inside the 300
warmup steps). Then 10 epochs each, best dev argument F1 (Su's, the selection figure):
  encoder lr 1e-4, head lr 1e-3 (webnlg_minilm's):  0.6654 (24.1 min; still rising at the last epoch)
  encoder lr 2e-4, head lr 2e-3 (chosen):           0.6717 (17.6 min, lighter load; best at the last epoch)
Head lr with the encoder's doubled in one step (one trial only: each costs ~20 minutes). Then, on trial 2's code
re-run (10 epochs): event_grouping "trigger" (Su's cliques, then one event per trigger) over "cliques", read on the
same checkpoint's dev predictions: PHEE dev EM F1 trigger / main / sub 0.547 / 0.527 / 0.545 -> 0.669 / 0.615 / 0.670.
20 epochs (early stopping after 3 without a better dev F1): best dev argument F1 0.6714 at epoch 11, stopped at 14;
dev EM F1 0.675 / 0.612 / 0.677 (no gain over 10 epochs beyond one seed's noise). Then the sweep below (3 seeds
an arm): the argument pointer without RoPE was higher on dev at every seed in the three PHEE EM F1s (means trigger /
main / sub 0.677 / 0.627 / 0.670 against 0.666 / 0.590 / 0.642 with RoPE), so RoPE is off by default here
(`:rope=True` turns it on). Other encoders and pointer_rope were not tried (pointer_rope belongs to a study, not to
the settings).
`quick` is a one-minute smoke run.
"""

from gp_jax.configs import base


def get_config(arg=None, dataset="phee"):
  a = base.parsed_arg(arg, dataset=dataset, encoder="bert", head="efficient", rope=False)
  c = base.get_config(arg, dataset=dataset, encoder="bert", head="efficient", rope=False, _defer_quick=True)
  c.task = "events"
  c.data.max_len = 128  # PHEE sentences: median ~30 word pieces, the longest ~130
  c.data.buckets = (32, 64, 128)
  c.model.pretrained = "minilm"
  c.model.dropout = 0.1
  c.model.pointer_rope = False  # as Su: no RoPE on the two link pointers
  c.model.event_grouping = "trigger"  # Su's cliques, then one event per trigger; chosen on dev (docs/studies/phee.md)
  c.batch_size = 16
  c.num_epochs = a.epochs or 20.0
  c.early_stop_patience = 3
  c.optimizer.lr = 2e-4  # encoder; chosen on dev over 1e-4 (above)
  c.optimizer.head_lr = 2e-3  # the event head; doubled with the encoder's (above)
  c.optimizer.ema_decay = 0.0
  c.checkpoint_every_steps = 1000
  c.log_every_steps = 50
  return base.shrink_if_quick(c, a)


def get_sweep(arg=None):
  """The events study: RoPE on the argument pointer on / off x 3 seeds (6 full runs; cost in docs/studies/phee.md).
  Seed-major: every cell gets a first result before any second seed runs."""
  return [{"config.model.use_rope": r, "config.seed": s} for s in (0, 1, 2) for r in (True, False)]
