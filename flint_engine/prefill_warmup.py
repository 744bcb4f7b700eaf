"""Prefill warm-up: run the fused kernels once for each class of prefill and mixed batch before serving.

Triton compiles a kernel the first time it meets a new specialisation (tile configuration, an integer argument
that is 1 or a multiple of 16, a path switch such as the MoE's decode / grouped crossover or the NVFP4 GEMV's
small-M / dequantise split). Decode shapes are compiled when the decode CUDA graphs are captured; prefill shapes
would otherwise be compiled inside the first requests, each compile adding seconds to their latency. The batches
here read the scratch block and write nowhere (every slot is -1), so they touch no live state.
"""

from __future__ import annotations

import logging
import time

import torch

from .forward_batch import ForwardBatch, blocks_needed
from .kv_cache import KVCache
from .model import FlintModel

log = logging.getLogger(__name__)

# Prefill lengths that cross the kernels' switches: 1 vs many rows, multiples of 16 or not, the MoE shared-expert
# fold (<= 16) and decode path (<= 64), the expert-major MoE's ids-scan widths (pairs padded to 64 / 128 / 256 /
# 512 from 9 / 11 / 22 / 43 tokens), the GEMV's tensor-core small-M tiles (<= 64) and the large-M paths, the
# router's tile sizes (from 1024 and from 4096 tokens), the NVFP4 MoE's expert copies (portable default: from 4096)
# and, in the H200 table, the MoE's TMA-fed launches (BF16 from 128 tokens, NVFP4 decoded in them from 65 tokens
# past the decode path; x's rows from the sorted copy up to 512 tokens, 128-row blocks from 4096), NVFP4's decode
# path up to 192 tokens (ids-scan widths 1024 from 86 tokens, 2048 from 171) and the BF16 grouped GEMM (from 6144).
PREFILL_LENGTHS = (2, 3, 8, 9, 16, 17, 32, 33, 64, 65, 128, 192, 257, 1024, 1025, 4097)
# Decode rows riding along a prefill chunk (mixed steps), and their context length. The chunk lengths give the
# prefill attention's three row-tile sizes (16, 32, 64 rows: the chunk's longest query times the 8 query heads a
# KV head serves, capped at 64): a request's last chunk is often a few tokens beside many decode rows.
MIXED_DECODE_ROWS = (1, 4, 8)
MIXED_CHUNKS = (2, 3, 64)
# Mixed steps with many decode rows: the lm_head multiplies one row a sequence, so its row count (decode rows + 1)
# must meet each small-M tile class (17-32, 33-64 rows) off a multiple of 16 too, which no prefill length or decode
# graph gives (H200, thirteenth session: the NVFP4 lm_head compiled for 33-64 rows while serving 64 requests). The
# decode attention takes other tiles from 12 sequences as well. One short chunk each.
MIXED_MANY_ROWS = (16, 32)
MIXED_MANY_CHUNK = 2
DECODE_CONTEXT = 100


def warmup_batches(max_tokens: int, max_seqs: int, budgets: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """(prefill length, decode rows) of each warm-up batch within the scheduler's token and sequence budgets; the
    largest step (`max_tokens`) and each smaller step budget (`budgets`) are run as prefills of their own."""
    shapes = [(n, 0) for n in sorted({*PREFILL_LENGTHS, *budgets, max_tokens}) if n <= max_tokens]
    mixed = [(chunk, rows) for rows in MIXED_DECODE_ROWS for chunk in MIXED_CHUNKS]
    mixed += [(MIXED_MANY_CHUNK, rows) for rows in MIXED_MANY_ROWS]
    for chunk, rows in mixed:
        n = min(chunk, max_tokens - rows)
        if n >= 2 and rows + 1 <= max_seqs and (n, rows) not in shapes:
            shapes.append((n, rows))
    return shapes


def scratch_batch(prefill: int, decode_rows: int, block_size: int, device: torch.device, scratch: int = 0):
    """A batch of one `prefill`-token sequence and `decode_rows` one-token sequences over the scratch block."""
    seq_lens = [prefill] + [DECODE_CONTEXT] * decode_rows
    query_start = [0, prefill]
    for _ in range(decode_rows):
        query_start.append(query_start[-1] + 1)
    t = query_start[-1]
    positions = list(range(prefill)) + [DECODE_CONTEXT - 1] * decode_rows
    width = blocks_needed(max(seq_lens), block_size)
    table = torch.full((len(seq_lens), width), scratch, dtype=torch.int32, device=device)
    nowhere = torch.full((t,), -1, dtype=torch.int64, device=device)
    return ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        query_start=query_start,
        seq_lens=seq_lens,
        full_block_tables=table,
        sliding_block_tables=table.clone(),
        full_slots=nowhere,
        sliding_slots=nowhere.clone(),
        logits_indices=torch.tensor([q - 1 for q in query_start[1:]], dtype=torch.int64, device=device),
    )


@torch.inference_mode()
def warm_up_prefill(
    model: FlintModel, cache: KVCache, max_tokens: int, max_seqs: int, budgets: tuple[int, ...] = ()
) -> list[tuple[int, int]]:
    """Run every warm-up batch once (forward and logits), then the sampling op on the last logits once per top-k
    variant the sampling kernels compile (`sampling_triton`); returns the (prefill, decode rows) shapes run."""
    from flint_kernels.sampling_triton import TOP_K_VARIANTS

    start = time.monotonic()
    shapes = warmup_batches(max_tokens, max_seqs, budgets)
    logits = None
    for prefill, rows in shapes:
        batch = scratch_batch(prefill, rows, cache.block_size, model.device)
        hidden = model.forward(batch, cache)
        logits = model.compute_logits(hidden[batch.logits_indices])
    if logits is not None:
        n, dev = logits.shape[0], logits.device
        ones = torch.ones(n, device=dev)
        steps = torch.zeros(n, dtype=torch.int64, device=dev)
        for k in sorted({min(k, logits.shape[1]) for k in TOP_K_VARIANTS}):
            top_k = torch.full((n,), k, dtype=torch.int64, device=dev)
            model.kernels.sample_top_k(logits, ones, top_k, ones * 0.95, ones * 0, steps, steps, k)
    prepare = model.kernels.prepare_prefill
    if prepare is not None:
        c = model.config
        heads = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        lengths = prepare(max_tokens, *heads, cache.dtype, model.device)
        if lengths:
            log.info("built cuDNN attention plans for fresh prompts of %d-%d tokens", lengths[0], lengths[-1])
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    log.info("warmed up %d prefill and mixed batch shapes in %.1f s", len(shapes), time.monotonic() - start)
    return shapes
