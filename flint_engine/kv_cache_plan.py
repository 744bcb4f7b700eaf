"""Size the two KV pools from a memory budget and report what they hold.

The sliding pool gets what the running sequences can ever need at once (each sequence's window plus one step's
chunk, with headroom for cached prefixes); everything else goes to the full-attention pool, which decides how
many tokens of context fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from flint_kernels.configs import DEQUANT_MIN_TOKENS

from .config import FlintConfig
from .kv_cache import KVCache


class KVCacheTooSmall(ValueError):
    pass


@dataclass(frozen=True)
class KVCachePlan:
    block_size: int
    num_full_blocks: int
    num_sliding_blocks: int
    full_block_bytes: int
    sliding_block_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.num_full_blocks * self.full_block_bytes + self.num_sliding_blocks * self.sliding_block_bytes

    @property
    def token_capacity(self) -> int:
        """Tokens of context the full-attention pool holds across all sequences."""
        return self.num_full_blocks * self.block_size

    def describe(self) -> str:
        return (
            f"KV cache: {self.total_bytes / 2**30:.2f} GiB, {self.num_full_blocks} full-attention blocks"
            f" ({self.token_capacity:,} tokens of context) + {self.num_sliding_blocks} sliding blocks,"
            f" block size {self.block_size}"
        )


# Activation bytes a step holds at its peak, per token (measured, with room).
ACTIVATION_BYTES_PER_TOKEN = 96 * 1024


def activation_reserve(
    config: FlintConfig,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    nvfp4_experts: bool = True,
    dequant_min_tokens: int = DEQUANT_MIN_TOKENS,
    graph_tokens: int = 0,
) -> int:
    """GPU bytes kept free for one step's activations and a full batch of FP32 logits (measured peak plus room).

    With NVFP4 experts, steps of `dequant_min_tokens` tokens or more (the GPU's MoE path limit) also need a BF16
    copy of one layer's routed experts (the fused MoE runs NVFP4 experts from such a copy on long prefills). Step
    graphs of up to `graph_tokens` tokens keep a step's activations of that size in their memory pool for good
    (H200, 4,096 tokens: 316 MiB measured), beside what an eager step needs."""
    per_token = ACTIVATION_BYTES_PER_TOKEN
    reserve = 2 * 2**30 + (max_num_batched_tokens + graph_tokens) * per_token + max_num_seqs * config.vocab_size * 8
    if nvfp4_experts and config.num_experts and max_num_batched_tokens >= dequant_min_tokens:
        reserve += 2 * 3 * config.num_experts * config.moe_intermediate_size * config.hidden_size
    return reserve


def gpu_kv_budget(
    config: FlintConfig,
    free_bytes: int,
    total_bytes: int,
    utilization: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    nvfp4_experts: bool = True,
    dequant_min_tokens: int = DEQUANT_MIN_TOKENS,
    graph_tokens: int = 0,
) -> int:
    """KV bytes to allocate once the weights are loaded: up to `utilization` of the whole GPU, minus activations."""
    usable = int(free_bytes - (1 - utilization) * total_bytes)
    reserve = activation_reserve(
        config, max_num_seqs, max_num_batched_tokens, nvfp4_experts, dequant_min_tokens, graph_tokens
    )
    return max(0, usable - reserve)


def sliding_blocks_needed(config: FlintConfig, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    if not config.sliding_layers:
        return 0
    per_seq = -(-(config.sliding_window - 1) // block_size) + 2
    chunk = -(-max_num_batched_tokens // block_size) + max_num_seqs
    need = max_num_seqs * per_seq + chunk
    return need + need // 4  # headroom so cached windows of finished prefixes survive a while


def plan_kv_cache(
    config: FlintConfig,
    budget_bytes: int,
    block_size: int = 16,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 2048,
    dtype_bytes: int = 2,
) -> KVCachePlan:
    full_b = KVCache.bytes_per_full_block(config, block_size, dtype_bytes)
    slide_b = KVCache.bytes_per_sliding_block(config, block_size, dtype_bytes)
    n_slide = sliding_blocks_needed(config, block_size, max_num_seqs, max_num_batched_tokens)
    rest = budget_bytes - n_slide * slide_b
    if config.full_layers:
        n_full = rest // full_b if rest > 0 else 0
        if n_full < 1:
            raise KVCacheTooSmall(
                f"a KV cache budget of {budget_bytes / 2**20:.1f} MiB cannot hold the sliding windows of"
                f" {max_num_seqs} sequences ({n_slide * slide_b / 2**20:.1f} MiB) plus any full-attention blocks;"
                " raise the budget or lower max_num_seqs"
            )
    else:
        n_full = 0
        n_slide = max(n_slide, budget_bytes // max(slide_b, 1))
    return KVCachePlan(block_size, int(n_full), int(n_slide), full_b, slide_b)
