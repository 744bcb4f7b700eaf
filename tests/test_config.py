"""FlintConfig: HF and GGUF round trips, presets, and errors that name the bad field."""

from __future__ import annotations

import pytest
from transformers import FlintConfig as HFFlintConfig

from flint_engine.config import FULL, SLIDING, ConfigError, FlintConfig, default_layer_types, preset


def test_full_preset_matches_the_published_model() -> None:
    c = preset("full")
    assert c.parameter_count() == 39_785_287_456
    assert round(c.active_parameter_count() / 1e9, 2) == 2.52
    assert c.full_layers == (0, 1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 48)
    assert len(c.sliding_layers) == 35
    assert c.kv_bytes_per_token() == 28 * 1024
    assert c.moe_layers == tuple(range(2, 49))


def test_hf_round_trip_and_transformers_accepts_it() -> None:
    c = preset("tiny")
    d = c.to_hf_dict()
    assert FlintConfig.from_hf_dict(d) == c
    hf = HFFlintConfig(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    assert hf.layer_types == list(c.layer_types)
    assert FlintConfig.from_hf_dict(hf.to_dict()) == c


def test_hf_defaults_follow_the_published_pattern() -> None:
    d = preset("full").to_hf_dict()
    del d["layer_types"]
    assert FlintConfig.from_hf_dict(d).layer_types == default_layer_types(49)


def test_gguf_round_trip_keeps_patterns() -> None:
    c = preset("tiny").replace(layer_types=(SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING))
    meta = {"general.architecture": "flint", **c.to_gguf_metadata()}
    back = FlintConfig.from_gguf_metadata(meta)
    assert back == c
    # rope pattern independent of the window pattern when the file says so
    meta["flint.attention.rope_pattern"] = [True] * 6
    assert FlintConfig.from_gguf_metadata(meta).rope_layers == (True,) * 6


def test_gguf_without_vocab_counts_tokens() -> None:
    c = preset("tiny")
    meta = {"general.architecture": "flint", **c.to_gguf_metadata()}
    del meta["flint.vocab_size"]
    meta["tokenizer.ggml.tokens"] = ["a"] * c.vocab_size
    assert FlintConfig.from_gguf_metadata(meta).vocab_size == c.vocab_size


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"layer_types": (FULL,) * 5}, "layer_types"),
        ({"layer_types": ("full_attention",) * 5 + ("chunked",)}, "layer_types"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"mlp_only_layers": (0, 9)}, "mlp_only_layers"),
        ({"head_dim": 15}, "head_dim"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"router_score_function": "softmax"}, "router_score_function"),
        ({"eos_token_id": (99999,)}, "eos_token_id"),
        ({"rope_layers": (True,)}, "rope_layers"),
    ],
)
def test_invalid_configs_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        preset("tiny").replace(**change)
    assert err.value.field == field
    assert field in str(err.value)


def test_hf_errors_name_the_field() -> None:
    d = preset("tiny").to_hf_dict()
    d["vocab_size"] = "many"
    with pytest.raises(ConfigError, match="vocab_size"):
        FlintConfig.from_hf_dict(d)
    d = preset("tiny").to_hf_dict()
    d["model_type"] = "llama"
    with pytest.raises(ConfigError, match="model_type"):
        FlintConfig.from_hf_dict(d)
    d = preset("tiny").to_hf_dict()
    del d["num_hidden_layers"]
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        FlintConfig.from_hf_dict(d)


def test_gguf_errors_name_the_key() -> None:
    meta = {"general.architecture": "flint", **preset("tiny").to_gguf_metadata()}
    bad = dict(meta, **{"general.architecture": "llama"})
    with pytest.raises(ConfigError, match=r"general\.architecture"):
        FlintConfig.from_gguf_metadata(bad)
    bad = dict(meta)
    del bad["flint.block_count"]
    with pytest.raises(ConfigError, match=r"flint\.block_count"):
        FlintConfig.from_gguf_metadata(bad)
    bad = dict(meta, **{"flint.attention.sliding_window_pattern": [True, False]})
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        FlintConfig.from_gguf_metadata(bad)
    bad = dict(meta, **{"flint.expert_gating_func": 1})
    with pytest.raises(ConfigError, match="expert_gating_func"):
        FlintConfig.from_gguf_metadata(bad)


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="preset"):
        preset("huge")
