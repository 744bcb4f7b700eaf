"""KV cache storage: a paged pool for the full-attention layers and a paged pool for the sliding layers.

Both pools use the layout the attention kernels read (see `flint_kernels.attention`):
    full_k, full_v:       [num_full_layers,    num_full_blocks,    block_size, num_kv_heads, head_dim]
    sliding_k, sliding_v: [num_sliding_layers, num_sliding_blocks, block_size, num_kv_heads, head_dim]
A sequence has one block table per pool. The full pool keeps every position; the sliding pool only needs the
blocks that cover the last `sliding_window` positions, so blocks that leave the window can be freed (their table
entries become -1). Full layers store K without RoPE; sliding layers store K after k-norm and RoPE.
"""

from __future__ import annotations

import torch

from .config import FlintConfig


class KVCache:
    def __init__(
        self,
        config: FlintConfig,
        num_full_blocks: int,
        num_sliding_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
    ) -> None:
        if block_size <= 0 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        self.config = config
        self.block_size = block_size
        self.dtype = dtype
        self.num_full_blocks = num_full_blocks
        self.num_sliding_blocks = num_sliding_blocks
        hkv, d = config.num_key_value_heads, config.head_dim
        nf, ns = len(config.full_layers), len(config.sliding_layers)
        # Zeroed so that no kernel ever reads uninitialised NaNs from a slot it masks out.
        self.full_k = torch.zeros((nf, num_full_blocks, block_size, hkv, d), dtype=dtype, device=device)
        self.full_v = torch.zeros_like(self.full_k)
        self.sliding_k = torch.zeros((ns, num_sliding_blocks, block_size, hkv, d), dtype=dtype, device=device)
        self.sliding_v = torch.zeros_like(self.sliding_k)
        self._index = {}
        for j, i in enumerate(config.full_layers):
            self._index[i] = (False, j)
        for j, i in enumerate(config.sliding_layers):
            self._index[i] = (True, j)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(k_cache, v_cache, is_sliding) for model layer i."""
        sliding, j = self._index[i]
        if sliding:
            return self.sliding_k[j], self.sliding_v[j], True
        return self.full_k[j], self.full_v[j], False

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.full_k, self.full_v, self.sliding_k, self.sliding_v))

    @staticmethod
    def bytes_per_full_block(config: FlintConfig, block_size: int, dtype_bytes: int = 2) -> int:
        return config.kv_bytes_per_token(dtype_bytes) * block_size

    @staticmethod
    def bytes_per_sliding_block(config: FlintConfig, block_size: int, dtype_bytes: int = 2) -> int:
        return config.sliding_kv_bytes_per_slot(dtype_bytes) * block_size
