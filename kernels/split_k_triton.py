"""Deterministic split-K inside one launch, shared by the linear, MoE, router and decode attention kernels.

When a launch's tiles cannot give ~4 programs per SM (`choose_split_k`), K is split over SPLIT_K programs and
reduced deterministically in the same launch: each split stores its FP32 partial tile to a workspace and bumps a
per-tile arrival counter (acq_rel, after a CTA barrier); the program that arrives last sums the partials in split
order, runs the epilogue and resets the counter, so results never depend on scheduling and the counters are zero
again for the next launch or graph replay. The counters are one zeroed int32 buffer per device (`counters`), made
on first use (make the first call outside graph capture) and shared by the launches of one stream: split-K
launches must not run concurrently on several streams.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Arrival counters for split-K tiles (one int32 each); a launch needing more tiles runs without split-K.
COUNTER_SLOTS = 1 << 16

_counters: dict[tuple[str, int | None], torch.Tensor] = {}
_sm_counts: dict[int | None, int] = {}


@triton.jit
def split_k_arrive(
    acc, ws_ptr, cnt_ptr, tile, pid_k, m_ok, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Store this split's partial tile, then arrive on the tile's counter: (tile workspace, offsets, mask, index).

    The classic semaphore pattern: every split stores its partial (only valid columns, so decode moves no
    padding), a CTA barrier, then an acq_rel increment of the tile's counter. The program whose arrival index is
    SPLIT_K - 1 sees every partial; it must read them bypassing L1 (cache_modifier=".cg") and reset the counter
    to 0 for the next launch or graph replay.
    """
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    tile_base = ws_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_N * BLOCK_M)
    mask = (tl.arange(0, BLOCK_N) >= 0)[:, None] & m_ok[None, :]
    tl.store(tile_base + pid_k * (BLOCK_N * BLOCK_M) + offs, acc, mask=mask)
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
    return tile_base, offs, mask, arrived


@triton.jit
def split_k_reduce(
    acc, ws_ptr, cnt_ptr, tile, pid_k, m_ok, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Deterministic in-launch split-K: returns (sum of the SPLIT_K partials in split order, arrival index).

    The sum is only meaningful where the arrival index is SPLIT_K - 1 (see `is_last`), the one program that
    loads the partials and resets the counter (see `split_k_arrive`).
    """
    tile_base, offs, mask, arrived = split_k_arrive(acc, ws_ptr, cnt_ptr, tile, pid_k, m_ok, SPLIT_K, BLOCK_N, BLOCK_M)
    total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if arrived == SPLIT_K - 1:
        for s in range(SPLIT_K):
            total += tl.load(tile_base + s * (BLOCK_N * BLOCK_M) + offs, mask=mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + tile, 0)
    return total, arrived


@triton.jit
def is_last(arrived, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """[BLOCK] mask, true in the program that arrived last (a vector: the interpreter cannot AND a scalar bool)."""
    return (tl.zeros((BLOCK,), dtype=tl.int32) + arrived) == SPLIT_K - 1


def counters(device: torch.device) -> torch.Tensor:
    """The device's zeroed split-K arrival counters (kernels leave them zero)."""
    key = (device.type, device.index)
    buf = _counters.get(key)
    if buf is None:
        buf = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
        _counters[key] = buf
    return buf


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (132 on H200; the interpreter pretends the same)."""
    if device.type != "cuda":
        return 132
    if device.index not in _sm_counts:
        _sm_counts[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sm_counts[device.index]


def choose_split_k(tiles: int, k: int, block_k: int, device: torch.device, min_iters: int = 2) -> tuple[int, int]:
    """(split, K per split): enough programs for ~4 per SM, each split at least `min_iters` BLOCK_K steps."""
    target = 4 * num_sms(device)
    if tiles >= target or tiles > COUNTER_SLOTS:
        return 1, triton.cdiv(k, block_k) * block_k
    steps = triton.cdiv(k, block_k)
    split = max(1, min(triton.cdiv(target, tiles), steps // min_iters, 32))
    per = triton.cdiv(steps, split) * block_k
    return triton.cdiv(k, per), per
