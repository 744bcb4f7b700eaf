"""Block bookkeeping for Flint's hybrid cache: full-attention blocks for the whole sequence, sliding blocks only
for the last `sliding_window` positions, and prefix caching across both.

A sequence's block i holds positions [i*bs, (i+1)*bs). Every completely computed block gets a content hash chained
from its predecessor; the hash indexes both pools, so a new request sharing a prefix can take the full-attention
blocks of the whole prefix and the sliding blocks of the window that ends it. Sliding blocks that fall out of the
window are released at once (they stay cached until evicted). A request's cache salt (vLLM's `cache_salt`) roots its
chain elsewhere, so only requests with the same salt share blocks.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from .block_pool import BlockPool
from .config import FlintConfig

NO_BLOCK = -1


def chain_root(salt: str | None) -> int:
    """Where a request's chain of block hashes starts: 0 unsalted, else a number read from the salt (a digest, not
    `hash()`, whose value for a string changes from process to process)."""
    if not salt:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little") | 1


def block_hashes(token_ids: Sequence[int], num_blocks: int, block_size: int, root: int = 0) -> list[int]:
    """The content hashes of the first `num_blocks` whole blocks, each chained from the one before (the first from
    `root`): the prefix cache's keys, and the Ray router's for its replica affinity."""
    out, parent = [], root
    for i in range(num_blocks):
        parent = hash((parent, *token_ids[i * block_size : (i + 1) * block_size]))
        out.append(parent)
    return out


_SERIALS = itertools.count(1)


@dataclass
class SeqBlocks:
    full: list[int] = field(default_factory=list)
    sliding: list[int] = field(default_factory=list)  # NO_BLOCK where the window has moved on
    hashes: list[int] = field(default_factory=list)  # content hash of each completely computed block
    root: int = 0  # the chain's start (`chain_root` of the request's cache salt)
    released: int = 0  # sliding entries below this index are NO_BLOCK (the window has passed them)
    # (serial, version) names the tables' contents: a new sequence gets a new serial, and every change to either
    # table bumps the version, so a consumer that copies tables (the decode graphs) can tell when to copy again.
    serial: int = field(default_factory=lambda: next(_SERIALS))
    version: int = 0


class KVCacheManager:
    def __init__(
        self,
        config: FlintConfig,
        num_full_blocks: int,
        num_sliding_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.block_size = block_size
        self.window = config.sliding_window
        self.has_full = bool(config.full_layers)
        self.has_sliding = bool(config.sliding_layers)
        self.full = BlockPool(max(num_full_blocks, 1), "full-attention pool")
        self.sliding = BlockPool(max(num_sliding_blocks, 1), "sliding-window pool")
        self.enable_prefix_caching = enable_prefix_caching
        self.seqs: dict[str, SeqBlocks] = {}
        self.prefix_queries = 0  # tokens looked up
        self.prefix_hits = 0  # tokens found

    # ------------------------------------------------------------------ hashing and lookup
    def _window_blocks(self, num_tokens: int, upto: int) -> range:
        """Logical blocks a query at position `num_tokens` .. `upto - 1` needs in the sliding pool."""
        start = max(0, num_tokens - (self.window - 1))
        return range(start // self.block_size, (upto - 1) // self.block_size + 1) if upto > start else range(0)

    def find_prefix(self, token_ids: list[int], root: int = 0) -> tuple[int, list[int]]:
        """Longest cached prefix, in whole blocks, that leaves at least one token to compute (under the chain that
        starts at `root`)."""
        if not self.enable_prefix_caching:
            return 0, []
        max_blocks = (len(token_ids) - 1) // self.block_size
        hashes = block_hashes(token_ids, max_blocks, self.block_size, root)
        n = 0
        if self.has_full:
            while n < max_blocks and self.full.is_cached(hashes[n]):
                n += 1
        else:
            n = max_blocks
        while n > 0 and self.has_sliding:
            needed = self._window_blocks(n * self.block_size, n * self.block_size)
            if all(self.sliding.is_cached(hashes[b]) for b in needed):
                break
            n -= 1
        return n * self.block_size, hashes[:n]

    # ------------------------------------------------------------------ allocation
    def _free_needed(self, seq: SeqBlocks, num_computed: int, num_new: int) -> tuple[int, int]:
        end = num_computed + num_new
        nblocks = -(-end // self.block_size)
        full_need = max(0, nblocks - len(seq.full)) if self.has_full else 0
        sliding_need = 0
        if self.has_sliding:
            for b in self._window_blocks(num_computed, end):
                if b >= len(seq.sliding) or seq.sliding[b] == NO_BLOCK:
                    sliding_need += 1
        return full_need, sliding_need

    def can_allocate(
        self, seq_id: str, num_computed: int, num_new: int, prefix_hashes: list[int] | None = None
    ) -> bool:
        seq = self.seqs.get(seq_id) or SeqBlocks()
        if prefix_hashes:
            seq = self._preview_prefix(prefix_hashes)
        full_need, sliding_need = self._free_needed(seq, num_computed, num_new)
        full_free, sliding_free = self.full.num_free, self.sliding.num_free
        if prefix_hashes:  # cached blocks with no owner are counted as free until taken
            full_free -= sum(1 for b in seq.full if self.full.ref[b] == 0)
            sliding_free -= sum(1 for b in seq.sliding if b != NO_BLOCK and self.sliding.ref[b] == 0)
        return full_need <= full_free and sliding_need <= sliding_free

    def _preview_prefix(self, hashes: list[int]) -> SeqBlocks:
        seq = SeqBlocks(hashes=list(hashes))
        if self.has_full:
            seq.full = [self.full.by_hash[h] for h in hashes]
        if self.has_sliding:
            n = len(hashes) * self.block_size
            needed = set(self._window_blocks(n, n))
            seq.sliding = [self.sliding.by_hash[h] if i in needed else NO_BLOCK for i, h in enumerate(hashes)]
        return seq

    def start(self, seq_id: str, prefix_hashes: list[int], root: int = 0) -> None:
        """Begin a sequence, taking the cached prefix blocks found by `find_prefix` (with the same `root`)."""
        seq = SeqBlocks(hashes=list(prefix_hashes), root=root)
        n = len(prefix_hashes) * self.block_size
        needed = set(self._window_blocks(n, n)) if self.has_sliding else set()
        for i, h in enumerate(prefix_hashes):
            if self.has_full:
                b = self.full.take_cached(h)
                assert b is not None
                seq.full.append(b)
            if self.has_sliding:
                if i in needed:
                    b = self.sliding.take_cached(h)
                    assert b is not None
                    seq.sliding.append(b)
                else:
                    seq.sliding.append(NO_BLOCK)
        self.seqs[seq_id] = seq

    def allocate(self, seq_id: str, num_computed: int, num_new: int) -> None:
        """Make sure blocks exist for positions [window start, num_computed + num_new)."""
        seq = self.seqs.setdefault(seq_id, SeqBlocks())
        full_need, sliding_need = self._free_needed(seq, num_computed, num_new)
        if full_need > self.full.num_free or sliding_need > self.sliding.num_free:
            raise RuntimeError("allocate() called without a successful can_allocate()")
        if full_need:
            seq.full.extend(self.full.allocate(full_need))
            seq.version += 1
        if self.has_sliding:
            for b in self._window_blocks(num_computed, num_computed + num_new):
                while len(seq.sliding) <= b:
                    seq.sliding.append(NO_BLOCK)
                if seq.sliding[b] == NO_BLOCK:
                    seq.sliding[b] = self.sliding.allocate(1)[0]
                    seq.version += 1

    def computed(self, seq_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """After a step: register newly completed blocks and release sliding blocks behind the window."""
        seq = self.seqs[seq_id]
        complete = num_computed // self.block_size
        if len(seq.hashes) < complete:
            parent = seq.hashes[-1] if seq.hashes else seq.root
            for i in range(len(seq.hashes), complete):
                parent = hash((parent, *token_ids[i * self.block_size : (i + 1) * self.block_size]))
                seq.hashes.append(parent)  # (as `block_hashes` chains them)
                if self.enable_prefix_caching:
                    if self.has_full:
                        self.full.register(seq.full[i], parent)
                    if self.has_sliding and i < len(seq.sliding) and seq.sliding[i] != NO_BLOCK:
                        self.sliding.register(seq.sliding[i], parent)
        if self.has_sliding:
            first_needed = max(0, num_computed - (self.window - 1)) // self.block_size
            upto = min(first_needed, len(seq.sliding))
            for b in range(seq.released, upto):  # only what the window passed since the last step
                if seq.sliding[b] != NO_BLOCK:
                    self.sliding.release(seq.sliding[b])
                    seq.sliding[b] = NO_BLOCK
                    seq.version += 1
            seq.released = max(seq.released, upto)

    def free(self, seq_id: str) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            return
        # Release the tail first so the head of a shared prefix stays cached longest.
        for b in reversed(seq.full):
            self.full.release(b)
        for b in reversed(seq.sliding):
            if b != NO_BLOCK:
                self.sliding.release(b)

    def tables(self, seq_id: str) -> tuple[list[int], list[int]]:
        seq = self.seqs[seq_id]
        return seq.full, seq.sliding

    def tables_version(self, seq_id: str) -> tuple[int, int]:
        """Changes whenever `tables(seq_id)` would return other contents (a new sequence, a block added or released)."""
        seq = self.seqs[seq_id]
        return seq.serial, seq.version

    # ------------------------------------------------------------------ accounting
    def usage(self, full_block_bytes: int, sliding_block_bytes: int) -> float:
        """Fraction of KV bytes held by live sequences (cached-but-free blocks count as free)."""
        total = (
            self.full.num_blocks * full_block_bytes * self.has_full
            + self.sliding.num_blocks * sliding_block_bytes * self.has_sliding
        )
        used = (
            self.full.num_used * full_block_bytes * self.has_full
            + self.sliding.num_used * sliding_block_bytes * self.has_sliding
        )
        return used / total if total else 0.0

    def all_free(self) -> bool:
        return self.full.num_free == self.full.num_blocks and self.sliding.num_free == self.sliding.num_blocks
