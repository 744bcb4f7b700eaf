#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# State in the thirteenth session (2026-12-01): `EngineConfig.async_decode` (off by default) launches each decode
# step before reading the previous one's tokens. Its first GPU run (that session) showed no gain: the tokens' read
# (`.tolist()` of a device tensor) queued its copy behind the step launched ahead and waited for it too, and the
# block tables went in from pageable memory (a copy that waits for the stream). Now the tokens come back through
# pinned memory and an event, the staging buffers take turns, and the tables copy from pinned memory (a grown row
# only its new entries). Here: the GPU tests (real CUDA graphs, async included) and the wall time per step with and
# without async decode. If it wins, turn it on by default (EngineConfig, ServeSettings, docs/deploy.md's knobs).
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
# Decode steps through the whole engine, NVFP4, greedy and sampled: by default 1 and 8 requests of 64 and 32K prompt
# tokens; HOST_BATCHES, HOST_PROMPTS, HOST_STEPS, MAX_MODEL_LEN choose others (e.g. HOST_BATCHES="16 32 64"
# HOST_PROMPTS="1024 16384" HOST_STEPS=100 MAX_MODEL_LEN=20000 SKIP_TESTS=1).
batches=${HOST_BATCHES:-1 8}
largest=$(echo $batches | tr ' ' '\n' | sort -n | tail -1)
for mode in sync async; do
    flag="--async-decode"; [ $mode = sync ] && flag="--no-async-decode"
    # shellcheck disable=SC2086
    timeout 280 python3 benchmarks/engine_gpu.py --host-profile $batches --host-profile-prompt ${HOST_PROMPTS:-64 32768} \
        --host-profile-steps "${HOST_STEPS:-200}" --max-num-seqs "$(( largest > 8 ? largest : 8 ))" --no-sampling-rows \
        --max-model-len "${MAX_MODEL_LEN:-40000}" $flag --out "$OUT/engine_host_$mode.json" > "$OUT/engine_host_$mode.txt" 2>&1
    echo "== $mode"; grep -E "^host profile.*a step$|^start-up|Error" "$OUT/engine_host_$mode.txt" | cut -c1-220
done

# The device returns at most 8 files from $OUT: everything goes back as one archive (tar -xzf results.tgz).
(cd "$OUT" && tar -czf /tmp/flint-results.tgz . && find . -mindepth 1 -delete && mv /tmp/flint-results.tgz results.tgz)
