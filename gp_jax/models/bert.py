"""BERT / RoBERTa encoder in Flax NNX, numerically matching transformers' BertModel.

Post-LN Transformer: embeddings (word + position + token type) -> LayerNorm -> dropout, then N layers of
  h = LN(h + Dropout(Attn(h)));  h = LN(h + Dropout(W2 gelu(W1 h))).
RoBERTa checkpoints differ only in position ids (cumulative count of non-pad tokens + pad id) and the
weight-name prefix.

`load_pretrained(dir)` reads config.json + model.safetensors (numpy API, no pickle) from a local
directory. The model comes back in eval mode (dropout off), like transformers' `from_pretrained`;
a freshly built `Bert(...)` follows the nnx convention and starts in train mode.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import pathlib
import re
import socket
import urllib.parse
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gp_jax.models.layers import linear

log = logging.getLogger(__name__)

_ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")
_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
  "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # BERT's "gelu" is the exact erf form
  "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
  "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  "relu": jax.nn.relu,
  "silu": jax.nn.silu,
  "swish": jax.nn.silu,
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture of a BERT-family encoder (field names follow the nnx side, not HF's)."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"
  model_type: str = "bert"  # "bert" | "roberta" (position ids offset by pad_token_id + 1)
  pad_token_id: int = 0
  hidden_dropout: float = 0.1  # embeddings, attention output, FFN output
  attention_dropout: float = 0.1  # attention probabilities

  def __post_init__(self):
    if self.model_type not in ("bert", "roberta"):
      raise ValueError(f"model_type must be 'bert' or 'roberta', got {self.model_type!r}")
    if self.hidden_act not in _ACTIVATIONS:
      raise ValueError(f"hidden_act {self.hidden_act!r} not supported; one of {sorted(_ACTIVATIONS)}")
    if self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any]) -> BertConfig:
    """Builds the config from a transformers config.json dict (BertConfig / RobertaConfig)."""
    model_type = d.get("model_type", "bert")
    if model_type in _ROBERTA_TYPES:
      model_type = "roberta"
    elif model_type != "bert":
      raise ValueError(f"unsupported model_type {model_type!r}: only BERT- and RoBERTa-style encoders")
    pos_type = d.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
      raise ValueError(f"position_embedding_type {pos_type!r} not supported (only 'absolute')")
    if d.get("is_decoder") or d.get("add_cross_attention"):
      raise ValueError("decoder / cross-attention BERT configs are not supported")
    pad = d.get("pad_token_id")
    return cls(
      vocab_size=d["vocab_size"],
      hidden_size=d["hidden_size"],
      num_layers=d["num_hidden_layers"],
      num_heads=d["num_attention_heads"],
      intermediate_size=d["intermediate_size"],
      max_position_embeddings=d.get("max_position_embeddings", 512),
      type_vocab_size=d.get("type_vocab_size", 2),
      layer_norm_eps=d.get("layer_norm_eps", 1e-12),
      hidden_act=d.get("hidden_act", "gelu"),
      model_type=model_type,
      pad_token_id=(1 if model_type == "roberta" else 0) if pad is None else pad,
      hidden_dropout=d.get("hidden_dropout_prob", 0.1),
      attention_dropout=d.get("attention_probs_dropout_prob", 0.1),
    )


def dropout16(module: nnx.Dropout, x: jax.Array) -> jax.Array:
  """`module(x)` (same rate, RNG stream and train/eval switch) with 16-bit uniforms: one threefry word
  gives two draws, which halves the RNG work (the attention-probability masks are most of a train step's
  random numbers: 26% of a MiniLM step at B4xL512 on CPU). Drop probability round(rate * 2^16) / 2^16
  (0.1 -> 0.100006); kept values are scaled by 1 / (1 - rate), as in nnx.Dropout."""
  rate = float(module.rate)
  if module.deterministic or rate == 0.0:
    return x
  if rate == 1.0:
    return jnp.zeros_like(x)
  n = x.size
  words = jax.random.bits(module.rngs(), ((n + 1) // 2,), jnp.uint32)
  u16 = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)
  u16 = (u16 if 2 * words.shape[0] == n else u16[:n]).reshape(x.shape)
  keep = u16 >= jnp.uint16(min(round(rate * 65536), 65535))
  return jax.lax.select(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros_like(x))


def _layer_norm(cfg: BertConfig, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
  # Two-pass variance (like torch), statistics in f32 even when dtype is bf16.
  return nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, use_fast_variance=False,
                       dtype=dtype, param_dtype=param_dtype, rngs=rngs)


class BertLayer(nnx.Module):
  """One post-LN Transformer layer."""

  def __init__(self, cfg: BertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    init = nnx.initializers.normal(0.02)
    dense = lambda i, o: linear(i, o, dtype=dtype, param_dtype=param_dtype, kernel_init=init, rngs=rngs)
    D, F = cfg.hidden_size, cfg.intermediate_size
    self.num_heads = cfg.num_heads
    self.query, self.key, self.value = dense(D, D), dense(D, D), dense(D, D)
    self.attention_out = dense(D, D)
    self.attention_norm = _layer_norm(cfg, dtype, param_dtype, rngs)
    self.intermediate = dense(D, F)
    self.output = dense(F, D)
    self.output_norm = _layer_norm(cfg, dtype, param_dtype, rngs)
    self.act = _ACTIVATIONS[cfg.hidden_act]
    self.attention_dropout = nnx.Dropout(cfg.attention_dropout, rngs=rngs)
    self.hidden_dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, x_BLD: jax.Array, mask_BL: jax.Array) -> jax.Array:
    B, L, D = x_BLD.shape
    H = self.num_heads
    q_BLHK = self.query(x_BLD).reshape(B, L, H, D // H)
    k_BLHK = self.key(x_BLD).reshape(B, L, H, D // H)
    v_BLHK = self.value(x_BLD).reshape(B, L, H, D // H)
    # Scores and softmax in f32 (also under bf16 compute); masked keys get the f32 minimum, so a
    # row with no valid key (an all-padding filler row) is uniform, never NaN.
    logits_BHLL = jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK, preferred_element_type=jnp.float32)
    logits_BHLL = logits_BHLL / np.sqrt(D // H).astype(np.float32)
    logits_BHLL = jnp.where(mask_BL[:, None, None, :], logits_BHLL, jnp.finfo(jnp.float32).min)
    probs_BHLL = jax.nn.softmax(logits_BHLL, axis=-1).astype(v_BLHK.dtype)
    probs_BHLL = dropout16(self.attention_dropout, probs_BHLL)
    ctx_BLD = jnp.einsum("bhqs,bshk->bqhk", probs_BHLL, v_BLHK).reshape(B, L, D)
    x_BLD = self.attention_norm(x_BLD + dropout16(self.hidden_dropout, self.attention_out(ctx_BLD)))
    ffn_BLD = self.output(self.act(self.intermediate(x_BLD)))
    return self.output_norm(x_BLD + dropout16(self.hidden_dropout, ffn_BLD))


class Bert(nnx.Module):
  """BERT / RoBERTa encoder: `(input_ids, attention_mask, token_type_ids) -> last_hidden_state`.

  dtype is the compute dtype (e.g. bf16 activations); param_dtype the storage dtype of parameters.
  """

  def __init__(self, config: BertConfig, *, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = config
    self.hidden_size = config.hidden_size
    self.dtype = dtype
    init = nnx.initializers.normal(0.02)
    embed = lambda n: nnx.Embed(n, config.hidden_size, dtype=dtype, param_dtype=param_dtype,
                                embedding_init=init, rngs=rngs)
    self.word_embeddings = embed(config.vocab_size)
    self.position_embeddings = embed(config.max_position_embeddings)
    self.token_type_embeddings = embed(config.type_vocab_size)
    self.embeddings_norm = _layer_norm(config, dtype, param_dtype, rngs)
    self.embeddings_dropout = nnx.Dropout(config.hidden_dropout, rngs=rngs)
    self.layers = nnx.List([BertLayer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
                            for _ in range(config.num_layers)])

  def position_ids(self, input_ids_BL: jax.Array) -> jax.Array:
    """0..L-1 for BERT; for RoBERTa cumsum(non-pad) + pad id on real tokens, pad id on padding."""
    B, L = input_ids_BL.shape
    offset = self.config.pad_token_id + 1 if self.config.model_type == "roberta" else 0
    if L + offset > self.config.max_position_embeddings:
      raise ValueError(f"sequence length {L} exceeds the {self.config.max_position_embeddings - offset} "
                       "positions this encoder was trained with")
    if self.config.model_type == "roberta":
      pad = self.config.pad_token_id
      real_BL = (input_ids_BL != pad).astype(jnp.int32)
      return jnp.cumsum(real_BL, axis=1) * real_BL + pad
    return jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None) -> jax.Array:
    """input_ids, attention_mask (1 = real token), token_type_ids: int [B, L] -> [B, L, D]."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    x_BLD = (self.word_embeddings(input_ids)
             + self.position_embeddings(self.position_ids(input_ids))
             + self.token_type_embeddings(token_type_ids))
    x_BLD = dropout16(self.embeddings_dropout, self.embeddings_norm(x_BLD))
    mask_BL = attention_mask.astype(bool)
    for layer in self.layers:
      x_BLD = layer(x_BLD, mask_BL)
    return x_BLD


# ----------------------------------------------------------------------------------------------
# Loading transformers checkpoints.

_EMBED_NAMES = {
  "embeddings.word_embeddings.weight": ("word_embeddings", "embedding"),
  "embeddings.position_embeddings.weight": ("position_embeddings", "embedding"),
  "embeddings.token_type_embeddings.weight": ("token_type_embeddings", "embedding"),
  "embeddings.LayerNorm.weight": ("embeddings_norm", "scale"),
  "embeddings.LayerNorm.bias": ("embeddings_norm", "bias"),
}
_LAYER_NAMES = {
  "attention.self.query": "query",
  "attention.self.key": "key",
  "attention.self.value": "value",
  "attention.output.dense": "attention_out",
  "attention.output.LayerNorm": "attention_norm",
  "intermediate.dense": "intermediate",
  "output.dense": "output",
  "output.LayerNorm": "output_norm",
}
_LAYER_RE = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)")
_NOT_WEIGHTS = ("embeddings.position_ids",)  # buffers some checkpoints carry


def _hf_name_to_path(name: str) -> tuple[tuple[Any, ...], bool] | None:
  """HF weight name (prefix stripped) -> (nnx param path, transpose?) or None if not ours."""
  name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
  if name in _EMBED_NAMES:
    return _EMBED_NAMES[name], False
  m = _LAYER_RE.fullmatch(name)
  if m is None or m.group(2) not in _LAYER_NAMES:
    return None
  layer, module, kind = int(m.group(1)), _LAYER_NAMES[m.group(2)], m.group(3)
  if module.endswith("norm"):
    return ("layers", layer, module, "scale" if kind == "weight" else "bias"), False
  # torch Linear weight is [out, in]; nnx kernel is [in, out].
  return ("layers", layer, module, "kernel" if kind == "weight" else "bias"), kind == "weight"


def _path_to_hf_name(path: tuple[Any, ...]) -> str:
  for hf, p in _EMBED_NAMES.items():
    if p == path:
      return hf
  _, layer, module, leaf = path
  hf_module = {v: k for k, v in _LAYER_NAMES.items()}[module]
  return f"encoder.layer.{layer}.{hf_module}.{'weight' if leaf in ('kernel', 'scale') else 'bias'}"


def _strip_prefix(name: str) -> str:
  for prefix in ("bert.", "roberta.", "model."):
    if name.startswith(prefix):
      return name[len(prefix):]
  return name


def load_weights(model: Bert, weights: dict[str, np.ndarray]) -> None:
  """Copies HF-named weights (with or without `bert.`/`roberta.` prefix) into `model` in place.

  Raises ValueError listing missing encoder weights or shape mismatches; logs ignored extras once.
  """
  params = {path: var for path, var in nnx.iter_graph(model) if isinstance(var, nnx.Param)}
  loaded, extras, bad_shapes = set(), [], []
  for name, array in weights.items():
    mapped = _hf_name_to_path(_strip_prefix(name))
    if mapped is None or mapped[0] not in params:
      if _strip_prefix(name) not in _NOT_WEIGHTS:
        extras.append(name)
      continue
    path, transpose = mapped
    if transpose:
      array = array.T
    var = params[path]
    if tuple(array.shape) != tuple(var.value.shape):
      bad_shapes.append(f"{name}: checkpoint {tuple(array.shape)} vs model {tuple(var.value.shape)}")
      continue
    var.value = jnp.asarray(array, dtype=var.value.dtype)
    loaded.add(path)
  if bad_shapes:
    raise ValueError("checkpoint weights do not match the config's shapes:\n  " + "\n  ".join(bad_shapes))
  missing = sorted((_path_to_hf_name(p) for p in params if p not in loaded), key=_natural_key)
  if missing:
    raise ValueError(f"checkpoint is missing {len(missing)} encoder weight(s): {', '.join(missing)}")
  if extras:
    log.info("Ignored %d checkpoint weight(s) not used by the encoder: %s",
             len(extras), ", ".join(sorted(extras, key=_natural_key)))


def _natural_key(s: str) -> list[Any]:
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def load_pretrained(path_or_name: str | os.PathLike, *, dtype=jnp.float32, overrides: dict[str, Any] | None = None
                    ) -> Bert:
  """Loads a BERT/RoBERTa checkpoint (config.json + model.safetensors) into a `Bert` in eval mode.

  `path_or_name` is a local directory, or a Hugging Face hub name resolved from the local HF cache
  (or downloaded when online). Parameters are float32; `dtype` is the compute dtype. `overrides`
  replaces `BertConfig` fields that do not change the weights (e.g. hidden_dropout).
  """
  directory = _resolve(path_or_name)
  with open(directory / "config.json") as f:
    config = dataclasses.replace(BertConfig.from_hf_dict(json.load(f)), **(overrides or {}))
  weights_file = directory / "model.safetensors"
  if not weights_file.exists():
    if (directory / "model.safetensors.index.json").exists():
      files = sorted(directory.glob("model-*.safetensors"))
    elif any((directory / n).exists() for n in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")):
      raise FileNotFoundError(
        f"{directory} has no model.safetensors, only legacy weights (pytorch_model.bin / tf / flax), which "
        "gp_jax does not unpickle. Convert once with transformers + torch:\n"
        "  from transformers import AutoModel\n"
        f"  AutoModel.from_pretrained({str(directory)!r}).save_pretrained({str(directory)!r}, "
        "safe_serialization=True)")
    else:
      raise FileNotFoundError(f"{directory} has no model.safetensors")
  else:
    files = [weights_file]
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  weights = {}
  for f in files:
    weights.update(load_file(str(f)))
  # Shapes only (no random init), then checkpoint values and fresh dropout keys.
  model = nnx.eval_shape(lambda: Bert(config, dtype=dtype, rngs=nnx.Rngs(0)))
  load_weights(model, weights)
  _init_rng_state(model, seed=0)
  model.eval()
  return model


def _init_rng_state(model: nnx.Module, *, seed: int) -> None:
  """Gives the (abstract) non-parameter variables of `model` values: a distinct key per RNG stream."""
  base = jax.random.key(seed)
  for i, (path, var) in enumerate(nnx.iter_graph(model)):
    if not isinstance(var, nnx.Variable) or isinstance(var, nnx.Param):
      continue
    value = var.value
    if not isinstance(value, jax.ShapeDtypeStruct):
      continue
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
      var.value = jax.random.fold_in(base, i)
    elif isinstance(var, nnx.RngCount):
      var.value = jnp.zeros(value.shape, value.dtype)
    else:
      raise ValueError(f"no value for non-parameter variable {path} ({type(var).__name__})")


def _resolve(path_or_name: str | os.PathLike) -> pathlib.Path:
  """Local directory as is; anything else is a hub name (HF cache first, network only if reachable)."""
  path = pathlib.Path(path_or_name).expanduser()
  if path.is_dir():
    return path
  name = str(path_or_name)
  if path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or path.exists():
    raise FileNotFoundError(f"{name!r} is not a directory")
  return _resolve_hub_name(name)


def _hub_files_cached(repo_id: str) -> pathlib.Path | None:
  from huggingface_hub import try_to_load_from_cache  # pylint: disable=g-import-not-at-top
  config = try_to_load_from_cache(repo_id, "config.json")
  weights = try_to_load_from_cache(repo_id, "model.safetensors")
  if isinstance(config, str) and isinstance(weights, str):
    return pathlib.Path(config).parent
  return None


def _hub_reachable(endpoint: str, timeout: float = 3.0) -> bool:
  """TCP probe of the hub endpoint, bounded by `timeout` including DNS resolution."""
  url = urllib.parse.urlparse(endpoint)
  host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)

  def probe():
    with socket.create_connection((host, port), timeout=timeout):
      return True

  pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  try:
    return pool.submit(probe).result(timeout=timeout)
  except Exception:  # pylint: disable=broad-except
    return False
  finally:
    pool.shutdown(wait=False)


def _resolve_hub_name(repo_id: str) -> pathlib.Path:
  hint = ("Pass a local directory holding config.json and model.safetensors (e.g. "
          "gp_jax.models.pretrained.minilm_l6_path()), or download the model on a machine with internet "
          "access and copy the directory here.")
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
    from huggingface_hub import constants  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise FileNotFoundError(f"{repo_id!r} is not a local directory and huggingface_hub is not "
                            f"installed. {hint}") from e
  if (cached := _hub_files_cached(repo_id)) is not None:
    return cached
  offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
  if offline:
    raise FileNotFoundError(f"{repo_id!r} is not a local directory nor in the HF cache, and "
                            f"HF_HUB_OFFLINE is set. {hint}")
  if not _hub_reachable(constants.ENDPOINT):
    raise FileNotFoundError(f"{repo_id!r} is not a local directory nor in the HF cache, and the hub "
                            f"({constants.ENDPOINT}) is unreachable. {hint}")
  try:
    local = huggingface_hub.snapshot_download(
      repo_id, allow_patterns=["config.json", "model.safetensors", "model.safetensors.index.json",
                               "model-*.safetensors"])
  except Exception as e:  # pylint: disable=broad-except
    raise FileNotFoundError(f"could not fetch {repo_id!r} from the hub: {e}. {hint}") from e
  return pathlib.Path(local)
