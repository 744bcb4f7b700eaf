#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# State after the seventeenth session (2026-12-02): NVFP4 GEMVs of 2-4 rows run on the FMA path in 2-row programs with
# whole-K steps, 33-64 rows in 32-column tensor-core tiles; the NVFP4 MoE runs per pair, 8 x 1024 / 8 x 512 tiles at 1
# token, 8 x 1024 / 32 x 512 at 2 (b2 2.95 -> 2.74 ms), 16 x 512 / 32 x 512 in 4 warps from 3 (b3 -8%, b4 -11%). Open,
# one A/B (each variant in the same alternating rounds as the table): the 2 tokens' gate_up at 3-4 tokens, whole-K
# gate_up steps at 2, 4-column GEMV programs at 2-4 rows; the sampler's filtered chunk kernel (FILTER) against the
# sorted rows. Then the GEMV, MoE and sampling GPU tests and the whole step with the table as installed, the fused
# path checked against the plain one at batch 1 and 2.
# SKIP_AB=1 leaves the A/B out, SKIP_CHECK=1 the tests and check, RECORD=1 then records the NVFP4 profile of the
# kernel manifest again (benchmarks/gpu_record_manifest.sh). SKIP_HOST=0 adds, as before: the GPU tests of the graphs
# and the sampler, and the engine's wall time per step at 1-64 requests with and without async decode. Through the
# server: `benchmarks/gpu_serve.sh` (two calls).
set -u
. benchmarks/gpu_env.sh

if [ "${SKIP_AB:-0}" != 1 ]; then
V=/tmp/variants; mkdir -p $V
variant() { python3 benchmarks/tuning_variant.py "$@" > /dev/null || echo "variant failed: $*"; }
# ab NAME FORMAT SECONDS "BATCHES" VARIANT...: the whole step at 1K context, default table vs each variant.
ab() {
    local name=$1 fmt=$2 secs=$3 batches=$4; shift 4
    # shellcheck disable=SC2086
    timeout "$secs" python3 benchmarks/decode.py --formats "$fmt" --batches $batches --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file "$@" --out "$OUT/decode_${name}_ab.json" \
        > "$OUT/decode_${name}_ab.txt" 2>&1
    echo "== $name: default vs each variant"
    grep "A/B rounds\|Error" "$OUT/decode_${name}_ab.txt" \
        | sed 's/ctx 1024 A.B rounds: //; s/--ab-ops None, --ab-tuning-file //'
}
# NVFP4 at 2-4 tokens after the seventeenth session (2 tokens: gate_up 8 x 1024 with down 32 x 512; from 3 the tiles
# from 5, 16 x 512 / 32 x 512): the 2 tokens' gate_up at 3-4 tokens, the 2 tokens' gate_up in whole-K steps, and the
# 2-4 rows' GEMV programs in 4 columns (8 now).
variant --op moe.decode --when '{"nvfp4": true}' --add '{"nvfp4": true, "tokens_min": 3, "tokens_max": 4}' \
    --set gu_block_i=8 gu_block_k=1024 --out $V/moe34_gu8x1024.json
variant --op moe.decode --when '{"nvfp4": true, "tokens_min": 2, "tokens_max": 2}' --set gu_block_k=2048 \
    --out $V/moe2_gu_whole_k.json
variant --op gemv.small_m --when '{"m_min": 2, "m_max": 4, "nvfp4": true}' --set block_n=4 --out $V/rows24_n4.json
ab nvfp4 nvfp4 150 "2 3 4" $V/moe34_gu8x1024.json $V/moe2_gu_whole_k.json $V/rows24_n4.json
# The sampler's filtered chunk kernel (`sampling_triton.FILTER`, built in the seventeenth session, off until timed):
# the op's GPU time at batch 1-64 with and without it (a sampled step took 0.16 ms more than a greedy one at batch
# 1, 0.56 at 64), the same tokens checked on each.
timeout 150 python3 benchmarks/sampler.py --device cuda --chunks 4096 --filter --iters 30 > "$OUT/sampler.txt" 2>&1
cp benchmarks/results/sampler_cuda.json "$OUT/" 2> /dev/null
echo "== sampler, filtered chunk kernel"; sed -n '/^sampling over/,$p' "$OUT/sampler.txt"; grep Error "$OUT/sampler.txt"
fi
if [ "${SKIP_CHECK:-0}" != 1 ]; then
timeout 150 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider -n 12 tests/test_kernels_gemv.py \
    tests/test_kernels_moe.py tests/test_kernels_sampling.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests (GEMV, MoE, sampling): $(tail -1 "$OUT/gpu_tests.txt")"
grep -E "^E |FAILED" "$OUT/gpu_tests.txt" | head -6
# The table as installed: the whole step at 1-64 and the fused path against the plain one at batch 1 and 2.
timeout 200 python3 benchmarks/decode.py --formats nvfp4 --batches 1 2 4 8 32 64 --contexts 1024 --prefill 0 \
    --reps 30 --check-batches 1 2 --check-steps 32 --profile-batches 1 2 32 64 \
    --out "$OUT/decode_nvfp4_table.json" > "$OUT/decode_table.txt" 2>&1
sed -n '/^ *fmt *batch/,$p' "$OUT/decode_table.txt" | grep -v " x .* us = " | head -40
grep "Error" "$OUT/decode_table.txt" | head -5
fi
# RECORD=1: then the NVFP4 profile of the kernel manifest again, for the table as installed (~220 s).
[ "${RECORD:-0}" = 1 ] && OUT="$OUT" bash benchmarks/gpu_record_manifest.sh
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
