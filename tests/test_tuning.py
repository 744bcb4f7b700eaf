"""Per-device tuning tables (`flint_kernels.tuning`): the shipped H200 table, how a device picks its table, the
FLINT_TUNING_FILE override, refusals of malformed tables, and `benchmarks/tune.py`'s writer through the loader.

A CUDA device is named here by patching `torch.cuda.get_device_name`: the config functions only read the name, so
`torch.device("cuda", 0)` stands for an H200 (or any GPU) on a CPU-only machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from flint_kernels import attention_triton as at
from flint_kernels import gemv_triton as gt
from flint_kernels import moe_grouped_tma_triton as mgt
from flint_kernels import moe_triton as mt
from flint_kernels import precompile, tuning
from flint_kernels import router_triton as rt
from flint_kernels.configs import (
    AttentionDecodeConfig,
    AttentionPrefillConfig,
    MoEConfig,
    MoEPaths,
    MoETmaConfig,
    TileConfig,
)
from flint_kernels.linear import linear_ref
from kernel_checks import rel_err

ROOT = Path(__file__).resolve().parents[1]
H200_TABLE = ROOT / "kernels" / "tuning" / "nvidia-h200.json"
RESULTS = ROOT / "benchmarks" / "results"
interpreter = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or the interpreter"
)


@pytest.fixture(autouse=True)
def fresh_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No override from the environment, and no table or device name cached across tests."""
    monkeypatch.delenv(tuning.ENV, raising=False)
    tuning.reload()
    yield
    tuning.reload()


@pytest.fixture
def gpu_named(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], torch.device]:
    """Makes cuda:0 report a device name; returns that device."""

    def name(device_name: str) -> torch.device:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: device_name)
        tuning.reload()
        return torch.device("cuda", 0)

    return name


def write(tmp_path: Path, table: object, name: str = "table.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(table) if not isinstance(table, str) else table)
    return path


# Every config function over shapes that cross each of its thresholds: (name, call with a device).
CONFIG_CALLS: list[tuple[str, Callable[[torch.device], object]]] = [
    *[(f"small_m m={m} nv={nv} k={k}", lambda d, m=m, nv=nv, k=k: gt.small_m_config(m, nv, k, 2048, d))
      for m in (1, 2, 8, 16, 17, 32, 33, 64) for nv in (False, True) for k in (1024, 2048, 3072, 4096)],
    *[(f"large_m nv={nv}", lambda d, nv=nv: gt.large_m_config(nv, d, 8192, 5120, 2048)) for nv in (False, True)],
    *[(f"paths nv={nv}", lambda d, nv=nv: mt.paths_config(nv, d)) for nv in (False, True)],
    *[(f"moe decode nv={nv} t={t}", lambda d, nv=nv, t=t: mt.decode_config(nv, t, d))
      for nv in (False, True) for t in (1, 2, 3, 4, 5, 8, 32, 64)],
    *[(f"moe grouped ppe={p}", lambda d, p=p: mt.grouped_config(p, False, d)) for p in (0.2, 16, 16.5, 48, 49, 192)],
    *[(f"moe grouped tma ppe={p}", lambda d, p=p: mgt.config(p, False, d)) for p in (3, 12, 13, 95, 96, 192)],
    *[(f"moe grouped tma nvfp4 ppe={p}", lambda d, p=p: mgt.config(p, True, d)) for p in (3, 71, 72, 95, 96, 144, 192)],
    *[(f"attn decode b={b} ctx={c} w={w}", lambda d, b=b, c=c, w=w: at.decode_config(c, w, b, d))
      for b in (1, 64) for c in (1024, 32768) for w in (None, 513)],
    *[(f"attn prefill w={w}", lambda d, w=w: at.prefill_config(8192, w, d)) for w in (None, 513)],
]  # fmt: skip


# ------------------------------------------------------------------------------------------------- the shipped table
def test_shipped_h200_table_parses_and_every_entry_is_a_whole_config() -> None:
    """Every op has entries; each names where its numbers came from and sets every field of its dataclass."""
    table = tuning.load(H200_TABLE)
    raw = json.loads(H200_TABLE.read_text())
    assert raw["device"] == "NVIDIA H200"
    assert set(table.ops) == set(tuning.OPS)
    for op, entries in table.ops.items():
        required = {f.name for f in dataclasses.fields(tuning.OPS[op].config) if f.default is dataclasses.MISSING}
        for entry in entries:
            # An H100 runs this table (`tuning.SIBLINGS`); entries measured there when no H200 was lent say so.
            assert re.match(r"\d{4}-\d{2}-\d{2}, NVIDIA H(200|100 80GB HBM3)", entry.source), (op, entry.source)
            assert "benchmarks/" in entry.source, (op, entry.source)
            assert required <= set(entry.config), (op, entry.config)
            tuning.OPS[op].config(**entry.config)  # constructs


def _probe_values(op: str, entries: tuple[tuple[tuple[str, str, object], ...], ...]) -> dict[str, list]:
    """Per shape key: the values at and just past every bound the entries test (and 1 where none tests the key)."""
    values: dict[str, set] = {key: set() for key in tuning.OPS[op].shape}
    for when in entries:
        for key, test, v in when:
            kind = tuning.OPS[op].shape[key]
            if kind is bool:
                values[key] |= {True, False}
            elif test == "eq":
                values[key].add(v)
            elif test == "min":
                values[key] |= {v, v - (1 if kind is int else 0.5)}
            elif test == "max":
                values[key] |= {v, v + (1 if kind is int else 0.5)}
            else:  # multiple
                values[key] |= {v, 2 * v, v + 1}
    unset = {key: [False] if kind is bool else [1] for key, kind in tuning.OPS[op].shape.items()}
    return {key: sorted(vals) or unset[key] for key, vals in values.items()}


def test_every_shipped_entry_is_the_first_match_for_some_shape() -> None:
    """No entry is dead: for each, some shape at or past the table's own bounds reaches it before any other entry
    (an entry shadowed by an earlier, wider one never applies, and its source would claim a config nobody runs)."""
    import itertools

    table = tuning.load(H200_TABLE)
    for op, entries in table.ops.items():
        values = _probe_values(op, tuple(e.when for e in entries))
        keys = list(values)
        reached = set()
        for combo in itertools.product(*(values[k] for k in keys)):
            shape = dict(zip(keys, combo))
            first = next((i for i, e in enumerate(entries) if e.matches(shape)), None)
            if first is not None:
                reached.add(first)
        dead = [dict((k, v) for k, _, v in entries[i].when) for i in range(len(entries)) if i not in reached]
        assert not dead, f"{op}: entries no shape reaches first: {dead}"


def test_h200_table_gives_the_documented_configs(gpu_named: Callable[[str], torch.device]) -> None:
    """The configs the kernels' docstrings and comments recorded on 2026-11-29, now read from the table."""
    h200 = gpu_named("NVIDIA H200")
    assert tuning.table(h200).path == H200_TABLE
    fma = dict(block_m=1, use_dot=False, num_warps=4, num_stages=1)
    assert gt.small_m_config(1, True, 4096, 2048, h200) == TileConfig(block_n=8, block_k=2048, **fma)
    assert gt.small_m_config(1, True, 1024, 2048, h200) == TileConfig(block_n=8, block_k=1024, **fma)
    assert gt.small_m_config(1, True, 3072, 2048, h200) == TileConfig(block_n=8, block_k=1024, **fma)
    # M = 1: the shapes re-measured by benchmarks/tune.py and then as a whole decode step (see the entries' source).
    # qkv, with the input add + RMSNorm as its prologue (forty-fifth session, BF16 b1 -1.7% on an H100)
    assert gt.small_m_config(1, False, 2048, 5120, h200) == TileConfig(
        block_n=4, block_k=2048, norm_prologue=True, **fma
    )
    assert not gt.small_m_config(1, True, 2048, 5120, h200).norm_prologue  # NVFP4 lost 12%
    # BF16 o projection and dense MLP: each program's K (or 2048 of it) in one step, before the PDL wait (2026-12-02).
    assert gt.small_m_config(1, False, 4096, 2048, h200) == TileConfig(block_n=4, block_k=4096, **fma)  # o
    assert gt.small_m_config(1, False, 2048, 12288, h200) == TileConfig(block_n=8, block_k=2048, **fma)
    assert gt.small_m_config(1, False, 6144, 2048, h200) == TileConfig(block_n=8, block_k=2048, **fma)
    assert gt.small_m_config(1, False, 3072, 2048, h200) == TileConfig(block_n=8, block_k=1024, **fma)
    assert gt.small_m_config(1, False, 2048, 150144, h200) == TileConfig(block_n=4, block_k=1024, **fma)  # lm_head
    assert gt.small_m_config(1, False, 1024, 2048, h200) == TileConfig(block_n=16, block_k=1024, **fma)  # shared down
    # The NVFP4 lm_head on the MMA linear at 1-8 rows (nineteenth session's whole-step A/B, 2026-12-02: b1 -0.6%,
    # b2 -1.8%), on its 16-byte-load kernel (twentieth session's: b8 -5.8% with the projections'); only the MMA flags
    # and the warps count there.
    # Every MMA entry reads ready scale bytes (thirty-fourth session's whole-step A/B: b32 -5.3%, b64 -4.4%) and,
    # since the forty-seventh, ready codes (its H200 A/B: b16 -5.1%, b32 -4.1%, b64 -1.8%).
    lm_mma = TileConfig(block_n=8, block_k=1024, **fma, mma=True, mma_vec=True, mma_ready=True, mma_ready_codes=True)
    assert gt.small_m_config(1, True, 2048, 150144, h200) == lm_mma
    for m in (2, 5, 8):
        cfg = gt.small_m_config(m, True, 2048, 150144, h200)
        assert cfg.mma and cfg.mma_vec
    # NVFP4 at M = 3-32 on the MMA linear (the same A/Bs: b4 -10.5%, b8 -11.5%, then -4% and -5.8%; 9-32 on its rows
    # kernel, twentieth session: b16 -5.1%, b32 -2.3%; at 33-64 for qkv, the shared gate_up and the lm_head in eight
    # groups, twenty-first session: b48 -2.4%), other shapes at 33-64 in 32-column tensor-core tiles (a 2026-11-30
    # sweep and whole-step A/B, a 2026-12-02 A/B; the rows kernel on every shape lost there, b64 +1.6%), BF16 64.
    for m in (3, 4, 5, 8, 9, 16, 17, 32, 33, 64):
        for k, n in ((2048, 5120), (2048, 2048), (2048, 150144)):
            cfg = gt.small_m_config(m, True, k, n, h200)
            assert cfg.mma and cfg.mma_vec and cfg.mma_ready and cfg.mma_ready_codes and cfg.num_warps == 4
            # 17-32 rows with 32 weight rows a warp (thirty-third session's A/B: b24 -0.8%, b32 -1.6%)
            assert cfg.mma_wide == (17 <= m <= 32), (m, k, n)
            # qkv at 9-16 rows in 4 K splits (forty-second session's A/B on an H100: b16 -1.0% over o's alone)
            assert cfg.mma_split_k == (4 if (n == 5120 and 9 <= m <= 16) else 0), (m, k, n)
        # The o projection (K 4096) at 9-32 rows in 8 K splits (the same session's: b16 -2.1%, b24 -1.6%, b32 -0.9%).
        assert gt.small_m_config(m, True, 4096, 2048, h200).mma_split_k == (8 if 9 <= m <= 32 else 0), m
    for m, block_m in ((5, 16), (8, 16), (17, 32), (32, 32), (33, 64), (64, 64)):
        if m > 32:
            assert gt.small_m_config(m, True, 4096, 2048, h200) == TileConfig(32, block_m, 128, True, 4, 3)  # o
            assert gt.small_m_config(m, True, 1024, 2048, h200) == TileConfig(32, block_m, 128, True, 4, 3)
        assert gt.small_m_config(m, False, 2048, 5120, h200) == TileConfig(64, block_m, 128, True, 4, 3)
    # NVFP4 at M = 2 on the FMA path in 2-row programs with whole-K steps, each weight decoded once for both rows
    # (whole-step A/Bs, 2026-12-02: b2 -19%; 4 columns a program, not 8, another 3%); the MMA linear lost there.
    assert gt.small_m_config(2, True, 2048, 5120, h200) == TileConfig(4, 2, 2048, False, 4, 1)
    assert gt.small_m_config(2, False, 2048, 5120, h200) == TileConfig(64, 16, 128, True, 4, 3)
    assert gt.large_m_config(True, h200) == TileConfig(128, 128, 64, True, 8, 3)
    fma_8x1024 = MoEConfig(1, 8, 1024, 8, 512, False, 4, 1)
    # BF16 3-8 tokens: 32 gate/up and 64 down columns on tensor cores (a 2026-11-30 sweep and whole-step A/B);
    # from 9 (shared expert apart) expert-major on tensor cores, up to 64 tokens (the same day's sweeps and A/Bs).
    dot_32 = MoEConfig(16, 32, 128, 64, 128, True, 4, 3)
    dot_expert = MoEConfig(16, 64, 128, 128, 128, True, 4, 3, expert_major=True)
    # BF16 at 1 token: the down adds the token's slots in one program of 2 columns (forty-third session's whole-step
    # A/B on an H100: b1 -2.3%), since the forty-eighth of 4 columns with the shared expert in the padding slot rows
    # (its A/B on an H100: b1 -1.2%).
    bf16_slots = dataclasses.replace(fma_8x1024, dn_block_n=4, dn_token_slots=True, dn_shared_slots=True)
    bf16_decode = [mt.decode_config(False, t, h200) for t in (1, 2, 3, 8, 9, 32, 64)]
    assert bf16_decode == [bf16_slots, fma_8x1024, dot_32, dot_32, dot_expert, dot_expert, dot_expert]
    # NVFP4 5-8 tokens (shared expert folded): gate_up in 16-column tiles, 4 warps (b8 -7.5%, b16 -10% in a
    # whole-step A/B; 2 warps lost, 2026-11-30); down in 32-column tiles since the FMA path reads int64 groups (b8
    # -12%, b16 -15%, 2026-12-02).
    fma_16x512 = MoEConfig(1, 16, 512, 32, 512, False, 4, 1)
    # Since the fiftieth session, with the shared expert beside the routed launches from 2 tokens, the gate_up in
    # 8-row programs (an H100's whole-step A/Bs: b3 -1.4%, b5 -0.8%, b7 -3.1%, b8 -2.6%).
    fma_8x512 = dataclasses.replace(fma_16x512, gu_block_i=8)
    assert [mt.decode_config(True, t, h200) for t in (5, 8)] == [fma_8x512, fma_8x512]
    # NVFP4 at 1 token: the down adds the token's slots in one program of 2 columns (forty-second session's
    # whole-step A/B on an H100: b1 -5.7%; at 2 tokens it lost 11%), the shared expert in the padding slot rows since
    # the forty-eighth (its A/B on an H100: b1 -1.8%).
    token_slots = dataclasses.replace(fma_8x1024, dn_block_n=2, dn_token_slots=True, dn_shared_slots=True)
    assert mt.decode_config(True, 1, h200) == token_slots
    # NVFP4 at 2 tokens: the 1 token's gate_up, the 32-column down tiles (b2 -8%); at 3-4 the tiles from 5 (b3 -8%,
    # b4 -11%; whole-step A/Bs, 2026-12-02, seventeenth session).
    assert mt.decode_config(True, 2, h200) == MoEConfig(1, 8, 1024, 32, 512, False, 4, 1)
    assert [mt.decode_config(True, t, h200) for t in (3, 4)] == [fma_8x512] * 2
    # NVFP4 from 9 tokens (shared expert apart from 9) the down on the MMA kernel, from 33 the gate_up too, loading
    # a K step ahead (nineteenth session's whole-step A/B, 2026-12-02: b16 -5.8%, b32 -8.6%, b64 -19.5%), all on the
    # 16-byte-load kernels (twentieth session's: b64 -8.1%); from 25 the gate_up in 8 warps (b32 -3.7%), asking L2
    # for its codes two K steps ahead (twenty-second session's: b32 -3.8%, b64 -3.5%); the down asking L2 for all of
    # its codes before the PDL wait (same session: b16 -1.1%, b64 -3.2%); at 17-24 the gate_up on the MMA kernel in
    # 4 warps with those L2 requests (twenty-third session's: b24 -4.6%; at b12 it lost 2.4%). Since the
    # thirty-third session both with two weight tiles a warp sharing the activations' loads (the down from 9 tokens,
    # the gate_up from 17: b24 -3.8%, b32 -4.5%, b64 -6.8%), and 25-32 tokens in 4 warps again (b32 -2.5%); the wide
    # MMA gate_up at 9-16 lost (b12 +2.3%).
    # Since the thirty-fourth, reading ready scale bytes (b32 -5.3%, b64 -4.4%).
    # Since the forty-seventh, ready codes too (b16 -5.1%, b32 -4.1%, b64 -1.8%).
    mma_down = dataclasses.replace(
        fma_16x512, mma_down=True, mma_vec=True, mma_down_l2=2, mma_down_wide=True, mma_ready=True,
        mma_ready_codes=True,
    )  # fmt: skip
    mma_both = dataclasses.replace(
        mma_down, expert_major=True, mma=True, mma_prefetch=True, mma_l2_ahead=2, mma_wide=True
    )  # fmt: skip
    # With the ready bytes the wide MMA gate_up won at 9-16 too (b12 -0.6%, b16 -1.9%). Since the thirty-fifth
    # session the shared expert runs inside those launches, h in the MMA's order (b16 -4.7%, b32 -3.3%, b64 -3.5%).
    # Since the thirty-sixth the shared expert's programs come first in those grids (b9 -2.5%, b32 -1.1%, b64 -1.8%).
    mma_both = dataclasses.replace(mma_both, mma_shared=True, mma_perm_h=True, mma_shared_first=True)
    assert [mt.decode_config(True, t, h200) for t in (8, 9, 16, 17, 24, 25, 32, 33, 64)] == [
        fma_8x512, mma_both, mma_both, mma_both, mma_both, mma_both, mma_both, mma_both, mma_both
    ]  # fmt: skip
    assert mt.grouped_config(16, False, h200) == MoEConfig(16, 32, 128, 64, 128, True, 4, 3)
    assert mt.grouped_config(30, False, h200) == MoEConfig(32, 64, 64, 128, 64, True, 4, 3)
    # 2048-token prefill chunks (48 pairs an expert): 64-row tiles, 8 warps (a 2026-12-01 sweep, 600 vs 624 us).
    assert mt.grouped_config(48, False, h200) == MoEConfig(64, 64, 64, 128, 64, True, 8, 3)
    assert mt.grouped_config(39.9, False, h200) == MoEConfig(32, 64, 64, 128, 64, True, 4, 3)
    # NVFP4 in registers: re-measured tiles (64 rows, 4 warps from 13 pairs per expert).
    assert mt.grouped_config(12, True, h200) == MoEConfig(32, 64, 64, 128, 64, True, 4, 3)
    assert mt.grouped_config(48, True, h200) == MoEConfig(64, 64, 64, 64, 64, True, 4, 3)
    assert mt.grouped_config(192, False, h200) == MoEConfig(128, 64, 64, 128, 64, True, 8, 3)
    # Prefill MoE paths (twenty-ninth session): the TMA-fed launches from 128 tokens (BF16) and for NVFP4's copies
    # from 2,048, torch's grouped GEMM from 6,144 (BF16). BF16's shared expert apart from 2 tokens, on a side stream
    # beside the routed launches (forty-ninth session: b8 -3.0%, b32 -2.4% on an H100).
    assert mt.paths_config(False, h200) == MoEPaths(decode_max_tokens=64, shared_fold_max_tokens=1,
                                                    grouped_gemm_min_tokens=6144, tma_min_tokens=128,
                                                    shared_beside=True)  # fmt: skip
    # NVFP4: the decode path up to 192 tokens, then every step on the twins that decode in registers (thirty-first
    # session), so no BF16 copies are made. Its shared expert apart and beside from 2 tokens too (fiftieth session,
    # on an H200: b2 -2.4%, b8 -4.7%); from 9 the MMA launches keep it inside their grids whatever the fold says.
    assert mt.paths_config(True, h200) == MoEPaths(decode_max_tokens=192, shared_fold_max_tokens=1,
                                                   dequant_min_tokens=2048, tma_min_tokens=2048,
                                                   tma_nvfp4_min_tokens=65, tma_nvfp4_max_tokens=0,
                                                   shared_beside=True)  # fmt: skip
    assert mt.copies_min_tokens(mt.paths_config(True, h200)) > 2**40
    # Their tiles: 64-row blocks with x's rows from the sorted copy up to 12 pairs an expert, gathered by pointer
    # above; 128-row blocks (8 warps, 256-column down tiles) from 96.
    small, large = mgt.config(12, False, h200), mgt.config(96, False, h200)
    assert small == MoETmaConfig(gather=False) and mgt.config(12.1, False, h200) == MoETmaConfig()
    assert mgt.config(95.9, False, h200) == MoETmaConfig()
    assert large == MoETmaConfig(128, 128, 64, 8, 4, True, 256, 64, 8, 3)
    # The twins: the packed decode on 64-row blocks of 64 columns, 3 stages, x gathered; from 96 pairs an expert
    # (4,096 tokens) 128-row blocks, the gate_up 128 deep in 2 stages, the down 128 columns in 8 warps (thirty-fifth
    # session: the routed MoE at 4,096 tokens 0.840 -> 0.743 ms a layer, the 8K prefill 136.1 -> 133.2 ms).
    twins = MoETmaConfig(64, 64, 64, 4, 3, True, 64, 64, 4, 3, packed_decode=True)
    assert mgt.config(3, True, h200) == mgt.config(72, True, h200) == mgt.config(95.9, True, h200) == twins
    big_twins = MoETmaConfig(128, 64, 128, 4, 2, True, 128, 64, 8, 3, packed_decode=True)
    assert mgt.config(96, True, h200) == mgt.config(143.9, True, h200) == big_twins
    # From 144 pairs an expert (6,144 tokens), 256-row blocks, the gate_up in 8 warps and 3 stages: each expert decoded
    # once for an 8K prompt's ~192 pairs (fifty-first session, on an H100: the gate_up at 8K 935.9 -> 738.9 us, the
    # prefill 133.7 -> 126.9 ms); the down 128 deep since the fifty-second (the prefill 127.3 -> 125.8 ms there).
    assert (
        mgt.config(144, True, h200)
        == mgt.config(192, True, h200)
        == dataclasses.replace(big_twins, block_m=256, gate_up_warps=8, gate_up_stages=3, down_block_k=128)
    )
    assert at.decode_config(32768, None, 1, h200) == AttentionDecodeConfig(128, 4, 2, 256, 64, 16384)
    # Below 12 sequences (forty-fourth session): 64-key tiles, 64 keys a split at least, merged by a launch of their
    # own; full layers so only to 2K context (NVFP4 b1 -4.3%, b2 -3.5%, BF16 b1 -3.2% at 1K on an H100).
    launch64 = dict(block_n=64, num_warps=4, min_keys_per_split=64, max_splits=64, combine_launch=True)
    assert at.decode_config(1024, 513, 1, h200) == AttentionDecodeConfig(num_stages=None, **launch64)
    assert at.decode_config(32768, 513, 11, h200) == AttentionDecodeConfig(num_stages=None, **launch64)
    assert at.decode_config(2048, None, 1, h200) == AttentionDecodeConfig(num_stages=2, **launch64)
    assert at.decode_config(4096, None, 11, h200) == AttentionDecodeConfig(128, 4, 2, 256, 64, 16384)
    # At 12-16 sequences (forty-fifth session): 128-key tiles, 256 keys a split at least, merged by a launch of their
    # own (NVFP4 b12 -2.4%, b16 -0.5% on an H100; at 32 sequences +1.9%).
    mid = dict(block_n=128, num_warps=4, min_keys_per_split=256, max_splits=64, combine_launch=True)
    assert at.decode_config(1024, 513, 12, h200) == AttentionDecodeConfig(num_stages=None, **mid)
    assert at.decode_config(32768, None, 16, h200) == AttentionDecodeConfig(num_stages=2, **mid)
    # From 17 sequences: one split in sliding layers, 512 keys a split at least in full ones (a 2026-11-30 sweep and
    # whole-step A/Bs, BF16 b32 -3.3%, b16 -1.9%; at 8 sequences BF16 was slower).
    assert at.decode_config(1024, 513, 17, h200) == AttentionDecodeConfig(128, 4, None, 1024, 64, 16384)
    assert at.decode_config(1024, None, 64, h200) == AttentionDecodeConfig(128, 4, 2, 512, 64, 16384)
    # Prefill (a 2026-12-01 sweep at 8K): query tiles last-first everywhere; 128 x 128 tiles in full layers at 8K.
    assert at.prefill_config(8192, 513, h200) == AttentionPrefillConfig(64, 64, 4, 2, longest_first=True)
    assert at.prefill_config(8192, None, h200) == AttentionPrefillConfig(
        128, 128, 8, 3, longest_first=True, cudnn_min_tokens=4096
    )
    assert at.prefill_config(2048, None, h200) == AttentionPrefillConfig(
        64, 64, 8, 3, longest_first=True, cudnn_min_tokens=4096
    )
    # Each of those came from an entry of the table, not from the code's defaults.
    assert tuning.lookup("gemv.small_m", h200, m=1, n=2048, k=4096, nvfp4=True).config["block_k"] == 2048
    assert (
        "kernels_attention.py --sweep"
        in tuning.lookup("attention.prefill", h200, tokens=1, sliding=True, elem_bytes=2).source
    )
    # The attention tiles were tuned on BF16 caches: an FP32 cache keeps the defaults (the sliding entry's default
    # pipeline depth needs 272 KB of shared memory in FP32, above the H200's 227 KB: seen on the GPU).
    assert at.decode_config(1024, 513, 1, h200, elem_bytes=4) == AttentionDecodeConfig()
    assert at.prefill_config(8192, 513, h200, elem_bytes=4) == AttentionPrefillConfig()


# Entries that a whole-step measurement moved away from the code's defaults on the H200.
RETUNED = ("small_m m=1 ", "attn decode b=1 ctx=1024 w=513", "attn decode b=1 ctx=32768 w=513",
           "attn decode b=1 ctx=1024 w=None",
           "attn decode b=64 ctx=1024 w=513", "attn decode b=64 ctx=32768 w=513",
           "moe decode nv=True t=32", "moe decode nv=True t=64", "moe decode nv=False t=3",
           "moe decode nv=False t=4", "moe decode nv=False t=5", "moe decode nv=False t=8",
           "moe decode nv=False t=6", "small_m m=2 nv=True", "small_m m=8 nv=True", "small_m m=16 nv=True",
           "small_m m=17 nv=True", "small_m m=32 nv=True", "small_m m=33 nv=True", "small_m m=64 nv=True",
           "moe decode nv=False t=32", "moe decode nv=False t=64",
           "paths nv=False", "moe decode nv=True t=5", "moe decode nv=True t=8", "attn decode b=64 ctx=1024 w=None",
           "attn decode b=64 ctx=32768 w=None", "attn prefill", "moe grouped ppe=48", "paths nv=True",
           "moe decode nv=True t=2", "moe decode nv=True t=3", "moe decode nv=True t=4",
           "moe grouped tma", "moe decode nv=True t=1", "moe decode nv=False t=1")  # fmt: skip


KEPT = [c for c in CONFIG_CALLS if not c[0].startswith(RETUNED)]


@pytest.mark.parametrize(("name", "call"), KEPT, ids=[n for n, _ in KEPT])
def test_h200_table_keeps_the_h200_behaviour(
    gpu_named: Callable[[str], torch.device], name: str, call: Callable[[torch.device], object]
) -> None:
    """The table holds the choices the code made before it existed (with it the H200 runs what it ran), except the
    M = 1 GEMV tiles, NVFP4 at M = 2-64, the sliding layers' decode splits, the NVFP4 MoE decode tiles from 17 tokens,
    the BF16 ones from 3, NVFP4's at 1-16 tokens, full layers' decode splits below 12 sequences to 2K context and
    from 12 sequences, and BF16's
    decode-path limit, the prefill attention tiles, BF16's grouped tiles at 40-48 pairs an expert, NVFP4's copies
    from 3072 tokens and the TMA-fed MoE launches' tiles (RETUNED; their H200 values are checked above)."""
    assert call(gpu_named("NVIDIA H200")) == call(torch.device("cpu"))


@pytest.mark.parametrize("tokens", [17, 32, 33, 64, 65, 512, 1024, 4096, 8192])
def test_h200_router_tiles_are_the_code_defaults(gpu_named: Callable[[str], torch.device], tokens: int) -> None:
    """The router's tiles (kernels_router.py on the H200, K split 4 ways for one token block after a whole-step
    A/B) are both the code's portable defaults and the H200 table's entries for Flint's 256 experts."""
    default = rt.tiles_config(tokens, 256, None)
    assert tuning.tuned("router.tiles", default, gpu_named("NVIDIA H200"), tokens=tokens, experts=256) == default
    assert default.split_k == (4 if tokens <= 64 else 1)


# ------------------------------------------------------------------------------------------------- picking a table
def test_device_keys_and_the_names_tried() -> None:
    assert tuning.slug("NVIDIA H200") == "nvidia-h200"
    assert tuning.slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"
    assert tuning.slug("NVIDIA GeForce RTX 5090 D") == "nvidia-geforce-rtx-5090-d"
    assert tuning.device_key(torch.device("cpu")) == "cpu" == tuning.device_key("cpu")
    assert tuning.table_names("nvidia-h200-nvl") == ["nvidia-h200-nvl", "nvidia-h200"]
    assert tuning.table_names("nvidia-b200") == ["nvidia-b200"]
    # a chip's sibling last, after its own names (a table of an H100's own would come first)
    assert tuning.table_names("nvidia-h100-80gb-hbm3") == [
        "nvidia-h100-80gb-hbm3", "nvidia-h100-80gb", "nvidia-h100", "nvidia-h200",
    ]  # fmt: skip
    assert tuning.table_names("cpu") == ["cpu"]


def test_a_variant_of_a_tuned_gpu_uses_its_table(gpu_named: Callable[[str], torch.device]) -> None:
    nvl = gpu_named("NVIDIA H200 NVL")
    assert tuning.device_key(nvl) == "nvidia-h200-nvl"
    assert tuning.table(nvl).path == H200_TABLE


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"])
def test_an_h100_uses_the_h200_table_and_manifest(
    gpu_named: Callable[[str], torch.device], gpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H100 (same chip as the H200, less memory) has no table of its own: it gets the H200's, entries and kernel
    manifest alike, instead of the code defaults (50-70% slower there at NVFP4 batch 32-64)."""
    monkeypatch.delenv(tuning.ENV, raising=False)
    monkeypatch.delenv(precompile.ENV, raising=False)
    dev = gpu_named(gpu)
    assert tuning.table(dev).path == H200_TABLE
    assert tuning.lookup("gemv.small_m", dev, m=1, n=150144, k=2048, nvfp4=True) is not None
    assert precompile.manifest_path(dev) == precompile.MANIFESTS / "nvidia-h200.json"


@pytest.mark.parametrize("gpu", ["NVIDIA B200", "NVIDIA A100-SXM4-80GB", "NVIDIA GH200 480GB"])
def test_an_unknown_device_gets_the_code_defaults(gpu_named: Callable[[str], torch.device], gpu: str) -> None:
    """No table for the GPU (nor the CPU): no entry is consulted and every config is the portable default."""
    dev = gpu_named(gpu)
    assert tuning.table(dev) is tuning.EMPTY and tuning.table("cpu") is tuning.EMPTY
    assert tuning.lookup("gemv.small_m", dev, m=1, n=2048, k=4096, nvfp4=True) is None
    assert tuning.lookup("attention.decode", dev, seqs=1, context=1024, sliding=False) is None
    for _, call in CONFIG_CALLS:
        assert call(dev) == call(torch.device("cpu"))
    assert at.decode_config(1024, None, 1, dev) == AttentionDecodeConfig()


# ------------------------------------------------------------------------------------------------- FLINT_TUNING_FILE
def test_tuning_file_overrides_every_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_named: Callable[[str], torch.device]
) -> None:
    """The file replaces the device's table (H200 and CPU alike); fields it leaves out keep the default; it is read
    once per process; an empty table gives the defaults back."""
    h200 = gpu_named("NVIDIA H200")
    table = {
        "gemv.small_m": [{"when": {"m": 1, "nvfp4": True}, "config": {"block_k": 256}, "source": "test"}],
        "moe.paths": [{"config": {"decode_max_tokens": 7}, "source": "test"}],
        "attention.decode": [
            {"when": {"seqs_min": 8}, "config": {"min_keys_per_split": 64, "max_splits": 8}, "source": "test"}
        ],
    }
    monkeypatch.setenv(tuning.ENV, str(write(tmp_path, table)))
    for dev in (h200, torch.device("cpu"), None):
        assert gt.small_m_config(1, True, 4096, 2048, dev) == TileConfig(8, 1, 256, False, 4, 1)
        assert gt.small_m_config(1, False, 4096, 2048, dev).block_k == 512  # no entry: the default
        assert mt.paths_config(True, dev) == MoEPaths(7, mt.SHARED_FOLD_MAX_TOKENS_NVFP4)
        assert mt.decode_config(True, 1, dev) == MoEConfig(1, 8, 1024, 8, 512, False, 4, 1)  # no entry
    cpu = torch.device("cpu")
    assert at.decode_num_splits(32768, None, 8, 4, cpu) == 8  # max_splits from the table (default 64 gives 16)
    assert at.decode_num_splits(32768, None, 1, 4, cpu) == 64  # seqs below 8: the defaults
    (tmp_path / "table.json").unlink()
    assert gt.small_m_config(1, True, 4096, 2048, cpu).block_k == 256  # cached: read once
    monkeypatch.setenv(tuning.ENV, str(write(tmp_path, {}, "empty.json")))
    assert tuning.lookup("gemv.small_m", h200, m=1, n=2048, k=4096, nvfp4=True) is None


def test_tuning_file_that_does_not_exist_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tuning.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(tuning.TuningError, match=r"missing\.json: no such tuning table"):
        gt.small_m_config(1, True, 4096)


@interpreter
def test_a_table_entry_reaches_the_kernel_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The linear kernel launches with the tile the table sets for the input's device, and the result is right."""
    table = {"gemv.small_m": [{"when": {"m": 1}, "config": {"block_n": 16, "block_k": 64}, "source": "test"}]}
    monkeypatch.setenv(tuning.ENV, str(write(tmp_path, table)))
    launches: list[dict] = []
    kernel = gt._linear_kernel

    class Spy:
        def __getitem__(self, grid: tuple) -> Callable[..., object]:
            def launch(*args: object, **kwargs: object) -> object:
                launches.append(kwargs)
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(gt, "_linear_kernel", Spy())
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device=dev).manual_seed(0)
    x, w = torch.randn(1, 320, generator=g, device=dev), torch.randn(72, 320, generator=g, device=dev)
    assert rel_err(gt.linear(x, w), linear_ref(x, w)) < 1e-5
    assert [(k["BLOCK_N"], k["BLOCK_K"]) for k in launches] == [(16, 64)]


# ------------------------------------------------------------------------------------------------- malformed tables
ENTRY = {"when": {"m": 1}, "config": {"block_k": 256}, "source": "test"}
MALFORMED = [
    ({"gemv.small_m": [{**ENTRY, "config": {"blok_k": 256}}]}, r"gemv.small_m\[0\]: unknown field 'blok_k'"),
    ({"gemv.smal_m": [ENTRY]}, r"unknown op 'gemv.smal_m'"),
    ({"gemv.small_m": [ENTRY, {**ENTRY, "when": {"mm": 1}}]}, r"gemv.small_m\[1\]: unknown condition 'mm'"),
    ({"gemv.small_m": [{**ENTRY, "when": {"m_mx": 1}}]}, r"unknown condition 'm_mx'"),
    ({"gemv.small_m": [{**ENTRY, "when": {"nvfp4": 1}}]}, r"condition 'nvfp4': 1 does not fit nvfp4 \(bool\)"),
    ({"gemv.small_m": [{**ENTRY, "when": {"k_multiple": 0}}]}, r"condition 'k_multiple'"),
    ({"gemv.small_m": [{**ENTRY, "config": {"block_k": "256"}}]}, r"field 'block_k': '256' is not int"),
    ({"gemv.small_m": [{**ENTRY, "config": {"use_dot": 1}}]}, r"field 'use_dot': 1 is not bool"),
    ({"gemv.small_m": [{**ENTRY, "config": {"block_k": 1000}}]}, r"field 'block_k': 1000 is not a power of two"),
    ({"moe.paths": [{**ENTRY, "when": {}, "config": {"decode_max_tokens": -1}}]}, r"-1 is negative"),
    ({"attention.decode": [{**ENTRY, "when": {}, "config": {"num_stages": 2.5}}]}, r"2.5 is not int or null"),
    ({"gemv.small_m": [{"when": {"m": 1}, "config": {"block_k": 256}}]}, r"gemv.small_m\[0\]: 'source'"),
    ({"gemv.small_m": [{**ENTRY, "why": "typo"}]}, r"unknown key\(s\) \['why'\]"),
    ({"gemv.small_m": [{**ENTRY, "config": {}}]}, r"'config' must be an object setting at least one field"),
    ({"gemv.small_m": ENTRY}, r"gemv.small_m must be a list"),
    ([ENTRY], r"a table is a JSON object"),
    ('{"gemv.small_m": [{"when": {"m": 1, "m": 2}, "config": {"block_k": 256}, "source": "x"}]}', r"duplicate key 'm'"),
    ('{"gemv.small_m": [', r"not a valid JSON table"),
]  # fmt: skip


@pytest.mark.parametrize(("table", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_a_malformed_table_is_refused_naming_file_and_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: object, message: str
) -> None:
    path = write(tmp_path, table, "bad-table.json")
    with pytest.raises(tuning.TuningError, match=message) as err:
        tuning.load(path)
    assert str(err.value).startswith(str(path))
    monkeypatch.setenv(tuning.ENV, str(path))
    with pytest.raises(tuning.TuningError, match=message):  # at the first config lookup, not silently skipped
        gt.small_m_config(1, True, 4096)


def test_results_are_remembered_per_shape_and_the_memory_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {"attention.decode": [{"when": {"context_min": 4096}, "config": {"block_n": 64}, "source": "test"}]}
    monkeypatch.setenv(tuning.ENV, str(write(tmp_path, table)))
    cpu = torch.device("cpu")
    first = at.decode_config(8192, None, 1, cpu)
    assert first.block_n == 64 and at.decode_config(8192, None, 1, cpu) is first
    assert at.decode_config(1024, None, 1, cpu) == AttentionDecodeConfig()
    memo = tuning.table(cpu).memo
    for context in range(2 * tuning.MEMO_LIMIT):  # a decode context that grows every step
        assert at.decode_config(context, None, 1, cpu).block_n == (64 if context >= 4096 else 128)
    assert 0 < len(memo) <= tuning.MEMO_LIMIT


def test_conditions_bounds_multiples_and_order(tmp_path: Path) -> None:
    """Inclusive bounds, divisibility (never for 0), and the first matching entry wins."""
    table = {
        "gemv.small_m": [
            {"when": {"m_min": 2, "m_max": 4, "k_multiple": 1024}, "config": {"block_k": 512}, "source": "a"},
            {"when": {"m_max": 4}, "config": {"block_k": 256}, "source": "b"},
            {"config": {"block_k": 64}, "source": "c"},
        ]
    }
    ops = tuning.load(write(tmp_path, table)).ops["gemv.small_m"]

    def first(m: int, k: int) -> str:
        return next(e.source for e in ops if e.matches({"m": m, "n": 1, "k": k, "nvfp4": False}))

    assert [first(2, 2048), first(4, 1024), first(4, 1536), first(2, 0), first(5, 2048), first(1, 1024)] == [
        "a", "a", "b", "b", "c", "b"
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------- benchmarks/tune.py
@pytest.fixture
def tune(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    """benchmarks/tune.py as a module."""
    return benchmark_script("tune")


SWEEPS = RESULTS / "tuning_nvidia-h200_sweeps.json"  # the raw times of benchmarks/tune.py's first H200 run
TUNED = RESULTS / "tuning_nvidia-h200.json"  # the table that run wrote (not installed)


def test_tune_sets_the_nvfp4_copy_threshold_from_a_sweep_that_timed_both(tune: ModuleType) -> None:
    """The H200 sweep of 2048-8192 tokens (kernels_moe_prefill_h200.json) timed NVFP4 experts in registers and from
    BF16 copies: the copies lose at 2048 and win from 4096, which becomes `dequant_min_tokens`; a sweep without copy
    candidates (the first tune run) leaves the field to its default."""
    rows = json.loads((RESULTS / "kernels_moe_prefill_h200.json").read_text())["moe"]
    paths = {e["when"]["nvfp4"]: e for e in tune.moe_entries(rows, "src")["moe.paths"]}
    assert paths[True]["config"]["dequant_min_tokens"] == 4096
    assert "copies vs registers: T=2048" in paths[True]["source"]
    assert "dequant_min_tokens" not in paths[False]["config"]  # BF16 has nothing to copy
    first_run = json.loads(SWEEPS.read_text())["moe"]["rows"]
    assert all("dequant_min_tokens" not in e["config"] for e in tune.moe_entries(first_run, "src")["moe.paths"])
    # Copies that win only at some T above a loss do not set a threshold below that loss.
    t2048, t4096, t8192 = (next(r for r in rows if r["fmt"] == "nvfp4" and r["T"] == t) for t in (2048, 4096, 8192))
    losing_last = [
        t2048,
        t4096,
        {**t8192, "sweep": {**t8192["sweep"], "grp dq m128 k64 w8": 9e9, "grp dq m64 k64 w8": 9e9}},
    ]
    never = {e["when"]["nvfp4"]: e for e in tune.moe_entries(losing_last, "src")["moe.paths"]}[True]
    assert never["config"]["dequant_min_tokens"] == 2**31 - 1


def test_tune_keeps_the_paths_fields_it_does_not_measure(tune: ModuleType) -> None:
    """A MoE sweep measures the decode limit (and NVFP4's copy threshold where it timed copies); the table's other
    `moe.paths` fields, chosen on whole steps (the shared expert's side stream, the prefill paths' thresholds), are
    written back as they were, and the entry's source says which."""
    rows = json.loads((RESULTS / "kernels_moe_prefill_h200.json").read_text())["moe"]
    kept = {
        "bf16": {"decode_max_tokens": 99, "shared_beside": True, "grouped_gemm_min_tokens": 6144},
        "nvfp4": {"decode_max_tokens": 99, "dequant_min_tokens": 7, "tma_nvfp4_min_tokens": 65},
    }
    paths = {e["when"]["nvfp4"]: e for e in tune.moe_entries(rows, "src", kept_paths=kept)["moe.paths"]}
    measured = {e["when"]["nvfp4"]: e for e in tune.moe_entries(rows, "src")["moe.paths"]}
    bf16, nvfp4 = paths[False]["config"], paths[True]["config"]
    assert bf16["decode_max_tokens"] == measured[False]["config"]["decode_max_tokens"] != 99
    assert bf16["shared_beside"] is True and bf16["grouped_gemm_min_tokens"] == 6144
    assert nvfp4["dequant_min_tokens"] == 4096 and nvfp4["tma_nvfp4_min_tokens"] == 65  # the sweep timed copies
    assert "grouped_gemm_min_tokens, shared_beside kept as they were" in paths[False]["source"]
    assert "tma_nvfp4_min_tokens kept as it was" in paths[True]["source"]


def _as_swept_2026_11_29(shipped: MoEConfig, nvfp4: bool, tokens: int) -> MoEConfig:
    """The shipped MoE decode tiles as the recorded 2026-11-29 sweeps chose them: the BF16 tiles from 3 tokens have
    since moved to 32 / 64 columns after a 2026-11-30 sweep with more candidates (moe_decode_bf16_h200.json), which
    those recorded rows do not hold, and from 9 tokens (shared expert apart) to expert-major tiles of 64 / 128
    columns in K steps of 128 (moe_decode_expert_major_h200.json, moe_decode_expert_major_tiles_h200.json). NVFP4
    at 5-16 tokens moved from 32- to 16-column tiles after a whole-step A/B (decode_h200_nvfp4_i16_ab.json), and at
    2-4 tokens from 8 x 1024 / 8 x 512 to 32-column down tiles (with the 5-16 tokens' gate_up from 3) after the
    seventeenth session's (decode_h200_nvfp4_moe_1_4_ab.json, decode_h200_nvfp4_moe2_dn32_ab.json). NVFP4 at 1
    token adds a token's slots in one program of 2 down columns since the forty-second session's
    (decode_h100_nvfp4_token_slots_ab_s42.json), BF16 since the forty-third's
    (decode_h100_bf16_token_slots_ab_s43.json), both with the shared expert in the padding slot rows since the
    forty-eighth's (decode_h100_shared_slots_{nvfp4,bf16}_ab_s48.json)."""
    if tokens == 1:
        return dataclasses.replace(shipped, dn_block_n=8, dn_token_slots=False, dn_shared_slots=False)
    if nvfp4 and 2 <= tokens <= 4:
        return dataclasses.replace(shipped, gu_block_i=8, gu_block_k=1024, dn_block_n=8)
    if nvfp4 and 5 <= tokens <= 16:
        return dataclasses.replace(shipped, gu_block_i=32, dn_block_n=32)
    if not nvfp4 and tokens >= 3:
        return dataclasses.replace(
            shipped, gu_block_i=16, gu_block_k=128, dn_block_n=32, dn_block_k=128, expert_major=False
        )
    return shipped


def test_tune_rewrites_from_its_h200_sweeps_the_table_it_wrote_there(
    tune: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_named: Callable[[str], torch.device]
) -> None:
    """The H200 run's real sweep rows, replayed through the writer as the two runs went (gemv + attention, then moe
    into the same file), give the file it wrote byte for byte; the loader reads it, and the config functions then
    return what the measurements favoured."""
    sweeps = json.loads(SWEEPS.read_text())
    device, where = sweeps["device"], str(SWEEPS.relative_to(ROOT))
    path = tmp_path / "tuning_nvidia-h200.json"
    ga, moe = sweeps["gemv"], sweeps["moe"]
    assert ga["command"] == sweeps["attention"]["command"]
    first = tune.make_table(device, tune.source_of(device, ga, where), ga["rows"], (), sweeps["attention"]["rows"])
    tune.write_table(first, path)
    fold = {"bf16": 8, "nvfp4": 16}  # the shipped table's, in effect during the run
    second = tune.make_table(
        device, tune.source_of(device, moe, where), moe=moe["rows"], fold_max_tokens=fold, moe_shared=moe["shared_rows"]
    )
    written = tune.write_table(second, path)
    assert path.read_text() == TUNED.read_text()
    # tune.py does not sweep the large-M GEMM or the router's tiles (benchmarks/kernels_router.py times those), nor
    # which weights the decode graphs ask L2 for ahead (whole-step A/Bs of benchmarks/decode.py chose those).
    # Nor the TMA-fed MoE launches' tiles (benchmarks/moe_grouped_tma.py), nor how the small-batch router ends.
    untuned = {"gemv.large_m", "router.small", "router.tiles", "weights_ahead", "moe.grouped_tma"}
    assert tuning.load(path).ops.keys() == written.keys() - {"device"} == set(tuning.OPS) - untuned

    monkeypatch.setenv(tuning.ENV, str(path))
    dev = gpu_named("NVIDIA H200")
    # GEMV at M = 1: BF16 qkv and lm_head in 4 x 1024 tiles, other K divisible by 1024 in 8 x 1024; NVFP4 K steps of
    # 2048 where K divides (the geometric mean), the shared down projection (K 1024) steps of 1024.
    assert gt.small_m_config(1, False, 2048, 5120, dev) == TileConfig(4, 1, 1024, False, 4, 1)
    assert gt.small_m_config(1, False, 4096, 2048, dev) == TileConfig(8, 1, 1024, False, 4, 1)
    assert gt.small_m_config(1, True, 4096, 2048, dev).block_k == 2048
    assert gt.small_m_config(1, True, 1024, 2048, dev) == TileConfig(8, 1, 1024, False, 4, 1)
    assert gt.small_m_config(20, True, 2048, 12288, dev) == TileConfig(64, 32, 128, True, 4, 3)  # BLOCK_M follows M
    # MoE: the path limits (BF16's decode limit was 32 then) and the BF16 decode tiles agree with the shipped table.
    assert mt.paths_config(False, dev) == MoEPaths(32, 8) and mt.paths_config(True, dev) == MoEPaths(64, 16)
    shipped = tuning.load(H200_TABLE).ops["moe.decode"]
    for t in range(1, 33):
        hand = next(e for e in shipped if e.matches({"tokens": t, "nvfp4": False}))
        assert mt.decode_config(False, t, dev) == _as_swept_2026_11_29(MoEConfig(**hand.config), False, t), t
    assert mt.decode_config(True, 4, dev) == MoEConfig(1, 16, 512, 16, 512, False, 4, 1)
    assert mt.grouped_config(192, False, dev) == MoEConfig(128, 64, 64, 128, 64, True, 8, 3)
    # Attention: full decode layers as shipped; sliding decode splits from 128 keys; sliding prefill 2 stages.
    assert at.decode_config(32768, None, 1, dev) == AttentionDecodeConfig(128, 4, 2, 256, 64, 16384)
    assert at.decode_config(4096, 513, 1, dev) == AttentionDecodeConfig(128, 4, None, 128, 64, 16384)
    assert at.prefill_config(8192, 513, dev) == AttentionPrefillConfig(64, 64, 4, 2)


def test_tune_derives_the_shipped_choices_from_the_measurements_behind_them(
    tune: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_named: Callable[[str], torch.device]
) -> None:
    """From the recorded 2026-11-29 sweeps that chose the hand-made H200 table (GEMV at M = 1, MoE with the shared
    expert folded in), the writer picks what was picked by hand: NVFP4 M = 1 K steps and MoE decode tiles."""
    gemv_rows = json.loads((RESULTS / "kernels_gemv_m1_sweep_h200.json").read_text())["kernels_e9043bc"]["gemv"]
    shared_rows = json.loads((RESULTS / "kernels_moe_shared_h200.json").read_text())["moe_shared_us"]
    routed = json.loads(SWEEPS.read_text())["moe"]["rows"]  # for the decode/grouped limits
    table = tune.make_table(
        "NVIDIA H200", "src", gemv_rows, routed, fold_max_tokens={"bf16": 8, "nvfp4": 16}, moe_shared=shared_rows
    )
    monkeypatch.setenv(tuning.ENV, str(write(tmp_path, table)))
    dev = gpu_named("NVIDIA H200")
    shipped = tuning.load(H200_TABLE).ops
    for k, n in ((2048, 5120), (4096, 2048), (6144, 2048), (1024, 2048)):
        hand = next(e for e in shipped["gemv.small_m"] if e.matches({"m": 1, "n": n, "k": k, "nvfp4": True}))
        assert gt.small_m_config(1, True, k, n, dev) == TileConfig(**hand.config), (k, n)
    for nv in (False, True):
        for t in range(1, 9):
            hand = next(e for e in shipped["moe.decode"] if e.matches({"tokens": t, "nvfp4": nv}))
            assert mt.decode_config(nv, t, dev) == _as_swept_2026_11_29(MoEConfig(**hand.config), nv, t), (nv, t)
    assert "folded fma i8 k1024 / n8 k512, fastest at T=1 22.5 us, T=2 38.5 us" in table["moe.decode"][0]["source"]


def _attention_rows() -> list[dict]:
    return json.loads(SWEEPS.read_text())["attention"]["rows"]


def test_tune_keeps_the_ops_a_run_did_not_measure(tune: ModuleType, tmp_path: Path) -> None:
    """A run of one family replaces that family's ops in the file and leaves the others' entries as they were."""
    path = tmp_path / "nvidia-h200.json"
    path.write_text(H200_TABLE.read_text())
    table = tune.make_table("NVIDIA H200", "2026-12-01, NVIDIA H200, tune", attention=_attention_rows())
    written = tune.write_table(table, path)
    before = json.loads(H200_TABLE.read_text())
    assert written["gemv.small_m"] == before["gemv.small_m"] and written["moe.paths"] == before["moe.paths"]
    assert written["attention.prefill"] == table["attention.prefill"] != before["attention.prefill"]
    assert list(written) == ["device", *tuning.OPS]
    assert set(tuning.load(path).ops) == set(tuning.OPS)


def test_tune_refuses_a_table_the_kernels_would_refuse(tune: ModuleType) -> None:
    rows = [r for r in _attention_rows() if r["kind"] == "prefill"]
    rows[0]["config"] = {**rows[0]["config"], "block_n": 48}
    rows[0]["ms"] = 1e-6  # fastest, so it is chosen
    with pytest.raises(tuning.TuningError, match="48 is not a power of two"):
        tune.make_table("NVIDIA H200", "src", attention=rows)


# ------------------------------------------------------------------------------------- benchmarks/tuning_variant.py
@pytest.fixture
def tuning_variant(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    """benchmarks/tuning_variant.py as a module."""
    return benchmark_script("tuning_variant")


def test_tuning_variant_sets_fields_of_the_matching_entries(
    tuning_variant: ModuleType, tmp_path: Path, gpu_named: Callable[[str], torch.device]
) -> None:
    """The A/B helper changes only the named entry's fields; the result loads and the config function sees it."""
    out = tmp_path / "variant.json"
    argv = ["--op", "moe.decode", "--when", '{"nvfp4": false}', "--set", "slots_in_down=true", "gu_block_k=64"]
    assert tuning_variant.main([*argv, "--out", str(out)]) == 0
    shipped, variant = json.loads(H200_TABLE.read_text()), json.loads(out.read_text())
    changed = [i for i, (a, b) in enumerate(zip(shipped["moe.decode"], variant["moe.decode"])) if a != b]
    assert len(changed) == 1 and variant["moe.decode"][changed[0]]["when"] == {"nvfp4": False}
    assert {k: v for k, v in variant.items() if k != "moe.decode"} == {
        k: v for k, v in shipped.items() if k != "moe.decode"
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tuning.ENV, str(out))
        cfg = mt.decode_config(False, 32, gpu_named("NVIDIA H200"))
    assert cfg.slots_in_down and cfg.gu_block_k == 64 and cfg.expert_major


def test_tuning_variant_sets_a_field_of_every_entry(
    tuning_variant: ModuleType, tmp_path: Path, gpu_named: Callable[[str], torch.device]
) -> None:
    """`--when all`: every entry of the op (here the decode attention's L2 prefetch), the other ops untouched."""
    out = tmp_path / "variant.json"
    argv = ["--op", "attention.decode", "--when", "all", "--set", "prefetch=1", "--out", str(out)]
    assert tuning_variant.main(argv) == 0
    shipped, variant = json.loads(H200_TABLE.read_text()), json.loads(out.read_text())
    assert len(variant["attention.decode"]) == len(shipped["attention.decode"]) > 1
    assert all(e["config"]["prefetch"] == 1 for e in variant["attention.decode"])
    assert {k: v for k, v in variant.items() if k != "attention.decode"} == {
        k: v for k, v in shipped.items() if k != "attention.decode"
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tuning.ENV, str(out))
        h200 = gpu_named("NVIDIA H200")
        assert at.decode_config(1024, 513, 1, h200).prefetch == at.decode_config(32768, None, 32, h200).prefetch == 1


def test_tuning_variant_adds_a_changed_copy_before_the_matching_entry(
    tuning_variant: ModuleType, tmp_path: Path, gpu_named: Callable[[str], torch.device]
) -> None:
    """`--add`: the matching entry stays, a copy with the new conditions and fields precedes it and wins its shapes."""
    out = tmp_path / "variant.json"
    when = {"m_min": 17, "m_max": 32, "nvfp4": True}
    add = {"m_min": 17, "m_max": 24, "nvfp4": True}
    argv = ["--op", "gemv.small_m", "--when", json.dumps(when), "--add", json.dumps(add), "--set", "block_n=64"]
    assert tuning_variant.main([*argv, "--out", str(out)]) == 0
    shipped, variant = json.loads(H200_TABLE.read_text())["gemv.small_m"], json.loads(out.read_text())["gemv.small_m"]
    at = next(i for i, e in enumerate(shipped) if e["when"] == when)
    assert variant[:at] + variant[at + 1 :] == shipped
    assert variant[at]["when"] == add and variant[at]["config"] == {**shipped[at]["config"], "block_n": 64}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tuning.ENV, str(out))
        h200 = gpu_named("NVIDIA H200")
        assert gt.small_m_config(20, True, 2048, 5120, h200).block_n == 64
        assert gt.small_m_config(25, True, 2048, 5120, h200).block_n == 32


@pytest.mark.parametrize(
    ("when", "sets", "why"),
    [
        ('{"nvfp4": "no"}', ["slots_in_down=true"], "no moe.decode entry"),
        ('{"nvfp4": false}', ["slots_in_down"], "expected field=value"),
        ('{"nvfp4": false}', ["slots_in_down=yes"], "not JSON"),
        ('{"nvfp4": false}', ["no_such_field=1"], "does not load"),
        ('{"nvfp4": false}', ["block_m=3"], "does not load"),
    ],
)
def test_tuning_variant_refuses_what_it_cannot_apply(
    tuning_variant: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture, when: str, sets: list[str], why: str
) -> None:
    out = tmp_path / "variant.json"
    assert tuning_variant.main(["--op", "moe.decode", "--when", when, "--set", *sets, "--out", str(out)]) == 2
    assert why in capsys.readouterr().err
    assert not out.exists()


def test_the_kernel_path_log_names_the_table(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The engine's choice of kernels logs which tuning table the device uses (none: the code defaults)."""
    import logging

    from flint_kernels import dispatch

    monkeypatch.setattr(dispatch, "fast_path_reason", lambda *args: None)  # the fast path as on a GPU
    monkeypatch.setattr(dispatch, "_logged", set())
    monkeypatch.setenv(tuning.ENV, str(H200_TABLE))
    tuning.reload()
    with caplog.at_level(logging.INFO, logger=dispatch.__name__):
        dispatch.select_kernels("cpu", torch.bfloat16, torch.bfloat16)
        monkeypatch.delenv(tuning.ENV)
        dispatch.select_kernels("cpu", torch.float32, torch.float32)
    lines = [r.getMessage() for r in caplog.records if "kernel path" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].endswith(f"tuning table: {H200_TABLE}")
    assert lines[1].endswith("tuning table: none (the code defaults)")
