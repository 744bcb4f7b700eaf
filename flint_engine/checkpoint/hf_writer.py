"""Write a Hugging Face safetensors checkpoint in the released Flint layout (per-expert tensors, `softmax_offset`
sinks, FP32 router and sinks), sharded, with config.json, generation_config.json and the tokenizer files."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from flint_kernels.linear import NVFP4Weight
from safetensors.torch import save_file
from tqdm import tqdm

from ..config import FlintConfig
from .random_tensors import TensorProvider
from .tensor_plan import EXPERTS, ROUTER, SINKS, checkpoint_plan

log = logging.getLogger(__name__)

SHARD_BYTES = 4 * 1024**3


def _dense(w: torch.Tensor | NVFP4Weight) -> torch.Tensor:
    return w.dequantize(torch.float32, with_global=True) if isinstance(w, NVFP4Weight) else w.to(torch.float32)


def write_hf(
    out_dir: str | Path,
    config: FlintConfig,
    provider: TensorProvider,
    dtype: torch.dtype = torch.bfloat16,
    tokenizer: Any | None = None,
    generation_config: dict[str, Any] | None = None,
    progress: bool = True,
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = checkpoint_plan(config)
    shard: dict[str, torch.Tensor] = {}
    shard_size = 0
    total_size = 0
    weight_map: dict[str, str] = {}
    names: list[list[str]] = []

    def flush() -> None:
        nonlocal shard, shard_size
        if shard:
            idx = len(names)
            fname = f"model-{idx + 1:05d}.safetensors"
            save_file(shard, str(out / fname), metadata={"format": "pt"})
            names.append(list(shard))
            for n in shard:
                weight_map[n] = fname
        shard, shard_size = {}, 0

    for spec in tqdm(plan, desc="writing safetensors", disable=not progress, leave=False):
        w = _dense(provider(spec))
        keep_fp32 = spec.role in (SINKS, ROUTER)
        w = w if keep_fp32 else w.to(dtype)
        items = (
            [(spec.hf.format(e=e), w[e].contiguous()) for e in range(w.shape[0])]
            if spec.role == EXPERTS
            else [(spec.hf, w.contiguous())]
        )
        for name, t in items:
            nbytes = t.numel() * t.element_size()
            if shard and shard_size + nbytes > shard_bytes:
                flush()
            shard[name] = t
            shard_size += nbytes
            total_size += nbytes
    flush()
    if len(names) == 1:
        (out / "model-00001.safetensors").rename(out / "model.safetensors")
    else:
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg = config.to_hf_dict()
    cfg["dtype"] = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}[dtype]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"_from_model_config": False, **(generation_config or {})}
    if config.eos_token_id:
        gen.setdefault("eos_token_id", list(config.eos_token_id))
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if tokenizer is not None:
        tokenizer.save_hf(out)
    log.info("wrote HF checkpoint to %s (%d shard(s))", out, len(names))
    return out
