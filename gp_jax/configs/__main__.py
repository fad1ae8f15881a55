"""Lists every `--config.KEY` field with its default and its one-line comment from gp_jax/configs/base.py.

  python -m gp_jax.configs                                        # base.get_config()'s fields and defaults
  python -m gp_jax.configs experiments/rope_ablation.py:dataset=msra   # that experiment's values, marked where set

The comments are read from base.py's source (the comment on each field's first assignment in get_config), so this
list and the file never disagree. Defaults are get_config()'s (the scratch encoder); a field the bert encoder sets
otherwise shows that value too. Set a field on any run with --config.KEY=VALUE (gp_jax.main, launch.local ... --).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import sys
import tokenize

import ml_collections

from gp_jax.configs import base
from gp_jax.configs.args import build_config
from gp_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Field:
  key: str  # dotted, as after --config.
  default: object  # base.get_config()
  comment: str  # "" when base.py has none
  bert: object = None  # base.get_config(encoder="bert")'s value where it differs, else None
  group: bool = False  # a ConfigDict of fields (e.g. model), not a leaf


def _target_key(node: ast.expr, root: str) -> str | None:
  """"model.head" for the target `c.model.head` (root "c"); None for any other target."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == root and parts else None


def source_comments(source: str | None = None) -> dict[str, str]:
  """{field key: its comment} from base.get_config's top-level assignments `c.a.b = ...  # comment` and those of the
  `add_*(c, ...)` group functions it calls, in call order (the first assignment of a key; later ones, e.g. bert's
  settings, keep the first comment)."""
  source = source if source is not None else open(base.__file__, encoding="utf-8").read()
  comments = {tok.start[0]: tok.string.lstrip("#").strip()
              for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
  functions = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
  fn = functions["get_config"]
  root = next(n.targets[0].id for n in fn.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
              and isinstance(n.value, ast.Call) and ast.unparse(n.value.func).endswith("ConfigDict"))
  out = {}

  def visit(body, root):
    for node in body:
      if isinstance(node, ast.Assign) and len(node.targets) == 1:
        key = _target_key(node.targets[0], root)
        if key is not None and key not in out:
          out[key] = comments.get(node.end_lineno, "")
      elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
            and node.value.func.id in functions and node.value.args):
        callee = functions[node.value.func.id]
        visit(callee.body, callee.args.args[0].arg)

  visit(fn.body, root)
  return out


def _flat(config, prefix: str = "") -> dict[str, object]:
  """{dotted key: value} of every field, groups included (a group's value is its ConfigDict)."""
  out = {}
  for k, v in config.items():
    out[prefix + k] = v
    if isinstance(v, ml_collections.ConfigDict):
      out.update(_flat(v, f"{prefix}{k}."))
  return out


def fields() -> list[Field]:
  """Every field of base.get_config(), groups and leaves, in the order get_config sets them."""
  comments = source_comments()
  scratch, bert = _flat(base.get_config()), _flat(base.get_config(encoder="bert"))
  order = {k: i for i, k in enumerate(comments)}
  out = []
  for key, value in sorted(scratch.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
    group = isinstance(value, ml_collections.ConfigDict)
    other = None if group or bert.get(key) == value else bert.get(key)
    out.append(Field(key, None if group else value, comments.get(key, ""), other, group))
  return out


def _show(value) -> str:
  return repr(value)


def listing(values: dict[str, object] | None = None) -> list[str]:
  """The lines `python -m gp_jax.configs` prints; `values` ({key: value}, an experiment's config) are shown beside
  the defaults, marked with * where they differ."""
  rows = []
  for f in fields():
    if f.group:
      rows.append((f"{f.key}:", "", f.comment))
      continue
    default = _show(f.default) + (f" (bert: {_show(f.bert)})" if f.bert is not None else "")
    if values is not None:
      value = values.get(f.key, f.default)
      default = f"{_show(value)}{' *' if value != f.default else ''}  (default {default})"
    rows.append((f"  --config.{f.key}", default, f.comment))
  width = max(len(r[0]) for r in rows)
  mid = max(len(r[1]) for r in rows)
  return [f"{name:<{width}}  {value:<{mid}}  {comment}".rstrip() for name, value, comment in rows]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m gp_jax.configs", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("config", nargs="?", metavar="CONFIG[:ARG]", help="an experiment file (optionally with "
                      ":arg): show its values beside the defaults, * where they differ")
  args = parser.parse_args(argv)
  values = None
  if args.config:
    try:
      values = _flat(build_config(args.config))
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  header = (f"Fields of {args.config} (value, * where it differs from base's default)" if args.config
            else "Fields of gp_jax/configs/base.py (default; bert's where it differs)")
  print(f"{header}; set one with --config.KEY=VALUE:")
  print("\n".join(listing(values)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
