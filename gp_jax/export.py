"""Exports a trained workdir as a self-contained serving folder.

  python -m gp_jax.export --workdir=W --out=DIR [--format=stablehlo|onnx] [--platforms=cpu,cuda,tpu]
      [--hit_buffer=4096] [--threshold=X] [--batch_size=N]

--out must be writable (a gs:// --out: its bucket exists and takes a probe object, written and removed) and
--threshold a finite float32 (the folder's default threshold); both are checked before the workdir is restored, as
is a gs:// --workdir's storage (probed within $GP_JAX_GCS_PROBE_TIMEOUT_S, default 10 s) and a mistyped URL.

The workdir is restored as `gp_jax.predict.Predictor` does (config, types, tokenizer, labels, parameters from
best/); nothing is compiled but what the artifact holds (the Predictor compiles its per-bucket eval steps only
when it predicts). DIR (local or gs://) holds:

  model.jax_export  stablehlo: the serialized `jax.export.Exported` eval-mode forward of the run's task
                    (`task.export_forward`), parameters inside; symbolic batch and length ("B, L"). Inputs: the
                    tokenizer's features, attention_mask, span_mask, positions (int32 [B, L]), then the task's
                    hit-buffer inputs (int32 [0, S]: only their sizes are read, so a buffer grows without a new
                    export; the host half's `BUFFERS`), then threshold (float32 []). Outputs: the host half's
                    `OUTPUTS` (entities: count, coords [hit_buffer, 4], hit_scores, scores).
  model.onnx        onnx: span heads only; inputs without threshold, one output `scores` [B, H, L, L]
                    (hits are read on the host).
  tokenizer/        the workdir's tokenizer
  types.json        entity types, in head order
  manifest.json     inputs and outputs (names, order), task, its labels (`labels_to_json`) and options, head
                    kind, threshold, windows, the initial hit buffers (a list, one per buffer), versions

`gp_jax.serving.load_exported(dir)` reads such a folder back with jax and numpy only (no flax, orbax,
ml_collections), reaching the task's host half through `gp_jax.tasks.host(manifest["task"])`. See docs/serving.md.

Imports go one way: export -> predict (to restore a workdir) -> serving (the folder's format and reader).
`ExportError`, `ExportedModel` and `load_exported` are re-exported here from gp_jax.serving for compatibility;
import them from gp_jax.serving.
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

from gp_jax import runtime, storage, tasks
from gp_jax.errors import UserError, help_exits_zero
from gp_jax.models.heads import HEADS
from gp_jax.models.taggers import TAGGERS
from gp_jax.serving import BATCH_FIELDS, FORMAT_VERSION, MANIFEST, MODEL_FILES, ExportError, check_threshold
# Re-exported for compatibility; import them from gp_jax.serving.
from gp_jax.serving import ExportedModel, load_exported  # noqa: F401  pylint: disable=unused-import

# Deferred imports below: gp_jax.predict, which defines its CLI flags (--workdir, --batch_size, --threshold) when
# imported, so only export's CLI and `export_workdir` import it (a library import beside gp_jax.main must not); and
# jax2onnx, an optional dependency (the `onnx` extra, installed in a separate environment).

DEFAULT_HIT_BUFFER = 4096
# The precision policy of an export is resolved as for this platform wherever export runs: model.dtype=auto is
# float32 and model.attention=auto the XLA path, a graph that lowers for every platform in one artifact.
PORTABLE_POLICY = "cpu"
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export lowers for


def input_names(feature_names) -> list[str]:
  """The array inputs, in call order (the StableHLO function takes `threshold` after them)."""
  return [*feature_names, *BATCH_FIELDS]


# ----------------------------------------------------------------------------- the exported function


def _one_device(tree):
  return jax.device_put(tree, jax.devices("cpu")[0] if jax.default_backend() == "cpu" else jax.devices()[0])


def export_stablehlo(fn, *, num_arrays: int, platforms=None, max_len: int | None = None, num_buffers: int = 0):
  """`jax.export` of `fn` with symbolic (B, L) int32 arrays and a float32 threshold -> Exported. `max_len` bounds
  L (windows never exceed it), which decides the BERT encoder's position-table check. `num_buffers` int32
  [0, S_n] inputs (between the arrays and threshold) carry symbolic hit buffer sizes (the host half's BUFFERS)."""
  constraints = ("L >= 2",) + ((f"L <= {max_len}",) if max_len else ())  # lax.scan (CRF) needs L - 1 >= 1
  sizes = "".join(f", S{n}" for n in range(num_buffers))
  B, L, *S = jax.export.symbolic_shape(f"B, L{sizes}",
                                       constraints=constraints + tuple(f"S{n} >= 1" for n in range(num_buffers)))
  args = ([jax.ShapeDtypeStruct((B, L), jnp.int32)] * num_arrays + [jax.ShapeDtypeStruct((0, s), jnp.int32) for s in S]
          + [jax.ShapeDtypeStruct((), jnp.float32)])
  return jax.export.export(jax.jit(fn), platforms=platforms)(*args)


def export_onnx(fn, *, names, path: str, scores: int):
  """Span scores only (output `scores` of `fn`), through jax2onnx (symbolic B, L); threshold is not an input."""
  try:
    import jax2onnx  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ExportError("--format=onnx needs jax2onnx, which pins orbax-checkpoint<0.11.37 (below this "
                      "project's): export from a separate environment, see docs/serving.md") from e

  def scores_fn(*arrays):
    return fn(*arrays, np.float32(0.0))[scores]

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
  spec = setup.spec
  task, host = tasks.of(spec), tasks.host(spec.task)
  _check_format(fmt, task, spec.head)
  if spec.head in TAGGERS:
    hit_buffer = max(hit_buffer, spec.max_len)  # one window never overflows (see the host's run_exported)
  sizes = (int(hit_buffer),) * len(task.initial_hits(1))
  names = input_names(setup.tokenizer.feature_names)
  params, rest = _one_device(jax.device_get(params)), _one_device(setup.rest)
  fn = task.export_forward(setup.graphdef, params, rest, names=names, sizes=sizes)
  platforms = list(platforms) if platforms else [jax.default_backend()]
  manifest = _manifest(setup, host, fmt, names=names, sizes=sizes, platforms=platforms, batch_size=batch_size,
                       threshold=threshold, extra=extra)
  with tempfile.TemporaryDirectory(prefix="gp_jax_export_") as tmp:
    _write_model(fn, fmt, os.path.join(tmp, MODEL_FILES[fmt]), names=names, platforms=platforms,
                 max_len=spec.max_len, host=host)
    setup.tokenizer.save(os.path.join(tmp, "tokenizer"))
    with open(os.path.join(tmp, "types.json"), "w", encoding="utf-8") as f:
      json.dump(list(setup.types), f, ensure_ascii=False)
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1)
    storage.upload_dir(tmp, out)
  return manifest


def _check_format(fmt: str, task, head: str) -> None:
  """ExportError when `fmt` is unknown, the task refuses it, or ONNX is asked of a tagger."""
  if fmt not in MODEL_FILES:
    raise ExportError(f"--format must be one of {sorted(MODEL_FILES)}, got {fmt!r}")
  refusal = task.export_refusal(fmt)
  if refusal:
    raise ExportError(refusal)
  if fmt == "onnx" and head in TAGGERS:
    raise ExportError(f"--format=onnx exports span heads only ({', '.join(sorted(HEADS))}); the {head} head decodes "
                      "tags inside the function: use --format=stablehlo")


def _write_model(fn, fmt: str, path: str, *, names, platforms, max_len: int, host) -> None:
  if fmt == "stablehlo":
    exported = export_stablehlo(fn, num_arrays=len(names), platforms=platforms, max_len=max_len,
                                num_buffers=len(host.BUFFERS))
    with open(path, "wb") as f:
      f.write(exported.serialize())
  else:
    export_onnx(fn, names=names, path=path, scores=host.OUTPUTS.index("scores"))


def _manifest(setup, host, fmt: str, *, names, sizes, platforms, batch_size: int, threshold, extra) -> dict:
  spec = setup.spec
  is_tagger = spec.head in TAGGERS
  int_input = lambda n: {"name": n, "dtype": "int32", "shape": ["B", "L"]}  # noqa: E731
  return {
      "format_version": FORMAT_VERSION,
      "format": fmt,
      "file": MODEL_FILES[fmt],
      "platforms": platforms if fmt == "stablehlo" else None,
      "inputs": [int_input(n) for n in names]
                + [{"name": n, "dtype": "int32", "shape": [0, f"S{i}"]} for i, n in enumerate(host.BUFFERS)]
                + ([{"name": "threshold", "dtype": "float32", "shape": []}] if fmt == "stablehlo" else []),
      "outputs": list(host.OUTPUTS) if fmt == "stablehlo" else ["scores"],
      "min_length": 2,  # L >= 2 (ExportedModel pads shorter batches)
      "task": spec.task,
      "labels": host.labels_to_json(setup.labels),
      "task_options": json.loads(json.dumps(dict(spec.task_options))),  # as read back (tuples: lists)
      "head": spec.head,
      "tagger": is_tagger,
      "tag_scheme": spec.tag_scheme if is_tagger else None,
      "threshold": None if is_tagger else float(threshold or 0.0),  # the default; callers may pass another
      "num_types": len(setup.types),
      "max_len": spec.max_len,
      "stride": spec.stride,
      "max_span_width": spec.max_span_width,
      "buckets": [int(b) for b in spec.buckets],
      "batch_size": int(batch_size or spec.eval_batch_size),
      "hit_buffers": list(sizes),  # the initial buffers, one per hit buffer of the task
      **(extra or {}),
      "gp_jax_version": _version(),
      "git_commit": _git_commit(),
      "jax_version": jax.__version__,
  }


# ----------------------------------------------------------------------------- CLI


SHARED_FLAGS = ("workdir", "batch_size", "threshold")  # defined by gp_jax.predict, read by export too


def _define_flags():
  from gp_jax import predict  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (its flags)

  for name in SHARED_FLAGS:  # key flags of this module too, so that --help lists them
    flags.declare_key_flag(name)
  flags.DEFINE_string("out", None, "Folder to write, local or gs://.")
  flags.DEFINE_enum("format", "stablehlo", sorted(MODEL_FILES), "Serialized artifact format.")
  flags.DEFINE_list("platforms", [], f"StableHLO lowering platforms ({', '.join(PLATFORMS)}); default: this "
                    "machine's.")
  flags.register_validator("platforms", lambda names: set(names) <= set(PLATFORMS),
                           f"--platforms takes a comma list of {', '.join(PLATFORMS)}")
  flags.DEFINE_integer("hit_buffer", DEFAULT_HIT_BUFFER, "Hits one call returns on device, per hit buffer (more "
                       "fall back to the scores output, or grow the buffer where the task's program takes its size).",
                       lower_bound=1)
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
    for flag in ("workdir", "out"):
      storage.check_path(getattr(flags_, flag), flag=flag)
    storage.check_bucket(flags_.workdir, flag="workdir")  # gs://: storage answers, the bucket exists
    storage.check_bucket(flags_.out, flag="out", write=True)  # ... and takes a write
    if not (storage.path(flags_.workdir) / "config.json").exists():
      raise ExportError(f"{flags_.workdir}: not a training workdir (no config.json)")
    out = storage.path(flags_.out)
    if out.exists() and not out.is_dir():
      raise ExportError(f"--out={flags_.out} is a file: give a folder (it is created, or its files overwritten)")
    if not storage.is_url(flags_.out):  # before the model loads: a folder that cannot be written stops here
      predict.check_writable(flags_.out, flag="out", value=flags_.out)
    check_threshold(flags_.threshold)  # a finite float32: the manifest's default is compared in the program
    predict.configure_compilation_cache(flags_.workdir)  # as training set it
    manifest = export_workdir(flags_.workdir, flags_.out, fmt=flags_.format, platforms=flags_.platforms or None,
                              hit_buffer=flags_.hit_buffer, batch_size=flags_.batch_size,
                              threshold=flags_.threshold)
  except (ExportError, UserError) as e:
    print(f"gp_jax.export: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"Exported {manifest['head']} head (step {manifest['step']}) as {manifest['format']} to {flags_.out}")


if __name__ == "__main__":
  _FLAGS = _define_flags()
  app.run(lambda argv: main(argv, _FLAGS), flags_parser=help_exits_zero(app.parse_flags_with_usage))
