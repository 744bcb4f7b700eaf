"""Token sampling for a batch of rows with per-row parameters.

Randomness comes from a counter-based hash of (seed, step, token id), not from a stateful generator, so a seeded
request draws the same token whatever else is in the batch, on CPU or GPU, and after a preemption.
Sampling is Gumbel-max over the processed logits, which is exactly sampling from their softmax.
Returned logprobs are those of the raw model distribution (before penalties, temperature and truncation).
"""

from __future__ import annotations

import functools
import logging
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import torch
from flint_kernels.sampling import keep_sorted, sample_top_k_ref, uniform_noise

from .staging_buffer import StagingBuffer, to_device

log = logging.getLogger(__name__)


@dataclass
class SamplingRow:
    """What the sampler needs for one row of logits."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    step: int  # tokens generated so far by this request: the RNG counter
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # added to those tokens' logits (after the penalties)
    allowed_ids: tuple[int, ...] | None = None  # every other token is masked out
    output_ids: tuple[int, ...] | list[int] = ()
    prompt_ids: tuple[int, ...] | list[int] = ()
    banned_ids: tuple[int, ...] = ()  # e.g. EOS before min_tokens
    # (if the latest token, not read yet, is this one, ban that one): bad words a step launched ahead may complete
    banned_after: tuple[tuple[int, int], ...] = ()
    logprobs: int | None = None
    allowed: Callable[[int], bool] | None = None  # a constraint (JSON mode): the best allowed candidate wins
    # Where the constraint accepts no token at all (a pattern nothing in the vocabulary continues), this token (the
    # end of the turn) ends the output instead of failing the step; None: fail.
    dead_end: int | None = None


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None  # logprob of each sampled token (None when no row asked)
    top_logprobs: list[list[tuple[int, float]]] | None


def _best_allowed(
    scores: torch.Tensor, allowed: Callable[[int], bool], dead_end: int | None = None, first: int = 64
) -> int:
    """The highest-scoring token the constraint accepts (tokens outside top-k/top-p come last, but still count);
    `dead_end` where it accepts none."""
    order = torch.argsort(scores, descending=True)
    head = order[:first].tolist()
    for t in head:
        if allowed(t):
            return t
    for t in order[first:].tolist():
        if allowed(t):
            return t
    if dead_end is not None:
        log.warning("the output constraint accepts no token; ending the output")
        return dead_end
    raise RuntimeError("the output constraint accepts no token")


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    vocab = logits.shape[-1]
    for i, r in enumerate(rows):
        if (r.presence_penalty or r.frequency_penalty) and r.output_ids:
            counts = torch.bincount(torch.tensor(r.output_ids, device=logits.device), minlength=vocab)[:vocab]
            counts = counts.to(logits.dtype)
            logits[i] -= r.frequency_penalty * counts + r.presence_penalty * (counts > 0).to(logits.dtype)
        if r.repetition_penalty != 1.0:
            seen = torch.tensor(sorted({*r.prompt_ids, *r.output_ids}), dtype=torch.long, device=logits.device)
            if seen.numel():
                vals = logits[i, seen]
                logits[i, seen] = torch.where(vals > 0, vals / r.repetition_penalty, vals * r.repetition_penalty)
        if r.logit_bias:
            ids = torch.tensor(list(r.logit_bias), dtype=torch.long, device=logits.device)
            logits[i, ids] += torch.tensor(list(r.logit_bias.values()), dtype=logits.dtype, device=logits.device)
        if r.allowed_ids:
            ids = torch.tensor(r.allowed_ids, dtype=torch.long, device=logits.device)
            kept = logits[i, ids]
            logits[i] = float("-inf")
            logits[i, ids] = kept
        if r.banned_ids:
            logits[i, torch.tensor(r.banned_ids, device=logits.device)] = float("-inf")
    return logits


def truncation_mask(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """True where a token survives top-k, then top-p (on the top-k distribution), then min-p (full-vocab sort)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    keep = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    keep.scatter_(1, order, keep_sorted(sorted_logits, top_k, top_p, min_p))
    return keep


def draw_full(
    sub: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    truncate: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gumbel-max over the whole (temperature-scaled) vocabulary: (tokens [N], perturbed scores [N, V]).

    `truncate`: whether any row has top-k, top-p or min-p, when the caller knows it on the host (else read from the
    tensors, which waits for the device)."""
    if truncate is None:
        truncate = bool((top_k > 0).any() or (top_p < 1.0).any() or (min_p > 0).any())
    if truncate:
        sub = sub.masked_fill(~truncation_mask(sub, top_k, top_p, min_p), float("-inf"))
    perturbed = sub - torch.log(-torch.log(uniform_noise(seeds, steps, sub.shape[-1])))
    return torch.argmax(perturbed, dim=-1), perturbed


def _staged(columns: list[list[float | int]], dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """Per-row parameters as the rows of one tensor on `dev`, each row padded to 16 bytes: every parameter then
    starts 16-byte aligned on the device, whatever the batch size. Triton specialises a kernel on its pointers'
    alignment, so an unaligned parameter (a column of an [N, 3] tensor is a contiguous view when N is 1) would
    compile a new variant of the sampling kernels in the middle of serving. To a GPU they go through a pinned host
    buffer that is kept for the next step of that shape (allocating and pinning one every step cost more than the
    copy)."""
    n = len(columns[0])
    per_16 = 16 // torch.empty((), dtype=dtype).element_size()
    shape = (len(columns), -(-n // per_16) * per_16)
    if dev.type != "cuda":
        out = torch.zeros(shape, dtype=dtype)
        out[:, :n] = torch.tensor(columns, dtype=dtype)
        return out.to(dev)
    buffer = _staging_buffer(dtype, shape, dev)
    values = buffer.values()
    values[:, :n] = columns
    values[:, n:] = 0
    return buffer.copy_to(torch.empty(shape, dtype=dtype, device=dev))


_BUFFERS: dict[tuple[torch.dtype, tuple[int, int], int], StagingBuffer] = {}
_BUFFERS_LOCK = threading.Lock()


def _staging_buffer(dtype: torch.dtype, shape: tuple[int, int], dev: torch.device) -> StagingBuffer:
    """The staging buffer kept for parameters of this shape on `dev`."""
    key = (dtype, shape, dev.index if dev.index is not None else torch.cuda.current_device())
    with _BUFFERS_LOCK:
        buffer = _BUFFERS.get(key)
        if buffer is None:
            buffer = _BUFFERS[key] = StagingBuffer(shape, dtype, dev)
        return buffer


def is_plain(row: SamplingRow, vocab: int) -> bool:
    """Whether the row's token can be drawn on the device without reading anything back: no constraint, and greedy
    or top-k sampling, so `draw_tokens` serves it after `apply_device_penalties` and `apply_static_masks` (the
    host's `apply_penalties` on the device); its logprobs, if it asks, come from `device_logprobs`."""
    return row.allowed is None and (array("f", [row.temperature])[0] == 0.0 or 0 < row.top_k < vocab)


def apply_device_penalties(
    logits: torch.Tensor, rows: list[SamplingRow], last: torch.Tensor | None = None
) -> torch.Tensor:
    """`apply_penalties`' presence, frequency and repetition penalties (to the same values), in place, with no host
    sync. `last`: each row's latest token on the device, not yet in its `output_ids` (a step launched before the
    one that drew it was read), counted with them, and the bans it sets off (`banned_after`)."""
    dev, vocab = logits.device, logits.shape[-1]
    for i, r in enumerate(rows):
        if r.banned_after and last is not None:  # -inf where the latest token is the pair's first, else + 0
            after, banned = zip(*r.banned_after)
            hit = _on_device(after, torch.int64, dev) == last[i].to(torch.int64)
            bans = torch.where(hit, float("-inf"), 0.0).to(logits.dtype)
            logits[i].index_add_(0, _on_device(banned, torch.int64, dev), bans)
        counted = r.presence_penalty or r.frequency_penalty
        if not (counted or r.repetition_penalty != 1.0):
            continue
        ids = to_device(torch.tensor(list(r.output_ids), dtype=torch.int64), dev)
        if last is not None:
            ids = torch.cat([ids, last[i : i + 1].to(torch.int64)])
        if counted and ids.numel():
            counts = torch.zeros(vocab, dtype=logits.dtype, device=dev)
            counts.index_add_(0, ids, torch.ones(ids.shape, dtype=logits.dtype, device=dev))
            logits[i] -= r.frequency_penalty * counts + r.presence_penalty * (counts > 0).to(logits.dtype)
        if r.repetition_penalty != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=dev).index_fill_(0, ids, True)
            if r.prompt_ids:
                seen.index_fill_(0, _on_device(tuple(r.prompt_ids), torch.int64, dev), True)
            row = logits[i]
            rp = r.repetition_penalty
            logits[i] = torch.where(seen, torch.where(row > 0, row / rp, row * rp), row)
    return logits


@functools.lru_cache(maxsize=256)
def _on_device(values: tuple[int | float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A request's ids or bias values on the device, uploaded once (through pinned memory, not waiting for the
    steps queued before it) and kept for its later steps."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def apply_static_masks(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """`apply_penalties`' logit_bias, allowed_ids and banned_ids (in its order, to the same values), in place, with
    no host sync: the ids and values go to the device once per distinct set."""
    dev = logits.device
    for i, r in enumerate(rows):
        if r.logit_bias:
            ids = _on_device(tuple(r.logit_bias), torch.int64, dev)
            logits[i].index_add_(0, ids, _on_device(tuple(r.logit_bias.values()), logits.dtype, dev))
        if r.allowed_ids:
            ids = _on_device(tuple(r.allowed_ids), torch.int64, dev)
            kept = logits[i].index_select(0, ids)
            logits[i].fill_(float("-inf")).index_copy_(0, ids, kept)
        if r.banned_ids:
            logits[i].index_fill_(0, _on_device(tuple(r.banned_ids), torch.int64, dev), float("-inf"))
    return logits


def draw_tokens(logits: torch.Tensor, rows: list[SamplingRow], draw: Callable = sample_top_k_ref) -> torch.Tensor:
    """The tokens of rows that are all `is_plain`, left on the logits' device (no host sync): what `sample` returns
    for them, for a caller that reads them later."""
    n = logits.shape[0]
    temps = array("f", [r.temperature for r in rows]).tolist()
    if not any(t != 0.0 for t in temps):
        return torch.argmax(logits, dim=-1)
    # Greedy rows ride along with top_k 1: the op returns their first argmax.
    top_k = [r.top_k if t != 0.0 else 1 for r, t in zip(rows, temps)]
    dev = logits.device
    floats = _staged([temps, [r.top_p for r in rows], [r.min_p for r in rows]], torch.float32, dev)
    ints = _staged([top_k, [r.seed for r in rows], [r.step for r in rows]], torch.int64, dev)
    temp_t, top_p, min_p = floats[:, :n]
    top_k_t, seeds, steps = ints[:, :n]
    return draw(logits, temp_t, top_k_t, top_p, min_p, seeds, steps, max(top_k))


def raw_logprobs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor | None:
    """The model's log-probabilities [N, V] (before penalties, temperature and truncation) where a row asks for
    logprobs; None where none does. Taken before the draw, which may work on the logits in place."""
    return torch.log_softmax(logits, dim=-1) if any(r.logprobs is not None for r in rows) else None


def device_logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of `raw_logprobs`, on its device: each drawn token's, and each row's top k (k the most any row asks; 0 columns
    where none asks for top ones) as values and ids. No host sync: the engine reads them with the tokens."""
    chosen = raw.gather(1, tokens.view(-1, 1).to(torch.int64)).view(-1)
    values, ids = torch.topk(raw, max(r.logprobs or 0 for r in rows), dim=-1)
    return chosen, values, ids


def logprob_lists(
    chosen: list[float], top_values: list[list[float]], top_ids: list[list[int]], rows: list[SamplingRow]
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """`device_logprobs`' results read back: each row's token logprob, and its top `row.logprobs` (id, logprob)."""
    tops = [list(zip(top_ids[i][: r.logprobs or 0], top_values[i][: r.logprobs or 0])) for i, r in enumerate(rows)]
    return chosen, tops


def sample(logits: torch.Tensor, rows: list[SamplingRow], draw: Callable = sample_top_k_ref) -> SampleResult:
    """logits FP32 [N, V] (modified in place) -> one token per row.

    `draw`: the op with `sample_top_k_ref`'s contract that serves the common batch (every sampling row has
    0 < top_k < V and no constraint) in one call; the engine passes its kernel table's (a Triton kernel on a GPU)."""
    n, vocab = logits.shape
    raw = raw_logprobs(logits, rows)
    logits = apply_penalties(logits, rows)
    dev = logits.device
    scores = logits  # what each row's choice maximises (the constrained rows walk it in order)
    # Which rows sample, and their parameters, are decided on the host from `rows`: no device round trip before
    # the one that returns the tokens (each sync would stall the queue of small sampling kernels on a GPU).
    # A temperature that is 0 in FP32 (also a tiny positive one) means greedy, as the division would.
    temps_list = array("f", [r.temperature for r in rows]).tolist()
    picked_idx = [i for i, t in enumerate(temps_list) if t != 0.0]
    picked = [rows[i] for i in picked_idx]
    # A constrained row walks every token in score order, so it needs the full perturbed scores.
    constrained = any(r.allowed is not None for r in picked)
    if not picked or (not constrained and all(0 < r.top_k < vocab for r in picked)):
        tokens = draw_tokens(logits, rows, draw)  # penalties and bans are in the logits already
    else:
        tokens = torch.argmax(logits, dim=-1)
        floats = to_device(torch.tensor([[r.temperature, r.top_p, r.min_p] for r in picked], dtype=torch.float32), dev)
        ints = to_device(torch.tensor([[r.top_k, r.seed, r.step] for r in picked], dtype=torch.int64), dev)
        temps, top_p, min_p = floats.unbind(1)
        top_k_t, seeds, steps = ints.unbind(1)
        idx = to_device(torch.tensor(picked_idx), dev) if len(picked_idx) < n else slice(None)
        sub = logits[idx] / temps[:, None]
        truncate = any(r.top_k > 0 or r.top_p < 1.0 or r.min_p > 0 for r in picked)
        tokens[idx], perturbed = draw_full(sub, top_k_t, top_p, min_p, seeds, steps, truncate=truncate)
        if constrained:
            scores = logits.clone()
            scores[idx] = perturbed
    token_list = tokens.tolist()
    replaced = False  # whether a constrained row took its best allowed token instead of the draw's
    for i, r in enumerate(rows):
        if r.allowed is not None and not r.allowed(token_list[i]):
            token_list[i] = _best_allowed(scores[i], r.allowed, r.dead_end)
            replaced = True
    if raw is None:
        return SampleResult(token_list, None, None)
    taken = torch.tensor(token_list, device=dev) if replaced else tokens
    chosen, values, ids = device_logprobs(raw, taken, rows)
    return SampleResult(token_list, *logprob_lists(chosen.tolist(), values.tolist(), ids.tolist(), rows))
