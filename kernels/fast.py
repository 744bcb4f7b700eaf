"""The fused-kernel op table: each Triton kernel in place of its reference.

Every kernel falls back to its reference for inputs it does not cover. A kernel that fails to compile or launch on
this GPU (an unsupported architecture or Triton version) is replaced by its reference for the rest of the process,
with one warning, rather than failing requests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from .dispatch import Kernels, with_ops
from .l2_prefetch import no_prefetch
from .linear import add_rms_norm_linear_ref, linear_add_rms_norm_ref
from .moe import moe_add_rms_norm_ref
from .qkv_attention import qkv_attention_ref
from .router import add_rms_norm_sigmoid_topk_ref

log = logging.getLogger(__name__)

OPS = (
    "rms_norm",
    "add_rms_norm",
    "qk_norm_rope_write",
    "attention",
    "router",
    "silu_and_mul",
    "moe",
    "linear",
    "lm_head",
    "sample_top_k",
    "add_rms_norm_router",
    # The input add + RMSNorm inside the q|k|v projection's GEMV at one token, where the tuning table sets
    # `norm_prologue` for the shape (H100, forty-fifth session: BF16 b1 -1.7%; NVFP4 b1 +12%, so off there);
    # elsewhere the add+RMSNorm and linear kernels, as without it.
    "add_rms_norm_linear",
    # Does nothing unless the tuning table's `weights_ahead` entry for the step's shape turns a part on.
    "l2_ahead",
)
# Fused only when named in $FLINT_FAST_OPS or the op list: correct (CPU interpreter, H200 tests), but slower on the
# H200 than the two launches each replaces. The add+RMSNorm epilogues (batch-1 step 2.46 vs 2.44 ms NVFP4, 3.12 vs
# 3.07 BF16; 2026-11-29): the last tile's serial normalisation costs more than the norm kernel it removes.
# qkv_attention (2026-11-30, same-call A/B): NVFP4 b1 2.356 vs 2.341 ms, b32 19.84 vs 19.68; BF16 b1 2.701 vs
# 2.707, b32 17.86 vs 17.66: the norm, RoPE and cache write now sit on the attention's critical path, before its
# first key tile, which costs more than the launch it removes.
# (add_rms_norm_linear was one of them until the forty-fifth session: on the H200 2026-11-30 NVFP4 b1 2.424 vs 2.340
# ms, BF16 2.714 vs 2.701; on an H100 with the shorter step of 2026-12-05 BF16 b1 -1.7% twice, so the table turns its
# one-launch path on for BF16 only.)
EXPERIMENTAL_OPS = ("linear_add_rms_norm", "moe_add_rms_norm", "qkv_attention")


def parse_ops(spec: str) -> tuple[str, ...]:
    """The fused ops a $FLINT_FAST_OPS-style list names: FLINT_FAST_OPS=attention,moe,... limits them (for
    bisecting); "all" stands for OPS (every op but the experimental ones), so "all,qkv_attention" adds one and
    "all,-add_rms_norm_router" drops one (names are applied left to right)."""
    chosen: dict[str, None] = {}
    for name in (o.strip() for o in spec.split(",") if o.strip()):
        if name.startswith("-"):
            if name[1:] not in OPS + EXPERIMENTAL_OPS:
                known = ", ".join(OPS + EXPERIMENTAL_OPS)
                raise ValueError(f"unknown fused op {name[1:]!r} in {spec!r}; known: {known}")
            chosen.pop(name[1:], None)
        else:
            chosen.update(dict.fromkeys(OPS if name == "all" else (name,)))
    return tuple(chosen)


def _guarded(name: str, fast: Callable, ref: Callable) -> Callable:
    state = {"fn": fast}

    def call(*args: Any, **kwargs: Any) -> Any:
        fn = state["fn"]
        if fn is ref:
            return ref(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception:
            log.exception("fused kernel for %s failed on this device; using the PyTorch reference from now on", name)
            state["fn"] = ref
            return ref(*args, **kwargs)

    call.__name__ = f"guarded_{name}"
    return call


# What an optional fused op falls back to when it fails: the reference ops it replaces.
_composed: dict[str, Callable] = {
    "linear_add_rms_norm": linear_add_rms_norm_ref,
    "moe_add_rms_norm": moe_add_rms_norm_ref,
    "qkv_attention": qkv_attention_ref,
    "add_rms_norm_router": add_rms_norm_sigmoid_topk_ref,
    "add_rms_norm_linear": add_rms_norm_linear_ref,
    "l2_ahead": no_prefetch,
}


def prepare_nvfp4(w: object) -> None:
    """The MMA kernels' ready bytes of an NVFP4 weight where its device wants them: the scales first, since making
    them zeroes the codes of blocks whose scale is 0, which the ready codes must then hold."""
    from . import nvfp4_mma_codes, nvfp4_mma_scales

    nvfp4_mma_scales.prepare(w)
    nvfp4_mma_codes.prepare(w)


def fast_kernels(base: Kernels, ops: tuple[str, ...] | None = None) -> Kernels:
    """`base` with the fused kernels of `ops` in place (default: $FLINT_FAST_OPS, or every op)."""
    from . import (
        activation_triton,
        attention_triton,
        gemv_triton,
        l2_prefetch,
        moe_triton,
        nvfp4_mma_codes,
        nvfp4_mma_scales,
        qk_norm_rope_triton,
        qkv_attention_triton,
        rmsnorm_triton,
        router_triton,
        sampling_triton,
    )

    fast = {
        "rms_norm": rmsnorm_triton.rms_norm,
        "add_rms_norm": rmsnorm_triton.add_rms_norm,
        "qk_norm_rope_write": qk_norm_rope_triton.qk_norm_rope_write,
        "attention": attention_triton.paged_attention,
        "router": router_triton.sigmoid_topk,
        "silu_and_mul": activation_triton.silu_and_mul,
        "moe": moe_triton.moe,
        "linear": gemv_triton.linear,
        "lm_head": gemv_triton.lm_head,
        "sample_top_k": sampling_triton.sample_top_k,
        "linear_add_rms_norm": gemv_triton.linear_add_rms_norm,
        "moe_add_rms_norm": moe_triton.moe_add_rms_norm,
        "qkv_attention": qkv_attention_triton.qkv_attention,
        "add_rms_norm_router": router_triton.add_rms_norm_sigmoid_topk,
        "add_rms_norm_linear": gemv_triton.add_rms_norm_linear,
        "l2_ahead": l2_prefetch.prefetch_chunks,
    }
    if ops is None:
        ops = parse_ops(os.environ.get("FLINT_FAST_OPS", "all"))
    unknown = set(ops) - set(fast)
    if unknown:
        raise ValueError(f"unknown fused ops {sorted(unknown)}; known: {', '.join(OPS + EXPERIMENTAL_OPS)}")
    table = {name: _guarded(name, fast[name], getattr(base, name) or _composed[name]) for name in ops}
    if "router" in ops:
        table["prepare_router"] = router_triton.prepare
    ready = (nvfp4_mma_scales.setting(), nvfp4_mma_codes.setting())  # both read: a bad value is refused here
    if ("linear" in ops or "moe" in ops) and ready != ("0", "0"):
        table["prepare_nvfp4"] = prepare_nvfp4
    if "attention" in ops or "qkv_attention" in ops:
        table["prepare_prefill"] = attention_triton.prepare_cudnn_plans
    return with_ops(base, name="triton", **table)
