"""Build the engine's `FlintWeights` from a checkpoint source, one tensor at a time, with a progress bar."""

from __future__ import annotations

import logging
from typing import Protocol

import torch
from flint_kernels.linear import NVFP4Weight, Weight
from tqdm import tqdm

from ..config import FlintConfig
from ..weights import DenseMLPWeights, FlintWeights, LayerWeights, MoEWeights, fuse_rows
from .errors import CheckpointError
from .tensor_plan import EMBED, EXPERTS, LINEAR, NORM, ROUTER, SINKS, TensorSpec, checkpoint_plan

log = logging.getLogger(__name__)


class TensorSource(Protocol):
    path: str
    config: FlintConfig

    def load(self, spec: TensorSpec, device: torch.device) -> Weight: ...

    def nbytes(self, spec: TensorSpec) -> int: ...


def _convert(w: Weight, spec: TensorSpec, dtype: torch.dtype, path: str) -> Weight:
    if isinstance(w, NVFP4Weight):
        if spec.role not in (LINEAR, EXPERTS, EMBED):
            raise CheckpointError(f"NVFP4 is not supported for a {spec.role} tensor", tensor=spec.key, path=path)
        return w
    if not torch.isfinite(w).all():
        raise CheckpointError("tensor holds NaN or infinite values", tensor=spec.key, path=path)
    if spec.role == NORM:
        # The reference keeps norm weights in the model dtype and multiplies them in FP32.
        return w.to(dtype).to(torch.float32)
    if spec.role in (SINKS, ROUTER):
        return w.to(torch.float32)  # FP32 in the reference whatever the model dtype
    return w.to(dtype)


def assemble_weights(
    source: TensorSource,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> FlintWeights:
    device = torch.device(device)
    config = source.config
    plan = checkpoint_plan(config)
    total = sum(source.nbytes(s) for s in plan)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="loading weights", disable=not progress, leave=False)
    loaded: dict[str, Weight] = {}

    def take(key: str) -> Weight:
        return loaded.pop(key)

    layers: list[LayerWeights] = []
    by_layer: dict[int, list[TensorSpec]] = {}
    globals_: list[TensorSpec] = []
    for spec in plan:
        if spec.key.startswith("layers."):
            by_layer.setdefault(int(spec.key.split(".")[1]), []).append(spec)
        else:
            globals_.append(spec)

    def load(spec: TensorSpec) -> None:
        loaded[spec.key] = _convert(source.load(spec, device), spec, dtype, source.path)
        bar.update(source.nbytes(spec))

    try:
        for spec in globals_:
            load(spec)
        for i in range(config.num_hidden_layers):
            for spec in by_layer[i]:
                load(spec)
            p = f"layers.{i}."
            if config.is_moe(i):
                shared = None
                if config.shared_expert_intermediate_size:
                    shared = DenseMLPWeights(
                        gate_up=fuse_rows([take(p + "shared.gate"), take(p + "shared.up")]),
                        down=take(p + "shared.down"),
                    )
                gate_up = fuse_rows([take(p + "experts.gate"), take(p + "experts.up")])
                if isinstance(gate_up, tuple):
                    raise CheckpointError(
                        "expert gate and up projections must share one storage type",
                        tensor=p + "experts",
                        path=source.path,
                    )
                down = take(p + "experts.down")
                mlp: DenseMLPWeights | MoEWeights = MoEWeights(
                    router=take(p + "router"),
                    experts_gate_up=gate_up,
                    experts_down=down,
                    shared=shared,  # type: ignore[arg-type]
                )
            else:
                mlp = DenseMLPWeights(gate_up=fuse_rows([take(p + "gate"), take(p + "up")]), down=take(p + "down"))
            layers.append(
                LayerWeights(
                    input_norm=take(p + "input_norm"),  # type: ignore[arg-type]
                    post_norm=take(p + "post_norm"),  # type: ignore[arg-type]
                    qkv=fuse_rows([take(p + "q"), take(p + "k"), take(p + "v")]),
                    q_norm=take(p + "q_norm"),  # type: ignore[arg-type]
                    k_norm=take(p + "k_norm"),  # type: ignore[arg-type]
                    sinks=take(p + "sinks"),  # type: ignore[arg-type]
                    o=take(p + "o"),
                    mlp=mlp,
                )
            )
    finally:
        bar.close()
    weights = FlintWeights(
        config=config,
        dtype=dtype,
        embed=loaded.pop("embed"),
        final_norm=loaded.pop("final_norm"),  # type: ignore[arg-type]
        lm_head=loaded.pop("lm_head"),
        layers=layers,
    )
    log.info("loaded %s: %.2f GB of weights on %s", source.path, weights.nbytes() / 1e9, device)
    return weights
