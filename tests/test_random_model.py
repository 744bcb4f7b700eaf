"""`random:<preset>[:nvfp4]` model specs: an engine of a preset's shape with random weights and the default
tokenizer, no checkpoint file, deterministic for a seed."""

from __future__ import annotations

import pytest
import torch

from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.random_model import RandomModelSpec, parse_random_spec
from flint_engine.sampling_params import SamplingParams


def test_parse_specs() -> None:
    assert parse_random_spec("random:full") == RandomModelSpec("full", False, 0)
    assert parse_random_spec("random:tiny:nvfp4:seed=7") == RandomModelSpec("tiny", True, 7)
    assert parse_random_spec("random:small:bf16") == RandomModelSpec("small", False, 0)
    for bad, why in (("random:", "unknown preset"), ("random:tiny:seed=x", "unknown option"), ("random:x", "preset")):
        with pytest.raises(ValueError, match=why):
            parse_random_spec(bad)


@pytest.mark.parametrize("spec", ["random:tiny", "random:tiny:nvfp4"])
def test_engine_serves_a_random_model(spec: str) -> None:
    engine = LLMEngine.from_checkpoint(
        EngineConfig(model=spec, device="cpu", dtype="float32", kv_cache_memory=8 * 2**20), progress=False
    )
    assert engine.model.weights.is_nvfp4() == spec.endswith("nvfp4")
    prompt = engine.tokenizer.encode("Hello there")
    [a] = engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    [b] = engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(a.output_token_ids) == 8 and a.output_token_ids == b.output_token_ids
    again = LLMEngine.from_checkpoint(
        EngineConfig(model=spec, device="cpu", dtype="float32", kv_cache_memory=8 * 2**20), progress=False
    )
    [c] = again.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert c.output_token_ids == a.output_token_ids  # deterministic for a seed
    assert torch.isfinite(engine.model.forward_sequences([prompt])[0]).all()


def test_random_checkpoint_file_matches_its_tokenizer(tmp_path) -> None:
    """The default-model fallback (when the shipped demo file is missing) writes a loadable random checkpoint."""
    from flint_engine.checkpoint import load_checkpoint
    from flint_engine.default_model import make_random_checkpoint

    ck = load_checkpoint(make_random_checkpoint(tmp_path / "t.gguf", "tiny", 0), torch.float32, progress=False)
    assert ck.tokenizer is not None and ck.tokenizer.vocab_size == ck.config.vocab_size
    assert set(ck.config.eos_token_id) <= set(ck.tokenizer.eos_token_ids)
