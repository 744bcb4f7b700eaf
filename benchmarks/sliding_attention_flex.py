"""Sliding-window prefill attention of a fresh prompt on torch's FlexAttention: is it faster than our Triton kernel?

FlexAttention compiles a Triton kernel for a mask given as a function, skipping the key blocks the mask leaves out
(`create_block_mask`): here causal with a 513-key window (the current key and 512 behind it), GQA (32 query heads on
4 K/V heads), K/V read contiguous from the prompt (the gather from the paged cache is timed apart). It has no sinks,
so each head's sink joins afterwards from the log-sum-exp it returns (`attention_cudnn.add_sinks_into`, one launch):
out * 1 / (1 + exp(sink - lse)). Whether Flex's log-sum-exp is natural or base-2 is read from the error against
`paged_attention_ref` (FP32 scores): both are timed, the right one is within the reference tolerance.

    python benchmarks/sliding_attention_flex.py --ts 8192 --out sliding_attention_flex.json
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_attention import D
from sliding_attention_cudnn import run_sliding

# Flex kernel launch parameters tried (None: Flex's own choice for the shape).
KERNEL_OPTIONS: dict[str, dict | None] = {
    "default": None,
    "128x64 w8 s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    "128x128 w8 s2": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
}


def flex_cases(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, window: int) -> dict:
    """name -> callable: Flex with each `KERNEL_OPTIONS` entry and the sinks added (natural and base-2 log-sum-exp
    read), and Flex alone."""
    from flint_kernels.attention_cudnn import add_sinks_into
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    t = q.shape[0]

    def band(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < window)

    mask = create_block_mask(band, None, None, t, t, device=q.device)
    compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    q4, k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, T, D] views
    dst = torch.empty_like(q)
    found: dict[str, Callable[[], torch.Tensor]] = {}
    for label, opts in KERNEL_OPTIONS.items():

        def run(opts: dict | None = opts) -> tuple[torch.Tensor, torch.Tensor]:
            return compiled(
                q4, k4, v4, block_mask=mask, scale=D**-0.5, enable_gqa=True, return_lse=True, kernel_options=opts
            )

        def whole(run: Callable = run, unit: float = 1.0) -> torch.Tensor:
            out, lse = run()
            return add_sinks_into(out[0].transpose(0, 1), lse[0] * unit, sinks, dst)

        found[f"flex {label}, lse natural (whole)"] = whole
        found[f"flex {label}, lse base 2 (whole)"] = lambda whole=whole: whole(unit=math.log(2.0))
        found[f"flex {label}: call alone"] = lambda run=run: run()[0]
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ts", type=int, nargs="*", default=[2048, 8192])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sliding_attention_flex.json")
    args = ap.parse_args()
    return run_sliding("sliding_attention_flex.py", args.ts, flex_cases, args.out)


if __name__ == "__main__":
    sys.exit(main())
