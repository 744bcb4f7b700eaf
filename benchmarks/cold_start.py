"""Engine start-up on an empty Triton cache, with and without the parallel precompile of the kernel manifest.

Each start runs in its own process with its own `TRITON_CACHE_DIR`, so "cold" means what it does on a fresh
machine: every kernel the warm-up meets is compiled. Per model:

- `serial`: cold, no manifest (`precompile_kernels=False`): the warm-up compiles kernel by kernel. With
  `--record FILE` the variants it compiled are written into the manifest FILE under the model's profile (the
  shipped one for a GPU is `kernels/precompile/<device key>.json`).
- `parallel`: cold, with the manifest (`--manifest`, default: the one `--record` wrote, else the shipped one),
  compiled in worker processes or on threads (`--mode`).
- `warm`: the same Triton cache again (what k8s/components/triton-cache gives a replica after the first).
- `after-load` (`--after-load`, for a checkpoint file): cold, with the manifest, but compiled only once the weights
  are loaded, as before the engine started the precompile from the checkpoint's header; `parallel` overlaps them.

A full-size checkpoint to start from: `flint make-checkpoint --preset full --format nvfp4 --device cuda --out F`.

    python benchmarks/cold_start.py --models random:full random:full:nvfp4 --record kernels/precompile/nvidia-h200.json

Prints a table and writes benchmarks/results/cold_start.json (or --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def child(args: argparse.Namespace) -> None:
    """One engine start in this process; prints one JSON line."""
    import torch
    import triton

    from flint_engine.engine import LLMEngine
    from flint_engine.engine_config import EngineConfig
    from flint_engine.late_compiles import WATCH
    from flint_engine.sampling_params import SamplingParams

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if re.search(r"in \d+(\.\d+)? s|precompiled|warm-up compiled|after it", msg):
                lines.append(msg)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger().addHandler(Keep())
    if args.precompile_after_load:  # no start before the load: the engine compiles after it
        from flint_kernels import precompile

        precompile.start = lambda device, profile: None
    cfg = EngineConfig(
        model=args.child,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        precompile_kernels=not args.no_precompile,
    )
    t0 = time.perf_counter()
    engine = LLMEngine.from_checkpoint(cfg, progress=False)
    startup = time.perf_counter() - t0
    # A request through the engine after the start: the precompiled kernels run (and nothing compiles late).
    t1 = time.perf_counter()
    engine.generate([[1, 2, 3, 4, 5, 6, 7, 8]], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    first_request = time.perf_counter() - t1
    profile = engine.model.weights.kernel_profile()
    report = engine.precompile_report
    if args.record_to and report is None:  # what the warm-up compiled, for the manifest
        recorded = [{"kernel": e.kernel, "spec": e.spec} for e in engine.warmup_compiles]
        Path(args.record_to).write_text(json.dumps(recorded))
    elif args.record_to:  # each precompiled entry's time in a worker
        times = [{"kernel": k, "key": key, "seconds": s} for (k, key), s in report.compile_seconds.items()]
        Path(args.record_to).write_text(json.dumps(times))
    summary = None
    if report is not None:
        summary = {k: v for k, v in dataclasses.asdict(report).items() if k != "compile_seconds"}
        slowest = sorted(report.compile_seconds.items(), key=lambda kv: -kv[1])[:6]
        summary["slowest_compiles_s"] = [[k.rsplit(".", 1)[-1], round(s, 1)] for (k, _), s in slowest]
        summary["compile_seconds_total"] = round(sum(report.compile_seconds.values()), 1)
    row = {
        "model": args.child,
        "profile": profile,
        "startup_s": round(startup, 1),
        "first_request_s": round(first_request, 2),
        "warmup_compiles": len(engine.warmup_compiles),
        "late_compiles": WATCH.count,  # kernels the first request compiled (a fused GPU engine watches)
        "precompile": summary,
        "log": lines,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "triton": triton.__version__,
    }
    print("ROW " + json.dumps(row), flush=True)


def start(model: str, cache: Path, manifest: Path | None, precompile: bool, record_to: Path | None,
          settings: list[str], timeout: float, mode: str | None, after_load: bool = False) -> dict:  # fmt: skip
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    if mode:
        env["FLINT_PRECOMPILE_MODE"] = mode
    if manifest is not None:
        env["FLINT_PRECOMPILE_FILE"] = str(manifest)
    cmd = [sys.executable, __file__, "--child", model, *settings]
    if not precompile:
        cmd.append("--no-precompile")
    if after_load:
        cmd.append("--precompile-after-load")
    if record_to is not None:
        cmd += ["--record-to", str(record_to)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    rows = [line[4:] for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if proc.returncode != 0 or not rows:
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return {**json.loads(rows[-1]), "process_wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["random:full", "random:full:nvfp4"])
    ap.add_argument("--record", type=Path, help="write the serial start's kernels into this manifest")
    ap.add_argument("--replace", action="store_true", help="--record replaces the model's profile (else adds to it)")
    ap.add_argument("--manifest", type=Path, help="the manifest of the parallel starts (default: --record's)")
    ap.add_argument("--skip-serial", action="store_true", help="no serial start (needs a manifest)")
    ap.add_argument("--mode", choices=["processes", "threads"], help="how to precompile (default: the engine's)")
    ap.add_argument("--save-times", action="store_true", help="write the workers' compile times into the manifest")
    ap.add_argument("--no-warm", action="store_true", help="no start on the filled cache")
    ap.add_argument("--after-load", action="store_true", help="also a cold start that compiles after the load")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    ap.add_argument("--max-num-seqs", type=int, default=128, help="also the largest decode graph (k8s NVFP4: 128)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per start")
    ap.add_argument("--out", type=Path, default=RESULTS / "cold_start.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-precompile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--record-to", help=argparse.SUPPRESS)
    ap.add_argument("--precompile-after-load", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from flint_kernels import precompile

    manifest = args.manifest or args.record
    if args.skip_serial and manifest is None and precompile.manifest_path() is None:
        ap.error("--skip-serial needs a manifest (--manifest, or a shipped one for this GPU)")
    from results_file import write_results

    command = shlex.join(["python", "benchmarks/cold_start.py", *sys.argv[1:]])
    rows: list[dict] = []
    settings = ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_model_len:
        settings += ["--max-model-len", str(args.max_model_len)]
    with tempfile.TemporaryDirectory(prefix="flint-cold-") as tmp:
        for i, model in enumerate(args.models):
            kinds = [] if args.skip_serial else ["serial"]
            kinds += ["after-load"] if args.after_load else []
            kinds += ["parallel"] if args.no_warm else ["parallel", "warm"]
            for kind in kinds:
                cache = Path(tmp) / f"cache-{i}-{kind if kind in ('serial', 'after-load') else 'parallel'}"
                timing = kind == "parallel" and args.save_times
                recording = (kind == "serial" and args.record is not None) or timing
                record_to = Path(tmp) / f"record-{i}-{kind}.json" if recording else None
                row = start(model, cache, manifest, kind != "serial", record_to, settings, args.timeout, args.mode,
                            after_load=kind == "after-load")  # fmt: skip
                row["start"] = kind
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
                write_results(args.out, command, rows)  # after each start: a time-out keeps what ran
                if timing and record_to is not None and row["precompile"]:
                    target = manifest or precompile.manifest_path()
                    assert target is not None
                    times = {(t["kernel"], t["key"]): t["seconds"] for t in json.loads(record_to.read_text())}
                    known = precompile.load(target, row["profile"])
                    timed = [dataclasses.replace(e, seconds=times[(e.kernel, e.key)]) for e in known
                             if (e.kernel, e.key) in times]  # fmt: skip
                    precompile.save(target, row["profile"], timed, row["device"], row["triton"])
                    print(f"saved the compile times of {len(timed)} kernel variants into {target}", flush=True)
                elif kind == "serial" and record_to is not None:
                    entries = [precompile.Entry(e["kernel"], e["spec"]) for e in json.loads(record_to.read_text())]
                    n = precompile.save(
                        args.record, row["profile"], entries, row["device"], row["triton"], replace=args.replace
                    )
                    print(f"recorded {n} kernel variants of {model} into {args.record}", flush=True)
    print(f"\n{'model':>20} {'start':>9} {'start-up s':>10} {'precompile':>24} {'warm-up compiles':>16}")
    for r in rows:
        p = r["precompile"]
        pre = "-" if p is None else f"{p['compiled']}/{p['listed']} in {p['seconds']} s"
        print(f"{r['model']:>20} {r['start']:>9} {r['startup_s']:>10} {pre:>24} {r['warmup_compiles']:>16}")


if __name__ == "__main__":
    main()
