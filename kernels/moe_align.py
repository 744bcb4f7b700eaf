"""Grouping the prefill MoE's (token, slot) pairs by expert: the PyTorch reference of `moe_align_triton`.

The grouped GEMM runs blocks of up to BLOCK_M pairs of one expert. `align_ref` returns the pairs' order (sorted by
expert) and per block (expert, first sorted row, rows), all on the device so no host sync happens. The number of
blocks is the shape bound cdiv(P, BLOCK_M) + min(E, P); blocks past the real total get 0 rows and do nothing.
`sort_ref` returns what torch's grouped GEMM takes instead (`moe_grouped_gemm`): each sorted row's token, each
pair's sorted row and each expert's end row.
"""

from __future__ import annotations

import torch
import triton


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks of at most `block_m` pairs of one expert that `pairs` pairs can need: each expert's last is partial."""
    return triton.cdiv(pairs, block_m) + min(num_experts, pairs)


def align_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(order int64 [P]: pair indices sorted by expert, stable; meta int32 [B, 3]: per block (expert, first sorted
    row, rows); B = `max_blocks`). Invalid blocks name the last expert and hold 0 rows."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    p = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    nblocks = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(nblocks, 0)
    row_start = torch.cumsum(counts, 0) - counts
    n_blocks = max_blocks(p, num_experts, block_m)
    b = torch.arange(n_blocks, device=flat.device)
    e = torch.searchsorted(block_end, b, right=True)
    valid = e < num_experts
    e = e.clamp(max=num_experts - 1)
    j = b - (block_end[e] - nblocks[e])
    row0 = row_start[e] + j * block_m
    nrows = torch.where(valid, (counts[e] - j * block_m).clamp(0, block_m), torch.zeros_like(e))
    meta = torch.stack((e, row0, nrows), dim=1).to(torch.int32).contiguous()
    return order, meta, n_blocks


def sort_ref(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src int64 [P]: the token of each sorted row; pos int64 [P]: the sorted row of pair t * k + s; offs int32 [E]:
    the end row of each expert's rows) with the T * k pairs sorted by expert, stable."""
    k = topk_ids.shape[-1]
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), device=order.device)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return order // k, pos, torch.cumsum(counts, 0, dtype=torch.int32)
