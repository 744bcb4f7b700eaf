"""Block bookkeeping over a long decode: the sliding window's blocks are released as it moves (scanning only what
it passed since the last step), and the tables' version names their contents."""

from __future__ import annotations

import itertools

from flint_engine.config import preset
from flint_engine.kv_cache_manager import NO_BLOCK, KVCacheManager
from flint_engine.request import TokenView


def _decode(kv: KVCacheManager, seq: str, prompt: int, steps: int) -> list[tuple[int, int]]:
    """Prefill `prompt` tokens, then decode `steps` tokens; the tables' version after each step."""
    tokens = list(range(prompt + steps))
    kv.allocate(seq, 0, prompt)
    kv.computed(seq, tokens, prompt)
    versions = [kv.tables_version(seq)]
    for n in range(prompt, prompt + steps):
        kv.allocate(seq, n, 1)
        kv.computed(seq, TokenView(tokens[:prompt], tokens[prompt : n + 1]), n + 1)
        versions.append(kv.tables_version(seq))
    return versions


def test_the_window_releases_every_block_it_passed() -> None:
    cfg = preset("tiny").replace(sliding_window=21)
    kv = KVCacheManager(cfg, num_full_blocks=64, num_sliding_blocks=16, block_size=4, enable_prefix_caching=False)
    versions = _decode(kv, "a", prompt=9, steps=150)
    full, sliding = kv.tables("a")
    n = 159
    assert len(full) == -(-n // 4)
    first_needed = (n - 20) // 4  # the last query sees positions n - 21 .. n - 1
    assert all(b == NO_BLOCK for b in sliding[:first_needed])
    assert all(b != NO_BLOCK for b in sliding[first_needed:])
    assert kv.sliding.num_used == len(sliding) - first_needed  # a 16-block pool lasted 40 blocks of decoding
    # The version moves when a block is added or released (every 4 tokens here), not on the other steps.
    changes = sum(1 for a, b in itertools.pairwise(versions) if a != b)
    assert 150 // 4 - 2 <= changes <= 150 // 2
    kv.free("a")
    assert kv.all_free()
    kv.allocate("a", 0, 3)  # the same id again is a new sequence: a new serial
    assert kv.tables_version("a")[0] != versions[-1][0]


def test_token_view_slices_like_the_concatenation() -> None:
    head, tail = list(range(10, 17)), list(range(50, 55))
    view, whole = TokenView(head, tail), head + tail
    assert len(view) == len(whole) and list(view) == whole
    for start in range(-13, 14):
        assert view[start:] == whole[start:]
        for stop in range(-13, 14):
            assert view[start:stop] == whole[start:stop]
    assert view[::2] == whole[::2]
    assert [view[i] for i in range(-12, 12)] == [whole[i] for i in range(-12, 12)]
    tail.append(99)  # a view follows the request's output as it grows
    assert view[-1] == 99 and len(view) == 13
