#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: bash benchmarks/gpu_pending.sh (device `run`, carry
# [".whl"]).
#
# State after the sixteenth session's first call (2026-12-02): the per-pair NVFP4 MoE now runs from 17 tokens up
# (the expert-major gate_up lost at 33-64 by 8-10%) and NVFP4 GEMVs of 2 rows run on the FMA path (b2 -16.6%). Open:
# the same FMA tiles at 3-4 rows as 2-row programs, whole-K steps at 2 rows, the batch-1 MoE and attention split
# knobs, and at 33-64 tokens the per-pair MoE's tiles and 32-column NVFP4 GEMV tiles. Each A/B below runs its variants
# in the same alternating rounds as the default table (decode.py, several --ab-tuning-file). Then, as before: the GPU
# tests of the graphs and the sampler, and the engine's wall time per step at 1-64 requests with and without async
# decode, with any late compile named (SKIP_HOST=1 leaves that out). Through the server: `benchmarks/gpu_serve.sh`
# (two calls).
set -u
OUT=${OUT:-/tmp/flint-gpu}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
ln -sfn "$PWD/deployments" /tmp/pp/flint_serve
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

V=/tmp/variants; mkdir -p $V
variant() { python3 benchmarks/tuning_variant.py "$@" > /dev/null || echo "variant failed: $*"; }
# Batch 1-4: FMA rows at 3-4 rows in 2-row programs; 2 rows in whole-K steps; the MoE's gate_up in whole-K steps (no
# split-K semaphore), also in 4-column tiles; the decode attention with fewer splits (sliding, full layers).
variant --op gemv.small_m --when '{"m_min": 2, "m_max": 2, "nvfp4": true}' --add '{"m_min": 3, "m_max": 4, "nvfp4": true}' \
    --set block_m=2 --out $V/rows34_m2.json
variant --op gemv.small_m --when '{"m_min": 2, "m_max": 2, "nvfp4": true}' --set block_k=2048 --out $V/rows2_k2048.json
variant --op moe.decode --when '{"nvfp4": true, "tokens_max": 4}' --set gu_block_k=2048 --out $V/moe_gk2048.json
variant --op moe.decode --when '{"nvfp4": true, "tokens_max": 4}' --set gu_block_i=4 gu_block_k=2048 \
    --out $V/moe_gi4_gk2048.json
variant --op attention.decode --when '{"sliding": true, "elem_bytes": 2}' --set min_keys_per_split=256 \
    --out $V/attn_slide256.json
variant --op attention.decode --when '{"elem_bytes": 2}' --set min_keys_per_split=512 --out $V/attn_full512.json
timeout 280 python3 benchmarks/decode.py --formats nvfp4 --batches 1 2 3 4 --contexts 1024 --prefill 0 --reps 30 \
    --check-steps 0 --no-plain-timing --ab-tuning-file $V/rows34_m2.json $V/rows2_k2048.json $V/moe_gk2048.json \
    $V/moe_gi4_gk2048.json $V/attn_slide256.json $V/attn_full512.json --profile-batches 2 3 \
    --out "$OUT/decode_nvfp4_small_ab.json" > "$OUT/decode_small_ab.txt" 2>&1
echo "== NVFP4 b1-4: default vs each variant"
grep "A/B rounds\|Error" "$OUT/decode_small_ab.txt" | sed 's/ctx 1024 A.B rounds: //; s/--ab-ops None, --ab-tuning-file //'
# 33-64 tokens: the per-pair MoE in 4 warps with 32-column down tiles, or 32-column gate_up tiles; NVFP4 GEMV tiles of
# 32 columns (the 2-32 rows' width).
variant --op moe.decode --when '{"nvfp4": true, "tokens_min": 17}' --add '{"nvfp4": true, "tokens_min": 33}' \
    --set num_warps=4 dn_block_n=32 --out $V/moe33_w4_dn32.json
variant --op moe.decode --when '{"nvfp4": true, "tokens_min": 17}' --add '{"nvfp4": true, "tokens_min": 33}' \
    --set num_warps=4 gu_block_i=32 --out $V/moe33_w4_gi32.json
variant --op gemv.small_m --when '{"m_min": 33, "m_max": 64}' --add '{"m_min": 33, "m_max": 64, "nvfp4": true}' \
    --set block_n=32 --out $V/gemv33_n32.json
timeout 240 python3 benchmarks/decode.py --formats nvfp4 --batches 33 48 64 --contexts 1024 --prefill 0 --reps 30 \
    --check-steps 0 --no-plain-timing --ab-tuning-file $V/moe33_w4_dn32.json $V/moe33_w4_gi32.json \
    $V/gemv33_n32.json --profile-batches 64 --out "$OUT/decode_nvfp4_large_ab.json" > "$OUT/decode_large_ab.txt" 2>&1
echo "== NVFP4 b33-64: default vs each variant"
grep "A/B rounds\|Error" "$OUT/decode_large_ab.txt" | sed 's/ctx 1024 A.B rounds: //; s/--ab-ops None, --ab-tuning-file //'
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
