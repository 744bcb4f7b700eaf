"""The model's weights in the engine's layout: fused q|k|v and gate|up, stacked experts, BF16/FP32 or NVFP4.

Norm weights, sinks and the router are FP32 (the reference keeps sinks and router in FP32 and multiplies norm
weights in FP32). Linear weights are dense tensors in the model dtype or `NVFP4Weight`s (W4A16).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from flint_kernels import nvfp4
from flint_kernels.linear import NVFP4Weight, Weight

from .config import FlintConfig

# A projection whose parts could not be fused (different storage types) is a tuple whose outputs concatenate.
Projection = Weight | tuple[Weight, ...]


def fuse_rows(parts: list[Weight]) -> Projection:
    """Concatenate weights along the output dimension when they share a storage type; else keep them apart."""
    if all(isinstance(p, torch.Tensor) for p in parts) and len({p.dtype for p in parts}) == 1:  # type: ignore[union-attr]
        return torch.cat(parts, dim=-2)  # type: ignore[arg-type]
    if all(isinstance(p, NVFP4Weight) for p in parts):
        ps: list[NVFP4Weight] = parts  # type: ignore[assignment]
        return NVFP4Weight(
            qweight=torch.cat([p.qweight for p in ps], dim=-2),
            scales=torch.cat([p.scales for p in ps], dim=-2),
            global_scale=torch.cat([p.global_scale for p in ps], dim=-1),
            segments=tuple(s for p in ps for s in p.segments),
        )
    return tuple(parts)


@dataclass
class DenseMLPWeights:
    gate_up: Projection  # [2I, H], gate rows first
    down: Projection  # [H, I]


@dataclass
class MoEWeights:
    router: torch.Tensor  # FP32 [E, H]
    experts_gate_up: Weight  # [E, 2I, H]
    experts_down: Weight  # [E, H, I]
    shared: DenseMLPWeights | None


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # FP32 [H]
    post_norm: torch.Tensor  # FP32 [H]
    qkv: Projection  # [Hq*D + 2*Hkv*D, H]
    q_norm: torch.Tensor  # FP32 [D]
    k_norm: torch.Tensor  # FP32 [D]
    sinks: torch.Tensor  # FP32 [Hq]
    o: Projection  # [H, Hq*D]
    mlp: DenseMLPWeights | MoEWeights


@dataclass
class FlintWeights:
    config: FlintConfig
    dtype: torch.dtype  # activation dtype (bfloat16 or float32)
    embed: Weight  # [V, H]
    final_norm: torch.Tensor  # FP32 [H]
    lm_head: Weight  # [V, H]
    layers: list[LayerWeights] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return self.final_norm.device

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every storage tensor (for byte accounting and device moves)."""
        yield from _walk(self.embed)
        yield self.final_norm
        yield from _walk(self.lm_head)
        for layer in self.layers:
            for value in vars(layer).values():
                yield from _walk(value)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def nvfp4_weights(self) -> Iterator[NVFP4Weight]:
        """Every NVFP4 weight the linear and MoE kernels read (the embedding's rows are dequantised, not read so)."""
        yield from _nvfp4_in(self.lm_head)
        for layer in self.layers:
            for value in vars(layer).values():
                yield from _nvfp4_in(value)

    def is_nvfp4(self) -> bool:
        return any(isinstance(w, NVFP4Weight) for w in _linears(self))

    def kernel_profile(self) -> str:
        """What the Triton kernel variants depend on (`flint_engine.kernel_profile`)."""
        from .kernel_profile import of_weights

        return of_weights(self)

    def has_nvfp4_experts(self) -> bool:
        """Whether any MoE layer's routed experts are NVFP4 (long prefills then copy them to BF16 for a step)."""
        return any(isinstance(layer.mlp, MoEWeights) and isinstance(layer.mlp.experts_gate_up, NVFP4Weight)
                   for layer in self.layers)  # fmt: skip


def as_float32(w: FlintWeights) -> FlintWeights:
    """The same weights with FP32 activations: dense tensors upcast exactly, NVFP4 weights shared as they are.

    A model on these evaluates the BF16/NVFP4 checkpoint without BF16 rounding between ops: the yardstick that the
    plain and the fused BF16 paths are each compared with."""

    def up(obj: object) -> object:
        if isinstance(obj, torch.Tensor):
            return obj.float() if obj.is_floating_point() else obj
        if isinstance(obj, tuple):
            return tuple(up(o) for o in obj)
        if isinstance(obj, (DenseMLPWeights, MoEWeights, LayerWeights)):
            return replace(obj, **{k: up(v) for k, v in vars(obj).items()})
        return obj  # NVFP4Weight: exact codes and scales, dequantised to the activation dtype when used

    return replace(
        w,
        dtype=torch.float32,
        embed=up(w.embed),
        lm_head=up(w.lm_head),
        final_norm=up(w.final_norm),
        layers=[up(layer) for layer in w.layers],
    )


def _leaves(obj: object) -> Iterator[torch.Tensor | NVFP4Weight]:
    """The tensors and NVFP4 weights inside a weight, a tuple of parts or an MLP's weights."""
    if isinstance(obj, (torch.Tensor, NVFP4Weight)):
        yield obj
    elif isinstance(obj, tuple):
        for o in obj:
            yield from _leaves(o)
    elif isinstance(obj, (DenseMLPWeights, MoEWeights)):
        for value in vars(obj).values():
            yield from _leaves(value)


def _walk(obj: object) -> Iterator[torch.Tensor]:
    for leaf in _leaves(obj):
        if isinstance(leaf, NVFP4Weight):
            yield leaf.qweight
            yield leaf.scales
            yield leaf.global_scale
            if leaf.extra_ready_scales is not None:
                yield leaf.extra_ready_scales
            if leaf.extra_ready_codes is not None:
                yield leaf.extra_ready_codes
        else:
            yield leaf


def _nvfp4_in(obj: object) -> Iterator[NVFP4Weight]:
    return (leaf for leaf in _leaves(obj) if isinstance(leaf, NVFP4Weight))


def _linears(w: FlintWeights) -> Iterator[object]:
    yield w.lm_head
    for layer in w.layers:
        yield layer.qkv
        yield layer.o
        mlp = layer.mlp
        if isinstance(mlp, MoEWeights):
            yield mlp.experts_gate_up
            yield mlp.experts_down


# ---------------------------------------------------------------------------------------------- random weights
class _Rand:
    """Deterministic random tensors made directly on the target device (no host copy of a 40B model)."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.device = device

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype, mean: float = 0.0) -> torch.Tensor:
        t = torch.empty(shape, dtype=torch.float32 if dtype != torch.bfloat16 else dtype, device=self.device)
        t.normal_(mean, std, generator=self.gen)
        return t.to(dtype)

    def nvfp4(self, shape: tuple[int, ...], std: float, lead: tuple[int, ...] = ()) -> NVFP4Weight:
        """Random codes and scales with roughly the given standard deviation, power-of-two global scale."""
        *_, n, k = shape
        q = torch.randint(0, 256, (*shape[:-1], k // 2), generator=self.gen, device=self.device, dtype=torch.int32)
        # Scale bytes with exponent field 7 decode to [0.5, 0.94) on the doubled table (rms 5.85): rms(w) ~ 4.2 g.
        m = torch.randint(0, 8, (*shape[:-1], k // nvfp4.QK_SUB), generator=self.gen, device=self.device)
        scales = ((7 << 3) | m).to(torch.uint8)
        g = 2.0 ** round(torch.log2(torch.tensor(std / 4.2)).item())
        global_scale = torch.full((*lead, 1), g, dtype=torch.float32, device=self.device)
        return NVFP4Weight(q.to(torch.uint8), scales, global_scale, (n,))


def random_weights(
    config: FlintConfig,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    nvfp4_linears: bool = False,
    gain: float = 1.0,
) -> FlintWeights:
    """Random Flint weights built straight on `device` (used by tests and benchmarks).

    Linear weights have standard deviation gain/sqrt(fan_in), so every block contributes to the residual
    stream at a similar scale and a wrong op anywhere shows in the logits. With `nvfp4_linears` every linear
    (lm_head included) is NVFP4, as in the official NVFP4 file.
    """
    device = torch.device(device)
    r = _Rand(seed, device)
    c = config
    h, d = c.hidden_size, c.head_dim

    def lin(n: int, k: int, lead: tuple[int, ...] = ()) -> Weight:
        std = gain / k**0.5
        if nvfp4_linears and k % nvfp4.QK == 0:
            return r.nvfp4((*lead, n, k), std, lead)
        return r.normal((*lead, n, k), std, dtype)

    def norm(n: int) -> torch.Tensor:
        return r.normal((n,), 0.1, torch.float32, mean=1.0).to(dtype).float()

    def mlp(width: int) -> DenseMLPWeights:
        return DenseMLPWeights(gate_up=fuse_rows([lin(width, h), lin(width, h)]), down=lin(h, width))

    layers = []
    for i in range(c.num_hidden_layers):
        if c.is_moe(i):
            e, w = c.num_experts, c.moe_intermediate_size
            block: DenseMLPWeights | MoEWeights = MoEWeights(
                router=r.normal((e, h), gain / h**0.5, torch.float32),
                experts_gate_up=fuse_rows([lin(w, h, (e,)), lin(w, h, (e,))]),  # type: ignore[arg-type]
                experts_down=lin(h, w, (e,)),
                shared=mlp(c.shared_expert_intermediate_size) if c.shared_expert_intermediate_size else None,
            )
        else:
            block = mlp(c.intermediate_size)
        layers.append(
            LayerWeights(
                input_norm=norm(h),
                post_norm=norm(h),
                qkv=fuse_rows([lin(c.q_size, h), lin(c.kv_size, h), lin(c.kv_size, h)]),
                q_norm=norm(d),
                k_norm=norm(d),
                sinks=r.normal((c.num_attention_heads,), 1.0, torch.float32),
                o=lin(h, c.q_size),
                mlp=block,
            )
        )
    return FlintWeights(
        config=c,
        dtype=dtype,
        embed=r.normal((c.vocab_size, h), 1.0, dtype),
        final_norm=norm(h),
        lm_head=lin(c.vocab_size, h),
        layers=layers,
    )
