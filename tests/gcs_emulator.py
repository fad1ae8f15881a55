"""A local GCS emulator (PyPI gcp-storage-emulator) for tests:

  python -m tests.gcs_emulator PORT BUCKET [--faults=SHARE] [--fault_kinds=503,429,drop,lost_answer] [--seed=0]

Binds 127.0.0.1 only. Fixes over the package:
  * object downloads carry the `x-goog-generation` header, as real GCS sends it; tensorstore's OCDBT reads an
    object's generation from it (without it a checkpoint write that re-reads its manifest fails with
    "Malformed StorageGeneration").
  * uploads honour `ifGenerationMatch` (the package ignores it): 0 means "only if absent", N "only if the live
    generation is N"; a mismatch answers 412 Precondition Failed, as GCS does (gcsfs raises FileExistsError).
    Resumable uploads carry it from the initiating request to the final chunk.
Fault injection, for a share of requests (seeded, so a run is repeatable for a given request order):
  503 / 429   an error answer (retryable by gcsfs and tensorstore), the request is not executed;
  drop        the connection is closed before the request is executed;
  lost_answer the request IS executed, then the connection is closed without an answer (a retried create then
              meets its own object: 412).
`POST /_faults?share=S[&kinds=a,b][&seed=N][&next=K]` (K: the next K requests fail whatever S) changes the injector at run time; `GET /_faults` returns its counts.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import socket
import threading
from http import HTTPStatus
from urllib.parse import parse_qs, urlparse

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download
_local = threading.local()
_resumable_conditions: dict[str, str] = {}  # upload_id -> ifGenerationMatch of the initiating request


class PreconditionFailed(Exception):
  pass


def download(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except Exception:  # NotFound: the 404 is already set
    return
  response["x-goog-generation"] = str(obj.get("generation", "1"))
  response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))


# ----------------------------------------------------------------------------- ifGenerationMatch


def _guarded(fn):
  def handler(request, response, storage, *args, **kwargs):
    cond = request.query.get("ifGenerationMatch", [None])[0]
    upload_id = request.query.get("upload_id", [None])[0]
    if cond is None and upload_id is not None:
      cond = _resumable_conditions.get(upload_id)
    _local.condition = cond
    try:
      out = fn(request, response, storage, *args, **kwargs)
      if cond is not None and upload_id is None and request.query.get("uploadType", [""])[0] == "resumable":
        loc = response._headers.get("Location") if hasattr(response, "_headers") else None  # pylint: disable=protected-access
        if loc:
          _resumable_conditions[parse_qs(urlparse(loc).query).get("upload_id", [""])[0]] = cond
      return out
    except PreconditionFailed as e:
      response.status = HTTPStatus.PRECONDITION_FAILED
      response.json({"error": {"code": 412, "message": str(e), "errors": [{"reason": "conditionNotMet"}]}})
      return None
    finally:
      _local.condition = None

  handler.guarded = True
  return handler


def _patch_storage(storage_cls):
  create_file = storage_cls.create_file

  def checked_create_file(self, bucket_name, file_name, content, file_obj, *args, **kwargs):
    cond = getattr(_local, "condition", None)
    if cond is not None:
      try:
        live = int(self.get_file_obj(bucket_name, file_name).get("generation", 1))
      except NotFound:
        live = 0
      if int(cond) != live:
        raise PreconditionFailed(f"ifGenerationMatch={cond}, live generation {live}: gs://{bucket_name}/{file_name}")
    return create_file(self, bucket_name, file_name, content, file_obj, *args, **kwargs)

  storage_cls.create_file = checked_create_file


# ----------------------------------------------------------------------------- faults


class Faults:
  def __init__(self, share: float = 0.0, kinds=("503", "429", "drop", "lost_answer"), seed: int = 0):
    self.lock = threading.Lock()
    self.set(share, kinds, seed)

  def set(self, share, kinds, seed, next_=0):
    with self.lock:
      self.share, self.kinds, self.rng, self.next = float(share), tuple(kinds), random.Random(seed), int(next_)
      self.counts = {k: 0 for k in self.kinds}
      self.requests = 0

  def draw(self, path: str) -> str | None:
    if path.startswith("/_faults"):
      return None
    with self.lock:
      self.requests += 1
      if self.next > 0:
        self.next -= 1
        kind = self.rng.choice(self.kinds)
        self.counts[kind] += 1
        return kind
      if self.share <= 0 or self.rng.random() >= self.share:
        return None
      kind = self.rng.choice(self.kinds)
      self.counts[kind] += 1
      return kind


FAULTS = Faults()


def _control(handler) -> bool:
  """GET/POST /_faults: read or change the injector."""
  if not handler.path.startswith("/_faults"):
    return False
  q = parse_qs(urlparse(handler.path).query)
  if handler.command == "POST":
    FAULTS.set(float(q.get("share", ["0"])[0]), q.get("kinds", [",".join(FAULTS.kinds)])[0].split(","),
               int(q.get("seed", ["0"])[0]), int(q.get("next", ["0"])[0]))
  body = json.dumps({"share": FAULTS.share, "kinds": FAULTS.kinds, "counts": FAULTS.counts,
                     "requests": FAULTS.requests}).encode()
  handler.send_response(200)
  handler.send_header("Content-Type", "application/json")
  handler.send_header("Content-Length", str(len(body)))
  handler.end_headers()
  handler.wfile.write(body)
  return True


def _hang_up(handler) -> None:
  handler.close_connection = True
  try:
    handler.connection.shutdown(socket.SHUT_RDWR)
  except OSError:
    pass


def _with_faults(method):
  def do(handler):
    if _control(handler):
      return
    kind = FAULTS.draw(handler.path)
    if kind in ("503", "429"):
      code = int(kind)
      body = json.dumps({"error": {"code": code, "message": f"injected {code}"}}).encode()
      handler.send_response(code)
      handler.send_header("Content-Type", "application/json")
      handler.send_header("Content-Length", str(len(body)))
      handler.send_header("Connection", "close")
      handler.end_headers()
      handler.wfile.write(body)
      handler.close_connection = True
      return
    if kind == "drop":
      _hang_up(handler)
      return
    if kind == "lost_answer":
      real = handler.wfile
      handler.wfile = io.BytesIO()  # the request runs; its answer goes nowhere
      try:
        method(handler)
      finally:
        handler.wfile = real
        _hang_up(handler)
      return
    method(handler)

  return do


def install() -> None:
  objects.download = download  # `objects.get` with alt=media calls it by name
  for name in ("insert", "xml_upload", "upload_partial"):
    fn = getattr(objects, name)
    if not getattr(fn, "guarded", False):
      setattr(objects, name, _guarded(fn))
  for _, methods in server.HANDLERS:
    for method, fn in list(methods.items()):
      if fn is _download:
        methods[method] = download
      elif getattr(fn, "__name__", "") in ("insert", "xml_upload", "upload_partial") and not getattr(fn, "guarded", False):
        methods[method] = getattr(objects, fn.__name__)
  from gcp_storage_emulator.storage import Storage  # pylint: disable=g-import-not-at-top

  _patch_storage(Storage)
  for verb in ("GET", "POST", "PUT", "DELETE", "PATCH"):
    name = f"do_{verb}"
    setattr(server.RequestHandler, name, _with_faults(getattr(server.RequestHandler, name)))


def main(argv=None) -> None:
  p = argparse.ArgumentParser()
  p.add_argument("port", type=int)
  p.add_argument("bucket")
  p.add_argument("--faults", type=float, default=0.0, help="share of requests that get a fault")
  p.add_argument("--fault_kinds", default="503,429,drop,lost_answer")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  install()
  FAULTS.set(a.faults, a.fault_kinds.split(","), a.seed)
  server.Server("127.0.0.1", a.port, in_memory=True, default_bucket=a.bucket).run()


if __name__ == "__main__":
  main()
