"""What a run's "dev" and "test" splits are, as its config says (data.dev_split, data.test_split): the report names
the split a figure is on by this, so that a corpus's official dev reported as the test figure (CLUENER and People's
Daily: data.test_split=dev) is never called "test", nor a share of the training split held out as dev "dev"."""

from __future__ import annotations

# gp_jax.data.sources' names, copied so the report need not import the data stack (jax); tests check them.
HOLDOUT = "holdout"  # data.dev_split: a share of the training split held out as dev
USER_FORMATS = ("jsonl", "conll", "cblue", "casrel")  # data.name values that read data.*_file, not corpus splits
DEV_NAMES = ("dev", "validation")  # a corpus's official dev split
ROLES = ("dev", "test")  # results.json's splits: dev chooses the checkpoint, test is reported


def split_label(config: dict, split: str) -> str:
  """The name of a run's `split` ("dev" or "test") in the report, from its resolved config (flat keys): "test" for
  the corpus's test, "dev" for its dev, "official dev" for the corpus's dev in the test role (data.test_split=dev),
  "holdout" for dev held out of the training split (data.dev_split=holdout; a user file format without
  data.dev_file), else the corpus split's own name."""
  config = config or {}
  if config.get("data.name") in USER_FORMATS:
    return HOLDOUT if split == "dev" and not config.get("data.dev_file") else split
  name = str(config.get(f"data.{split}_split", split))
  if split == "dev" and name == HOLDOUT:
    return HOLDOUT
  if name == split or (split == "dev" and name in DEV_NAMES):
    return split
  if name in DEV_NAMES:
    return "official dev"
  return "official test" if name == "test" else name


def labels_of(configs, split: str) -> list[str]:
  """The distinct `split_label`s of these configs: the corpus's own `split` first, then in order of first sight."""
  found = list(dict.fromkeys(split_label(c, split) for c in configs))
  return sorted(found, key=lambda label: (label != split, found.index(label)))


def joined(configs, split: str) -> str:
  """`labels_of` as one name: "official dev", or "test / official dev" where the configs differ."""
  return join_labels(labels_of(configs, split), split)


def join_labels(labels: list[str], split: str) -> str:
  """`joined` of labels found already (`labels_of`)."""
  return " / ".join(labels) or split


def is_plain(configs) -> bool:
  """Whether every config's dev and test are the corpus's dev and test (the report then says "dev" and "test")."""
  return all(split_label(c, s) == s for c in configs for s in ROLES)
