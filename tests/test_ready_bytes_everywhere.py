"""Ready bytes in the place of the weight's own (`FLINT_MMA_READY_SCALES=replace`, `FLINT_MMA_READY_CODES=replace`):
the codec decodes them to the same floats, a replaced weight keeps its values and its size, and every Triton path
outside the MMA kernels (the FMA and tensor-core GEMV tiles, the prefill copy kernel, the MoE's decode and grouped
launches, the TMA-fed prefill launches) gives the same bits from them as from the UE4M3 bytes and the engine's codes,
under the interpreter in FP32 and FP16. (The MMA kernels' own tests are in test_nvfp4_mma.py, test_nvfp4_mma_moe.py and
test_nvfp4_mma_codes.py.)"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from flint_kernels import gemv_triton as gt
from flint_kernels import moe_triton as mt
from flint_kernels import nvfp4, nvfp4_mma_codes, nvfp4_mma_scales
from kernel_checks import random_nvfp4, random_nvfp4_experts, replaced, routing

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
interpreted = pytest.mark.skipif(
    not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


# What a replaced weight holds in its own bytes' place: ready scale bytes, ready codes, or both.
KINDS = ["scales", "codes"]


def test_ready_bytes_decode_to_the_ue4m3_floats() -> None:
    """All 256 UE4M3 bytes: their ready bytes decode (`nvfp4.ready_to_float`, through `scales_to_float`) to the same
    float32 bits; where the UE4M3 byte decodes to zero the ready byte is 0, which decodes to the smallest subnormal
    (its block's codes are zeroed instead, `make_ready`)."""
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = nvfp4.ue4m3_to_float(b)
    ready = nvfp4_mma_scales.ready_bytes(b)
    got = nvfp4.scales_to_float(ready)
    zero = nvfp4_mma_scales.zero_scale(b)
    assert torch.equal(got[~zero].view(torch.int32), want[~zero].view(torch.int32))
    assert (ready[zero] == 0).all() and (got[zero] == 2.0**-10).all() and got[1] == 2.0**-10


@pytest.mark.parametrize("kind", [*KINDS, "both"])
def test_a_replaced_weight_keeps_its_values_and_its_size(kind: str) -> None:
    """`make_ready(replace=True)`: one byte a block and half a byte a value (the weight's bytes as before) and the
    dequantised values, nonzero ones bit for bit (zero-scale blocks planted: their zeros may lose a sign, as
    `nvfp4_mma_scales` says)."""
    w = random_nvfp4(64, 256, torch.Generator().manual_seed(3), (64,))
    before, nbytes = w.dequantize(torch.float32), w.nbytes
    r = replaced(w, kind)
    after = r.dequantize(torch.float32)
    assert r.nbytes == nbytes
    assert torch.equal(after, before)
    nonzero = before != 0
    assert torch.equal(after[nonzero].view(torch.int32), before[nonzero].view(torch.int32))


def test_replace_is_a_setting_and_wants_ready_bytes_on_any_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FLINT_MMA_READY_SCALES=replace` and `FLINT_MMA_READY_CODES=replace` ask for ready bytes whatever the device's
    table says (`prepare` keeps to CUDA weights), and the model builder's hook then replaces the weight's own."""
    monkeypatch.setenv("FLINT_MMA_READY_SCALES", "replace")
    monkeypatch.setenv("FLINT_MMA_READY_CODES", "replace")
    assert nvfp4_mma_scales.setting() == "replace" and nvfp4_mma_codes.setting() == "replace"
    assert nvfp4_mma_scales.wanted(torch.device("cpu")) and nvfp4_mma_codes.wanted(torch.device("cpu"))
    w = random_nvfp4(16, 128, torch.Generator().manual_seed(4), (16,))
    nvfp4_mma_scales.prepare(w)  # a CPU weight: left as it is
    nvfp4_mma_codes.prepare(w)
    assert w.ready_scales is None and w.scales.dtype == torch.uint8
    assert w.ready_codes is None and w.qweight.dtype == torch.uint8


@interpreted
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 3, 8, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_linear_paths_read_replaced_bytes(m: int, dtype: torch.dtype, kind: str) -> None:
    """`gemv_triton.linear` and `lm_head` (FMA tiles at M = 1, tensor-core tiles above), the
    FMA and tensor-core tile configs forced, and the prefill copy kernel: the same bits from ready bytes."""
    g = gen(m)
    w = random_nvfp4(120, 288, g, (72, 32, 16))
    r = replaced(w, kind)
    x = (torch.randn(m, 288, generator=g, device=DEVICE) * 0.5).to(dtype)
    assert torch.equal(gt.linear(x, r), gt.linear(x, w))
    assert torch.equal(gt.lm_head(x, r), gt.lm_head(x, w))
    fma = gt.TileConfig(block_n=16, block_m=1, block_k=64, use_dot=False, num_warps=4, num_stages=1)
    dot = gt.TileConfig(32, 16 if m <= 16 else 64, 64, True, 4, 2)
    packed = dataclasses.replace(dot, packed=True)
    for cfg in (fma, dot, packed):
        if cfg is fma and m > 1:
            continue
        assert torch.equal(gt._matmul(x, r, False, config=cfg), gt._matmul(x, w, False, config=cfg)), cfg
    assert torch.equal(gt.dequantize(r, dtype), gt.dequantize(w, dtype))


@interpreted
@pytest.mark.parametrize("kind", [*KINDS, "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_word_plane_tiles_read_replaced_bytes(dtype: torch.dtype, kind: str) -> None:
    """The tensor-core tiles on int32 nibble planes (`words`, `nvfp4_dot_step`: BLOCK_K >= 128, so K in whole and
    partial tiles) and the default linear with ready scale bytes and ready codes together: the same bits."""
    g = gen(7)
    w = random_nvfp4(48, 384, g, (32, 16))
    r = replaced(w, kind)
    x = (torch.randn(5, 384, generator=g, device=DEVICE) * 0.5).to(dtype)
    words = gt.TileConfig(16, 16, 128, True, 4, 2, words=True)
    assert gt.decode_mode(words, x.dtype) == 1
    partial = dataclasses.replace(words, block_k=256)  # 384 = one whole tile and half of one
    for cfg in (words, partial):
        got = gt._matmul(x, r, False, config=cfg)
        assert torch.equal(got, gt._matmul(x, w, False, config=cfg)), cfg
    ref = x.double() @ w.dequantize(with_global=True).double().T  # FP32 sums in another order; FP16 out: 2**-10
    assert torch.allclose(got.double(), ref, rtol=2e-3, atol=1e-3 * ref.abs().max().item())
    assert torch.equal(gt.linear(x, r), gt.linear(x, w))


@interpreted
# The engine's default form only (since the forty-eighth session both scales and codes replaced, where the H200 table
# reads them); each form alone is the linear paths' and word-plane tiles' case above. Each run takes 15-25 s here.
@pytest.mark.parametrize("t", [1, 2])
def test_the_moe_paths_read_replaced_bytes(t: int) -> None:
    """`moe_triton.fused_moe` on its decode path (per-pair FMA tiles, expert-major FMA gate_up, the folded shared
    expert) and its grouped tensor-core path: the same bits from ready scales and codes in the weight's own bytes'
    place."""
    kind = "both"
    g = gen(40 + t)
    e, h, i, k = 6, 128, 48, 3
    x = torch.randn(t, h, generator=g, device=DEVICE)
    tw, ids = routing(t, e, k, g)
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    shared = (random_nvfp4(2 * 2 * i, h, g, (2 * i, 2 * i)), random_nvfp4(h, 2 * i, g, (h,)))
    r13, r2 = replaced(w13, kind), replaced(w2, kind)
    rs = (replaced(shared[0], kind), replaced(shared[1], kind))
    fma = mt.MoEConfig(block_m=1, gu_block_i=16, gu_block_k=32, dn_block_n=32, dn_block_k=32, use_dot=False,
                       num_warps=4, num_stages=1)  # fmt: skip
    expert_major = dataclasses.replace(fma, gu_block_i=32, gu_block_k=64, expert_major=True)
    grouped = mt.MoEConfig(16, 16, 32, 32, 32, True, 4, 2)
    runs = [
        dict(decode_max_tokens=64, config=fma),
        dict(decode_max_tokens=64, config=expert_major),
        dict(decode_max_tokens=64, config=fma, shared=True),
        dict(decode_max_tokens=0, config=grouped),
    ]
    if t == 2:  # what two tokens add: the expert-major gate_up's two-row programs (`_two_rows_nvfp4`)
        runs = [dict(decode_max_tokens=64, config=expert_major)]
    for kw in runs:
        with_shared = kw.pop("shared", False)
        got = mt.fused_moe(x, tw, ids, r13, r2, shared=rs if with_shared else None, **kw)
        want = mt.fused_moe(x, tw, ids, w13, w2, shared=shared if with_shared else None, **kw)
        assert torch.equal(got, want), kw


@interpreted
@pytest.mark.parametrize("packed", [False, True], ids=["planes", "packed"])
def test_the_prefill_twins_read_replaced_bytes(packed: bool) -> None:
    """The TMA-fed launches that decode NVFP4 in registers (`moe_grouped_tma_triton`, byte planes and packed pairs):
    the same bits from ready scales and codes in the weight's own bytes' place (the engine's default form), in FP32
    and FP16."""
    kind = "both"
    from flint_kernels import moe_grouped_tma_triton as mt2
    from flint_kernels.configs import MoETmaConfig

    g = gen(11)
    e, h, i, k, t = 8, 128, 64, 3, 29
    w13 = random_nvfp4_experts(e, 2 * i, h, g, (i, i))
    w2 = random_nvfp4_experts(e, h, i, g, (h,))
    r13, r2 = replaced(w13, kind), replaced(w2, kind)
    cfg = MoETmaConfig(
        block_m=16, gate_up_block_n=16, gate_up_block_k=32, gate_up_stages=2, down_block_n=32, down_block_k=16,
        down_stages=2, packed_decode=packed,
    )  # fmt: skip
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(t, h, generator=g, device=DEVICE).to(dtype)
        tw, ids = routing(t, e - 1, k, g)
        assert mt2.fits(x, r13, r2, cfg)
        assert torch.equal(mt2.routed(x, tw, ids, r13, r2, cfg), mt2.routed(x, tw, ids, w13, w2, cfg)), dtype


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "tokens,kind",
    [(t, "scales") for t in (1, 2, 8, 16, 32, 64, 256, 2048)]
    + [(t, k) for t in (1, 8, 32, 2048) for k in ("codes", "both")],
)
def test_replaced_bytes_on_the_gpu(tokens: int, kind: str) -> None:
    """At Flint's shapes with BF16 activations and the device's table, every path a batch of `tokens` takes (the
    FMA and MMA linears, the MoE's decode paths with the shared expert, the prefill twins) gives the same bits from
    ready bytes in the UE4M3 bytes' and the engine's codes' place."""
    g = gen(tokens)
    w = random_nvfp4(5120, 2048, g, (4096, 512, 512))
    w13 = random_nvfp4_experts(256, 1024, 2048, g, (512, 512))
    w2 = random_nvfp4_experts(256, 2048, 512, g, (2048,))
    shared = (random_nvfp4(2048, 2048, g, (1024, 1024)), random_nvfp4(2048, 1024, g, (2048,)))
    for s in (w, w13, w2, *shared):
        s.global_scale.mul_(1 / 64)
    rw, r13, r2 = replaced(w, kind), replaced(w13, kind), replaced(w2, kind)
    rs = (replaced(shared[0], kind), replaced(shared[1], kind))
    x = (torch.randn(tokens, 2048, generator=g, device=DEVICE) * 0.5).bfloat16()
    scores = torch.rand(tokens, 256, generator=g, device=DEVICE)
    tw, ids = torch.topk(scores, 6, dim=-1)
    tw = tw / tw.sum(-1, keepdim=True)
    assert torch.equal(gt.linear(x, rw), gt.linear(x, w))
    assert torch.equal(mt.fused_moe(x, tw, ids, r13, r2, shared=rs), mt.fused_moe(x, tw, ids, w13, w2, shared=shared))


def test_the_nvfp4_kernels_compile_for_ready_codes_on_sm90() -> None:
    """With ready codes in the codes' place (an int8 code pointer) the NVFP4 kernels outside the MMA ones compile for
    sm_90 (`benchmarks/kernel_sass.py`'s `compile_sm90`) and their decode changes (the PTX is not the engine codes'
    one), without spills: the GEMV tiles (FMA at 1 and 4 rows, tensor cores on byte planes, word planes and packed
    pairs), the MoE's decode kernels with the shared expert, the dequantising copy. (The TMA-fed prefill launches
    decode through the same packed pairs and byte planes.)"""
    import json
    import subprocess
    import sys
    from pathlib import Path

    gemv = {"x_ptr": "bf16", "s_ptr": "u8", "gs_ptr": "fp32", "out_ptr": "bf16", "ws_ptr": "fp32",
            "cnt_ptr": "i32", "res_ptr": "bf16", "nw_ptr": "fp32", "h_ptr": "bf16", "res_out_ptr": "bf16",
            "row_cnt_ptr": "i32"}  # fmt: skip
    common = {"NVFP4": True, "PRECISION": "tf32", "EVEN_K": True, "SPLIT_K": 2, "PDL": True, "NORM": False,
              "N_PAD": 1, "NORM_IN": False}  # fmt: skip
    moe = {"x_ptr": "bf16", "h_ptr": "bf16", "ids_ptr": "i64", "order_ptr": "i64", "meta_ptr": "i64", "tw_ptr": "fp32",
           "s_ptr": "u8", "gs_ptr": "fp32", "ss_ptr": "u8", "sgs_ptr": "fp32", "out_ptr": "bf16", "ws_ptr": "fp32",
           "cnt_ptr": "i32", "res_ptr": "bf16", "nw_ptr": "fp32", "hn_ptr": "bf16", "res_out_ptr": "bf16",
           "row_cnt_ptr": "i32"}  # fmt: skip
    moe_cx = {"NVFP4": True, "GROUPED": False, "EXPERT": False, "P_PAD": 1, "SHARED": True, "EVEN_K": True,
              "WORDS": 0, "PRECISION": "tf32", "PDL": True, "USE_DOT": False, "BLOCK_M": 1, "BLOCK_K": 512}  # fmt: skip
    cases = [
        ("flint_kernels.gemv_triton", "_linear_kernel", gemv,
         {**common, "USE_DOT": False, "BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 1024, "WORDS": 0}, 4, 1),
        ("flint_kernels.gemv_triton", "_linear_kernel", gemv,
         {**common, "USE_DOT": False, "BLOCK_M": 4, "BLOCK_N": 8, "BLOCK_K": 2048, "WORDS": 0}, 4, 1),
        ("flint_kernels.gemv_triton", "_linear_kernel", gemv,
         {**common, "USE_DOT": True, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "WORDS": 0}, 4, 3),
        ("flint_kernels.gemv_triton", "_linear_kernel", gemv,
         {**common, "USE_DOT": True, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "WORDS": 1}, 4, 3),
        ("flint_kernels.gemv_triton", "_linear_kernel", gemv,
         {**common, "USE_DOT": True, "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "WORDS": 2}, 4, 3),
        ("flint_kernels.moe_triton", "_moe_gate_up_kernel", moe, {**moe_cx, "SPLIT_K": 2, "BLOCK_I": 16}, 4, 1),
        ("flint_kernels.moe_triton", "_moe_down_kernel", moe,
         {**moe_cx, "SLOTS_HERE": False, "TOPK": 6, "NSLOTS": 7, "BLOCK_N": 32, "NORM": False, "N_PAD": 1}, 4, 1),
        ("flint_kernels.gemv_triton", "_dequant_kernel", {"s_ptr": "u8", "out_ptr": "bf16"},
         {"EVEN_K": True, "BLOCK_N": 32, "BLOCK_K": 128}, 4, 1),
    ]  # fmt: skip
    code = """
import json, sys, inspect, importlib
sys.path.insert(0, sys.argv[1])
from kernel_sass import compile_sm90, disassemble
out = []
for module, kernel, pointers, cx, warps, stages in json.loads(sys.stdin.read()):
    names = inspect.signature(getattr(importlib.import_module(module), kernel).fn).parameters
    row = []
    for codes in ("u8", "i8"):
        ptrs = {k: v for k, v in dict(pointers, w_ptr=codes, sw_ptr=codes).items() if k in names}
        cubin, ptx = compile_sm90(module, kernel, ptrs, cx, warps, stages, aligned=True)
        _, res = disassemble(cubin)
        row.append([res.get("LOCAL", 0) + res.get("STACK", 0), hash(ptx)])
    out.append(row)
print(json.dumps(out))
"""
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code, str(benchmarks)], input=json.dumps(cases), capture_output=True,
                       text=True, env=env, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    for case, ((spills_u8, ptx_u8), (spills_i8, ptx_i8)) in zip(cases, json.loads(r.stdout.splitlines()[-1])):
        assert ptx_i8 != ptx_u8 and spills_i8 <= spills_u8, (case[1], case[3], spills_u8, spills_i8)
