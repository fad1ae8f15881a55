"""Everything built from a training config: the tokenizer, the model, the prepared data splits.

The one place that reads the ConfigDict for these; `models/` and `data/` take small typed arguments.
Used by training, predict and the benchmarks.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax import adversarial, optim, runtime, tasks
from gp_jax.adversarial import Adversarial
from gp_jax.data import batching, corpora, sources, tagging
from gp_jax.data.char_tokenizer import CharTokenizer
from gp_jax.data.sources import conventions, load_records
from gp_jax.data.tokenize import HFTokenizer
from gp_jax.errors import UserError
from gp_jax.models import bert, pretrained, scratch
from gp_jax.models.heads import HEADS
from gp_jax.models.ner import LOSS_KINDS
from gp_jax.models.scratch import ScratchConfig, ScratchEncoder
from gp_jax.models.taggers import TAGGERS
from gp_jax.ops import attention as ops_attention
from gp_jax.ops import blockwise
from gp_jax.tasks.base import threshold_config_refusal

log = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
DTYPE_CHOICES = ("auto",) + tuple(DTYPES)
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
ENCODERS = ("scratch", "bert")


def target_platform(platform: str | None = None) -> str:
  """The platform a program is compiled for, in `jax.export` / `lax.platform_dependent` names: `platform`, else
  this machine's default backend ("gpu" -> "cuda")."""
  p = (platform or jax.default_backend()).lower()
  p = {"gpu": "cuda"}.get(p, p)
  if p not in PLATFORMS:
    raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
  return p


@dataclasses.dataclass(frozen=True)
class Precision:
  """The precision policy and attention request resolved for one target platform."""

  platform: str
  dtype: str  # compute dtype name; parameters and optimizer state are float32 whatever it is
  attention: str  # model.attention as requested; ops.attention picks per shape ("auto" -> xla on cpu)
  attention_dropout: float  # bert: probability dropout (the XLA path only); scratch: 0 unless set
  dropout_bits: str = "threefry"  # bert: where dropout masks come from (`ops.dropout`): hash or threefry; scratch:
  # NNX_DROPOUT (its nnx.Dropout layers draw their own masks), as resolved.json records it

  def describe(self) -> str:
    return (f"compute {self.dtype} for {self.platform} (parameters, optimizer state, span scores, softmax, LayerNorm "
            f"statistics and RoPE in float32), attention {self.attention}, attention dropout {self.attention_dropout}, "
            f"{dropout_masks(self.dropout_bits)}")


NNX_DROPOUT = "none (nnx.Dropout)"  # the scratch encoder's dropout bits: `ops.dropout` is not used


def dropout_masks(bits: str) -> str:
  """How the logs name a dropout bit source (`Precision.dropout_bits`, resolved.json's "dropout_bits")."""
  return f"dropout masks from {bits} bits" if bits in runtime.DROPOUT_BITS else f"dropout masks: {bits}"


def resolve_dtype(name: str, platform: str | None = None) -> str:
  """`model.dtype` for the target: "auto" is float32 on cpu, bfloat16 on gpu/tpu; explicit names stay."""
  if name not in DTYPE_CHOICES:
    raise UserError(f"model.dtype must be one of {DTYPE_CHOICES}, got {name!r}")
  if name != "auto":
    return name
  return "float32" if target_platform(platform) == "cpu" else "bfloat16"


def attention_dropout(config) -> float:
  """`model.attention_dropout`; -1 (the default) keeps the old tie: model.dropout for bert, none for scratch."""
  rate = float(config.model.get("attention_dropout", -1.0))
  if rate >= 0:
    return rate
  return float(config.model.dropout) if config.model.encoder == "bert" else 0.0


DROPOUT_BITS_ENV = runtime.DROPOUT_BITS_ENV


def resolve_dropout_bits(name: str, platform: str) -> str:
  """`model.dropout_bits` for the target (`runtime.resolve_dropout_bits`); a bad value is the user's error."""
  try:
    return runtime.resolve_dropout_bits(name, platform)
  except ValueError as e:
    raise UserError(str(e)) from None


def precision(config, platform: str | None = None) -> Precision:
  """The policy `build_model` applies for the target `platform` (default: this machine's backend)."""
  p = target_platform(platform)
  bits = resolve_dropout_bits(config.model.get("dropout_bits", "auto"), p)  # checked whatever the encoder
  return Precision(p, resolve_dtype(config.model.dtype, p), config.model.get("attention", "auto"),
                   attention_dropout(config), bits if config.model.encoder == "bert" else NNX_DROPOUT)


def build_tokenizer(config, train_texts):
  """Builds the tokenizer from the training texts (scratch) or opens the pretrained one (bert); both lowercase
  text or not as `tokenizer.lowercase` says."""
  if config.model.encoder == "scratch":
    return CharTokenizer.build(
        train_texts,
        min_freq=config.tokenizer.min_freq,
        bigram_min_freq=config.tokenizer.bigram_min_freq,
        max_bigrams=config.tokenizer.max_bigrams or None,
        lowercase=config.tokenizer.lowercase,
    )
  if config.model.encoder == "bert":
    return HFTokenizer(pretrained.resolve(config.model.pretrained), lowercase=config.tokenizer.lowercase)
  raise UserError(f"model.encoder must be one of {ENCODERS}, got {config.model.encoder!r}")


def encoder_config(config) -> dict | None:
  """bert: the HF config.json dict of `model.pretrained`; None for the scratch encoder."""
  if config.model.encoder != "bert":
    return None
  return pretrained.encoder_config(config.model.pretrained)


def scratch_config(config, tokenizer, *, platform: str | None = None):
  m = config.model
  policy = precision(config, platform)
  return ScratchConfig(
      vocab_size=tokenizer.vocab_size,
      bigram_vocab_size=tokenizer.bigram_vocab_size if m.bigram_dim else 0,
      embed_dim=m.embed_dim,
      bigram_dim=m.bigram_dim or 128,
      hidden_size=m.hidden_size,
      num_layers=m.num_layers,
      block=m.block,
      kernel_size=m.kernel_size,
      dilations=tuple(m.dilations),
      conv_impl=m.get("conv_impl", "unfold"),
      num_attn_layers=m.num_attn_layers,
      dropout=m.dropout,
      embed_dropout=m.embed_dropout,
      attention=policy.attention,
      attention_dropout=policy.attention_dropout,
      target_platform=policy.platform,
  )


def loss_implementation(config, platform: str) -> str:
  """`loss.implementation` for the target `platform`: "auto" is pallas where `PALLAS_FASTER_ON` lists it (with the
  blockwise loss), else xla. UserError when pallas is asked for without the blockwise span loss."""
  m = config.model
  implementation = config.loss.get("implementation", "auto")
  if implementation == "auto":  # resolved for the target platform, not the machine that traces
    implementation = "pallas" if platform in blockwise.PALLAS_FASTER_ON and int(config.loss.block_size) else "xla"
  if implementation == "pallas" and not (m.head in HEADS and int(config.loss.block_size)
                                          and config.loss.kind == "sparse_zlpr"):
    raise UserError("loss.implementation=pallas is the blockwise span loss's kernel: it needs a span head "
                    f"(got model.head={m.head!r}), loss.block_size > 0 (got {config.loss.block_size}) and "
                    f"loss.kind=sparse_zlpr (got {config.loss.kind!r})")
  refusal = blockwise.pallas_refusal(platform) if implementation == "pallas" else None
  if refusal:
    raise UserError(refusal)
  return implementation


def build_model(config, tokenizer, num_types: int, *, seed: int = 0, load_weights: bool = True,
                encoder_config: dict | None = None, platform: str | None = None, labels=(), abstract_encoder=None):
  """Builds the model of `config.task` for the target `platform` (default: this machine's backend; see `precision`):
  the encoder here, the head by the task (from the run spec and its label space `labels`). With `load_weights=False`
  a bert encoder is built from `encoder_config` (the HF config.json dict; default: read from `model.pretrained`)
  without reading weights; `abstract_encoder` (that encoder from `nnx.eval_shape`) is filled with the weights rather
  than traced again."""
  spec = run_spec(config, platform)  # refuses a model.encoder not in ENCODERS (`check_choices`)
  policy = spec.precision
  dtype = DTYPES[policy.dtype]
  rngs = nnx.Rngs(params=seed, dropout=seed + 1)
  m = config.model
  if m.encoder == "scratch":
    encoder = ScratchEncoder(scratch_config(config, tokenizer, platform=policy.platform), dtype=dtype, rngs=rngs)
  else:  # bert
    overrides = {"hidden_dropout": float(m.dropout), "attention_dropout": policy.attention_dropout,
                 "attention": policy.attention, "target_platform": policy.platform, "dropout_bits": policy.dropout_bits,
                 "kernels": m.get("kernels", "auto")}
    if load_weights:
      encoder = pretrained.load_pretrained(pretrained.resolve(m.pretrained), dtype=dtype, overrides=overrides,
                                           abstract=abstract_encoder)
    else:
      hf = encoder_config or pretrained.encoder_config(m.pretrained)
      bcfg = dataclasses.replace(bert.BertConfig.from_hf_dict(hf), **overrides)
      encoder = bert.Bert(bcfg, dtype=dtype, rngs=rngs)
  return tasks.of(spec).build_model(encoder, spec, tuple(labels), num_types=num_types,
                                    feature_names=tokenizer.feature_names, dtype=dtype, rngs=rngs)


def task_name(config) -> str:
  """`config.task` (an older workdir's config.json has none: entities), checked: the task may refuse the config in
  one line (`config_refusal`), and tune_threshold=True where it says it does not apply (`threshold_refusal`)."""
  name = str(config.get("task", tasks.DEFAULT))
  if name not in tasks.NAMES:
    raise UserError(f"task={name!r}: expected one of {tasks.NAMES}")
  task = tasks.get(name)
  refusal = task.config_refusal(config) or threshold_config_refusal(config, task.threshold_refusal)
  if refusal:
    raise UserError(refusal)
  return name


def task_options(config, name: str) -> tuple:
  """The task's options (`Task.options`) from the config and the corpus's conventions (`sources.conventions`), as
  sorted (key, value) pairs: what `RunSpec.task_options` keeps."""
  return tuple(sorted(tasks.get(name).options(config, conventions(config.data)).items()))


def tag_scheme(config) -> str | None:
  """The tag scheme when the head is a tagger baseline, else None."""
  return config.model.tag_scheme if config.model.head in TAGGERS else None


def split_options(config) -> dict:
  """The `windows.prepare_split` arguments a config sets: window length, stride (None: half a window), span width
  (None: unlimited)."""
  d = config.data
  return dict(max_len=int(d.max_len), stride=int(d.get("stride", 0)) or None,
              max_span_width=int(d.get("max_span_width", 0)) or None)


def prepare_split(task, config, records, tokenizer, types, labels, *, name: str):
  """The task's prepared split (`Task.prepare`). `data.truncate` applies to the train split only: dev and test are
  always read whole, in sliding windows."""
  truncate = bool(config.data.get("truncate", False)) and name == "train"
  return task.prepare(records, tokenizer, types, labels, name=name, truncate=truncate, **split_options(config))


def prepare_data(config, tokenizer=None):
  """(splits {train, dev?, test?} of PreparedSplit, tokenizer, types). `tokenizer`: read the text with this one
  (a resumed run's, `resume.saved_tokenizer`) instead of building one from the train split."""
  train_recs, dev_recs, test_recs, types = load_records(config.data, seed=config.seed)
  if tokenizer is None:
    tokenizer = build_tokenizer(config, [r["text"] for r in train_recs])
  task = tasks.of(run_spec(config))
  labels = task.labels(train=train_recs, dev=dev_recs, test=test_recs)
  splits = {"train": prepare_split(task, config, train_recs, tokenizer, types, labels, name="train")}
  if dev_recs:
    splits["dev"] = prepare_split(task, config, dev_recs, tokenizer, types, labels, name="dev")
  if test_recs and any(r["entities"] for r in test_recs):
    splits["test"] = prepare_split(task, config, test_recs, tokenizer, types, labels, name="test")
  elif test_recs:
    log.info("Test split has no labels: skipping test evaluation")
  return splits, tokenizer, types


def train_batches(spec: RunSpec, train) -> batching.BatchIterator:
  """The training iterator over the prepared train split: this process's rows of each global batch."""
  return batching.train_batches(train, batch_size=spec.batch_size, buckets=spec.buckets, bucket_run=spec.bucket_run,
                                seed=spec.seed, process_index=jax.process_index(),
                                process_count=jax.process_count(), tag_scheme=spec.tag_scheme,
                                targets=tasks.of(spec).batch_targets)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """The `optimizer` group's fields as the config sets them; `optim.make_optimizer` reads it like the group."""

  lr: float
  head_lr: float
  warmup_steps: int
  decay: str
  weight_decay: float
  clip_norm: float
  b1: float
  b2: float
  eps: float
  crf_lr_multiplier: float = 1.0
  ema_decay: float = 0.0
  update_impl: str = "auto"
  ema_warmup: bool = False

  def get(self, name: str, default=None):
    """The field `name`, else `default` (the ConfigDict's `.get`, so `optim` reads either)."""
    return getattr(self, name, default)

  @classmethod
  def from_config(cls, group) -> OptimizerSpec:
    """Values kept as the config holds them (no casts): the optimizer computes exactly what it did from the group."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    return cls(**{f.name: group.get(f.name, defaults.get(f.name)) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """What training, evaluation, predict and the compiler read of a run, resolved once from its config for one target
  platform (`run_spec`): the steps and the trainer read these fields, never the ConfigDict, so a setting is
  resolved (and validated) in one place."""

  precision: Precision
  encoder: str  # model.encoder: scratch | bert
  head: str  # model.head: a span head or a tagger
  tag_scheme: str | None  # taggers: BIO | BIOES; None for span heads
  num_attn_layers: int  # scratch: self-attention blocks (0: no attention to choose)
  hidden_size: int  # scratch: encoder width (bert: the encoder config's)
  kernels: str  # bert: model.kernels as requested
  loss_kind: str  # loss.kind
  loss_implementation: str  # loss.implementation resolved for the platform: xla | pallas
  block_size: int | None  # loss.block_size; None: dense [B, H, L, L] loss and decoding
  ema_decay: float  # optimizer.ema_decay in [0, 1); 0 = no EMA
  ema_warmup: bool
  adversarial: Adversarial | None  # None: the plain step
  tune_threshold: bool
  optimizer: OptimizerSpec
  batch_size: int
  eval_batch_size: int
  buckets: tuple | None  # data.buckets; None: one bucket, max_len
  bucket_run: int
  max_len: int
  stride: int | None  # data.stride; None: half a window
  max_span_width: int | None  # data.max_span_width; None: unlimited
  checkpoint_every_steps: int
  keep_checkpoints: int
  eval_every_steps: int
  early_stop_patience: int  # epochs without a better dev F1 before stopping; 0 = never
  log_every_steps: int
  steps_per_execution: int  # as set: 0 = auto per platform (`feed.steps_per_execution`)
  seed: int
  num_train_steps: int
  num_epochs: float
  init_from: str
  head_size: int = 64  # model.head_size: a span head's width per class
  use_rope: bool = True  # model.use_rope: RoPE on the span head
  task: str = "entities"  # config.task, one of `gp_jax.tasks.NAMES`
  task_options: tuple = ()  # the task's own settings as sorted (key, value) pairs (`task_options`)

  @property
  def platform(self) -> str:
    return self.precision.platform

  @property
  def window_options(self) -> dict:
    """The `windows.prepare_split` arguments: window length, stride, span width."""
    return dict(max_len=self.max_len, stride=self.stride, max_span_width=self.max_span_width)


def ema_decay(config) -> float:
  """`optimizer.ema_decay`: > 0 keeps state["ema"], the weights evaluation and best/ use; 0 = off."""
  decay = float(config.optimizer.get("ema_decay", 0.0))
  if not 0.0 <= decay < 1.0:
    raise ValueError(f"optimizer.ema_decay must be in [0, 1), got {decay}")
  return decay


def buckets(config) -> tuple | None:
  """`data.buckets` (None: one bucket, data.max_len), each in [1, data.max_len]."""
  values = None if config.data.get("buckets") is None else tuple(int(b) for b in config.data.buckets)
  max_len = int(config.data.max_len)
  try:
    batching.normalize_buckets(values, max_len)  # the batcher's check, here before any data is read
  except ValueError:
    fits = tuple(b for b in values if 1 <= b <= max_len)
    raise UserError(f"data.buckets={values} must lie in [1, data.max_len={max_len}]: pass "
                    f"--config.data.buckets='{fits}' or a larger data.max_len") from None
  return values


def _count(config, key: str, default: int, low: int) -> int:
  """config[key] (dotted) as an int >= `low`, else a UserError naming it."""
  group, _, name = key.rpartition(".")
  value = (config[group] if group else config).get(name, default)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < low:
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    raise UserError(f"{key}={value!r}: expected {what}")
  return int(value)


def _rates(config) -> None:
  """Dropout rates in [0, 1) (attention_dropout -1: the default tie), learning rates finite and >= 0, else a
  UserError naming the key."""
  m = config.model
  for key, low in (("dropout", 0.0), ("embed_dropout", 0.0), ("attention_dropout", -1.0)):
    rate = float(m.get(key, 0.0))
    if not (0.0 <= rate < 1.0 or rate == low):
      raise UserError(f"model.{key}={rate}: expected a rate in [0, 1)" + (" or -1" if low else ""))
  for key in ("lr", "head_lr"):
    rate = float(config.optimizer.get(key, 0.0))
    if not (math.isfinite(rate) and rate >= 0):
      raise UserError(f"optimizer.{key}={rate}: expected a finite learning rate >= 0")


def choices(config) -> dict[str, tuple]:
  """Each key of `config` that takes one of a set of names -> the names it accepts (for this encoder and head)."""
  m = config.model
  out = {"model.head": tuple(HEADS) + tuple(TAGGERS), "model.encoder": ENCODERS,
         "model.attention": ops_attention.IMPLEMENTATIONS, "model.dropout_bits": runtime.DROPOUT_BITS,
         "loss.kind": LOSS_KINDS, "loss.implementation": blockwise.IMPLEMENTATIONS, "optimizer.decay": optim.DECAYS,
         "optimizer.update_impl": optim.UPDATES, "adversarial.kind": adversarial.ADVERSARIAL_KINDS,
         "data.name": (corpora.NAMES + tuple(sources.SYNTHETIC_CORPORA) + sources.USER_FORMATS)}
  if m.get("encoder") == "scratch":
    out.update({"model.block": scratch.BLOCKS, "model.conv_impl": scratch.CONV_IMPLS})
  if m.get("encoder") == "bert":
    out["model.kernels"] = bert.KERNELS
  return out


def check_choices(config) -> None:
  """UserError, in one line, for the first key of `choices` whose value is not one of its names (keys an older
  config.json lacks are skipped); taggers: `model.tag_scheme` too."""
  for key, names in choices(config).items():
    section, _, field = key.partition(".")
    if section not in config or field not in config[section]:
      continue
    value = config[section][field]
    if value not in names:
      close = difflib.get_close_matches(str(value), [str(n) for n in names], n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      raise UserError(f"{key}={value!r}: expected one of {', '.join(map(str, names))}{hint}")
  scheme = config.model.get("tag_scheme", "BIO")
  if config.model.get("head") in TAGGERS:
    try:
      tagging.normalize_scheme(str(scheme))
    except ValueError:
      raise UserError(f"model.tag_scheme={scheme!r}: the tagger heads take {' or '.join(tagging.SCHEMES)} (IOB2 and "
                      "IOBES are read as these)") from None


def run_spec(config, platform: str | None = None) -> RunSpec:
  """The run spec of `config` for the target `platform` (default: this machine's backend): the one place the
  trainer's, the steps' and the compiler's settings are read from the ConfigDict. Keys an older workdir's
  config.json lacks take the base config's defaults."""
  check_choices(config)
  _rates(config)
  policy = precision(config, platform)
  m, d = config.model, config.data
  get = config.get
  name = task_name(config)
  return RunSpec(
      precision=policy, encoder=m.encoder, head=m.head, tag_scheme=tag_scheme(config),
      num_attn_layers=int(m.get("num_attn_layers", 0)), hidden_size=int(m.get("hidden_size", 0)),
      kernels=m.get("kernels", "auto"), loss_kind=config.loss.kind,
      loss_implementation=loss_implementation(config, policy.platform),
      block_size=_count(config, "loss.block_size", 0, 0) or None, ema_decay=ema_decay(config),
      ema_warmup=bool(config.optimizer.get("ema_warmup", False)), adversarial=Adversarial.from_config(config),
      tune_threshold=bool(get("tune_threshold", False)), optimizer=OptimizerSpec.from_config(config.optimizer),
      batch_size=_count(config, "batch_size", 32, 1), eval_batch_size=_count(config, "eval_batch_size", 128, 1),
      buckets=buckets(config), bucket_run=int(d.get("bucket_run", 0)), **split_options(config),
      checkpoint_every_steps=_count(config, "checkpoint_every_steps", 500, 1),
      keep_checkpoints=_count(config, "keep_checkpoints", 2, 1),
      eval_every_steps=_count(config, "eval_every_steps", 0, 0),
      early_stop_patience=_count(config, "early_stop_patience", 0, 0),
      log_every_steps=_count(config, "log_every_steps", 100, 1),
      steps_per_execution=_count(config, "steps_per_execution", 1, 0), seed=int(get("seed", 0)),
      num_train_steps=_count(config, "num_train_steps", 0, 0), num_epochs=float(get("num_epochs", 3.0)),
      init_from=str(get("init_from", "") or ""), head_size=_count(config, "model.head_size", 64, 1),
      use_rope=bool(m.get("use_rope", True)), task=name, task_options=task_options(config, name))
