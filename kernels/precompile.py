"""Compile, in parallel, the Triton kernels a start-up will meet, from a manifest of their specialisations.

Without it a cold start compiles each kernel variant when the warm-up first launches it, one after another (about
a second each; ~2 minutes for the full-size model on an H200). A manifest lists those variants as Triton's own
specialisation records (what `JITFunction.preload` takes), recorded from a start-up on the same kind of GPU. Before
its warm-up the engine compiles them in parallel, and the warm-up then finds every listed kernel compiled; from a
checkpoint file the compile starts from the file's header while the weights load (`start`). Two ways
(`FLINT_PRECOMPILE_MODE`): `processes` (default) runs worker processes that compile into Triton's disk cache, then
loads the results in-process; `threads` compiles on a thread pool under Triton's `AsyncCompileMode`, where the
Python front end of each compile holds the GIL (on an H200 host, 76 kernels took 49 s on 16 threads against ~110 s
one by one).

The manifest only saves time. An entry that does not fit this machine (another Triton, a kernel whose signature
has changed since it was recorded) fails to compile and is skipped; the warm-up compiles whatever is missing as it
would without a manifest, and `Recorder` lists what that was.

Which manifest: `kernels/precompile/<device key>.json` (package data), the device key and its shorter prefixes as
for the tuning tables (`tuning.device_key`); `FLINT_PRECOMPILE_FILE=<path>` names another file, and an empty
value turns the manifest off. Entries are grouped by profile (the model's shapes and weight format, which the
caller names), so one file serves every model that runs on that GPU.

Schema: {"format": 1, "triton": "<version it was recorded with>", "device": "<torch device name>",
"profiles": {"<profile>": [{"kernel": "<module>.<qualname>", "seconds": <its compile time in a worker, optional>,
"spec": {<Triton's specialisation record>}}, ...]}}.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import jit_cache_keys, tuning
from .jit_cache_hook import runtime_knobs

log = logging.getLogger(__name__)

MANIFESTS = Path(__file__).resolve().parent / "precompile"
ENV = "FLINT_PRECOMPILE_FILE"
MODE_ENV = "FLINT_PRECOMPILE_MODE"
MODES = ("processes", "threads")
FORMAT = 1
# Options that name paths on the machine that recorded them; this machine's backend fills its own.
_MACHINE_OPTIONS = ("extern_libs",)


@dataclass(frozen=True)
class Entry:
    kernel: str  # "<module>.<qualname>" of the @triton.jit function
    spec: dict[str, Any]  # Triton's specialisation record (serialize_specialization_data), as JSON
    seconds: float | None = None  # its compile time in a worker when measured: the longest start first

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
    mode: str = ""
    process_seconds: float = 0.0  # the worker processes' part (mode "processes")
    # Entries Triton's disk cache gained during the in-process pass: with "processes", kernels the workers' cache
    # entries did not serve (0 when every key agrees; `jit_cache_keys`), with "threads" every compile.
    in_process_compiles: int = 0
    compile_seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (kernel, key): a worker's time
    errors: list[str] = field(default_factory=list)  # the first few, for the log

    def describe(self) -> str:
        return (
            f"precompiled {self.compiled} of {self.listed} listed Triton kernels in {self.seconds:.1f} s with"
            f" {self.workers} {self.mode} ({self.present} already compiled, {self.failed} skipped,"
            f" {self.in_process_compiles} compiled in-process)"
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
    return [Entry(e["kernel"], e["spec"], e.get("seconds")) for e in raw["profiles"].get(profile, [])]


def save(
    path: Path | str,
    profile: str,
    entries: list[Entry],
    device_name: str,
    triton_version: str = "",
    replace: bool = False,
) -> int:
    """Add `entries` to `profile` in the manifest at `path` (created if missing); returns the profile's count.

    Recordings merge: starts with other settings (graph sizes, budgets) add their variants. After kernels or a tuning
    table changed, `replace` drops the profile's earlier entries (stale variants), leaving other profiles as they are.
    `triton_version`: the recording's (default: ours).
    """
    import triton

    path = Path(path)
    raw: dict[str, Any] = {"format": FORMAT, "profiles": {}}
    if path.is_file():
        raw = json.loads(path.read_text())
    earlier = [] if replace else raw["profiles"].get(profile, [])
    known = [Entry(e["kernel"], e["spec"], e.get("seconds")) for e in earlier]
    unique = {(e.kernel, e.key): e for e in known}
    for e in entries:  # a new recording replaces the record, and keeps a measured time it lacks
        old = unique.get((e.kernel, e.key))
        unique[(e.kernel, e.key)] = e if e.seconds is not None or old is None else Entry(e.kernel, e.spec, old.seconds)
    raw.update({"format": FORMAT, "triton": triton_version or triton.__version__, "device": device_name})
    raw["profiles"][profile] = [_record(e) for _, e in sorted(unique.items(), key=lambda kv: kv[0])]
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


def _record(e: Entry) -> dict[str, Any]:
    timed = {} if e.seconds is None else {"seconds": round(e.seconds, 2)}
    return {"kernel": e.kernel, **timed, "spec": _portable(e.spec)}


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


def precompile(
    entries: list[Entry],
    device: torch.device,
    workers: int | None = None,
    mode: str | None = None,
    stop: threading.Event | None = None,
) -> Report:
    """Compile `entries` for `device` in parallel; every failure is counted and skipped, never raised.

    `mode`: "processes" or "threads" (default: `$FLINT_PRECOMPILE_MODE`, else "processes"). `stop`, once set, ends
    the worker processes' part early and skips the rest (the start it served has failed)."""
    import triton

    mode = mode or os.environ.get(MODE_ENV) or "processes"
    if mode not in MODES:
        raise ValueError(f"precompile mode must be one of {MODES}, got {mode!r}")
    report = Report(listed=len(entries), mode=mode)
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
        missing = [(fn, e) for fn, e in todo if _cached(fn, index, e.key) is None]
        # Longest compile first: the parallel compile ends with its longest job, so that one must not start last.
        # An entry without a measured time may be new and long: it goes first too.
        missing.sort(key=lambda fe: -(float("inf") if fe[1].seconds is None else fe[1].seconds))
        report.present = len(todo) - len(missing)
        if mode == "processes" and missing:
            t0 = time.monotonic()
            # Their failures are not final: what they could not compile, the in-process pass below compiles.
            errors, report.compile_seconds = _compile_in_processes(
                [e for _, e in missing], report.workers, index, stop=stop
            )
            for error in errors[:5]:
                log.debug("precompile worker: %s", error)
            report.process_seconds = time.monotonic() - t0
        if stop is not None and stop.is_set():
            report.seconds = time.monotonic() - start
            return report
        submitted: list[tuple[Any, Entry]] = []
        # The keys the workers computed (`jit_cache_keys`: else Triton 3.6 recompiles what they left in the cache).
        jit_cache_keys.settle()
        entries_before = _disk_cache_entries()
        # In-process: compiles (threads) or loads what the workers left in Triton's disk cache (processes).
        # No CUDA here only under a stand-in driver that compiles for a GPU it does not have (the tests' fake sm_90).
        on_device = torch.cuda.device(index) if torch.cuda.is_available() else contextlib.nullcontext()
        with on_device, ThreadPoolExecutor(report.workers, thread_name_prefix="triton") as pool:
            with triton.AsyncCompileMode(pool, ignore_errors=True):
                for fn, entry in missing:
                    try:
                        fn.preload(json.dumps(entry.spec))
                        submitted.append((fn, entry))
                    except Exception as exc:
                        _failed(report, entry, exc)
            # Leaving the mode waited for every compile; a failed one is no longer in the cache.
            report.in_process_compiles = max(0, _disk_cache_entries() - entries_before)
            for fn, entry in submitted:
                if _cached(fn, index, entry.key) is not None:
                    report.compiled += 1
                else:
                    _failed(report, entry, RuntimeError("did not compile here"))
    report.seconds = time.monotonic() - start
    return report


def _disk_cache_entries() -> int:
    """How many kernels Triton's disk cache holds (0 where it cannot be read)."""
    import triton

    try:
        return len(os.listdir(triton.knobs.cache.dir))
    except (AttributeError, OSError):
        return 0


def _compile_in_processes(
    entries: list[Entry],
    workers: int,
    device_index: int,
    deadline_s: float = 900.0,
    stop: threading.Event | None = None,
) -> tuple[list[str], dict[tuple[str, str], float]]:
    """Compile `entries` into Triton's disk cache in `workers` child processes, in their order.

    Returns the errors and each compiled entry's time, keyed by (kernel, key). Workers still busy after
    `deadline_s` are killed (a stuck compile must not hold up the start; the warm-up compiles what is left), and so
    are all of them once `stop` is set.

    Each child (`python -m flint_kernels.precompile --worker`) takes one entry at a time from a shared queue, so a
    long compile does not hold up the others. A child that dies loses its current entry, nothing else.
    """
    queue = collections.deque(entries)
    lock = threading.Lock()
    errors: list[str] = []
    times: dict[tuple[str, str], float] = {}
    # The child sees the engine's GPU as its device 0 (whose target it compiles for) and no other.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v for v in visible.split(",") if v.strip()] if visible else []
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=ids[device_index] if device_index < len(ids) else str(device_index))

    procs: list[subprocess.Popen] = []

    def drive() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flint_kernels.precompile", "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        with lock:
            procs.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    entry = queue.popleft()
                proc.stdin.write(json.dumps({"kernel": entry.kernel, "spec": entry.spec}) + "\n")
                proc.stdin.flush()
                reply = proc.stdout.readline().strip()
                if reply.startswith("ok "):
                    with lock:
                        times[(entry.kernel, entry.key)] = float(reply[3:])
                else:
                    with lock:
                        errors.append(reply or f"{entry.kernel}: the worker exited")
                    if not reply:
                        return
        except OSError as exc:  # the worker is gone; the queue goes on in the others
            with lock:
                errors.append(f"worker: {exc}")
        finally:
            try:
                proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(min(workers, len(entries)))]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        while t.is_alive() and time.monotonic() < end and not (stop is not None and stop.is_set()):
            t.join(min(0.25, max(0.0, end - time.monotonic())))
    if any(t.is_alive() for t in threads):
        stopped = stop is not None and stop.is_set()
        with lock:
            errors.append("stopped: the start was cancelled" if stopped else
                          f"workers still compiling after {deadline_s:.0f} s: stopped")  # fmt: skip
            queue.clear()
            for proc in procs:
                proc.kill()
        for t in threads:
            t.join()
    return errors, times


def _worker() -> None:
    """A compile worker: one JSON entry per input line, "ok" or the error per output line."""
    jit_cache_keys.settle()  # the keys the in-process pass will compute, whatever order the entries come in
    for line in sys.stdin:
        kernel = "?"
        start = time.monotonic()
        try:
            item = json.loads(line)
            kernel = item["kernel"]
            fn = check(Entry(kernel, item["spec"]))
            fn.preload(json.dumps(item["spec"]))  # compiles for device 0's target; launches nothing
            reply = f"ok {time.monotonic() - start:.3f}"
        except Exception as exc:
            reply = f"{kernel}: {type(exc).__name__}: {exc}"
        sys.stdout.write(reply.replace("\n", " ")[:500] + "\n")
        sys.stdout.flush()


def run(device: torch.device, profile: str, stop: threading.Event | None = None) -> Report | None:
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
    report = precompile(entries, device, stop=stop)
    listed = "" if entries else ": not listed, the warm-up compiles its kernels one by one"
    log.info("%s (%s, profile %s%s)", report.describe(), path.name, profile, listed)
    for error in report.errors:
        log.info("precompile skipped %s", error)
    return report


class Pending:
    """`run` on a background thread (`start`), so that the compile overlaps the checkpoint's load.

    The compile needs only the model's profile, which the checkpoint's header gives; the load needs the disk and
    the GPU's copy engines more than the CPUs that compile."""

    def __init__(self, device: torch.device, profile: str) -> None:
        if device.type == "cuda" and device.index is None:  # the thread's current device is not the caller's
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.profile = profile
        self._stop = threading.Event()
        self._report: Report | None = None
        self._thread = threading.Thread(target=self._run, name="flint-precompile", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._report = run(self.device, self.profile, self._stop)
        except Exception:  # a speed-up must not fail the start: the warm-up compiles what is missing
            log.warning("kernel precompile failed: the warm-up compiles its kernels one by one", exc_info=True)

    def wait(self) -> Report | None:
        """The report once the compile is done (None: no manifest, or it failed)."""
        self._thread.join()
        return self._report

    def cancel(self) -> None:
        """Stop the worker processes and wait for the thread (the start this served has failed)."""
        self._stop.set()
        self._thread.join()


def start(device: torch.device, profile: str) -> Pending:
    """Begin `run(device, profile)` in the background; `Pending.wait` gives its report."""
    return Pending(device, profile)


def _default_workers(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """One compile per usable CPU, at most 16 (each holds a Triton/LLVM pipeline in memory).

    Usable: the CPUs this process may run on, capped by a container's CPU quota (a k8s pod's CPU limit shows in the
    cgroup, not in the affinity mask, which lists the whole node)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_cpus(cgroup)
    if quota is not None:
        usable = min(usable, quota)
    return max(1, min(16, usable))


def _cgroup_cpus(root: Path) -> int | None:
    """CPUs allowed by the cgroup's quota (v2 `cpu.max`, else v1 `cpu.cfs_quota_us`), None without a quota."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else max(1, -(-int(quota) // int(period)))
        v1 = root / "cpu" / "cpu.cfs_quota_us"
        if v1.is_file():
            quota_us = int(v1.read_text())
            period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
            return None if quota_us <= 0 else max(1, -(-quota_us // period_us))
    except (OSError, ValueError):
        return None
    return None


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
        runtime = runtime_knobs()
        if runtime is not None:
            self._knobs = runtime
            self._previous = runtime.jit_cache_hook
            runtime.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        if self._knobs is not None:
            self._knobs.jit_cache_hook = self._previous
            self._knobs = None


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        sys.exit("usage: python -m flint_kernels.precompile --worker (started by precompile(); reads entries on stdin)")
    _worker()
