"""Compile, in parallel, the Triton kernels a start-up will meet, from a manifest of their specialisations.

Without it a cold start compiles each kernel variant when the warm-up first launches it, one after another (about
a second each; ~2 minutes for the full-size model on an H200). A manifest lists those variants as Triton's own
specialisation records (what `JITFunction.preload` takes), recorded from a start-up on the same kind of GPU: the
engine hands them to a thread pool under Triton's `AsyncCompileMode` (its compiler passes release the GIL) before
its warm-up, and the warm-up then finds every listed kernel compiled.

The manifest only saves time. An entry that does not fit this machine (another Triton, a kernel whose signature
has changed since it was recorded) fails to compile and is skipped; the warm-up compiles whatever is missing as it
would without a manifest, and `Recorder` lists what that was.

Which manifest: `kernels/precompile/<device key>.json` (package data), the device key and its shorter prefixes as
for the tuning tables (`tuning.device_key`); `FLINT_PRECOMPILE_FILE=<path>` names another file, and an empty
value turns the manifest off. Entries are grouped by profile (the model's shapes and weight format, which the
caller names), so one file serves every model that runs on that GPU.

Schema: {"format": 1, "triton": "<version it was recorded with>", "device": "<torch device name>",
"profiles": {"<profile>": [{"kernel": "<module>.<qualname>", "spec": {<Triton's specialisation record>}}, ...]}}.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import tuning

log = logging.getLogger(__name__)

MANIFESTS = Path(__file__).resolve().parent / "precompile"
ENV = "FLINT_PRECOMPILE_FILE"
FORMAT = 1
# Options that name paths on the machine that recorded them; this machine's backend fills its own.
_MACHINE_OPTIONS = ("extern_libs",)


@dataclass(frozen=True)
class Entry:
    kernel: str  # "<module>.<qualname>" of the @triton.jit function
    spec: dict[str, Any]  # Triton's specialisation record (serialize_specialization_data), as JSON

    @property
    def key(self) -> str:
        return str(self.spec.get("key", ""))


@dataclass
class Report:
    listed: int = 0
    compiled: int = 0  # now in the kernel's in-process cache (compiled or loaded from Triton's disk cache)
    present: int = 0  # already in the in-process cache before
    failed: int = 0  # did not resolve, load or compile here (skipped)
    seconds: float = 0.0
    workers: int = 0
    errors: list[str] = field(default_factory=list)  # the first few, for the log

    def describe(self) -> str:
        return (
            f"precompiled {self.compiled} of {self.listed} listed Triton kernels in {self.seconds:.1f} s on"
            f" {self.workers} threads ({self.present} already compiled, {self.failed} skipped)"
        )


def manifest_path(device: torch.device | str | None = None) -> Path | None:
    """The manifest for `device`: `$FLINT_PRECOMPILE_FILE` when set (None when empty), else the shipped one."""
    override = os.environ.get(ENV)
    if override is not None:
        return Path(override) if override else None
    for name in tuning.table_names(tuning.device_key(device)):
        path = MANIFESTS / f"{name}.json"
        if path.is_file():
            return path
    return None


def load(path: Path | str, profile: str) -> list[Entry]:
    """The entries of `profile` in the manifest at `path` (a missing profile: none)."""
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("profiles"), dict):
        raise ValueError(f"{path}: not a Flint kernel manifest of format {FORMAT}")
    return [Entry(e["kernel"], e["spec"]) for e in raw["profiles"].get(profile, [])]


def save(path: Path | str, profile: str, entries: list[Entry], device_name: str, triton_version: str = "") -> int:
    """Add `entries` to `profile` in the manifest at `path` (created if missing); returns the profile's count.

    Recordings merge: starts with other settings (graph sizes, budgets) add their variants. To drop stale entries
    after kernels changed, delete the file and record again. `triton_version`: the recording's (default: ours).
    """
    import triton

    path = Path(path)
    raw: dict[str, Any] = {"format": FORMAT, "profiles": {}}
    if path.is_file():
        raw = json.loads(path.read_text())
    known = [Entry(e["kernel"], e["spec"]) for e in raw["profiles"].get(profile, [])]
    unique = {(e.kernel, e.key): e for e in [*known, *entries]}
    raw.update({"format": FORMAT, "triton": triton_version or triton.__version__, "device": device_name})
    raw["profiles"][profile] = [
        {"kernel": e.kernel, "spec": _portable(e.spec)} for (_, _), e in sorted(unique.items(), key=lambda kv: kv[0])
    ]
    raw["profiles"] = dict(sorted(raw["profiles"].items()))
    # One entry per line: a re-recorded manifest diffs by kernel.
    lines = [f'{{"format": {FORMAT}, "triton": {json.dumps(raw["triton"])}, "device": {json.dumps(device_name)},']
    lines.append(' "profiles": {')
    for i, (name, items) in enumerate(raw["profiles"].items()):
        lines.append(f"  {json.dumps(name)}: [")
        # Never sort keys: a record's signature lists the kernel's parameters in their order.
        lines += [f"   {json.dumps(item)}{',' if j < len(items) - 1 else ''}" for j, item in enumerate(items)]
        lines.append(f"  ]{',' if i < len(raw['profiles']) - 1 else ''}")
    lines.append(" }}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return len(unique)


def _portable(spec: dict[str, Any]) -> dict[str, Any]:
    options = {k: v for k, v in spec.get("options", {}).items() if k not in _MACHINE_OPTIONS}
    return {**spec, "options": options}


def _resolve(kernel: str) -> Any:
    """The JITFunction named "<module>.<qualname>" (through any decorator that wraps it as `.fn`)."""
    from triton.runtime.jit import JITFunction

    module, _, name = kernel.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{kernel} is not a Triton kernel")
    return obj


def check(entry: Entry) -> Any:
    """The entry's JITFunction; raises when the kernel is gone or its parameters differ from the recorded ones."""
    fn = _resolve(entry.kernel)
    recorded = list(entry.spec.get("signature", {}))
    current = [p.name for p in fn.params]
    if recorded != current:
        raise ValueError(f"recorded for parameters {recorded}, the kernel now has {current}")
    return fn


def _cached(fn: Any, device_index: int, key: str) -> Any:
    caches = getattr(fn, "device_caches", None)
    if caches is None or device_index not in caches:
        return None
    return caches[device_index][0].get(key)


def precompile(entries: list[Entry], device: torch.device, workers: int | None = None) -> Report:
    """Compile `entries` for `device` on a thread pool; every failure is counted and skipped, never raised."""
    import triton

    report = Report(listed=len(entries))
    start = time.monotonic()
    todo: list[tuple[Any, Entry]] = []
    for entry in entries:
        try:
            todo.append((check(entry), entry))
        except Exception as exc:  # a stale entry: the warm-up compiles what it needs
            _failed(report, entry, exc)
    if todo and hasattr(triton, "AsyncCompileMode"):
        index = device.index if device.index is not None else torch.cuda.current_device()
        report.workers = workers or _default_workers()
        submitted: list[tuple[Any, Entry]] = []
        with torch.cuda.device(index), ThreadPoolExecutor(report.workers, thread_name_prefix="triton") as pool:
            with triton.AsyncCompileMode(pool, ignore_errors=True):
                for fn, entry in todo:
                    if _cached(fn, index, entry.key) is not None:
                        report.present += 1
                        continue
                    try:
                        fn.preload(json.dumps(entry.spec))
                        submitted.append((fn, entry))
                    except Exception as exc:
                        _failed(report, entry, exc)
            # Leaving the mode waited for every compile; a failed one is no longer in the cache.
            for fn, entry in submitted:
                if _cached(fn, index, entry.key) is not None:
                    report.compiled += 1
                else:
                    _failed(report, entry, RuntimeError("did not compile here"))
    report.seconds = time.monotonic() - start
    return report


def run(device: torch.device, profile: str) -> Report | None:
    """Compile in parallel what the manifest for `device` lists for `profile` (None: no usable manifest here)."""
    path = manifest_path(device)
    if path is None:
        log.info("no kernel manifest for %s: the warm-up compiles its kernels one by one", tuning.device_key(device))
        return None
    try:
        entries = load(path, profile)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("kernel manifest %s unreadable (%s): the warm-up compiles its kernels one by one", path, exc)
        return None
    report = precompile(entries, device)
    listed = "" if entries else ": not listed, the warm-up compiles its kernels one by one"
    log.info("%s (%s, profile %s%s)", report.describe(), path.name, profile, listed)
    for error in report.errors:
        log.info("precompile skipped %s", error)
    return report


def _default_workers() -> int:
    """One compile per usable CPU, at most 16 (each holds a Triton/LLVM pipeline in memory)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(16, usable))


def _failed(report: Report, entry: Entry, exc: BaseException) -> None:
    report.failed += 1
    if len(report.errors) < 5:
        report.errors.append(f"{entry.kernel}: {type(exc).__name__}: {str(exc)[:200]}")
    log.debug("precompile: skipped %s (%s)", entry.kernel, exc)


class Recorder:
    """While active, lists each Triton kernel specialisation this process compiles (or loads from disk) at launch.

    A context manager around Triton's process-wide `jit_cache_hook`, chaining any hook installed before it;
    `entries` are what a manifest needs to precompile them next time.
    """

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._previous: Any = None
        self._knobs: Any = None
        self._lock = threading.Lock()

    def _hook(self, **kwargs: Any) -> Any:
        if not kwargs.get("is_manual_warmup", False):
            info, spec = kwargs.get("fn"), (kwargs.get("compile") or {}).get("specialization_data")
            jit = getattr(info, "jit_function", None)
            if jit is not None and spec:
                name = f"{jit.fn.__module__}.{jit.fn.__qualname__}"
                with self._lock:
                    self.entries.append(Entry(name, json.loads(spec)))
        return self._previous(**kwargs) if self._previous is not None else None

    def __enter__(self) -> Recorder:
        try:
            from triton import knobs
        except ImportError:
            return self
        runtime = getattr(knobs, "runtime", None)
        if hasattr(runtime, "jit_cache_hook"):
            self._knobs = runtime
            self._previous = runtime.jit_cache_hook
            runtime.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        if self._knobs is not None:
            self._knobs.jit_cache_hook = self._previous
            self._knobs = None
