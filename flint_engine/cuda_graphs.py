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
from dataclasses import dataclass, field

import torch
from flint_kernels.attention import AttnMeta

from .forward_batch import ForwardBatch
from .kv_cache import KVCache
from .model import FlintModel
from .staging_buffer import StagingBuffer, host_for

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
CONTEXT_BUCKETS = (1024, 4096, 16384, 65536, 262144)


def _up_to(sizes: tuple[int, ...], top: int) -> tuple[int, ...]:
    return (*tuple(s for s in sizes if s < top), top)


def _smallest_holding(buckets: tuple[int, ...], n: int) -> int:
    return buckets[bisect.bisect_left(buckets, n)]


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """The sequence counts decode graphs are captured for, up to `max_batch`."""
    return _up_to(BATCH_BUCKETS, max_batch)


def batch_bucket(n: int, max_batch: int) -> int:
    """The captured sequence count a decode step of `n <= max_batch` sequences runs at (padding rows added)."""
    return _smallest_holding(batch_buckets(max_batch), n)


def context_buckets(max_context: int) -> tuple[int, ...]:
    """The context lengths decode graphs are captured for, up to `max_context`."""
    return _up_to(CONTEXT_BUCKETS, max_context)


def context_bucket(longest: int, max_context: int) -> int:
    """The captured context a decode step whose longest sequence has `longest` tokens runs at (<= max_context)."""
    return _smallest_holding(context_buckets(max_context), longest)


@dataclass
class DecodeRows:
    """One decode step's inputs as host values, one entry per sequence (what `DecodeGraphs.run_rows` copies in).

    `tables_key` names the block tables' contents (`SeqBlocks` serial and version per sequence): the tables, which
    change only every block_size tokens, are copied only when it changes."""

    input_ids: list[int]
    positions: list[int]
    full_slots: list[int]
    sliding_slots: list[int]
    seq_lens: list[int]
    full_tables: list[list[int]]
    sliding_tables: list[list[int]]
    tables_key: tuple


@dataclass
class _Staging:
    """Host buffers of one graph's per-step inputs, copied in with one transfer each."""

    rows: StagingBuffer  # int64 [4, padded b]: input ids, positions, full slots, sliding slots
    lens: StagingBuffer  # int32 [b]: context lengths
    tables_key: tuple | None = None  # what the graph's static block tables hold
    # (full, sliding) entries of each row copied so far: a sequence's tables only grow at the end (entries the
    # window passes become NO_BLOCK on the host, but no kernel reads them), so a grown row copies its new tail
    table_lens: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    batch: ForwardBatch
    logits: torch.Tensor
    # int64 [4, padded b] whose rows back the batch's input_ids, positions, full_slots and sliding_slots
    inputs: torch.Tensor
    staging: _Staging | None = None


class DecodeGraphs:
    def __init__(
        self, model: FlintModel, cache: KVCache, max_batch: int, max_context: int, scratch_block: int = 0
    ) -> None:
        self.model = model
        self.cache = cache
        self.device = model.device
        self.batch_buckets = batch_buckets(max_batch)
        self.context_buckets = context_buckets(max_context)
        bs = cache.block_size
        self.max_blocks = -(-max_context // bs)
        self.max_sliding_blocks = self.max_blocks  # logical indices reach as far; only the window is live
        self.scratch_block = scratch_block
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool = None

    def static_inputs(self, b: int) -> torch.Tensor:
        """The int64 [4, padded b] buffer behind a graph's input ids, positions and slots (`_static_batch`): one
        copy fills all four. Rows are padded to 16 bytes, so each starts as aligned as a buffer of its own (Triton
        specialises kernels on pointer alignment)."""
        inputs = torch.zeros((4, -(-b // 2) * 2), dtype=torch.int64, device=self.device)
        inputs[2:].fill_(-1)
        return inputs

    def _static_batch(self, b: int, ctx: int, inputs: torch.Tensor | None = None) -> ForwardBatch:
        dev = self.device
        inputs = self.static_inputs(b) if inputs is None else inputs
        table = torch.full((b, self.max_blocks), self.scratch_block, dtype=torch.int32, device=dev)
        batch = ForwardBatch(
            input_ids=inputs[0, :b],
            positions=inputs[1, :b],
            query_start=list(range(b + 1)),
            seq_lens=[1] * b,
            full_block_tables=table,
            sliding_block_tables=table.clone(),
            full_slots=inputs[2, :b],
            sliding_slots=inputs[3, :b],
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
                inputs = self.static_inputs(b)
                batch = self._static_batch(b, ctx, inputs)
                for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                    self.model.compute_logits(self.model.forward(batch, self.cache))
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    logits = self.model.compute_logits(self.model.forward(batch, self.cache))
                self.graphs[(b, ctx)] = _Graph(g, batch, logits, inputs)
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

    def covers_rows(self, rows: DecodeRows) -> bool:
        return 0 < len(rows.seq_lens) <= self.batch_buckets[-1] and max(rows.seq_lens) <= self.context_buckets[-1]

    def _graph_for(self, n: int, longest: int) -> tuple[_Graph, int]:
        # The captured tuples, not rebuilt: this runs every decode step.
        b = _smallest_holding(self.batch_buckets, n)
        return self.graphs[(b, _smallest_holding(self.context_buckets, longest))], b

    def _staging(self, g: _Graph, b: int) -> _Staging:
        rows = StagingBuffer(tuple(g.inputs.shape), torch.int64, self.device)
        g.staging = _Staging(rows, StagingBuffer((b,), torch.int32, self.device))
        return g.staging

    @torch.inference_mode()
    def run_rows(self, rows: DecodeRows, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """FP32 logits [num_seqs, V] for a decode step given as host values: the per-step inputs go in with two
        host-to-device copies (and the block tables only when `rows.tables_key` changed), then the replay.
        `input_ids` (on the device: the previous step's sampled tokens, not yet read back) replace
        `rows.input_ids`.

        The same result as `run` on the equivalent `ForwardBatch`, which copies each input on its own."""
        n = len(rows.input_ids)
        g, b = self._graph_for(n, max(rows.seq_lens))
        st = g.staging or self._staging(g, b)
        host = st.rows.values()
        host[0, :n] = rows.input_ids
        host[1, :n] = rows.positions
        host[2, :n] = rows.full_slots
        host[3, :n] = rows.sliding_slots
        host[2:, n:] = -1  # padding rows write nowhere
        lens = st.lens.values()
        lens[:n] = rows.seq_lens
        lens[n:] = 1
        st.rows.copy_to(g.inputs)
        if input_ids is not None:
            g.inputs[0, :n].copy_(input_ids)
        st.lens.copy_to(g.batch.attn.seq_lens_t)
        if st.tables_key != rows.tables_key:
            self._copy_tables(g.batch, st, rows)
        g.graph.replay()
        return g.logits[:n]

    def _copy_tables(self, s: ForwardBatch, st: _Staging, rows: DecodeRows) -> None:
        """Copy what changed in the block tables since `st.tables_key`: a new sequence's rows whole, a grown one's
        new entries. From pinned memory, so the copies queue behind the GPU's work instead of waiting for it (a
        copy from pageable memory waits for the stream, which stalls a step launched ahead)."""
        old = st.tables_key or ()
        if len(st.table_lens) < len(rows.tables_key):
            st.table_lens.extend([(0, 0)] * (len(rows.tables_key) - len(st.table_lens)))
        for i, key in enumerate(rows.tables_key):
            if i < len(old) and old[i] == key:
                continue
            grown = i < len(old) and old[i][0] == key[0]  # same sequence (serial), a newer version
            starts = st.table_lens[i] if grown else (0, 0)
            tables = (rows.full_tables[i], rows.sliding_tables[i])
            for table, start, static in zip(tables, starts, (s.full_block_tables, s.sliding_block_tables)):
                if len(table) > start:
                    host = host_for(torch.tensor(table[start:], dtype=torch.int32), self.device)
                    static[i, start : len(table)].copy_(host, non_blocking=True)
            st.table_lens[i] = (len(tables[0]), len(tables[1]))
        st.tables_key = rows.tables_key

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """FP32 logits [num_seqs, V] for a decode batch (one token per sequence)."""
        n = batch.num_seqs
        g, _ = self._graph_for(n, max(batch.seq_lens))
        if g.staging is not None:
            g.staging.tables_key = None  # the tables written below are not the ones `run_rows` last wrote
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
