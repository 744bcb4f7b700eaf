#!/usr/bin/env bash
# The kernel microbenchmarks in one device call (one H200), results under $OUT; the acceptance runs are
# benchmarks/gpu_session.sh. Run: bash benchmarks/gpu_kernels.sh (device `run`, carry [".whl"]).
# Measured 2026-11-30: router ~35 s (4 batch sizes; ~60 s with the K-split rows at 17-64 tokens), dequantisation
# ~30 s, NVFP4 MoE decode sweep ~50 s, sampler ~40 s (its two compiled variants take 15-27 s each); the GEMV sweep
# (M = 2-64 with packed candidates) ~110 s. Not yet timed: the shared-expert rows and the attention sweep (first).
# With them the whole may pass the 10-minute limit of one call: then run the tail in a second call.
set -u
. benchmarks/gpu_env.sh

# The prefill MoE's grouping of pairs by expert: three Triton launches against the PyTorch reference's ~25.
timeout 60 python3 benchmarks/kernels_moe_align.py --out "$OUT/kernels_moe_align.json" > "$OUT/moe_align.txt" 2>&1
grep -v "^wrote" "$OUT/moe_align.txt"

# Routed + shared expert at batch 9-64: apart (the H200 default) against folded into the expert-major launches with
# the slots summed in the down launch (`slots_in_down`, row "folded dot expert ... slots").
timeout 120 python3 benchmarks/kernels_moe_gemv.py --only shared --ts 9 16 32 64 --out "$OUT/moe_shared.json" \
    > "$OUT/moe_shared.txt" 2>&1
grep '^{' "$OUT/moe_shared.txt"

# Decode attention launch parameters, incl. batch 32-64 at 1K context (fewer splits).
timeout 150 python3 benchmarks/kernels_attention.py --sweep --sweep-parts decode > "$OUT/attention_sweep.txt" 2>&1
cp benchmarks/results/kernels_attention_sweep.json "$OUT/" 2>/dev/null
grep "^best" "$OUT/attention_sweep.txt"

timeout 150 python3 benchmarks/kernels_router.py --tokens 17 32 64 512 2048 8192 --out "$OUT/kernels_router.json" \
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

# The device returns at most 8 files from $OUT: everything goes back as one archive (tar -xzf results.tgz).
(cd "$OUT" && tar -czf /tmp/flint-results.tgz . && find . -mindepth 1 -delete && mv /tmp/flint-results.tgz results.tgz)
