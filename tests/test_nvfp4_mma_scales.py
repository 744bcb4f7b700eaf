"""Ready scale bytes for the NVFP4 MMA kernels (`flint_kernels.nvfp4_mma_scales`): the pair they decode to equals the
E4M3 decode's for every byte, the codes of zero-scale blocks become signed zeros with every value unchanged, the
model builder hands each NVFP4 weight to the op table's `prepare_nvfp4`, and devices whose table reads the bytes get
them."""

from __future__ import annotations

import json
import pathlib
import struct

import pytest
import torch
from flint_kernels import fast, nvfp4_mma_scales, tuning
from flint_kernels.dispatch import REFERENCE, with_ops
from kernel_checks import random_nvfp4

from flint_engine.config import preset
from flint_engine.model import FlintModel
from flint_engine.weights import random_weights


def _e4m3_pair(b: int) -> int:
    """The BF16 pair `nvfp4_mma_triton._scale2` builds from scale byte b: E4M3 of its low 7 bits (0x7F: 0) times
    2**64, in both halves (int32 bits)."""
    value = struct.unpack("<f", struct.pack("<I", (b & 0x7F) << 20))[0] * 2.0**120 * 2.0**64
    if b == 0x7F:
        value = 0.0
    bits = int(torch.tensor([value]).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF
    return struct.unpack("<i", struct.pack("<I", bits | bits << 16))[0]


def test_every_nonzero_byte_gives_the_e4m3_pair() -> None:
    """All 256 bytes: the ready byte's pair equals the E4M3 decode's wherever the scale is not 0 (E4M3's subnormals,
    0x80-0xFF's ignored top bit and 0xFF included); the zero scales (0x00, 0x80, 0x7F) are flagged and give byte 0."""
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    u = nvfp4_mma_scales.ready_bytes(b)
    assert u.dtype == torch.int8
    pairs = nvfp4_mma_scales.ready_pair(u).tolist()
    zero = nvfp4_mma_scales.zero_scale(b).tolist()
    assert [i for i in range(256) if zero[i]] == [0x00, 0x7F, 0x80]
    for i in range(256):
        if zero[i]:
            assert u[i].item() == 0
        else:
            assert pairs[i] == _e4m3_pair(i), (hex(i), hex(pairs[i]), hex(_e4m3_pair(i)))
    assert max(u.view(torch.uint8).tolist()) == 0x7F + 16  # 0xFF's 1.875 * 2**8: within a byte


def test_make_ready_keeps_every_value() -> None:
    """A weight with every code and scale byte (zero scales planted): after `make_ready` its dequantised values are
    equal, the nonzero ones to the bit, the zero-scale blocks' codes are zeros with their sign bits kept, and the
    ready bytes count in its bytes; a second call changes nothing."""
    w = random_nvfp4(64, 256, torch.Generator().manual_seed(3), (64,))
    before = w.dequantize(torch.float32)
    codes = w.qweight.clone()
    nbytes = w.nbytes
    nvfp4_mma_scales.make_ready(w)
    assert w.ready_scales is not None and w.ready_scales.shape == w.scales.shape
    after = w.dequantize(torch.float32)
    assert torch.equal(after, before)
    nonzero = before != 0
    assert torch.equal(after[nonzero].view(torch.int32), before[nonzero].view(torch.int32))
    empty = nvfp4_mma_scales.zero_scale(w.scales)
    assert int(empty.sum()) >= 3
    blocks = w.qweight.unflatten(-1, (-1, 8))
    assert torch.equal(blocks[empty], codes.unflatten(-1, (-1, 8))[empty] & 0x88)
    assert torch.equal(blocks[~empty], codes.unflatten(-1, (-1, 8))[~empty])
    assert w.nbytes == nbytes + w.scales.numel()
    ready = w.ready_scales
    nvfp4_mma_scales.make_ready(w)
    assert w.ready_scales is ready


def test_prepare_takes_only_cuda_nvfp4_weights() -> None:
    """`prepare` (the op table's hook) leaves CPU weights and dense tensors alone: ready bytes live beside the
    weights the GPU kernels read."""
    w = random_nvfp4(16, 128, torch.Generator().manual_seed(4), (16,))
    nvfp4_mma_scales.prepare(w)
    nvfp4_mma_scales.prepare(torch.zeros(4, 4))
    assert w.ready_scales is None


def test_the_model_builder_hands_each_nvfp4_weight_to_the_hook() -> None:
    """FlintModel calls `prepare_nvfp4` once for each NVFP4 weight the linear and MoE kernels read: the lm_head, every
    layer's projections, dense MLPs, routed and shared experts (not the embedding, whose rows are dequantised)."""
    weights = random_weights(preset("tiny"), torch.bfloat16, seed=5, nvfp4_linears=True)
    seen: list[int] = []
    FlintModel(weights, with_ops(REFERENCE, prepare_nvfp4=lambda w: seen.append(id(w))))
    want = [id(w) for w in weights.nvfp4_weights()]
    assert seen == want and len(set(want)) == len(want)
    layer = weights.layers[-1]
    assert id(weights.lm_head) in seen and id(layer.qkv) in seen and id(layer.mlp.experts_gate_up) in seen
    assert id(weights.embed) not in seen


def test_the_model_builder_logs_what_the_ready_bytes_take(caplog: pytest.LogCaptureFixture) -> None:
    """Where the hook made ready bytes, the builder logs once how many weights got them and their bytes (memory the
    KV cache does not get)."""
    weights = random_weights(preset("tiny"), torch.bfloat16, seed=6, nvfp4_linears=True)
    with caplog.at_level("INFO", logger="flint_engine.model"):
        FlintModel(weights, with_ops(REFERENCE, prepare_nvfp4=nvfp4_mma_scales.make_ready))
    nbytes = sum(w.scales.numel() for w in weights.nvfp4_weights())
    lines = [r.getMessage() for r in caplog.records if "ready scale and code bytes" in r.getMessage()]
    n = len(list(weights.nvfp4_weights()))
    assert lines == [f"ready scale and code bytes for {n} NVFP4 weights: {nbytes / 1e9:.2f} GB"]
    # In the UE4M3 bytes' place they take nothing more: no line.
    caplog.clear()
    weights = random_weights(preset("tiny"), torch.bfloat16, seed=7, nvfp4_linears=True)
    with caplog.at_level("INFO", logger="flint_engine.model"):
        FlintModel(weights, with_ops(REFERENCE, prepare_nvfp4=lambda w: nvfp4_mma_scales.make_ready(w, replace=True)))
    assert all(w.scales.dtype == torch.int8 for w in weights.nvfp4_weights())
    assert not [r for r in caplog.records if "ready scale and code bytes" in r.getMessage()]


@pytest.mark.parametrize("codes", ["0", "1", "auto"])
@pytest.mark.parametrize("flag", ["0", "1", "auto"])
def test_the_fused_table_has_the_hook_unless_turned_off(monkeypatch: pytest.MonkeyPatch, flag: str, codes: str) -> None:
    """The fused op table carries `fast.prepare_nvfp4` (whose two steps ask `wanted` per device) unless both
    `FLINT_MMA_READY_SCALES` and `FLINT_MMA_READY_CODES` are 0."""
    monkeypatch.setenv("FLINT_MMA_READY_SCALES", flag)
    monkeypatch.setenv("FLINT_MMA_READY_CODES", codes)
    table = fast.fast_kernels(REFERENCE)
    assert (table.prepare_nvfp4 is fast.prepare_nvfp4) == (flag != "0" or codes != "0")


def test_ready_scales_are_wanted_where_the_table_reads_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """By default (auto) a device wants ready bytes when its tuning table has an `mma_ready` entry, and makes them in
    the UE4M3 bytes' place (since the forty-eighth session): the shipped H200 table does, a table without one and a
    device with no table do not; replace makes them in that place on any device, 1 beside the UE4M3 bytes, 0 never;
    other values are errors."""
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv("FLINT_MMA_READY_SCALES", raising=False)
    monkeypatch.setenv("FLINT_TUNING_FILE", str(tuning.TABLES / "nvidia-h200.json"))
    assert nvfp4_mma_scales.wanted(cuda) and nvfp4_mma_scales.replaces()
    plain = json.loads((tuning.TABLES / "nvidia-h200.json").read_text())
    for op in nvfp4_mma_scales.READING_OPS:
        for entry in plain.get(op, []):
            entry["config"].pop("mma_ready", None)
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    monkeypatch.setenv("FLINT_TUNING_FILE", str(tmp_path / "plain.json"))
    assert not nvfp4_mma_scales.wanted(cuda)
    monkeypatch.setenv("FLINT_MMA_READY_SCALES", "replace")
    assert nvfp4_mma_scales.wanted(cuda) and nvfp4_mma_scales.replaces()
    monkeypatch.setenv("FLINT_MMA_READY_SCALES", "1")
    assert nvfp4_mma_scales.wanted(cuda) and not nvfp4_mma_scales.replaces()
    monkeypatch.setenv("FLINT_MMA_READY_SCALES", "0")
    monkeypatch.setenv("FLINT_TUNING_FILE", str(tuning.TABLES / "nvidia-h200.json"))
    assert not nvfp4_mma_scales.wanted(cuda)
    monkeypatch.setenv("FLINT_MMA_READY_SCALES", "yes")
    with pytest.raises(ValueError, match="FLINT_MMA_READY_SCALES must be auto, 0, 1 or replace"):
        nvfp4_mma_scales.wanted(cuda)
    with pytest.raises(ValueError, match="FLINT_MMA_READY_SCALES must be auto, 0, 1 or replace"):
        fast.fast_kernels(REFERENCE)  # refused when the op table is made, before any weight
    monkeypatch.delenv("FLINT_MMA_READY_SCALES")
    monkeypatch.delenv("FLINT_TUNING_FILE")
    assert not nvfp4_mma_scales.wanted(torch.device("cpu"))
