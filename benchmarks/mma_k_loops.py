"""K loops of the NVFP4 MMA kernels as the H200 table launches them, compiled for Hopper (sm_90) here, without a GPU.

The MMA MoE at batch 32 issues on ~2 of 3 scheduler cycles (Nsight Compute, thirty-third session), so instructions a
weight value are a proxy for its speed; this compares the installed kernels' K loops (the innermost loop holding the
MMAs) read from the engine's codes and from ready codes (`flint_kernels.nvfp4_mma_codes`): instructions a K step
(the ready-code gate_up's loop takes two steps an iteration), HMMAs, spills in the loop, registers, spills, and the
loop's opcodes. Compiled as launched: ready scale bytes, the launch's
divisibility-by-16 specialisations, the wide gate_up's register cap. It is a proxy; time the kernels on a GPU.

    python benchmarks/mma_k_loops.py            # prints a table, writes benchmarks/results/mma_k_loops.json

`profile(cases)` is what `tests/test_nvfp4_mma_codes.py` checks; it compiles in a subprocess without
TRITON_INTERPRET (which the test session sets).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"

_COMMON = {"x_ptr": "bf16", "w_ptr": "u8", "s_ptr": "i8", "gs_ptr": "fp32"}
_LINEAR = {**_COMMON, "out_ptr": "bf16", "ws_ptr": "fp32", "cnt_ptr": "i32"}
_SHARED = {"sw_ptr": "u8", "ss_ptr": "i8", "sgs_ptr": "fp32", "hs_ptr": "bf16", "ys_ptr": "bf16"}
_GATE_UP = {**_COMMON, "ids_ptr": "i64", "h_ptr": "bf16", **_SHARED}
_DOWN = {**_COMMON, "h_ptr": "bf16", "ids_ptr": "i64", "y_ptr": "bf16", **_SHARED}
_LIN, _MOE = "flint_kernels.nvfp4_mma_triton", "flint_kernels.nvfp4_mma_moe_triton"
KS_MAXNREG = 128  # `nvfp4_mma_moe_triton.KS_MAXNREG`, the wide gate_up's cap (the test checks they agree)


def installed_cases(ready_codes: bool) -> list[dict[str, Any]]:
    """The MMA kernels the H200 table runs (1-8 rows, rows and wide linear; the MoE's wide gate_up and down with the
    shared expert's programs first and h in the MMA's order), reading ready codes (an int8 code pointer) or not."""
    codes = {"w_ptr": "i8", "sw_ptr": "i8"} if ready_codes else {}
    cases = [  # (module, kernel, pointer types, constexprs, HMMAs a K step: 8 a group of 8 rows and 16-row tile)
        (_LIN, "_nvfp4_mma_vec_kernel", _LINEAR, {"SPLIT_K": 4, "NW": 4, "PREFETCH": False, "PDL": True}, 8),
        (_LIN, "_nvfp4_mma_rows_kernel", _LINEAR, {"SPLIT_K": 4, "NW": 4, "PDL": True, "VEC": True, "GROUPS": 4}, 32),
        (_LIN, "_nvfp4_mma_wide_kernel", _LINEAR, {"SPLIT_K": 4, "NW": 4, "PDL": True, "VEC": True}, 64),
        (_MOE, "_moe_gate_up_mma_wide_shared_first_kernel", _GATE_UP,
         {"P_PAD": 256, "NW": 4, "PREFETCH": True, "PDL": True, "L2_AHEAD": 2, "PERM": True}, 16),
        (_MOE, "_moe_down_mma_wide_shared_first_kernel", _DOWN,
         {"P_PAD": 256, "NW": 4, "PREFETCH": False, "PDL": True, "L2_MODE": 2, "PERM": True}, 16),
    ]  # fmt: skip
    return [
        {"module": module, "kernel": kernel, "pointers": {**pointers, **{k: codes[k] for k in codes if k in pointers}},
         "constexprs": cx, "num_warps": cx["NW"], "maxnreg": KS_MAXNREG if "_gate_up_mma_wide_" in kernel else None,
         "hmma_a_step": hmma}
        for module, kernel, pointers, cx, hmma in cases
    ]  # fmt: skip


def profile(cases: list[dict[str, Any]], timeout: int = 900) -> list[dict[str, Any]]:
    """Each case ({"module", "kernel", "pointers", "constexprs", "num_warps", "maxnreg"}) compiled and its K loop
    profiled, in a subprocess without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, __file__, "--cases-stdin"], input=json.dumps(cases), capture_output=True, text=True, env=env,
        timeout=timeout,
    )  # fmt: skip
    if r.returncode:
        raise RuntimeError(f"compiling for sm_90 failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _profile_one(case: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from kernel_sass import compile_sm90, disassemble

    cubin, _ = compile_sm90(
        case["module"], case["kernel"], case["pointers"], case["constexprs"], case["num_warps"], aligned=True,
        maxnreg=case.get("maxnreg"),
    )  # fmt: skip
    code, res = disassemble(cubin)
    loops = [
        (int(m.group(1)), i)
        for i, op in code
        for m in [re.search(r"\bBRA\b.*->(\d+)", op)]
        if m and int(m.group(1)) <= i and any("HMMA" in code[j][1] for j in range(int(m.group(1)), i + 1))
    ]
    lo, hi = min(loops, key=lambda ab: ab[1] - ab[0])  # the innermost loop with the MMAs
    body = [op for i, op in code if lo <= i <= hi]
    opcodes: dict[str, int] = {}
    for op in body:
        name = (op.split()[1] if op.startswith("@") else op.split()[0]).split(".")[0]
        opcodes[name] = opcodes.get(name, 0) + 1
    steps = sum("HMMA" in op for op in body) / case["hmma_a_step"]  # K steps an iteration (two: `_k_loop_wide_pairs`)
    return {
        "kernel": case["kernel"],
        "regs": res.get("REG", 0),
        "spills": res.get("LOCAL", 0) + res.get("STACK", 0),
        "k_step": round((hi - lo + 1) / steps, 1),
        "k_loop_steps": steps,
        "k_loop": hi - lo + 1,
        "k_loop_hmma": sum("HMMA" in op for op in body),
        "k_loop_spills": sum("LDL" in op or "STL" in op for op in body),
        "k_loop_opcodes": dict(sorted(opcodes.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(RESULTS / "mma_k_loops.json"))
    ap.add_argument("--cases-stdin", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cases_stdin:
        print(json.dumps([_profile_one(case) for case in json.loads(sys.stdin.read())]))
        return
    import triton

    plain, ready = installed_cases(False), installed_cases(True)
    results = profile(plain + ready)
    rows = []
    print(f"sm_90 K loops, Triton {triton.__version__}: engine's codes -> ready codes")
    print(f"{'kernel':46s} {'a K step':>19s} {'registers':>10s} {'spills':>8s}")
    for a, b in zip(results[: len(plain)], results[len(plain) :], strict=True):
        change = b["k_step"] / a["k_step"] - 1
        print(f"{a['kernel']:46s} {a['k_step']:6.1f} -> {b['k_step']:5.1f} {change:+.1%} {a['regs']:4d} -> "
              f"{b['regs']:3d} {a['spills']:3d} -> {b['spills']:2d}")  # fmt: skip
        rows.append({"kernel": a["kernel"], "codes": a, "ready_codes": b, "k_step_change": change})
    Path(args.out).write_text(json.dumps({"triton": triton.__version__, "kernels": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
