"""Exports a trained workdir as a self-contained serving folder.

  python -m gp_jax.export --workdir=W --out=DIR [--format=stablehlo|onnx] [--platforms=cpu,cuda,tpu]
      [--hit_buffer=4096]

The workdir is restored as `gp_jax.predict.Predictor` does (config, types, tokenizer, parameters from
best/); nothing is compiled but what the artifact holds (the Predictor compiles its per-bucket eval steps only
when it predicts). DIR (local or gs://) holds:

  model.jax_export  stablehlo: the serialized `jax.export.Exported` eval-mode forward, parameters inside;
                    symbolic batch and length ("B, L"). Inputs: the tokenizer's features, attention_mask,
                    span_mask, positions (int32 [B, L]), threshold (float32 []). Outputs: count (int32 []),
                    coords (int32 [hit_buffer, 4] as (row, type, start, end)), hit_scores (float32
                    [hit_buffer]), scores (span heads: float32 [B, H, L, L]; taggers: emissions [B, L, T]).
  model.onnx        onnx: span heads only; inputs without threshold, one output `scores` [B, H, L, L]
                    (hits are read on the host).
  tokenizer/        the workdir's tokenizer
  types.json        entity types, in head order
  manifest.json     inputs and outputs (names, order), task, head kind, threshold, windows, hit buffer, versions

A task=relations workdir (GPLinker) exports to StableHLO only, decoding on the device as its eval step does: the
inputs above, then entity_buffer, head_buffer, tail_buffer (int32 [0, size]: only their sizes are read, so a
buffer grows without a new export), then threshold; outputs the three pointers' (count, coords [size, 4],
scores [size]) as `ops.relation_hits` gives them, no [B, 2R + 2, L, L] scores. The manifest adds the relation types
and the initial `hit_buffers`.

`gp_jax.serving.load_exported(dir)` reads such a folder back with jax and numpy only (no flax, orbax,
ml_collections): a callable over a batch dict that returns hits. See docs/serving.md.

Imports go one way: export -> predict (to restore a workdir) -> serving (the folder's format and reader).
`ExportError`, `ExportedModel`, `host_span_hits` and `load_exported` are re-exported here from gp_jax.serving
for compatibility; import them from gp_jax.serving.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from gp_jax import runtime, storage
from gp_jax.errors import UserError, help_exits_zero
from gp_jax.models.heads import HEADS
from gp_jax.models.taggers import TAGGERS
from gp_jax.serving import (BATCH_FIELDS, FORMAT_VERSION, MANIFEST, MODEL_FILES, OUTPUTS, RELATION_BUFFERS,
                             RELATION_OUTPUTS, ExportError)
# Re-exported for compatibility; import them from gp_jax.serving.
from gp_jax.serving import ExportedModel, host_span_hits, load_exported  # noqa: F401  pylint: disable=unused-import

# Deferred imports below: gp_jax.predict, which defines its CLI flags (--workdir, --batch_size, --threshold) when
# imported, so only export's CLI and `export_workdir` import it (a library import beside gp_jax.main must not); and
# jax2onnx, an optional dependency (the `onnx` extra, installed in a separate environment).

DEFAULT_HIT_BUFFER = 4096
# The precision policy of an export is resolved as for this platform wherever export runs: model.dtype=auto is
# float32 and model.attention=auto the XLA path, a graph that lowers for every platform in one artifact.
PORTABLE_POLICY = "cpu"


def input_names(feature_names) -> list[str]:
  """The array inputs, in call order (the StableHLO function takes `threshold` after them)."""
  return [*feature_names, *BATCH_FIELDS]


# ----------------------------------------------------------------------------- the exported function


def model_outputs(model, batch, *, threshold, size: int):
  """Eval-mode model -> (count, coords [size, 4] (row, type, start, end), hit_scores [size], scores).

  scores: span heads' logits [B, H, L, L] (masked cells hold the dtype's min); taggers' emissions
  [B, L, T]. Hits are `ops.gather_hits`' (count may exceed size: the caller falls back)."""
  hidden_BLD = model.encode(batch)
  head = model.head
  count, coords, hit_scores = head.decode_hits(hidden_BLD, batch["span_mask"], positions=batch["positions"],
                                               size=size, threshold=threshold)
  scores = head(hidden_BLD, batch["span_mask"], positions=batch["positions"])
  return count, coords, hit_scores, scores


def forward_fn(graphdef, params, rest, *, names, size: int):
  """`(*arrays in names order, threshold) -> model_outputs(...)`, parameters closed over."""
  def fn(*args):
    *arrays, threshold = args
    model = nnx.merge(graphdef, nnx.State(params), rest)
    model.eval()
    return model_outputs(model, dict(zip(names, arrays)), threshold=threshold, size=size)

  return fn


def relation_forward_fn(graphdef, params, rest, *, names):
  """task=relations: `(*arrays in names order, entity_buffer, head_buffer, tail_buffer, threshold) ->` the three
  pointers' hits flattened in `RELATION_OUTPUTS` order, decoded as the eval step decodes (`model.decode_hits`), in
  buffers as long as the buffer inputs' second axis; parameters closed over."""
  def fn(*args):
    *arrays, entity_buffer, head_buffer, tail_buffer, threshold = args
    model = nnx.merge(graphdef, nnx.State(params), rest)
    model.eval()
    sizes = (entity_buffer.shape[1], head_buffer.shape[1], tail_buffer.shape[1])
    hits = model.decode_hits(dict(zip(names, arrays)), size=sizes, threshold=threshold)
    return tuple(x for pointer in hits for x in pointer)

  return fn


def _one_device(tree):
  return jax.device_put(tree, jax.devices("cpu")[0] if jax.default_backend() == "cpu" else jax.devices()[0])


def export_stablehlo(fn, *, num_arrays: int, platforms=None, max_len: int | None = None, num_buffers: int = 0):
  """`jax.export` of `fn` with symbolic (B, L) int32 arrays and a float32 threshold -> Exported. `max_len` bounds
  L (windows never exceed it), which decides the BERT encoder's position-table check. `num_buffers` int32
  [0, S_n] inputs (between the arrays and threshold) carry symbolic hit buffer sizes (task=relations)."""
  constraints = ("L >= 2",) + ((f"L <= {max_len}",) if max_len else ())  # lax.scan (CRF) needs L - 1 >= 1
  sizes = "".join(f", S{n}" for n in range(num_buffers))
  B, L, *S = jax.export.symbolic_shape(f"B, L{sizes}",
                                       constraints=constraints + tuple(f"S{n} >= 1" for n in range(num_buffers)))
  args = ([jax.ShapeDtypeStruct((B, L), jnp.int32)] * num_arrays + [jax.ShapeDtypeStruct((0, s), jnp.int32) for s in S]
          + [jax.ShapeDtypeStruct((), jnp.float32)])
  return jax.export.export(jax.jit(fn), platforms=platforms)(*args)


def export_onnx(fn, *, names, path: str):
  """Span scores only, through jax2onnx (symbolic B, L); threshold is not an input."""
  try:
    import jax2onnx  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ExportError("--format=onnx needs jax2onnx, which pins orbax-checkpoint<0.11.37 (below this "
                      "project's): export from a separate environment, see docs/serving.md") from e

  def scores_fn(*arrays):
    return fn(*arrays, np.float32(0.0))[3]

  spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("B, L", constraints=("L >= 2",)), np.int32)
  jax2onnx.to_onnx(scores_fn, [spec] * len(names), input_names=list(names), output_names=["scores"],
                   return_mode="file", output_path=path)


def _git_commit() -> str | None:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  if head.returncode:
    return None
  return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _version() -> str | None:
  try:
    return importlib.metadata.version("gp_jax")
  except importlib.metadata.PackageNotFoundError:
    return None


def export_workdir(workdir, out, *, fmt: str = "stablehlo", platforms=None, hit_buffer: int = DEFAULT_HIT_BUFFER,
                   batch_size: int = 0, threshold: float | None = None) -> dict:
  """Restores `workdir` (as predict does) and writes the serving folder `out`; returns the manifest. `threshold`:
  the folder's default (None: the workdir's dev-tuned one, else 0)."""
  from gp_jax import predict  # pylint: disable=g-import-not-at-top

  try:
    p = predict.Predictor(workdir, threshold=threshold, platform=PORTABLE_POLICY, attention="xla")
  except UserError as e:
    raise ExportError(str(e)) from None
  return export_model(p.setup, p.params, out, fmt=fmt, platforms=platforms, hit_buffer=hit_buffer,
                      batch_size=batch_size, threshold=p.threshold,
                      extra={"step": int(p.step), "source_workdir": os.fspath(workdir),
                             "compute_dtype": p.setup.spec.precision.dtype})


def export_model(setup, params, out, *, fmt: str = "stablehlo", platforms=None,
                 hit_buffer: int = DEFAULT_HIT_BUFFER, batch_size: int = 0, threshold: float | None = None,
                 extra: dict | None = None) -> dict:
  """Writes the serving folder `out` for a `state.Setup` and its parameters; returns the manifest."""
  if fmt not in MODEL_FILES:
    raise ExportError(f"--format must be one of {sorted(MODEL_FILES)}, got {fmt!r}")
  spec, tokenizer, types = setup.spec, setup.tokenizer, setup.types
  relations = spec.task == "relations"  # GPLinker: three hit buffers of input-given sizes, no scores output
  head = spec.head
  is_tagger = head in TAGGERS
  if fmt == "onnx" and relations:
    raise ExportError("--format=onnx exports entity span heads only; a task=relations model decodes its three "
                      "pointers inside the function: use --format=stablehlo")
  if fmt == "onnx" and is_tagger:
    raise ExportError(f"--format=onnx exports span heads only ({', '.join(sorted(HEADS))}); the {head} head decodes "
                      "tags inside the function: use --format=stablehlo")
  if is_tagger:
    hit_buffer = max(hit_buffer, spec.max_len)  # one window never overflows (see ExportedModel)
  names = input_names(tokenizer.feature_names)
  params, rest = _one_device(jax.device_get(params)), _one_device(setup.rest)
  if relations:
    fn = relation_forward_fn(setup.graphdef, params, rest, names=names)
  else:
    fn = forward_fn(setup.graphdef, params, rest, names=names, size=hit_buffer)
  platforms = list(platforms) if platforms else [jax.default_backend()]
  buffers = RELATION_BUFFERS if relations else ()

  with tempfile.TemporaryDirectory(prefix="gp_jax_export_") as tmp:
    model_path = os.path.join(tmp, MODEL_FILES[fmt])
    if fmt == "stablehlo":
      exported = export_stablehlo(fn, num_arrays=len(names), platforms=platforms, max_len=spec.max_len,
                                  num_buffers=len(buffers))
      with open(model_path, "wb") as f:
        f.write(exported.serialize())
    else:
      export_onnx(fn, names=names, path=model_path)
    tokenizer.save(os.path.join(tmp, "tokenizer"))
    with open(os.path.join(tmp, "types.json"), "w", encoding="utf-8") as f:
      json.dump(list(types), f, ensure_ascii=False)
    int_input = lambda n: {"name": n, "dtype": "int32", "shape": ["B", "L"]}  # noqa: E731
    manifest = {
        "format_version": FORMAT_VERSION,
        "format": fmt,
        "file": MODEL_FILES[fmt],
        "platforms": platforms if fmt == "stablehlo" else None,
        "inputs": [int_input(n) for n in names]
                  + [{"name": n, "dtype": "int32", "shape": [0, f"S{i}"]} for i, n in enumerate(buffers)]
                  + ([{"name": "threshold", "dtype": "float32", "shape": []}] if fmt == "stablehlo" else []),
        "outputs": (list(RELATION_OUTPUTS) if relations else list(OUTPUTS)) if fmt == "stablehlo" else ["scores"],
        "min_length": 2,  # L >= 2 (ExportedModel pads shorter batches)
        "task": spec.task,
        "relation_types": list(setup.relation_types) if relations else None,
        "head": head,
        "tagger": is_tagger,
        "tag_scheme": spec.tag_scheme if is_tagger else None,
        "threshold": None if is_tagger else float(threshold or 0.0),  # the default; callers may pass another
        "num_types": len(types),
        "max_len": spec.max_len,
        "stride": spec.stride,
        "max_span_width": spec.max_span_width,
        "buckets": [int(b) for b in spec.buckets],
        "batch_size": int(batch_size or spec.eval_batch_size),
        "hit_buffer": int(hit_buffer) if fmt == "stablehlo" and not relations else None,
        "hit_buffers": [int(hit_buffer)] * len(buffers) if relations else None,  # initial (entity, head, tail)
        **(extra or {}),
        "gp_jax_version": _version(),
        "git_commit": _git_commit(),
        "jax_version": jax.__version__,
    }
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1)
    storage.upload_dir(tmp, out)
  return manifest


# ----------------------------------------------------------------------------- CLI


SHARED_FLAGS = ("workdir", "batch_size", "threshold")  # defined by gp_jax.predict, read by export too


def _define_flags():
  from gp_jax import predict  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (its flags)

  for name in SHARED_FLAGS:  # key flags of this module too, so that --help lists them
    flags.declare_key_flag(name)
  flags.DEFINE_string("out", None, "Folder to write, local or gs://.")
  flags.DEFINE_enum("format", "stablehlo", sorted(MODEL_FILES), "Serialized artifact format.")
  flags.DEFINE_list("platforms", [], "StableHLO lowering platforms (cpu, cuda, tpu); default: this machine's.")
  flags.DEFINE_integer("hit_buffer", DEFAULT_HIT_BUFFER, "Hits one call returns on device (more fall back to "
                       "the scores output; task=relations: each pointer's initial buffer, grown when exceeded).")
  return flags.FLAGS


def main(argv, flags_):
  if len(argv) > 1:
    print(f"gp_jax.export: unexpected arguments {argv[1:]}", file=sys.stderr)
    sys.exit(2)
  runtime.configure()  # process settings before jax starts a backend, as gp_jax.main and gp_jax.predict
  from gp_jax import predict  # pylint: disable=g-import-not-at-top  (imported by _define_flags already)

  try:
    if not flags_.workdir or not flags_.out:
      raise ExportError("--workdir and --out are required")
    if not (storage.path(flags_.workdir) / "config.json").exists():
      raise ExportError(f"{flags_.workdir}: not a training workdir (no config.json)")
    predict.configure_compilation_cache(flags_.workdir)  # as training set it
    manifest = export_workdir(flags_.workdir, flags_.out, fmt=flags_.format, platforms=flags_.platforms or None,
                              hit_buffer=flags_.hit_buffer, batch_size=flags_.batch_size,
                              threshold=flags_.threshold)
  except ExportError as e:
    print(f"gp_jax.export: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"Exported {manifest['head']} head (step {manifest['step']}) as {manifest['format']} to {flags_.out}")


if __name__ == "__main__":
  _FLAGS = _define_flags()
  app.run(lambda argv: main(argv, _FLAGS), flags_parser=help_exits_zero(app.parse_flags_with_usage))
