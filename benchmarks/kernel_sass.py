"""Static SASS profile of a decode kernel for Hopper (sm_90), compiled here without a GPU.

At batch 1 the GEMV and MoE programs load their first weights, wait for the previous kernel (PDL), then do the rest;
what they execute after the wait is on the step's critical path, and for NVFP4 it is instruction-bound. This compiles
one configuration with the installed Triton (ptxas and nvdisasm ship with it), disassembles it and prints: registers
and spills, the instructions before and after the first PDL wait (`ACQBULK`), the opcodes after it, and the
instructions of one K step after the wait per weight value a thread handles (the K loop's body, which runs only when a
program has more than one step, is counted apart, with its own opcodes and count per weight value). It is a proxy
to compare variants offline; time them on a GPU.

    python benchmarks/kernel_sass.py linear --nvfp4 --block-n 8 --block-k 2048
    python benchmarks/kernel_sass.py moe-down --nvfp4 --block-n 16 --block-k 512 --warps 2
    python benchmarks/kernel_sass.py linear --nvfp4 --block-n 8 --block-k 2048 --block-m 8   # FMA, 8 rows of x

Writes benchmarks/results/kernel_sass.json (or --out).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def _linear(args: argparse.Namespace) -> tuple[str, str, dict, dict]:
    nv = args.nvfp4
    pointers = {"x_ptr": "bf16", "w_ptr": "u8" if nv else "bf16", "s_ptr": "u8" if nv else "bf16",
                "gs_ptr": "fp32", "out_ptr": "bf16", "ws_ptr": "fp32", "cnt_ptr": "i32", "res_ptr": "bf16",
                "nw_ptr": "fp32", "h_ptr": "bf16", "res_out_ptr": "bf16", "row_cnt_ptr": "i32"}  # fmt: skip
    constexprs = dict(NVFP4=nv, USE_DOT=False, BLOCK_M=args.block_m, BLOCK_N=args.block_n, BLOCK_K=args.block_k,
                      WORDS=args.words, PRECISION="tf32", EVEN_K=True, SPLIT_K=1, NORM=False, N_PAD=1,
                      NORM_IN=args.norm_in, PDL=True)  # fmt: skip
    return "flint_kernels.gemv_triton", "_linear_kernel", pointers, constexprs


def _moe(args: argparse.Namespace, kernel: str) -> tuple[str, str, dict, dict]:
    nv = args.nvfp4
    wdt = "u8" if nv else "bf16"
    pointers = {"x_ptr": "bf16", "h_ptr": "bf16", "ids_ptr": "i64", "order_ptr": "i64", "meta_ptr": "i64",
                "tw_ptr": "fp32", "w_ptr": wdt, "s_ptr": wdt, "gs_ptr": "fp32" if nv else "bf16", "sw_ptr": wdt,
                "ss_ptr": wdt, "sgs_ptr": "fp32" if nv else "bf16", "out_ptr": "bf16", "ws_ptr": "fp32",
                "cnt_ptr": "i32", "res_ptr": "bf16", "nw_ptr": "fp32", "hn_ptr": "bf16", "res_out_ptr": "bf16",
                "row_cnt_ptr": "i32"}  # fmt: skip
    constexprs = dict(NVFP4=nv, GSCALE=nv, GROUPED=False, EXPERT=False, P_PAD=1, SHARED=True, EVEN_K=True,
                      WORDS=args.words, USE_DOT=False, PRECISION="tf32", BLOCK_M=1, BLOCK_K=args.block_k,
                      PDL=True)  # fmt: skip
    if kernel == "_moe_gate_up_kernel":
        constexprs.update(SPLIT_K=1, BLOCK_I=args.block_n)
    else:
        constexprs.update(TOPK=6, NSLOTS=7, BLOCK_N=args.block_n, NORM=False, N_PAD=1, SLOTS_HERE=False)
    return "flint_kernels.moe_triton", kernel, pointers, constexprs


def compile_sm90(
    module: str,
    kernel: str,
    pointers: dict,
    constexprs: dict,
    warps: int,
    stages: int = 1,
    aligned: bool = False,
    maxnreg: int | None = None,
) -> tuple[bytes, str]:
    """(cubin, PTX) of `kernel` compiled for sm_90 (outside Triton's interpreter). Arguments not named in `pointers`
    (those the kernel has) or `constexprs` are i32 scalars, except names ending in "eps"/"scale"/"scaling" (fp32).

    `aligned`: every pointer and i32 argument the kernel specialises on is taken as divisible by 16, as a launch with
    such values (the engine's strides and buffers) compiles it. Without it, loads whose addresses come from strides
    can compile to one element at a time (the prefill attention's K/V tiles: 2-byte loads instead of 16-byte
    copies), which no launch runs. `maxnreg`: the register cap a launch passes (the MMA MoE's wide gate_up)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(module), kernel)
    names = fn.arg_names
    sig = {n: "fp32" if n.endswith(("eps", "scale", "scaling")) else "i32" for n in names}
    # A TMA descriptor argument is named by its full type ("tensordesc<bf16[128, 64]>"), a pointer by its element type.
    sig.update({n: t if t.startswith("tensordesc") else "*" + t for n, t in pointers.items() if n in names})
    sig.update({n: "constexpr" for n in constexprs})
    attrs = {}
    if aligned:
        skip = {names[d] if isinstance(d, int) else d for d in getattr(fn, "do_not_specialize", ())}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                 if sig[n].startswith("*") or (sig[n] == "i32" and n not in skip)}  # fmt: skip
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    options = {"num_warps": warps, "num_stages": stages} | ({"maxnreg": maxnreg} if maxnreg else {})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return k.asm["cubin"], k.asm["ptx"]


def disassemble(cubin: bytes) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """([(index, instruction)], {"REG": .., "STACK": .., "LOCAL": ..}) from Triton's bundled nvdisasm/cuobjdump;
    a branch's target is written as "->index"."""
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run([tools / "nvdisasm", "-c", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tools / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    code: list[tuple[int, str]] = []
    labels: dict[str, int] = {}  # label -> index of the instruction it marks
    for line in text.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(code)
        m = _LINE.search(line)
        if m:
            op = m.group(2)
            target = re.search(r"`\((\.L_x_\d+)\)", op)
            code.append((len(code), op if not target else f"{op.split('`')[0].strip()} @{target.group(1)}"))
    # Branch targets as instruction indices: "BRA @.L_x_1" -> "BRA ->12".
    code = [(i, re.sub(r"@(\.L_x_\d+)", lambda m: f"->{labels.get(m.group(1), -1)}", op)) for i, op in code]
    resources = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage)}
    return code, resources


def profile(code: list[tuple[int, str]]) -> dict:
    """Instructions before / after the first PDL wait, the K loop's body apart, and the opcodes after the wait."""
    wait = next((i for i, (_, op) in enumerate(code) if op.startswith("ACQBULK")), 0)
    in_loop: set[int] = set()
    for i, op in code:
        m = re.search(r"\bBRA\b.*->(\d+)", op)
        if m and wait < int(m.group(1)) <= i:  # a backward branch after the wait: a loop from its target to here
            in_loop.update(range(int(m.group(1)), i + 1))
    after = [op for i, (_, op) in enumerate(code) if i >= wait and i not in in_loop]

    def opcode(op: str) -> str:
        word = op.split()[1] if op.startswith("@") else op.split()[0]
        return word.split(".")[0]

    return {
        "instructions": len(code),
        "before_wait": wait,
        "after_wait_one_step": len(after),
        "loop_body": len(in_loop),
        "after_wait_opcodes": dict(Counter(opcode(op) for op in after).most_common(16)),
        # A program with several K steps runs the body once a step after the first: its steady state.
        "loop_body_opcodes": dict(Counter(opcode(code[i][1]) for i in sorted(in_loop)).most_common(16)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kernel", choices=["linear", "moe-gate-up", "moe-down"])
    ap.add_argument("--nvfp4", action="store_true", help="NVFP4 weights (default BF16)")
    ap.add_argument("--block-n", type=int, default=8, help="rows a program (the MoE gate_up's BLOCK_I)")
    ap.add_argument("--block-k", type=int, default=1024)
    ap.add_argument("--block-m", type=int, default=1, help="x rows a program (linear's FMA path: 1, or a few rows)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--words", type=int, default=0, help="the kernels' WORDS (decode mode)")
    ap.add_argument("--norm-in", action="store_true", help="linear: the add+RMSNorm prologue (`add_rms_norm_linear`)")
    ap.add_argument("--out", type=Path, default=RESULTS / "kernel_sass.json")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    if args.kernel == "linear":
        module, kernel, pointers, constexprs = _linear(args)
    else:
        module, kernel, pointers, constexprs = _moe(args, f"_moe_{args.kernel[4:].replace('-', '_')}_kernel")
    cubin, _ = compile_sm90(module, kernel, pointers, constexprs, args.warps)
    code, resources = disassemble(cubin)
    row = {"kernel": kernel, **{k: v for k, v in constexprs.items() if k.isupper()}, "warps": args.warps}
    row.update(resources)
    row.update(profile(code))
    rows_a_step = args.block_n * (2 if args.kernel == "moe-gate-up" else 1)
    values = rows_a_step * args.block_k / (32 * args.warps)  # weight values a thread handles in one K step
    row["after_wait_per_value"] = round(row["after_wait_one_step"] / values, 2)
    row["loop_body_per_value"] = round(row["loop_body"] / values, 2)
    print(
        f"{kernel} {'nvfp4' if args.nvfp4 else 'bf16'} {args.block_n} x {args.block_k}, {args.warps} warps: "
        f"{row.get('REG', '?')} registers, {row.get('LOCAL', 0)} B local; {row['instructions']} instructions, "
        f"{row['before_wait']} before the wait, {row['after_wait_one_step']} after it in one K step "
        f"({row['after_wait_per_value']} a weight value, {values:.0f} values a thread), loop body {row['loop_body']}"
        f" ({row['loop_body_per_value']} a weight value)"
    )
    print("after the wait:", ", ".join(f"{k} {v}" for k, v in row["after_wait_opcodes"].items()))
    if row["loop_body_opcodes"]:
        print("loop body:", ", ".join(f"{k} {v}" for k, v in row["loop_body_opcodes"].items()))
    from results_file import write_results

    write_results(args.out, " ".join(["python", "benchmarks/kernel_sass.py", *sys.argv[1:]]), [row], target="sm_90")


if __name__ == "__main__":
    main()
