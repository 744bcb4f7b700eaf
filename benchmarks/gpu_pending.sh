#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# Pending since 2026-12-01 (ninth session): the idle prefill budget. A step in which no running request is generating
# takes up to `idle_prefill_tokens` (default 8192 on the fused GPU path) instead of `max_num_batched_tokens` (2048).
# Judged through the engine (`benchmarks/engine_gpu.py --long-prompt`): an 8K prompt's time to first token alone and
# beside a decoding request, that request's inter-token gaps meanwhile, and the start-up (the warm-up now also runs
# the 8192-token shape), with the budget at 2048 (as before) and at its default. Expected from decode.py's chunked
# prefill (BF16, 2026-12-01): 206 -> 128 ms alone; unchanged gaps beside a decoding request.
# Earlier contents (the eighth session's CPU-built work, run on 2026-12-01): docs/performance.md, ninth session.
set -u
OUT=${OUT:-/tmp/flint-gpu}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# Each run starts an engine on the full-size random BF16 model (weights, warm-up, 8 decode graphs: ~80-100 s).
for idle in 2048 default; do
    flag=()
    [ "$idle" != default ] && flag=(--idle-prefill-tokens "$idle")
    timeout 270 python3 benchmarks/engine_gpu.py --model random:full --max-model-len 16384 --long-prompt 8192 \
        --no-sampling-rows "${flag[@]}" --out "$OUT/engine_idle_$idle.json" > "$OUT/engine_idle_$idle.txt" 2>&1
    echo "idle_prefill_tokens $idle: $(grep -E '^start-up|token prompt' "$OUT/engine_idle_$idle.txt" | tr '\n' ' ')"
done

# The device returns at most 8 files from $OUT: everything goes back as one archive (tar -xzf results.tgz).
(cd "$OUT" && tar -czf /tmp/flint-results.tgz . && find . -mindepth 1 -delete && mv /tmp/flint-results.tgz results.tgz)
