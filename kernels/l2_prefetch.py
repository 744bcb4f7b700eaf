"""L2 prefetch hints (PTX, sm_90+): bytes a later read will need, requested early so their DRAM latency overlaps other
work. A hint changes no result: L2 is where every SM's reads and writes meet, so a line written after its prefetch
is read as written. The CPU interpreter has no PTX: callers pass their PREFETCH switches off there.

* `prefetch_lines`: one `prefetch.global.L2` per pointer (a 128-byte line each), e.g. the decode attention's first
  key tiles before its PDL wait.

A bulk `cp.async.bulk.prefetch.L2` of the routed experts' weights from the router's top-k program was measured far
slower on the H200 (2026-12-01) and removed: see docs/performance.md.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prefetch_lines(ptrs):
    """Ask for the 128-byte lines at `ptrs` in L2 (no registers held, no result)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )
