"""Turns a scheduled step into a `ForwardBatch`, runs the model and returns logits for the rows to sample."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import torch

from .cuda_graphs import DecodeGraphs, DecodeRows, batch_bucket, context_bucket
from .forward_batch import ForwardBatch
from .kv_cache import KVCache
from .kv_cache_manager import NO_BLOCK, KVCacheManager
from .model import FlintModel
from .prompt_logprobs import record_prompt_logprobs, wants_prompt_logprobs
from .scheduler import ScheduledChunk
from .step_graphs import StepGraphs

log = logging.getLogger(__name__)
G = TypeVar("G", DecodeGraphs, StepGraphs)

# Step graphs pad a step to their bucket, so some launches run on more rows than the eager forward would (other
# kernel tiles, other roundings); a capture that baked in stale state is off by far more.
STEP_GRAPH_TOLERANCE = 5e-2


class ModelRunner:
    def __init__(self, model: FlintModel, cache: KVCache, kv: KVCacheManager) -> None:
        self.model = model
        self.cache = cache
        self.kv = kv
        self.device = model.device
        self.block_size = cache.block_size
        self.graphs: DecodeGraphs | None = None
        self.step_graphs: StepGraphs | None = None
        # The longest context and largest batch decode graphs would be captured for, where eager decode steps plan
        # their attention as the graphs do (`align_eager_decode`); None: from the batch's own sequences.
        self.decode_context: int | None = None
        self.decode_batch: int | None = None

    def align_eager_decode(self, max_context: int, max_batch: int) -> None:
        """Eager decode steps give the tokens a decode graph would: their attention metadata carries the context
        and batch buckets a graph is captured for instead of the batch's longest sequence and its count. Decode
        attention takes its table entry and key splits from those host values, and another split count rounds
        differently (one split folds the sink in first, several merge partials and add it last), enough to change a
        greedy token at a near-tie."""
        self.decode_context = max_context
        self.decode_batch = max_batch

    def enable_cuda_graphs(self, max_batch: int, max_context: int) -> None:
        """Capture decode graphs; on any failure keep running eagerly (and say so)."""
        make = functools.partial(DecodeGraphs, self.model, self.cache, max_batch, max_context)
        self.graphs = _checked(make, 1e-3, "decode graphs", "decoding without graphs")

    def enable_step_graphs(self, max_tokens: int) -> None:
        """Capture the prefill/mixed step graphs; on any failure run those steps eagerly (and say so)."""
        if self.model.kernels.qkv_attention is not None:
            log.info("no step graphs: the op table runs attention inside the qkv launch; those steps run eagerly")
            return
        make = functools.partial(StepGraphs, self.model, self.cache, max_tokens)
        self.step_graphs = _checked(make, STEP_GRAPH_TOLERANCE, "step graphs", "prefill and mixed steps run eagerly")

    def _slots(self, full: list[int], sliding: list[int], pos: int) -> tuple[int, int]:
        """Where position `pos`'s K/V go in the full and the sliding pool (-1: nowhere)."""
        bs = self.block_size
        blk, off = divmod(pos, bs)
        sb = sliding[blk] if blk < len(sliding) else NO_BLOCK
        return (full[blk] * bs + off if full else -1), (sb * bs + off if sb != NO_BLOCK else -1)

    def build_batch(self, chunks: list[ScheduledChunk]) -> tuple[ForwardBatch, list[int]]:
        """The batch, and the indices (into `chunks`) of the sequences whose last token is sampled this step."""
        ids: list[int] = []
        pos: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        full_slots: list[int] = []
        sliding_slots: list[int] = []
        full_tables: list[list[int]] = []
        sliding_tables: list[list[int]] = []
        sample_rows: list[int] = []
        logits_idx: list[int] = []
        for i, ch in enumerate(chunks):
            req = ch.request
            c, n = req.num_computed_tokens, ch.num_tokens
            tokens = req.tokens
            ids.extend(tokens[c : c + n])
            pos.extend(range(c, c + n))
            full, sliding = self.kv.tables(req.request_id)
            for p in range(c, c + n):
                fs, ss = self._slots(full, sliding, p)
                full_slots.append(fs)
                sliding_slots.append(ss)
            full_tables.append(full)
            sliding_tables.append(sliding)
            seq_lens.append(c + n)
            starts.append(starts[-1] + n)
            if c + n == req.num_tokens:
                sample_rows.append(i)
                logits_idx.append(starts[-1] - 1)
        dev = self.device

        def table(rows: list[list[int]]) -> torch.Tensor:
            width = max((len(r) for r in rows), default=0) or 1
            return torch.tensor([r + [NO_BLOCK] * (width - len(r)) for r in rows], dtype=torch.int32, device=dev)

        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            query_start=starts,
            seq_lens=seq_lens,
            full_block_tables=table(full_tables),
            sliding_block_tables=table(sliding_tables),
            full_slots=torch.tensor(full_slots, dtype=torch.int64, device=dev),
            sliding_slots=torch.tensor(sliding_slots, dtype=torch.int64, device=dev),
            logits_indices=torch.tensor(logits_idx, dtype=torch.int64, device=dev),
        )
        meta = batch.attn
        n = len(meta.seq_lens)
        if (
            self.decode_context is not None
            and self.decode_batch is not None
            and meta.max_query_len == 1
            and 0 < meta.max_seq_len <= self.decode_context
            and 0 < n <= self.decode_batch
        ):
            batch.attn = dataclasses.replace(
                meta,
                max_seq_len=context_bucket(meta.max_seq_len, self.decode_context),
                plan_seqs=batch_bucket(n, self.decode_batch),
            )
        return batch, sample_rows

    def decode_rows(self, chunks: list[ScheduledChunk], ahead: int = 0) -> tuple[DecodeRows, list[int]] | None:
        """The step's inputs as host values when every chunk is one token (else None), and the chunks whose token
        is their sequence's last (sampled): what the decode graphs take without building a `ForwardBatch` (whose
        device tensors cost a transfer each).

        `ahead` = 1: the step after the one in flight, every chunk a sequence's next token, whose inputs (the
        in-flight step's sampled tokens) are not on the host yet (placeholders here)."""
        rows = DecodeRows([], [], [], [], [], [], [], ())
        sampled, key = [], []
        for i, ch in enumerate(chunks):
            req = ch.request
            c = req.num_computed_tokens + ahead
            if ch.num_tokens != 1 or (ahead and c != req.num_tokens):
                return None
            if c + 1 == req.num_tokens + ahead:
                sampled.append(i)
            rows.input_ids.append(0 if ahead else req.tokens[c])
            rows.positions.append(c)
            full, sliding = self.kv.tables(req.request_id)
            fs, ss = self._slots(full, sliding, c)
            rows.full_slots.append(fs)
            rows.sliding_slots.append(ss)
            rows.seq_lens.append(c + 1)
            rows.full_tables.append(full)
            rows.sliding_tables.append(sliding)
            key.append(self.kv.tables_version(req.request_id))
        rows.tables_key = tuple(key)
        return rows, sampled

    def execute_ahead(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor) -> torch.Tensor | None:
        """FP32 logits of the decode step after the one in flight, on a CUDA graph, its inputs the in-flight step's
        sampled tokens `input_ids` (on the device); None (nothing launched) where the graphs do not cover it."""
        if self.graphs is None:
            return None
        decode = self.decode_rows(chunks, ahead=1)
        if decode is None or not self.graphs.covers_rows(decode[0]):
            return None
        return self.graphs.run_rows(decode[0], input_ids)

    def execute(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor | None, list[int]]:
        """FP32 logits [len(sample_rows), V] and which chunks they belong to; the prompt log-probabilities of the
        chunks that ask for them are recorded on their requests (`prompt_logprobs`)."""
        prompt_lp = any(wants_prompt_logprobs(ch) for ch in chunks)
        if self.graphs is not None and not prompt_lp:  # decode graphs keep only the sampled rows' logits
            decode = self.decode_rows(chunks)
            if decode is not None and self.graphs.covers_rows(decode[0]):
                rows, sampled = decode
                logits = self.graphs.run_rows(rows)  # a row for every chunk: keep the sampled ones'
                if not sampled:
                    return None, sampled
                return (logits if len(sampled) == len(chunks) else logits[sampled]), sampled
        batch, sample_rows = self.build_batch(chunks)
        if self.step_graphs is not None and self.step_graphs.covers(batch):
            hidden = self.step_graphs.run(batch)
        else:
            hidden = self.model.forward(batch, self.cache)
        if prompt_lp:
            record_prompt_logprobs(self.model, hidden, batch.query_start, chunks)
        if not sample_rows:
            return None, sample_rows
        return self.model.compute_logits(hidden[batch.logits_indices]), sample_rows


def _checked(make: Callable[[], G], tolerance: float, what: str, fallback: str) -> G | None:
    """`make()`'s graphs captured and compared with the eager forward (their `self_check`), or None, logged with
    `fallback`, if the capture fails or they differ by more than `tolerance`."""
    try:
        graphs = make()
        graphs.capture()
        error = graphs.self_check()
    except Exception:
        log.exception("%s: capture failed; %s", what, fallback)
        return None
    if error > tolerance:
        log.error("%s differ from the eager forward (relative %.2e); %s", what, error, fallback)
        return None
    log.info("%s agree with the eager forward (relative difference %.1e)", what, error)
    return graphs
