"""`flint_kernels.nvfp4_mma_codes`: ready codes (each word's bits in the order the MMA K step decodes in 8 integer
instructions instead of 13), the K step's PTX for them, and the MMA kernels reading them.

The layout and its PTX are checked bit for bit against the engine's codes and their PTX (`nvfp4_mma_emulation`'s
emulator); the kernels run in Triton's interpreter with the K step emulated and must give the same bits as from the
engine's codes; the sm_90 compile test measures the K loops; the `gpu` tests run the compiled kernels.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import numpy as np
import pytest
import torch
from flint_kernels import fast, nvfp4_mma_codes, nvfp4_mma_scales, tuning
from flint_kernels import nvfp4_mma_moe_triton as mm
from flint_kernels import nvfp4_mma_triton as nm
from flint_kernels.dispatch import REFERENCE, with_ops
from flint_kernels.linear import NVFP4Weight
from kernel_checks import LaunchSpy, random_nvfp4
from nvfp4_mma_emulation import emulate_ptx, record_l2_requests, run_ptx, seeded
from test_nvfp4_mma import EVERY_LINEAR_KERNEL
from test_nvfp4_mma_moe import _routing, _stacked, gpu_operands, random_experts

from flint_engine.config import preset
from flint_engine.model import FlintModel
from flint_engine.weights import random_weights

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import mma_k_loops

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def emulated_ptx(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The kernels in Triton's interpreter with their K step's PTX emulated (`emulate_ptx`); returns the ready_codes
    flag of every K step the emulator ran, so a test can see which PTX the kernel picked."""
    emulate_ptx(monkeypatch)
    picked: list[bool] = []
    step_asm = nm.step_asm

    def recording(groups: int = 1, perm: bool = False, ready_codes: bool = False) -> str:
        picked.append(ready_codes)
        return step_asm(groups, perm, ready_codes)

    monkeypatch.setattr(nm, "step_asm", recording)
    return picked


def _random_bytes(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=seeded(seed), dtype=torch.int32).to(torch.uint8)


def test_ready_words_permute_each_word_and_invert() -> None:
    """Ready codes are int8 of the codes' shape, each 32-bit word a permutation of its own bits (as many set bits,
    words of one set bit map to words of one set bit at 32 distinct places), and `engine_words` gives the codes back;
    rows that are not whole words are refused."""
    q = _random_bytes((3, 5, 64), 1)
    r = nvfp4_mma_codes.ready_words(q)
    assert r.dtype == torch.int8 and r.shape == q.shape
    assert torch.equal(nvfp4_mma_codes.engine_words(r), q)
    words = q.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    ready = r.view(torch.int32).to(torch.int64) & 0xFFFFFFFF

    def popcount(w: torch.Tensor) -> torch.Tensor:
        return sum((w >> b) & 1 for b in range(32))

    assert torch.equal(popcount(words), popcount(ready))
    one_hot = torch.tensor([1 << b for b in range(32)], dtype=torch.int64).to(torch.int32).view(torch.uint8)
    places = nvfp4_mma_codes.ready_words(one_hot).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert sorted(int(p).bit_length() - 1 for p in places) == list(range(32)) and popcount(places).eq(1).all()
    with pytest.raises(ValueError, match="not whole 32-bit words"):
        nvfp4_mma_codes.ready_words(torch.zeros(2, 6, dtype=torch.uint8))


def test_ready_words_convert_in_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large weights convert a bounded number of words at a time: the passes give the same bytes as one."""
    q = _random_bytes((4, 96), 2)
    whole = nvfp4_mma_codes.ready_words(q)
    monkeypatch.setattr(nvfp4_mma_codes, "WORDS_AT_ONCE", 7)
    assert torch.equal(nvfp4_mma_codes.ready_words(q), whole)


def _registers(lines: list[str], words: np.ndarray) -> np.ndarray:
    """The emulator's register m after `lines` (a decode's integer instructions) on 32 lanes' words."""
    asm = "\n".join(["mov.b32 w, $1;", *lines, "mov.b32 $0, m;"])
    return run_ptx(asm, {1: words}, 1)[0]


@pytest.mark.parametrize("register", [0, 1, 2, 3])
def test_ready_decode_gives_the_engine_decodes_bits(register: int) -> None:
    """Each register's integer instructions (`_decode_ready`, without the scale's FMA) on a ready word give exactly
    the bits the engine's decode (`_decode_pair`, after the shift by 8 for registers 2 and 3) gives on the word it
    came from: for words with every code in every nibble and for random words."""
    h, p = divmod(register, 2)
    nibbles = np.arange(16, dtype=np.uint32)
    every = sum(((nibbles + i) % 16) << (4 * i) for i in range(8)).astype(np.uint32)  # each code at each place
    rand = np.random.default_rng(register).integers(0, 2**32, 16, dtype=np.uint64).astype(np.uint32)
    words = np.concatenate([every, rand])
    ready = nvfp4_mma_codes.ready_words(torch.from_numpy(words.view(np.uint8).copy())).numpy().view(np.uint32)
    plain = nm._decode_pair("r", p, "s", "o")[:-1]
    plain = ["shr.u32 r, w, 8;" if h else "mov.b32 r, w;", *plain]
    fast_lines = nm._decode_ready("w", register, "s", "o")[:-1]
    assert len(fast_lines) == (1 if register == 0 else 2 if register < 3 else 3)
    assert [line.split()[-1] for line in nm._decode_ready("w", register, "s", "o")][-1] == "z;"
    assert np.array_equal(_registers(fast_lines, ready), _registers(plain, words))


def test_step_asm_with_ready_codes_is_the_same_step_with_fewer_instructions() -> None:
    """The K step for ready codes keeps its MMAs, FMAs and x handling and drops the shifts by 8 and 5 of 13 integer
    instructions a word: 8 words a lane's step (two rows, four words), so 40 fewer."""
    for groups, perm in ((1, False), (1, True), (4, False)):
        plain, ready = nm.step_asm(groups, perm), nm.step_asm(groups, perm, ready_codes=True)
        for op in ("mma.sync", "fma.rn.bf16x2", "prmt", "mov."):
            assert plain.count(op) == ready.count(op), (groups, perm, op)
        count = lambda asm: len([s for s in asm.split(";") if s.strip()])  # noqa: E731
        assert count(plain) - count(ready) == 40, (groups, perm)
        assert "shr.u32" not in ready and ready.count("shf.r.wrap") == 16


@pytest.mark.parametrize("m,vec,wide,kernel", EVERY_LINEAR_KERNEL)
@pytest.mark.parametrize("scales", [False, True])
def test_linear_with_ready_codes(
    emulated_ptx: list[bool], m: int, vec: bool, wide: bool, kernel: str, scales: bool
) -> None:
    """`ready_codes` (TileConfig.mma_ready_codes): each linear kernel reading the int8 ready codes (with UE4M3 or
    ready scale bytes) gives the same outputs as from the engine's codes, through the ready PTX (the pointer's type
    picked it); without ready codes `ready_codes` reads the engine's codes."""
    w = random_nvfp4(80, 384, seeded(60 + m), (48, 32))
    x = (torch.randn(m, 384, generator=seeded(61 + m)) * 0.5).to(torch.bfloat16)
    if scales:
        nvfp4_mma_scales.make_ready(w)
    want = torch.full((m, 80), float("nan"))
    nm.launch_linear(x, w, want, num_warps=2, split_k=2, vec=vec, wide=wide, ready=scales, ready_codes=True)
    assert emulated_ptx and not any(emulated_ptx)  # none made yet: the engine's codes
    nvfp4_mma_codes.make_ready(w)
    emulated_ptx.clear()
    got = torch.full((m, 80), float("nan"))
    spy = LaunchSpy(getattr(nm, kernel))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nm, kernel, spy)
        nm.launch_linear(x, w, got, num_warps=2, split_k=2, vec=vec, wide=wide, ready=scales, ready_codes=True)
    assert spy.launches == 1 and emulated_ptx and all(emulated_ptx)
    assert not torch.isnan(want).any() and torch.equal(got, want)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize(
    "vec,wide,l2,down_l2,prefetch,k",
    [
        (False, False, 0, 0, False, 768),
        (True, False, 2, 2, False, 768),
        (True, True, 2, 2, False, 768),
        (True, True, 2, 1, True, 768),  # both wide loops two steps an iteration (`_k_loop_wide_pairs`)
        (True, True, 2, 1, True, 640),  # five steps: not whole pairs, so one step an iteration (`pairs_fit`)
    ],
)
def test_moe_with_ready_codes(
    emulated_ptx: list[bool], vec: bool, wide: bool, l2: int, down_l2: int, prefetch: bool, k: int, monkeypatch
) -> None:
    """`ready_codes` (MoEConfig.mma_ready_codes) in the MoE's gate_up and down, 8- and 16-byte, with L2 requests and
    the wide tiles, the wide loops with loads a step ahead too (then two steps an iteration), after the ready scales
    (zero-scale blocks planted, their codes zeroed first): the same h and y as from the engine's codes. Where K is not
    whole pairs of steps the wide launches load no step ahead (one step an iteration)."""
    requested = record_l2_requests(monkeypatch)
    pairs_calls: list[int] = []
    pairs_loop = nm._k_loop_wide_pairs

    def counted(*args: object, **kwargs: object) -> object:
        pairs_calls.append(1)
        return pairs_loop(*args, **kwargs)

    monkeypatch.setattr(nm, "_k_loop_wide_pairs", counted)
    w13 = random_experts(5, 40, k, seed=71)
    w2 = random_experts(5, 68, k, seed=72)
    for w in (w13, w2):
        w.scales[:, 1, 0], w.scales[:, 2, 3] = 0x7F, 0x00
        nvfp4_mma_scales.make_ready(w)
    ids = _routing().reshape(-1).contiguous()
    x = (torch.randn(10, k, generator=seeded(73)) * 0.5).to(torch.bfloat16)
    hh = (torch.randn(30, k, generator=seeded(74)) * 0.5).to(torch.bfloat16)
    outs, lines = [], []
    for step in range(2):
        if step:
            nvfp4_mma_codes.make_ready(w13)
            nvfp4_mma_codes.make_ready(w2)
        emulated_ptx.clear()
        requested.clear()
        pairs_calls.clear()
        h = torch.full((30, 40), float("nan"))
        mm.launch_moe_gate_up(
            x, ids, w13, h, 3, 2, prefetch=prefetch, vec=vec, l2_ahead=l2, wide=wide, ready=True, ready_codes=True
        )
        y = torch.full((30, 136), float("nan"))
        mm.launch_moe_down(
            hh, ids, w2, y, num_warps=2, prefetch=prefetch, vec=vec, l2=down_l2, wide=wide, ready=True,
            ready_codes=True,
        )  # fmt: skip
        ready = bool(step)
        assert emulated_ptx and set(emulated_ptx) == {ready}
        # the paired loop: ready codes, loads ahead, whole pairs of steps (else loads ahead are off: `pairs_fit`)
        assert bool(pairs_calls) == (ready and wide and prefetch and k % 256 == 0)
        # the code lines each launch asked L2 for, as (weight, offset) whichever tensor holds them
        codes = [w.ready_codes if ready else w.qweight for w in (w13, w2)]
        lines.append(sorted((i, a - c.data_ptr()) for a in requested for i, c in enumerate(codes)
                            if 0 <= a - c.data_ptr() < c.numel()))  # fmt: skip
        outs.append((h, y))
    assert not torch.isnan(outs[0][0]).any() and not torch.isnan(outs[0][1]).any()
    assert torch.equal(outs[1][0], outs[0][0]) and torch.equal(outs[1][1], outs[0][1])
    assert lines[1] == lines[0] and (bool(lines[0]) == (l2 > 0 or down_l2 > 0))  # the same requests, by offset


def test_pairs_fit_only_whole_pairs_of_steps_with_loads_and_requests_ahead() -> None:
    assert mm.pairs_fit(2048, True, 2) and mm.pairs_fit(512, True, 2) and not mm.pairs_fit(640, True, 2)
    assert mm.pairs_fit(640, False, 2) and mm.pairs_fit(640, True, 0)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("shared_has_them", [True, False])
def test_the_shared_expert_programs_read_ready_codes_with_the_experts(
    emulated_ptx: list[bool], shared_has_them: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MoEConfig.mma_shared with ready codes: the wide gate_up and down launches with the shared expert's programs
    (first in the grid, h in the MMA's order, ready scale bytes) give the same h, hs, y and ys as from the engine's
    codes; where the shared expert has no ready codes, neither weight reads them (one launch's programs pick the PTX
    through one pointer type)."""
    record_l2_requests(monkeypatch)
    w13 = random_experts(5, 40, 768, seed=81)
    w2 = random_experts(5, 68, 256, seed=82)
    gate_up = random_nvfp4(160, 768, seeded(83), (80, 80))
    down = random_nvfp4(136, 512, seeded(84), (136,))
    for w in (w13, w2, gate_up, down):
        nvfp4_mma_scales.make_ready(w)
    ids = _routing().reshape(-1).contiguous()
    x = (torch.randn(10, 768, generator=seeded(85)) * 0.5).to(torch.bfloat16)
    hh = nm.perm_columns((torch.randn(30, 256, generator=seeded(86)) * 0.5).to(torch.bfloat16))
    hs_in = nm.perm_columns((torch.randn(10, 512, generator=seeded(87)) * 0.5).to(torch.bfloat16))

    def run() -> list[torch.Tensor]:
        h, hs = torch.full((30, 40), float("nan")), torch.full((10, 80), float("nan"))
        mm.launch_moe_gate_up(
            x, ids, w13, h, 3, 2, prefetch=True, vec=True, l2_ahead=2, wide=True, ready=True, shared=(gate_up, hs),
            perm=True, first=True, ready_codes=True,
        )  # fmt: skip
        y, ys = torch.full((30, 136), float("nan")), torch.full((10, 136), float("nan"))
        mm.launch_moe_down(
            hh, ids, w2, y, num_warps=2, vec=True, l2=2, wide=True, ready=True, shared=(down, hs_in, ys), perm=True,
            first=True, ready_codes=True,
        )  # fmt: skip
        return [h, hs, y, ys]

    want = run()
    assert not any(emulated_ptx)
    for w in (w13, w2) + ((gate_up, down) if shared_has_them else ()):
        nvfp4_mma_codes.make_ready(w)
    emulated_ptx.clear()
    got = run()
    assert emulated_ptx and set(emulated_ptx) == {shared_has_them}
    for a, b in zip(want, got, strict=True):
        assert not torch.isnan(a).any() and torch.equal(a, b)


def test_shared_stack_reads_ready_codes_like_a_2d_weight() -> None:
    """`_stacked` keeps the codes; a weight's ready codes follow it when the kernels pick them (`_with_ready_bytes`),
    and without either kind of ready bytes the weight itself is used."""
    w = random_nvfp4(32, 256, seeded(5), (32,))
    assert nm._with_ready_bytes(w, True, True) is w
    nvfp4_mma_scales.make_ready(w)
    nvfp4_mma_codes.make_ready(w)
    both = nm._with_ready_bytes(w, True, True)
    assert both.qweight is w.ready_codes and both.scales is w.ready_scales and both.global_scale is w.global_scale
    assert nm._with_ready_bytes(w, False, True).scales is w.scales
    assert nm._with_ready_bytes(w, False, False) is w
    assert _stacked(w).qweight.shape == (1, 32, 128)


def test_make_ready_after_the_ready_scales_keeps_their_zeroed_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fast.prepare_nvfp4` makes the ready scales first (they zero the codes of blocks whose scale is 0) and the
    ready codes after them, which then hold those codes; made the other way round, the ready scales refuse (the
    ready codes would keep the codes they zero). `prepare` acts on CUDA weights, so its two steps are recorded here
    and the CPU weight gets them from `make_ready`."""
    calls: list[str] = []
    monkeypatch.setattr(nvfp4_mma_scales, "prepare", lambda w: calls.append("scales"))
    monkeypatch.setattr(nvfp4_mma_codes, "prepare", lambda w: calls.append("codes"))
    fast.prepare_nvfp4(object())
    assert calls == ["scales", "codes"]
    w = random_nvfp4(16, 256, seeded(9), (16,))
    w.scales[3, 2] = 0x00
    nvfp4_mma_scales.make_ready(w)
    nvfp4_mma_codes.make_ready(w)
    assert torch.equal(nvfp4_mma_codes.engine_words(w.ready_codes), w.qweight)
    assert (w.qweight[3, 16:24] & 0x77).eq(0).all()
    before = w.ready_codes
    nvfp4_mma_codes.make_ready(w)  # once only
    assert w.ready_codes is before
    late = random_nvfp4(16, 256, seeded(10), (16,))
    late.scales[5, 1] = 0x7F
    nvfp4_mma_codes.make_ready(late)
    with pytest.raises(ValueError, match="ready codes were made before the ready scales"):
        nvfp4_mma_scales.make_ready(late)
    monkeypatch.undo()
    nvfp4_mma_codes.prepare(torch.zeros(4, 4))  # not an NVFP4 weight: nothing


def test_ready_codes_are_wanted_where_the_table_reads_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """By default (auto) a device wants ready codes when its tuning table has an `mma_ready_codes` entry (the shipped
    H200 table's MMA entries, since the forty-seventh session), and makes them in the codes' place; replace does so
    on any device, 1 keeps them beside the codes, 0 never makes them; other values are errors."""
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv("FLINT_MMA_READY_CODES", raising=False)
    monkeypatch.setenv("FLINT_TUNING_FILE", str(tuning.TABLES / "nvidia-h200.json"))
    assert nvfp4_mma_codes.wanted(cuda) and nvfp4_mma_codes.replaces()
    table = json.loads((tuning.TABLES / "nvidia-h200.json").read_text())
    for op in nvfp4_mma_scales.READING_OPS:
        for entry in table.get(op, ()):
            entry["config"].pop("mma_ready_codes", None)
    (tmp_path / "no_codes.json").write_text(json.dumps(table))
    monkeypatch.setenv("FLINT_TUNING_FILE", str(tmp_path / "no_codes.json"))
    assert not nvfp4_mma_codes.wanted(cuda)
    monkeypatch.setenv("FLINT_MMA_READY_CODES", "replace")
    assert nvfp4_mma_codes.wanted(cuda) and nvfp4_mma_codes.replaces()
    monkeypatch.setenv("FLINT_MMA_READY_CODES", "1")
    assert nvfp4_mma_codes.wanted(cuda) and not nvfp4_mma_codes.replaces()
    monkeypatch.setenv("FLINT_TUNING_FILE", str(tuning.TABLES / "nvidia-h200.json"))
    monkeypatch.setenv("FLINT_MMA_READY_CODES", "0")
    assert not nvfp4_mma_codes.wanted(cuda)
    monkeypatch.setenv("FLINT_MMA_READY_CODES", "yes")
    with pytest.raises(ValueError, match="FLINT_MMA_READY_CODES must be auto, 0, 1 or replace"):
        nvfp4_mma_codes.wanted(cuda)
    with pytest.raises(ValueError, match="FLINT_MMA_READY_CODES must be auto, 0, 1 or replace"):
        fast.fast_kernels(REFERENCE)  # refused when the op table is made, before any weight


def test_the_model_builder_counts_ready_codes(caplog: pytest.LogCaptureFixture) -> None:
    """Ready codes are memory beside the codes: `NVFP4Weight.nbytes`, the weights' total and the builder's log line
    count them (half a byte a value)."""
    weights = random_weights(preset("tiny"), torch.bfloat16, seed=8, nvfp4_linears=True)
    before = weights.nbytes()
    with caplog.at_level("INFO", logger="flint_engine.model"):
        FlintModel(weights, with_ops(REFERENCE, prepare_nvfp4=nvfp4_mma_codes.make_ready))
    extra = sum(w.qweight.numel() for w in weights.nvfp4_weights())
    values = sum(2 * w.qweight.numel() for w in weights.nvfp4_weights())
    assert extra == nvfp4_mma_codes.extra_bytes(values) and weights.nbytes() == before + extra
    n = len(list(weights.nvfp4_weights()))
    lines = [r.getMessage() for r in caplog.records if "ready scale and code bytes" in r.getMessage()]
    assert lines == [f"ready scale and code bytes for {n} NVFP4 weights: {extra / 1e9:.2f} GB"]


def test_ready_codes_shorten_the_installed_k_loops_on_sm90() -> None:
    """Compiled for sm_90 as the H200 table launches them (`benchmarks/mma_k_loops.py`: ready scale bytes, the wide
    MoE twins with the shared expert's programs first and h in the MMA's order, the 1-8-row, rows and wide linear):
    with ready codes (an int8 code pointer) each K loop is at least 12% shorter, with the same HMMAs, no spill in it,
    fewer integer multiplies (one a word of codes instead of one a register), at most 128 registers or as many as
    before, and no more than 16 bytes more spilled outside the loop (the wide gate_up at its 128-register cap: 24 ->
    32 bytes with Triton 3.9, 32 -> 24 with the H200's 3.6: the epilogue's selected pointers). Figures:
    `benchmarks/results/mma_k_loops*.json`, the docstring of `nvfp4_mma_codes`."""
    assert mma_k_loops.KS_MAXNREG == mm.KS_MAXNREG
    plain, ready = mma_k_loops.installed_cases(False), mma_k_loops.installed_cases(True)
    assert all(c["pointers"]["w_ptr"] == "i8" for c in ready)
    results = mma_k_loops.profile(plain + ready)
    for before, after in zip(results[: len(plain)], results[len(plain) :], strict=True):
        name = before["kernel"]
        assert after["k_step"] <= 0.88 * before["k_step"], (name, before["k_step"], after["k_step"])
        steps = 2 if name.startswith("_moe_gate_up") else 1  # its ready loop: `_k_loop_wide_pairs`
        assert before["k_loop_steps"] == 1 and after["k_loop_steps"] == steps and after["k_loop_spills"] == 0, name
        imad = after["k_loop_opcodes"].get("IMAD", 0) / steps
        assert imad < before["k_loop_opcodes"].get("IMAD", 0), name
        assert after["regs"] <= max(128, before["regs"]) and after["spills"] <= before["spills"] + 16, (name, after)


def test_every_mma_kernel_variant_compiles_for_ready_codes_on_sm90() -> None:
    """The MMA kernels the table does not run today compile for sm_90 with ready codes too (an int8 code pointer),
    their K loops with all their HMMAs and no spill: the 8-byte linear with loads ahead, the gate_up's L2 twin and
    its twin splitting K over warps, the down's L2 twin, and the wide down with loads and L2 requests ahead (two steps
    an iteration)."""
    lin = dict(mma_k_loops.installed_cases(True)[0]["pointers"])
    gate_up = dict(mma_k_loops.installed_cases(True)[3]["pointers"])
    down = dict(mma_k_loops.installed_cases(True)[4]["pointers"])
    plain_moe = {k: v for k, v in gate_up.items() if not k.startswith(("sw_", "ss_", "sgs_", "hs_", "ys_"))}
    plain_down = {k: v for k, v in down.items() if not k.startswith(("sw_", "ss_", "sgs_", "hs_", "ys_"))}
    lin_mod, moe_mod = "flint_kernels.nvfp4_mma_triton", "flint_kernels.nvfp4_mma_moe_triton"
    cases = [
        (lin_mod, "_nvfp4_mma_kernel", lin, dict(SPLIT_K=4, NW=4, PREFETCH=True, PDL=True), 8, 1),
        (moe_mod, "_moe_gate_up_mma_l2_kernel", plain_moe, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True,
                                                                 L2_AHEAD=2), 8, 1),
        (moe_mod, "_moe_gate_up_mma_ks_kernel", plain_moe, dict(P_PAD=512, NW=4, PREFETCH=True, PDL=True,
                                                                 L2_AHEAD=2, KSPLIT=2), 8, 1),
        (moe_mod, "_moe_down_mma_l2_kernel", plain_down, dict(P_PAD=512, NW=4, PREFETCH=False, PDL=True,
                                                               L2_MODE=1), 8, 1),
        (moe_mod, "_moe_down_mma_wide_kernel", plain_down, dict(P_PAD=256, NW=8, PREFETCH=True, PDL=True,
                                                                 L2_MODE=1), 16, 2),
    ]  # fmt: skip
    specs = [
        {"module": m, "kernel": k, "pointers": p, "constexprs": cx, "num_warps": cx["NW"], "hmma_a_step": hmma,
         "maxnreg": mm.KS_MAXNREG if "_ks_" in k or "_gate_up_mma_wide_" in k else None}
        for m, k, p, cx, hmma, _ in cases
    ]  # fmt: skip
    assert all(spec["pointers"]["w_ptr"] == "i8" for spec in specs)
    for (_, kernel, _, _, _, steps), got in zip(cases, mma_k_loops.profile(specs), strict=True):
        assert got["k_loop_steps"] == steps and got["k_loop_spills"] == 0, (kernel, got)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 9, 16, 32, 64])
def test_ready_codes_on_the_gpu(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ready codes (`nvfp4_mma_codes.prepare` on CUDA weights; TileConfig / MoEConfig.mma_ready_codes) change no
    output: the linear at `tokens` rows (the 1-8-row, rows and wide kernels, 16-byte loads) and the MoE's gate_up and
    down (plain, L2 requests, wide) give the same bits as from the engine's codes, with ready scale bytes as
    installed; so does `fused_moe` with the table's config plus mma_ready_codes, the shared expert in its launches
    from 9 tokens."""
    from flint_kernels import moe_triton as mt

    monkeypatch.setenv("FLINT_MMA_READY_CODES", "1")
    w, w13, w2, x, ids, tw, h = gpu_operands(tokens)
    gate_up = random_nvfp4(2048, 2048, seeded(500 + tokens), (1024, 1024))
    down = random_nvfp4(2048, 1024, seeded(600 + tokens), (2048,))
    sh = [NVFP4Weight(s.qweight.cuda(), s.scales.cuda(), s.global_scale.cuda() / 64, s.segments)
          for s in (gate_up, down)]  # fmt: skip
    for weight in (w, w13, w2, *sh):
        nvfp4_mma_scales.make_ready(weight)
    cfg = mt.decode_config(True, tokens, x.device)
    cfg = dataclasses.replace(cfg, expert_major=True, mma=True, mma_down=True, mma_vec=True, use_dot=False,
                              mma_ready=True, mma_ready_codes=True)  # fmt: skip
    shared_cfg = dataclasses.replace(cfg, mma_wide=True, mma_down_wide=True, mma_shared=True, mma_perm_h=True)

    def outputs() -> list[torch.Tensor]:
        out = [
            nm.linear(x, w, vec=True, ready=True, ready_codes=True),
            nm.linear(x, w, vec=True, wide=True, ready=True, ready_codes=True),
            mm.moe_gate_up(x, ids, w13, vec=True, ready=True, ready_codes=True),
            mm.moe_gate_up(x, ids, w13, 8, vec=True, prefetch=True, l2_ahead=2, wide=True, ready=True,
                           ready_codes=True),
            mm.moe_down(h, ids, w2, vec=True, l2=2, ready=True, ready_codes=True),
            mm.moe_down(h, ids, w2, vec=True, l2=2, wide=True, ready=True, ready_codes=True),
            mt.fused_moe(x, tw, ids, w13, w2, decode_max_tokens=64, config=cfg),
        ]  # fmt: skip
        if tokens >= 9:
            out.append(mt.fused_moe(x, tw, ids, w13, w2, shared=tuple(sh), decode_max_tokens=64, config=shared_cfg))
        return out

    before = outputs()  # no ready codes yet: `ready_codes` falls back to the engine's codes
    for weight in (w, w13, w2, *sh):
        nvfp4_mma_codes.prepare(weight)
        assert weight.ready_codes is not None and weight.ready_codes.dtype == torch.int8
    read: list[torch.dtype] = []  # the codes each launch was handed: ready ones (int8) every time
    with_ready = nm._with_ready_bytes

    def recorded(weight: NVFP4Weight, ready: bool, ready_codes: bool = False) -> NVFP4Weight:
        out = with_ready(weight, ready, ready_codes)
        read.append(out.qweight.dtype)
        return out

    monkeypatch.setattr(nm, "_with_ready_bytes", recorded)
    monkeypatch.setattr(mm, "_with_ready_bytes", recorded)
    for i, (want, got) in enumerate(zip(before, outputs(), strict=True)):
        assert torch.equal(got, want), i
    assert len(read) >= len(before) and set(read) == {torch.int8}, read
