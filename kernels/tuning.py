"""Per-device tuning tables: the launch parameters a GPU model measured best, read by the kernels' config functions.

Each kernel module computes a portable default for every call (the baseline that must run on any GPU, Ampere to
Blackwell) and asks `tuned(op, default, device, **shape)`, which returns the default with the fields of the first
matching table entry replaced; `lookup` returns that entry itself. No table or no matching entry: the default.

Which table: the device is named by a key made from `torch.cuda.get_device_name` (lower case, every run of other
characters than a-z and 0-9 becomes "-": "NVIDIA H200" -> "nvidia-h200"; "cpu" for anything not CUDA). The
table is `kernels/tuning/<key>.json` (package data of `flint_kernels`); without one, the key's shorter dash
prefixes are tried down to two parts ("nvidia-h200-nvl" -> "nvidia-h200"), then a measured sibling's (`SIBLINGS`:
an H100 takes the H200's table). `FLINT_TUNING_FILE=<path>` replaces
the table on every device (the empty table `{}` gives the code defaults). Tables are read once per process and
results are remembered per launch shape, so a lookup costs a few dict operations.

Schema (a JSON object; `benchmarks/tune.py` writes one from measurements):

    {
      "device": "NVIDIA H200",                       # optional: the torch device name it was measured on
      "<op>": [                                      # one list per tuned op (OPS below); first match wins
        {
          "when": {"m": 1, "nvfp4": true, "k_multiple": 2048},   # optional; absent or {} matches every shape
          "config": {"block_n": 8, "block_k": 2048},           # the fields to set; others keep the default
          "source": "2026-11-29, NVIDIA H200, python benchmarks/...: what was measured"
        }
      ]
    }

A condition on shape key x is `"x": v` (equal), `"x_min": v` / `"x_max": v` (inclusive bounds) or
`"x_multiple": d` (x > 0 and divisible by d). Config fields are the op's dataclass fields (`configs.py`), with its
types; fields marked POW2 there (block sizes, warp counts) must be powers of two. Anything else (an unknown op,
condition, field or key, a wrong type, a duplicate key, invalid JSON) raises `TuningError` naming the file and the
entry when the table loads, which is at the first kernel call that consults it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from .configs import (
    AttentionDecodeConfig,
    AttentionPrefillConfig,
    MoEConfig,
    MoEPaths,
    MoETmaConfig,
    RouterSmallConfig,
    RouterTilesConfig,
    TileConfig,
    WeightsAheadConfig,
)

TABLES = Path(__file__).resolve().parent / "tuning"
ENV = "FLINT_TUNING_FILE"
# A GPU without a table of its own uses that of a measured GPU of the same chip: the H100 is the H200's (sm_90, 132
# SMs and 50 MB of L2 on the SXM part; less and slower memory). On an H100 80GB HBM3 (fortieth session) the NVFP4
# decode step at 32 sequences took 9.66 ms under the H200's table against 14.6 ms under the code defaults.
SIBLINGS = {"nvidia-h100": "nvidia-h200"}
C = TypeVar("C")


@dataclass(frozen=True)
class Op:
    """A tunable launch: its config dataclass and the shape keys (with types) its entries may test."""

    config: type
    shape: dict[str, type]


OPS: dict[str, Op] = {
    # The linear kernel (gemv_triton) at 1 <= M <= 64 (GEMV, split-K) and above.
    "gemv.small_m": Op(TileConfig, {"m": int, "n": int, "k": int, "nvfp4": bool}),
    "gemv.large_m": Op(TileConfig, {"m": int, "n": int, "k": int, "nvfp4": bool}),
    # MoE (moe_triton): path limits per format, per-pair decode tiles, grouped-GEMM tiles.
    "moe.paths": Op(MoEPaths, {"nvfp4": bool}),
    "moe.decode": Op(MoEConfig, {"tokens": int, "nvfp4": bool}),
    "moe.grouped": Op(MoEConfig, {"pairs_per_expert": float, "nvfp4": bool}),
    "moe.grouped_tma": Op(MoETmaConfig, {"pairs_per_expert": float, "nvfp4": bool}),
    # Paged attention (attention_triton): context is the batch's longest sequence, sliding a windowed layer.
    # elem_bytes: the cache's element size (tiles tuned in BF16 can overflow shared memory in FP32).
    "attention.decode": Op(AttentionDecodeConfig, {"seqs": int, "context": int, "sliding": bool, "elem_bytes": int}),
    "attention.prefill": Op(AttentionPrefillConfig, {"tokens": int, "sliding": bool, "elem_bytes": int}),
    # The small-batch router (router_triton, up to its SMALL_BATCH tokens): how its top-k runs.
    "router.small": Op(RouterSmallConfig, {"tokens": int, "experts": int}),
    # The many-token router (router_triton's tensor-core tiles, above its small-batch limit).
    "router.tiles": Op(RouterTilesConfig, {"tokens": int, "experts": int}),
    # A decode graph's side stream asking L2 for the next weights (l2_prefetch); tokens: the step's batch.
    "weights_ahead": Op(WeightsAheadConfig, {"tokens": int, "nvfp4": bool}),
}
TESTS = ("min", "max", "multiple")
MEMO_LIMIT = 4096


class TuningError(ValueError):
    """A tuning table that cannot be used as written."""


@dataclass(frozen=True)
class Entry:
    """One validated table entry: conditions (key, test, value), the fields to set, where the numbers came from."""

    when: tuple[tuple[str, str, Any], ...]
    config: dict[str, Any]
    source: str

    def matches(self, shape: dict[str, Any]) -> bool:
        """Whether every condition holds for `shape`."""
        for key, test, want in self.when:
            have = shape[key]
            if test == "eq":
                ok = have == want
            elif test == "min":
                ok = have >= want
            elif test == "max":
                ok = have <= want
            else:
                ok = have > 0 and have % want == 0
            if not ok:
                return False
        return True


@dataclass(frozen=True)
class Table:
    """A loaded table: entries per op, and the file it came from (None: no table)."""

    path: Path | None
    ops: dict[str, tuple[Entry, ...]]
    # Results of `tuned` by (op, default, shape): a repeated launch shape costs one dict lookup.
    memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


EMPTY = Table(None, {})


def slug(name: str) -> str:
    """A device name as a table key: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@functools.cache
def _cuda_key(index: int) -> str:
    return slug(torch.cuda.get_device_name(index))


@functools.cache
def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_key(device: torch.device | str | None = None) -> str:
    """The table key of `device` (None: the current CUDA device, or the CPU without one)."""
    dev = device if isinstance(device, torch.device) else _default_device() if device is None else torch.device(device)
    if dev.type != "cuda":
        return "cpu"
    return _cuda_key(dev.index if dev.index is not None else torch.cuda.current_device())


def table_names(key: str) -> list[str]:
    """The table names tried for `key`: itself, then shorter dash prefixes down to two parts, then their siblings'."""
    parts = key.split("-")
    names = ["-".join(parts[:n]) for n in range(len(parts), min(2, len(parts)) - 1, -1)]
    return names + [SIBLINGS[name] for name in names if name in SIBLINGS]


def table(device: torch.device | str | None = None) -> Table:
    """The table that applies to `device`: FLINT_TUNING_FILE, else the shipped one for its key, else none."""
    override = os.environ.get(ENV)
    if override:
        return load(override)
    return _shipped(device_key(device))


@functools.cache
def _shipped(key: str) -> Table:
    for name in table_names(key):
        path = TABLES / f"{name}.json"
        if path.is_file():
            return load(path)
    return EMPTY


def lookup(op: str, device: torch.device | str | None = None, **shape: Any) -> Entry | None:
    """The first entry of `op` in the device's table whose conditions hold for `shape`, or None."""
    for entry in table(device).ops.get(op, ()):
        if entry.matches(shape):
            return entry
    return None


def tuned(op: str, default: C, device: torch.device | str | None = None, **shape: Any) -> C:
    """`default` with the fields of the first matching entry of `op` set (`default` itself when none matches)."""
    tab = table(device)
    entries = tab.ops.get(op)
    if not entries:
        return default
    key = (op, default, *shape.items())
    hit = tab.memo.get(key)
    if hit is None:
        entry = next((e for e in entries if e.matches(shape)), None)
        hit = default if entry is None else dataclasses.replace(default, **entry.config)
        if len(tab.memo) >= MEMO_LIMIT:  # shapes such as decode context lengths keep coming: stay bounded
            tab.memo.clear()
        tab.memo[key] = hit
    return hit


def reload() -> None:
    """Forget loaded tables and device names (for tools that rewrite a table in place)."""
    load.cache_clear()
    _shipped.cache_clear()
    _cuda_key.cache_clear()


# ------------------------------------------------------------------------------------------------- loading
def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise TuningError(f"duplicate key {key!r}")
        out[key] = value
    return out


@functools.cache
def load(path: Path | str) -> Table:
    """Read and validate a table file (cached per path)."""
    try:
        raw = json.loads(Path(path).read_text(), object_pairs_hook=_no_duplicates)
    except FileNotFoundError:
        raise TuningError(f"{path}: no such tuning table ({ENV}={os.environ.get(ENV, '')!r})") from None
    except (json.JSONDecodeError, TuningError) as e:
        raise TuningError(f"{path}: not a valid JSON table: {e}") from None
    return Table(Path(path), parse(raw, str(path)))


def parse(raw: Any, where: str = "<table>") -> dict[str, tuple[Entry, ...]]:
    """Validate a table's JSON value; `where` names it in errors."""
    if not isinstance(raw, dict):
        raise TuningError(f"{where}: a table is a JSON object, got {type(raw).__name__}")
    ops = {}
    for name, entries in raw.items():
        if name == "device":
            if not isinstance(entries, str):
                raise TuningError(f"{where}: 'device' must be a string")
            continue
        if name not in OPS:
            raise TuningError(f"{where}: unknown op {name!r} (ops: {', '.join(OPS)})")
        if not isinstance(entries, list):
            raise TuningError(f"{where}: {name} must be a list of entries")
        ops[name] = tuple(_entry(OPS[name], e, f"{where}: {name}[{i}]") for i, e in enumerate(entries))
    return ops


def _entry(op: Op, raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise TuningError(f"{where}: an entry is an object with 'when', 'config' and 'source'")
    unknown = set(raw) - {"when", "config", "source"}
    if unknown:
        raise TuningError(f"{where}: unknown key(s) {sorted(unknown)} (an entry has 'when', 'config', 'source')")
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        raise TuningError(f"{where}: 'source' (date, GPU, command that measured it) is required")
    when = raw.get("when", {})
    config = raw.get("config")
    if not isinstance(when, dict):
        raise TuningError(f"{where}: 'when' must be an object")
    if not isinstance(config, dict) or not config:
        raise TuningError(f"{where}: 'config' must be an object setting at least one field")
    return Entry(tuple(_condition(op, k, v, where) for k, v in when.items()), _config(op, config, where), source)


def _condition(op: Op, key: str, value: Any, where: str) -> tuple[str, str, Any]:
    name, test = key, "eq"
    if key not in op.shape and "_" in key:
        name, test = key.rsplit("_", 1)
    kind = op.shape.get(name)
    if kind is None or test not in ("eq", *TESTS):
        tests = ", ".join(f"x_{t}" for t in TESTS)
        raise TuningError(f"{where}: unknown condition {key!r} (shape keys: {', '.join(op.shape)}; also {tests})")
    if test == "eq":
        ok = _fits(value, kind)
    elif test == "multiple":
        ok = kind is int and _fits(value, int) and value > 0
    else:
        ok = kind is not bool and _fits(value, float)
    if not ok:
        raise TuningError(f"{where}: condition {key!r}: {value!r} does not fit {name} ({kind.__name__})")
    return name, test, value


def _config(op: Op, config: dict[str, Any], where: str) -> dict[str, Any]:
    cls = op.config
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for name, value in config.items():
        if name not in fields:
            raise TuningError(f"{where}: unknown field {name!r} for {cls.__name__} (fields: {', '.join(fields)})")
        if not _fits(value, hints[name]):
            raise TuningError(f"{where}: field {name!r}: {value!r} is not {_type_name(hints[name])}")
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise TuningError(f"{where}: field {name!r}: {value} is negative")
        if fields[name].metadata.get("power_of_two") and (value < 1 or value & (value - 1)):
            raise TuningError(f"{where}: field {name!r}: {value} is not a power of two")
    return dict(config)


def _fits(value: Any, kind: Any) -> bool:
    """Whether a JSON value fits a field type: bool, int (not bool), float (int too), None, or a union of those."""
    if isinstance(kind, types.UnionType):
        return any(_fits(value, k) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def _type_name(kind: Any) -> str:
    if isinstance(kind, types.UnionType):
        return " or ".join(_type_name(k) for k in typing.get_args(kind))
    return "null" if kind is type(None) else kind.__name__
