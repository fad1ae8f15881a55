"""A local GCS emulator (PyPI gcp-storage-emulator) for tests: `python -m tests.gcs_emulator PORT BUCKET`.

Binds 127.0.0.1 only. One fix over the package: object downloads carry the `x-goog-generation` header,
as real GCS sends it; tensorstore's OCDBT reads an object's generation from it (without it a checkpoint
write that re-reads its manifest fails with "Malformed StorageGeneration").
"""

import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except Exception:  # NotFound: the 404 is already set
    return
  response["x-goog-generation"] = str(obj.get("generation", "1"))
  response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))


def main(port: int, bucket: str) -> None:
  objects.download = download  # `objects.get` with alt=media calls it by name
  for _, methods in server.HANDLERS:
    for method, fn in list(methods.items()):
      if fn is _download:
        methods[method] = download
  server.Server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2])
