"""Packaging: launch/ is installed as `gp_jax_launch` (never the top-level name `launch`, which ROS 2 ships), with
console scripts, so the launcher's CLIs run from any folder; from the repository root `python -m launch.X` still
works. Checked on pyproject.toml, on this environment's install (`pip install -e .`) and on a regular install."""

import ast
import importlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
INSTALLED = {"gp_jax": "gp_jax", "launch": "gp_jax_launch"}  # folder in the repository -> installed package


def _pyproject() -> dict:
  with open(REPO / "pyproject.toml", "rb") as f:
    return tomllib.load(f)


def _package_folders() -> list[str]:
  """Installed names of every package folder (one holding __init__.py) under gp_jax/ and launch/."""
  out = []
  for folder, name in INSTALLED.items():
    for init in sorted((REPO / folder).rglob("__init__.py")):
      parts = init.parent.relative_to(REPO / folder).parts
      out.append(".".join([name, *parts]))
  return out


def test_pyproject_installs_every_package_folder_under_its_name():
  tool = _pyproject()["tool"]["setuptools"]
  assert sorted(tool["packages"]) == sorted(_package_folders())
  assert tool["package-dir"] == {"gp_jax_launch": "launch"}
  assert not any(p == "launch" or p.startswith("launch.") for p in tool["packages"])
  for pattern in tool["package-data"]["gp_jax_launch"]:
    assert list((REPO / "launch").glob(pattern)), pattern


def test_console_scripts_name_each_cli_main():
  scripts = _pyproject()["project"]["scripts"]
  assert {"gp-jax-compile", "gp-jax-local", "gp-jax-report", "gp-jax-slurm", "gp-jax-tpu", "gp-jax-worker"} <= set(scripts)
  for script, target in scripts.items():
    module, _, fn = target.partition(":")
    assert module.startswith("gp_jax_launch.") and fn == "main", target
    assert script == "gp-jax-" + module.split(".")[1]
    repo_module = importlib.import_module("launch." + module.split(".", 1)[1])  # the same file, from the root
    assert callable(getattr(repo_module, fn)), target


def test_the_launcher_imports_itself_relatively():
  """No module of launch/ imports `launch` by that name: installed, the package is gp_jax_launch."""
  found = []
  for path in sorted((REPO / "launch").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
      found += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names if n == "launch" or n.startswith("launch.")]
  assert not found, found


def _run(args, cwd, *, pythonpath: str | None = None, timeout: float = 180, **env):
  """`args` in `cwd` with this environment but PYTHONPATH (only `pythonpath`), plus `env`."""
  full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env
  if pythonpath:
    full["PYTHONPATH"] = pythonpath
  return subprocess.run(args, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


def _fake_study(root: pathlib.Path) -> None:
  for seed in (0, 1):
    d = root / f"seed={seed}"
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"seed": %d, "data": {"name": "msra"}, "model": {"head": "standard"}}' % seed)
    (d / "results.json").write_text('{"status": "finished", "dev": {"f1": 0.5, "precision": 0.5, "recall": 0.5}}')


@pytest.mark.e2e
def test_installed_clis_run_from_any_folder(tmp_path):
  """This environment's install (pip install -e .): the console scripts and `python -m gp_jax_launch.X` work from a
  folder outside the repository, and the worker commands they write name the installed package."""
  if importlib.util.find_spec("gp_jax_launch") is None:
    pytest.fail("gp_jax_launch is not installed: run `pip install -e .` after pulling this pyproject.toml")
  bin_dir = pathlib.Path(sys.executable).parent
  _fake_study(tmp_path / "study")
  out = _run([str(bin_dir / "gp-jax-report"), "study"], tmp_path)
  assert out.returncode == 0 and "| msra |" in out.stdout, out.stderr
  missing = _run([str(bin_dir / "gp-jax-report"), "nope"], tmp_path)
  assert missing.returncode == 2 and missing.stderr.startswith("error: nope is not a folder"), missing.stderr
  for cli in ("local", "worker", "compile", "tpu"):
    out = _run([str(bin_dir / f"gp-jax-{cli}"), "--help"], tmp_path)
    assert out.returncode == 0 and out.stdout.startswith(f"usage: gp-jax-{cli} "), out.stderr
  # An experiment that imports its siblings (experiments/head_ablation.py), from a folder outside the repository.
  plan = _run([sys.executable, "-m", "gp_jax_launch.local", f"--config={REPO}/experiments/head_ablation.py:quick",
               "--workdir=runs", "--workers=2", "--dry_run"], tmp_path, JAX_PLATFORMS="cpu")
  assert plan.returncode == 0, plan.stdout + plan.stderr
  assert f"-m gp_jax_launch.worker --config={REPO}/experiments/head_ablation.py:quick" in plan.stdout
  assert "every config builds" in plan.stdout and not (tmp_path / "runs").exists()
  probe = _run([sys.executable, "-c", "import importlib.util as u; s = u.find_spec('launch'); "
                "print(s.origin if s else None)"], tmp_path)
  assert not probe.stdout.strip().startswith(str(REPO)), probe.stdout  # `launch` is not ours to claim


@pytest.mark.e2e
def test_a_regular_install_has_the_same_layout(tmp_path):
  """`pip install --target` of a copy of the sources (a built wheel's layout): gp_jax and gp_jax_launch with its
  subpackage and data files, the console scripts, no top-level `launch`."""
  src = tmp_path / "src"
  src.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(REPO / name, src / name)
  for folder in INSTALLED:
    shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
  target = tmp_path / "target"
  out = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
              "--target", str(target), str(src)], tmp_path, timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) == [
      "bin", "gp_jax", "gp_jax_launch"]
  assert (target / "gp_jax_launch" / "report" / "__main__.py").is_file()
  assert sorted(p.name for p in (target / "gp_jax_launch" / "gpu_specs").iterdir()) == sorted(
      p.name for p in (REPO / "launch" / "gpu_specs").iterdir())
  assert sorted(p.name for p in (target / "bin").iterdir()) == sorted(_pyproject()["project"]["scripts"])
  _fake_study(tmp_path / "study")
  out = _run([sys.executable, "-c", "import gp_jax, gp_jax_launch.report as r; print(gp_jax.__file__, r.__file__); "
              "import sys; sys.exit(r.main(['study']))"], tmp_path, pythonpath=str(target))
  assert out.returncode == 0, out.stderr
  assert out.stdout.split()[:2] == [str(target / "gp_jax" / "__init__.py"),
                                    str(target / "gp_jax_launch" / "report" / "__init__.py")]
  out = _run([sys.executable, "-m", "gp_jax_launch.report", "--help"], tmp_path, pythonpath=str(target))
  assert out.returncode == 0 and out.stdout.startswith("usage: python -m gp_jax_launch.report"), out.stderr
