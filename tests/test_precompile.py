"""The kernel manifest: recording Triton's specialisations, saving them portably, compiling them in parallel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from flint_kernels import precompile
from triton import knobs

HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]


def _spec(name: str, key: str, params: list[str], libdevice: str = "/opt/somewhere/libdevice.10.bc") -> dict:
    """A specialisation record shaped like Triton's `serialize_specialization_data`."""
    return {
        "name": name,
        "signature": dict.fromkeys(params, "*bf16"),
        "constant_keys": [],
        "constant_vals": [],
        "attrs_keys": [],
        "attrs_vals": [],
        "options": {"num_warps": 4, "num_stages": 3, "extern_libs": [["libdevice", libdevice]]},
        "key": key,
    }


def _kernel_body() -> None:
    """Stands in for the Python function under a @triton.jit."""


def test_save_merges_recordings_and_keeps_no_machine_paths(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    a = precompile.Entry("flint_kernels.x._a_kernel", _spec("flint_kernels.x._a_kernel", "k1", ["x_ptr"]))
    b = precompile.Entry("flint_kernels.x._b_kernel", _spec("flint_kernels.x._b_kernel", "k2", ["y_ptr"]))
    assert precompile.save(path, "bf16-model", [a, a], "GPU X") == 1  # the same variant twice: one entry
    assert precompile.save(path, "bf16-model", [b], "GPU X") == 2  # a second recording adds to the profile
    assert precompile.save(path, "nvfp4-model", [b], "GPU X") == 1
    text = path.read_text()
    assert "/opt/somewhere" not in text and "extern_libs" not in text
    assert [e.kernel for e in precompile.load(path, "bf16-model")] == [a.kernel, b.kernel]
    assert [e.key for e in precompile.load(path, "nvfp4-model")] == ["k2"]
    assert precompile.load(path, "another-model") == []
    raw = json.loads(text)
    assert raw["format"] == precompile.FORMAT and raw["device"] == "GPU X" and raw["triton"]
    assert precompile.load(path, "bf16-model")[0].spec["options"] == {"num_warps": 4, "num_stages": 3}
    # A recording after a change replaces its profile (stale variants go) and leaves the others.
    assert precompile.save(path, "bf16-model", [b], "GPU X", replace=True) == 1
    assert [e.kernel for e in precompile.load(path, "bf16-model")] == [b.kernel]
    assert [e.key for e in precompile.load(path, "nvfp4-model")] == ["k2"]


def test_load_rejects_a_file_that_is_not_a_manifest(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"gemv.small_m": []}))
    with pytest.raises(ValueError, match="not a Flint kernel manifest"):
        precompile.load(path, "any")


def test_manifest_path_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(precompile.ENV, str(tmp_path / "m.json"))
    assert precompile.manifest_path("cpu") == tmp_path / "m.json"
    monkeypatch.setenv(precompile.ENV, "")
    assert precompile.manifest_path("cpu") is None  # empty: turned off
    monkeypatch.delenv(precompile.ENV)
    assert precompile.manifest_path("cpu") is None  # no manifest ships for the CPU
    assert (precompile.MANIFESTS / "nvidia-h200.json").is_file()


def test_stale_entries_are_skipped_and_counted_not_raised() -> None:
    gone = precompile.Entry("flint_kernels.rmsnorm_triton._no_such_kernel", _spec("x", "k", ["a"]))
    no_module = precompile.Entry("flint_kernels.no_such_module._k", _spec("y", "k", ["a"]))
    report = precompile.precompile([gone, no_module], torch.device("cpu"))
    assert (report.listed, report.failed, report.compiled) == (2, 2, 0)
    assert "_no_such_kernel" in report.errors[0] and "no_such_module" in report.errors[1]
    assert "2 skipped" in report.describe()


def test_worker_processes_report_each_failure_and_exit() -> None:
    bad = [precompile.Entry(f"flint_kernels.no_such_module._k{i}", _spec("x", f"k{i}", ["a"])) for i in range(3)]
    errors, times = precompile._compile_in_processes(bad, workers=2, device_index=0)
    assert times == {}
    assert sorted(e.split(":")[0] for e in errors) == [e.kernel for e in bad]
    assert all("ModuleNotFoundError" in e for e in errors)


@pytest.fixture
def stuck_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> precompile.Entry:
    """Workers that never answer (their "python" sleeps), and an entry to give them."""
    stuck = tmp_path / "python"
    stuck.write_text("#!/bin/sh\nexec sleep 60\n")
    stuck.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stuck))
    return precompile.Entry("flint_kernels.rmsnorm_triton._rms_norm_kernel", _spec("x", "k", ["a"]))


def test_a_stuck_worker_is_stopped_at_the_deadline(stuck_worker: precompile.Entry) -> None:
    """A compile that never ends must not hold up the engine's start: the worker is killed, the entry reported."""
    entry = stuck_worker
    start = time.monotonic()
    errors, times = precompile._compile_in_processes([entry, entry], workers=2, device_index=0, deadline_s=1.0)
    assert time.monotonic() - start < 30
    assert times == {} and any("still compiling after 1 s" in e for e in errors)


def test_a_cancelled_start_stops_its_workers(stuck_worker: precompile.Entry) -> None:
    """A start that fails while the precompile runs (a bad checkpoint) kills the workers at once."""
    entry = stuck_worker
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    start = time.monotonic()
    errors, times = precompile._compile_in_processes([entry, entry], workers=2, device_index=0, stop=stop)
    assert time.monotonic() - start < 30
    assert times == {} and any("cancelled" in e for e in errors)


def test_pending_gives_the_report_of_its_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """`start` runs the precompile on a thread; `wait` returns its report, `cancel` sets its stop event."""
    started, stops = threading.Event(), []

    def fake_run(device: torch.device, profile: str, stop: threading.Event | None = None) -> precompile.Report:
        started.set()
        stops.append(stop)
        if profile == "slow":  # holds until cancelled (or 5 s)
            assert stop is not None
            stop.wait(5.0)
        return precompile.Report(listed=3, compiled=3)

    monkeypatch.setattr(precompile, "run", fake_run)
    pending = precompile.start(torch.device("cpu"), "fast")
    assert pending.profile == "fast" and pending.wait().compiled == 3
    slow = precompile.start(torch.device("cpu"), "slow")
    assert started.wait(5.0)
    t0 = time.monotonic()
    slow.cancel()
    assert time.monotonic() - t0 < 4.0 and stops[-1].is_set()


def test_a_failing_precompile_does_not_fail_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("no processes here")

    monkeypatch.setattr(precompile, "run", broken)
    assert precompile.start(torch.device("cpu"), "p").wait() is None


def test_workers_follow_the_container_cpu_limit(tmp_path: Path) -> None:
    """A k8s pod's CPU limit is a cgroup quota (the affinity mask lists the node's CPUs): 8 CPUs, 8 workers."""
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("750000 100000\n")  # 7.5 CPUs: 8 workers
    assert precompile._cgroup_cpus(v2) == 8
    (v2 / "cpu.max").write_text("max 100000\n")
    assert precompile._cgroup_cpus(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert precompile._cgroup_cpus(v1) == 2
    assert precompile._default_workers(v1) == min(2, len(os.sched_getaffinity(0)))
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert precompile._cgroup_cpus(v1) is None
    assert precompile._cgroup_cpus(tmp_path / "none") is None


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="processes"):
        precompile.precompile([], torch.device("cpu"), mode="fork")


def test_recorder_lists_launch_compiles_and_chains_the_previous_hook() -> None:
    seen: list[str] = []
    before = knobs.runtime.jit_cache_hook

    def earlier(**kwargs) -> None:
        seen.append(kwargs["key"])

    knobs.runtime.jit_cache_hook = earlier
    try:
        spec = _spec(f"{__name__}._kernel_body", "key-1", ["x_ptr"])
        info = SimpleNamespace(jit_function=SimpleNamespace(fn=_kernel_body))
        with precompile.Recorder() as rec:
            assert knobs.runtime.jit_cache_hook == rec._hook
            # Triton's own calls: keyword arguments only; a manual warm-up (preload) is not a launch.
            for manual in (False, True):
                knobs.runtime.jit_cache_hook(
                    key=f"key-{int(manual)}", repr="r", fn=info, compile={"specialization_data": json.dumps(spec)},
                    is_manual_warmup=manual, already_compiled=False,
                )  # fmt: skip
        assert knobs.runtime.jit_cache_hook == earlier  # restored on exit
        assert seen == ["key-0", "key-1"]
        assert [(e.kernel, e.key) for e in rec.entries] == [(f"{__name__}._kernel_body", "key-1")]
    finally:
        knobs.runtime.jit_cache_hook = before


def test_shipped_manifests_match_the_kernels() -> None:
    """Every entry names a kernel that exists with the parameters it was recorded with (else: record again)."""
    # Outside Triton's interpreter, where @triton.jit gives the JITFunction the manifest names.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json, sys\n"
        "from flint_kernels import precompile\n"
        "bad, counts = [], {}\n"
        "for path in sorted(precompile.MANIFESTS.glob('*.json')):\n"
        "    for profile in json.loads(path.read_text())['profiles']:\n"
        "        entries = precompile.load(path, profile)\n"
        "        counts[f'{path.name}:{profile}'] = len(entries)\n"
        "        for e in entries:\n"
        "            try:\n"
        "                precompile.check(e)\n"
        "            except Exception as exc:\n"
        "                bad.append(f'{path.name}: {e.kernel}: {exc}')\n"
        "print(json.dumps({'bad': bad, 'counts': counts}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bad"] == [], "stale manifest entries; record again on the GPU (benchmarks/cold_start.py --record)"
    assert len(result["counts"]) >= 2 and min(result["counts"].values()) >= 20, result["counts"]
    text = "\n".join(p.read_text() for p in precompile.MANIFESTS.glob("*.json"))
    assert "extern_libs" not in text and "/tmp/" not in text and "/home/" not in text


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize(("mode", "width"), [("threads", 1536), ("processes", 1664)])
def test_precompiled_kernel_is_what_the_launch_uses(mode: str, width: int) -> None:
    """A launch recorded, dropped from the in-process cache, precompiled from its entry: the launch then compiles
    nothing and computes the reference's result."""
    from flint_kernels.rmsnorm import rms_norm_ref
    from flint_kernels.rmsnorm_triton import rms_norm

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(3, width, device=dev, generator=g).to(torch.bfloat16)
    w = torch.rand(width, device=dev, generator=g) + 0.5
    # Forget this process's compiled variants of the kernel, so the first launch meets Triton's JIT cache hook.
    index = torch.cuda.current_device()
    kernel = precompile._resolve("flint_kernels.rmsnorm_triton._rms_norm_kernel")
    if index in kernel.device_caches:
        kernel.device_caches[index][0].clear()
    with precompile.Recorder() as first:
        rms_norm(x, w, 1e-6)
    torch.cuda.synchronize()
    entries = first.entries
    assert [e.kernel for e in entries] == ["flint_kernels.rmsnorm_triton._rms_norm_kernel"]
    for e in entries:
        fn = precompile.check(e)
        del fn.device_caches[index][0][e.key]
    report = precompile.precompile(entries, dev, workers=2, mode=mode)
    assert (report.compiled, report.failed) == (len(entries), 0), report.errors
    if mode == "processes":
        assert list(report.compile_seconds) == [(e.kernel, e.key) for e in entries]
        assert report.in_process_compiles == 0  # the workers' cache entries served the in-process pass
    with precompile.Recorder() as second:
        out = rms_norm(x, w, 1e-6)
    torch.cuda.synchronize()
    assert second.entries == []
    ref = rms_norm_ref(x, w, 1e-6)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_the_engine_precompiles_while_the_checkpoint_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a checkpoint on the GPU, the precompile starts from the header before the load, and the engine takes
    its report (the header's profile is the loaded weights' one)."""
    from flint_engine.checkpoint.gguf_writer import write_gguf
    from flint_engine.checkpoint.random_tensors import random_provider
    from flint_engine.config import preset
    from flint_engine.engine import LLMEngine
    from flint_engine.engine_config import EngineConfig

    config = preset("tiny")
    path = tmp_path / "m.gguf"
    write_gguf(path, config, random_provider(config, 1, nvfp4_values=True), fmt="nvfp4", progress=False)
    started: list[precompile.Pending] = []
    real_start = precompile.start

    def recording_start(device: torch.device, profile: str) -> precompile.Pending:
        started.append(real_start(device, profile))
        return started[-1]

    monkeypatch.setattr(precompile, "start", recording_start)
    engine = LLMEngine.from_checkpoint(
        EngineConfig(
            model=str(path), device="cuda", max_num_seqs=2, max_model_len=256, cuda_graphs=False, prefill_warmup=False
        ),
        progress=False,
    )
    assert len(started) == 1 and started[0].profile == engine.model.weights.kernel_profile()
    assert engine.precompile_report is started[0].wait()


def test_serving_settings_reach_the_engine() -> None:
    from flint_serve.settings import ServeSettings

    assert ServeSettings().engine_config(gpu=True).precompile_kernels is True
    assert ServeSettings(precompile_kernels=False).engine_config(gpu=True).precompile_kernels is False


def test_workers_and_the_in_process_pass_agree_on_cache_keys(tmp_path: Path) -> None:
    """On a CPU, with Triton told the device is an sm_90 GPU (`tests/fake_gpu`): two specialisations of the MMA linear
    (recorded from `warmup`, which compiles nothing here) go through `precompile` with worker processes, after this
    process hashed the kernel before its helpers (as an engine that launched it first can). The in-process pass then
    compiles nothing: each worker's cache entry has the key this process computes (Triton 3.6 keyed by hashing order;
    `jit_cache_keys.settle` mends it)."""
    code = """
import json, torch
from triton import knobs
from flint_kernels import nvfp4_mma_triton as nm, precompile
specs = []
def record(**kw):
    spec = (kw.get("compile") or {}).get("specialization_data")
    if spec:
        specs.append(spec)
    return True  # recorded: compile nothing
knobs.runtime.jit_cache_hook = record
x, out = torch.zeros(8, 2048, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
q, s = torch.zeros(64, 1024, dtype=torch.uint8), torch.zeros(64, 128, dtype=torch.uint8)
for split in (1, 4):
    nm._nvfp4_mma_kernel.warmup(
        x, q, s, torch.ones(1), out, torch.zeros(1), torch.zeros(4, dtype=torch.int32), 8, 64, 2048, 512, 2048, 1024,
        128, 64, 64, 64, 64, SPLIT_K=split, NW=4, PREFETCH=False, PDL=False, grid=(1,), num_warps=4, num_stages=1)
knobs.runtime.jit_cache_hook = None
nm._nvfp4_mma_kernel.cache_key  # the kernel hashed before its helpers
entries = [precompile.Entry("flint_kernels.nvfp4_mma_triton._nvfp4_mma_kernel", json.loads(s)) for s in specs]
r = precompile.precompile(entries, torch.device("cuda", 0), workers=2, mode="processes")
print(json.dumps({"listed": r.listed, "compiled": r.compiled, "again": r.in_process_compiles,
                  "workers": len(r.compile_seconds), "errors": r.errors}))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    fake = str(Path(__file__).resolve().parent / "fake_gpu")
    env.update(FLINT_FAKE_SM90="1", TRITON_CACHE_DIR=str(tmp_path / "triton"), CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([fake, env.get("PYTHONPATH", "")]))  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["listed"] == 2 and result["errors"] == [], result
    assert result["workers"] == result["compiled"] == 2, result
    assert result["again"] == 0, result
