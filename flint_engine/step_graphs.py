"""Prefill and mixed steps on CUDA graphs, in pieces around attention.

Outside the decode graphs every step ran eagerly, and on the fused path its ~600-1,200 launches cost the host far more
than the GPU: on the H200 an eager NVFP4 forward of 16 tokens took 107 ms of host time for 7 ms of kernels, one of
2,048 tokens 119 ms for 46 (`benchmarks/prefill_host.py`, thirty-first session). A short prompt's time to first token
and each mixed step's gap between tokens paid that.

Here everything but attention is captured once per token-count bucket: attention is the one op that reads the batch's
sequence structure (host lists of query starts and lengths), so it runs eagerly between the pieces, on the batch's
real rows. Piece 0 is the embedding, the RoPE table, the first norm and layer 0 up to its queries (projection, Q/K
norm, RoPE and the K/V cache write); piece i is layer i-1 after its attention (o projection, residual adds, router,
MoE, next norm) and layer i up to its queries; the last piece ends with the final norm. A step copies its token ids,
positions and cache slots into the bucket's static buffers (padding rows: slot -1, so they write nowhere), then
replays piece 0, and for each layer runs attention on its real rows and replays the next piece. The padding rows
cost some compute (a bucket holds at most twice its smallest step, 1.5x above 2,048 tokens) and touch no live
state.

All buckets' pieces share one memory pool, and one pair of query and attention-output buffers: a step replays one
bucket's pieces in order, so a piece may reuse another piece's dead temporaries. What crosses an attention boundary
lives in those buffers or in the piece outputs the next piece reads (the residual stream), which stay referenced. The
Q/K norm writes the queries into their buffer and attention its output into the other (the ops' `out`), so no copy
runs at a boundary.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .forward_batch import ForwardBatch
from .kv_cache import KVCache
from .model import Carry, FlintModel
from .prefill_warmup import scratch_batch

log = logging.getLogger(__name__)

# Doubling up to 2,048 tokens, then by halves: a step pads to at most 1.5x its tokens where the GPU's time counts.
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096)
# The largest bucket by default. H200, NVFP4 (`prefill_host.py`, thirty-first session): an eager step's launches take
# the host ~55-140 ms at any size; on the pieces 3,000 tokens took 61.8 ms against 94.5 eagerly and 4,096 76.2
# against 102.2, but 8,192 141.4 against 139.9 (its kernels alone ~139 ms; the pieces then added two copies a layer,
# which the ops' `out` arguments have since taken away).
MAX_TOKENS = 4096

Piece = Callable[[], None]


@dataclass
class _Bucket:
    tokens: int
    # Static: one sequence of `tokens` over the scratch block, writing nowhere (what the pieces were captured on); a
    # step's token ids, positions and slots are copied into its tensors.
    batch: ForwardBatch
    queries: torch.Tensor  # [tokens, Hq, D]: each layer's queries, written by a piece, read by attention
    attn: torch.Tensor  # [tokens, Hq * D]: attention's output, read by the next piece
    pieces: list[Piece] = field(default_factory=list)
    carry: Carry | None = None  # the last piece's: its `h` is the step's hidden states


class StepGraphs:
    def __init__(self, model: FlintModel, cache: KVCache, max_tokens: int = MAX_TOKENS, scratch_block: int = 0) -> None:
        if model.kernels.qkv_attention is not None:
            raise ValueError("step graphs need attention as an op of its own (the op table fuses it with the qkv)")
        self.model = model
        self.cache = cache
        self.device = model.device
        self.buckets = (*tuple(b for b in TOKEN_BUCKETS if b < max_tokens), max_tokens)
        self.scratch_block = scratch_block
        self.graphs: dict[int, _Bucket] = {}
        self.pool = None
        self.memory = 0  # bytes the capture added to the allocator's reserve (the pool and the static buffers)

    def covers(self, batch: ForwardBatch) -> bool:
        return 0 < batch.num_tokens <= self.buckets[-1]

    # ------------------------------------------------------------------ capture
    def _pieces(self, b: _Bucket) -> list[Piece]:
        """The step's pieces as plain functions of the bucket's static buffers, in order."""
        model, cache, batch = self.model, self.cache, b.batch
        layers = len(model.weights.layers)

        def first() -> None:
            b.carry = model.begin(batch)
            model.layer_queries(0, b.carry, batch, cache, out=b.queries)

        def after(i: int) -> Piece:
            def piece() -> None:
                assert b.carry is not None
                model.layer_mlp(i, b.attn, b.carry)
                if i + 1 < layers:
                    model.layer_queries(i + 1, b.carry, batch, cache, out=b.queries)

            return piece

        return [first, *(after(i) for i in range(layers))]

    def _attend(self, b: _Bucket, i: int, batch: ForwardBatch) -> None:
        t = batch.num_tokens
        self.model.attend(i, b.queries[:t], batch, self.cache, out=b.attn[:t].view(b.queries[:t].shape))

    def _capture_piece(self, fn: Piece) -> Piece:
        """`fn` captured as a CUDA graph in the shared pool; its replay."""
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            fn()
        return g.replay

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.monotonic()
        cuda = self.device.type == "cuda"
        reserved = torch.cuda.memory_reserved(self.device) if cuda else 0
        if cuda:
            self.pool = torch.cuda.graph_pool_handle()
        # One pair of buffers for every bucket (a step replays one bucket), sized for the largest.
        c, most = self.model.config, self.buckets[-1]
        queries = torch.zeros((most, c.num_attention_heads, c.head_dim), dtype=self.model.dtype, device=self.device)
        attn = torch.zeros((most, c.num_attention_heads * c.head_dim), dtype=self.model.dtype, device=self.device)
        for t in reversed(self.buckets):  # largest first, so smaller buckets reuse its memory
            batch = scratch_batch(t, 0, self.cache.block_size, self.device, self.scratch_block)
            b = _Bucket(t, batch, queries[:t], attn[:t])
            pieces = self._pieces(b)
            for piece_index, fn in enumerate(pieces):  # once eagerly: Triton compiles outside the capture
                fn()
                if piece_index < len(pieces) - 1:
                    self._attend(b, piece_index, b.batch)
            if cuda:
                torch.cuda.synchronize(self.device)
            b.pieces = [self._capture_piece(fn) for fn in pieces]
            self.graphs[t] = b
        if cuda:
            torch.cuda.synchronize(self.device)
            # The eager warm-up's blocks go back: steps up to the largest bucket allocate only from the pool now.
            torch.cuda.empty_cache()
            self.memory = torch.cuda.memory_reserved(self.device) - reserved
        log.info(
            "captured prefill/mixed step graphs for %d token buckets (<= %d tokens, %d pieces each) in %.1f s,"
            " holding %.0f MiB",
            len(self.graphs),
            self.buckets[-1],
            len(self.model.weights.layers) + 1,
            time.monotonic() - start,
            self.memory / 2**20,
        )

    @torch.inference_mode()
    def self_check(self) -> float:
        """Relative difference between the pieces and an eager forward over the scratch block (reads only, writes
        nothing) for a mixed step, a prompt and decode rows: a capture that baked in stale state shows here, before
        serving."""
        prompt = max(1, min(8, self.buckets[-1] - 3))
        batch = scratch_batch(prompt, 3, self.cache.block_size, self.device, self.scratch_block)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.model.config.vocab_size, (batch.num_tokens,), generator=gen)
        batch.input_ids.copy_(ids)
        eager = self.model.forward(batch, self.cache)[batch.logits_indices].float()
        replay = self.run(batch)[batch.logits_indices].float()
        return ((replay - eager).norm() / eager.norm().clamp_min(1e-30)).item()

    # ------------------------------------------------------------------ replay
    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states [T, H] after the final norm, as `FlintModel.forward` gives them; K/V land in the cache."""
        t = batch.num_tokens
        b = self.graphs[self.buckets[bisect.bisect_left(self.buckets, t)]]
        s = b.batch
        s.input_ids[:t].copy_(batch.input_ids)
        s.positions[:t].copy_(batch.positions)
        for static, slots in ((s.full_slots, batch.full_slots), (s.sliding_slots, batch.sliding_slots)):
            static[:t].copy_(slots)
            static[t:].fill_(-1)  # padding rows write nowhere
        b.pieces[0]()
        for i in range(len(b.pieces) - 1):
            self._attend(b, i, batch)
            b.pieces[i + 1]()
        assert b.carry is not None
        return b.carry.h[:t]
