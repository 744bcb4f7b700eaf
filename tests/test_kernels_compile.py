"""Ahead-of-time compilation of the GEMV kernel variants for Hopper (sm_90) without a GPU: a kernel that the
installed Triton cannot compile for the target fails here, in CI, instead of on the GPU machine."""

from __future__ import annotations

import os

import pytest


def _compile(case: dict) -> None:
    """Compile in a fresh process: the interpreter (set for CPU test runs) replaces @triton.jit functions."""
    import subprocess
    import sys

    code = f"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import torch
import flint_kernels.gemv_triton as g
case = {case!r}
fn = g._linear_kernel
names = fn.arg_names
dt = case.pop("dtype")
nv = case["NVFP4"]
sig = {{n: "i32" for n in names}}
sig.update({{"x_ptr": "*" + dt, "w_ptr": "*u8" if nv else "*" + dt, "s_ptr": "*u8" if nv else "*" + dt,
            "gs_ptr": "*fp32", "out_ptr": "*" + dt, "ws_ptr": "*fp32", "cnt_ptr": "*i32"}})
warps, stages = case.pop("num_warps"), case.pop("num_stages")
case["PRECISION"] = g.precision_for(torch.bfloat16 if dt == "bf16" else torch.float32)
for k in case:
    sig[k] = "constexpr"
src = ASTSource(fn=fn, signature=sig, constexprs={{(names.index(k),): v for k, v in case.items()}})
triton.compile(src, target=GPUTarget("cuda", 90, 32), options={{"num_warps": warps, "num_stages": stages}})
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


CASES = [
    dict(NVFP4=True, USE_DOT=True, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
    dict(NVFP4=True, USE_DOT=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
    dict(NVFP4=True, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=1024, num_warps=4, num_stages=1),
    dict(NVFP4=False, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512, num_warps=4, num_stages=1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'nvfp4' if c['NVFP4'] else 'bf16'}-m{c['BLOCK_M']}")
def test_gemv_compiles_for_sm90(case: dict) -> None:
    _compile({**case, "dtype": "bf16", "EVEN_K": True, "WORDS": False, "SPLIT_K": 1})
