#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# State in the twelfth session (2026-12-01): an engine started from a checkpoint file begins the kernel precompile
# from the checkpoint's header, before the weights load, so the two overlap (before: load, then precompile, then
# the warm-up). Judged here: its GPU test, and a cold start from a full-size NVFP4 GGUF both ways.
set -u
OUT=${OUT:-/tmp/flint-gpu}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

timeout 240 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_precompile.py tests/test_kernel_profile.py \
    > "$OUT/tests.txt" 2>&1
echo "tests: $(tail -1 "$OUT/tests.txt")"
# A full-size NVFP4 checkpoint (~22 GB), drawn on the GPU.
CK=/tmp/flint-full-nvfp4.gguf
t0=$(date +%s)
timeout 300 python3 -m flint_engine.cli make-checkpoint --preset full --format nvfp4 --device cuda --out $CK --quiet \
    > "$OUT/make_checkpoint.txt" 2>&1
echo "make-checkpoint: rc $? in $(( $(date +%s) - t0 )) s, $(du -h $CK | cut -f1)"
free -g | head -2
# Engine starts from it on an empty Triton cache: precompile after the load (as before) vs begun before it. Both read
# the file from the page cache (it was just written).
timeout 330 python3 benchmarks/cold_start.py --models $CK --skip-serial --no-warm --after-load --timeout 150 \
    --out benchmarks/results/cold_start_checkpoint_h200.json > "$OUT/cold_start.txt" 2>&1
grep -v '^{' "$OUT/cold_start.txt" | grep -v '^ *$' | tail -3
python3 -c '
import json
for r in json.load(open("benchmarks/results/cold_start_checkpoint_h200.json"))["rows"]:
    p = r["precompile"] or {}
    print(r["start"], "start-up", r["startup_s"], "s; precompile", p.get("seconds"), "s;", " | ".join(r["log"]))'
cp benchmarks/results/cold_start_checkpoint_h200.json "$OUT/" 2>/dev/null
rm -f $CK

# The device returns at most 8 files from $OUT: everything goes back as one archive (tar -xzf results.tgz).
(cd "$OUT" && tar -czf /tmp/flint-results.tgz . && find . -mindepth 1 -delete && mv /tmp/flint-results.tgz results.tgz)
