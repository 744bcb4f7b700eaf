"""L2 prefetch hints (PTX, sm_90+): bytes a later read will need, requested early so their DRAM latency overlaps other
work. A hint changes no result: L2 is where every SM's reads and writes meet, so a line written after its prefetch
is read as written. The CPU interpreter has no PTX: callers pass their PREFETCH switches off there.

* `prefetch_lines`: one `prefetch.global.L2` per pointer (a 128-byte line each), e.g. the decode attention's first
  key tiles before its PDL wait.
* `prefetch_chunks`: a launch of its own that asks L2 for whole tensors, listed in a `chunk_table` (each program one
  chunk of lines). The decode graph runs it on a side stream, a layer ahead of the kernels that read those weights
  (`flint_engine.weights_ahead`), so their reads meet L2 instead of DRAM without any kernel of the step waiting.

A bulk `cp.async.bulk.prefetch.L2` of the routed experts' weights from the router's top-k program was measured far
slower on the H200 (2026-12-01) and removed; so were side-stream kernels that asked for a layer's routed experts'
down projections (from the router's ids) and the next layer's newest K/V blocks (2026-12-04: even or slower, those
kernels already ask for them before their PDL wait). See docs/performance.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE = 128  # bytes a prefetch asks for
CHUNK_LINES = 256  # lines a `prefetch_chunks` program asks for at a time (32 KB); its chunk may hold more


@triton.jit
def prefetch_lines(ptrs):
    """Ask for the 128-byte lines at `ptrs` in L2 (no registers held, no result)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


def chunk_table(tensors: list[torch.Tensor], device: torch.device, lines: int = CHUNK_LINES) -> torch.Tensor:
    """The 128-byte lines holding `tensors` (each a dense block of memory) as chunks of at most `lines` lines:
    int64 [chunks, 2] of (address of the first line, lines), on `device`, for `prefetch_chunks`."""
    rows: list[tuple[int, int]] = []
    for t in tensors:
        if t.numel() == 0:
            continue
        if not t.is_contiguous():
            raise ValueError(f"cannot prefetch a strided tensor {tuple(t.shape)} as one block of lines")
        first = t.data_ptr() // LINE * LINE
        count = -(-(t.data_ptr() + t.numel() * t.element_size() - first) // LINE)
        rows += [(first + i * LINE, min(lines, count - i)) for i in range(0, count, lines)]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 2).to(device)


@triton.jit
def _prefetch_chunks_kernel(table_ptr, LINES: tl.constexpr):
    """Program p asks L2 for the lines of chunk p of the table (`chunk_table`), LINES at a time; a short last step
    repeats its chunk's last line."""
    p = tl.program_id(0).to(tl.int64)
    first = tl.load(table_ptr + 2 * p)
    count = tl.load(table_ptr + 2 * p + 1)
    for start in range(0, count, LINES):
        line = tl.minimum(start + tl.arange(0, LINES).to(tl.int64), count - 1)
        prefetch_lines((first + line * 128).to(tl.pointer_type(tl.int8)))


def no_prefetch(table: torch.Tensor) -> None:
    """`prefetch_chunks`'s reference: a hint changes no result, so without it nothing happens."""


def prefetch_chunks(table: torch.Tensor) -> None:
    """Ask L2 for every line of `table` (`chunk_table`), one program a chunk; no result, launched without PDL (it
    waits for nothing but what its stream orders before it). CUDA sm_90+ only: the hint is PTX."""
    if table.shape[0] == 0:
        return
    _prefetch_chunks_kernel[(table.shape[0],)](table, LINES=CHUNK_LINES, num_warps=4)
