"""benchmarks/fast_path_accuracy.py's teacher forcing: each path fed the yardstick's greedy tokens, its own choice
compared at every step on the same context (the check behind "greedy agreement over 256 steps" on a random model,
whose near-ties make free-running comparisons part early)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from flint_engine.config import preset
from flint_engine.model import FlintModel
from flint_engine.weights import as_float32, random_weights

PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7, 7, 300, 12]]  # the tiny preset has 384 tokens
STEPS = 20


@pytest.fixture
def fpa(benchmark_script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = benchmark_script("fast_path_accuracy")
    monkeypatch.setattr(module, "kv_budget", lambda model, seqs: 32 * 2**20)  # its GPU-sized budget: 2 GiB
    return module


def test_forcing_a_models_own_tokens_is_its_greedy_decoding(fpa: ModuleType) -> None:
    gold = FlintModel(as_float32(random_weights(preset("tiny"), torch.bfloat16, seed=3)))
    ref = fpa.greedy(gold, PROMPTS, STEPS)
    same = fpa.forced(gold, PROMPTS, ref)
    assert same.tokens == ref.tokens
    assert all(a == pytest.approx(b) for a, b in zip(same.gaps, ref.gaps))
    result = fpa.forced_agreement(same, ref, tie=0.1)
    assert result == {
        "positions": 2 * STEPS,
        "agreement": 1.0,
        "differ": 0,
        "differ_beyond_tie": 0,
        "tie": 0.1,
        "widest_gap_at_difference": None,
    }


def test_forced_choices_are_made_on_the_fed_context(fpa: ModuleType) -> None:
    """Fed tokens the model would never pick, each step's own choice is still the argmax of a whole forward over the
    prompt and the fed tokens so far: the engine really decoded on the forced context."""
    model = FlintModel(random_weights(preset("tiny"), torch.float32, seed=4))
    gen = torch.Generator().manual_seed(0)
    fed = [torch.randint(0, 384, (STEPS,), generator=gen).tolist() for _ in PROMPTS]
    own = fpa.forced(model, PROMPTS, fpa.Decoded(fed, [[0.0] * STEPS for _ in PROMPTS]))
    for prompt, tokens, choices in zip(PROMPTS, fed, own.tokens):
        for k in (0, 1, 7, STEPS - 1):
            [logits] = model.forward_sequences([prompt + tokens[:k]])
            assert choices[k] == int(logits[-1].argmax())
    assert own.tokens != fed


def test_bf16_differs_from_fp32_only_at_near_ties(fpa: ModuleType) -> None:
    w = random_weights(preset("tiny"), torch.bfloat16, seed=6)
    ref = fpa.greedy(FlintModel(as_float32(w)), PROMPTS, STEPS)
    result = fpa.forced_agreement(fpa.forced(FlintModel(w), PROMPTS, ref), ref, tie=0.1)
    assert result["positions"] == 2 * STEPS and result["differ_beyond_tie"] == 0
    assert result["agreement"] >= 0.9


def test_decode_benchmarks_check_reports_the_forced_comparison(
    fpa: ModuleType, benchmark_script: Callable[[str], ModuleType]
) -> None:
    """decode.py's fused-vs-plain check on CPU (both paths the reference there): free-running and teacher-forced
    agreement both whole, no difference beyond the tie."""
    decode = benchmark_script("decode")
    cfg = preset("tiny")
    w = random_weights(cfg, torch.float32, seed=8)
    out = decode.check_fast_vs_plain(FlintModel(w), FlintModel(w), cfg, torch.device("cpu"), 8, 2, 16)
    assert out["greedy_token_agreement"] == 1.0 and out["first_divergence_step"] is None
    assert out["forced_token_agreement"] == 1.0 and out["forced_differ_beyond_tie"] == 0
    assert out["tie"] == decode.TIE
