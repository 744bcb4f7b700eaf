#!/usr/bin/env bash
# The kernel microbenchmarks in one device call (one H200), results under $OUT; the acceptance runs are
# benchmarks/gpu_session.sh. Run: bash benchmarks/gpu_kernels.sh (device `run`, carry [".whl"]).
# Measured 2026-11-30: router ~35 s, dequantisation ~30 s, NVFP4 MoE decode sweep ~50 s, sampler ~40 s (its two
# compiled variants take 15-27 s each); the GEMV sweep (M = 2-64 with packed candidates) ~110 s.
set -u
OUT=${OUT:-/tmp/flint-gpu}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

timeout 80 python3 benchmarks/kernels_router.py --tokens 32 512 2048 8192 --out "$OUT/kernels_router.json" \
    > "$OUT/router.txt" 2>&1
grep -E "^T=|default" "$OUT/router.txt"

timeout 80 python3 benchmarks/kernels_dequant.py --out "$OUT/kernels_dequant.json" > "$OUT/dequant.txt" 2>&1
grep -v "^wrote" "$OUT/dequant.txt"

timeout 120 python3 benchmarks/kernels_moe_gemv.py --only moe --formats nvfp4 --ts 16 32 64 --sweep \
    --out "$OUT/moe_decode_sweep.json" > "$OUT/moe.txt" 2>&1
tail -8 "$OUT/moe.txt"

timeout 150 python3 benchmarks/kernels_moe_gemv.py --only gemv --ms 2 8 32 64 --sweep \
    --out "$OUT/gemv_sweep.json" > "$OUT/gemv.txt" 2>&1
tail -12 "$OUT/gemv.txt"

timeout 100 python3 benchmarks/sampler.py --device cuda --chunks 4096 > "$OUT/sampler.txt" 2>&1
cp benchmarks/results/sampler_cuda.json "$OUT/" 2>/dev/null
tail -6 "$OUT/sampler.txt"
