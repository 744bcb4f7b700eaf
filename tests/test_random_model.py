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
    assert parse_random_spec("random:full:layers=8") == RandomModelSpec("full", False, 0, 8)
    bad_specs = (("random:", "unknown preset"), ("random:tiny:seed=x", "unknown option"), ("random:x", "preset"),
                 ("random:full:layers=0", "outside 1..49"), ("random:full:layers=50", "outside 1..49"),
                 ("random:full:layers=x", "unknown option"))  # fmt: skip
    for bad, why in bad_specs:
        with pytest.raises(ValueError, match=why):
            parse_random_spec(bad)


def test_first_layers_keep_their_kinds_and_the_kernel_profile() -> None:
    """`layers=N`: the full preset's first N layers, each of its attention and MLP kind, the same kernel profile
    (what the kernel manifest is keyed by) as the whole model."""
    from flint_engine import kernel_profile
    from flint_engine.config import FULL, SLIDING, preset
    from flint_engine.random_model import first_layers

    full = preset("full")
    cut = first_layers(full, 8)
    cut.validate()
    assert cut.num_hidden_layers == 8 and cut.layer_types == full.layer_types[:8]
    assert {FULL, SLIDING} <= set(cut.layer_types) and cut.rope_layers == full.rope_layers[:8]
    assert cut.mlp_only_layers == full.mlp_only_layers and cut.moe_layers == tuple(range(2, 8))
    parts = dict.fromkeys(kernel_profile.PARTS, False)
    assert kernel_profile.name(cut, torch.bfloat16, parts) == kernel_profile.name(full, torch.bfloat16, parts)


def test_engine_serves_the_first_layers_of_a_preset() -> None:
    engine = LLMEngine.from_checkpoint(
        EngineConfig(model="random:tiny:layers=3", device="cpu", dtype="float32", kv_cache_memory=8 * 2**20),
        progress=False,
    )
    assert engine.model.config.num_hidden_layers == 3 == len(engine.model.weights.layers)
    [out] = engine.generate([engine.tokenizer.encode("Hi")], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out.output_token_ids) == 4


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
