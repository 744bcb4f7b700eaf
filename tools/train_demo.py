"""Train the small Flint demo model on the synthetic GLM-4.7 chat corpus and write it as BF16 and NVFP4 GGUF.

    python tools/train_demo.py --out flint_engine/assets/flint-demo.gguf \
        --out-nvfp4 flint_engine/assets/flint-demo-nvfp4.gguf --steps 5000 --minutes 40

Deterministic for a seed: the tokenizer, the init and every batch (batch `s` comes from its own seeded generator)
depend only on the arguments, so a run resumed from a checkpoint (`--resume`) sees the same data as an unbroken one.
Training runs `TrainableFlint` (tools/demo_arch.py, the engine's numerics in FP32); the periodic greedy eval runs
the project's own engine on the BF16 file the trainer would write at that step.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Set before torch loads OpenMP: with the default spinning policy, 2 threads on 2 shared cores run ~10x slower as
# soon as another process takes a core; passive waiting costs nothing when the cores are free.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.nn.functional as F
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_arch import TrainableFlint  # noqa: E402
from demo_corpus import Sample, build_demo_tokenizer, encode_sample, make_sample, render_prompt, samples, score  # noqa: E402

from flint_engine.checkpoint import FLINT_GENERATION_DEFAULTS  # noqa: E402
from flint_engine.checkpoint.gguf_writer import write_gguf  # noqa: E402
from flint_engine.config import FlintConfig, default_layer_types, describe  # noqa: E402
from flint_engine.tokenizer import FlintTokenizer  # noqa: E402

log = logging.getLogger("train_demo")

EVAL_SEED = 777_001  # the in-training eval's held-out prompts (training batches use seed * 1_000_003 + step)


def demo_config(tok: FlintTokenizer, **overrides: Any) -> FlintConfig:
    """The demo Flint: Flint's structure, shrunk. 6 layers (0, 1, 5 full attention without RoPE; 2-4 sliding
    window 64 with RoPE), 2 leading dense SwiGLU layers, 8 experts top-2 plus a shared expert, GQA 4q/2kv."""
    layers = int(overrides.pop("num_hidden_layers", 6))
    base: dict[str, Any] = dict(
        vocab_size=tok.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        sliding_window=64,
        max_position_embeddings=4096,
        layer_types=default_layer_types(layers),
        mlp_only_layers=(0, 1),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tuple(tok.eos_token_ids),
        pad_token_id=tok.pad_token_id,
    )
    base.update(overrides)
    return FlintConfig(**base)


# ---------------------------------------------------------------------------------------------- batches
@dataclass
class Batch:
    ids: torch.Tensor  # [R, L]
    labels: torch.Tensor  # [R, L], -100 where there is no loss
    positions: torch.Tensor  # [R, L]
    segments: torch.Tensor  # [R, L], -1 for padding
    examples: int
    kinds: dict[str, int]

    def to(self, device: torch.device) -> Batch:
        move = (self.ids, self.labels, self.positions, self.segments)
        return Batch(*(t.to(device, non_blocking=True) for t in move), self.examples, self.kinds)


def make_batch(tok: FlintTokenizer, seed: int, step: int, rows: int, row_len: int) -> Batch:
    """Pack freshly generated conversations into `rows` rows of `row_len` tokens (first fit); deterministic."""
    rng = random.Random(seed * 1_000_003 + step)
    ids = torch.full((rows, row_len), tok.pad_token_id or 0, dtype=torch.long)
    labels = torch.full((rows, row_len), -100, dtype=torch.long)
    positions = torch.zeros((rows, row_len), dtype=torch.long)
    segments = torch.full((rows, row_len), -1, dtype=torch.long)
    fill = [0] * rows
    kinds: dict[str, int] = {}
    count, misses = 0, 0
    while misses < 16:
        sample = make_sample(rng)
        seq, mask = encode_sample(tok, sample)
        if len(seq) > row_len:  # cut to fit, it would lose its target turn
            misses += 1
            continue
        row = next((r for r in range(rows) if fill[r] + len(seq) <= row_len), None)
        if row is None:
            misses += 1
            continue
        a, n = fill[row], len(seq)
        ids[row, a : a + n] = torch.tensor(seq)
        positions[row, a : a + n] = torch.arange(n)
        segments[row, a : a + n] = count
        # Position i predicts token i+1: label it when token i+1 is a target token.
        lab = [seq[i + 1] if mask[i + 1] else -100 for i in range(n - 1)] + [-100]
        labels[row, a : a + n] = torch.tensor(lab)
        fill[row] += n
        count += 1
        kinds[sample.kind] = kinds.get(sample.kind, 0) + 1
    if count == 0:
        raise ValueError(f"--row-len {row_len} is shorter than the sampled conversations; raise it")
    return Batch(ids, labels, positions, segments, count, kinds)


# ---------------------------------------------------------------------------------------------- schedule
def lr_at(step: int, total: int, peak: float, warmup: int, floor: float) -> float:
    """Linear warm-up to `peak`, then cosine decay to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def param_groups(model: TrainableFlint, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on the projection matrices and router; none on the embedding, norms and sinks."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and name != "embed" else rest).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------- writing
def write_checkpoints(
    model: TrainableFlint, tok: FlintTokenizer, out: str | None, out_nvfp4: str | None, name: str = "flint-demo"
) -> dict[str, int]:
    """Write the BF16 and/or NVFP4 GGUF files with tokenizer, chat template and generation defaults."""
    sizes: dict[str, int] = {}
    for path, fmt in ((out, "bf16"), (out_nvfp4, "nvfp4")):
        if not path:
            continue
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=Path(path).parent, suffix=".tmp")
        os.close(fd)
        try:
            summary = write_gguf(
                tmp,
                model.config,
                model.provider(),
                fmt=fmt,
                tokenizer=tok,
                generation=FLINT_GENERATION_DEFAULTS,
                name=name if fmt == "bf16" else f"{name}-nvfp4",
                progress=False,
            )
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        sizes[fmt] = summary.file_bytes
        log.debug("wrote %s (%s, %.2f MB)", path, fmt, summary.file_bytes / 1e6)
    return sizes


# ---------------------------------------------------------------------------------------------- greedy eval
def engine_greedy(path: str, items: list[Sample], max_tokens: int = 96) -> list[dict[str, Any]]:
    """Greedy answers of the engine (CPU, FP32) on a GGUF file, parsed as the API parses them (no HTTP)."""
    from flint_engine.engine import LLMEngine
    from flint_engine.engine_config import EngineConfig
    from flint_engine.parsers import ChatOutputParser
    from flint_engine.sampling_params import SamplingParams

    config = EngineConfig(model=path, device="cpu", dtype="float32", kv_cache_memory=64 * 2**20)
    engine = LLMEngine.from_checkpoint(config, progress=False)
    tok = engine.tokenizer
    prompts = [tok.encode(render_prompt(tok, s)) for s in items]
    reqs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    out = []
    eos = set(tok.eos_token_ids)
    for s, r in zip(items, reqs):
        ids = list(r.output_token_ids)
        if ids and ids[-1] in eos:
            ids = ids[:-1]
        text = tok.decode(ids, skip_special_tokens=False)
        parsed = ChatOutputParser(s.thinking, s.tools, seed=0).parse(text)
        calls = [c.to_openai() for c in parsed.tool_calls]
        out.append(
            {
                "kind": s.kind,
                "thinking": s.thinking,
                "text": text,
                "reasoning": parsed.reasoning,
                "content": parsed.content,
                "tool_calls": calls,
                "ok": score(s, parsed.reasoning, parsed.content, calls),
            }
        )
    return out


def eval_items(n_per_kind: int, seed: int = EVAL_SEED) -> list[Sample]:
    items: list[Sample] = []
    for i, kind in enumerate(("arith", "count", "tool", "tool_result", "greet")):
        items += samples(seed + i, n_per_kind, kind=kind, thinking=True)
    items += samples(seed + 99, n_per_kind, kind="arith", thinking=False)
    return items


def summarize(results: list[dict[str, Any]]) -> dict[str, float]:
    acc: dict[str, list[bool]] = {}
    for r in results:
        key = r["kind"] if r["thinking"] else f"{r['kind']}/no-think"
        acc.setdefault(key, []).append(r["ok"])
    return {k: sum(v) / len(v) for k, v in sorted(acc.items())}


def periodic_eval(model: TrainableFlint, tok: FlintTokenizer, n_per_kind: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "eval.gguf")
        write_checkpoints(model, tok, path, None)
        return summarize(engine_greedy(path, eval_items(n_per_kind)))


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="BF16 GGUF to write")
    p.add_argument("--out-nvfp4", default=None, help="NVFP4 GGUF to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--steps", type=int, default=5000, help="schedule length (the cosine ends here)")
    p.add_argument("--minutes", type=float, default=40.0, help="wall-time budget for training; stops early")
    p.add_argument("--rows", type=int, default=8, help="packed rows per batch")
    p.add_argument("--row-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--lr-floor", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing loss weight")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-per-kind", type=int, default=12)
    p.add_argument("--ckpt-every", type=int, default=250)
    p.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "flint-demo-train"))
    p.add_argument("--resume", action="store_true", help="continue from <ckpt-dir>/last.pt")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--no-compile", action="store_true", help="run eagerly (torch.compile needs a C++ compiler)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the same data and init; GPU rounding differs)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("gguf", "flint_engine"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("flint_engine.parsers").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)

    tok = build_demo_tokenizer(args.vocab, args.seed)
    config = demo_config(tok, num_hidden_layers=args.layers, hidden_size=args.hidden)
    log.info("config: %s", describe(config))
    device = torch.device(args.device)
    model = TrainableFlint(config).init_weights(args.seed).to(device)
    model.check_plan()
    if not args.no_compile:
        model.compile_blocks()
    opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    history: list[dict[str, Any]] = []
    step, elapsed_before = 0, 0.0
    if args.resume and (ckpt_dir / "last.pt").is_file():
        state = torch.load(ckpt_dir / "last.pt", weights_only=False, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed_before, history = state["step"], state["elapsed"], state["history"]
        log.info("resumed at step %d (%.1f min trained)", step, elapsed_before / 60)

    def save(path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "elapsed": elapsed_before + (time.monotonic() - t_start),
                "history": history,
                "args": vars(args),
            },
            tmp,
        )
        os.replace(tmp, path)

    t_start = time.monotonic()
    budget = args.minutes * 60
    window: list[tuple[float, float, int]] = []
    bar = tqdm(total=args.steps, initial=step, desc="training", unit="step", dynamic_ncols=True)
    while step < args.steps:
        if elapsed_before + (time.monotonic() - t_start) > budget:
            log.warning("time budget of %.1f min reached at step %d of %d", args.minutes, step, args.steps)
            break
        batch = make_batch(tok, args.seed, step, args.rows, args.row_len).to(device)
        lr = lr_at(step, args.steps, args.lr, args.warmup, args.lr_floor)
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        hidden, aux = model(batch.ids, batch.positions, batch.segments, hidden_only=True)
        where = batch.labels != -100  # the lm_head runs only where there is a loss
        logits = F.linear(hidden[where], model.lm_head)
        loss = F.cross_entropy(logits, batch.labels[where])
        opt.zero_grad(set_to_none=True)
        (loss + args.aux_coef * aux).backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip))
        opt.step()
        step += 1
        n_tok = int((batch.labels != -100).sum())
        window.append((loss.item() * n_tok, aux.item(), n_tok))
        bar.update(1)
        if step % args.log_every == 0 or step == args.steps:
            mean_loss = sum(w[0] for w in window) / max(1, sum(w[2] for w in window))
            mean_aux = sum(w[1] for w in window) / len(window)
            elapsed = elapsed_before + time.monotonic() - t_start
            history.append(
                {
                    "step": step,
                    "loss": round(mean_loss, 4),
                    "aux": round(mean_aux, 4),
                    "lr": lr,
                    "minutes": elapsed / 60,
                }
            )
            bar.set_postfix(loss=f"{mean_loss:.3f}", aux=f"{mean_aux:.3f}", gnorm=f"{gnorm:.2f}")
            log.info(
                "step %d loss %.4f aux %.3f lr %.2e gnorm %.2f examples %d (%.1f min)",
                step,
                mean_loss,
                mean_aux,
                lr,
                gnorm,
                batch.examples,
                elapsed / 60,
            )
            window.clear()
        if args.eval_every and step % args.eval_every == 0:
            model.eval()
            t0 = time.monotonic()
            acc = periodic_eval(model, tok, args.eval_per_kind)
            history.append({"step": step, "eval": acc})
            log.info("eval at step %d (%.0f s): %s", step, time.monotonic() - t0, json.dumps(acc))
        if step % args.ckpt_every == 0:
            save(ckpt_dir / "last.pt")
    bar.close()
    save(ckpt_dir / "last.pt")
    total_min = (elapsed_before + time.monotonic() - t_start) / 60
    log.info("trained %d steps in %.1f min", step, total_min)

    model.eval()
    sizes = write_checkpoints(model, tok, args.out, args.out_nvfp4)
    log.info("wrote %s", ", ".join(f"{fmt} {n / 1e6:.2f} MB" for fmt, n in sizes.items()))
    acc = summarize(engine_greedy(args.out, eval_items(args.eval_per_kind)))
    log.info("final greedy eval (BF16 file): %s", json.dumps(acc))
    report = {
        "steps": step,
        "minutes": round(total_min, 2),
        "threads": args.threads,
        "config": describe(config),
        "file_bytes": sizes,
        "final_eval": acc,
        "history": history,
        "args": vars(args),
    }
    (ckpt_dir / "report.json").write_text(json.dumps(report, indent=1))
    log.info("report: %s", ckpt_dir / "report.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
