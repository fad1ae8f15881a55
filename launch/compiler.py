"""Builds and compiles the points of a sweep for one slice (`launch.compile`), as the trainer builds its steps there.

Everything is abstract (`ShapeDtypeStruct`): no parameter or batch is allocated. Points that build the same config
are built once, and steps that lower to the same program are compiled once; a point's programs compile together
(`aot.compile_all`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import traceback
from typing import Any

import jax
from etils import epath
from huggingface_hub import hf_hub_download

from gp_jax import aot, feed, tasks
from gp_jax import sharding as shd
from gp_jax import steps as steps_lib
from gp_jax.data import batching, corpora, sources
from gp_jax.errors import UserError
from gp_jax.models import locate
from gp_jax.ops import pallas_zlpr
from gp_jax.optim import make_optimizer

from .accelerators import GIB, Slice, topology_devices
from .failures import failure
from .points import NUM_TYPES, SCRATCH_VOCAB, STEPS, Point, program_key

TRITON_TILING = "Couldn't find output tile sizes"  # XLA:GPU, no autotuning: a GEMM fusion no Triton tiling fits
TOTAL_STEPS = 10_000  # the schedule's length only sets constants in the step


# ----------------------------------------------------------------------------- stand-ins for what is not here


def encoder_config_json(pretrained: str) -> dict:
  """A pretrained encoder's config.json and nothing else: a folder (config.json alone is enough), gs://, minilm, or
  a hub id (the HF cache, else that one file is downloaded)."""
  kind, arg = locate.parse_name(pretrained)
  if kind == "hub":
    path = hf_hub_download(arg[0], "config.json", revision=arg[1])
  elif kind == "minilm":
    path = locate.minilm_l6_path() / "config.json"
  elif kind == "url":
    return json.loads((epath.Path(arg) / "config.json").read_text())
  else:
    path = arg / "config.json"
  with open(path) as f:
    return json.load(f)


def entity_types(config, num_types: int) -> tuple[list[str], str]:
  """(types, where they came from): the corpus's own, else `num_types` stand-ins."""
  name = config.data.name
  if name in sources.SYNTHETIC_CORPORA:
    return list(sources.SYNTHETIC_CORPORA[name][1]), name
  if name in corpora.NAMES:
    return list(corpora.corpus_types(name)), name
  return [f"T{i}" for i in range(num_types)], f"stand-in for {name} files (--num_types)"


def stand_ins(config, *, scratch_vocab: int):
  """(tokenizer stand-in, encoder config.json or None, note)."""
  if config.model.encoder == "bert":
    hf = encoder_config_json(config.model.pretrained)
    note = (f"encoder {config.model.pretrained} (config.json: {hf.get('num_hidden_layers')} layers, width "
            f"{hf.get('hidden_size')}, vocabulary {hf.get('vocab_size')})")
    return aot.bert_tokenizer(hf), hf, note
  bigrams = int(config.tokenizer.max_bigrams or 50_000) + 2 if config.model.bigram_dim else 0
  note = (f"scratch encoder, vocabulary {scratch_vocab} chars (stand-in, --scratch_vocab) and {bigrams} bigrams "
          "(tokenizer.max_bigrams + [PAD], [UNK])")
  return aot.char_tokenizer(scratch_vocab, max(bigrams, 3)), None, note


# ----------------------------------------------------------------------------- compiling one step


@dataclasses.dataclass
class Row:
  """One (point, step, bucket)."""

  point: str
  step: str  # train | eval
  length: int
  batch: int
  status: str  # compiled | does not fit | error
  labels: str = ""  # mesh, dtype, attention, loss
  seconds: float | None = None
  hbm_bytes: int | None = None
  hbm_limit_bytes: int | None = None
  gflop: float | None = None
  kernels: int | None = None
  floor_ms: float | None = None
  reason: str = ""
  same_as: str = ""  # the point whose compile this one's program shares
  memory: dict = dataclasses.field(default_factory=dict)
  kernel_kind: str = "TPU"  # what `kernels` counts: TPU (Mosaic) or cuDNN custom calls

  def line(self) -> str:
    head = f"{self.point} {self.step} L{self.length} B{self.batch}: "
    tail = f" [{self.labels}]" if self.labels else ""
    if self.status == "error":
      return head + f"error: {self.reason}" + tail
    if self.hbm_bytes is None:
      return head + f"does not fit: {self.reason}" + tail
    how = f"same program as {self.same_as}" if self.same_as else f"compiled in {self.seconds:.0f} s"
    if self.kernel_kind == "TPU":
      figures = (f"HBM per chip {self.hbm_bytes / GIB:.2f} / {self.hbm_limit_bytes / GIB:g} GiB; "
                 f"{self.gflop:.1f} GFLOP per chip; {self.kernels} TPU kernels; compute floor {self.floor_ms:.2f} ms")
    else:
      figures = (f"memory per GPU {self.hbm_bytes / GIB:.2f} / {self.hbm_limit_bytes / GIB:.1f} GiB; "
                 f"{self.kernels} {self.kernel_kind} kernels")
    if self.status == "does not fit":
      return head + f"does not fit: {self.reason} ({how}); {figures}" + tail
    return head + f"{how}; {figures}" + tail


def hbm_bytes(memory) -> int:
  """Arguments + outputs - aliased + temporaries + generated code of a compiled program, per device."""
  return (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
          + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)


@dataclasses.dataclass
class Built:
  """A config built for the slice: what every step and bucket of its point shares."""

  config: Any
  tokenizer: Any
  types: list
  mesh: Any
  encoder_config: dict | None
  setups: dict  # model.attention override (None: the config's) -> state.Setup


@dataclasses.dataclass
class Job:
  """One (step, bucket) of a point: its labels, its lowered program (`aot.Program`) and what compiling it gave."""

  point: str
  step: str
  length: int
  batch: int
  labels: str = ""
  program: Any = None  # shared by the jobs of a point that lower to the same program
  digest: str = ""  # of the lowered program's text
  kernels: int = 0
  error: BaseException | None = None  # building or lowering it failed
  retried: bool = False  # compiled again with Triton GEMM fusions off
  seconds: float = 0.0  # its compiles, a retry included
  memory: Any = None
  cost: Any = None


class Compiler:
  """Builds and compiles the points of one slice; remembers programs it has compiled."""

  def __init__(self, s: Slice, *, mesh_sizes: dict | None = None, buckets: str = "largest",
               steps=STEPS, scratch_vocab: int = SCRATCH_VOCAB, num_types: int = NUM_TYPES, out=print,
               hlo_dir: str = ""):
    self.slice = s
    self.hlo_dir = hlo_dir
    self.steps = tuple(steps)
    self.devices = topology_devices(s)
    self.generation = pallas_generation(self.devices)
    self.mesh_sizes = mesh_sizes
    self.buckets = buckets
    self.scratch_vocab = scratch_vocab
    self.num_types = num_types
    self.out = out
    self.rows: list[Row] = []
    self.unexpected = False
    self.reports: list = []  # aot.Report of each concurrent compile (a point's, its retries')
    self.programs = 0  # programs compiled
    self._built: dict[str, str] = {}  # program_key -> first point with it
    self._compiled: dict[str, tuple[str, Row]] = {}  # lowered program hash -> (point, its row)
    self._notes: set[str] = set()

  def _note(self, text: str) -> None:
    if text not in self._notes:
      self._notes.add(text)
      self.out(text)

  def lengths(self, config) -> list[int]:
    buckets = batching.normalize_buckets(config.data.buckets, config.data.max_len)
    return list(buckets) if self.buckets == "all" else [buckets[-1]]

  def run(self, points: list[Point]) -> list[Row]:
    for point in points:
      if self.mesh_sizes:
        point.config.mesh.data, point.config.mesh.fsdp = self.mesh_sizes["data"], self.mesh_sizes["fsdp"]
      key = program_key(point.config)
      if key in self._built:
        for row in [r for r in self.rows if r.point == self._built[key]]:
          self._emit(dataclasses.replace(row, point=point.name, same_as=row.same_as or row.point))
        continue
      self._built[key] = point.name
      self.point(point)
    return self.rows

  def summary(self) -> str:
    """One line: the programs compiled, the wall time of their concurrent compiles against the compile time summed."""
    n, threads = self.programs, max([r.threads for r in self.reports] or [1])
    wall, summed = sum(r.wall for r in self.reports), sum(r.summed for r in self.reports)
    return (f"compiled {n} program{'s' * (n != 1)} in {wall:.1f} s wall, {summed:.1f} s of compile summed, "
            f"{threads} thread{'s' * (threads != 1)}")

  def _emit(self, row: Row) -> None:
    self.rows.append(row)
    self.out(row.line())

  def point(self, point: Point) -> None:
    """Every step and bucket of a point: lowered in turn, the programs not compiled before compiled together, then
    a row each in order."""
    config = point.config
    try:
      built = self._build(config)
    except Exception as e:  # pylint: disable=broad-except
      for length in self._safe_lengths(config):
        for step in self.steps:
          self._fail(point, step, length, config.batch_size if step == "train" else config.eval_batch_size, "", e,
                     config)
      return
    jobs = [self._lower(point.name, built, step, length) for length in self.lengths(config) for step in self.steps]
    firsts: dict[str, Job] = {}  # digest -> the point's first job with it
    for job in jobs:
      if job.error is None and job.digest not in self._compiled:
        first = firsts.setdefault(job.digest, job)
        job.program = first.program
    self._compile(list(firsts.values()))
    for job in jobs:
      self._row(point, job)
    for job in jobs:
      job.program = None
    jax.clear_caches()  # a BERT-base program holds GBs of host memory; none is run

  def _compile(self, jobs: list[Job]) -> None:
    """The jobs' programs compiled concurrently (`aot.compile_all`); a GPU program for which XLA:GPU found no Triton
    tiling again with Triton GEMM fusions off. Memory and cost analysis as each finishes, in this thread."""
    if not jobs:
      return
    self.programs += len(jobs)
    owner = {id(job.program): job for job in jobs}

    def done(program) -> None:
      job = owner[id(program)]
      job.seconds += program.seconds or 0.0
      if program.error is None:
        try:
          self._analyse(job)
        except Exception as e:  # pylint: disable=broad-except
          program.error = e

    self.reports.append(aot.compile_all([job.program for job in jobs], on_done=done))
    retry = [job for job in jobs if self.slice.platform == "cuda" and TRITON_TILING in str(job.program.error or "")]
    for job in retry:  # the lowered module does not depend on the options: compiled again, not lowered again
      job.retried = True
      job.program.options = dict(job.program.options, xla_gpu_enable_triton_gemm=False)
      job.program.error = None
    if retry:
      self.reports.append(aot.compile_all([job.program for job in retry], on_done=done))

  def _analyse(self, job: Job) -> None:
    """Memory and cost of a compiled program (its HLO written with --hlo_dir); the executable is dropped."""
    compiled = job.program.compiled
    if self.hlo_dir:
      self._write_hlo(job.point, job.step, job.length, compiled.as_text())
    job.memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    job.cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    job.program.compiled = job.program.lowered = None

  def _row(self, point: Point, job: Job) -> None:
    """The job's row, in order: a failure, the same program as an earlier row, does not fit, or compiled."""
    step, L, B, labels = job.step, job.length, job.batch, job.labels
    if job.error is not None:
      self._fail(point, step, L, B, labels, job.error, point.config)
      return
    if job.digest in self._compiled:
      first, row = self._compiled[job.digest]
      self._emit(dataclasses.replace(row, point=point.name, same_as=first, labels=labels))
      return
    program = job.program
    if job.retried and program.error is None:
      labels += (f"; Triton GEMM fusions off: without a GPU to autotune, XLA:GPU found no Triton tiling for a GEMM "
                 f"at L{L}" + (" (L a multiple of 16 compiles with them)" if L % 16 else ""))
    if program.error is not None:
      reason = failure(program.error, point.config, length=L, generation=self.generation)
      if reason is None:
        self._fail(point, step, L, B, labels, program.error, point.config)
        return
      row = Row(point.name, step, L, B, "does not fit", labels, seconds=job.seconds, kernels=job.kernels,
                reason=reason)
      self._compiled[job.digest] = (point.name, row)
      self._emit(row)
      return
    memory, cost = job.memory, job.cost
    gflop = None if cost is None and self.slice.platform == "cuda" else float((cost or {}).get("flops", 0.0)) / 1e9
    used, limit = hbm_bytes(memory), self.slice.hbm_bytes
    row = Row(point.name, step, L, B, "compiled", labels, seconds=job.seconds, hbm_bytes=used, hbm_limit_bytes=limit,
              gflop=gflop, kernels=job.kernels,
              floor_ms=None if gflop is None else gflop / self.slice.family.bf16_tflops,
              memory={k: int(getattr(memory, k)) for k in dir(memory) if k.endswith("_in_bytes")},
              kernel_kind="cuDNN" if self.slice.platform == "cuda" else "TPU")
    if used > limit:
      row.status, row.reason = "does not fit", f"HBM: needs {used / GIB:.2f} of {limit / GIB:.4g} GiB"
    self._compiled[job.digest] = (point.name, row)
    self._emit(row)

  def _safe_lengths(self, config) -> list[int]:
    try:
      return self.lengths(config)
    except Exception:  # pylint: disable=broad-except
      return [int(config.data.max_len)]

  def _fail(self, point, step, length, batch, labels, e, config) -> None:
    reason = failure(e, config, length=length, generation=self.generation)
    if reason is None:
      self.unexpected = True
      print(f"{point.name} {step} L{length}: unexpected error", file=sys.stderr)
      traceback.print_exception(e, file=sys.stderr)
      reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
      self._emit(Row(point.name, step, length, batch, "error", labels, reason=reason))
    else:
      self._emit(Row(point.name, step, length, batch, "does not fit", labels, reason=reason))

  def _build(self, config) -> Built:
    """A config on this slice: the mesh over its devices, the model built for its platform, parameters abstract.
    Batch size and length do not enter it."""
    tokenizer, hf, note = stand_ins(config, scratch_vocab=self.scratch_vocab)
    types, source = entity_types(config, self.num_types)
    self._note(f"{note}; {len(types)} entity types ({source})")
    try:
      mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp, devices=self.devices)
    except ValueError as e:
      raise UserError(f"{e} of {self.slice.accelerator_type}") from None
    for name in ("batch_size", "eval_batch_size"):  # as train.setup_run checks
      if config[name] % mesh.size or config[name] % self.slice.hosts:
        raise UserError(f"{name}={config[name]} must be divisible by the {mesh.size} data-parallel devices (mesh "
                        f"{dict(mesh.shape)}) and by the {self.slice.hosts} hosts of {self.slice.accelerator_type}")
    built = Built(config, tokenizer, types, mesh, hf, {})
    self._setup(built, None)
    return built

  def _setup(self, built: Built, attention: str | None):
    """The `state.Setup` of a built config, with `model.attention` overridden where `attention` is given."""
    if attention not in built.setups:
      built.setups[attention] = aot.target_setup(built.config, built.tokenizer, built.types, built.mesh,
                                                 self.slice.platform, encoder_config=built.encoder_config,
                                                 attention=attention)
    return built.setups[attention]

  def _lower(self, point: str, built: Built, step: str, length: int) -> Job:
    """One step at one bucket, labelled and lowered (on a machine without cuDNN, with the XLA attention in place of
    cuDNN's); an error is kept on the job."""
    config, mesh, platform = built.config, built.mesh, self.slice.platform
    job = Job(point, step, length, config.batch_size if step == "train" else config.eval_batch_size)
    try:
      spec = built.setups[None].spec  # resolved for this slice's platform
      k = feed.steps_per_execution(spec.steps_per_execution, platform) if step == "train" else 1
      attention = attention_choice(spec, built.encoder_config, length=length, train=step == "train",
                                   platform=platform)
      job.labels = (f"data:{mesh.shape['data']} x fsdp:{mesh.shape['fsdp']}, {spec.precision.dtype}, attention "
                    f"{attention}, loss {spec.loss_implementation}" + (f", {k} steps per call" if k > 1 else ""))
      with pallas_zlpr.tpu_target(self.generation):
        job.program, _, without_cudnn = aot.lower_or_xla_attention(
            lambda s: lower_step(step, s, platform, batch=job.batch, length=length, steps=k),
            lambda a: self._setup(built, a),
            built.setups[None])
      if without_cudnn:
        job.labels = re.sub(r"attention cudnn\b", "attention xla (in place of cudnn: cuDNN cannot be traced here)",
                            job.labels)
      text = job.program.lowered.as_text()
      job.digest = hashlib.sha256(text.encode()).hexdigest()
      job.kernels = sum(aot.kernel_calls(text).values())
    except Exception as e:  # pylint: disable=broad-except
      job.error = e
    return job

  def _write_hlo(self, point: str, step: str, length: int, text: str) -> None:
    """The compiled program's optimised HLO as HLO_DIR/POINT.STEP.LLENGTH.hlo.txt (POINT: the point's name made a
    file name)."""
    os.makedirs(self.hlo_dir, exist_ok=True)
    name = re.sub(r"[^\w.=,-]+", "_", point)
    with open(os.path.join(self.hlo_dir, f"{name}.{step}.L{length}.hlo.txt"), "w") as f:
      f.write(text)


def pallas_generation(devices) -> str | None:
  """The slice's TPU generation as `pallas_zlpr` names it (v4, v5e, v5p, v6e): its kernel picks tiles for it
  (`pallas_zlpr.tpu_target`) as it would on the chip."""
  return pallas_zlpr.tpu_generation(devices[0].device_kind)


def attention_choice(spec, encoder_config: dict | None, *, length: int, train: bool, platform: str = "tpu") -> str:
  """The self-attention the step holds on `platform` (`aot.attention_choice`): splash or cudnn, or xla and why; none
  for a scratch encoder without attention blocks."""
  impl, why = aot.attention_choice(spec, encoder_config, platform=platform, length=length, train=train)
  return impl + (f" ({why})" if why else "")


def lower_step(step: str, setup, platform: str, *, batch: int, length: int, steps: int = 1):
  """The trainer's jitted train step (state donated; with `steps` > 1 that many in one call, as a run whose
  steps_per_execution is k compiles it) or eval step (at `HitDecoder`'s first hit buffer) as an `aot.Program` with
  the XLA options a run on `platform` gives it (`aot.resolve`), lowered for the abstract state and batch; a lowering
  error is raised."""
  if step == "train":
    tx, _ = make_optimizer(setup.spec.optimizer, TOTAL_STEPS, setup.abstract_params)
    make = steps_lib.make_train_steps if steps > 1 else steps_lib.make_train_step
    fn = make(setup, tx, loss_kind=setup.spec.loss_kind)
    program = aot.train_program(fn, setup, tx, batch=batch, length=length, steps=steps)
  else:
    hits = tasks.of(setup.spec).initial_hits(batch)
    program = aot.eval_program(steps_lib.make_eval_step(setup, size=hits), setup, batch=batch, length=length, hits=hits)
  aot.resolve(program, setup, platform)
  program.lowered = program.fn.lower(*program.args)
  return program
