"""Sliding-window prefill attention of a fresh prompt on cuDNN, cut into blocks: is it faster than our Triton kernel?

torch's cuDNN attention takes no window, only the top-left causal mask or an additive bias. Two ways to give it a
513-key window (W = 512 keys behind each query plus its own) over a prompt that starts at position 0:

- *flipped*: cut the prompt into blocks of W queries. A query sees its own block causally (one batched causal call
  over all blocks) and, of the block before, the keys at or after its own offset: reversing both blocks turns that
  into a causal call too. The two parts merge by their log-sum-exps with the sinks (`attention_cudnn.merge_into`).
  Work: exactly the band's, in two calls, plus the reversals and the merge.
- *band*: cut the prompt into blocks of BQ queries, each seeing the BQ + W keys that end with it (the keys as one
  overlapping strided view, or copied), with a bias of -inf outside the band: one call, (BQ + W) / (W + 1) times the
  band's work, no merge (the sinks from the log-sum-exp, `attention_cudnn.add_sinks_into`).

Each variant's error against `paged_attention_ref` (FP32 scores) is printed beside its time, and the cuDNN calls of
each alone, so the glue's share shows.

    python benchmarks/sliding_attention_cudnn.py --ts 4096 8192 --out sliding_attention_cudnn.json
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_attention import HQ, WINDOW, D, _paged_case, _rel_err
from prefill_attention_sdpa import measured, triton_only
from results_file import write_results

ATEN = torch.ops.aten


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool) -> tuple:
    """cuDNN attention of [B, H, S, D] views -> (out [B, Hq, Sq, D], log-sum-exp [B, Hq, Sq] FP32)."""
    out, lse = ATEN._scaled_dot_product_cudnn_attention(q, k, v, bias, True, 0.0, causal, False, scale=D**-0.5)[:2]
    return out, lse.reshape(q.shape[0], q.shape[1], q.shape[2])


def _blocks(x: torch.Tensor, rows: int, block: int) -> torch.Tensor:
    """x [n, H, D] padded with zero rows to `rows` -> [rows / block, H, block, D] (a view of the padded rows)."""
    if x.shape[0] < rows:
        x = torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])
    return x.view(rows // block, block, x.shape[1], x.shape[2]).transpose(1, 2)


def flipped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, window: int) -> dict:
    """name -> callable for the flipped decomposition: the whole path, and its two cuDNN calls alone."""
    from flint_kernels.attention_cudnn import merge_into

    t, w = q.shape[0], window - 1
    nb = math.ceil(t / w)
    rows = nb * w
    qb, kb, vb = (_blocks(x, rows, w) for x in (q, k, v))
    qf, kf, vf = qb[1:].flip(2), kb[:-1].flip(2), vb[:-1].flip(2)

    def whole() -> torch.Tensor:
        own, own_l = _cudnn(qb, kb, vb, None, True)
        a = own.transpose(1, 2).reshape(rows, HQ, D)
        a_l = own_l.permute(1, 0, 2).reshape(HQ, rows)
        b = torch.zeros_like(a)
        b_l = torch.full_like(a_l, -math.inf)
        if nb > 1:
            po, pl = _cudnn(qb[1:].flip(2), kb[:-1].flip(2), vb[:-1].flip(2), None, True)
            b[w:] = po.flip(2).transpose(1, 2).reshape(rows - w, HQ, D)
            b_l[:, w:] = pl.flip(2).permute(1, 0, 2).reshape(HQ, rows - w)
        out = torch.empty((rows, HQ, D), dtype=q.dtype, device=q.device)
        merge_into(a, a_l, b, b_l, out, sinks=sinks)
        return out[:t]

    found: dict[str, Callable[[], torch.Tensor]] = {"flipped (whole)": whole}
    found["flipped: own blocks' call"] = lambda: _cudnn(qb, kb, vb, None, True)[0]
    if nb > 1:
        found["flipped: reversed call"] = lambda: _cudnn(qf, kf, vf, None, True)[0]
        found["flipped: reversals"] = lambda: (qb[1:].flip(2), kb[:-1].flip(2), vb[:-1].flip(2))[0]
    return found


def band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, window: int, bq: int) -> dict:
    """name -> callable for the band decomposition with BQ-query blocks (keys as a view, and copied), and its call."""
    from flint_kernels.attention_cudnn import add_sinks_into

    t, w = q.shape[0], window - 1
    nb = math.ceil(t / bq)
    rows = nb * bq
    span = bq + w
    qb = _blocks(q, rows, bq)

    def keys(x: torch.Tensor) -> torch.Tensor:
        # W zero rows in front (the first blocks' missing history, masked by the bias) and padding behind.
        padded = torch.cat([x.new_zeros((w, *x.shape[1:])), x, x.new_zeros((rows - t, *x.shape[1:]))])
        h = x.shape[1]
        return padded.as_strided((nb, h, span, D), (bq * h * D, D, h * D, 1))

    kv_view = (keys(k), keys(v))
    kv_copy = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in kv_view)
    # Query i of block b (position b*BQ + i) sees key j of its span (position b*BQ - W + j) for i <= j <= i + W,
    # and no key before position 0.
    i = torch.arange(bq, device=q.device)[:, None]
    j = torch.arange(span, device=q.device)[None, :]
    first = (torch.arange(nb, device=q.device) * bq)[:, None, None]
    allowed = (j >= i) & (j <= i + w) & (j >= w - first)
    bias = torch.zeros((nb, 1, bq, span), dtype=q.dtype, device=q.device)
    bias.masked_fill_(~allowed[:, None], -math.inf)
    bias = bias.expand(nb, HQ, bq, span)

    def whole(kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out, lse = _cudnn(qb, *kv, bias, False)
        out = out.transpose(1, 2).reshape(rows, HQ, D)[:t]
        lse = lse.permute(1, 0, 2).reshape(HQ, rows)
        return add_sinks_into(out, lse, sinks, torch.empty((t, HQ, D), dtype=q.dtype, device=q.device))

    return {
        f"band {bq}, keys a view (whole)": lambda: whole(kv_view),
        f"band {bq}, keys copied (whole)": lambda: whole(kv_copy),
        f"band {bq}: call alone": lambda: _cudnn(qb, *kv_copy, bias, False)[0],
    }


def sliding_rows(ts: list[int], variants: Callable[..., dict]) -> list[dict]:
    """Our Triton kernel, the gather of K/V from the paged cache, and `variants(q, k, v, sinks, WINDOW)`'s cases at
    each prompt length in `ts` (fresh prompts, bf16), each timed and, where whole, judged against the FP32 reference.
    """
    from flint_kernels import attention_triton as at
    from flint_kernels.attention import gather_kv, paged_attention_ref

    rows = []
    for t in ts:
        q, kc, vc, table, meta, sinks = _paged_case([t], [t], None, torch.bfloat16, seed=t)
        pargs = (q, kc, vc, table, meta, sinks, D**-0.5, WINDOW)
        ref = paged_attention_ref(*pargs)
        k, v = (gather_kv(c, table[0], 0, t) for c in (kc, vc))
        flops = 4.0 * sum(min(WINDOW, i + 1) for i in range(t)) * HQ * D
        ours = triton_only(t, q.device, WINDOW)
        cases: dict[str, Callable[[], object]] = {
            "ours (Triton)": lambda pargs=pargs, c=ours: at.paged_attention_prefill(*pargs, config=c),
            "gather K/V from the cache": lambda t=t, kc=kc, vc=vc, table=table: [
                gather_kv(c, table[0], 0, t, checked=False) for c in (kc, vc)
            ],
        }
        try:
            cases.update(variants(q, k, v, sinks, WINDOW))
        except Exception as e:  # a torch without the variant's path is a row, not the end of the run
            rows.append({"T": t, "variant": getattr(variants, "__name__", "variants"), "error": f"{e}"[:200]})
        for name, fn in cases.items():
            judged = name.endswith("(whole)") or name.startswith("ours")
            judge = (lambda out, ref=ref: _rel_err(out, ref)) if judged else (lambda out: None)
            rows.append(measured({"T": t, "variant": name}, fn, judge, flops, 60))
        del q, kc, vc, table, meta, sinks, ref, k, v, cases
        torch.cuda.empty_cache()
    return rows


def run_sliding(script: str, ts: list[int], variants: Callable[..., dict], out: Path) -> int:
    """`sliding_rows` printed as a table and written to `out` (the exit status: 1 without a GPU)."""
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    rows = sliding_rows(ts, variants)
    _print_sliding(rows)
    write_results(out, f"python benchmarks/{script} " + " ".join(sys.argv[1:]), rows)
    return 0


def _print_sliding(rows: list[dict]) -> None:
    print(f"\nSliding prefill attention (513 keys) on {torch.cuda.get_device_name()} (torch {torch.__version__}):")
    print(f"{'T':>6s} {'variant':40s} {'ms':>8s} {'TFLOP/s':>8s} {'rel err':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['T']:6d} {r['variant']:40s} {r['error']}")
        else:
            err = f"{r['rel_err']:9.1e}" if r.get("rel_err") is not None else f"{'':9s}"
            print(f"{r['T']:6d} {r['variant']:40s} {r['ms']:8.4f} {r['TFLOP/s']:8.1f} {err}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ts", type=int, nargs="*", default=[4096, 8192])
    ap.add_argument("--bqs", type=int, nargs="*", default=[128, 256])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sliding_attention_cudnn.json")
    args = ap.parse_args()

    def variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, window: int) -> dict:
        found = flipped(q, k, v, sinks, window)
        for bq in args.bqs:
            found.update(band(q, k, v, sinks, window, bq))
        return found

    return run_sliding("sliding_attention_cudnn.py", args.ts, variants, args.out)


if __name__ == "__main__":
    sys.exit(main())
