"""The name of what a model's Triton kernel variants depend on: shapes, activation dtype, which weights are NVFP4.

Models with the same profile compile the same kernels; `flint_kernels.precompile` groups its manifest by it. It is
computed from loaded weights (`of_weights`) and from a checkpoint's tensor types before anything is loaded
(`of_checkpoint`), so the engine can start compiling while the weights load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from flint_kernels.linear import NVFP4Weight

from .config import FlintConfig
from .weights import DenseMLPWeights, FlintWeights, MoEWeights

# The weights whose format selects kernel variants, in the order the name lists them. Each of the first MoE and the
# first dense layer stands for all layers of its kind (a checkpoint stores every layer of a kind the same way).
PARTS = ("head", "emb", "moe.qkv", "moe.o", "experts", "shared", "dense.qkv", "dense.o", "mlp")


def name(config: FlintConfig, dtype: torch.dtype, nvfp4: Mapping[str, bool]) -> str:
    """The profile of a model of `config` with activations in `dtype`; `nvfp4` says for each part it has whether
    that part is NVFP4 (parts the model lacks, such as a shared expert, are left out)."""
    c = config
    kinds = [f"{part}{'f4' if nvfp4[part] else 'bf'}" for part in PARTS if part in nvfp4]
    shape = (
        f"v{c.vocab_size}-h{c.hidden_size}-q{c.num_attention_heads}kv{c.num_key_value_heads}d{c.head_dim}"
        f"-i{c.intermediate_size}-e{c.num_experts}x{c.moe_intermediate_size}k{c.num_experts_per_tok}"
        f"-s{c.shared_expert_intermediate_size}-w{c.sliding_window}"
    )
    return f"{str(dtype).removeprefix('torch.')}-{shape}-{'.'.join(kinds)}"


def _any_nvfp4(w: object) -> bool:
    parts = w if isinstance(w, tuple) else (w,)
    return any(isinstance(p, NVFP4Weight) for p in parts)


def of_weights(w: FlintWeights) -> str:
    """The profile of loaded weights."""
    parts = {"head": _any_nvfp4(w.lm_head), "emb": _any_nvfp4(w.embed)}
    first_moe = next((layer for layer in w.layers if isinstance(layer.mlp, MoEWeights)), None)
    first_dense = next((layer for layer in w.layers if isinstance(layer.mlp, DenseMLPWeights)), None)
    for kind, layer in (("moe", first_moe), ("dense", first_dense)):
        if layer is None:
            continue
        parts[f"{kind}.qkv"] = _any_nvfp4(layer.qkv)
        parts[f"{kind}.o"] = _any_nvfp4(layer.o)
        mlp = layer.mlp
        if isinstance(mlp, MoEWeights):
            parts["experts"] = _any_nvfp4(mlp.experts_gate_up)
            if mlp.shared is not None:
                parts["shared"] = _any_nvfp4(mlp.shared.gate_up)
        else:
            parts["mlp"] = _any_nvfp4(mlp.gate_up)
    return name(w.config, w.dtype, parts)


def of_checkpoint(config: FlintConfig, dtype: torch.dtype, is_nvfp4: Callable[[str], bool]) -> str:
    """The profile the weights of a checkpoint will have once loaded, from `is_nvfp4(engine key)` (e.g. "lm_head",
    "layers.2.experts.gate"), which a checkpoint source answers from its header."""
    parts = {"head": is_nvfp4("lm_head"), "emb": is_nvfp4("embed")}
    layers = range(config.num_hidden_layers)
    first_moe = next((i for i in layers if config.is_moe(i)), None)
    first_dense = next((i for i in layers if not config.is_moe(i)), None)
    for kind, i in (("moe", first_moe), ("dense", first_dense)):
        if i is None:
            continue
        p = f"layers.{i}."
        parts[f"{kind}.qkv"] = any(is_nvfp4(p + x) for x in ("q", "k", "v"))
        parts[f"{kind}.o"] = is_nvfp4(p + "o")
        if kind == "moe":
            parts["experts"] = is_nvfp4(p + "experts.gate") or is_nvfp4(p + "experts.up")
            if config.shared_expert_intermediate_size:
                parts["shared"] = is_nvfp4(p + "shared.gate") or is_nvfp4(p + "shared.up")
        else:
            parts["mlp"] = is_nvfp4(p + "gate") or is_nvfp4(p + "up")
    return name(config, dtype, parts)
