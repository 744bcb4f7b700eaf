"""Flint's forward pass over a flat varlen batch, written against the op table in `flint_kernels.dispatch`.

Each op is one call into `self.kernels`, so a fused kernel replaces its reference one for one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from flint_kernels.dispatch import REFERENCE, Kernels
from flint_kernels.linear import NVFP4Weight
from flint_kernels.moe import SharedExpert
from flint_kernels.rope import rope_cos_sin

from .forward_batch import ForwardBatch, fresh_sequences_batch
from .kv_cache import KVCache
from .weights import DenseMLPWeights, FlintWeights, LayerWeights, MoEWeights, Projection
from .weights_ahead import WeightsAhead

log = logging.getLogger(__name__)

# The router's output: top-k weights (FP32) and expert ids, [T, k] each.
Routing = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Carry:
    """What the forward carries from layer to layer: the normed input of the next projection (`h`), the residual
    stream, an MLP output whose add and norm the next qkv projection does (`pending`), the RoPE table, and the side
    stream that asks L2 for weights ahead (decode graphs only)."""

    h: torch.Tensor
    residual: torch.Tensor
    cos_sin: torch.Tensor
    ahead: WeightsAhead | None = None
    pending: torch.Tensor | None = None


class FlintModel:
    def __init__(self, weights: FlintWeights, kernels: Kernels = REFERENCE) -> None:
        self.weights = weights
        self.config = weights.config
        self.kernels = kernels
        self.dtype = weights.dtype
        self.device = weights.device
        if kernels.prepare_router is not None:
            for layer in weights.layers:
                if isinstance(layer.mlp, MoEWeights):
                    kernels.prepare_router(layer.mlp.router)
        if kernels.prepare_nvfp4 is not None:
            start = time.perf_counter()
            nvfp4 = list(weights.nvfp4_weights())
            for w in nvfp4:
                kernels.prepare_nvfp4(w)
            # A cost of every GPU start (the ready scales and codes where the table reads them), which kernels make:
            # timed to their end, not to the queue's.
            if nvfp4 and weights.device.type == "cuda":
                torch.cuda.synchronize(weights.device)
                log.info(
                    "prepared %d NVFP4 weights for the fused kernels in %.1f s", len(nvfp4), time.perf_counter() - start
                )
            # Ready bytes kept beside the weights' own (FLINT_MMA_READY_SCALES=1 / FLINT_MMA_READY_CODES=1; the
            # default puts them in the own bytes' place) are memory the KV cache does not get: say so once.
            extra = [w.extra_nbytes for w in nvfp4 if w.extra_nbytes]
            if extra:
                log.info("ready scale and code bytes for %d NVFP4 weights: %.2f GB", len(extra), sum(extra) / 1e9)
        # Weights asked into L2 ahead of their kernels on a side stream of captured graphs (op `l2_ahead`).
        self.weights_ahead = (
            WeightsAhead(weights, kernels.l2_ahead)
            if kernels.l2_ahead is not None and weights.device.type == "cuda"
            else None
        )

    # ------------------------------------------------------------------ building blocks
    def _linear(self, x: torch.Tensor, w: Projection) -> torch.Tensor:
        if isinstance(w, tuple):
            return torch.cat([self.kernels.linear(x, part) for part in w], dim=-1)
        return self.kernels.linear(x, w)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.weights.embed
        if isinstance(e, NVFP4Weight):
            rows = NVFP4Weight(e.qweight[ids], e.scales[ids], e.global_scale, e.segments)
            return rows.dequantize(self.dtype, with_global=True)
        return e[ids].to(self.dtype)

    def _dense_mlp(self, x: torch.Tensor, w: DenseMLPWeights) -> torch.Tensor:
        return self._linear(self.kernels.silu_and_mul(self._linear(x, w.gate_up)), w.down)

    def _route(self, x: torch.Tensor, w: MoEWeights) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        return self.kernels.router(x, w.router, c.num_experts_per_tok, c.norm_topk_prob, c.routed_scaling_factor)

    @staticmethod
    def _shared(w: MoEWeights) -> SharedExpert | None:
        """The shared expert as one op argument, when both its projections are single weights."""
        s = w.shared
        if s is not None and not isinstance(s.gate_up, tuple) and not isinstance(s.down, tuple):
            return (s.gate_up, s.down)
        return None

    def _moe(self, x: torch.Tensor, w: MoEWeights, routing: Routing | None = None) -> torch.Tensor:
        topk_w, topk_ids = routing if routing is not None else self._route(x, w)
        shared = self._shared(w)
        if shared is not None:
            # One op for routed + shared experts, so the fused path can run them in the same launches.
            return self.kernels.moe(x, topk_w, topk_ids, w.experts_gate_up, w.experts_down, shared)
        out = self.kernels.moe(x, topk_w, topk_ids, w.experts_gate_up, w.experts_down)
        if w.shared is not None:
            # The shared expert is added in full (no gate), after the routed sum, as in the reference.
            out = out + self._dense_mlp(x, w.shared)
        return out

    def _attn_add_norm(
        self, o_in: torch.Tensor, lw: LayerWeights, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Routing | None]:
        """The o projection, the residual add and the post-attention RMSNorm: (normed, new residual, routing).

        Routing (the MoE router's weights and expert ids) comes back when the op table's router op does the add and
        norm itself (one launch at decode); otherwise it is None and the MoE block routes.
        """
        k, c = self.kernels, self.config
        if k.linear_add_rms_norm is not None and not isinstance(lw.o, tuple):
            h, residual = k.linear_add_rms_norm(o_in, lw.o, residual, lw.post_norm, c.rms_norm_eps)
            return h, residual, None
        o = self._linear(o_in, lw.o)
        if k.add_rms_norm_router is not None and isinstance(lw.mlp, MoEWeights):
            h, residual, topk_w, topk_ids = k.add_rms_norm_router(
                o, residual, lw.post_norm, c.rms_norm_eps, lw.mlp.router, c.num_experts_per_tok, c.norm_topk_prob,
                c.routed_scaling_factor,
            )  # fmt: skip
            return h, residual, (topk_w, topk_ids)
        h, residual = k.add_rms_norm(o, residual, lw.post_norm, c.rms_norm_eps)
        return h, residual, None

    def _mlp_add_norm(
        self,
        h: torch.Tensor,
        mlp: DenseMLPWeights | MoEWeights,
        residual: torch.Tensor,
        norm_w: torch.Tensor,
        routing: Routing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP block, the residual add and the next RMSNorm: (normed, new residual).

        The op table's optional fused ops do the add and norm inside the MLP's last launch; otherwise they run as
        the add+RMSNorm op after it.
        """
        k, eps = self.kernels, self.config.rms_norm_eps
        if isinstance(mlp, MoEWeights):
            shared = self._shared(mlp)
            if k.moe_add_rms_norm is not None and (shared is not None or mlp.shared is None):
                topk_w, topk_ids = routing if routing is not None else self._route(h, mlp)
                wg, wd = mlp.experts_gate_up, mlp.experts_down
                return k.moe_add_rms_norm(h, topk_w, topk_ids, wg, wd, shared, residual, norm_w, eps)
            x = self._moe(h, mlp, routing)
        elif (
            k.linear_add_rms_norm is not None and not isinstance(mlp.gate_up, tuple) and not isinstance(mlp.down, tuple)
        ):
            return k.linear_add_rms_norm(k.silu_and_mul(k.linear(h, mlp.gate_up)), mlp.down, residual, norm_w, eps)
        else:
            x = self._dense_mlp(h, mlp)
        return k.add_rms_norm(x, residual, norm_w, eps)

    def _mlp_out(self, h: torch.Tensor, mlp: DenseMLPWeights | MoEWeights, routing: Routing | None) -> torch.Tensor:
        """The MLP block's output before the residual add (the next op does the add and the norm)."""
        return self._moe(h, mlp, routing) if isinstance(mlp, MoEWeights) else self._dense_mlp(h, mlp)

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Hidden states [T, H] after the final norm, for every token of the batch; K/V land in `cache`."""
        k = self.kernels
        carry = self.begin(batch, ahead=True)
        for i in range(len(self.weights.layers)):
            if k.qkv_attention is not None:
                attn = self._qkv_attention(i, carry, batch, cache)
            else:
                attn = self.attend(i, self.layer_queries(i, carry, batch, cache), batch, cache)
            self.layer_mlp(i, attn, carry)
        if carry.ahead is not None:
            carry.ahead.join()
        return carry.h

    # The forward in pieces around attention, the one op that reads the batch's sequence structure (host lists):
    # `begin`, then for each layer `layer_queries`, `attend` and `layer_mlp`. `StepGraphs` captures the rest of a
    # step as CUDA graphs and runs only `attend` eagerly.
    def begin(self, batch: ForwardBatch, ahead: bool = False) -> Carry:
        """The embedding, the RoPE table and the first input norm; `ahead`: ask L2 for weights on a side stream where
        the op table says so (decode graphs)."""
        c, k = self.config, self.kernels
        layers = self.weights.layers
        x = self._embed(batch.input_ids)
        cos_sin = rope_cos_sin(batch.positions, c.head_dim, c.rope_theta, self.dtype)
        wa = self.weights_ahead if ahead else None
        if wa is not None and not wa.begin(batch.num_tokens):
            wa = None
        return Carry(k.rms_norm(x, layers[0].input_norm, c.rms_norm_eps), x, cos_sin, wa)

    def _qkv(self, i: int, carry: Carry) -> torch.Tensor:
        """Layer i's q|k|v projection (with the pending MLP output's add and norm where the op table fuses them)."""
        lw, c = self.weights.layers[i], self.config
        if carry.pending is not None:
            qkv, carry.residual = self.kernels.add_rms_norm_linear(
                carry.pending, carry.residual, lw.input_norm, c.rms_norm_eps, lw.qkv
            )
            carry.pending = None
        else:
            qkv = self._linear(carry.h, lw.qkv)
        if carry.ahead is not None:
            carry.ahead.after_qkv(i)
        return qkv

    def _qkv_args(self, i: int, qkv: torch.Tensor, carry: Carry, batch: ForwardBatch, cache: KVCache) -> tuple:
        c, lw = self.config, self.weights.layers[i]
        k_cache, v_cache, sliding = cache.layer(i)
        rope = carry.cos_sin if c.uses_rope(i) else None
        slots = batch.sliding_slots if sliding else batch.full_slots
        heads = (c.num_attention_heads, c.num_key_value_heads)
        return (qkv, lw.q_norm, lw.k_norm, c.rms_norm_eps, rope, k_cache, v_cache, slots, *heads)

    def _attn_args(self, i: int, batch: ForwardBatch, cache: KVCache) -> tuple:
        c, lw = self.config, self.weights.layers[i]
        sliding = cache.layer(i)[2]
        tables = batch.sliding_block_tables if sliding else batch.full_block_tables
        return (tables, batch.attn, lw.sinks, c.head_dim**-0.5, c.sliding_window if sliding else None)

    def layer_queries(
        self, i: int, carry: Carry, batch: ForwardBatch, cache: KVCache, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Layer i up to its attention: the q|k|v projection, then the Q/K norm, RoPE and the K/V cache write.
        Returns the queries [T, Hq, D] (in `out` if given)."""
        qkv = self._qkv(i, carry)
        return self.kernels.qk_norm_rope_write(*self._qkv_args(i, qkv, carry, batch, cache), out=out)

    def attend(
        self, i: int, q: torch.Tensor, batch: ForwardBatch, cache: KVCache, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Layer i's attention of queries `q` over the cache: [T, Hq, D] (in `out` if given)."""
        k_cache, v_cache, _ = cache.layer(i)
        return self.kernels.attention(q, k_cache, v_cache, *self._attn_args(i, batch, cache), out=out)

    def _qkv_attention(self, i: int, carry: Carry, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Layer i up to and with its attention in the op table's one launch (`qkv_attention`)."""
        qkv = self._qkv(i, carry)
        return self.kernels.qkv_attention(
            *self._qkv_args(i, qkv, carry, batch, cache), *self._attn_args(i, batch, cache)
        )

    def layer_mlp(self, i: int, attn: torch.Tensor, carry: Carry) -> None:
        """Layer i after its attention (`attn` [T, Hq, D] or [T, Hq * D]): the o projection, the residual adds, the
        MLP and the next norm, into `carry`."""
        k, layers = self.kernels, self.weights.layers
        lw = layers[i]
        h, carry.residual, routing = self._attn_add_norm(attn.reshape(attn.shape[0], -1), lw, carry.residual)
        if carry.ahead is not None:
            carry.ahead.before_mlp(i)
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        if k.add_rms_norm_linear is not None and nxt is not None and not isinstance(nxt.qkv, tuple):
            # The next input norm happens inside that layer's qkv projection: the MLP output stays pending.
            carry.pending = self._mlp_out(h, lw.mlp, routing)
        else:
            next_norm = nxt.input_norm if nxt is not None else self.weights.final_norm
            carry.h, carry.residual = self._mlp_add_norm(h, lw.mlp, carry.residual, next_norm, routing)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """FP32 logits [N, V] for the given final hidden states."""
        return self.kernels.lm_head(hidden, self.weights.lm_head)

    @torch.inference_mode()
    def forward_sequences(
        self, seqs: list[list[int]], block_size: int = 16, to_host: bool = False
    ) -> list[torch.Tensor]:
        """FP32 logits for every position of each sequence, prefilled together in one flat batch. `to_host`: each
        sequence's logits computed and moved to the host in turn (the batch's [tokens, vocab] FP32 logits at once
        may not fit beside a full-size model's weights)."""
        batch, nblocks = fresh_sequences_batch(seqs, block_size, self.device)
        cache = KVCache(self.config, nblocks, nblocks, block_size, self.dtype, self.device)
        hidden = self.forward(batch, cache)
        spans = list(zip(batch.query_start[:-1], batch.query_start[1:]))
        if to_host:
            return [self.compute_logits(hidden[a:b]).cpu() for a, b in spans]
        logits = self.compute_logits(hidden)
        return [logits[a:b] for a, b in spans]
