"""GGUF checkpoints (llama.cpp's `flint` architecture): F32, F16, BF16 and NVFP4 tensors in any mix, memory-mapped.

NVFP4 tensors (ggml type 40) are repacked losslessly into the engine's W4A16 layout on the target device; their
optional F32 `<name>.scale` companion (one per tensor, or one per expert for stacked experts) becomes the global
scale, 1.0 when absent. Files that ask for FP4 activations (`general.tensor_extra.prec_a4`) are refused.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flint_kernels import nvfp4
from flint_kernels.linear import NVFP4Weight, Weight
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import quant_shape_to_byte_shape

from ..config import ConfigError, FlintConfig
from .errors import CheckpointError
from .tensor_plan import TensorSpec

log = logging.getLogger(__name__)

_FLOAT_TYPES = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}


class _CheckedReader(GGUFReader):
    """gguf's reader, with each tensor checked as it is mapped so a bad file names the bad tensor."""

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        tensors: list[ReaderTensor] = []
        names: set[str] = set()
        size = len(self.data)
        for fld in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = fld.parts
            name = str(bytes(name_data), encoding="utf-8", errors="replace")
            if name in names:
                raise CheckpointError("duplicate tensor name", tensor=name)
            names.add(name)
            try:
                ggml_type = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise CheckpointError(f"unknown GGML tensor type id {int(raw_dtype[0])}", tensor=name) from None
            if ggml_type not in GGML_QUANT_SIZES:
                raise CheckpointError(f"tensor type {ggml_type.name} has no known block size", tensor=name)
            n_elems = int(np.prod(dims))
            block, type_size = GGML_QUANT_SIZES[ggml_type]
            if int(dims[0]) % block:
                raise CheckpointError(
                    f"row length {int(dims[0])} is not a multiple of the {ggml_type.name} block of {block}", tensor=name
                )
            n_bytes = n_elems * type_size // block
            data_offs = int(start_offs + offset_tensor[0])
            if data_offs + n_bytes > size:
                raise CheckpointError(
                    f"file is truncated: the tensor's {n_bytes} bytes at offset {data_offs} run past the end of the"
                    f" {size}-byte file",
                    tensor=name,
                )
            np_dims = tuple(reversed(dims.tolist()))
            if ggml_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                item_type: Any = np.float32 if ggml_type == GGMLQuantizationType.F32 else np.float16
                data = self._get(data_offs, item_type, n_elems).reshape(np_dims)
            else:
                data = self._get(data_offs, np.uint8, n_bytes).reshape(quant_shape_to_byte_shape(np_dims, ggml_type))
            tensors.append(
                ReaderTensor(
                    name=name,
                    tensor_type=ggml_type,
                    shape=dims,
                    n_elements=n_elems,
                    n_bytes=n_bytes,
                    data_offset=data_offs,
                    data=data,
                    field=fld,
                )
            )
        self.tensors = tensors


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = fld.contents()
        except Exception as exc:  # a malformed field should name itself, not crash deep in numpy
            raise CheckpointError(f"metadata key '{key}' cannot be decoded: {exc}") from exc
    return meta


def open_gguf(path: str | os.PathLike[str]) -> GGUFReader:
    path = str(path)
    if not os.path.isfile(path):
        raise CheckpointError("no such file", path=path)
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise CheckpointError("not a GGUF file (bad magic)", path=path)
    try:
        return _CheckedReader(path)
    except CheckpointError as exc:
        exc.path = path
        raise CheckpointError(str(exc).rsplit(" (", 1)[0], tensor=exc.tensor, path=path) from None
    except Exception as exc:
        raise CheckpointError(f"corrupt or truncated GGUF header/metadata: {exc}", path=path) from exc


def _refuse_fp4_activations(meta: Mapping[str, Any], path: str) -> None:
    flags = meta.get("general.tensor_extra.prec_a4")
    if not flags:
        return
    names = meta.get("general.tensor_extra.name") or []
    flagged = [names[i] if i < len(names) else f"#{i}" for i, f in enumerate(flags) if f]
    if flagged:
        raise CheckpointError(
            f"the file asks for FP4 activations on {len(flagged)} tensors (e.g. {flagged[0]}); Flint Serve runs NVFP4"
            " weights with 16-bit activations (W4A16) only",
            tensor=str(flagged[0]),
            path=path,
        )


class GGUFSource:
    """Tensors of a GGUF checkpoint, read lazily from the memory map."""

    format_name = "gguf"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.reader = open_gguf(self.path)
        self.meta = read_metadata(self.reader)
        _refuse_fp4_activations(self.meta, self.path)
        try:
            self.config = FlintConfig.from_gguf_metadata(self.meta)
        except ConfigError as exc:
            raise CheckpointError(str(exc), path=self.path) from exc
        self.tensors = {t.name: t for t in self.reader.tensors}

    def tensor_types(self) -> dict[str, str]:
        return {n: t.tensor_type.name for n, t in self.tensors.items()}

    def nbytes(self, spec: TensorSpec) -> int:
        t = self.tensors.get(spec.gguf)
        return int(t.n_bytes) if t is not None else 0

    def is_nvfp4(self, spec: TensorSpec) -> bool:
        """Whether the tensor is stored as NVFP4 (from the header; nothing is read)."""
        t = self.tensors.get(spec.gguf)
        return t is not None and t.tensor_type == GGMLQuantizationType.NVFP4

    def _get(self, name: str) -> ReaderTensor:
        t = self.tensors.get(name)
        if t is None:
            raise CheckpointError("missing tensor", tensor=name, path=self.path)
        return t

    def load(self, spec: TensorSpec, device: torch.device) -> Weight:
        t = self._get(spec.gguf)
        shape = tuple(reversed([int(d) for d in t.shape]))
        if shape != spec.shape:
            raise CheckpointError(
                f"shape {list(shape)} does not match the expected {list(spec.shape)}", tensor=t.name, path=self.path
            )
        if t.tensor_type == GGMLQuantizationType.NVFP4:
            return self._load_nvfp4(t, spec, device)
        dtype = _FLOAT_TYPES.get(t.tensor_type)
        if dtype is None:
            raise CheckpointError(
                f"unsupported tensor type {t.tensor_type.name} (supported: F32, F16, BF16, NVFP4)",
                tensor=t.name,
                path=self.path,
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the memory map is read-only; we only copy out of it
            raw = torch.from_numpy(np.asarray(t.data))
        if dtype == torch.bfloat16:
            raw = raw.view(torch.uint8).view(torch.bfloat16)
        return raw.reshape(shape).to(device)

    def _load_nvfp4(self, t: ReaderTensor, spec: TensorSpec, device: torch.device) -> NVFP4Weight:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.asarray(t.data)).to(device)
        k = spec.shape[-1]
        try:
            qweight, scales = nvfp4.gguf_blocks_to_engine(raw.reshape(*spec.shape[:-1], -1), k)
        except nvfp4.NVFP4FormatError as exc:
            raise CheckpointError(str(exc), tensor=t.name, path=self.path) from exc
        lead = spec.shape[:-2]
        scale_name = t.name.removesuffix(".weight") + ".scale"
        st = self.tensors.get(scale_name)
        if st is None:
            g = torch.ones((*lead, 1), dtype=torch.float32, device=device)
        else:
            if st.tensor_type != GGMLQuantizationType.F32:
                raise CheckpointError(
                    f"scale companion must be F32, got {st.tensor_type.name}", tensor=scale_name, path=self.path
                )
            vals = torch.from_numpy(np.array(st.data, dtype=np.float32)).reshape(-1).to(device)
            count = int(np.prod(lead)) if lead else 1
            if vals.numel() == 1:
                g = vals.reshape(*([1] * len(lead)), 1).expand(*lead, 1).contiguous()
            elif vals.numel() == count:
                g = vals.reshape(*lead, 1)
            else:
                raise CheckpointError(
                    f"scale companion has {vals.numel()} values; expected 1 or {count}",
                    tensor=scale_name,
                    path=self.path,
                )
            if not bool(torch.isfinite(g).all()):
                raise CheckpointError("scale companion holds non-finite values", tensor=scale_name, path=self.path)
        return NVFP4Weight(qweight, scales, g, (spec.shape[-2],))
