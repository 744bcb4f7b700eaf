"""Log-probabilities of a prompt's own tokens (OpenAI's `echo` with `logprobs`, as lm-evaluation-harness scores
multiple-choice answers, and vLLM's `prompt_logprobs`): the lm_head over a prefill chunk's hidden rows, each row's
FP32 log-softmax read at the prompt's next token, as the sampler reads a sampled token's, with that token's rank
and the top alternatives. An entry is (token, logprob, [(alternative, logprob), ...], rank).

Row r of a chunk that starts at position c holds position c + r and predicts the token at c + r + 1, so a chunk
yields the prompt tokens c + 1 .. c + n (up to the prompt's last); the prompt's first token has none. Rows go
through the lm_head a few hundred at a time: a whole 8K prompt's logits would be ~5 GB in FP32."""

from __future__ import annotations

import torch

from .model import FlintModel
from .scheduler import ScheduledChunk

ROWS_A_PASS = 256  # ~150 MB of FP32 logits and as much log-softmax at Flint's vocabulary


def wants_prompt_logprobs(chunk: ScheduledChunk) -> bool:
    """The chunk computes prompt positions whose next prompt token's log-probability was asked for."""
    req = chunk.request
    return req.prompt_logprobs is not None and req.num_computed_tokens + 1 < len(req.prompt_token_ids)


def record_prompt_logprobs(
    model: FlintModel, hidden: torch.Tensor, query_start: list[int], chunks: list[ScheduledChunk]
) -> None:
    """Fill each wanting chunk's request's `prompt_logprobs` for the prompt tokens this step's rows predict."""
    for i, ch in enumerate(chunks):
        if not wants_prompt_logprobs(ch):
            continue
        req = ch.request
        prompt, top_k = req.prompt_token_ids, req.params.prompt_logprobs or 0
        c = req.num_computed_tokens
        last = min(c + ch.num_tokens, len(prompt) - 1)  # the last prompt token this chunk's rows predict
        for lo in range(c + 1, last + 1, ROWS_A_PASS):
            hi = min(lo + ROWS_A_PASS, last + 1)
            first_row = query_start[i] + lo - 1 - c
            logp = torch.log_softmax(model.compute_logits(hidden[first_row : first_row + hi - lo]).float(), dim=-1)
            targets = torch.tensor(prompt[lo:hi], dtype=torch.int64, device=logp.device)
            chosen_t = logp.gather(1, targets[:, None])
            ranks = ((logp > chosen_t).sum(dim=-1) + 1).tolist()  # 1: the most likely token
            chosen = chosen_t.squeeze(1).tolist()
            tops: list[list[tuple[int, float]]] = [[] for _ in chosen]
            if top_k:
                vals, ids = torch.topk(logp, top_k, dim=-1)
                tops = [list(zip(r_ids, r_vals)) for r_ids, r_vals in zip(ids.tolist(), vals.tolist())]
            for j, pos in enumerate(range(lo, hi)):
                req.prompt_logprobs[pos] = (prompt[pos], chosen[j], tops[j], ranks[j])  # type: ignore[index]
