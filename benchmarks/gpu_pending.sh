#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# State after the fifteenth session (2026-12-02): the NVFP4 FMA path reads whole int64 groups (b32 18.3 -> 13.9 ms),
# which made the expert-major gate_up from 17 tokens 15% slower than the per-pair path; whether the table's
# expert-major from 33 tokens still wins at 33-64 was not measured (no device time left). First step below: that
# whole-step A/B (the >= 33 entry as per-pair 16 x 512 tiles in 2 warps, the 17-32 tokens config), b33-64. Second:
# NVFP4 GEMVs of 2-8 rows on the FMA path against the tensor-core tiles (below). Then, as before: the GPU tests of the graphs and the sampler, and the engine's wall time per step at 1-64 requests with and
# without async decode, with any late compile named (SKIP_HOST=1 leaves that out). Through the server:
# `benchmarks/gpu_serve.sh` (two calls).
set -u
OUT=${OUT:-/tmp/flint-gpu}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
ln -sfn "$PWD/deployments" /tmp/pp/flint_serve
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_min": 33}' \
    --set expert_major=false gu_block_k=512 --out /tmp/per_pair_from_33.json > /dev/null
timeout 240 python3 benchmarks/decode.py --formats nvfp4 --batches 33 48 64 --contexts 1024 --prefill 0 --reps 30 \
    --check-steps 0 --ab-tuning-file /tmp/per_pair_from_33.json --profile-batches 64 \
    --out "$OUT/decode_nvfp4_per_pair_from_33_ab.json" > "$OUT/decode_ab.txt" 2>&1
echo "== NVFP4 MoE >= 33 tokens: expert-major (default) vs per-pair (variant)"
grep "A/B rounds\|Error" "$OUT/decode_ab.txt"
# NVFP4 GEMVs of 2-8 rows on the FMA path (each weight decoded once for every row; built in the fifteenth session,
# sm_90 SASS 3.1-4.8 instructions a weight value and row against the tensor-core tiles' decode) against the table's
# tensor-core tiles, whole step at b2-b8; its GPU test first.
timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/test_kernels_gemv.py \
    -k several_rows > "$OUT/tests_rows.txt" 2>&1
echo "several-rows FMA tests: $(tail -1 "$OUT/tests_rows.txt")"
python3 - <<'PY'
import json
t = json.load(open("kernels/tuning/nvidia-h200.json"))
ops = t["gemv.small_m"]
at = next(i for i, e in enumerate(ops) if e["when"].get("m_min") == 2)
for lo, hi, bm in ((2, 2, 2), (3, 4, 4), (5, 8, 8)):
    cfg = {"block_n": 8, "block_m": bm, "block_k": 1024, "use_dot": False, "num_warps": 4, "num_stages": 1}
    ops.insert(at, {"when": {"m_min": lo, "m_max": hi, "nvfp4": True}, "config": cfg, "source": "variant"})
    at += 1
json.dump(t, open("/tmp/fma_rows.json", "w"))
PY
timeout 200 python3 benchmarks/decode.py --formats nvfp4 --batches 2 4 8 --contexts 1024 --prefill 0 --reps 30 \
    --check-steps 0 --ab-tuning-file /tmp/fma_rows.json --out "$OUT/decode_nvfp4_fma_rows_ab.json" > "$OUT/decode_ab2.txt" 2>&1
echo "== NVFP4 GEMV at 2-8 rows: tensor cores (default) vs FMA rows (variant)"
grep "A/B rounds\|Error" "$OUT/decode_ab2.txt"
[ "${SKIP_HOST:-0}" = 1 ] && SKIP_TESTS=1
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
    [ "${SKIP_HOST:-0}" = 1 ] && break
    flag="--async-decode"; [ $mode = sync ] && flag="--no-async-decode"
    # shellcheck disable=SC2086
    timeout 280 python3 benchmarks/engine_gpu.py --host-profile $batches --host-profile-prompt ${HOST_PROMPTS:-1024} \
        --host-profile-steps "${HOST_STEPS:-100}" --max-num-seqs "$(( largest > 8 ? largest : 8 ))" --no-sampling-rows \
        --max-model-len "${MAX_MODEL_LEN:-4096}" $flag --out "$OUT/engine_host_$mode.json" > "$OUT/engine_host_$mode.txt" 2>&1
    echo "== $mode"; grep -E "^host profile.*a step$|^start-up|Error|after the warm-up" "$OUT/engine_host_$mode.txt" | cut -c1-1500
done

# The device returns at most 8 files from $OUT: everything goes back as one archive (tar -xzf results.tgz).
(cd "$OUT" && tar -czf /tmp/flint-results.tgz . && find . -mindepth 1 -delete && mv /tmp/flint-results.tgz results.tgz)
