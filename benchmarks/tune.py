"""Time the Triton kernels' launch candidates on this GPU and write its tuning table (see kernels/tuning.py).

    python benchmarks/tune.py                    # -> benchmarks/results/tuning_<key>.json (+ tuning_<key>_sweeps.json)
    python benchmarks/tune.py --install          # -> kernels/tuning/<key>.json, the table the kernels read
    python benchmarks/tune.py --only attention   # one family; other ops keep their entries from the file replaced

Runs the sweeps of kernels_moe_gemv.py (GEMV tiles at M = 1, 8, 64 on its swept shapes; MoE paths and tiles per
token count, routed alone and with the shared expert) and kernels_attention.py (prefill and decode attention launch
parameters); every candidate is checked against the reference before it is timed. From the times it writes, per op:

- gemv.small_m: per format and measured M, the fastest tile of each swept shape (N, K), then for any K divisible
  by its block_k the tile best on the geometric mean over the shapes (a shape's own entry is left out where that
  one gives the same tile). M = 1 stands for itself; a larger measured M for the Ms above the previous measured one
  (the last up to 64), with BLOCK_M following M.
- moe.paths: the decode path up to the largest measured T such that it beat the grouped GEMM at that T and every
  smaller one measured; for NVFP4, where the sweep timed the experts from BF16 copies, the smallest T from which
  the copies beat decoding in registers at every measured T (`dequant_min_tokens`); the fields it does not measure
  (the shared expert's fold limit and side stream, the prefill paths' thresholds) are kept as the table has them
  (decode.py and the prefill benchmarks measure those, on whole steps).
- moe.decode / moe.grouped: the fastest tiles of the path per measured T (decode: T up to that limit, timed with
  the shared expert folded in where the engine folds it, `--only shared`'s measurement; grouped: T above the limit,
  by pairs per expert); each T stands for the values above the previous one, the last for all above.
- attention.decode / attention.prefill: per full / sliding layer, the candidate best on the geometric mean over the
  measured shapes.

An op this run measures gets only the entries it writes: in `moe.decode`, `moe.grouped`, `gemv.small_m` and the
attention ops, the flags that whole-step A/Bs chose on top of the tiles (the NVFP4 MMA paths, the token-slots down,
norm prologues, K splits, merge launches) are not carried over from the file it replaces; it is a first table for a
new GPU, or a sweep to compare with `git diff`, not a way to refresh a tuned one.

The raw times go to benchmarks/results/tuning_<key>_sweeps.json, one record per family (a run keeps the records
of the families it does not measure). Needs a CUDA GPU (exits 1 otherwise). Review the table, then try it before
installing it: FLINT_TUNING_FILE=benchmarks/results/tuning_<key>.json python benchmarks/decode.py ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Iterable
from datetime import date
from pathlib import Path

import kernels_attention  # sibling scripts: benchmarks/ is on sys.path
import kernels_moe_gemv
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TABLES = ROOT / "kernels" / "tuning"
FAMILIES = ("gemv", "moe", "attention")


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _geomean_best(scores: list[dict[str, float]], higher_is_better: bool) -> str | None:
    """The candidate measured on every shape whose geometric-mean ratio to each shape's best is best (first wins)."""
    common = [c for c in scores[0] if all(c in s for s in scores)] if scores else []
    if not common:
        return None

    def cost(c: str) -> float:
        if higher_is_better:
            return sum(math.log(max(s.values()) / s[c]) for s in scores)
        return sum(math.log(s[c] / min(s.values())) for s in scores)

    return min(common, key=cost)


def _ranges(points: list[int], last_open: bool, lo: int = 1) -> list[tuple[int, int | None]]:
    """(first, last) of the values each measured point stands for: above the previous point up to itself."""
    out: list[tuple[int, int | None]] = []
    for i, p in enumerate(points):
        out.append((lo, None if last_open and i == len(points) - 1 else p))
        lo = p + 1
    return out


# ------------------------------------------------------------------------------------------------- GEMV
def gemv_entries(rows: Iterable[dict], source: str) -> list[dict]:
    """`gemv.small_m` entries from `kernels_moe_gemv.gemv_rows(..., sweep=True)` rows (GB/s per candidate)."""
    from flint_kernels.configs import TileConfig
    from flint_kernels.gemv_triton import SMALL_M

    groups: dict[tuple[str, int], list[tuple[dict, dict[str, float]]]] = {}
    for row in rows:
        if "sweep" not in row or row["M"] > SMALL_M:
            continue
        cands = kernels_moe_gemv.gemv_candidates(row["M"], row["fmt"] == "nvfp4")
        scores = {n: v for n, v in row["sweep"].items() if _number(v) and isinstance(cands.get(n), TileConfig)}
        if scores:
            groups.setdefault((row["fmt"], row["M"]), []).append((row, scores))
    entries = []
    for fmt in ("bf16", "nvfp4"):
        larger = sorted(m for f, m in groups if f == fmt and m > 1)
        spans = {m: {"m_min": lo, "m_max": hi or SMALL_M} for m, (lo, hi) in zip(larger, _ranges(larger, True, 2))}
        if (fmt, 1) in groups:
            spans[1] = {"m": 1}
        for m in sorted(spans):
            shapes = groups[(fmt, m)]
            cands = kernels_moe_gemv.gemv_candidates(m, fmt == "nvfp4")

            def config(name: str, m: int = m, cands: dict = cands) -> dict:
                cfg = _fields(cands[name])
                return cfg if m == 1 else {k: v for k, v in cfg.items() if k != "block_m"}  # BLOCK_M follows M

            when = {**spans[m], "nvfp4": fmt == "nvfp4"}
            general = _geomean_best([s for _, s in shapes], higher_is_better=True)
            block_k = cands[general].block_k if general else 0
            for row, scores in shapes:
                best = max(scores, key=scores.__getitem__)
                if general and config(best) == config(general) and row["K"] % block_k == 0:
                    continue  # the general entry below gives this shape the same tile
                note = f"{row['op']} {fmt} M={m}: {best} {scores[best]:.0f} GB/s, fastest of {len(scores)}"
                entries.append(
                    {
                        "when": {**when, "n": row["N"], "k": row["K"]},
                        "config": config(best),
                        "source": f"{source}: {note}",
                    }
                )
            if general:
                ops = ", ".join(f"{r['op']} {s[general]:.0f}" for r, s in shapes)
                note = f"{fmt} M={m}: {general}, best geometric mean over the shapes (GB/s: {ops})"
                entries.append(
                    {"when": {**when, "k_multiple": block_k}, "config": config(general), "source": f"{source}: {note}"}
                )
    return entries


# ------------------------------------------------------------------------------------------------- MoE
Best = tuple[str, float, object]  # (candidate name, us, MoEConfig)


def _fields(config: object) -> dict:
    """A config's fields for a table entry; fields added later (`later`) only when set, so tables written before
    they existed read the same."""
    out = dataclasses.asdict(config)
    later = (
        "packed", "expert_major", "slots_in_down", "mma", "mma_down", "mma_prefetch", "mma_vec",
        "mma_split_k", "mma_l2_ahead", "mma_down_l2", "mma_warp_k", "mma_wide", "mma_down_wide", "mma_ready",
        "mma_shared", "mma_perm_h", "mma_shared_first", "mma_ready_codes", "dn_token_slots", "dn_shared_slots",
        "norm_prologue",
    )  # fmt: skip
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for flag in later:
        if flag in out and out[flag] == defaults[flag]:
            del out[flag]
    return out


def _moe_best(rows: Iterable[dict], shared: Iterable[dict], fold: dict[str, int] | None) -> dict:
    """fmt -> T -> path -> the fastest candidate; "tiles" (the decode tiles to use) comes from the routed + shared
    rows where the engine folds the shared expert in (T up to the fold limit), else from the routed rows."""
    best: dict[str, dict[int, dict[str, Best]]] = {}

    def offer(fmt: str, t: int, path: str, name: str, us: object, cfg: object) -> None:
        at_t = best.setdefault(fmt, {}).setdefault(t, {})
        if _number(us) and (path not in at_t or us < at_t[path][1]):
            at_t[path] = (name, float(us), cfg)

    for row in rows:
        for name, us in row.get("sweep", {}).items():
            dmt, cfg, dq = kernels_moe_gemv.moe_candidates(row["T"]).get(name, (None, None, None))
            if cfg is not None:  # NVFP4 from BF16 copies (dq 0) is its own path, not grouped tiles
                offer(row["fmt"], row["T"], "decode" if dmt > 0 else "grouped" if dq else "dequant", name, us, cfg)
    tiles = kernels_moe_gemv.shared_tiles()
    for row in shared:
        if fold is not None and row["T"] <= fold[row["fmt"]]:
            for name, cfg in tiles.items():
                offer(row["fmt"], row["T"], "tiles", f"folded {name}", row.get(f"folded {name}"), cfg)
    for per_t in best.values():
        for at_t in per_t.values():
            if "tiles" not in at_t and "decode" in at_t:
                at_t["tiles"] = at_t["decode"]
    return best


def moe_entries(
    rows: Iterable[dict],
    source: str,
    fold_max_tokens: dict[str, int] | None = None,
    shared: Iterable[dict] = (),
    kept_paths: dict[str, dict] | None = None,
) -> dict[str, list]:
    """`moe.paths`, `moe.decode` and `moe.grouped` entries from `kernels_moe_gemv.moe_rows(..., sweep=True)` rows
    (us per candidate) and, for the decode tiles where the shared expert is folded in, `shared_rows` rows.
    `fold_max_tokens` (per format) is written unchanged into `moe.paths`, and so is every field of `kept_paths`
    (per format: `MoEPaths` fields as the table has them) that this sweep does not measure."""
    best = _moe_best(rows, shared, fold_max_tokens)
    out: dict[str, list] = {"moe.paths": [], "moe.decode": [], "moe.grouped": []}
    for fmt in ("bf16", "nvfp4"):
        if fmt not in best:
            continue
        nv, per_t = fmt == "nvfp4", best[fmt]
        ts = sorted(per_t)
        limit, why = 0, []
        for t in ts:  # the decode path while it beats the grouped GEMM at every measured T
            dec, grp = per_t[t].get("decode"), per_t[t].get("grouped")
            if dec is None and grp is None:
                continue  # only routed + shared rows at this T
            why.append(
                f"T={t}: " + ", ".join(f"{p} {b[1]:.1f} us" for p, b in (("decode", dec), ("grouped", grp)) if b)
            )
            if dec is None or (grp is not None and grp[1] < dec[1]):
                break
            limit = t
        paths = {**(kept_paths or {}).get(fmt, {}), "decode_max_tokens": limit}
        # NVFP4 from BF16 copies from the smallest measured T above which the copies win at every measured T.
        copies = [t for t in ts if t > limit and "dequant" in per_t[t] and "grouped" in per_t[t]]
        if nv and copies:
            wins = [per_t[t]["dequant"][1] < per_t[t]["grouped"][1] for t in copies]
            first = next((i for i in range(len(copies)) if all(wins[i:])), None)
            paths["dequant_min_tokens"] = copies[first] if first is not None else 2**31 - 1
            why.append(
                "copies vs registers: "
                + ", ".join(f"T={t} {per_t[t]['dequant'][1]:.1f} vs {per_t[t]['grouped'][1]:.1f} us" for t in copies)
            )
        if fold_max_tokens is not None:
            paths["shared_fold_max_tokens"] = fold_max_tokens[fmt]
        measured = {"decode_max_tokens", *(("dequant_min_tokens",) if nv and copies else ())}
        kept = sorted(set(paths) - measured)
        if kept:
            why.append(f"{', '.join(kept)} kept as {'it was' if len(kept) == 1 else 'they were'} (not measured here)")
        why_text = f"decode path up to {limit} tokens: " + "; ".join(why)
        out["moe.paths"].append({"when": {"nvfp4": nv}, "config": paths, "source": f"{source}: {fmt} {why_text}"})
        for path, key, points in (
            ("tiles", "tokens", [t for t in ts if t <= limit and "tiles" in per_t[t]]),
            ("grouped", "pairs_per_expert", [t for t in ts if t > limit and "grouped" in per_t[t]]),
        ):
            runs: list[tuple[dict, list[int]]] = []  # neighbouring Ts with the same tiles share one entry
            for t in points:
                cfg = _fields(per_t[t][path][2])
                if runs and runs[-1][0] == cfg:
                    runs[-1][1].append(t)
                else:
                    runs.append((cfg, [t]))
            for (cfg, run), (lo, hi) in zip(runs, _ranges([r[-1] for _, r in runs], True)):
                when: dict = {"nvfp4": nv}
                if key == "tokens":
                    when |= ({"tokens_min": lo} if lo > 1 else {}) | ({"tokens_max": hi} if hi else {})
                elif hi:
                    when["pairs_per_expert_max"] = hi * kernels_moe_gemv.TOPK / kernels_moe_gemv.EXPERTS
                times = ", ".join(f"T={t} {per_t[t][path][1]:.1f} us" for t in run)
                op = "decode" if path == "tiles" else path
                note = f"{fmt} {op}: {per_t[run[0]][path][0]}, fastest at {times}"
                out[f"moe.{op}"].append({"when": when, "config": cfg, "source": f"{source}: {note}"})
    return {op: entries for op, entries in out.items() if entries}


# ------------------------------------------------------------------------------------------------- attention
def attention_entries(rows: Iterable[dict], source: str) -> dict[str, list]:
    """`attention.decode` / `attention.prefill` entries from `kernels_attention.sweep_decode` / `sweep_prefill`
    rows (ms per candidate, checked against the reference)."""
    groups: dict[tuple[str, bool], dict[str, dict[str, float]]] = {}  # (kind, sliding) -> shape -> config -> ms
    configs: dict[str, dict] = {}
    for row in rows:
        if row.get("kind") not in ("decode", "prefill") or not _number(row.get("ms")) or not row["rel_err"] < 1e-2:
            continue
        key = json.dumps(row["config"], sort_keys=True)
        configs[key] = row["config"]
        groups.setdefault((row["kind"], row["sliding"]), {}).setdefault(row["shape"], {})[key] = row["ms"]
    out: dict[str, list] = {}
    for (kind, sliding), shapes in sorted(groups.items()):
        best = _geomean_best(list(shapes.values()), higher_is_better=False)
        if best is None:
            continue
        times = "; ".join(
            f"{shape} {s[best] * 1e3:.1f} us (fastest {min(s.values()) * 1e3:.1f})" for shape, s in shapes.items()
        )
        note = f"{'sliding' if sliding else 'full'} layers: best geometric mean over {len(shapes)} shape(s): {times}"
        # The sweeps run BF16 caches; an FP32 cache keeps the defaults (the tiles may not fit its shared memory).
        entry = {"when": {"sliding": sliding, "elem_bytes": 2}, "config": configs[best], "source": f"{source}: {note}"}
        out.setdefault(f"attention.{kind}", []).append(entry)
    return out


# ------------------------------------------------------------------------------------------------- the table
def make_table(
    device: str,
    source: str,
    gemv: Iterable[dict] = (),
    moe: Iterable[dict] = (),
    attention: Iterable[dict] = (),
    fold_max_tokens: dict[str, int] | None = None,
    moe_shared: Iterable[dict] = (),
    kept_paths: dict[str, dict] | None = None,
) -> dict:
    """A tuning table from the sweeps' rows; `source` (date, GPU, command) starts every entry's source."""
    from flint_kernels import tuning

    table: dict = {"device": device}
    small_m = gemv_entries(gemv, source)
    if small_m:
        table["gemv.small_m"] = small_m
    table |= moe_entries(moe, source, fold_max_tokens, moe_shared, kept_paths)
    table |= attention_entries(attention, source)
    tuning.parse(table, "the new table")  # what the kernels will accept
    return table


def source_of(device: str, record: dict, sweeps: str) -> str:
    """The start of every entry's source: date, GPU, versions, the command and the file holding its raw times."""
    return (
        f"{record['date']}, {device} (torch {record['torch']}, Triton {record['triton']}), {record['command']}"
        f" ({sweeps})"
    )


def dumps(table: dict) -> str:
    """The table as JSON with one line per condition set, config and source (diffs stay readable)."""
    parts = []
    for key, value in table.items():
        if not isinstance(value, list):
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
            continue
        entries = [
            "    {\n" + ",\n".join(f"      {json.dumps(k)}: {json.dumps(v)}" for k, v in e.items()) + "\n    }"
            for e in value
        ]
        parts.append(f"  {json.dumps(key)}: [\n" + ",\n".join(entries) + "\n  ]")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_table(table: dict, path: Path) -> dict:
    """Write `table` to `path`, keeping the ops of the file it replaces that `table` has none of; returns it."""
    from flint_kernels import tuning

    merged = dict(table)
    if path.is_file():
        for op, entries in json.loads(path.read_text()).items():
            merged.setdefault(op, entries)
    ordered = {k: merged[k] for k in ("device", *tuning.OPS) if k in merged}
    tuning.parse(ordered, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(ordered))
    tuning.reload()
    return ordered


def measure(family: str, ms: list[int], ts: list[int], fold: dict[str, int]) -> dict:
    """Run one family's sweeps on the GPU: {"rows": ...} (and the MoE's routed + shared rows)."""
    if family == "gemv":
        return {"rows": kernels_moe_gemv.gemv_rows(ms, sweep=True, shapes=kernels_moe_gemv.SWEEP_SHAPES)}
    if family == "moe":
        rows = kernels_moe_gemv.moe_rows(ts, sweep=True)
        shared = kernels_moe_gemv.shared_rows([t for t in ts if t <= max(fold.values())])
        return {"rows": rows, "shared_rows": shared, "fold_max_tokens": fold}
    bench = kernels_attention.Bench(quick=False)
    rows = kernels_attention.sweep_prefill(bench, torch.bfloat16) + kernels_attention.sweep_decode(
        bench, torch.bfloat16
    )
    return {"rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=FAMILIES, default=list(FAMILIES), help="kernel families to tune")
    ap.add_argument("--install", action="store_true", help="write kernels/tuning/<key>.json (the shipped table)")
    ap.add_argument("--out", type=Path, help="write the table here instead")
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 8, 64], help="GEMV rows (the sweep covers 1, 8, 64)")
    ap.add_argument(
        "--ts", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 512, 2048, 8192], help="MoE tokens"
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("tune: needs a CUDA GPU (the Triton interpreter cannot time kernels); nothing was run", file=sys.stderr)
        return 1
    import triton
    from flint_kernels import moe_triton, tuning

    key, name = tuning.device_key(), torch.cuda.get_device_name()
    out = args.out or (TABLES / f"{key}.json" if args.install else RESULTS / f"tuning_{key}.json")
    sweeps_path = RESULTS / f"tuning_{key}_sweeps.json"
    command = " ".join(["python benchmarks/tune.py", *sys.argv[1:]])
    meta = {"date": date.today().isoformat(), "torch": torch.__version__, "triton": triton.__version__}
    meta["command"] = command
    source = source_of(name, meta, str(sweeps_path.relative_to(ROOT)))
    dev = torch.device("cuda")
    now = {f: moe_triton.paths_config(f == "nvfp4", dev) for f in ("bf16", "nvfp4")}
    fold = {f: paths.shared_fold_max_tokens for f, paths in now.items()}
    # The raw times, one record per family; families this run does not measure keep the file's earlier record.
    sweeps = json.loads(sweeps_path.read_text()) if sweeps_path.is_file() else {}
    sweeps = sweeps if sweeps.get("device") == name else {"device": name}
    start = time.time()
    for family in args.only:
        began = time.time()
        sweeps[family] = {**meta, **measure(family, args.ms, args.ts, fold), "seconds": round(time.time() - began)}
        RESULTS.mkdir(parents=True, exist_ok=True)
        sweeps_path.write_text(json.dumps(sweeps, indent=1) + "\n")  # after each family: a later one may fail
    ran = {f: sweeps[f] for f in args.only}
    table = make_table(
        name,
        source,
        ran.get("gemv", {}).get("rows", ()),
        ran.get("moe", {}).get("rows", ()),
        ran.get("attention", {}).get("rows", ()),
        fold_max_tokens=fold,
        moe_shared=ran.get("moe", {}).get("shared_rows", ()),
        kept_paths={f: dataclasses.asdict(paths) for f, paths in now.items()},
    )
    written = write_table(table, out)
    counts = ", ".join(f"{op} {len(v)}" for op, v in written.items() if isinstance(v, list))
    print(f"wrote {out} ({counts}) and {sweeps_path} in {time.time() - start:.0f} s")
    if not args.install:
        print(f"try it: FLINT_TUNING_FILE={out} python benchmarks/decode.py ...; install: --install (or copy it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
