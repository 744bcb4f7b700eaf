"""Write Flint GGUF checkpoints (F32, BF16 or NVFP4) tensor by tensor, with config, tokenizer and chat template.

NVFP4 follows the official file's policy by default: every linear layer (lm_head included) is NVFP4 with an F32
`.scale` companion; the embedding stays BF16 and norms, sinks and router F32. `nvfp4_scope="experts"` writes the
third-party policy (routed experts only).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flint_kernels import nvfp4
from flint_kernels.linear import NVFP4Weight
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from tqdm import tqdm

from ..config import GGUF_ARCH, FlintConfig
from .random_tensors import TensorProvider, nvfp4_encodable
from .tensor_plan import EMBED, EXPERTS, LINEAR, TensorSpec, checkpoint_plan

log = logging.getLogger(__name__)

FORMATS = ("f32", "bf16", "nvfp4")
_ALIGN = 32
_F32, _BF16, _NVFP4 = GGMLQuantizationType.F32, GGMLQuantizationType.BF16, GGMLQuantizationType.NVFP4


@dataclass
class PlannedTensor:
    name: str
    spec: TensorSpec | None  # None for a `.scale` companion
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # torch order
    nbytes: int


@dataclass
class GGUFSummary:
    path: str | None
    parameters: int
    file_bytes: int
    tensor_types: dict[str, int] = field(default_factory=dict)


def tensor_type(spec: TensorSpec, fmt: str, nvfp4_scope: str = "all") -> GGMLQuantizationType:
    if fmt == "f32":
        return _F32
    if spec.role in (LINEAR, EXPERTS, EMBED):
        in_scope = nvfp4_scope == "all" or spec.role == EXPERTS
        if fmt == "nvfp4" and spec.role != EMBED and nvfp4_encodable(spec) and in_scope:
            return _NVFP4
        return _BF16
    return _F32  # norms, sinks, router


def _nbytes(shape: tuple[int, ...], t: GGMLQuantizationType) -> int:
    n = int(np.prod(shape))
    if t == _NVFP4:
        return n // nvfp4.QK * nvfp4.BLOCK_BYTES
    return n * (4 if t == _F32 else 2)


def plan_tensors(
    config: FlintConfig, fmt: str, nvfp4_scope: str = "all", scale_companions: bool = True
) -> list[PlannedTensor]:
    if fmt not in FORMATS:
        raise ValueError(f"GGUF format must be one of {FORMATS}, got {fmt!r}")
    out = []
    for spec in checkpoint_plan(config):
        t = tensor_type(spec, fmt, nvfp4_scope)
        out.append(PlannedTensor(spec.gguf, spec, t, spec.shape, _nbytes(spec.shape, t)))
        if t == _NVFP4 and scale_companions:
            scale_shape = spec.shape[:-2] if len(spec.shape) > 2 else (1,)
            name = spec.gguf.removesuffix(".weight") + ".scale"
            out.append(PlannedTensor(name, None, _F32, scale_shape, _nbytes(scale_shape, _F32)))
    return out


def _add_kv(w: GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value) if 0 <= value < 2**32 else w.add_int64(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, bool) for v in value):
            w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)
        elif value and all(isinstance(v, int) for v in value):
            w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
        else:
            w.add_array(key, list(value))
    else:
        raise TypeError(f"cannot store metadata {key}={value!r} in GGUF")


def gguf_metadata(
    config: FlintConfig, fmt: str, tokenizer: Any | None, generation: dict[str, Any] | None, name: str
) -> dict[str, Any]:
    file_type = {"f32": LlamaFileType.ALL_F32, "bf16": LlamaFileType.MOSTLY_BF16, "nvfp4": LlamaFileType.MOSTLY_NVFP4}
    meta: dict[str, Any] = {
        "general.name": name,
        "general.file_type": int(file_type[fmt]),
        "general.quantization_version": 2,
    }
    meta.update(config.to_gguf_metadata())
    gen = generation or {}
    for src, key in (
        ("temperature", "general.sampling.temp"),
        ("top_p", "general.sampling.top_p"),
        ("top_k", "general.sampling.top_k"),
        ("min_p", "general.sampling.min_p"),
    ):
        if gen.get(src) is not None:
            meta[key] = float(gen[src]) if src != "top_k" else int(gen[src])
    if tokenizer is not None:
        meta.update(tokenizer.to_gguf_metadata())
    return meta


def _to_array(
    w: torch.Tensor | NVFP4Weight, p: PlannedTensor, scale_companion: bool
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The tensor's file bytes, plus the data of its `.scale` companion when it is NVFP4 and has one."""
    if p.ggml_type == _NVFP4:
        lead = p.shape[:-2]
        if isinstance(w, NVFP4Weight):
            q, s, g = w.qweight, w.scales, w.global_scale.reshape(lead) if lead else w.global_scale.reshape(())
            if len(w.segments) != 1:
                raise ValueError(f"{p.name}: a fused NVFP4 weight cannot be written as one GGUF tensor")
        else:
            wf = w.to(torch.float32)
            if scale_companion:
                amax = wf.abs().amax(dim=(-2, -1)) if lead else wf.abs().amax()
                g = nvfp4.choose_global_scale(amax, power_of_two=True)
            else:
                g = torch.ones(lead)
            q, s = nvfp4.quantize(wf, g)
        if not scale_companion:
            if not bool((g == 1).all()):
                raise ValueError(f"{p.name}: global scale is not 1.0, so its .scale companion cannot be left out")
            return nvfp4.engine_to_gguf_blocks(q, s).cpu().numpy(), []
        blocks = nvfp4.engine_to_gguf_blocks(q, s).cpu().numpy()
        return blocks, [g.reshape(-1).to(torch.float32).cpu().numpy()]
    dense = w.dequantize(torch.float32, with_global=True) if isinstance(w, NVFP4Weight) else w
    if p.ggml_type == _F32:
        return dense.to(torch.float32).cpu().contiguous().numpy(), []
    return dense.to(torch.bfloat16).cpu().contiguous().view(torch.int16).numpy().view(np.uint16), []


def write_gguf(
    path: str | os.PathLike[str] | None,
    config: FlintConfig,
    provider: TensorProvider | None,
    fmt: str = "bf16",
    tokenizer: Any | None = None,
    generation: dict[str, Any] | None = None,
    nvfp4_scope: str = "all",
    scale_companions: bool = True,
    name: str = "flint",
    progress: bool = True,
) -> GGUFSummary:
    """Stream a checkpoint to `path`. With `path=None` only measure it: the header is built for real and the
    tensor data sizes are added, so a 23 GB file is sized without writing it."""
    planned = plan_tensors(config, fmt, nvfp4_scope, scale_companions)
    meta = gguf_metadata(config, fmt, tokenizer, generation, name)
    counts: dict[str, int] = {}
    for p in planned:
        counts[p.ggml_type.name] = counts.get(p.ggml_type.name, 0) + 1
    target = str(path) if path is not None else None
    tmp = None
    if target is None:
        fd, tmp = tempfile.mkstemp(suffix=".gguf")
        os.close(fd)
    out_path = target or tmp
    w = GGUFWriter(out_path, arch=GGUF_ARCH)
    try:
        for key, value in meta.items():
            if key == "general.architecture":
                continue
            _add_kv(w, key, value)
        for p in planned:
            if p.ggml_type == _NVFP4:
                byte_shape = (*p.shape[:-1], p.shape[-1] // nvfp4.QK * nvfp4.BLOCK_BYTES)
                w.add_tensor_info(p.name, byte_shape, np.dtype(np.uint8), p.nbytes, raw_dtype=_NVFP4)
            elif p.ggml_type == _BF16:
                w.add_tensor_info(p.name, p.shape, np.dtype(np.uint16), p.nbytes, raw_dtype=_BF16)
            else:
                w.add_tensor_info(p.name, p.shape, np.dtype(np.float32), p.nbytes)
        w.write_header_to_file(path=Path(out_path))
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        header_bytes = w.fout[0].tell()  # type: ignore[index]
        data_bytes = sum(-(-p.nbytes // _ALIGN) * _ALIGN for p in planned)
        file_bytes = -(-header_bytes // _ALIGN) * _ALIGN + data_bytes
        if target is not None:
            if provider is None:
                raise ValueError("a tensor provider is needed to write tensor data")
            for data in _stream(planned, provider, progress, scale_companions):
                w.write_tensor_data(data)
            file_bytes = w.fout[0].tell()  # type: ignore[index]
    finally:
        w.close()
        if tmp is not None:
            os.unlink(tmp)
    if target is not None:
        log.info("wrote %s (%s, %.3f GB)", target, fmt, file_bytes / 1e9)
    return GGUFSummary(target, config.parameter_count(), file_bytes, counts)


def _stream(
    planned: list[PlannedTensor], provider: TensorProvider, progress: bool, scale_companions: bool
) -> Iterator[np.ndarray]:
    total = sum(p.nbytes for p in planned)
    pending: list[np.ndarray] = []
    with tqdm(total=total, unit="B", unit_scale=True, desc="writing gguf", disable=not progress, leave=False) as bar:
        for p in planned:
            if p.spec is None:
                data = pending.pop(0)  # the companion of the NVFP4 tensor just written
            else:
                data, companions = _to_array(provider(p.spec), p, scale_companions)
                pending.extend(companions)
            assert data.nbytes == p.nbytes, (p.name, data.nbytes, p.nbytes)
            bar.update(p.nbytes)
            yield data
