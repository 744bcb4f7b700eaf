"""Checkpoint formats: the same model from HF safetensors, GGUF F32/BF16/NVFP4; clear errors for bad files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import hf_checkpoint
from flint_kernels import nvfp4
from flint_kernels.linear import NVFP4Weight
from gguf import GGMLQuantizationType, GGUFWriter
from safetensors.torch import load_file, save_file
from transformers import FlintForCausalLM

from flint_engine.checkpoint import CheckpointError, open_source
from flint_engine.checkpoint.assemble import assemble_weights
from flint_engine.checkpoint.gguf_writer import _add_kv, _to_array, gguf_metadata, plan_tensors, write_gguf
from flint_engine.checkpoint.random_tensors import random_provider
from flint_engine.config import preset
from flint_engine.model import FlintModel

SEQS = [list(range(3, 40)), [7, 1, 300, 5], list(range(200, 213))]


def logits_of(path: Path | str, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    return FlintModel(assemble_weights(open_source(path), dtype, progress=False)).forward_sequences(SEQS)


def assert_identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One random model (weights on the NVFP4 grid) in every format."""
    cfg = preset("tiny")
    tmp = tmp_path_factory.mktemp("formats")
    prov = random_provider(cfg, seed=5, nvfp4_values=True)
    out = {"hf": hf_checkpoint(tmp, cfg, seed=5, nvfp4_values=True, dtype=torch.bfloat16)}
    for fmt in ("f32", "bf16", "nvfp4"):
        out[fmt] = tmp / f"m-{fmt}.gguf"
        write_gguf(out[fmt], cfg, prov, fmt=fmt, progress=False)
    out["mixed"] = tmp / "m-mixed.gguf"  # third-party policy: only routed experts in NVFP4
    write_gguf(out["mixed"], cfg, prov, fmt="nvfp4", nvfp4_scope="experts", progress=False)
    return out


def test_all_formats_give_identical_logits(files: dict[str, Path]) -> None:
    ref = logits_of(files["hf"])
    for fmt in ("f32", "bf16", "nvfp4", "mixed"):
        assert_identical(logits_of(files[fmt]), ref)


def test_nvfp4_file_really_is_nvfp4(files: dict[str, Path]) -> None:
    src = open_source(files["nvfp4"])
    types = src.tensor_types()
    assert types["blk.2.ffn_gate_exps.weight"] == "NVFP4"
    assert types["output.weight"] == "NVFP4"
    assert types["token_embd.weight"] == "BF16"
    assert types["blk.0.attn_norm.weight"] == "F32"
    mixed = open_source(files["mixed"]).tensor_types()
    assert mixed["blk.2.ffn_gate_exps.weight"] == "NVFP4" and mixed["blk.2.attn_q.weight"] == "BF16"
    w = assemble_weights(src, torch.bfloat16, progress=False)
    assert w.is_nvfp4() and isinstance(w.layers[2].mlp.experts_gate_up, NVFP4Weight)
    bf16 = assemble_weights(open_source(files["bf16"]), torch.bfloat16, progress=False)
    assert w.nbytes() < bf16.nbytes() / 2
    # The engine keeps room for a BF16 copy of a layer's experts only when they are NVFP4.
    assert w.has_nvfp4_experts() and not bf16.has_nvfp4_experts()


def test_transformers_reads_our_hf_files_and_we_read_its(tmp_path: Path, files: dict[str, Path]) -> None:
    hf = FlintForCausalLM.from_pretrained(files["hf"], dtype=torch.bfloat16)
    hf.save_pretrained(tmp_path / "saved")
    assert_identical(logits_of(tmp_path / "saved"), logits_of(files["hf"]))


def test_fused_hf_expert_tensors_and_sinks_name(tmp_path: Path, files: dict[str, Path]) -> None:
    """A checkpoint holding the fused forms (`mlp.experts.gate_up_proj`, `self_attn.sinks`) loads the same."""
    src_dir = files["hf"]
    tensors = load_file(str(src_dir / "model.safetensors"))
    cfg = preset("tiny")
    fused = {}
    for name, t in tensors.items():
        if ".mlp.experts." in name:
            continue
        fused[name.replace("self_attn.softmax_offset", "self_attn.sinks")] = t
    for i in cfg.moe_layers:
        p = f"model.layers.{i}.mlp.experts."
        gate = torch.stack([tensors[f"{p}{e}.gate_proj.weight"] for e in range(cfg.num_experts)])
        up = torch.stack([tensors[f"{p}{e}.up_proj.weight"] for e in range(cfg.num_experts)])
        fused[p + "gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        fused[p + "down_proj"] = torch.stack([tensors[f"{p}{e}.down_proj.weight"] for e in range(cfg.num_experts)])
    out = tmp_path / "fused"
    out.mkdir()
    save_file(fused, str(out / "model.safetensors"))
    (out / "config.json").write_text((src_dir / "config.json").read_text())
    assert_identical(logits_of(out), logits_of(src_dir))


# ---------------------------------------------------------------------------------------------- NVFP4 scales
def _write_custom(
    path: Path,
    mutate: Callable[[str, np.ndarray, GGMLQuantizationType], tuple | None] | None = None,
    extra_meta: dict | None = None,
    fmt: str = "nvfp4",
    provider=None,
    scale_companions: bool = True,
) -> Path:
    cfg = preset("tiny")
    prov = provider or random_provider(cfg, seed=9, nvfp4_values=True)
    w = GGUFWriter(str(path), arch="flint")
    for k, v in {**gguf_metadata(cfg, fmt, None, None, "t"), **(extra_meta or {})}.items():
        if k != "general.architecture":
            _add_kv(w, k, v)
    pending: list[np.ndarray] = []
    for p in plan_tensors(cfg, fmt, scale_companions=scale_companions):
        if p.spec is None:
            data = pending.pop(0)
        else:
            data, comp = _to_array(prov(p.spec), p, scale_companions)
            pending.extend(comp)
        item = (p.name, data, p.ggml_type)
        if mutate is not None:
            item = mutate(*item)
            if item is None:
                continue
        name, data, t = item
        w.add_tensor(name, data, raw_dtype=None if t == GGMLQuantizationType.F32 else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_missing_scale_companion_means_one(tmp_path: Path) -> None:
    cfg = preset("tiny")
    base = random_provider(cfg, seed=9, nvfp4_values=False)

    def unit_scale_provider(spec):  # NVFP4 weights whose global scale is exactly 1
        w = base(spec)
        if spec.role in ("linear", "experts") and spec.shape[-1] % 64 == 0:
            q, s = nvfp4.quantize(w, None)
            lead = spec.shape[:-2]
            return NVFP4Weight(q, s, torch.ones((*lead, 1)), (spec.shape[-2],))
        return w

    with_scales = _write_custom(tmp_path / "a.gguf", provider=unit_scale_provider)
    without = _write_custom(tmp_path / "b.gguf", provider=unit_scale_provider, scale_companions=False)
    assert not any(n.endswith(".scale") for n in open_source(without).tensors)
    assert_identical(logits_of(without), logits_of(with_scales))


def test_per_expert_scale_is_applied_per_expert(tmp_path: Path) -> None:
    base = random_provider(preset("tiny"), seed=9, nvfp4_values=True)

    def spread(spec):  # give every expert its own (non power of two) global scale
        w = base(spec)
        if isinstance(w, NVFP4Weight) and spec.role == "experts":
            factors = 1.0 + 0.1 * torch.arange(spec.shape[0], dtype=torch.float32)[:, None]
            return NVFP4Weight(w.qweight, w.scales, w.global_scale * factors, w.segments)
        return w

    src = open_source(_write_custom(tmp_path / "e.gguf", provider=spread))
    t = src.tensors["blk.2.ffn_up_exps.weight"]
    scales = np.array(src.tensors["blk.2.ffn_up_exps.scale"].data, dtype=np.float32)
    assert scales.shape == (8,) and len(set(scales.tolist())) > 1
    ref = np.stack(
        [
            __import__("gguf").quants.dequantize(np.asarray(t.data[e]), GGMLQuantizationType.NVFP4) * scales[e]
            for e in range(8)
        ]
    )
    spec = next(
        s
        for s in __import__("flint_engine.checkpoint.tensor_plan", fromlist=["x"]).checkpoint_plan(preset("tiny"))
        if s.gguf == "blk.2.ffn_up_exps.weight"
    )
    w = src.load(spec, torch.device("cpu"))
    assert isinstance(w, NVFP4Weight)
    assert np.array_equal(w.dequantize(torch.float32, with_global=True).numpy(), ref)


def test_fp4_activation_files_are_refused(tmp_path: Path) -> None:
    path = _write_custom(
        tmp_path / "a4.gguf",
        extra_meta={
            "general.tensor_extra.name": ["blk.2.ffn_up_exps.weight", "blk.3.ffn_up_exps.weight"],
            "general.tensor_extra.prec_a4": [False, True],
        },
    )
    with pytest.raises(CheckpointError, match=r"FP4 activations.*W4A16") as err:
        open_source(path)
    assert err.value.tensor == "blk.3.ffn_up_exps.weight"


# ---------------------------------------------------------------------------------------------- bad files
def _expect_error(path: Path, match: str, tensor: str | None) -> None:
    with pytest.raises(CheckpointError, match=match) as err:
        assemble_weights(open_source(path), torch.bfloat16, progress=False)
    if tensor is not None:
        assert err.value.tensor == tensor
        assert tensor in str(err.value)


def test_truncated_gguf_names_the_tensor(tmp_path: Path, files: dict[str, Path]) -> None:
    data = files["nvfp4"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])
    _expect_error(cut, "truncated", "output.weight")
    cut.write_bytes(data[:200])  # inside the metadata
    _expect_error(cut, "corrupt or truncated", None)


def test_wrong_shape_names_the_tensor(tmp_path: Path) -> None:
    def mutate(name, data, t):
        if name == "blk.1.attn_k.weight":
            return name, data[:-64], t  # one row too few... of a [kv, H] tensor in bytes
        return name, data, t

    _expect_error(_write_custom(tmp_path / "s.gguf", mutate), r"shape .* does not match", "blk.1.attn_k.weight")


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    path = _write_custom(tmp_path / "m.gguf", lambda n, d, t: None if n == "blk.3.ffn_down_exps.weight" else (n, d, t))
    _expect_error(path, "missing tensor", "blk.3.ffn_down_exps.weight")


def test_unsupported_and_unknown_tensor_types(tmp_path: Path) -> None:
    def as_q8(name, data, t):
        if name == "blk.0.attn_q_norm.weight":  # 16 floats -> not even a Q8_0 block: use raw bytes of one block
            return name, np.zeros((1, 34), dtype=np.uint8) + 1, GGMLQuantizationType.Q8_0
        return name, data, t

    with pytest.raises(CheckpointError, match=r"row length 32 is not a multiple|shape") as err:
        assemble_weights(open_source(_write_custom(tmp_path / "q.gguf", as_q8)), torch.bfloat16, progress=False)
    assert err.value.tensor == "blk.0.attn_q_norm.weight"

    def as_q8_block(name, data, t):
        if name == "blk.0.attn_norm.weight":  # 64 values = 2 Q8_0 blocks
            return name, np.ones((2 * 34,), dtype=np.uint8).reshape(1, 68), GGMLQuantizationType.Q8_0
        return name, data, t

    _expect_error(
        _write_custom(tmp_path / "q8.gguf", as_q8_block),
        r"shape|unsupported tensor type Q8_0",
        "blk.0.attn_norm.weight",
    )
    # an id no ggml version knows: patch the type field of one tensor info in place
    path = _write_custom(tmp_path / "u.gguf")
    raw = bytearray(path.read_bytes())
    name = b"blk.0.attn_norm.weight"
    at = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", raw, at)[0]
    struct.pack_into("<I", raw, at + 4 + 8 * n_dims, 250)
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="unknown GGML tensor type id 250") as err:
        open_source(path)
    assert err.value.tensor == "blk.0.attn_norm.weight"


def test_not_gguf_and_missing_paths(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="not a GGUF"):
        open_source(junk)
    with pytest.raises(CheckpointError, match="no such file"):
        open_source(tmp_path / "nope.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        open_source(tmp_path / "empty")


def test_bad_hf_checkpoints(tmp_path: Path, files: dict[str, Path]) -> None:
    tensors = load_file(str(files["hf"] / "model.safetensors"))
    cfg_text = (files["hf"] / "config.json").read_text()

    def make(name: str, t: dict[str, torch.Tensor]) -> Path:
        d = tmp_path / name
        d.mkdir()
        save_file(t, str(d / "model.safetensors"))
        (d / "config.json").write_text(cfg_text)
        return d

    missing = dict(tensors)
    del missing["model.layers.2.mlp.experts.5.up_proj.weight"]
    _expect_error(make("missing", missing), "missing tensor", "model.layers.2.mlp.experts.5.up_proj.weight")
    wrong = dict(tensors)
    wrong["model.layers.1.self_attn.o_proj.weight"] = torch.zeros(3, 3)
    _expect_error(make("wrong", wrong), "does not match", "model.layers.1.self_attn.o_proj.weight")
    cut = make("cut", tensors)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError):
        assemble_weights(open_source(cut), torch.bfloat16, progress=False)
    bad_cfg = make("badcfg", tensors)
    cfg = json.loads(cfg_text)
    cfg["layer_types"] = cfg["layer_types"][:-1]
    (bad_cfg / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="layer_types"):
        open_source(bad_cfg)


# ---------------------------------------------------------------------------------------------- CLI
def _flint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flint_engine.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "flags,env",
    [
        ([], {}),
        (["--no-ready-scales"], {}),
        (["--ready-codes"], {}),
        (["--no-ready-scales", "--ready-codes"], {}),
        (["--ready-scales", "replace", "--ready-codes", "replace"], {}),
        ([], {"FLINT_MMA_READY_SCALES": "replace", "FLINT_MMA_READY_CODES": "1"}),
        (["--ready-scales", "1"], {"FLINT_MMA_READY_SCALES": "0"}),
    ],
)
def test_capacity_counts_what_the_fused_path_keeps_beside_the_weights(flags: list[str], env: dict[str, str]) -> None:
    """`flint capacity` weighs the checkpoint's tensors plus the BF16 router parts (3 x 2 bytes x 256 x 2048 for each
    of the 47 MoE layers, 141 MB) that the fused router keeps beside them, and the NVFP4 MMA kernels' ready bytes as
    the engine makes them: under FLINT_MMA_READY_SCALES / _CODES (auto: as the H200's table asks; its entries read
    ready scale bytes and ready codes, made in the UE4M3 bytes' and the codes' place, nothing added; 1: beside the
    weight's own bytes, one byte per 16 NVFP4 values for scales, 2.47 GB, half a byte a value for codes, 19.7 GB;
    replace: in the weight's own bytes' place, nothing added), or as `--ready-scales` / `--ready-codes` say."""
    from flint_kernels import nvfp4_mma_codes, nvfp4_mma_scales, tuning

    from flint_engine.checkpoint.gguf_writer import plan_tensors

    h200 = tuning.load(tuning.TABLES / "nvidia-h200.json")

    def beside(name: str, env_name: str, table_reads: bool) -> bool:
        mode = env.get(env_name, "auto")
        if f"--no-ready-{name}" in flags:
            mode = "0"
        elif f"--ready-{name}" in flags:
            i = flags.index(f"--ready-{name}")
            mode = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else "1"
        return mode == "1" or (mode == "auto" and table_reads)

    # auto makes ready bytes in the weight's own bytes' place where the table reads them (it reads both): nothing added
    assert nvfp4_mma_scales.table_reads(h200) and nvfp4_mma_codes.table_reads(h200)
    ready = beside("scales", "FLINT_MMA_READY_SCALES", False)
    codes = beside("codes", "FLINT_MMA_READY_CODES", False)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLINT_MMA_READY_")}
    r = subprocess.run(
        [sys.executable, "-m", "flint_engine.cli", "capacity", "--weights", "nvfp4", "bf16", *flags],
        capture_output=True, text=True, timeout=300, env={**clean, **env},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = {
        line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["nvfp4"], ["bf16"])
    }
    router = 3 * 2 * 256 * 2048 * 47
    ready_bytes = (2_465_808_384 if ready else 0) + (2_465_808_384 * 8 if codes else 0)
    for fmt, extra in (("nvfp4", router + ready_bytes), ("bf16", router)):
        tensors = sum(t.nbytes for t in plan_tensors(preset("full"), fmt))
        assert float(rows[fmt][1]) == pytest.approx((tensors + extra) / 1e9, abs=0.006), fmt


def test_capacity_refuses_an_unknown_ready_setting() -> None:
    """A misspelt setting, in the variable or the flag, is an error naming it, not a silent default."""
    r = subprocess.run(
        [sys.executable, "-m", "flint_engine.cli", "capacity"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "FLINT_MMA_READY_CODES": "yes"},
    )  # fmt: skip
    assert r.returncode == 2 and "error: FLINT_MMA_READY_CODES must be auto, 0, 1 or replace" in r.stderr
    assert "Traceback" not in r.stderr
    r = _flint("capacity", "--ready-scales", "beside")
    assert r.returncode == 2 and "invalid choice: 'beside'" in r.stderr


def test_meta_only_reports_the_real_model_size() -> None:
    r = _flint("make-checkpoint", "--preset", "full", "--format", "nvfp4", "--meta-only")
    assert r.returncode == 0, r.stderr
    assert "39,785,287,456" in r.stdout
    size_line = next(line for line in r.stdout.splitlines() if "file size" in line)
    gb = float(size_line.split("(")[1].split(" GB")[0])
    assert 22.8 <= gb <= 23.0


def test_cli_make_convert_inspect(tmp_path: Path) -> None:
    hf_dir = tmp_path / "hf"
    r = _flint(
        "make-checkpoint",
        "--preset",
        "tiny",
        "--format",
        "hf",
        "--out",
        str(hf_dir),
        "--nvfp4-values",
        "--seed",
        "4",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "c.gguf"
    r = _flint("convert", str(hf_dir), "--to", "nvfp4", "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    assert_identical(logits_of(out), logits_of(hf_dir))
    r = _flint("inspect", str(out))
    assert r.returncode == 0 and json.loads(r.stdout)["tensor_types"]["NVFP4"] > 0
    r = _flint("inspect", str(tmp_path / "missing.gguf"))
    assert r.returncode == 1 and "no such file" in r.stderr
