"""Low-latency decode: the whole forward (and the logits) captured as CUDA graphs, one per batch-size bucket and
context bucket, replayed with inputs copied into static buffers. No host sync inside a step.

Requires every op on the decode path to be capturable (the fused kernel path is; the reference attention's
per-sequence Python loop is not, so graphs are used only with the fused kernels). Padding rows of a bucket point
at a scratch block and write nowhere (slot -1), so they cost a little compute and touch no live state.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import torch
from flint_kernels.attention import AttnMeta

from .forward_batch import ForwardBatch
from .kv_cache import KVCache
from .model import FlintModel

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
CONTEXT_BUCKETS = (1024, 4096, 16384, 65536, 262144)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    batch: ForwardBatch
    logits: torch.Tensor


class DecodeGraphs:
    def __init__(
        self, model: FlintModel, cache: KVCache, max_batch: int, max_context: int, scratch_block: int = 0
    ) -> None:
        self.model = model
        self.cache = cache
        self.device = model.device
        self.batch_buckets = (*tuple(b for b in BATCH_BUCKETS if b < max_batch), max_batch)
        ctx = (*tuple(c for c in CONTEXT_BUCKETS if c < max_context), max_context)
        self.context_buckets = ctx
        bs = cache.block_size
        self.max_blocks = -(-max_context // bs)
        self.max_sliding_blocks = self.max_blocks  # logical indices reach as far; only the window is live
        self.scratch_block = scratch_block
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool = None

    def _static_batch(self, b: int, ctx: int) -> ForwardBatch:
        dev = self.device
        table = torch.full((b, self.max_blocks), self.scratch_block, dtype=torch.int32, device=dev)
        batch = ForwardBatch(
            input_ids=torch.zeros(b, dtype=torch.int64, device=dev),
            positions=torch.zeros(b, dtype=torch.int64, device=dev),
            query_start=list(range(b + 1)),
            seq_lens=[1] * b,
            full_block_tables=table,
            sliding_block_tables=table.clone(),
            full_slots=torch.full((b,), -1, dtype=torch.int64, device=dev),
            sliding_slots=torch.full((b,), -1, dtype=torch.int64, device=dev),
            logits_indices=torch.arange(b, device=dev),
        )
        # Kernels size their work from max_seq_len (a host int): capture for the bucket's upper bound.
        batch.attn = AttnMeta(
            batch.query_start, [ctx] * b, batch.attn.query_start_t, torch.ones(b, dtype=torch.int32, device=dev), 1, ctx
        )
        return batch

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.monotonic()
        self.pool = torch.cuda.graph_pool_handle()
        for ctx in reversed(self.context_buckets):
            for b in reversed(self.batch_buckets):  # largest first so smaller graphs reuse its memory
                batch = self._static_batch(b, ctx)
                for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                    self.model.compute_logits(self.model.forward(batch, self.cache))
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    logits = self.model.compute_logits(self.model.forward(batch, self.cache))
                self.graphs[(b, ctx)] = _Graph(g, batch, logits)
        torch.cuda.synchronize()
        log.info(
            "captured %d decode graphs (batch <= %d, context <= %d) in %.1f s",
            len(self.graphs),
            self.batch_buckets[-1],
            self.context_buckets[-1],
            time.monotonic() - start,
        )

    @torch.inference_mode()
    def self_check(self) -> float:
        """Relative difference between replaying and running eagerly a decode step over the scratch block (reads
        only, writes nothing): a capture that baked in stale state shows here, before it serves a request."""
        worst = 0.0
        for b in (1, min(3, self.batch_buckets[-1])):
            batch = self._static_batch(b, self.context_buckets[0])
            batch.seq_lens = [1] * b
            batch.attn = AttnMeta.build(batch.query_start, batch.seq_lens, self.device)
            eager = self.model.compute_logits(self.model.forward(batch, self.cache))
            replay = self.run(batch)
            worst = max(worst, ((replay - eager).norm() / eager.norm().clamp_min(1e-30)).item())
        return worst

    def covers(self, batch: ForwardBatch) -> bool:
        return (
            batch.is_decode
            and batch.num_seqs <= self.batch_buckets[-1]
            and max(batch.seq_lens) <= self.context_buckets[-1]
        )

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """FP32 logits [num_seqs, V] for a decode batch (one token per sequence)."""
        n = batch.num_seqs
        b = self.batch_buckets[bisect.bisect_left(self.batch_buckets, n)]
        ctx = self.context_buckets[bisect.bisect_left(self.context_buckets, max(batch.seq_lens))]
        g = self.graphs[(b, ctx)]
        s = g.batch
        s.input_ids[:n].copy_(batch.input_ids)
        s.positions[:n].copy_(batch.positions)
        s.full_slots[:n].copy_(batch.full_slots)
        s.sliding_slots[:n].copy_(batch.sliding_slots)
        s.full_slots[n:].fill_(-1)
        s.sliding_slots[n:].fill_(-1)
        w = batch.full_block_tables.shape[1]
        s.full_block_tables[:n, :w].copy_(batch.full_block_tables)
        ws = batch.sliding_block_tables.shape[1]
        s.sliding_block_tables[:n, :ws].copy_(batch.sliding_block_tables)
        s.attn.seq_lens_t[:n].copy_(batch.attn.seq_lens_t)
        s.attn.seq_lens_t[n:].fill_(1)
        g.graph.replay()
        return g.logits[:n]
