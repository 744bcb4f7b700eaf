"""Top-k sampling over a batch of logit rows: the PyTorch reference for `sampling_triton`.

Randomness comes from a counter-based hash of (seed, step, token id), not from a stateful generator, so a seeded
request draws the same token whatever else is in the batch, on CPU or GPU, and after a preemption. A draw is
Gumbel-max over the truncated, temperature-scaled logits, which is exactly sampling from their softmax.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xorshift-multiply), on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def uniform_noise_at(seeds: torch.Tensor, steps: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """U(0,1) float32 [N, K] for the given token ids [N, K] (or [1, K]), a pure function of (seed, step, token id)."""
    s = seeds.to(torch.int64)
    lo, hi = s & _M32, (s >> 32) & _M32
    key = _mix32(lo ^ _mix32(hi ^ _mix32(steps.to(torch.int64) & _M32)))
    h = _mix32(key[:, None] ^ ((token_ids.to(torch.int64) * 0x9E3779B9) & _M32))
    h = _mix32(h ^ key[:, None])
    return ((h.to(torch.float64) + 0.5) / 2.0**32).to(torch.float32)


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """U(0,1) float32 [N, vocab] for every token id."""
    return uniform_noise_at(seeds, steps, torch.arange(vocab, dtype=torch.int64, device=seeds.device)[None, :])


def keep_sorted(
    sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """On logits sorted descending [N, K]: True where a token survives top-k, then top-p, then min-p."""
    width = sorted_logits.shape[-1]
    rank = torch.arange(width, device=sorted_logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, width))
    keep = rank < k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it already does.
    before = torch.cumsum(probs, dim=-1) - probs
    keep &= before < top_p[:, None]
    keep[:, 0] = True
    keep &= probs >= min_p[:, None] * probs[:, :1]
    return keep


def draw_top_k(
    sub: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    k_max: int | None = None,
) -> torch.Tensor:
    """Gumbel-max over temperature-scaled logits `sub` [N, V] when every row has top_k > 0, without sorting the
    vocabulary: top-p and min-p act on the top-k distribution, so only the max(top_k) best candidates (one `topk`
    selection) and their noise are needed. `k_max`: max(top_k) when the caller knows it on the host (else read from
    the tensor, which waits for the device)."""
    vals, ids = torch.topk(sub, int(top_k.max()) if k_max is None else k_max, dim=-1)
    keep = keep_sorted(vals, top_k, top_p, min_p)
    perturbed = vals - torch.log(-torch.log(uniform_noise_at(seeds, steps, ids)))
    best = torch.argmax(perturbed.masked_fill(~keep, float("-inf")), dim=-1)
    return ids.gather(1, best[:, None]).squeeze(1)


def sample_top_k_ref(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    k_max: int,
) -> torch.Tensor:
    """One token per row of FP32 `logits` [N, V]: greedy (first argmax) where temperature is 0, else a top-k draw
    of `logits / temperature`. Every row needs 1 <= top_k <= k_max <= V (greedy rows: any such top_k)."""
    greedy = temperature == 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    drawn = draw_top_k(logits / scale[:, None], top_k, top_p, min_p, seeds, steps, k_max=k_max)
    return torch.where(greedy, torch.argmax(logits, dim=-1), drawn)
