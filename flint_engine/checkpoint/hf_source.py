"""Hugging Face safetensors checkpoints: the released layout (per-expert tensors, `self_attn.softmax_offset`) and the
fused forms transformers can also hold (`mlp.experts.gate_up_proj`, `self_attn.sinks`). Tensors are read one at a
time from the memory-mapped files and copied straight to the target device."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..config import ConfigError, FlintConfig
from .errors import CheckpointError
from .tensor_plan import EXPERTS, TensorSpec

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


class HFSource:
    format_name = "hf-safetensors"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        root = Path(path)
        try:
            self.config = FlintConfig.from_hf_dir(root)
        except ConfigError as exc:
            raise CheckpointError(str(exc), path=str(root / "config.json")) from exc
        files = self._shard_files(root)
        self._handles: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        for f in files:
            try:
                h = safe_open(str(f), framework="pt", device="cpu")
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"unreadable safetensors file: {exc}", path=str(f)) from exc
            self._handles[str(f)] = h
            for name in h.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                self._where[name] = str(f)

    @staticmethod
    def _shard_files(root: Path) -> list[Path]:
        index = root / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise CheckpointError(f"bad safetensors index: {exc}", path=str(index)) from exc
            files = sorted({root / f for f in weight_map.values()})
            missing = [f for f in files if not f.is_file()]
            if missing:
                raise CheckpointError("shard listed in the index is missing", path=str(missing[0]))
            return files
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise CheckpointError("no *.safetensors files", path=str(root))
        return files

    def has(self, name: str) -> bool:
        return name in self._where

    def _shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._where[name]].get_slice(name).get_shape())

    def _read(self, name: str) -> torch.Tensor:
        try:
            t = self._handles[self._where[name]].get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"cannot read tensor data: {exc}", tensor=name, path=self._where[name]) from exc
        if t.dtype not in _FLOAT:
            raise CheckpointError(
                f"unsupported dtype {t.dtype} (expected F32, F16 or BF16)", tensor=name, path=self._where[name]
            )
        return t

    def _check_shape(self, name: str, expected: tuple[int, ...]) -> None:
        shape = self._shape(name)
        if shape != expected:
            raise CheckpointError(
                f"shape {list(shape)} does not match the expected {list(expected)}", tensor=name, path=self._where[name]
            )

    def is_nvfp4(self, spec: TensorSpec) -> bool:
        """Safetensors checkpoints hold float tensors only (NVFP4 comes as GGUF)."""
        return False

    def nbytes(self, spec: TensorSpec) -> int:
        n = 1
        for d in spec.shape:
            n *= d
        return n * 2

    def load(self, spec: TensorSpec, device: torch.device) -> torch.Tensor:
        if spec.role == EXPERTS:
            return self._load_experts(spec, device)
        for name in (spec.hf, *spec.hf_alt):
            if self.has(name):
                self._check_shape(name, spec.shape)
                return self._read(name).to(device)
        raise CheckpointError("missing tensor", tensor=spec.hf, path=self.path)

    def _load_experts(self, spec: TensorSpec, device: torch.device) -> torch.Tensor:
        e = spec.shape[0]
        if self.has(spec.hf.format(e=0)):
            first = self._read(spec.hf.format(e=0))
            out = torch.empty(spec.shape, dtype=first.dtype, device=device)
            for i in range(e):
                name = spec.hf.format(e=i)
                if not self.has(name):
                    raise CheckpointError("missing tensor", tensor=name, path=self.path)
                self._check_shape(name, spec.shape[1:])
                out[i].copy_(self._read(name))
            return out
        fused = spec.hf_alt[0]
        if not self.has(fused):
            raise CheckpointError("missing tensor", tensor=spec.hf.format(e=0), path=self.path)
        if fused.endswith("gate_up_proj"):
            expected = (e, 2 * spec.shape[1], spec.shape[2])
            self._check_shape(fused, expected)
            half = spec.shape[1]
            part = slice(0, half) if spec.key.endswith(".gate") else slice(half, 2 * half)
            return self._read(fused)[:, part, :].to(device)
        self._check_shape(fused, spec.shape)
        return self._read(fused).to(device)

    def read_json(self, name: str) -> dict[str, Any] | None:
        p = Path(self.path) / name
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"invalid JSON: {exc}", path=str(p)) from exc
