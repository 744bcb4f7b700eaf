"""NVFP4 experts' copies in the activations' dtype, made ahead on a second stream while the layer's attention runs.

A prefill step of `dequant_min_tokens` tokens or more (3072 on the H200) runs its NVFP4 experts from exact copies in
x's dtype made for the call (`moe_triton._dequantized`): ~1.6 GB written a layer, 26.8 ms of dequantisation in an
8K NVFP4 prefill (H200, twenty-first session). The copies need only the weights, so `start` begins layer L's at the
start of layer L, on a side stream, and `take` hands them to layer L's MoE after an event wait: the copy's DRAM
traffic can overlap the layer's projections, attention and router, which are compute-bound at those sizes. Whether it
pays is for the GPU to say (`benchmarks/prefill_ab.py --variant experts_ahead`): the op is experimental, on with
FLINT_FAST_OPS=all,experts_ahead.

Memory: the copies are allocated on the compute stream before the side stream writes them, and freed there after
the MoE, so the caching allocator sees one stream; the side stream first waits for everything queued before it
(the previous layer's MoE included), so it never writes memory a queued kernel still uses. One layer's copies are
live at a time, as without this op (they now live from the layer's start, beside its attention's activations).
Off CUDA (the interpreter) the copies are made at once, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import moe_triton
from .linear import NVFP4Weight, Weight

_streams: dict[torch.device, torch.cuda.Stream] = {}


@dataclass
class _Ahead:
    """The copies begun for one layer's experts, and the event that marks them written (None off CUDA)."""

    w13: NVFP4Weight
    w2: NVFP4Weight
    dtype: torch.dtype
    copies: tuple[Weight | moe_triton.ScaledWeight, Weight | moe_triton.ScaledWeight]
    written: torch.cuda.Event | None


# At most one layer's copies in flight per device.
_ahead: dict[torch.device, _Ahead] = {}


def _key(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _streams:
        _streams[device] = torch.cuda.Stream(device)
    return _streams[device]


def _drop(device: torch.device) -> _Ahead | None:
    """Forget the copies in flight on `device`; the compute stream waits for them first, so their memory is not
    handed out again while the side stream still writes it."""
    ahead = _ahead.pop(device, None)
    if ahead is not None and ahead.written is not None:
        torch.cuda.current_stream(device).wait_event(ahead.written)
    return ahead


def start(
    tokens: int,
    w13: Weight,
    w2: Weight,
    dtype: torch.dtype,
    decode_max_tokens: int | None = None,
    dequant_min_tokens: int | None = None,
) -> bool:
    """Begin the copies of these experts when a MoE of `tokens` tokens will run from copies (`runs_from_copies`;
    None limits: the device's); True if begun. Copies begun earlier and not taken are dropped."""
    if not (isinstance(w13, NVFP4Weight) and isinstance(w2, NVFP4Weight)):
        return False
    device = _key(w13.device)
    _drop(device)
    if not moe_triton.runs_from_copies(tokens, w13, w2, device, decode_max_tokens, dequant_min_tokens):
        return False
    cuda = device.type == "cuda"
    if cuda and torch.cuda.is_current_stream_capturing():
        return False
    # Allocated on the compute stream (see the module docstring), written on the side stream.
    out13 = moe_triton._empty(tuple(w13.shape), dtype, device)
    out2 = moe_triton._empty(tuple(w2.shape), dtype, device)
    if not cuda:
        copies = (moe_triton._dequantized(w13, dtype, out13), moe_triton._dequantized(w2, dtype, out2))
        _ahead[device] = _Ahead(w13, w2, dtype, copies, None)
        return True
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        copies = (moe_triton._dequantized(w13, dtype, out13), moe_triton._dequantized(w2, dtype, out2))
        written = torch.cuda.Event()
        written.record(side)
    _ahead[device] = _Ahead(w13, w2, dtype, copies, written)
    return True


def take(
    w13: Weight, w2: Weight, dtype: torch.dtype, device: torch.device
) -> tuple[Weight | moe_triton.ScaledWeight, Weight | moe_triton.ScaledWeight] | None:
    """The copies `start` began for exactly these experts in `dtype`, ready for the compute stream; else None (and
    copies of other experts in flight are dropped)."""
    device = _key(device)
    if device not in _ahead:
        return None
    ahead = _drop(device)
    assert ahead is not None
    if ahead.w13 is not w13 or ahead.w2 is not w2 or ahead.dtype != dtype:
        return None
    return ahead.copies


def in_flight(device: torch.device) -> bool:
    """Whether copies begun by `start` wait to be taken on `device`."""
    return _key(device) in _ahead
