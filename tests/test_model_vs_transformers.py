"""Our plain PyTorch Flint against transformers' FlintForCausalLM on the same random weights."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_checkpoint
from transformers import FlintForCausalLM

from flint_engine.checkpoint import open_source
from flint_engine.checkpoint.assemble import assemble_weights
from flint_engine.config import FULL, SLIDING, FlintConfig, preset
from flint_engine.model import FlintModel

FP32_TOL = 1e-5
BF16_TOL = 2e-2


def _configs() -> dict[str, FlintConfig]:
    tiny = preset("tiny")  # window 7: sequences cross the window edge; full layers 0, 1, 5 are NoPE
    odd = tiny.replace(
        num_hidden_layers=5,
        layer_types=(SLIDING, FULL, SLIDING, FULL, SLIDING),
        mlp_only_layers=(0, 2),
        sliding_window=5,
        num_experts=6,
        num_experts_per_tok=2,
    )
    real_window = tiny.replace(
        num_hidden_layers=3, layer_types=(FULL, SLIDING, SLIDING), mlp_only_layers=(0,), sliding_window=513
    )
    return {"tiny": tiny, "odd": odd, "window513": real_window}


CONFIGS = _configs()
SEQ_LENS = {"tiny": [1, 6, 7, 8, 23, 40], "odd": [3, 17, 31], "window513": [700, 520]}


def _compare(name: str, dtype: torch.dtype, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[float, float]]:
    cfg = CONFIGS[name]
    path = hf_checkpoint(tmp_path_factory.mktemp(name), cfg, seed=7)
    hf = FlintForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model = FlintModel(assemble_weights(open_source(path), dtype, progress=False))
    gen = torch.Generator().manual_seed(11)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in SEQ_LENS[name]]
    ours = model.forward_sequences(seqs)  # all sequences in one flat varlen batch
    stats = []
    for seq, got in zip(seqs, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0].float()
        rel = ((got - ref).norm() / ref.norm()).item()
        # In BF16 the reference's own logits are rounded, so its top token is sometimes tied with others; any
        # token tied for the reference's maximum counts as agreeing (our logits are FP32 and break such ties).
        ours_top = got.argmax(-1)
        agree = (ref.gather(-1, ours_top[:, None])[:, 0] == ref.max(-1).values).float().mean().item()
        stats.append((rel, agree))
    return stats


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fp32_logits_match(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    for rel, agree in _compare(name, torch.float32, tmp_path_factory):
        assert rel < FP32_TOL
        assert agree == 1.0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_bf16_logits_match(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    stats = _compare(name, torch.bfloat16, tmp_path_factory)
    for rel, _ in stats:
        assert rel < BF16_TOL
    total_agree = sum(a for _, a in stats) / len(stats)
    assert total_agree > 0.99


def test_batched_equals_alone(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A sequence's logits do not depend on the other sequences in the flat batch."""
    cfg = CONFIGS["tiny"]
    path = hf_checkpoint(tmp_path_factory.mktemp("alone"), cfg, seed=3)
    model = FlintModel(assemble_weights(open_source(path), torch.float32, progress=False))
    seqs = [list(range(5, 30)), [9, 8, 7], list(range(100, 140))]
    together = model.forward_sequences(seqs)
    for s, t in zip(seqs, together):
        alone = model.forward_sequences([s])[0]
        torch.testing.assert_close(t, alone, rtol=1e-5, atol=1e-5)
