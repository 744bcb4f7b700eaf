"""Registers and spills of every kernel variant in a kernel manifest, compiled for sm_90 here (no GPU needed).

The manifest (kernels/precompile/nvidia-h200.json) records each variant the engine launches with its signature,
constants, alignment attributes and options, so this compiles exactly those variants with the installed Triton and
reads ptxas's resource usage: a variant with stack or local memory spills registers, and is a place to look.

    python benchmarks/manifest_registers.py [--manifest FILE] [--profile SUBSTRING] [--out FILE]

Prints one line a variant (spilling ones marked) and writes benchmarks/results/manifest_registers.json. The
installed Triton may differ from the device's (3.9 here, 3.6 on the H200 in 2026-12): the figures are a guide.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MANIFEST = HERE.parent / "kernels" / "precompile" / "nvidia-h200.json"
_OPTIONS = ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion", "launch_pdl")


def compile_variant(kernel: str, spec: dict[str, Any]) -> dict[str, int]:
    """ptxas's {"REG", "STACK", "LOCAL"} for one manifest variant (`kernel` "module.name", Triton's `spec`)."""
    import flint_kernels  # noqa: F401  (sets Triton's defaults as the engine's import does)
    import triton
    from kernel_sass import disassemble
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = kernel.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    src = ASTSource(
        fn=fn,
        signature=dict(spec["signature"]),
        constexprs={tuple(k): v for k, v in zip(spec["constant_keys"], spec["constant_vals"])},
        attrs={tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])},
    )
    options = {k: v for k, v in spec.get("options", {}).items() if k in _OPTIONS and v is not None}
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return disassemble(compiled.asm["cubin"])[1]


def constants(spec: dict[str, Any]) -> dict[str, Any]:
    """The variant's constexpr arguments by name."""
    names = list(spec["signature"])
    return {names[k[0]]: v for k, v in zip(spec["constant_keys"], spec["constant_vals"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, default=MANIFEST)
    ap.add_argument("--profile", default="", help="only profiles whose name contains this")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "manifest_registers.json")
    args = ap.parse_args(argv)
    manifest = json.loads(args.manifest.read_text())
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for profile, entries in manifest["profiles"].items():
        if args.profile not in profile:
            continue
        for entry in entries:
            key = (entry["kernel"], str(entry["spec"].get("key")))
            if key in seen:
                continue
            seen.add(key)
            start = time.perf_counter()
            row: dict[str, Any] = {"kernel": entry["kernel"], "constants": constants(entry["spec"])}
            try:
                row |= compile_variant(entry["kernel"], entry["spec"])
            except Exception as e:  # a variant this Triton cannot build is a row, not the end of the run
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            row["spills"] = bool(row.get("STACK") or row.get("LOCAL"))
            rows.append(row)
            name = entry["kernel"].rsplit(".", 1)[1]
            figures = row.get("error") or f"{row.get('REG')} registers, stack {row.get('STACK')}"
            mark = "  SPILLS" if row["spills"] else ""
            took = time.perf_counter() - start
            print(f"{name:40s} {figures}{mark}  {str(row['constants'])[:100]} ({took:.1f} s)", flush=True)
    spilling = [r for r in rows if r["spills"]]
    print(f"{len(rows)} variants, {len(spilling)} spill")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    root = HERE.parent
    where = args.manifest.resolve()
    # The manifest as the repository names it, so the results do not carry this machine's paths.
    named = str(where.relative_to(root)) if where.is_relative_to(root) else args.manifest.name
    args.out.write_text(json.dumps({"manifest": named, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
