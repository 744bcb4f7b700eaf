"""A trainable Flint: the engine's architecture and FP32 numerics, written for autograd over padded batches.

`flint_engine.model.FlintModel` runs under `torch.inference_mode` over a paged KV cache, so it cannot be trained.
`TrainableFlint` computes the same function over whole sequences (full causal attention, or the config's sliding
window), with the same op order as the reference kernels:

* RMSNorm multiplies its weight in FP32 after normalising; the residual is added before each norm.
* Fused per-head q/k RMSNorm, then NeoX RoPE on the RoPE layers only (NoPE on the full-attention layers).
* FP32 scores and softmax with one learned sink logit per head in the denominator only; GQA.
* Leading dense SwiGLU layers; MoE layers with an FP32 sigmoid router, top-k renormalised over the k, the routing
  weight applied after each expert's down projection, and an ungated shared expert added in full.
* Untied lm_head, FP32 logits.

Its parameter names are the checkpoint plan's engine keys (`layers.3.experts.gate`, `lm_head`, ...) with the plan's
shapes, so `provider()` hands the trained tensors to `flint_engine.checkpoint.gguf_writer.write_gguf` one to one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from flint_kernels.rmsnorm import rms_norm_ref
from flint_kernels.rope import rope_cos_sin
from torch import nn

from flint_engine.checkpoint.random_tensors import TensorProvider
from flint_engine.checkpoint.tensor_plan import TensorSpec, checkpoint_plan
from flint_engine.config import SLIDING, FlintConfig


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rope_ref` over a batch: x [B, T, H, D]; cos/sin [T, D] or per row [B, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


def attention_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor:
    """Bool [T, T]: key j is visible to query i when j <= i and, with a window, j > i - window."""
    q = torch.arange(length, device=device)[:, None]
    k = torch.arange(length, device=device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    return allowed


def attention_block(
    residual: torch.Tensor,
    x: torch.Tensor,
    input_norm: torch.Tensor,
    post_norm: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    wo: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    sinks: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    allowed: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, input norm, attention with sinks, residual add, post-attention norm.

    residual/x [B, T, H] (the first layer passes a zero residual: 0 + x is x exactly); cos/sin None for NoPE;
    `allowed` [T, T] or [B, 1, T, T]. Returns (new residual, normed input of the MLP). A pure function of tensors
    and Python scalars, so `torch.compile` can fuse it for training.
    """
    b, t, _ = x.shape
    d = q_norm.shape[0]
    residual = residual + x
    h = rms_norm_ref(residual, input_norm, eps)
    q = rms_norm_ref(F.linear(h, wq).view(b, t, num_heads, d), q_norm, eps)
    k = rms_norm_ref(F.linear(h, wk).view(b, t, num_kv_heads, d), k_norm, eps)
    v = F.linear(h, wv).view(b, t, num_kv_heads, d)
    if cos is not None and sin is not None:
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    group = num_heads // num_kv_heads
    qh = q.transpose(1, 2)  # [B, Hq, T, D]
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * d**-0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    # The sink is one more logit per head in the softmax denominator only.
    sink = sinks.view(1, num_heads, 1, 1).expand(b, num_heads, t, 1)
    probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    out = torch.matmul(probs, vh).transpose(1, 2).reshape(b, t, num_heads * d)
    residual = residual + F.linear(out, wo)
    return residual, rms_norm_ref(residual, post_norm, eps)


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """`down(silu(gate x) * up x)`."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


class _Experts(nn.Module):
    """Stacked routed experts: gate/up [E, I, H], down [E, H, I] (the plan's `experts.*` tensors)."""

    def __init__(self, num_experts: int, hidden: int, width: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.empty(num_experts, width, hidden))
        self.up = nn.Parameter(torch.empty(num_experts, width, hidden))
        self.down = nn.Parameter(torch.empty(num_experts, hidden, width))


class _SwiGLU(nn.Module):
    """gate/up [I, H], down [H, I]: `down(silu(gate x) * up x)`."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.empty(width, hidden))
        self.up = nn.Parameter(torch.empty(width, hidden))
        self.down = nn.Parameter(torch.empty(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate, self.up, self.down)


class _Layer(nn.Module):
    def __init__(self, config: FlintConfig, index: int) -> None:
        super().__init__()
        c = config
        h, d = c.hidden_size, c.head_dim
        self.index = index
        self.input_norm = nn.Parameter(torch.ones(h))
        self.post_norm = nn.Parameter(torch.ones(h))
        self.q = nn.Parameter(torch.empty(c.q_size, h))
        self.k = nn.Parameter(torch.empty(c.kv_size, h))
        self.v = nn.Parameter(torch.empty(c.kv_size, h))
        self.o = nn.Parameter(torch.empty(h, c.q_size))
        self.q_norm = nn.Parameter(torch.ones(d))
        self.k_norm = nn.Parameter(torch.ones(d))
        self.sinks = nn.Parameter(torch.zeros(c.num_attention_heads))
        self.moe = c.is_moe(index)
        if self.moe:
            self.router = nn.Parameter(torch.empty(c.num_experts, h))
            self.experts = _Experts(c.num_experts, h, c.moe_intermediate_size)
            s = c.shared_expert_intermediate_size
            self.shared = _SwiGLU(h, s) if s else None
        else:
            # Dense layers own gate/up/down directly (`layers.0.gate` in the plan).
            self.gate = nn.Parameter(torch.empty(c.intermediate_size, h))
            self.up = nn.Parameter(torch.empty(c.intermediate_size, h))
            self.down = nn.Parameter(torch.empty(h, c.intermediate_size))


@dataclass
class _Packing:
    """Several sequences packed in one row: per-token RoPE tables and which keys share the query's sequence."""

    cos_sin: tuple[torch.Tensor, torch.Tensor]  # [B, T, D] each
    same_segment: torch.Tensor  # bool [B, 1, T, T]


class TrainableFlint(nn.Module):
    """Flint for training: `forward(ids [B, T])` -> (FP32 logits [B, T, V], router load-balancing loss).

    Sequences are right-padded: causal attention never lets a real token see the padding after it, and every
    sequence starts at position 0, so each row computes exactly what the engine computes for that sequence alone.
    For training, several sequences may be packed in one row: `positions` restart at 0 for each and `segments`
    (one id per sequence, -1 for padding) keep their attention apart, which gives the same result per sequence.
    """

    def __init__(self, config: FlintConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size))
        self.layers = nn.ModuleList(_Layer(c, i) for i in range(c.num_hidden_layers))
        self.final_norm = nn.Parameter(torch.ones(c.hidden_size))
        self.lm_head = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size))
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._masks: dict[tuple[int, int | None, str], torch.Tensor] = {}
        self._block: Callable[..., tuple[torch.Tensor, torch.Tensor]] = attention_block
        self._swiglu: Callable[..., torch.Tensor] = swiglu

    def compile_blocks(self) -> TrainableFlint:
        """Fuse the attention blocks and dense MLPs with `torch.compile` (training speed; the routed experts stay
        eager because their token counts change every step). Same function, different rounding order."""
        self._block = torch.compile(attention_block, dynamic=False)
        self._swiglu = torch.compile(swiglu, dynamic=False)
        return self

    # ------------------------------------------------------------------ initialisation
    def init_weights(self, seed: int, sink_std: float = 0.0, norm_std: float = 0.0) -> TrainableFlint:
        """Deterministic init: linears N(0, 1/fan_in) with the residual-writing ones (o, down) scaled down by
        sqrt(2 * layers); embedding N(0, 1); norms 1 (+ noise `norm_std`); sinks N(0, sink_std)."""
        gen = torch.Generator().manual_seed(seed)
        depth_scale = 1.0 / math.sqrt(2 * self.config.num_hidden_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if name == "embed":
                    p.normal_(0.0, 1.0, generator=gen)
                elif leaf in ("input_norm", "post_norm", "q_norm", "k_norm") or name == "final_norm":
                    p.normal_(1.0, norm_std, generator=gen) if norm_std else p.fill_(1.0)
                elif leaf == "sinks":
                    p.normal_(0.0, sink_std, generator=gen) if sink_std else p.zero_()
                else:
                    std = 1.0 / math.sqrt(p.shape[-1])
                    if leaf in ("o", "down"):
                        std *= depth_scale
                    p.normal_(0.0, std, generator=gen)
        return self

    # ------------------------------------------------------------------ checkpoint mapping
    def plan(self) -> list[TensorSpec]:
        return checkpoint_plan(self.config)

    def check_plan(self) -> None:
        """Every plan tensor is one parameter of the same shape, and every parameter is in the plan."""
        params = dict(self.named_parameters())
        plan = {s.key: s.shape for s in self.plan()}
        missing = sorted(set(plan) - set(params))
        extra = sorted(set(params) - set(plan))
        if missing or extra:
            raise ValueError(f"parameters do not match the checkpoint plan: missing {missing}, extra {extra}")
        for key, shape in plan.items():
            if tuple(params[key].shape) != shape:
                raise ValueError(f"{key}: parameter shape {tuple(params[key].shape)} != plan shape {shape}")

    def provider(self) -> TensorProvider:
        """A `write_gguf` provider: the plan's tensor for each spec, as a detached FP32 CPU copy."""
        self.check_plan()
        params = dict(self.named_parameters())

        def provide(spec: TensorSpec) -> torch.Tensor:
            return params[spec.key].detach().to("cpu", torch.float32).clone()

        return provide

    @torch.no_grad()
    def round_to_bf16_(self) -> TrainableFlint:
        """Round every parameter to BF16 in place (what a BF16 file stores), keeping FP32 storage."""
        for p in self.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
        return self

    # ------------------------------------------------------------------ forward
    def _tables(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].shape[0] < length or self._rope[0].device != device:
            positions = torch.arange(max(length, 512), device=device)
            self._rope = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, torch.float32)
        cos, sin = self._rope
        return cos[:length], sin[:length]

    def _mask(self, length: int, window: int | None, device: torch.device) -> torch.Tensor:
        key = (length, window, str(device))
        if key not in self._masks:
            if len(self._masks) > 64:
                self._masks.clear()
            self._masks[key] = attention_mask(length, window, device)
        return self._masks[key]

    def _moe(self, layer: _Layer, h: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        scores = torch.sigmoid(F.linear(x, layer.router))  # [N, E], FP32
        top_w, top_i = torch.topk(scores, c.num_experts_per_tok, dim=-1)
        if c.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        if c.routed_scaling_factor != 1.0:
            top_w = top_w * c.routed_scaling_factor
        ex = layer.experts
        out = torch.zeros_like(x)
        flat_w = top_w.reshape(-1)
        k = c.num_experts_per_tok
        for e in range(c.num_experts):
            tok, slot = torch.where(top_i == e)
            if tok.numel() == 0:
                continue
            # index_select/index_add (not advanced indexing): their backward passes are much cheaper on CPU.
            xe = x.index_select(0, tok)
            y = F.linear(F.silu(F.linear(xe, ex.gate[e])) * F.linear(xe, ex.up[e]), ex.down[e])
            out = out.index_add(0, tok, y * flat_w.index_select(0, tok * k + slot)[:, None])
        if layer.shared is not None:
            sh = layer.shared
            out = out + self._swiglu(x, sh.gate, sh.up, sh.down)
        # Load balancing (Switch-style): E * sum_e f_e * P_e over real tokens, with P the scores normalised over E.
        keep = valid.reshape(-1) if valid is not None else torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        probs = scores[keep] / scores[keep].sum(-1, keepdim=True)
        counts = torch.zeros(c.num_experts, device=x.device).index_add_(
            0, top_i[keep].reshape(-1), torch.ones(top_i[keep].numel(), device=x.device)
        )
        frac = counts / counts.sum().clamp_min(1.0)
        aux = c.num_experts * (frac * probs.mean(0)).sum()
        return out.view(shape), aux

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        hidden_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [B, T] int64; packed rows also give `positions` and `segments` [B, T] (see the class docstring).

        Returns (FP32 logits [B, T, V], or final hidden states with `hidden_only`) and the mean balancing loss
        over the MoE layers (real tokens only when `segments` is given).
        """
        c = self.config
        pack: _Packing | None = None
        valid: torch.Tensor | None = None
        if segments is not None:
            if positions is None:
                raise ValueError("packed rows need positions as well as segments")
            cos, sin = self._tables(int(positions.max()) + 1, ids.device)
            pack = _Packing((cos[positions], sin[positions]), (segments[:, :, None] == segments[:, None, :])[:, None])
            valid = segments >= 0
        x = self.embed[ids]
        residual = torch.zeros_like(x)
        aux_total = x.new_zeros(())
        t = ids.shape[1]
        for layer in self.layers:
            assert isinstance(layer, _Layer)
            cos = sin = None
            if c.uses_rope(layer.index):
                cos, sin = pack.cos_sin if pack is not None else self._tables(t, ids.device)
            allowed = self._mask(t, c.sliding_window if c.layer_types[layer.index] == SLIDING else None, ids.device)
            if pack is not None:
                allowed = allowed & pack.same_segment  # [B, 1, T, T]
            residual, h = self._block(
                residual,
                x,
                layer.input_norm,
                layer.post_norm,
                layer.q,
                layer.k,
                layer.v,
                layer.o,
                layer.q_norm,
                layer.k_norm,
                layer.sinks,
                cos,
                sin,
                allowed,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.rms_norm_eps,
            )
            if layer.moe:
                x, aux = self._moe(layer, h, valid)
                aux_total = aux_total + aux
            else:
                x = self._swiglu(h, layer.gate, layer.up, layer.down)
        out = rms_norm_ref(residual + x, self.final_norm, c.rms_norm_eps)
        n_moe = max(1, len(c.moe_layers))
        if hidden_only:
            return out, aux_total / n_moe
        return F.linear(out, self.lm_head), aux_total / n_moe
