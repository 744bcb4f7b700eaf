"""Accuracy of the fused path against an FP32 evaluation of the same weights, side by side with the plain path.

    python benchmarks/fast_path_accuracy.py                                # H200: full-size NVFP4, 16-layer BF16
    python benchmarks/fast_path_accuracy.py --formats bf16 --bf16-layers 49 --steps 256
    python benchmarks/fast_path_accuracy.py --formats bf16 --prompt-lengths 8192 4500 --steps 0 --demo-steps 0

Both BF16 paths round differently from each other, so on a random Flint (whose logits are near-ties) their greedy
tokens part after a few steps whichever is right. The yardstick here is the model evaluated in FP32 on the same
BF16/NVFP4 weights (`as_float32`): for prefill logits and for greedy decoding through the engine, the fused path
must be as close to it as the plain path is. Teacher-forced rows feed each path FP32's greedy tokens and compare
its own greedy choice at every step on the same context: a free-running comparison stops meaning anything after
the first flipped near-tie, a forced one covers all `--steps` steps, and a path is right where it differs from FP32
only at near-ties (`--tie`). Per-op rows swap one fused op into the plain path, to point at an op
that adds more error than rounding. A last check decodes the trained demo model (confident logits) with both
paths, where greedy tokens must agree exactly. Prints a table and writes JSON (benchmarks/results/, or --out).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
from flint_kernels.dispatch import REFERENCE, Kernels, with_ops
from flint_kernels.fast import OPS, fast_kernels

from flint_engine.config import preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.kv_cache import KVCache
from flint_engine.kv_cache_plan import sliding_blocks_needed
from flint_engine.model import FlintModel
from flint_engine.request import Request
from flint_engine.sampling_params import SamplingParams
from flint_engine.weights import as_float32, random_weights

RESULTS = Path(__file__).parent / "results"
Emit = Callable[[dict[str, Any]], None]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


@dataclass
class Decoded:
    tokens: list[list[int]]
    gaps: list[list[float]]  # per step: top-1 minus top-2 logit (log-probability) of the path that decoded it


def kv_budget(model: FlintModel, seqs: int) -> int:
    """KV bytes for `seqs` sequences: their sliding windows as the engine plans them (a fixed 2 GiB held only ~28 at
    full size, so a batch-32 check failed to start) and 2 GiB of full-attention blocks."""
    cfg, ec = model.config, EngineConfig(max_num_seqs=seqs)
    blocks = sliding_blocks_needed(cfg, ec.block_size, seqs, ec.prefill_tokens(True))  # the largest step it may plan
    return blocks * KVCache.bytes_per_sliding_block(cfg, ec.block_size) + 2 * 2**30


def greedy(model: FlintModel, prompts: list[list[int]], steps: int, ignore_eos: bool = True) -> Decoded:
    ec = EngineConfig(kv_cache_memory=kv_budget(model, len(prompts)), max_num_seqs=len(prompts), cuda_graphs=False)
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=ignore_eos, logprobs=2)
    return decoded(LLMEngine(model, None, ec).generate(prompts, params))


def forced(model: FlintModel, prompts: list[list[int]], ref: Decoded) -> Decoded:
    """Teacher forcing: decode through the engine, but feed `ref`'s tokens at every step; returns this model's own
    greedy choice at each of `ref`'s positions and its top-2 gap there. Unlike free-running greedy, one flipped near
    tie does not send the rest of the sequence elsewhere, so every step is compared on the same context."""
    steps = max(len(t) for t in ref.tokens)
    ec = EngineConfig(kv_cache_memory=kv_budget(model, len(prompts)), max_num_seqs=len(prompts), cuda_graphs=False)
    engine = LLMEngine(model, None, ec)
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True, logprobs=2)
    reqs = [engine.add_request(f"forced-{i}", p, params) for i, p in enumerate(prompts)]
    row = {r.request_id: i for i, r in enumerate(reqs)}
    own: list[list[int]] = [[] for _ in prompts]
    append = engine._append_token

    def feed_ref(req: Request, token: int, lp: Any, now: float) -> Any:
        i = row[req.request_id]
        own[i].append(token)
        step = len(req.output_token_ids)
        return append(req, ref.tokens[i][step] if step < len(ref.tokens[i]) else token, lp, now)

    engine._append_token = feed_ref  # type: ignore[method-assign]
    while engine.has_unfinished():
        engine.step()
    return Decoded(own, decoded(reqs).gaps)


def forced_agreement(a: Decoded, ref: Decoded, tie: float) -> dict[str, Any]:
    """`a` (from `forced` along `ref`) against `ref`'s tokens, position by position: the share that agree, how many
    differ where `ref`'s top two are further apart than `tie` (a real disagreement, not a flipped near-tie), and
    the widest `ref` gap at a difference."""
    diffs = [
        ref.gaps[s][i]
        for s, (x, y) in enumerate(zip(a.tokens, ref.tokens))
        for i, (p, q) in enumerate(zip(x, y))
        if p != q
    ]
    total = sum(len(t) for t in ref.tokens)
    return {
        "positions": total,
        "agreement": 1 - len(diffs) / max(total, 1),
        "differ": len(diffs),
        "differ_beyond_tie": sum(g > tie for g in diffs),
        "tie": tie,
        "widest_gap_at_difference": round(max(diffs), 4) if diffs else None,
    }


def decoded(reqs: list[Request]) -> Decoded:
    return Decoded(
        [r.output_token_ids for r in reqs], [[top[0][1] - top[1][1] for _, top in r.output_logprobs] for r in reqs]
    )


def agreement(a: Decoded, ref: Decoded) -> dict[str, Any]:
    """Share of positions with the same token, the first step where any sequence differs, and how close to a tie
    `ref`'s top two tokens were where each sequence first differs (rounding can only flip near-ties)."""
    pairs = list(zip(a.tokens, ref.tokens))
    total = sum(max(len(x), len(y)) for x, y in pairs)
    same = sum(p == q for x, y in pairs for p, q in zip(x, y))
    firsts = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None) for x, y in pairs]
    gaps = [ref.gaps[s][i] for s, i in enumerate(firsts) if i is not None]
    all_gaps = sorted(g for seq in ref.gaps for g in seq)
    return {
        "agreement": same / max(total, 1),
        "first_divergence": min((i for i in firsts if i is not None), default=None),
        "gap_at_divergences": [round(g, 4) for g in gaps],
        "median_gap": round(all_gaps[len(all_gaps) // 2], 4) if all_gaps else None,
    }


def random_model_rows(fmt: str, layers: int, args: argparse.Namespace, dev: torch.device, emit: Emit) -> None:
    cfg = preset(args.preset).replace(num_hidden_layers=layers)
    w = random_weights(cfg, torch.bfloat16, dev, seed=0, nvfp4_linears=fmt == "nvfp4", gain=args.gain)
    gold_model = FlintModel(as_float32(w), REFERENCE)
    gen = torch.Generator().manual_seed(1)
    lengths = args.prompt_lengths or [37 + 11 * i for i in range(args.batch)]
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    gold = torch.cat(gold_model.forward_sequences(prompts))
    fk = fast_kernels(REFERENCE, OPS)

    def logits_row(name: str, kernels: Kernels) -> dict[str, Any]:
        logits = torch.cat(FlintModel(w, kernels).forward_sequences(prompts))
        return {
            "format": fmt,
            "layers": layers,
            "path": name,
            "logits_rel_err_vs_fp32": rel_err(logits, gold),
            "argmax_agreement_vs_fp32": (logits.argmax(-1) == gold.argmax(-1)).float().mean().item(),
        }

    plain, fused = logits_row("plain", REFERENCE), logits_row("fused", fk)
    if args.steps:
        tokens = {
            "fp32": greedy(gold_model, prompts, args.steps),
            "plain": greedy(FlintModel(w, REFERENCE), prompts, args.steps),
            "fused": greedy(FlintModel(w, fk), prompts, args.steps),
        }
        for row in (plain, fused):
            row["greedy_vs_fp32"] = agreement(tokens[row["path"]], tokens["fp32"])
            model = FlintModel(w, REFERENCE if row["path"] == "plain" else fk)
            row["forced_vs_fp32"] = forced_agreement(forced(model, prompts, tokens["fp32"]), tokens["fp32"], args.tie)
        fused["greedy_vs_plain"] = agreement(tokens["fused"], tokens["plain"])
    emit(plain)
    emit(fused)
    if args.per_op:
        for op in OPS:
            emit(logits_row(f"plain + {op}", with_ops(REFERENCE, name=op, **{op: getattr(fk, op)})))


def demo_rows(args: argparse.Namespace, dev: torch.device, emit: Emit) -> None:
    """The trained demo model through the engine, every fused op against the plain path: exact greedy agreement."""
    from flint_engine.default_model import default_checkpoint_path

    questions = ["What is 7 + 5?", "What is 9 times 6?", "Count from 3 to 9.", "Hello!", "What is 18 - 11?"]
    for fmt, path in (
        ("bf16", default_checkpoint_path()),
        ("nvfp4", default_checkpoint_path().with_name("flint-demo-nvfp4.gguf")),
    ):
        for ignore_eos in (False, True):  # the answers as served (stop at EOS), then 256 steps regardless
            runs = {}
            for mode in ("reference", "fast"):
                ec = EngineConfig(
                    model=str(path), device=str(dev), kernels=mode, cuda_graphs=False, kv_cache_memory=2**28
                )
                engine = LLMEngine.from_checkpoint(ec, progress=False)
                prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": q}]) for q in questions]
                params = SamplingParams(max_tokens=args.demo_steps, temperature=0.0, ignore_eos=ignore_eos, logprobs=2)
                runs[mode] = decoded(engine.generate(prompts, params))
            emit(
                {
                    "model": f"demo {fmt}",
                    "until": "max_tokens" if ignore_eos else "eos",
                    "max_tokens": args.demo_steps,
                    "tokens": [len(t) for t in runs["reference"].tokens],
                    **agreement(runs["fast"], runs["reference"]),
                }
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="full")
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "bf16"])
    ap.add_argument("--nvfp4-layers", type=int, default=49)
    ap.add_argument("--bf16-layers", type=int, default=16, help="its FP32 copy must fit beside it (49: ~240 GB)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-lengths", type=int, nargs="*", default=[],
                    help="the prompts' lengths (default: --batch prompts of 37 + 11 i tokens); from 4096 tokens the "
                    "H200's full layers run them on cuDNN")  # fmt: skip
    ap.add_argument("--steps", type=int, default=64, help="greedy steps per path (0: logits only)")
    ap.add_argument("--demo-steps", type=int, default=256)
    ap.add_argument("--gain", type=float, default=0.5)
    ap.add_argument("--tie", type=float, default=0.1, help="top-2 gap under which a forced difference is a near-tie")
    ap.add_argument("--per-op", action="store_true", help="also one fused op at a time in the plain path")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=str(RESULTS / "fast_path_accuracy.json"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    report: dict[str, Any] = {
        "meta": {
            "date": date.today().isoformat(),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "args": vars(args),
        },
        "rows": [],
        "demo": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def emit_to(key: str) -> Emit:
        def emit(row: dict[str, Any]) -> None:
            report[key].append(row)
            print(json.dumps(row), flush=True)
            out.write_text(json.dumps(report, indent=2))

        return emit

    if args.demo_steps:  # first: quick, and the one exact check
        demo_rows(args, dev, emit_to("demo"))
    for fmt in args.formats:
        t = time.monotonic()
        layers = args.nvfp4_layers if fmt == "nvfp4" else args.bf16_layers
        random_model_rows(fmt, layers, args, dev, emit_to("rows"))
        print(f"{fmt}: {time.monotonic() - t:.0f} s", flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print(
        f"\n{'format':>6} {'layers':>6} {'path':>28} {'rel err':>9} {'argmax':>7} {'greedy':>7} {'first':>5}  vs FP32"
    )
    for r in report["rows"]:
        g = r.get("greedy_vs_fp32", {})
        print(
            f"{r['format']:>6} {r['layers']:>6} {r['path']:>28} {r['logits_rel_err_vs_fp32']:>9.2e}"
            f" {r['argmax_agreement_vs_fp32']:>7.3f} {g.get('agreement', float('nan')):>7.3f}"
            f" {g.get('first_divergence', '')!s:>5} {g.get('gap_at_divergences', '')!s}"
        )
        if "forced_vs_fp32" in r:
            print(f"{'':>42} teacher-forced along FP32's greedy tokens {r['forced_vs_fp32']}")
        if "greedy_vs_plain" in r:
            print(f"{'':>42} fused vs plain greedy {r['greedy_vs_plain']}")
    for r in report["demo"]:
        print(
            f"{r['model']} until {r['until']}: fused vs plain greedy agreement {r['agreement']:.3f}, first divergence"
            f" {r['first_divergence']} (top-2 gap there {r['gap_at_divergences']}, median gap {r['median_gap']})"
        )


if __name__ == "__main__":
    main()
