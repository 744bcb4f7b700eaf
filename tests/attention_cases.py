"""Paged-attention test cases: a batch of sequences over a shuffled, NaN-filled paged cache, and its check."""

from __future__ import annotations

import torch
from flint_kernels.attention import AttnMeta, paged_attention_ref


class Case:
    """A batch of sequences (context length, new queries) over a shuffled paged cache; the reference output."""

    def __init__(
        self,
        seqs: list[tuple[int, int]],
        hq: int,
        hkv: int,
        d: int,
        window: int | None,
        dtype: torch.dtype = torch.float32,
        block_size: int = 16,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        need = [-(-ctx // block_size) for ctx, _ in seqs]
        max_blocks = max(need) + 2  # trailing -1 entries, as the engine pads its tables
        num_blocks = sum(need) + 3
        perm = torch.randperm(num_blocks, generator=g).tolist()
        k = torch.full((num_blocks, block_size, hkv, d), float("nan"))
        v = k.clone()
        table = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32)
        starts = [0]
        self.freed = 0
        for s, (ctx, n) in enumerate(seqs):
            lo = 0 if window is None else max(0, ctx - n - window + 1)  # first key any query of s may see
            for b in range(need[s]):
                phys = perm.pop()
                if (b + 1) * block_size <= lo:
                    self.freed += 1  # behind the window: freed, -1 in the table, NaN in the pool
                    continue
                table[s, b] = phys
                first, last = max(lo - b * block_size, 0), min(ctx - b * block_size, block_size)
                k[phys, first:last] = torch.randn(last - first, hkv, d, generator=g)
                v[phys, first:last] = torch.randn(last - first, hkv, d, generator=g)
            starts.append(starts[-1] + n)
        self.q = (torch.randn(starts[-1], hq, d, generator=g) * 1.5).to(device, dtype)
        self.k_cache = k.to(device, dtype)
        self.v_cache = v.to(device, dtype)
        self.table = table.to(device)
        self.sinks = (torch.randn(hq, generator=g) * 2).to(device)
        self.meta = AttnMeta.build(starts, [c for c, _ in seqs], device)
        self.scale = d**-0.5
        self.window = window

    def args(self) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.table, self.meta, self.sinks, self.scale, self.window)

    def ref(self) -> torch.Tensor:
        return paged_attention_ref(*self.args())


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def check_attention(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert not out.isnan().any(), "unwritten or poisoned output elements"
    assert rel_err(out, ref) < tol
