"""Flint's forward pass over a flat varlen batch, written against the op table in `flint_kernels.dispatch`.

Each op is one call into `self.kernels`, so a fused kernel replaces its reference one for one.
"""

from __future__ import annotations

import torch
from flint_kernels.dispatch import REFERENCE, Kernels
from flint_kernels.linear import NVFP4Weight
from flint_kernels.moe import SharedExpert
from flint_kernels.rope import rope_cos_sin

from .forward_batch import ForwardBatch, fresh_sequences_batch
from .kv_cache import KVCache
from .weights import DenseMLPWeights, FlintWeights, LayerWeights, MoEWeights, Projection
from .weights_ahead import WeightsAhead

# The router's output: top-k weights (FP32) and expert ids, [T, k] each.
Routing = tuple[torch.Tensor, torch.Tensor]


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
        c, k = self.config, self.kernels
        layers = self.weights.layers
        x = self._embed(batch.input_ids)
        cos_sin = rope_cos_sin(batch.positions, c.head_dim, c.rope_theta, self.dtype)
        # Each block ends with the residual add and the next norm (the next layer's input norm, or the final norm),
        # unless the op table's add_rms_norm_linear does the next input norm inside the qkv projection: then the
        # block's MLP output stays `pending` until that projection.
        h, residual = k.rms_norm(x, layers[0].input_norm, c.rms_norm_eps), x
        pending: torch.Tensor | None = None
        ahead = self.weights_ahead
        if ahead is not None and not ahead.begin(batch.num_tokens):
            ahead = None
        for i, lw in enumerate(layers):
            k_cache, v_cache, sliding = cache.layer(i)
            if pending is not None:
                qkv, residual = k.add_rms_norm_linear(pending, residual, lw.input_norm, c.rms_norm_eps, lw.qkv)
            else:
                qkv = self._linear(h, lw.qkv)
            if ahead is not None:
                ahead.after_qkv(i)
            qkv_args = (
                qkv,
                lw.q_norm,
                lw.k_norm,
                c.rms_norm_eps,
                cos_sin if c.uses_rope(i) else None,
                k_cache,
                v_cache,
                batch.sliding_slots if sliding else batch.full_slots,
                c.num_attention_heads,
                c.num_key_value_heads,
            )
            attn_args = (
                batch.sliding_block_tables if sliding else batch.full_block_tables,
                batch.attn,
                lw.sinks,
                c.head_dim**-0.5,
                c.sliding_window if sliding else None,
            )
            if k.qkv_attention is not None:
                attn = k.qkv_attention(*qkv_args, *attn_args)
            else:
                attn = k.attention(k.qk_norm_rope_write(*qkv_args), k_cache, v_cache, *attn_args)
            h, residual, routing = self._attn_add_norm(attn.reshape(attn.shape[0], -1), lw, residual)
            if ahead is not None:
                ahead.before_mlp(i)
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            if k.add_rms_norm_linear is not None and nxt is not None and not isinstance(nxt.qkv, tuple):
                pending = self._mlp_out(h, lw.mlp, routing)
            else:
                pending = None
                next_norm = nxt.input_norm if nxt is not None else self.weights.final_norm
                h, residual = self._mlp_add_norm(h, lw.mlp, residual, next_norm, routing)
        if ahead is not None:
            ahead.join()
        return h

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """FP32 logits [N, V] for the given final hidden states."""
        return self.kernels.lm_head(hidden, self.weights.lm_head)

    @torch.inference_mode()
    def forward_sequences(self, seqs: list[list[int]], block_size: int = 16) -> list[torch.Tensor]:
        """FP32 logits for every position of each sequence, prefilled together in one flat batch."""
        batch, nblocks = fresh_sequences_batch(seqs, block_size, self.device)
        cache = KVCache(self.config, nblocks, nblocks, block_size, self.dtype, self.device)
        logits = self.compute_logits(self.forward(batch, cache))
        return [logits[a:b] for a, b in zip(batch.query_start[:-1], batch.query_start[1:])]
