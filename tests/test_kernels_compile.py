"""Ahead-of-time compilation of the fused decode kernels for Hopper (sm_90) without a GPU: a kernel that the
installed Triton cannot compile for the target (a construct the interpreter accepts but the compiler does not)
fails here, in CI, instead of on the GPU machine."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


# The compiler process: it reads one request a line (a Python literal, so tuples stay tuples) and answers each on a
# line of its own after a mark (Triton may print on stdout too).
_MARK = "@@compiled "
_WORKER = f"""
import ast, json, sys, traceback
sys.path.insert(0, {str(BENCHMARKS)!r})
from kernel_sass import compile_sm90
for line in sys.stdin:
    module, kernel, pointers, constexprs, warps, stages = ast.literal_eval(line)
    try:
        _, ptx = compile_sm90(module, kernel, pointers, constexprs, warps, stages)
        lines = ptx.splitlines()
        waits = [i for i, text in enumerate(lines) if "griddepcontrol.wait" in text]
        first = waits[0] if waits else len(lines)
        loads = sum("ld.global" in text or "prefetch.global" in text for text in lines[:first])
        answer = {{"loads": loads, "waits": len(waits)}}
    except Exception:
        answer = {{"error": traceback.format_exc()[-3000:]}}
    print({_MARK!r} + json.dumps(answer), flush=True)
"""


class _Compiler:
    """One Python process outside the interpreter (set for CPU test runs, it replaces @triton.jit functions) that
    compiles kernels for sm_90 on request, kept for a test worker's session: importing torch and Triton again for
    each of this file's cases took most of its time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (the process's stderr for its life; close())

    def __call__(self, request: tuple) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                text=True, env=env,
            )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(repr(request) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])
        self.errors.seek(0)
        raise AssertionError(f"the compiler process exited: {self.errors.read()[-3000:]}")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.communicate(timeout=60)  # closes its stdin: it ends its loop
        self.errors.close()


_compiler = _Compiler()
atexit.register(_compiler.close)


def _compile(
    module: str, kernel: str, pointers: dict[str, str], constexprs: dict, warps: int, stages: int
) -> tuple[int, int]:
    """Compile `kernel` for sm_90 (benchmarks/kernel_sass.py's `compile_sm90`, in `_compiler`'s process). Returns how
    many global loads (and L2 prefetches) the PTX issues before its first `griddepcontrol.wait`, and how many wait
    instructions it has (0 without PDL)."""
    answer = _compiler((module, kernel, pointers, constexprs, warps, stages))
    assert "error" not in answer, answer.get("error")
    return answer["loads"], answer["waits"]


GEMV_CASES = [
    dict(NVFP4=True, USE_DOT=True, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
    dict(NVFP4=True, USE_DOT=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
    dict(NVFP4=True, USE_DOT=True, BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3, WORDS=2),
    dict(NVFP4=True, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=1024, num_warps=4, num_stages=1),
    dict(NVFP4=True, USE_DOT=False, BLOCK_M=4, BLOCK_N=8, BLOCK_K=2048, num_warps=4, num_stages=1),
    dict(NVFP4=False, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512, num_warps=4, num_stages=1),
]


@pytest.mark.parametrize(
    "case",
    GEMV_CASES,
    ids=lambda c: (
        f"{'nvfp4' if c['NVFP4'] else 'bf16'}-m{c['BLOCK_M']}{'-fma' if not c['USE_DOT'] else ''}"
        f"{'-packed' if c.get('WORDS') == 2 else ''}"
    ),
)
def test_gemv_compiles_for_sm90(case: dict) -> None:
    case = dict(case)
    warps, stages = case.pop("num_warps"), case.pop("num_stages")
    nv = case["NVFP4"]
    pointers = {"x_ptr": "bf16", "w_ptr": "u8" if nv else "bf16", "s_ptr": "u8" if nv else "bf16",
                "gs_ptr": "fp32", "out_ptr": "bf16", "ws_ptr": "fp32", "cnt_ptr": "i32", "res_ptr": "bf16",
                "nw_ptr": "fp32", "h_ptr": "bf16", "res_out_ptr": "bf16", "row_cnt_ptr": "i32"}  # fmt: skip
    # The add+RMSNorm epilogue exists for M == 1 (the FMA path) only.
    norm = {"NORM": case["BLOCK_M"] == 1 and not case["USE_DOT"], "N_PAD": 2048}
    constexprs = {"WORDS": 0, **case, "PRECISION": "tf32", "EVEN_K": True, "SPLIT_K": 2, "PDL": True, **norm,
                  "NORM_IN": False}  # fmt: skip
    loads, waits = _compile("flint_kernels.gemv_triton", "_linear_kernel", pointers, constexprs, warps, stages)
    assert waits >= 1
    # FMA tiles (one row or a few): the first step's weights are requested before waiting for the previous kernel;
    # with tensor cores nothing is read before the wait.
    assert (loads > 0) == (not case["USE_DOT"]), loads


@pytest.mark.parametrize("nvfp4", [True, False])
def test_gemv_with_the_norm_prologue_compiles_for_sm90(nvfp4: bool) -> None:
    """M == 1 with the add+RMSNorm prologue (`add_rms_norm_linear`): the first weight step still loads before the
    PDL wait; the row's norm after it."""
    pointers = {"x_ptr": "bf16", "w_ptr": "u8" if nvfp4 else "bf16", "s_ptr": "u8" if nvfp4 else "bf16",
                "gs_ptr": "fp32", "out_ptr": "bf16", "ws_ptr": "fp32", "cnt_ptr": "i32", "res_ptr": "bf16",
                "nw_ptr": "fp32", "h_ptr": "bf16", "res_out_ptr": "bf16", "row_cnt_ptr": "i32"}  # fmt: skip
    constexprs = dict(NVFP4=nvfp4, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=2048 if nvfp4 else 1024, WORDS=0,
                      PRECISION="tf32", EVEN_K=True, SPLIT_K=1, NORM=False, N_PAD=1, NORM_IN=True,
                      PDL=True)  # fmt: skip
    loads, waits = _compile("flint_kernels.gemv_triton", "_linear_kernel", pointers, constexprs, 4, 1)
    assert loads > 0 and waits >= 1


def test_moe_expert_major_gate_up_compiles_for_sm90() -> None:
    """The expert-major NVFP4 gate_up (`MoEConfig.expert_major`) at the sweep's spill-free tiles: nothing is read
    before the PDL wait (the expert's pairs come from the router's ids, the previous kernel's output)."""
    pointers = {"x_ptr": "bf16", "ids_ptr": "i64", "w_ptr": "u8", "s_ptr": "u8", "gs_ptr": "fp32", "h_ptr": "bf16"}
    constexprs = dict(EVEN_K=True, P_PAD=256, BLOCK_I=16, BLOCK_K=256, PDL=True)
    loads, waits = _compile("flint_kernels.moe_triton", "_moe_gate_up_expert_kernel", pointers, constexprs, 2, 1)
    assert loads == 0 and waits == 1


@pytest.mark.parametrize(
    ("kernel", "slots_here", "shared"),
    [("_moe_gate_up_kernel", False, False), ("_moe_down_kernel", False, False), ("_moe_down_kernel", True, False),
     ("_moe_gate_up_kernel", False, True), ("_moe_down_kernel", True, True)],
    ids=["gate_up", "down", "down-slots", "gate_up-shared", "down-slots-shared"],
)  # fmt: skip
def test_moe_expert_major_tensor_cores_compile_for_sm90(kernel: str, slots_here: bool, shared: bool) -> None:
    """The grouped launches over blocks found in the unsorted ids (`MoEConfig.expert_major` with tensor-core tiles)
    at the H200's BF16 tiles: the ids scan (cumsum, a [P_PAD, BLOCK_M] match) compiles, and nothing is read before
    the PDL wait (the blocks come from the router's ids)."""
    import inspect

    from flint_kernels import moe_triton

    pointers = {
        "x_ptr": "bf16",
        "h_ptr": "bf16",
        "ids_ptr": "i64",
        "order_ptr": "i64",
        "meta_ptr": "i64",
        "tw_ptr": "fp32",
        "w_ptr": "bf16",
        "s_ptr": "bf16",
        "gs_ptr": "bf16",
        "sw_ptr": "bf16",
        "ss_ptr": "bf16",
        "sgs_ptr": "bf16",
        "out_ptr": "bf16",
        "ws_ptr": "fp32",
        "cnt_ptr": "i32",
        "res_ptr": "bf16",
        "nw_ptr": "fp32",
        "hn_ptr": "bf16",
        "res_out_ptr": "bf16",
        "row_cnt_ptr": "i32",
    }
    constexprs = {"NVFP4": False, "GSCALE": False, "GROUPED": True, "EXPERT": True, "P_PAD": 256, "SHARED": shared,
                  "EVEN_K": True, "WORDS": False, "USE_DOT": True, "PRECISION": "tf32", "BLOCK_M": 16,
                  "BLOCK_K": 128, "PDL": True}  # fmt: skip
    if kernel == "_moe_gate_up_kernel":
        constexprs.update(SPLIT_K=1, BLOCK_I=64)
    else:
        constexprs.update(TOPK=6, NSLOTS=6 + shared, BLOCK_N=128, NORM=False, N_PAD=1, SLOTS_HERE=slots_here)
    names = inspect.signature(getattr(moe_triton, kernel).fn).parameters
    pointers = {k: v for k, v in pointers.items() if k in names}
    loads, waits = _compile("flint_kernels.moe_triton", kernel, pointers, constexprs, 4, 3)
    # Shared-expert blocks of gate_up load their first weights before waiting (they need no ids).
    assert (loads == 0 or (shared and kernel == "_moe_gate_up_kernel")) and waits >= 1


@pytest.mark.parametrize("fmt", ["nvfp4", "bf16"])
@pytest.mark.parametrize("kernel", ["_moe_gate_up_kernel", "_moe_down_kernel"])
def test_moe_decode_with_shared_expert_compiles_for_sm90(kernel: str, fmt: str) -> None:
    """The decode kernels with the shared expert folded in (runtime branches choosing weight pointers)."""
    nv = fmt == "nvfp4"
    wdt = "u8" if nv else "bf16"
    pointers = {"x_ptr": "bf16", "h_ptr": "bf16", "ids_ptr": "i64", "order_ptr": "i64", "meta_ptr": "i64",
                "tw_ptr": "fp32", "w_ptr": wdt, "s_ptr": wdt, "gs_ptr": "fp32" if nv else "bf16",
                "sw_ptr": wdt, "ss_ptr": wdt, "sgs_ptr": "fp32" if nv else "bf16", "out_ptr": "bf16",
                "ws_ptr": "fp32", "cnt_ptr": "i32", "res_ptr": "bf16", "nw_ptr": "fp32", "hn_ptr": "bf16",
                "res_out_ptr": "bf16", "row_cnt_ptr": "i32"}  # fmt: skip
    if nv:
        tiles = dict(USE_DOT=False, BLOCK_M=1, BLOCK_K=512)
    else:
        tiles = dict(USE_DOT=True, BLOCK_M=16, BLOCK_K=128)
    constexprs = {"NVFP4": nv, "GROUPED": False, "EXPERT": False, "P_PAD": 1, "SHARED": True, "EVEN_K": True,
                  "WORDS": False, "PRECISION": "tf32", "PDL": True, **tiles}  # fmt: skip
    if kernel == "_moe_down_kernel":
        constexprs["SLOTS_HERE"] = False
    if kernel == "_moe_gate_up_kernel":
        constexprs.update(SPLIT_K=2, BLOCK_I=16)
    else:
        constexprs.update(TOPK=6, NSLOTS=7, BLOCK_N=32, NORM=True, N_PAD=2048)  # with the add+RMSNorm epilogue
    import inspect

    from flint_kernels import moe_triton

    names = inspect.signature(getattr(moe_triton, kernel).fn).parameters
    pointers = {k: v for k, v in pointers.items() if k in names}
    loads, waits = _compile("flint_kernels.moe_triton", kernel, pointers, constexprs, 4, 1 if nv else 3)
    if kernel == "_moe_down_kernel":  # ids, routing weights and expert weights before the wait (the router's done)
        assert loads > 0 and waits >= 1
    else:  # routed programs wait first; shared-expert programs after their first weight loads
        assert waits >= 2


@pytest.mark.parametrize(
    "fmt,block_n,shared_slots",
    [("nvfp4", 1, False), ("nvfp4", 2, False), ("bf16", 1, False), ("bf16", 2, False), ("nvfp4", 2, True),
     ("ready", 2, True), ("nvfp4", 4, True), ("bf16", 2, True)],
)  # fmt: skip
def test_moe_down_token_slots_compiles_for_sm90(fmt: str, block_n: int, shared_slots: bool) -> None:
    """The down of a program a (tile, token) at Flint's shapes with the shared expert (in a tile of its own or in the
    padding slots, `MoEConfig.dn_shared_slots`; engine or ready codes): the ids, routing weights and every slot's
    weight rows are requested before the one PDL wait."""
    nv = fmt != "bf16"
    wdt = {"nvfp4": "u8", "ready": "i8", "bf16": "bf16"}[fmt]
    sdt = "u8" if nv else "bf16"
    pointers = {"h_ptr": "bf16", "ids_ptr": "i64", "tw_ptr": "fp32", "w_ptr": wdt, "s_ptr": sdt, "gs_ptr": "fp32",
                "out_ptr": "bf16", "sw_ptr": wdt, "ss_ptr": sdt, "sgs_ptr": "fp32"}  # fmt: skip
    constexprs = {"NVFP4": nv, "GSCALE": nv, "SHARED": True, "TOPK": 6, "S_PAD": 8, "EVEN_K": True, "EVEN_KS": True,
                  "BLOCK_N": block_n, "BLOCK_K": 512, "BLOCK_KS": 1024, "PDL": True}  # fmt: skip
    kernel = "_moe_down_shared_slots_kernel" if shared_slots else "_moe_down_slots_kernel"
    loads, waits = _compile("flint_kernels.moe_down_slots_triton", kernel, pointers, constexprs, 4, 1)
    # ids and weights (2), each slot's code or value loads and the shared expert's: more than the 8 slots
    assert loads > 8 and waits == 1


def test_router_compiles_for_sm90() -> None:
    pointers = {"x_ptr": "bf16", "w_ptr": "fp32", "logits_ptr": "fp32", "cnt_ptr": "i32", "out_w_ptr": "fp32",
                "out_ids_ptr": "i64"}  # fmt: skip
    constexprs = dict(BLOCK_T=1, BLOCK_E=1, BLOCK_K=2048, EVEN_K=True, TOP_K=6, K_PAD=8, E_PAD=256, ROWS=1,
                      RENORMALIZE=True, PDL=True)  # fmt: skip
    loads, waits = _compile("flint_kernels.router_triton", "_router_kernel", pointers, constexprs, 4, 1)
    assert loads > 0 and waits == 1  # the router's weights before waiting for the previous kernel


def test_router_top_k_launch_compiles_for_sm90() -> None:
    """`RouterSmallConfig.tail_launch`: the batch-1 router with its norm prologue and no tail still loads its weights
    before its PDL wait, and the one-program top-k launch waits before it reads anything (the logits are the previous
    kernel's)."""
    pointers = {"x_ptr": "bf16", "res_ptr": "bf16", "norm_w_ptr": "fp32", "normed_ptr": "bf16", "new_res_ptr": "bf16",
                "w_ptr": "fp32", "logits_ptr": "fp32"}  # fmt: skip
    constexprs = dict(BLOCK_T=1, BLOCK_E=1, BLOCK_K=2048, EVEN_K=True, PDL=True)
    loads, waits = _compile("flint_kernels.router_triton", "_router_norm_logits_kernel", pointers, constexprs, 4, 1)
    assert loads > 0 and waits == 1
    pointers = {"logits_ptr": "fp32", "out_w_ptr": "fp32", "out_ids_ptr": "i64"}
    constexprs = dict(TOP_K=6, K_PAD=8, E_PAD=256, ROWS=1, RENORMALIZE=True, PDL=True)
    loads, waits = _compile("flint_kernels.router_triton", "_router_topk_kernel", pointers, constexprs, 4, 1)
    assert loads == 0 and waits == 1


@pytest.mark.parametrize(
    ("presplit", "e_pad", "split_k"),
    [(True, 256, 1), (False, 256, 1), (True, 128, 1), (True, 256, 8)],
    ids=["presplit", "split-in-kernel", "one-pass", "split-k"],
)
def test_router_tiles_compile_for_sm90(presplit: bool, e_pad: int, split_k: int) -> None:
    """The many-token router at its 8K-prefill tiles (128 x 128): BF16 MMAs from pre-split or in-kernel-split
    weights, top-k in the last tile to arrive (Flint's 256 experts) or in the tile itself (128 experts); and at
    batch 32 with K split 8 ways (32 x 16 tiles)."""
    pointers = {"x_ptr": "bf16", "w_ptr": "fp32", "split_ptr": "bf16", "logits_ptr": "fp32", "cnt_ptr": "i32",
                "out_w_ptr": "fp32", "out_ids_ptr": "i64"}  # fmt: skip
    tiles = dict(BLOCK_T=128, BLOCK_E=128, BLOCK_K=64) if split_k == 1 else dict(BLOCK_T=32, BLOCK_E=16, BLOCK_K=128)
    constexprs = dict(**tiles, EVEN_K=True, TOP_K=6, K_PAD=8, E_PAD=e_pad, ROWS=16, SPLIT=True, PRESPLIT=presplit,
                      RENORMALIZE=True, SPLIT_K=split_k, PDL=True)  # fmt: skip
    _, waits = _compile("flint_kernels.router_triton", "_router_tiles_kernel", pointers, constexprs, 8, 3)
    assert waits == 1


@pytest.mark.parametrize("add", [False, True], ids=["routed", "plus-shared"])
def test_moe_reduce_compiles_for_sm90(add: bool) -> None:
    """The slot reduce, also adding the shared expert's output (run apart) after rounding the routed sum."""
    pointers = {"y_ptr": "bf16", "tw_ptr": "fp32", "out_ptr": "bf16", "add_ptr": "bf16"}
    constexprs = dict(TOPK=6, BLOCK_H=1024, ADD=add, PDL=True)
    _, waits = _compile("flint_kernels.moe_triton", "_moe_reduce_kernel", pointers, constexprs, 4, 1)
    assert waits == 1


@pytest.mark.parametrize("add", [False, True], ids=["routed", "plus-shared"])
def test_moe_reduce_sorted_compiles_for_sm90(add: bool) -> None:
    """The grouped-GEMM path's slot reduce, each pair's row read through the sort's inverse permutation."""
    pointers = {"y_ptr": "bf16", "pos_ptr": "i64", "tw_ptr": "fp32", "out_ptr": "bf16", "add_ptr": "bf16"}
    constexprs = dict(TOPK=6, BLOCK_H=1024, ADD=add, PDL=True)
    _, waits = _compile("flint_kernels.moe_grouped_gemm", "_moe_reduce_sorted_kernel", pointers, constexprs, 4, 1)
    assert waits == 1


@pytest.mark.parametrize("add", [False, True], ids=["routed", "plus-shared"])
def test_moe_reduce_sorted_scaled_compiles_for_sm90(add: bool) -> None:
    """The sorted reduce over FP32 down accumulators of NVFP4 copies, each scaled by its expert's global scale."""
    pointers = {"y_ptr": "fp32", "pos_ptr": "i64", "ids_ptr": "i64", "gs_ptr": "fp32", "tw_ptr": "fp32",
                "out_ptr": "bf16", "add_ptr": "bf16"}  # fmt: skip
    constexprs = dict(TOPK=6, BLOCK_H=1024, ADD=add, PDL=True)
    kernel = "_moe_reduce_sorted_scaled_kernel"
    _, waits = _compile("flint_kernels.moe_grouped_gemm", kernel, pointers, constexprs, 4, 1)
    assert waits == 1


def test_scaled_silu_and_mul_compiles_for_sm90() -> None:
    """SiLU-and-mul of FP32 gate_up accumulators, each row's expert found in the sorted groups' end rows."""
    pointers = {"gu_ptr": "fp32", "offs_ptr": "i32", "gs_ptr": "fp32", "out_ptr": "bf16"}
    constexprs = dict(UP_SCALE=1, E_PAD=256, BLOCK=512, PDL=True)
    _, waits = _compile("flint_kernels.moe_grouped_gemm", "_scaled_silu_and_mul_kernel", pointers, constexprs, 4, 1)
    assert waits == 1


def test_silu_and_mul_rows_compiles_for_sm90() -> None:
    """The prefill's SiLU-and-mul, 4 rows a program."""
    pointers = {"gate_up_ptr": "bf16", "out_ptr": "bf16"}
    constexprs = dict(ROWS=4, BLOCK=512, PDL=True)
    _, waits = _compile("flint_kernels.activation_triton", "_silu_and_mul_rows_kernel", pointers, constexprs, 4, 1)
    assert waits == 1


@pytest.mark.parametrize("kernel", ["_count_kernel", "_blocks_kernel", "_scatter_kernel", "_rank_kernel"])
def test_moe_align_compiles_for_sm90(kernel: str) -> None:
    """The prefill MoE's grouping launches (int32 atomics, the block table's binary search; the grouped GEMM's ranks)
    with PDL."""
    pointers = {
        "_count_kernel": {"ids_ptr": "i64", "counts_ptr": "i32"},
        "_blocks_kernel": {"counts_ptr": "i32", "cursor_ptr": "i32", "scratch_ptr": "i32", "meta_ptr": "i32"},
        "_scatter_kernel": {"ids_ptr": "i64", "cursor_ptr": "i32", "order_ptr": "i64"},
        "_rank_kernel": {"ids_ptr": "i64", "cursor_ptr": "i32", "src_ptr": "i64", "pos_ptr": "i64"},
    }[kernel]
    constexprs: dict = {"PDL": True}
    if kernel == "_blocks_kernel":
        constexprs.update(BLOCK_M=64, E_PAD=256, STEPS=9, CHUNK=1024)
    else:
        constexprs.update(BLOCK=1024)
    if kernel == "_rank_kernel":
        constexprs.update(TOPK=6)
    _, waits = _compile("flint_kernels.moe_align_triton", kernel, pointers, constexprs, 4, 1)
    assert waits == 1


@pytest.mark.parametrize(
    ("splits", "qkv", "prefetch"),
    [(1, False, 0), (8, False, 0), (1, True, 0), (8, True, 0), (8, False, 2), (1, True, 1)],
)
def test_decode_attention_compiles_for_sm90(splits: int, qkv: bool, prefetch: int) -> None:
    """Also with QKV (`qkv_attention`: Q/K norm, RoPE and the cache write in the launch; its mul.rn inline PTX),
    and with key tiles requested into L2 before the PDL wait (PREFETCH: the block table and L2 prefetches first)."""
    pointers = {"q_ptr": "bf16", "k_ptr": "bf16", "v_ptr": "bf16", "bt_ptr": "i32", "qs_ptr": "i32", "sl_ptr": "i32",
                "sink_ptr": "fp32", "out_ptr": "bf16", "part_acc_ptr": "fp32", "part_m_ptr": "fp32",
                "part_l_ptr": "fp32", "cnt_ptr": "i32", "qn_ptr": "fp32", "kn_ptr": "fp32", "cos_ptr": "bf16",
                "sin_ptr": "bf16", "slot_ptr": "i64"}  # fmt: skip
    constexprs = dict(NUM_HEADS=32, GROUP=8, G_PAD=16, G_P2=8, WINDOW=513, CACHE_BLOCK=16, HEAD_DIM=128, BLOCK_D=128,
                      BLOCK_N=128, NUM_SPLITS=splits, FUSED_COMBINE=splits > 1, SPLIT_STEP=min(splits, 16),
                      DOT_PREC="tf32", QKV=qkv, HAS_ROPE=qkv, PTX_MUL=qkv, PREFETCH=prefetch, LINES=2, LINE_ELEMS=64,
                      PDL=True)  # fmt: skip
    loads, waits = _compile("flint_kernels.attention_triton", "_decode_kernel", pointers, constexprs, 4, 2)
    # The batch metadata (3 loads) before waiting for the previous kernel; with PREFETCH the block table and the
    # tiles' L2 prefetches too.
    assert waits == 1 and (loads > 3 if prefetch else loads == 3), loads


def test_decode_merge_kernel_compiles_for_sm90() -> None:
    """The decode splits' merge as a launch of its own (`combine_launch`): only the batch metadata (2 loads) before
    waiting for the decode launch, whose partials it merges."""
    pointers = {"part_acc_ptr": "fp32", "part_m_ptr": "fp32", "part_l_ptr": "fp32", "qs_ptr": "i32",
                "sink_ptr": "fp32", "out_ptr": "bf16"}  # fmt: skip
    constexprs = dict(NUM_HEADS=32, GROUP=8, G_P2=8, HEAD_DIM=128, BLOCK_D=128, NUM_SPLITS=8, SPLIT_STEP=8, PDL=True)
    loads, waits = _compile("flint_kernels.attention_triton", "_decode_merge_kernel", pointers, constexprs, 4, 1)
    assert waits == 1 and loads == 2, loads


def test_router_norm_kernel_compiles_for_sm90() -> None:
    """The one-launch kernel compiles for Hopper (sm_90, no GPU needed) at Flint's 4 tokens x 2048 with PDL, and
    reads before the wait for the previous kernel only what no kernel writes: the plain router's early loads (its
    weight row) plus as many for the FP32 norm weight (as long as that row); x and the residual come after it."""
    pointers = {"x_ptr": "bf16", "res_ptr": "bf16", "norm_w_ptr": "fp32", "normed_ptr": "bf16",
                "new_res_ptr": "bf16", "w_ptr": "fp32", "logits_ptr": "fp32", "cnt_ptr": "i32", "out_w_ptr": "fp32",
                "out_ids_ptr": "i64"}  # fmt: skip
    constexprs = dict(BLOCK_T=4, BLOCK_E=1, BLOCK_K=2048, EVEN_K=True, TOP_K=6, K_PAD=8, E_PAD=256, ROWS=4,
                      RENORMALIZE=True, PDL=True)  # fmt: skip
    plain = {k: v for k, v in pointers.items() if k not in ("res_ptr", "norm_w_ptr", "normed_ptr", "new_res_ptr")}
    plain_loads, _ = _compile("flint_kernels.router_triton", "_router_kernel", plain, constexprs, 4, 1)
    loads, waits = _compile("flint_kernels.router_triton", "_router_norm_kernel", pointers, constexprs, 4, 1)
    assert waits == 1 and plain_loads > 0
    assert loads == 2 * plain_loads


@pytest.mark.parametrize("kc", [32, 128])
def test_sampler_chunk_kernel_compiles_for_sm90(kc: int) -> None:
    """The sampler's chunk top-k at Flint's 4096-key chunks, cut in two levels of sorted rows (`chunk_levels`)."""
    sub, levels, final = {32: (128, 2, 256), 128: (512, 2, 256)}[kc]
    pointers = {"logits_ptr": "fp32", "temp_ptr": "fp32", "cand_ptr": "i64"}
    constexprs = dict(BLOCK=4096, KC=kc, SUB=sub, LEVELS=levels, FINAL=final)
    loads, waits = _compile("flint_kernels.sampling_triton", "_chunk_top_kernel", pointers, constexprs, 4, 1)
    assert loads > 0 and waits == 0  # the sampler launches without PDL


def test_sampler_filtered_kernels_compile_for_sm90() -> None:
    """The filtered sampler kernels (`FILTER`) at Flint's sizes: the chunk top-k over 4096-key chunks (the gathered
    keys cut once, the fallback in two levels) and the draw."""
    pointers = {"logits_ptr": "fp32", "temp_ptr": "fp32", "cand_ptr": "i64", "gather_ptr": "i64"}
    constexprs = dict(BLOCK=4096, KC=32, SUB=128, LEVELS=2, FINAL=256, CAP=512, CAP_SUB=128, CAP_LEVELS=1,
                      CAP_FINAL=128)  # fmt: skip
    loads, waits = _compile("flint_kernels.sampling_triton", "_chunk_filter_kernel", pointers, constexprs, 4, 1)
    assert loads > 0 and waits == 0
    # The draw over Flint's 37 chunks' candidates (P = 2048), its gathered candidates cut once.
    pointers = {"cand_ptr": "i64", "gather_ptr": "i64", "temp_ptr": "fp32", "top_k_ptr": "i64", "top_p_ptr": "fp32",
                "min_p_ptr": "fp32", "seed_ptr": "i64", "step_ptr": "i64", "out_ptr": "i64"}  # fmt: skip
    constexprs = dict(P=2048, KC=32, SUB=128, LEVELS=2, FINAL=128, CAP=256, CAP_SUB=128, CAP_LEVELS=1, CAP_FINAL=64)
    loads, waits = _compile("flint_kernels.sampling_triton", "_draw_filter_kernel", pointers, constexprs, 4, 1)
    assert loads > 0 and waits == 0


@pytest.mark.parametrize("chosen", [None, "0"])
def test_fp_fusion_stays_on_unless_the_user_chose(chosen: str | None) -> None:
    """Importing flint_kernels keeps Triton's multiply-add fusion on (Triton 3.10 turns its default off), and the
    NVFP4 GEMV's products then compile to FFMA; a user's own TRITON_DEFAULT_FP_FUSION is left alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    if chosen is not None:
        env["TRITON_DEFAULT_FP_FUSION"] = chosen
    code = f"""
import os, sys
sys.path.insert(0, {str(BENCHMARKS)!r})
import flint_kernels
from kernel_sass import compile_sm90
ptx = compile_sm90("flint_kernels.gemv_triton", "_linear_kernel",
    {{"x_ptr": "bf16", "w_ptr": "u8", "s_ptr": "u8", "gs_ptr": "fp32", "out_ptr": "bf16", "ws_ptr": "fp32",
      "cnt_ptr": "i32", "res_ptr": "bf16", "nw_ptr": "fp32", "h_ptr": "bf16", "res_out_ptr": "bf16",
      "row_cnt_ptr": "i32"}},
    dict(NVFP4=True, USE_DOT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=256, WORDS=0, PRECISION="tf32", EVEN_K=True,
         SPLIT_K=1, NORM=False, N_PAD=1, NORM_IN=False, PDL=True), 4)[1]
print(os.environ["TRITON_DEFAULT_FP_FUSION"], sum("fma.rn.f32" in line for line in ptx.splitlines()))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    value, fmas = r.stdout.split()[-2:]
    assert value == (chosen or "1")
    assert (int(fmas) > 0) == (value == "1"), fmas


def test_prefill_attention_copies_its_key_tiles_16_bytes_at_a_time() -> None:
    """The sliding prefill's tiles (the H200 table's 64 x 64, 2 stages) as the engine's aligned strides compile them:
    K and V in 16-byte asynchronous copies in every key loop and no 2-byte loads (compiled without the strides'
    alignment, as `kernel_sass.compile_sm90` did before `aligned`, every K/V element is a load of its own), and a
    small stack (64 bytes with Triton 3.9 here; a full layer's 128 x 128 tiles spilled 168 before the edge masks)."""
    code = f"""
import sys
sys.path.insert(0, {str(BENCHMARKS)!r})
from kernel_sass import compile_sm90, disassemble
pointers = {{"q_ptr": "bf16", "k_ptr": "bf16", "v_ptr": "bf16", "bt_ptr": "i32", "qs_ptr": "i32", "sl_ptr": "i32",
            "sink_ptr": "fp32", "out_ptr": "bf16"}}
cx = dict(GROUP=8, G_PAD=8, BLOCK_Q=8, WINDOW=513, CACHE_BLOCK=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=64,
          DOT_PREC="tf32", LONGEST_FIRST=True)
cubin, _ = compile_sm90("flint_kernels.attention_triton", "_prefill_kernel", pointers, cx, 4, 2, aligned=True)
code, res = disassemble(cubin)
ops = [op.split(None, 1)[1] if op.startswith("@") else op for _, op in code]
print(sum(o.startswith("LDGSTS.E.BYPASS.128") for o in ops), sum(o.startswith("LDG.E.U16") for o in ops),
      res.get("STACK", 0))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    copies, narrow, stack = (int(x) for x in r.stdout.split()[-3:])
    assert copies >= 3 * 16 and narrow == 0 and stack <= 256, (copies, narrow, stack)


def test_add_sinks_compiles_for_sm90() -> None:
    """The sinks after cuDNN's attention: its BF16 output scaled by sigmoid(lse - sink) into the batch's rows."""
    pointers = {"o_ptr": "bf16", "lse_ptr": "fp32", "sinks_ptr": "fp32", "dst_ptr": "bf16"}
    constexprs = dict(HEAD_DIM=128, BLOCK_T=16, BLOCK_D=128, PDL=True)
    _, waits = _compile("flint_kernels.attention_cudnn", "_add_sinks_kernel", pointers, constexprs, 4, 1)
    assert waits == 1


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("a_dtype", ["bf16", "fp32"])
def test_prefix_merge_compiles_for_sm90(sinks: bool, a_dtype: str) -> None:
    """The merge of a chunk's prefix segments: cuDNN's BF16 part or the FP32 state with the next part, into the FP32
    state, or with the sinks into the batch's BF16 rows."""
    pointers = {"a_ptr": a_dtype, "a_lse_ptr": "fp32", "b_ptr": "bf16", "b_lse_ptr": "fp32", "sinks_ptr": "fp32",
                "dst_ptr": "bf16" if sinks else "fp32", "dst_lse_ptr": "fp32"}  # fmt: skip
    constexprs = dict(HEAD_DIM=128, BLOCK_T=16, BLOCK_D=128, SINKS=sinks, PDL=True)
    _, waits = _compile("flint_kernels.attention_cudnn", "_merge_kernel", pointers, constexprs, 4, 1)
    assert waits == 1


def test_manifest_registers_compiles_a_recorded_variant(tmp_path: Path) -> None:
    """benchmarks/manifest_registers.py on a manifest of two recorded variants (the decode and prefill SiLU): each
    compiled from its spec with its alignment, its registers read, neither spilling; a repeated entry counted once."""
    shipped = json.loads((BENCHMARKS.parent / "kernels" / "precompile" / "nvidia-h200.json").read_text())
    entries = [e for p in shipped["profiles"].values() for e in p if "silu_and_mul" in e["kernel"]][:2]
    assert len({e["kernel"] for e in entries}) == 2
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"profiles": {"p": [*entries, entries[0]]}}))
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = BENCHMARKS / "manifest_registers.py"
    r = subprocess.run([sys.executable, str(script), "--manifest", str(manifest), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(0 < r["REG"] <= 255 and not r["spills"] for r in rows), rows
    assert {r["constants"]["PDL"] for r in rows} == {True}


def test_l2_prefetch_chunks_compiles_for_sm90() -> None:
    """The side stream's prefetch kernel: its table's two words and one L2 prefetch a line, no PDL wait."""
    loads, waits = _compile("flint_kernels.l2_prefetch", "_prefetch_chunks_kernel", {"table_ptr": "i64"},
                            {"LINES": 256}, 4, 1)  # fmt: skip
    assert loads >= 3 and waits == 0


def _ptx_counts(module: str, kernel: str, pointers: dict, constexprs: dict, warps: int, stages: int,
                needles: tuple[str, ...]) -> list[int]:  # fmt: skip
    """How many PTX lines of `kernel` compiled for sm_90 (in a fresh process, as `_compile`) contain each needle."""
    code = f"""
import sys
sys.path.insert(0, {str(BENCHMARKS)!r})
from kernel_sass import compile_sm90
_, ptx = compile_sm90({module!r}, {kernel!r}, {pointers!r}, {constexprs!r}, {warps}, {stages}, aligned=True)
print(*[sum(n in line for line in ptx.splitlines()) for n in {needles!r}])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return [int(v) for v in r.stdout.split()[-len(needles) :]]


TMA_NEEDLES = ("wgmma.mma_async", "cp.async.bulk.tensor", "griddepcontrol.wait")


@pytest.mark.parametrize("gather", [True, False], ids=["gather", "sorted-copy"])
@pytest.mark.parametrize("gscale", [False, True], ids=["bf16", "nvfp4-copies"])
def test_moe_grouped_tma_gate_up_compiles_for_sm90(gather: bool, gscale: bool) -> None:
    """The TMA-fed gate_up (H200 table tiles: 128-row blocks, 8 warps, 4 stages): weights by TMA, x's rows by TMA
    or gathered by pointer, on wgmma, with one PDL wait."""
    desc = "tensordesc<bf16[128, 64]>"
    pointers = {"x_desc": desc, "x_ptr": "bf16", "src_ptr": "i64", "meta_ptr": "i32", "w_desc": desc,
                "gs_ptr": "fp32" if gscale else "bf16", "h_ptr": "bf16"}  # fmt: skip
    constexprs = dict(GATHER=gather, GSCALE=gscale, UP_SCALE=1 if gscale else 0, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
                      PDL=True)  # fmt: skip
    mma, tma, waits = _ptx_counts("flint_kernels.moe_grouped_tma_triton", "_gate_up_kernel", pointers, constexprs, 8, 4,
                                  TMA_NEEDLES)  # fmt: skip
    assert mma > 0 and tma > 0 and waits == 1


def test_moe_grouped_tma_down_compiles_for_sm90() -> None:
    """The TMA-fed down (64-row blocks, 4 warps, 4 stages): both operands by TMA, on wgmma, one PDL wait."""
    pointers = {"h_desc": "tensordesc<bf16[64, 64]>", "meta_ptr": "i32", "w_desc": "tensordesc<bf16[128, 64]>",
                "gs_ptr": "bf16", "y_ptr": "bf16"}  # fmt: skip
    constexprs = dict(GSCALE=False, BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, PDL=True)
    mma, tma, waits = _ptx_counts("flint_kernels.moe_grouped_tma_triton", "_down_kernel", pointers, constexprs, 4, 4,
                                  TMA_NEEDLES)  # fmt: skip
    assert mma > 0 and tma >= 2 and waits == 1


@pytest.mark.parametrize("packed", [0, 1], ids=["planes", "packed"])
@pytest.mark.parametrize("block_m", [64, 128])
def test_moe_grouped_tma_nvfp4_twins_compile_for_sm90(block_m: int, packed: int) -> None:
    """The launches that decode NVFP4 in registers (byte planes, or packed pairs by FMA.BF16X2's inline PTX), the
    decoded tile the MMA's left operand, on wgmma, one PDL wait."""
    warps, stages = (4, 3) if block_m == 64 else (4, 2)
    desc = f"tensordesc<bf16[{block_m}, 64]>"
    pointers = {"x_desc": desc, "x_ptr": "bf16", "src_ptr": "i64", "meta_ptr": "i32", "w_ptr": "u8", "s_ptr": "u8",
                "gs_ptr": "fp32", "h_ptr": "bf16"}  # fmt: skip
    constexprs = dict(GATHER=True, UP_SCALE=1, PACKED=packed, BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=64, PDL=True)
    mma, _, waits = _ptx_counts("flint_kernels.moe_grouped_tma_triton", "_gate_up_nvfp4_kernel", pointers, constexprs,
                                warps, stages, TMA_NEEDLES)  # fmt: skip
    assert mma > 0 and waits == 1
    pointers = {"h_desc": desc, "meta_ptr": "i32", "w_ptr": "u8", "s_ptr": "u8", "gs_ptr": "fp32", "y_ptr": "bf16"}
    constexprs = dict(PACKED=packed, BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=64, PDL=True)
    mma, tma, waits = _ptx_counts("flint_kernels.moe_grouped_tma_triton", "_down_nvfp4_kernel", pointers, constexprs,
                                  warps, stages, TMA_NEEDLES)  # fmt: skip
    assert mma > 0 and tma > 0 and waits == 1
