"""Flint architecture configuration: from HF `config.json`, from GGUF metadata, presets, validation."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FULL = "full_attention"
SLIDING = "sliding_attention"
GGUF_ARCH = "flint"


class ConfigError(ValueError):
    """An invalid or inconsistent Flint configuration; `field` names the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"invalid Flint config field '{field_name}': {message}")
        self.field = field_name


def default_layer_types(num_layers: int) -> tuple[str, ...]:
    """Flint's published pattern: full attention at i < 2, i % 4 == 1 and the last layer."""
    return tuple(FULL if i < 2 or i % 4 == 1 or i == num_layers - 1 else SLIDING for i in range(num_layers))


@dataclass(frozen=True)
class FlintConfig:
    """Every architecture field of Flint. Layer patterns always come from the checkpoint."""

    vocab_size: int = 150144
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 49
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    head_dim: int = 128
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 1024
    num_experts: int = 256
    num_experts_per_tok: int = 6
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    router_score_function: str = "sigmoid"
    rms_norm_eps: float = 1e-6
    sliding_window: int = 513
    max_position_embeddings: int = 262144
    rope_theta: float = 10000.0
    layer_types: tuple[str, ...] = field(default_factory=lambda: default_layer_types(49))
    # True where the layer applies NeoX RoPE; HF ties this to the sliding layers, GGUF stores it separately.
    rope_layers: tuple[bool, ...] | None = None
    mlp_only_layers: tuple[int, ...] = (0, 1)
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mlp_only_layers", tuple(sorted(int(i) for i in self.mlp_only_layers)))
        eos = self.eos_token_id
        if isinstance(eos, int):
            eos = (eos,)
        object.__setattr__(self, "eos_token_id", tuple(int(e) for e in (eos or ())))
        if self.rope_layers is None:
            object.__setattr__(self, "rope_layers", tuple(t == SLIDING for t in self.layer_types))
        else:
            object.__setattr__(self, "rope_layers", tuple(bool(b) for b in self.rope_layers))
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        positive = [
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "sliding_window",
            "max_position_embeddings",
        ]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                "num_key_value_heads",
                f"{self.num_attention_heads} query heads are not a multiple of {self.num_key_value_heads} KV heads",
            )
        if self.head_dim % 2:
            raise ConfigError("head_dim", f"must be even for NeoX RoPE, got {self.head_dim}")
        if not (self.rms_norm_eps > 0):
            raise ConfigError("rms_norm_eps", f"must be > 0, got {self.rms_norm_eps}")
        if not (self.rope_theta > 0):
            raise ConfigError("rope_theta", f"must be > 0, got {self.rope_theta}")
        n = self.num_hidden_layers
        if len(self.layer_types) != n:
            raise ConfigError("layer_types", f"has {len(self.layer_types)} entries for {n} layers")
        bad = [t for t in self.layer_types if t not in (FULL, SLIDING)]
        if bad:
            raise ConfigError("layer_types", f"unknown layer type {bad[0]!r} (expected {FULL!r} or {SLIDING!r})")
        assert self.rope_layers is not None
        if len(self.rope_layers) != n:
            raise ConfigError("rope_layers", f"has {len(self.rope_layers)} entries for {n} layers")
        for i in self.mlp_only_layers:
            if not 0 <= i < n:
                raise ConfigError("mlp_only_layers", f"layer index {i} is outside 0..{n - 1}")
        if len(set(self.mlp_only_layers)) != len(self.mlp_only_layers):
            raise ConfigError("mlp_only_layers", "has duplicate layer indices")
        has_dense = bool(self.mlp_only_layers)
        has_moe = len(self.mlp_only_layers) < n
        if has_dense and (not isinstance(self.intermediate_size, int) or self.intermediate_size <= 0):
            raise ConfigError("intermediate_size", f"must be a positive integer, got {self.intermediate_size!r}")
        if has_moe:
            for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
                value = getattr(self, name)
                if not isinstance(value, int) or value <= 0:
                    raise ConfigError(name, f"must be a positive integer, got {value!r}")
            if self.num_experts_per_tok > self.num_experts:
                raise ConfigError(
                    "num_experts_per_tok", f"{self.num_experts_per_tok} exceeds num_experts={self.num_experts}"
                )
            if self.shared_expert_intermediate_size < 0:
                raise ConfigError("shared_expert_intermediate_size", "must be >= 0")
        if self.router_score_function != "sigmoid":
            raise ConfigError(
                "router_score_function", f"Flint routes with 'sigmoid', got {self.router_score_function!r}"
            )
        if self.routed_scaling_factor <= 0:
            raise ConfigError("routed_scaling_factor", f"must be > 0, got {self.routed_scaling_factor}")
        if self.tie_word_embeddings:
            raise ConfigError("tie_word_embeddings", "Flint has an untied lm_head")
        for name in ("bos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ConfigError(name, f"{value} is outside the vocabulary of {self.vocab_size}")
        for e in self.eos_token_id:
            if not 0 <= e < self.vocab_size:
                raise ConfigError("eos_token_id", f"{e} is outside the vocabulary of {self.vocab_size}")

    # ------------------------------------------------------------------ derived facts
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING)

    def uses_rope(self, layer: int) -> bool:
        assert self.rope_layers is not None
        return self.rope_layers[layer]

    def is_moe(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_moe(i))

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of K+V per token summed over the full-attention layers (sliding layers are bounded)."""
        return len(self.full_layers) * 2 * self.kv_size * dtype_bytes

    def sliding_kv_bytes_per_slot(self, dtype_bytes: int = 2) -> int:
        """Bytes of K+V for one token position summed over the sliding layers."""
        return len(self.sliding_layers) * 2 * self.kv_size * dtype_bytes

    def parameter_count(self) -> int:
        h, q, kv = self.hidden_size, self.q_size, self.kv_size
        attn = h * q + 2 * h * kv + q * h + 2 * self.head_dim + self.num_attention_heads + 2 * h
        total = 2 * self.vocab_size * h + h  # embedding, lm_head, final norm
        for i in range(self.num_hidden_layers):
            total += attn
            if self.is_moe(i):
                total += self.num_experts * 3 * h * self.moe_intermediate_size
                total += 3 * h * self.shared_expert_intermediate_size
                total += self.num_experts * h
            else:
                total += 3 * h * self.intermediate_size
        return total

    def active_parameter_count(self) -> int:
        """Parameters touched per token, excluding the embedding lookup."""
        h = self.hidden_size
        total = self.parameter_count() - self.vocab_size * h
        unused = (self.num_experts - self.num_experts_per_tok) * 3 * h * self.moe_intermediate_size
        return total - len(self.moe_layers) * unused

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf_dict(cls, cfg: Mapping[str, Any]) -> FlintConfig:
        model_type = cfg.get("model_type", "flint")
        if model_type != "flint":
            raise ConfigError("model_type", f"expected 'flint', got {model_type!r}")
        n = _req_int(cfg, "num_hidden_layers")
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            if cfg.get("use_sliding_window", True) is False:
                layer_types = [FULL] * n
            else:
                layer_types = list(default_layer_types(n))
        rope_layers = None
        if cfg.get("no_rope_layer_indices") is not None:
            no_rope = {int(i) for i in cfg["no_rope_layer_indices"]}
            rope_layers = tuple(i not in no_rope for i in range(n))
        rope_params = cfg.get("rope_parameters") or {}
        if not isinstance(rope_params, Mapping):
            raise ConfigError("rope_parameters", f"must be an object, got {type(rope_params).__name__}")
        rope_type = rope_params.get("rope_type", rope_params.get("type", "default"))
        if rope_type != "default":
            raise ConfigError("rope_parameters", f"only rope_type 'default' is supported, got {rope_type!r}")
        rope_theta = rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        mlp_only = cfg.get("mlp_only_layers")
        if mlp_only is None:
            mlp_only = [0, 1]
        step = cfg.get("decoder_sparse_step", 1)
        if step != 1:
            mlp_only = sorted({*mlp_only, *(i for i in range(n) if (i + 1) % step != 0)})
        eos = cfg.get("eos_token_id")
        kwargs: dict[str, Any] = dict(
            vocab_size=_req_int(cfg, "vocab_size"),
            hidden_size=_req_int(cfg, "hidden_size"),
            intermediate_size=int(cfg.get("intermediate_size", 0)),
            num_hidden_layers=n,
            num_attention_heads=_req_int(cfg, "num_attention_heads"),
            num_key_value_heads=int(cfg.get("num_key_value_heads", cfg.get("num_attention_heads", 0))),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size", 0)),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 0)),
            num_experts=int(cfg.get("num_experts", 0)),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 0)),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            router_score_function=str(cfg.get("router_score_function", "sigmoid")),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            sliding_window=int(cfg.get("sliding_window") or 513),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 262144)),
            rope_theta=float(rope_theta),
            layer_types=tuple(layer_types),
            rope_layers=rope_layers,
            mlp_only_layers=tuple(mlp_only),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
            pad_token_id=cfg.get("pad_token_id"),
        )
        if cfg.get("attention_bias"):
            raise ConfigError("attention_bias", "Flint has no attention biases")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError("hidden_act", f"Flint uses 'silu', got {cfg.get('hidden_act')!r}")
        return cls(**kwargs)

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> FlintConfig:
        cfg_path = Path(path) / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        try:
            data = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError("config.json", f"is not valid JSON: {exc}") from exc
        return cls.from_hf_dict(data)

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` that transformers' FlintConfig accepts."""
        assert self.rope_layers is not None
        out: dict[str, Any] = {
            "architectures": ["FlintForCausalLM"],
            "model_type": "flint",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "sliding_window": self.sliding_window,
            "decoder_sparse_step": 1,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_experts": self.num_experts,
            "norm_topk_prob": self.norm_topk_prob,
            "mlp_only_layers": list(self.mlp_only_layers),
            "layer_types": list(self.layer_types),
            "attention_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if len(self.eos_token_id) != 1 else self.eos_token_id[0],
            "pad_token_id": self.pad_token_id,
        }
        if self.rope_layers != tuple(t == SLIDING for t in self.layer_types):
            out["no_rope_layer_indices"] = [i for i, r in enumerate(self.rope_layers) if not r]
        return out

    # ------------------------------------------------------------------ GGUF metadata
    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> FlintConfig:
        """Build from GGUF key/values (`flint.*` as llama.cpp's converter writes them)."""
        arch = meta.get("general.architecture")
        if arch != GGUF_ARCH:
            raise ConfigError("general.architecture", f"expected {GGUF_ARCH!r}, got {arch!r}")
        p = GGUF_ARCH + "."

        def get(key: str, default: Any = _MISSING) -> Any:
            if p + key in meta:
                return meta[p + key]
            if default is _MISSING:
                raise ConfigError(p + key, "is missing from the GGUF metadata")
            return default

        n = int(get("block_count"))
        heads_raw = get("attention.head_count")
        if isinstance(heads_raw, Sequence):
            raise ConfigError(p + "attention.head_count", "per-layer head counts are not supported")
        heads = int(heads_raw)
        hidden = int(get("embedding_length"))
        key_len = int(get("attention.key_length", hidden // heads))
        val_len = int(get("attention.value_length", key_len))
        if val_len != key_len:
            raise ConfigError(p + "attention.value_length", f"{val_len} differs from key_length {key_len}")
        swp = get("attention.sliding_window_pattern", None)
        if swp is None:
            layer_types = default_layer_types(n)
        else:
            swp = list(swp)
            if len(swp) != n:
                raise ConfigError(p + "attention.sliding_window_pattern", f"has {len(swp)} entries for {n} layers")
            layer_types = tuple(SLIDING if bool(s) else FULL for s in swp)
        rp = get("attention.rope_pattern", None)
        rope_layers = None
        if rp is not None:
            rp = list(rp)
            if len(rp) != n:
                raise ConfigError(p + "attention.rope_pattern", f"has {len(rp)} entries for {n} layers")
            rope_layers = tuple(bool(r) for r in rp)
        n_dense = int(get("leading_dense_block_count", 0))
        expert_ff = int(get("expert_feed_forward_length", 0))
        shared_ff = get("expert_shared_feed_forward_length", None)
        if shared_ff is None:
            shared_ff = int(get("expert_shared_count", 0)) * expert_ff
        gating = get("expert_gating_func", None)
        if gating is not None and int(gating) != 2:
            raise ConfigError(p + "expert_gating_func", f"Flint routes with sigmoid (2), got {gating}")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        extra_eos = meta.get("tokenizer.ggml.eot_token_id")
        eos_ids: list[int] = [int(eos)] if eos is not None else []
        if extra_eos is not None and int(extra_eos) not in eos_ids:
            eos_ids.append(int(extra_eos))
        bos = meta.get("tokenizer.ggml.bos_token_id")
        pad = meta.get("tokenizer.ggml.padding_token_id")
        vocab = meta.get(p + "vocab_size")
        if vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise ConfigError(p + "vocab_size", "is missing and there is no tokenizer.ggml.tokens to count")
            vocab = len(tokens)
        return cls(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length", 0)),
            num_hidden_layers=n,
            num_attention_heads=heads,
            num_key_value_heads=int(get("attention.head_count_kv", heads)),
            head_dim=key_len,
            moe_intermediate_size=expert_ff,
            shared_expert_intermediate_size=int(shared_ff),
            num_experts=int(get("expert_count", 0)),
            num_experts_per_tok=int(get("expert_used_count", 0)),
            norm_topk_prob=bool(get("expert_weights_norm", True)),
            routed_scaling_factor=_f32_decimal(get("expert_weights_scale", 1.0)),
            rms_norm_eps=_f32_decimal(get("attention.layer_norm_rms_epsilon", 1e-6)),
            sliding_window=int(get("attention.sliding_window", 513)),
            max_position_embeddings=int(get("context_length", 262144)),
            rope_theta=_f32_decimal(get("rope.freq_base", 10000.0)),
            layer_types=layer_types,
            rope_layers=rope_layers,
            mlp_only_layers=tuple(range(n_dense)),
            bos_token_id=int(bos) if bos is not None else None,
            eos_token_id=tuple(eos_ids),
            pad_token_id=int(pad) if pad is not None else None,
        )

    def to_gguf_metadata(self) -> dict[str, Any]:
        """`flint.*` keys in llama.cpp's converter convention (plus vocab_size for exactness)."""
        dense = self.mlp_only_layers
        if dense != tuple(range(len(dense))):
            raise ConfigError("mlp_only_layers", "GGUF can only express dense layers as a leading prefix")
        assert self.rope_layers is not None
        p = GGUF_ARCH + "."
        meta: dict[str, Any] = {
            p + "vocab_size": self.vocab_size,
            p + "block_count": self.num_hidden_layers,
            p + "context_length": self.max_position_embeddings,
            p + "embedding_length": self.hidden_size,
            p + "feed_forward_length": self.intermediate_size,
            p + "attention.head_count": self.num_attention_heads,
            p + "attention.head_count_kv": self.num_key_value_heads,
            p + "attention.key_length": self.head_dim,
            p + "attention.value_length": self.head_dim,
            p + "attention.layer_norm_rms_epsilon": self.rms_norm_eps,
            p + "rope.freq_base": self.rope_theta,
            p + "expert_count": self.num_experts,
            p + "expert_used_count": self.num_experts_per_tok,
            p + "expert_feed_forward_length": self.moe_intermediate_size,
            p + "expert_shared_feed_forward_length": self.shared_expert_intermediate_size,
            p + "leading_dense_block_count": len(dense),
            p + "expert_weights_norm": self.norm_topk_prob,
            p + "expert_weights_scale": self.routed_scaling_factor,
            p + "expert_gating_func": 2,
            p + "attention.sliding_window": self.sliding_window,
            p + "attention.sliding_window_pattern": [t == SLIDING for t in self.layer_types],
            p + "attention.rope_pattern": list(self.rope_layers),
        }
        if self.moe_intermediate_size:
            meta[p + "expert_shared_count"] = max(1, self.shared_expert_intermediate_size // self.moe_intermediate_size)
        return meta

    def replace(self, **changes: Any) -> FlintConfig:
        if "num_hidden_layers" in changes and "layer_types" not in changes:
            changes["layer_types"] = default_layer_types(changes["num_hidden_layers"])
        if "layer_types" in changes and "rope_layers" not in changes:
            changes["rope_layers"] = None
        return dataclasses.replace(self, **changes)


class _Missing:
    pass


_MISSING = _Missing()


def _f32_decimal(x: Any) -> float:
    """GGUF stores floats as float32: recover the shortest decimal (1e-06, not 9.99999997e-07)."""
    return float(f"{float(x):.7g}")


def _req_int(cfg: Mapping[str, Any], key: str) -> int:
    if key not in cfg:
        raise ConfigError(key, "is missing")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    return value


def _preset_full() -> FlintConfig:
    return FlintConfig()


def _preset_tiny() -> FlintConfig:
    """A few-layer Flint for exactness tests: window 7 so sequences cross it."""
    return FlintConfig(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=3,
        sliding_window=7,
        max_position_embeddings=4096,
        layer_types=default_layer_types(6),
    )


def _preset_small() -> FlintConfig:
    """The embedded demo size: real window, fast on one CPU core."""
    return FlintConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=256,
        num_experts=16,
        num_experts_per_tok=4,
        sliding_window=513,
        max_position_embeddings=8192,
        layer_types=default_layer_types(8),
    )


def _preset_medium() -> FlintConfig:
    """Full widths, few layers: exercises real kernel shapes at a fraction of the memory."""
    return FlintConfig(num_hidden_layers=6, layer_types=default_layer_types(6))


PRESETS = {"full": _preset_full, "tiny": _preset_tiny, "small": _preset_small, "medium": _preset_medium}


def preset(name: str) -> FlintConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError("preset", f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None


def describe(cfg: FlintConfig) -> str:
    """One line of human-readable architecture summary."""
    return (
        f"{cfg.num_hidden_layers} layers ({len(cfg.full_layers)} full,"
        f" {len(cfg.sliding_layers)} sliding/{cfg.sliding_window}),"
        f" hidden {cfg.hidden_size}, {cfg.num_attention_heads}q/{cfg.num_key_value_heads}kv x {cfg.head_dim},"
        f" {cfg.num_experts} experts top-{cfg.num_experts_per_tok} of {cfg.moe_intermediate_size}"
        f" + shared {cfg.shared_expert_intermediate_size}, vocab {cfg.vocab_size},"
        f" {cfg.parameter_count() / 1e9:.3f}B params ({cfg.active_parameter_count() / 1e9:.2f}B active)"
    )
