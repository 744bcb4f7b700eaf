"""`flint`: checkpoint tools (make random checkpoints, convert HF -> GGUF, inspect) and local generation
(`flint generate`, in `generate_cli`; `flint run-batch`, in `batch_cli`)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import torch
from flint_kernels import nvfp4_mma_scales

from .batch_cli import add_parser as add_batch_parser
from .checkpoint import FLINT_GENERATION_DEFAULTS, CheckpointError, open_source
from .checkpoint.gguf_writer import FORMATS, write_gguf
from .checkpoint.hf_writer import write_hf
from .checkpoint.random_tensors import random_provider
from .checkpoint.tensor_plan import TensorSpec
from .config import PRESETS, ConfigError, FlintConfig, describe, preset
from .engine_config import IDLE_PREFILL_TOKENS_GPU, EngineConfig
from .generate_cli import add_parser as add_generate_parser

log = logging.getLogger("flint")

_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def _default_tokenizer(config: FlintConfig):
    from .tokenizer import build_default_tokenizer

    return build_default_tokenizer(config.vocab_size)


def _with_special_ids(config: FlintConfig, tokenizer: object) -> FlintConfig:
    """Record the tokenizer's BOS/EOS/PAD ids in the config so every format carries them."""
    eos = tuple(getattr(tokenizer, "eos_token_ids", ()) or ())
    return config.replace(
        bos_token_id=getattr(tokenizer, "bos_token_id", None),
        eos_token_id=eos,
        pad_token_id=getattr(tokenizer, "pad_token_id", None),
    )


def cmd_make_checkpoint(args: argparse.Namespace) -> int:
    config = preset(args.preset)
    if args.meta_only:
        tokenizer = _default_tokenizer(config)
        config = _with_special_ids(config, tokenizer)
        print(describe(config))
        print(f"parameters: {config.parameter_count():,} ({config.parameter_count() / 1e9:.3f}B)")
        if args.format == "hf":
            fp32 = len(config.moe_layers) * config.num_experts * config.hidden_size
            fp32 += config.num_hidden_layers * config.num_attention_heads
            size = 2 * config.parameter_count() + 2 * fp32  # router and sinks are stored in FP32
            print(f"hf safetensors bf16 size: {size:,} bytes ({size / 1e9:.2f} GB)")
        else:
            summary = write_gguf(
                None,
                config,
                None,
                fmt=args.format,
                tokenizer=tokenizer,
                generation=FLINT_GENERATION_DEFAULTS,
                nvfp4_scope=args.nvfp4_scope,
            )
            print(f"gguf {args.format} file size: {summary.file_bytes:,} bytes ({summary.file_bytes / 1e9:.2f} GB)")
            print("tensor types: " + ", ".join(f"{k} x{v}" for k, v in sorted(summary.tensor_types.items())))
        return 0
    if not args.out:
        print("error: --out is required unless --meta-only", file=sys.stderr)
        return 2
    tokenizer = _default_tokenizer(config)
    config = _with_special_ids(config, tokenizer)
    provider = random_provider(
        config, seed=args.seed, nvfp4_values=args.nvfp4_values or args.format == "nvfp4", device=args.device
    )
    if args.format == "hf":
        write_hf(
            args.out,
            config,
            provider,
            dtype=_DTYPES[args.dtype],
            tokenizer=tokenizer,
            generation_config=FLINT_GENERATION_DEFAULTS,
            progress=not args.quiet,
        )
    else:
        summary = write_gguf(
            args.out,
            config,
            provider,
            fmt=args.format,
            tokenizer=tokenizer,
            generation=FLINT_GENERATION_DEFAULTS,
            nvfp4_scope=args.nvfp4_scope,
            name=f"flint-{args.preset}-random-seed{args.seed}",
            progress=not args.quiet,
        )
        print(f"wrote {args.out}: {summary.file_bytes:,} bytes")
    print(describe(config))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    src = open_source(args.src)
    from .checkpoint.hf_source import HFSource

    if not isinstance(src, HFSource):
        print("error: convert reads a Hugging Face safetensors directory", file=sys.stderr)
        return 2
    from .tokenizer import FlintTokenizer

    tokenizer = FlintTokenizer.from_hf_dir(src.path) if (Path(src.path) / "tokenizer.json").is_file() else None
    if tokenizer is None:
        log.warning("no tokenizer.json in %s: the GGUF file will carry no tokenizer", src.path)
    cpu = torch.device("cpu")

    def provider(spec: TensorSpec) -> torch.Tensor:
        return src.load(spec, cpu).to(torch.float32)

    gen = dict(FLINT_GENERATION_DEFAULTS)
    gen.update({k: v for k, v in (src.read_json("generation_config.json") or {}).items() if k in gen})
    summary = write_gguf(
        args.out,
        src.config,
        provider,
        fmt=args.to,
        tokenizer=tokenizer,
        generation=gen,
        nvfp4_scope=args.nvfp4_scope,
        name=Path(src.path).name,
        progress=not args.quiet,
    )
    print(f"wrote {args.out}: {summary.file_bytes:,} bytes, tensor types {summary.tensor_types}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    src = open_source(args.path)
    info: dict[str, object] = {"path": src.path, "format": src.format_name, "architecture": describe(src.config)}
    types = getattr(src, "tensor_types", None)
    if types is not None:
        counts: dict[str, int] = {}
        for t in types().values():
            counts[t] = counts.get(t, 0) + 1
        info["tensor_types"] = counts
    info["config"] = src.config.to_hf_dict()
    print(json.dumps(info, indent=2))
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    """How much context fits next to the weights on one GPU, from the engine's own sizing code."""
    from flint_kernels import nvfp4_mma_codes
    from flint_kernels.router_triton import split_nbytes
    from gguf import GGMLQuantizationType

    from .checkpoint.gguf_writer import plan_tensors
    from .kv_cache_plan import gpu_kv_budget, plan_kv_cache
    from .step_graphs import MAX_TOKENS as STEP_GRAPH_MAX_TOKENS

    config = preset(args.preset)
    total = int(args.gpu_memory_gib * 2**30)
    # The largest step the engine runs (prefill-only steps on the fused GPU path), by the engine's own rule.
    budgets = EngineConfig(
        max_num_batched_tokens=args.max_num_batched_tokens, idle_prefill_tokens=args.idle_prefill_tokens
    )
    step_tokens = budgets.prefill_tokens(fused_gpu=True)
    rows = []
    # The MMA kernels' ready bytes beside the weight's own: as the engine would make them under the same settings
    # (FLINT_MMA_READY_*: only 1 keeps them beside; auto and replace put them in the own bytes' place, adding nothing).
    try:
        scales_mode = args.ready_scales or nvfp4_mma_scales.setting()
        codes_mode = args.ready_codes or nvfp4_mma_codes.setting()
    except ValueError as exc:  # a misspelt FLINT_MMA_READY_* variable
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # auto makes both in the weight's own bytes' place (nvfp4_mma_scales.replaces, nvfp4_mma_codes.replaces)
    ready_scales = scales_mode == "1"
    ready_codes = codes_mode == "1"
    # The fused path keeps each MoE router weight also as three BF16 parts (router_triton.prepare).
    router_parts = split_nbytes(config.num_experts, config.hidden_size) * len(config.moe_layers)
    for fmt in args.weights:
        planned = plan_tensors(config, fmt)
        weight_bytes = sum(p.nbytes for p in planned) + router_parts
        nvfp4_values = sum(math.prod(p.shape) for p in planned if p.ggml_type == GGMLQuantizationType.NVFP4)
        if ready_scales:  # beside the UE4M3 bytes, as FLINT_MMA_READY_SCALES=1 makes them
            weight_bytes += nvfp4_mma_scales.extra_bytes(nvfp4_values)
        if ready_codes:  # beside the codes, as FLINT_MMA_READY_CODES=1 makes them
            weight_bytes += nvfp4_mma_codes.extra_bytes(nvfp4_values)
        budget = gpu_kv_budget(
            config,
            total - weight_bytes - args.runtime_overhead_gib * 2**30,
            total,
            args.gpu_memory_utilization,
            args.max_num_seqs,
            step_tokens,
            nvfp4_experts=fmt == "nvfp4",
            # The step graphs' pool, as the engine keeps it with its defaults (cuda_graphs, step_graphs).
            graph_tokens=min(step_tokens, STEP_GRAPH_MAX_TOKENS),
        )
        plan = plan_kv_cache(config, budget, args.block_size, args.max_num_seqs, step_tokens)
        rows.append((fmt, weight_bytes, plan))
    print(
        f"{describe(config)}\nGPU memory {args.gpu_memory_gib} GiB, utilization {args.gpu_memory_utilization},"
        f" max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens},"
        f" idle_prefill_tokens {args.idle_prefill_tokens}"
    )
    print(
        f"{'weights':>8} {'weight GB':>10} {'KV GiB':>8} {'full blocks':>12} {'context tokens':>15}"
        f" {'sliding blocks':>15} {'max context':>12}"
    )
    for fmt, wb, plan in rows:
        max_ctx = min(plan.token_capacity, config.max_position_embeddings)
        print(
            f"{fmt:>8} {wb / 1e9:>10.2f} {plan.total_bytes / 2**30:>8.2f} {plan.num_full_blocks:>12,}"
            f" {plan.token_capacity:>15,} {plan.num_sliding_blocks:>15,} {max_ctx:>12,}"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flint", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    mk = sub.add_parser("make-checkpoint", help="write a deterministic random-weight checkpoint of a preset")
    mk.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    mk.add_argument(
        "--format",
        default="bf16",
        choices=["hf", *FORMATS],
        help="hf (safetensors directory) or a GGUF type: f32, bf16, nvfp4",
    )
    mk.add_argument("--out", help="output file (GGUF) or directory (hf)")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES), help="safetensors dtype for --format hf")
    mk.add_argument(
        "--nvfp4-values",
        action="store_true",
        help="draw linear weights on the NVFP4 grid so BF16 and NVFP4 files hold the same model",
    )
    mk.add_argument(
        "--nvfp4-scope",
        default="all",
        choices=["all", "experts"],
        help="which linears become NVFP4: all (official file) or routed experts only",
    )
    mk.add_argument(
        "--device",
        default="cpu",
        help="draw the values on this device (cuda: the full-size model in about a minute; other values than cpu's)",
    )
    mk.add_argument("--meta-only", action="store_true", help="report parameter count and file size, write nothing")
    mk.add_argument("--quiet", action="store_true")
    mk.set_defaults(func=cmd_make_checkpoint)

    cv = sub.add_parser("convert", help="convert a Hugging Face safetensors checkpoint to GGUF")
    cv.add_argument("src", help="HF checkpoint directory")
    cv.add_argument("--to", default="bf16", choices=FORMATS)
    cv.add_argument("--out", required=True)
    cv.add_argument("--nvfp4-scope", default="all", choices=["all", "experts"])
    cv.add_argument("--quiet", action="store_true")
    cv.set_defaults(func=cmd_convert)

    cap = sub.add_parser("capacity", help="KV-cache capacity next to the weights on one GPU (engine sizing code)")
    cap.add_argument("--preset", default="full", choices=sorted(PRESETS))
    cap.add_argument("--weights", nargs="+", default=["bf16", "nvfp4"], choices=FORMATS)
    cap.add_argument("--gpu-memory-gib", type=float, default=143771 / 1024, help="default: an H200 (143771 MiB)")
    cap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    cap.add_argument("--runtime-overhead-gib", type=float, default=1.0, help="CUDA context and allocator slack")
    cap.add_argument("--max-num-seqs", type=int, default=64)
    cap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    cap.add_argument(
        "--idle-prefill-tokens",
        type=int,
        default=IDLE_PREFILL_TOKENS_GPU,
        help="token budget of prefill-only steps (the engine's default on the fused GPU path)",
    )
    cap.add_argument("--block-size", type=int, default=16)
    for name, env, what in (
        ("scales", "FLINT_MMA_READY_SCALES", "ready scale bytes (1/16 byte a value)"),
        ("codes", "FLINT_MMA_READY_CODES", "ready codes (1/2 byte a value)"),
    ):
        cap.add_argument(
            f"--ready-{name}",
            nargs="?",
            const="1",
            default=None,
            choices=nvfp4_mma_scales.SETTINGS,
            help=f"the NVFP4 MMA kernels' {what} as {env} makes them: auto (in the weight's own bytes' place where "
            f"the table reads them), 1 (beside the weight's own bytes), replace (in their place) or 0; auto and "
            f"replace add no memory; default: ${env}, else auto",
        )
        cap.add_argument(f"--no-ready-{name}", dest=f"ready_{name}", action="store_const", const="0", help="--ready-"
                         f"{name} 0")  # fmt: skip
    cap.set_defaults(func=cmd_capacity)

    ins = sub.add_parser("inspect", help="print a checkpoint's architecture and tensor types")
    ins.add_argument("path")
    ins.set_defaults(func=cmd_inspect)
    add_generate_parser(sub)
    add_batch_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except (CheckpointError, ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
