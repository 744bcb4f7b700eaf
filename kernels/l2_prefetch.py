"""L2 prefetch hints (PTX, sm_90+): bytes a later read will need, requested early so their DRAM latency overlaps other
work. A hint changes no result: L2 is where every SM's reads and writes meet, so a line written after its prefetch
is read as written. The CPU interpreter has no PTX: callers pass their PREFETCH switches off there.

* `prefetch_lines`: one `prefetch.global.L2` per pointer (a 128-byte line each), e.g. the decode attention's first
  key tiles before its PDL wait.
* `prefetch_experts`: `cp.async.bulk.prefetch.L2` of the routed experts' weights, issued by the router's top-k
  program right after it stores the ids (`router_triton`), so the MoE launches that follow read them from L2.
  Which bytes: `ExpertRegions` describes each weight tensor of the experts (base address, bytes from one expert to
  the next, bytes an expert) as a small int64 tensor on the device, made once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .linear import NVFP4Weight

# Bytes per bulk prefetch request: an expert's 4 MB BF16 gate|up weight is 64 of them.
CHUNK_BYTES = 65536


@triton.jit
def prefetch_lines(ptrs):
    """Ask for the 128-byte lines at `ptrs` in L2 (no registers held, no result)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _prefetch_ranges(addr, nbytes, on):
    """Bulk-prefetch `nbytes` (a multiple of 16) from each int64 address `addr` where `on` is nonzero."""
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, $3, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\t}"
        "\n\tmov.u32 $0, 0;",
        "=r,l,r,r",
        [addr, nbytes, on],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def prefetch_experts(ids_ptr, n_ids, regions_ptr, REGIONS: tl.constexpr, IDS: tl.constexpr, CHUNKS: tl.constexpr,
                     CHUNK: tl.constexpr):  # fmt: skip
    """L2 prefetch of the weights of the first `n_ids` (<= IDS) expert ids at `ids_ptr`: for each of REGIONS rows
    (base, stride, bytes) of `regions_ptr` [3, REGIONS], CHUNK-byte requests covering `bytes` from base + id *
    stride (CHUNKS of them at most)."""
    i = tl.arange(0, IDS)
    ids = tl.load(ids_ptr + i, mask=i < n_ids, other=0).to(tl.int64)
    c = tl.arange(0, CHUNKS).to(tl.int64) * CHUNK
    for r in tl.static_range(REGIONS):
        base = tl.load(regions_ptr + r)
        stride = tl.load(regions_ptr + REGIONS + r)
        size = tl.load(regions_ptr + 2 * REGIONS + r)
        addr = base + ids[:, None] * stride + c[None, :]
        nbytes = tl.minimum(size - c, CHUNK).to(tl.int32)
        on = ((i < n_ids)[:, None] & (c < size)[None, :]).to(tl.int32)
        _prefetch_ranges(addr, tl.broadcast_to(nbytes[None, :], (IDS, CHUNKS)), on)


@dataclass(frozen=True)
class ExpertRegions:
    """The experts' weight tensors as prefetch regions: `table` int64 [3, R] (base address, bytes between experts,
    bytes an expert, each a multiple of 16), `chunks` the most CHUNK_BYTES requests one expert's region takes."""

    table: torch.Tensor
    chunks: int

    @property
    def regions(self) -> int:
        return self.table.shape[1]


def expert_regions(*weights: torch.Tensor | NVFP4Weight, cuda_only: bool = True) -> ExpertRegions | None:
    """Regions of stacked expert weights [E, ...] (BF16 / FP16 tensors, or NVFP4 codes and block scales); None when
    one is not a contiguous-per-expert tensor whose sizes are multiples of 16 bytes, or (`cuda_only`) not on a GPU."""
    tensors: list[torch.Tensor] = []
    for w in weights:
        tensors += [w.qweight, w.scales] if isinstance(w, NVFP4Weight) else [w]
    rows = []
    for t in tensors:
        if (cuda_only and not t.is_cuda) or t.dim() < 2 or t[0].numel() == 0 or not t[0].is_contiguous():
            return None
        stride, size = t.stride(0) * t.element_size(), t[0].numel() * t.element_size()
        if t.data_ptr() % 16 or stride % 16 or size % 16:
            return None
        rows.append((t.data_ptr(), stride, size))
    if not rows:
        return None
    table = torch.tensor(rows, dtype=torch.int64).t().contiguous().to(tensors[0].device)
    chunks = triton.next_power_of_2(triton.cdiv(max(size for _, _, size in rows), CHUNK_BYTES))
    return ExpertRegions(table, chunks)
