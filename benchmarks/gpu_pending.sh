#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# Pending since 2026-12-01 (tenth session). The ninth session's idle prefill budget was run once (2026-12-01, tenth
# session's first call): TTFT alone 229.7 ms with steps of 2048, 53.9 ms with 8192 (below decode.py's 127.9 ms
# one-chunk prefill: to be explained), and beside a decoding request a 4.9 s gap in the run on a cold Triton cache
# (a kernel compiled after the warm-up). Now: the late-compile watch (flint_engine/late_compiles.py) names any kernel
# Triton compiles after the warm-up, `engine_gpu.py` lists each step's wall time and, with --profile-long, the
# prompt's kernels by family, and with --churn N serving-like mixed traffic. Both run on a cold Triton cache (what
# a fresh replica meets).
set -u
OUT=${OUT:-/tmp/flint-gpu}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

python3 -m pytest -q -p no:cacheprovider tests/test_late_compiles.py tests/test_sampler.py > "$OUT/tests.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/test_kernels_moe_align.py -k gpu >> "$OUT/tests.txt" 2>&1
echo "tests: $(grep -E ' passed| failed' "$OUT/tests.txt" | tr '\n' ' ')"
# Each run starts an engine on the full-size random model (weights, warm-up, decode graphs: ~1-2.5 min on a cold
# Triton cache), times an 8K prompt alone and beside a decoding request, then 200 requests of serving-like traffic.
for model in random:full random:full:nvfp4; do
    tag=${model//:/_}
    timeout 250 python3 benchmarks/engine_gpu.py --model "$model" --max-model-len 16384 --max-num-seqs 32 \
        --long-prompt 8192 --churn 200 --no-sampling-rows --out "$OUT/engine_$tag.json" > "$OUT/engine_$tag.txt" 2>&1
    echo "$model:"
    grep -E '^start-up|token prompt|^  |^churn|compiled after|Error' "$OUT/engine_$tag.txt" | cut -c1-600
done
# The kernels that no longer specialise on batch counts (MoE, its grouping, prefill attention): decode and prefill
# against the ninth session's BF16 figures (b1 2.71, b32 12.97 ms, 8K prefill 127.9 ms).
timeout 150 python3 benchmarks/decode.py --formats bf16 --batches 1 32 --contexts 1024 --prefill 8192 \
    --check-steps 0 --reps 20 --deadline-s 120 --out "$OUT/decode_bf16.json" > "$OUT/decode_bf16.txt" 2>&1
tail -6 "$OUT/decode_bf16.txt"

# The device returns at most 8 files from $OUT: everything goes back as one archive (tar -xzf results.tgz).
(cd "$OUT" && tar -czf /tmp/flint-results.tgz . && find . -mindepth 1 -delete && mv /tmp/flint-results.tgz results.tgz)
