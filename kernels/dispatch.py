"""The one place that decides, per op, whether a Triton kernel or the PyTorch reference runs.

The reference path runs everywhere (CPU, any GPU, any dtype). Fast kernels register here for the
configurations they cover; `select_kernels` logs the choice once per configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from . import tuning
from .activation import silu_and_mul_ref
from .attention import paged_attention_ref
from .linear import linear_fp32_out_ref, linear_ref
from .moe import moe_ref
from .qk_norm_rope import qk_norm_rope_write_ref
from .rmsnorm import add_rms_norm_ref, rms_norm_ref
from .router import sigmoid_topk_ref
from .sampling import sample_top_k_ref

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernels:
    """The model's ops. Every field has the reference op's signature."""

    name: str
    rms_norm: Callable
    add_rms_norm: Callable
    qk_norm_rope_write: Callable
    attention: Callable
    router: Callable
    silu_and_mul: Callable
    moe: Callable
    linear: Callable
    lm_head: Callable
    sample_top_k: Callable
    # Optional fused ops: None means the model composes them from the ops above.
    linear_add_rms_norm: Callable | None = None
    moe_add_rms_norm: Callable | None = None
    # qk_norm_rope_write then attention, from the packed qkv rows (decode: one launch).
    qkv_attention: Callable | None = None
    # add_rms_norm then the router on the normed rows: (normed, new residual, weights, ids).
    add_rms_norm_router: Callable | None = None
    # add_rms_norm then a projection of the normed rows: (projection, new residual).
    add_rms_norm_linear: Callable | None = None
    # Asks L2 for the lines of an `l2_prefetch.chunk_table` (no result): the model then runs it on a side stream of its
    # CUDA graphs, a layer ahead of the kernels that read those weights (`flint_engine.weights_ahead`).
    l2_ahead: Callable | None = None
    # Called once per router weight when a model is built, so the router op can keep data derived from it.
    prepare_router: Callable | None = None
    # Called once for each NVFP4 weight when the model is built (`fast.prepare_nvfp4`: the ready scales and codes).
    prepare_nvfp4: Callable | None = None
    # Called by the prefill warm-up with (max prefill tokens, query heads, KV heads, head_dim, dtype, device), so an
    # op can build before serving what its first long prefill would (cuDNN's attention plans); returns a list.
    prepare_prefill: Callable | None = None


REFERENCE = Kernels(
    name="reference",
    rms_norm=rms_norm_ref,
    add_rms_norm=add_rms_norm_ref,
    qk_norm_rope_write=qk_norm_rope_write_ref,
    attention=paged_attention_ref,
    router=sigmoid_topk_ref,
    silu_and_mul=silu_and_mul_ref,
    moe=moe_ref,
    linear=linear_ref,
    lm_head=linear_fp32_out_ref,
    sample_top_k=sample_top_k_ref,
)

_logged: set[tuple] = set()


def fast_path_reason(device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype) -> str | None:
    """Why the fused path cannot run here, or None when it can."""
    if device.type != "cuda":
        return f"device {device.type} (the fused kernels need CUDA)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if dtype != torch.bfloat16:
        return f"activation dtype {dtype} (the fused kernels are BF16)"
    if kv_dtype != torch.bfloat16:
        return f"KV cache dtype {kv_dtype} (the fused kernels read a BF16 cache)"
    return None


def select_kernels(
    device: torch.device | str, dtype: torch.dtype, kv_dtype: torch.dtype, mode: str = "auto"
) -> Kernels:
    """`mode`: 'auto' (fast where covered), 'reference' (plain PyTorch everywhere) or 'fast' (error if impossible)."""
    device = torch.device(device)
    if mode not in ("auto", "reference", "fast"):
        raise ValueError(f"kernel mode must be auto, reference or fast, got {mode!r}")
    reason = "requested" if mode == "reference" else fast_path_reason(device, dtype, kv_dtype)
    if reason is None:
        from .fast import fast_kernels

        chosen = fast_kernels(REFERENCE)
    elif mode == "fast":
        raise RuntimeError(f"the fused kernel path cannot run: {reason}")
    else:
        chosen = REFERENCE
    key = (device.type, dtype, kv_dtype, mode, chosen.name)
    if key not in _logged:
        _logged.add(key)
        if reason is None:
            tab = tuning.table(device)
            log.info(
                "kernel path: %s on %s (%s activations, %s KV); tuning table: %s", chosen.name, device, dtype,
                kv_dtype, tab.path or "none (the code defaults)",
            )  # fmt: skip
        else:
            log.info("kernel path: reference PyTorch ops on %s because of %s", device, reason)
    return chosen


def with_ops(base: Kernels, **ops: Callable) -> Kernels:
    return replace(base, **ops)
