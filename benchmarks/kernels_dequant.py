"""NVFP4 -> BF16 dequantisation (`gemv_triton.dequantize`), the copy an NVFP4 prefill makes of each layer's routed
experts (and of the attention / shared-expert weights for cuBLAS), over its tile candidates.

    python benchmarks/kernels_dequant.py

Each candidate's output is compared bit for bit with `NVFP4Weight.dequantize` (the reference) and timed as the
median of CUDA-graph replays; GB/s counts bytes read (codes and scales) plus bytes written. Prints a table and
writes benchmarks/results/kernels_dequant.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from results_file import write_results

RESULTS = Path(__file__).parent / "results"
# Flint's NVFP4 weights that a prefill dequantises, flattened as `moe_triton._dequantized` does.
SHAPES = {"experts gate_up": (256 * 1024, 2048), "experts down": (256 * 2048, 512), "qkv": (5120, 2048)}
TILES = [(32, 128, 4), (64, 128, 4), (32, 256, 4), (64, 256, 8), (16, 512, 4), (128, 128, 8), (64, 512, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "kernels_dequant.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kernels_dequant: no CUDA GPU here; nothing was run.")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from flint_kernels import gemv_triton as gt
    from kernels_moe_gemv import random_nvfp4, time_graph

    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = random_nvfp4((), n, k, g)
        ref = w.dequantize(torch.bfloat16)
        moved = w.qweight.numel() + w.scales.numel() + 2 * n * k
        row: dict = {"weight": name, "shape": [n, k], "bytes": moved}
        for tile in TILES:
            key = f"n{tile[0]} k{tile[1]} w{tile[2]}"
            try:
                out = gt.dequantize(w, torch.bfloat16, tile)
                if not torch.equal(out, ref):
                    row[key] = "differs from the reference"
                    continue
                ms = time_graph([lambda w=w, tile=tile: gt.dequantize(w, torch.bfloat16, tile)], reps=5)
                row[key] = {"us": round(ms * 1e3, 1), "GB/s": round(moved / ms / 1e6)}
            except Exception as e:  # a tile that does not compile is reported
                row[key] = f"error: {type(e).__name__}: {str(e)[:100]}"
        rows.append(row)
        print(f"{name} [{n} x {k}], {moved / 1e9:.2f} GB moved:")
        for key, v in row.items():
            if key.startswith("n"):
                text = f"{v['us']:9.1f} us {v['GB/s']:6d} GB/s" if isinstance(v, dict) else str(v)
                print(f"    {key:16s} {text}")
        del w, ref
        torch.cuda.empty_cache()
    tiles = {"large": list(gt.DEQUANT_TILE_LARGE), "small": list(gt.DEQUANT_TILE)}
    write_results(args.out, "python benchmarks/kernels_dequant.py", rows, default_tiles=tiles)


if __name__ == "__main__":
    main()
