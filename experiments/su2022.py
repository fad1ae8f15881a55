"""Su's own experiments (kexue.fm 8373 / 8877, arXiv 2208.03054) with his settings: BERT-base Chinese fine-tuned
with a GlobalPointer, Efficient GlobalPointer or CRF head on People's Daily, CLUENER or CMeEE.

Settings come from bojone/GlobalPointer's scripts (each line below names its source):
PeopleDaily_GlobalPointer.py, CLUENER_GlobalPointer.py, CMeEE_GlobalPointer.py and their *_CRF.py twins.
What still differs from his code is listed in docs/results.md ("Su's experiments: what still differs").

  dataset=people_daily|cluener2020|cmeee   (People's Daily needs example.train in its manual dir; CMeEE needs
                                            CMeEE_{train,dev,test}.json from CBLUE)
  head=standard|efficient|crf, rope=True|False (span heads), seed=N, epochs=N
  pretrained=HUB_ID_OR_FOLDER              (default google-bert/bert-base-chinese, his chinese_L-12_H-768_A-12)

  python -m launch.local --config=experiments/su2022.py:dataset=cluener2020 --workdir=runs/su2022

Decoding keeps every span scoring > 0 (his `recognize(text, threshold=0)`); that is fixed, not a key.
Exact reproduction of his training data: --config.data.truncate=True (first 256 tokens of each training record;
our default cuts long records into sliding windows instead).
"""

from gp_jax.configs import base
from gp_jax.errors import UserError

PRETRAINED = "google-bert/bert-base-chinese"
DATASETS = ("people_daily", "cluener2020", "cmeee")
HEADS = ("standard", "efficient", "crf")
SEEDS = (0, 1, 2)


def get_config(arg=None):
  defaults = dict(dataset="cluener2020", encoder="bert", pretrained=PRETRAINED)
  a = base.parsed_arg(arg, **defaults)
  if a.dataset not in DATASETS:
    raise UserError(f"experiments/su2022.py: dataset must be one of {', '.join(DATASETS)}, got {a.dataset!r}")
  if a.head not in HEADS:
    raise UserError(f"experiments/su2022.py: head must be one of {', '.join(HEADS)}, got {a.head!r}")
  if a.encoder != "bert":
    raise UserError(f"experiments/su2022.py: encoder must be bert (his BERT-base), got {a.encoder!r}")
  c = base.get_config(arg, **defaults, _defer_quick=True)

  c.model.pretrained = a.pretrained  # config_path/checkpoint_path: chinese_L-12_H-768_A-12 (all six scripts)
  c.model.head_size = 64  # GlobalPointer(len(categories), 64) / EfficientGlobalPointer(..., 64)
  c.model.tag_scheme = "BIO"  # *_CRF.py: B-type / I-type labels with O, ConditionalRandomField
  c.model.dropout = 0.1  # build_transformer_model: the BERT config's dropout (hidden_dropout_prob 0.1)
  c.tokenizer.lowercase = True  # Tokenizer(dict_path, do_lower_case=True) (bert-base-chinese's tokenizer lowercases)

  c.data.max_len = 256  # maxlen = 256
  c.data.buckets = (64, 128, 192, 256)  # he pads each batch to its longest record (sequence_padding)
  c.data.truncate = False  # he trains on the first maxlen tokens only (tokenize(text, maxlen=maxlen)); True = his
  c.data.test_split = "test" if a.dataset == "people_daily" else ""  # CLUENER and CMeEE test sets are unlabelled
  c.batch_size = 16  # batch_size = 16
  c.data.bucket_run = 16  # ours: an epoch's batches come in shuffled runs of 16 of one bucket, so k-step calls are full
  c.steps_per_execution = 0  # ours: auto, k train steps per call on GPU/TPU (gp_jax.feed.AUTO_STEPS), 1 on CPU
  c.eval_batch_size = 64
  c.num_epochs = a.epochs or 10.0  # epochs = 10
  c.eval_every_steps = 0  # Evaluator.on_epoch_end: dev F1 once per epoch
  c.early_stop_patience = 0  # no early stopping; the best dev epoch's weights are kept (model.save_weights)
  c.log_every_steps = 100
  c.checkpoint_every_steps = 1000

  c.optimizer.lr = 2e-5  # learning_rate = 2e-5; Adam(learning_rate)
  c.optimizer.head_lr = 0.0  # one learning rate for encoder and head
  c.optimizer.warmup_steps = 0  # plain bert4keras Adam: no warmup
  c.optimizer.decay = "constant"  # no schedule
  c.optimizer.weight_decay = 0.0  # Adam, not AdamW
  c.optimizer.clip_norm = 0.0  # no gradient clipping
  c.optimizer.b1 = 0.9  # bert4keras Adam beta_1
  c.optimizer.b2 = 0.999  # bert4keras Adam beta_2
  c.optimizer.eps = 1e-6  # bert4keras Adam epsilon
  c.optimizer.crf_lr_multiplier = 1000.0  # *_CRF.py: crf_lr_multiplier = 1000 (only the CRF has transitions)
  return base.shrink_if_quick(c, a)


def get_sweep(arg=None):
  """One launch per dataset (the arg): head x RoPE (span heads only) x seeds 0, 1, 2, seed-major."""
  del arg
  points = []
  for seed in SEEDS:
    for head in HEADS:
      for rope in ((True, False) if head != "crf" else (None,)):
        point = {"config.model.head": head, "config.seed": seed}
        if rope is not None:
          point["config.model.use_rope"] = rope
        points.append(point)
  return points
