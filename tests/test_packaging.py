"""Packaging: every package folder is listed in pyproject.toml, and the built wheel, installed apart from the source
tree, carries every module and data file and runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found == listed, f"unlisted: {sorted(found - listed)}, stale: {sorted(listed - found)}"


def test_the_wheel_installs_and_runs_without_the_source_tree(tmp_path: Path) -> None:
    """`pip install` of the built wheel carries every module and data file: installed apart from the source tree, all
    three packages import module by module, the H200 tuning table and kernel manifest load, and the engine answers a
    prompt on the embedded demo model (CPU) with the console scripts' entry points in place."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True,
                   cwd=tmp_path, timeout=300, capture_output=True)  # fmt: skip
    [wheel] = wheels.glob("flint_serve-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    entry_points = next(site.glob("flint_serve-*.dist-info")) / "entry_points.txt"
    assert "flint = flint_engine.cli:main" in entry_points.read_text()
    assert "flint-serve = flint_serve.cli:main" in entry_points.read_text()
    code = f"""
import importlib, pkgutil
import flint_engine, flint_kernels, flint_serve
for pkg in (flint_engine, flint_kernels, flint_serve):
    assert pkg.__file__.startswith({str(site)!r}), pkg.__file__  # the installed copy, not the source tree
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(info.name)
from flint_kernels import precompile, tuning
assert tuning.load(tuning.TABLES / "nvidia-h200.json").path.is_file()
assert (precompile.MANIFESTS / "nvidia-h200.json").is_file()
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.sampling_params import SamplingParams
engine = LLMEngine.from_checkpoint(EngineConfig(device="cpu"))
prompt = engine.tokenizer.encode_chat([{{"role": "user", "content": "What is 7 + 8?"}}])
[req] = engine.generate([prompt], SamplingParams(max_tokens=64, temperature=0))
print(engine.tokenizer.decode(req.output_token_ids))
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "15" in out.stdout, out.stdout
