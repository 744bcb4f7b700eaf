"""`random:<preset>[:nvfp4][:seed=N][:layers=N]` model specs: a Flint of a preset's shape with random weights built
straight on the device, no checkpoint file (like vLLM's dummy load format). For serving and load benchmarks of the
full-size model on a GPU without an 80 GB download; the output is noise.

    flint-serve --model random:full:nvfp4        # every linear NVFP4 (W4A16), as in the official NVFP4 file
    flint-serve --model random:small --device cpu
    flint-serve --model random:full:layers=8     # the first 8 layers only: every kernel of the full model's shapes

`layers=N` keeps the preset's first N layers (their attention and MLP kinds as in the preset): the same kernel
variants as the whole model (its kernel profile does not count layers) in a fraction of the memory, e.g. to record
the BF16 kernel manifest on a GPU too small for BF16's 74 GiB of weights and a KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .config import FlintConfig
    from .tokenizer import FlintTokenizer
    from .weights import FlintWeights

PREFIX = "random:"


@dataclass(frozen=True)
class RandomModelSpec:
    preset: str
    nvfp4: bool = False
    seed: int = 0
    layers: int | None = None  # the preset's first `layers` layers only


def is_random_spec(model: str | None) -> bool:
    return model is not None and model.startswith(PREFIX)


def parse_random_spec(model: str) -> RandomModelSpec:
    """Parse `random:<preset>[:nvfp4|:bf16][:seed=N][:layers=N]`; ValueError naming the bad part."""
    from .config import PRESETS

    parts = model[len(PREFIX) :].split(":")
    preset, options = parts[0], parts[1:]
    if preset not in PRESETS:
        raise ValueError(f"model {model!r}: unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    nvfp4, seed, layers = False, 0, None
    for opt in options:
        if opt in ("nvfp4", "bf16"):
            nvfp4 = opt == "nvfp4"
        elif opt.startswith("seed=") and opt[5:].isdigit():
            seed = int(opt[5:])
        elif opt.startswith("layers=") and opt[7:].isdigit():
            layers = int(opt[7:])
            total = PRESETS[preset]().num_hidden_layers
            if not 1 <= layers <= total:
                raise ValueError(f"model {model!r}: layers={layers} is outside 1..{total}, the preset's layers")
        else:
            raise ValueError(f"model {model!r}: unknown option {opt!r} (nvfp4, bf16, seed=N or layers=N)")
    return RandomModelSpec(preset, nvfp4, seed, layers)


def first_layers(config: FlintConfig, layers: int) -> FlintConfig:
    """`config` cut to its first `layers` layers, each keeping its attention and MLP kind."""
    return config.replace(
        num_hidden_layers=layers,
        layer_types=config.layer_types[:layers],
        rope_layers=None if config.rope_layers is None else config.rope_layers[:layers],
        mlp_only_layers=tuple(i for i in config.mlp_only_layers if i < layers),
    )


def preset_with_tokenizer(preset_name: str) -> tuple[FlintConfig, FlintTokenizer]:
    """A preset's config with the special-token ids of the project's default tokenizer for its vocabulary."""
    from .config import preset
    from .tokenizer import build_default_tokenizer

    config = preset(preset_name)
    tok = build_default_tokenizer(config.vocab_size)
    config = config.replace(
        bos_token_id=tok.bos_token_id, eos_token_id=tuple(tok.eos_token_ids), pad_token_id=tok.pad_token_id
    )
    return config, tok


def load_random_model(
    model: str, dtype: torch.dtype, device: torch.device
) -> tuple[FlintWeights, FlintTokenizer, dict[str, float]]:
    """(weights, tokenizer, generation defaults) for a `random:` spec."""
    from .checkpoint import FLINT_GENERATION_DEFAULTS
    from .weights import random_weights

    spec = parse_random_spec(model)
    config, tok = preset_with_tokenizer(spec.preset)
    if spec.layers is not None:
        config = first_layers(config, spec.layers)
    weights = random_weights(config, dtype, device, seed=spec.seed, nvfp4_linears=spec.nvfp4)
    return weights, tok, dict(FLINT_GENERATION_DEFAULTS)
