#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# State after the fourteenth session (2026-12-02): nothing built without a GPU is waiting. That session judged the
# thirteenth's scheduling (length-ending requests left out of the step ahead, a saturated server launching ahead:
# 609 vs 526 output tok/s at concurrency 32 through the server) and measured async decode at 1-64 requests (11-14%
# less a step at 32-64); its warm-up change (mixed steps with 16 and 32 decode rows) left 0 kernels compiled after the
# warm-up at 64 requests. The defaults re-run that: the GPU tests of the graphs and the sampler, then the engine's
# wall time per step at 1-64 requests with and without async decode, and any late compile (named by its variant).
# Through the server: `benchmarks/gpu_serve.sh` (two calls).
set -u
OUT=${OUT:-/tmp/flint-gpu}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
ln -sfn "$PWD/deployments" /tmp/pp/flint_serve
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout 200 python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/test_cuda_graphs.py \
        tests/test_sampler.py tests/test_kernels_sampling.py > "$OUT/tests.txt" 2>&1
    echo "tests: $(tail -1 "$OUT/tests.txt")"
    grep -E "^E |FAILED" "$OUT/tests.txt" | head -6
fi
# Decode steps through the whole engine, NVFP4, greedy and sampled: by default 1, 8, 32 and 64 requests of 1K prompt
# tokens (~2 min a mode); HOST_BATCHES, HOST_PROMPTS, HOST_STEPS, MAX_MODEL_LEN choose others (the twelfth session's
# table: HOST_BATCHES="1 8" HOST_PROMPTS="64 32768" HOST_STEPS=200 MAX_MODEL_LEN=40000). Mind the time box: a start
# at --max-num-seqs 64 takes ~70 s, and 64 prompts of 16K tokens took the rest of 280 s in both modes.
batches=${HOST_BATCHES:-1 8 32 64}
largest=$(echo "$batches" | tr ' ' '\n' | sort -n | tail -1)
for mode in sync async; do
    flag="--async-decode"; [ $mode = sync ] && flag="--no-async-decode"
    # shellcheck disable=SC2086
    timeout 280 python3 benchmarks/engine_gpu.py --host-profile $batches --host-profile-prompt ${HOST_PROMPTS:-1024} \
        --host-profile-steps "${HOST_STEPS:-100}" --max-num-seqs "$(( largest > 8 ? largest : 8 ))" --no-sampling-rows \
        --max-model-len "${MAX_MODEL_LEN:-4096}" $flag --out "$OUT/engine_host_$mode.json" > "$OUT/engine_host_$mode.txt" 2>&1
    echo "== $mode"; grep -E "^host profile.*a step$|^start-up|Error|after the warm-up" "$OUT/engine_host_$mode.txt" | cut -c1-1500
done

# The device returns at most 8 files from $OUT: everything goes back as one archive (tar -xzf results.tgz).
(cd "$OUT" && tar -czf /tmp/flint-results.tgz . && find . -mindepth 1 -delete && mv /tmp/flint-results.tgz results.tgz)
