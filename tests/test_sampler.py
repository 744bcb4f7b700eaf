"""The top-k sampling path (one `topk` selection, noise for the candidates only) draws exactly what the full-vocabulary
sort-and-mask path draws, for every mix of temperature, top-k, top-p and min-p in a batch; per-row logit biases and
allowed-token masks shape what every path draws."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from flint_kernels.sampling import draw_top_k, uniform_noise, uniform_noise_at

from flint_engine.sampler import (
    SamplingRow,
    apply_device_penalties,
    apply_penalties,
    apply_static_masks,
    draw_full,
    draw_tokens,
    is_plain,
    sample,
)


def _params(n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    top_k = torch.randint(1, 64, (n,), generator=gen)
    top_p = torch.where(torch.rand(n, generator=gen) < 0.3, 1.0, 0.3 + 0.7 * torch.rand(n, generator=gen))
    min_p = torch.where(torch.rand(n, generator=gen) < 0.5, 0.0, 0.2 * torch.rand(n, generator=gen))
    seeds = torch.randint(0, 2**62, (n,), generator=gen)
    steps = torch.randint(0, 10_000, (n,), generator=gen)
    return top_k, top_p.float(), min_p.float(), seeds, steps


@pytest.mark.parametrize("vocab", [97, 4096, 150_144])
def test_top_k_path_draws_what_the_full_sort_draws(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    draws = 0
    for trial in range(40 if vocab < 150_144 else 6):
        n = 16
        # Peaked and flat rows: a scale of 4 puts most mass in a few tokens, 0.3 spreads it over the top-k.
        scale = 4.0 if trial % 2 else 0.3
        logits = torch.randn(n, vocab, generator=gen) * scale
        params = _params(n, gen)
        want, _ = draw_full(logits.clone(), *params)
        got = draw_top_k(logits.clone(), *params)
        assert got.tolist() == want.tolist(), trial
        draws += n
    assert draws >= 96


def test_noise_for_chosen_ids_is_the_full_noise() -> None:
    seeds, steps = torch.tensor([3, 2**40 + 5]), torch.tensor([0, 17])
    full = uniform_noise(seeds, steps, 1000)
    ids = torch.tensor([[0, 999, 5], [7, 7, 123]])
    torch.testing.assert_close(uniform_noise_at(seeds, steps, ids), full.gather(1, ids), rtol=0, atol=0)
    assert float(full.min()) > 0.0 and float(full.max()) < 1.0


def test_sample_mixes_greedy_top_k_and_unbounded_rows() -> None:
    """One batch: a greedy row, default top-k rows (top-k path) and a top_k=0 row (full path); seeded rows repeat."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5000, generator=gen) * 2
    rows = [
        SamplingRow(0.0, 1.0, 0, 0.0, seed=1, step=0),
        SamplingRow(1.0, 0.95, 20, 0.0, seed=11, step=3),
        SamplingRow(0.7, 0.8, 5, 0.05, seed=12, step=9),
        SamplingRow(1.0, 0.9, 0, 0.0, seed=13, step=1),
    ]
    first = sample(logits.clone(), rows).token_ids
    assert first[0] == int(logits[0].argmax())
    assert first[1] in torch.topk(logits[1], 20).indices.tolist()
    assert first[2] in torch.topk(logits[2], 5).indices.tolist()
    # Each row alone draws what it drew in the batch.
    for i, r in enumerate(rows):
        assert sample(logits[i : i + 1].clone(), [r]).token_ids == [first[i]]


def test_temperature_zero_in_fp32_is_greedy() -> None:
    """A temperature too small for FP32 (1e-50) is greedy, as 0 is, instead of dividing by zero."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4000, generator=gen) * 2
    rows = [SamplingRow(t, 0.95, 20, 0.0, seed=5, step=2) for t in (1e-50, 0.0, 1.0)]
    got = sample(logits.clone(), rows).token_ids
    assert got[:2] == [int(logits[0].argmax()), int(logits[1].argmax())]
    assert got[2] == sample(logits[2:].clone(), rows[2:]).token_ids[0]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_sampling_op_gets_16_byte_aligned_parameters(n: int) -> None:
    """Triton specialises on pointer alignment: a misaligned parameter (a contiguous view of a column, as at N = 1)
    would compile a new kernel variant while serving. Every parameter reaches the op aligned, with its values."""
    from flint_kernels.sampling import sample_top_k_ref

    seen: list[torch.Tensor] = []

    def recording(logits: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        seen.extend(params[:-1])
        return sample_top_k_ref(logits, *params)

    rows = [SamplingRow(0.5 + i, 0.9, 5 + i, 0.01 * i, 100 + i, 7 * i) for i in range(n)]
    logits = torch.randn(n, 64, generator=torch.Generator().manual_seed(n))
    expected = sample(logits.clone(), rows).token_ids
    assert sample(logits.clone(), rows, recording).token_ids == expected
    temps, top_k, top_p, min_p, seeds, steps = seen
    assert all(t.data_ptr() % 16 == 0 and t.is_contiguous() and t.shape == (n,) for t in seen)
    assert temps.tolist() == pytest.approx([0.5 + i for i in range(n)]) and top_k.tolist() == [5 + i for i in range(n)]
    assert top_p.tolist() == pytest.approx([0.9] * n) and min_p.tolist() == pytest.approx([0.01 * i for i in range(n)])
    assert seeds.tolist() == [100 + i for i in range(n)] and steps.tolist() == [7 * i for i in range(n)]


def test_logit_bias_shifts_the_draw() -> None:
    """logit_bias adds to the logits the draw sees (greedy, top-k and unbounded rows); a biased row is not plain."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 3000, generator=gen) * 2
    top = logits.argmax(dim=-1).tolist()
    pick = [int(i) for i in torch.randint(0, 3000, (3,), generator=gen)]
    rows = [
        SamplingRow(0.0, 1.0, 0, 0.0, seed=1, step=0, logit_bias={pick[0]: 100.0}),
        SamplingRow(1.0, 0.95, 20, 0.0, seed=2, step=4, logit_bias={pick[1]: 100.0, top[1]: -100.0}),
        SamplingRow(0.0, 1.0, 0, 0.0, seed=3, step=0, logit_bias={top[2]: -100.0}),
    ]
    assert sample(logits.clone(), rows).token_ids[:2] == pick[:2]
    second = torch.topk(logits[2], 2).indices[1]
    assert sample(logits[2:].clone(), rows[2:]).token_ids == [int(second)]
    biased = apply_penalties(logits[:1].clone(), rows[:1])
    assert float(biased[0, pick[0]] - logits[0, pick[0]]) == pytest.approx(100.0)
    others = torch.arange(3000) != pick[0]
    assert torch.equal(biased[0, others], logits[0, others])
    # On the device path (steps launched ahead), the bias is applied there to the same logits and tokens.
    assert all(is_plain(r, 3000) for r in rows)
    assert torch.equal(apply_static_masks(logits.clone(), rows), apply_penalties(logits.clone(), rows))
    assert (
        draw_tokens(apply_static_masks(logits.clone(), rows), rows).tolist() == sample(logits.clone(), rows).token_ids
    )


def test_allowed_ids_mask_every_other_token() -> None:
    """Greedy, top-k and unbounded rows draw only allowed tokens; greedy takes the best of them."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 2000, generator=gen) * 3
    allowed = tuple(int(i) for i in torch.randperm(2000, generator=gen)[:5])
    rows = [
        SamplingRow(0.0, 1.0, 0, 0.0, seed=1, step=0, allowed_ids=allowed),
        SamplingRow(1.0, 0.95, 20, 0.0, seed=2, step=1, allowed_ids=allowed),
        SamplingRow(1.0, 1.0, 0, 0.0, seed=3, step=2, allowed_ids=allowed),
    ]
    for step in range(20):
        rows = [dataclasses.replace(r, step=step) for r in rows]
        got = sample(logits.clone(), rows).token_ids
        assert all(t in allowed for t in got), got
    assert got[0] == max(allowed, key=lambda t: float(logits[0, t]))
    plain = rows[:2]  # (the unbounded row samples on the host)
    assert all(is_plain(r, 2000) for r in plain) and not is_plain(rows[2], 2000)
    assert torch.equal(apply_static_masks(logits[:2].clone(), plain), apply_penalties(logits[:2].clone(), plain))
    on_device = draw_tokens(apply_static_masks(logits[:2].clone(), plain), plain).tolist()
    assert on_device == sample(logits[:2].clone(), plain).token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_constrained_rows_logprob_is_the_token_it_took(temperature: float) -> None:
    """Where the constraint refuses the model's pick, the row's token is the best allowed one, and its reported
    logprob is that token's (not the refused pick's), as the raw distribution gives it."""
    torch.manual_seed(3)
    logits = torch.randn(3, 50)
    raw = torch.log_softmax(logits, dim=-1)
    allowed = {7, 11}  # neither is the row's favourite, almost surely
    rows = [
        SamplingRow(temperature, 1.0, 5, 0.0, seed=1, step=0, logprobs=2, allowed=lambda t: t in allowed),
        SamplingRow(0.0, 1.0, 0, 0.0, seed=2, step=0, logprobs=0),
        SamplingRow(temperature, 1.0, 5, 0.0, seed=3, step=4, logprobs=1, allowed=lambda t: t in allowed),
    ]
    out = sample(logits.clone(), rows)
    assert out.token_ids[0] in allowed and out.token_ids[2] in allowed
    for i, t in enumerate(out.token_ids):
        assert out.logprobs[i] == pytest.approx(raw[i, t].item(), abs=1e-6)


def test_penalties_on_the_device_equal_the_hosts() -> None:
    """`apply_device_penalties` gives the host's `apply_penalties` values exactly (presence, frequency, repetition
    over prompt and output), also with each row's latest token given apart on the device (a step launched ahead),
    and the draw on top of them takes the host's tokens."""
    gen = torch.Generator().manual_seed(5)
    vocab = 1000
    logits = torch.randn(4, vocab, generator=gen) * 4
    outs = [torch.randint(0, 60, (n,), generator=gen).tolist() for n in (9, 1, 14, 6)]
    prompt = torch.randint(0, 80, (30,), generator=gen).tolist()
    rows = [
        SamplingRow(0.0, 1.0, 0, 0.0, seed=1, step=9, presence_penalty=1.5, output_ids=outs[0]),
        SamplingRow(0.8, 1.0, 9, 0.0, seed=2, step=1, frequency_penalty=0.7, presence_penalty=-0.4, output_ids=outs[1]),
        SamplingRow(0.0, 1.0, 0, 0.0, seed=3, step=14, repetition_penalty=1.3, output_ids=outs[2], prompt_ids=prompt),
        SamplingRow(1.0, 0.9, 20, 0.0, seed=4, step=6, frequency_penalty=2.0, repetition_penalty=0.8,
                    output_ids=outs[3], prompt_ids=prompt, logit_bias={3: 2.0}),
    ]  # fmt: skip
    want = apply_penalties(logits.clone(), rows)
    assert all(is_plain(r, vocab) for r in rows)
    assert torch.equal(apply_static_masks(apply_device_penalties(logits.clone(), rows), rows), want)
    earlier = [dataclasses.replace(r, output_ids=r.output_ids[:-1]) for r in rows]
    last = torch.tensor([o[-1] for o in outs])
    assert torch.equal(apply_static_masks(apply_device_penalties(logits.clone(), earlier, last), earlier), want)
    assert not torch.equal(apply_device_penalties(logits.clone(), earlier), want)  # (the last token counts)
    drawn = draw_tokens(apply_static_masks(apply_device_penalties(logits.clone(), rows), rows), rows).tolist()
    assert drawn == sample(logits.clone(), rows).token_ids
