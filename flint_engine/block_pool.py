"""A pool of fixed-size KV blocks with reference counts and a content-hash index for prefix caching.

Free blocks sit in LRU order. A freed block that holds a full, hashed block of tokens keeps its hash, so a later
request with the same prefix can take it back; allocation evicts from the least recently freed end.
"""

from __future__ import annotations

from collections import OrderedDict


class NoFreeBlocks(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int, name: str = "pool") -> None:
        if num_blocks <= 0:
            raise ValueError(f"{name}: a block pool needs at least one block, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}
        # block id -> None, oldest first; every block with ref 0 is here
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise NoFreeBlocks(f"{self.name}: need {n} blocks, {len(self.free)} free")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:  # evict its cached content
                del self.by_hash[h]
                self.block_hash[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def take_cached(self, h: int) -> int | None:
        """Reuse the block holding content hash h (ref + 1), or None if it is not cached."""
        b = self.by_hash.get(h)
        if b is None:
            return None
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1
        return b

    def is_cached(self, h: int) -> bool:
        return h in self.by_hash

    def register(self, b: int, h: int) -> None:
        """Record that block b now holds the full block of tokens with hash h."""
        if self.block_hash[b] is not None:
            return
        if h in self.by_hash:
            return  # an identical block is already cached; keep the first
        self.block_hash[b] = h
        self.by_hash[h] = b

    def release(self, b: int) -> None:
        if self.ref[b] <= 0:
            raise RuntimeError(f"{self.name}: double free of block {b}")
        self.ref[b] -= 1
        if self.ref[b] == 0:
            if self.block_hash[b] is None:
                # Uncached blocks go first in line for reuse, cached ones last (LRU).
                self.free[b] = None
                self.free.move_to_end(b, last=False)
            else:
                self.free[b] = None

    def reset_prefix_cache(self) -> None:
        for b in range(self.num_blocks):
            h = self.block_hash[b]
            if h is not None and self.ref[b] == 0:
                del self.by_hash[h]
                self.block_hash[b] = None
