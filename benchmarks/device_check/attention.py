"""Stage attention: cuDNN's fused dropout read off exactly (drop rate, masks across steps and layers), then cuDNN
and XLA attention in bf16 against an f32 XLA reference, values and gradients."""

from __future__ import annotations

import traceback

import numpy as np

from benchmarks.device_check.base import Recorder, cudnn_reason, rel_err, skipped

# Deferred imports below: jax and gp_jax.ops, in the stage's child only.


def _attention_inputs(B, L, H, K, seed):
  rng = np.random.default_rng(seed)
  q, k, v, g = (rng.standard_normal((B, L, H, K)).astype(np.float32) for _ in range(4))
  lengths = rng.integers(1, L + 1, size=B)
  lengths[0], lengths[-1] = L, 0  # one full row, one all-padding row
  mask = np.arange(L)[None, :] < lengths[:, None]
  return q, k, v, g, lengths, mask


def _attention_grads(fn, q, k, v, g):
  """(output, (dq, dk, dv)) of `fn` with cotangent g, from one compiled program."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def loss(q, k, v):
    out = fn(q, k, v)
    return jnp.sum(out.astype(jnp.float32) * g), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return jax.device_get((out, grads))


def stage_attention(rec: Recorder, ctx: dict) -> None:
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from gp_jax.ops import attention as attention_lib  # pylint: disable=g-import-not-at-top

  s = ctx["shapes"]["attn"]
  no_cudnn = cudnn_reason()
  if no_cudnn is not None:
    rec.set("dropout", skipped(no_cudnn))
  else:  # first: it decides whether training may use cuDNN's fused dropout
    try:
      rec.set("dropout", cudnn_dropout_probe(ctx["shapes"]["probe_L"]))
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      rec.set("dropout", {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:400]}"})
  for L in s["lengths"]:
    q, k, v, g, lengths, mask = _attention_inputs(s["B"], L, s["heads"], s["head_dim"], seed=L)
    # No cotangent on padding queries: the model's loss never reads them (XLA's padding queries attend to the real
    # keys, cuDNN's output 0, so their cotangent would move dk and dv apart for no reason the model sees).
    g = g * mask[:, :, None, None]
    mask_j = jnp.asarray(mask)
    impls = {"xla_f32": (attention_lib.xla_attention, jnp.float32), "xla_bf16": (attention_lib.xla_attention,
                                                                                   jnp.bfloat16)}
    if no_cudnn is None:
      impls["cudnn_bf16"] = (attention_lib.cudnn_attention, jnp.bfloat16)
    results, errors = {}, {}
    for name, (fn, dtype) in impls.items():
      cast = lambda x, dtype=dtype: jnp.asarray(x, dtype)  # noqa: E731
      try:
        results[name] = _attention_grads(lambda q, k, v, fn=fn: fn(q, k, v, mask_BL=mask_j), cast(q), cast(k),
                                         cast(v), jnp.asarray(g))
      except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc()
        errors[name] = {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    valid_q = mask[:, :, None, None] & (lengths > 0)[:, None, None, None]  # query rows of non-empty examples
    ref_out, ref_grads = results["xla_f32"]
    row = {"B": s["B"], "L": L, "heads": s["heads"], "head_dim": s["head_dim"], "lengths": lengths.tolist()}
    row.update(errors)
    for name in results:
      if name == "xla_f32":
        continue
      out, grads = results[name]
      pick = lambda x: np.asarray(x, np.float32)[np.broadcast_to(valid_q, x.shape)]  # noqa: E731
      row[name] = {
          "finite": bool(np.isfinite(np.asarray(out, np.float32)).all()
                         and all(np.isfinite(np.asarray(x, np.float32)).all() for x in grads)),
          "out_rel_err": rel_err(pick(out), pick(ref_out)),
          **{f"d{n}_rel_err": rel_err(pick(gr), pick(rg)) for n, gr, rg in zip("qkv", grads, ref_grads)}}
    if no_cudnn is not None:
      row["cudnn_bf16"] = skipped(no_cudnn)
    rec.update("compare", f"L{L}", row)
  rec.set("compare_note", "relative L2 error against XLA attention in f32 on the query rows of non-empty examples "
                          "(dk, dv: the same rows' positions; no cotangent on padding queries, which the model "
                          "never reads); finite: outputs and gradients, all rows included")


def cudnn_dropout_probe(L: int, rate: float = 0.1) -> dict:
  """Reads cuDNN's dropout masks exactly: with v one-hot over key positions (head dim = L) the output row of query q
  is its kept, rescaled probabilities. Two calls of one program (two steps), and two layers in one program (the same
  static seed, then distinct seeds)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from gp_jax.ops import attention as attention_lib  # pylint: disable=g-import-not-at-top

  B, H = 2, 2
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((B, L, H, L)) * 0.5, jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((B, L, H, L)) * 0.5, jnp.bfloat16)
  v = jnp.asarray(np.broadcast_to(np.eye(L)[None, :, None, :], (B, L, H, L)), jnp.bfloat16)
  mask = jnp.ones((B, L), bool)
  drop = lambda q, k, v, seed: attention_lib.cudnn_attention(q, k, v, mask_BL=mask, dropout_rate=rate,  # noqa: E731
                                                             seed=seed)
  step = jax.jit(lambda q, k, v: drop(q, k, v, 0))
  kept_1, kept_2 = (np.asarray(step(q, k, v), np.float32) != 0 for _ in range(2))
  same_seed = jax.jit(lambda q, k, v: (drop(q, k, v, 0), drop(q, k, v, 0)))(q, k, v)
  two_seeds = jax.jit(lambda q, k, v: (drop(q, k, v, 0), drop(q, k, v, 1)))(q, k, v)
  differ = lambda pair: bool((np.asarray(pair[0], np.float32) != np.asarray(pair[1], np.float32)).any())  # noqa: E731
  probs = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q.astype(jnp.float32), k.astype(jnp.float32)) / np.sqrt(L),
                         axis=-1)
  out = np.asarray(step(q, k, v), np.float32)
  kept = out != 0
  expected = np.swapaxes(np.asarray(probs), 1, 2) / (1 - rate)  # [B, q, H, s]
  result = {
      "rate": rate, "L": L, "drop_fraction": float(1 - kept_1.mean()),
      "steps_differ": bool((kept_1 != kept_2).any()),
      "layers_differ_same_seed": differ(same_seed), "layers_differ_distinct_seeds": differ(two_seeds),
      "kept_values_rel_err": rel_err(out[kept], expected[kept]),
  }
  result["usable_in_training"] = bool(result["steps_differ"] and result["layers_differ_distinct_seeds"]
                                      and abs(result["drop_fraction"] - rate) < 0.03)
  result["status"] = "ok"
  return result
