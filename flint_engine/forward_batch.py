"""The flat, unpadded batch one forward step runs on: tokens of many sequences and where their KV lives."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from flint_kernels.attention import AttnMeta


@dataclass
class ForwardBatch:
    """Sequence s owns rows [query_start[s], query_start[s+1]) of the flat token arrays; its context after this
    step is seq_lens[s] tokens, the new ones last. Slots say where each token's K/V are written in each pool."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    query_start: list[int]  # S + 1 host ints
    seq_lens: list[int]  # S host ints
    full_block_tables: torch.Tensor  # int32 [S, max_blocks]
    sliding_block_tables: torch.Tensor  # int32 [S, max_sliding_blocks]
    full_slots: torch.Tensor  # int64 [T]
    sliding_slots: torch.Tensor  # int64 [T]
    logits_indices: torch.Tensor  # int64 [N]: rows whose logits are wanted
    attn: AttnMeta = field(init=False)

    def __post_init__(self) -> None:
        self.attn = AttnMeta.build(self.query_start, self.seq_lens, self.input_ids.device)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def is_decode(self) -> bool:
        """Every sequence contributes exactly one token."""
        return self.num_tokens == self.num_seqs


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def fresh_sequences_batch(
    seqs: list[list[int]], block_size: int, device: torch.device | str = "cpu", all_logits: bool = True
) -> tuple[ForwardBatch, int]:
    """A batch that prefills whole sequences from position 0 into consecutive blocks of both pools.

    Returns the batch and the number of blocks each pool needs (the same for both pools here).
    """
    ids, pos, starts, slots, tables = [], [], [0], [], []
    next_block = 0
    max_blocks = max(blocks_needed(len(s), block_size) for s in seqs)
    for s in seqs:
        if not s:
            raise ValueError("empty sequence")
        nb = blocks_needed(len(s), block_size)
        first = next_block
        tables.append(list(range(first, first + nb)) + [-1] * (max_blocks - nb))
        ids.extend(s)
        pos.extend(range(len(s)))
        slots.extend(first * block_size + p for p in range(len(s)))
        starts.append(starts[-1] + len(s))
        next_block += nb
    dev = torch.device(device)
    table = torch.tensor(tables, dtype=torch.int32, device=dev)
    slot_t = torch.tensor(slots, dtype=torch.int64, device=dev)
    last = [i - 1 for i in starts[1:]]
    batch = ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
        positions=torch.tensor(pos, dtype=torch.int64, device=dev),
        query_start=starts,
        seq_lens=[len(s) for s in seqs],
        full_block_tables=table,
        sliding_block_tables=table,
        full_slots=slot_t,
        sliding_slots=slot_t,
        logits_indices=torch.arange(len(ids), device=dev) if all_logits else torch.tensor(last, device=dev),
    )
    return batch, next_block
