"""benchmarks/kernel_sass.py: a decode kernel compiled for sm_90 here, disassembled and split at its PDL wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def kernel_sass(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    """benchmarks/kernel_sass.py as a module."""
    return benchmark_script("kernel_sass")


def test_profile_splits_at_the_wait_and_counts_the_loop_apart(kernel_sass: ModuleType) -> None:
    code = [(0, "LDG.E R2, desc[UR4][R4.64]"), (1, "ACQBULK"), (2, "FFMA R1, R2, R3, R1"), (3, "IADD3 R5, R5, 1, RZ"),
            (4, "@P0 BRA ->2"), (5, "SHFL.BFLY PT, R6, R1, 0x1, 0x1f"), (6, "EXIT")]  # fmt: skip
    p = kernel_sass.profile(code)
    assert (p["instructions"], p["before_wait"], p["loop_body"], p["after_wait_one_step"]) == (7, 1, 3, 3)
    assert p["after_wait_opcodes"] == {"ACQBULK": 1, "SHFL": 1, "EXIT": 1}
    assert p["loop_body_opcodes"] == {"FFMA": 1, "IADD3": 1, "BRA": 1}


def test_an_nvfp4_gemv_loads_its_weights_before_the_wait_and_decodes_after(tmp_path: Path) -> None:
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "kernel_sass.py"), "linear", "--nvfp4", "--block-n", "8",
           "--block-k", "1024", "--out", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["kernel"] == "_linear_kernel" and row["NVFP4"] and row["BLOCK_K"] == 1024
    assert 0 < row["before_wait"] < row["instructions"] and row["REG"] > 0
    assert row["loop_body"] > 0  # K beyond one step runs a loop, counted apart
    assert row["loop_body_opcodes"].get("FFMA", 0) > 0 and row["loop_body_per_value"] > 1
    ops = row["after_wait_opcodes"]
    assert ops.get("FFMA", 0) > 0 and ops.get("LOP3", 0) > 0  # the E2M1 decode and the FMAs come after the wait
    assert row["after_wait_per_value"] > 1
    assert "a weight value" in r.stdout
