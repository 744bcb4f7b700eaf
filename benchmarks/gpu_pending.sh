#!/usr/bin/env bash
# What was built without a GPU and is not yet judged, in one device call (one H200), results under $OUT (returned as
# one results.tgz: the device sends back at most 8 files). Run: SKIP_HOST=1 SKIP_AB=1 SKIP_CHECK=1 FLAG=1 bash
# benchmarks/gpu_pending.sh (device `run`, carry [".whl"]); each experiment is a block behind its FLAG below.
#
# Next (the sixty-second to sixty-fourth sessions got no machine: every start refused; run first `FORCED8=1
# FORCED8_PROBE=0 FORCED8_STEPS="32 256" FORCED8_BUDGET=540`, the check at 8 sequences in one call, the probe left out;
# and, in a call of its own (~2 min), the sixty-fourth session's GPU test of logprobs, a bias and min_tokens' ban drawn
# on the device beside the tokens: `python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider
# tests/test_cuda_graphs.py tests/test_sampler.py`, then SKIP_HOST=0's engine profile to see async decode's share).
# State after the sixty-first session, 2026-12-07: the check at 8 sequences cut again on H100s, its prefill
# logits alone 342 s, then 232 s; `prefill_probe.py` found the plain path un-permuting ready codes bit by bit at
# every use of a weight (now four byte-table lookups) and the fused path compiling once per prompt length (the
# check now prefills its prompts together): rerun it first (FORCED8=1: the probe, then 32 steps; FORCED8_STEPS=256
# next); after the sixtieth, two H100 calls
# for it, both cut by their limits before any output; after the fifty-ninth, one H100 for one short call, FLEX=1 at 8K: Flex's kernel 12%
# faster than ours, slower with the sinks added, not installed; after the fifty-eighth, H100s only:
# FORCED ran, the fused path's greedy choice differing from the plain path's only at near-ties over 256 teacher-forced
# steps, BF16 at 1 and 8 sequences and NVFP4 at 1; the status figures on an H100 within 1.1% of the fifty-sixth
# session's; no H200 since the fiftieth session):
#   the status figures on an H200 with the fiftieth to fifty-second sessions' installs (`decode.py --formats nvfp4
#                 bf16 --batches 1 2 4 8 16 32 64 --prefill 8192 --profile-batches 1`);
#   NVFP4's teacher-forced check at 8 sequences (`decode.py --formats nvfp4 --batches 1 --prefill 0 --check-steps N
#                 --check-batches 8`): its plain path dequantises at each use, and at 8 sequences neither 256 steps
#                 (560 s) nor 128 (420 s) ended within a call on an H100 (sixtieth session, ~980 s of device time with
#                 nothing printed): take --check-steps 32 first; decode.py now prints each phase of the check as it
#                 ends, so a cut call says how far it got. (Sixty-first: `python3 benchmarks/prefill_probe.py
#                 --layers 6 --lengths 37 48 114` first, ~2 minutes, shows the plain path's seconds a prefill now.)
# AFTER_BESIDE ran too (H100): the gate_up in 8-row programs at 3-8 tokens won (b7 -3.1%, b8 -2.6%), installed.
# Judged and kept only as commands: L2_ALL and USED (lost 13-16% and 3-15%; their kernel options removed), WIDE_SPLIT
# (2 and 4 K splits at 17-32 rows lost 3-19%), EXPERTS_AHEAD (lost 1-15%; its kernel removed), REG_CAP
# (lost 0.9-6.7%; `max_registers` removed), ADD_IN_DOWN (lost 3.5-6.4%; `dn_add` removed), B1_PROBE (lost
# 0.3-3.0%), LM_PROBE (even / +0.5%). An H100 runs the H200's table and manifest (`tuning.SIBLINGS`; the
# fortieth session's calls set FLINT_TUNING_FILE to it, before that): the A/Bs compare the same tables there.
#
# The blocks of experiments already judged stay as the commands docs/performance.md quotes for their figures; each
# block's comment says when it ran and what it found. Recipes kept for later use: SMALL_AB=1 (the MMA MoE below the
# batches it is installed at), L2_AB=1 (the gate_up's L2 requests), DOWN_L2=1 (the down's, and the o projection in
# 8 K splits), MMA_AB=1 (the rows kernel's K splits), RADIX=1 (the sampler's modes and their op time), PREFILL_AB=1
# (the NVFP4 prefill's alpha epilogue against the FP32 output and scale pass), GRAPH_PROFILE=1 (the decode graph's
# replay profiled). On a fresh machine the check's tests and table need a call each with RECORD=1 (CHECK_TESTS=0 /
# CHECK_TABLE=0). This script ends by packing $OUT into results.tgz: append nothing that writes results.tgz after it.
#
# SKIP_AB=1 leaves the MMA kernels' tests and benchmark out (MMA_TESTS=0 the tests only; MMA_BENCH_ARGS replaces the
# benchmark's arguments), SKIP_CHECK=1 the tests and check, RECORD=1 records the NVFP4 profile of the kernel manifest
# again (benchmarks/gpu_record_manifest.sh). SKIP_HOST=0 adds, as before: the GPU tests of the graphs and the sampler,
# and the engine's wall time per step at 1-64 requests with and without async decode (the sampled step's cost since
# the filter is not measured yet). Through the server: `benchmarks/gpu_serve.sh` (two calls; REQUESTS=256 for a run
# long enough to compare).
set -u
. benchmarks/gpu_env.sh
# gpu_tests LABEL NAME LIMIT PYTEST-ARGS...: GPU tests into $OUT/NAME.txt, their last line and first failures printed.
# Verbose, so a run cut short by its time limit still names each test that failed (the summary comes only at the end).
gpu_tests() {
    local label=$1 name=$2 limit=$3
    shift 3
    timeout "$limit" python3 -m pytest -v -m gpu --noconftest -p no:cacheprovider "$@" > "$OUT/$name.txt" 2>&1
    echo "$label: $(tail -1 "$OUT/$name.txt")"
    grep -E "^E |FAILED" "$OUT/$name.txt" | head -6
}
# ab_rounds FILE...: the whole-step A/B rounds `benchmarks/decode.py --ab-tuning-file` printed into these files.
ab_rounds() {
    grep -h "A/B rounds\|Error" "$@" | sed 's/ctx 1024 A.B rounds: //; s/--ab-ops None, --ab-tuning-file //'
}
# decode_ab NAME LIMIT LABEL "DECODE-ARGS" VARIANT...: the whole step (`benchmarks/decode.py` with those arguments,
# 1K context) against each VARIANT table in alternating rounds, into $OUT/decode_NAME_ab.*; prints the rounds and
# keeps the variants.
decode_ab() {
    local name=$1 limit=$2 label=$3 args=$4
    shift 4
    # shellcheck disable=SC2086  # the arguments are a list of words
    timeout "$limit" python3 benchmarks/decode.py $args --contexts 1024 --prefill 0 --reps 30 --check-steps 0 \
        --no-plain-timing --ab-tuning-file "$@" --out "$OUT/decode_${name}_ab.json" > "$OUT/decode_${name}_ab.txt" 2>&1
    echo "== whole step: table vs $label"
    ab_rounds "$OUT/decode_${name}_ab.txt"
    cp "$@" "$OUT/"
}
# step_ab FORMAT NAME VARIANT LABEL: `decode_ab` at 9, 16, 32 and 64 sequences, with the b32 profile's top.
step_ab() {
    decode_ab "$2" 300 "$4 ($1)" "--formats $1 --batches 9 16 32 64 --profile-batches 32" "$3"
    grep -E "GPU ms by kernel family|x .* us = " "$OUT/decode_${2}_ab.txt" | head -8
}
# table_against NAME LIMIT SESSION OLD DECODE-ARGS...: the shipped table against an older one (OLD, that session's) in
# alternating rounds, both formats at 1K context, into $OUT/decode_NAME_ab.*; prints the rounds, the batch-1 kernel
# counts and the eager profile's families and launches.
table_against() {
    local name=$1 limit=$2 session=$3 old=$4
    shift 4
    timeout "$limit" python3 benchmarks/decode.py --formats nvfp4 bf16 --contexts 1024 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --profile-batches 1 "$@" --ab-tuning-file "$old" \
        --out "$OUT/decode_${name}_ab.json" > "$OUT/decode_${name}_ab.txt" 2>&1
    echo "== whole step: the shipped table vs the $session session's"
    ab_rounds "$OUT/decode_${name}_ab.txt"
    grep -o "\"format\": \"[a-z0-9]*\", \"batch\": 1, .*\"kernels_per_step\": [0-9]*" "$OUT/decode_${name}_ab.txt" \
        | sed "s/, \"context.*kernels_per_step/ kernels_per_step/"
    grep -E "GPU ms by kernel family|x .* us = " "$OUT/decode_${name}_ab.txt" | head -24
}
# moe_entries_variant FIELD=VALUE OUT LO...: the table with FIELD set in each NVFP4 moe.decode entry from LO tokens.
moe_entries_variant() {
    local set=$1 out=$2 t="" lo
    shift 2
    for lo in "$@"; do
        python3 benchmarks/tuning_variant.py ${t:+--table $t} --op moe.decode \
            --when "{\"nvfp4\": true, \"tokens_min\": $lo}" --set "$set" --out "$out.$lo" > /dev/null \
            || echo "variant failed: $set from $lo"
        t=$out.$lo
    done
    cp "$t" "$out"
}
# modes_ab VAR NAME LIMIT MODE...: the NVFP4 step at 1, 8, 32 and 64 sequences (1K context) and the 8K prefill under
# each value of the environment variable VAR, a process each (the weights' ready bytes are made at build), the fast
# path checked against the plain one; into $OUT/decode_NAME_MODE.*.
modes_ab() {
    local var=$1 name=$2 limit=$3 mode
    shift 3
    for mode in "$@"; do
        env "$var=$mode" timeout "$limit" python3 benchmarks/decode.py --formats nvfp4 --batches 1 8 32 64 \
            --contexts 1024 --prefill 8192 --reps 30 --check-batches 1 --check-steps 8 --no-plain-timing \
            --out "$OUT/decode_${name}_$mode.json" > "$OUT/decode_${name}_$mode.txt" 2>&1
        echo "== $var=$mode"
        grep -E "^ +nvfp4 +[0-9]+ +1024|prefill|agree|match|Error" "$OUT/decode_${name}_$mode.txt" | head -8
    done
}
# moe_field_ab NAME FIELD LABEL: the shared-expert GPU test (the same bits with and without each MMA MoE field, at
# 9-64 tokens), then the whole step with FIELD=true on the four NVFP4 moe.decode entries from 9 tokens.
moe_field_ab() {
    local name=$1 field=$2 label=$3
    gpu_tests "shared expert GPU tests ($label)" "${name}_tests" 300 -n 4 tests/test_nvfp4_mma_moe.py \
        -k "shared_expert_in_the_moe and True-True"
    V=/tmp/variants; mkdir -p $V
    moe_entries_variant "$field=true" "$V/$name.json" 9 17 25 33
    step_ab nvfp4 "$name" "$V/$name.json" "$label"
}

if [ "${SKIP_AB:-0}" != 1 ]; then
# The NVFP4 MMA kernels: their GPU tests (the linear against linear_ref at qkv, o_proj and a ragged N, 1-8 rows, with
# and without split-K; the MoE gate_up against moe_ref's h at 1-64 tokens), then their time against the engine's paths.
if [ "${MMA_TESTS:-1}" = 1 ]; then
    # shellcheck disable=SC2086
    gpu_tests "nvfp4_mma tests" mma_tests 240 tests/test_nvfp4_mma.py tests/test_nvfp4_mma_moe.py \
        ${MMA_TEST_K:+-k "$MMA_TEST_K"}
fi
# shellcheck disable=SC2086
timeout 300 python3 benchmarks/nvfp4_mma.py ${MMA_BENCH_ARGS:-} --out "$OUT/nvfp4_mma.json" > "$OUT/nvfp4_mma.txt" 2>&1
echo "== nvfp4_mma"; sed -n '/^NVFP4 linear on/,/^wrote/p' "$OUT/nvfp4_mma.txt" | grep -v '^{'; grep -E "Error|error" "$OUT/nvfp4_mma.txt" | head -4
fi
# MMA_AB=1: the MMA rows kernel at 33-64 rows for the o projection (n 2048, k 4096) and the shared down (k 1024)
# with fewer K splits (TileConfig.mma_split_k; its own choice splits the o projection 16 ways at 64 rows, and the
# FP32 partials outweigh the weights: it lost there, 19.7 -> 22.1 us, twenty-first session). Run it with
# MMA_BENCH_ARGS="--ms 48 64 --shapes o_proj shared_down --warps 4 --vec 1 --splits 1 2 4 8" for the kernels alone,
# then the whole step at 48 and 64 rows: o2 / o4 (the o projection in 2 / 4 splits), o4d2 (and the shared down in
# 2). ~3 minutes.
if [ "${MMA_AB:-0}" = 1 ]; then
V=/tmp/variants; mkdir -p $V
variant() { python3 benchmarks/tuning_variant.py "$@" > /dev/null || echo "variant failed: $*"; }
rows='{"m_min": 33, "m_max": 64, "nvfp4": true}'
variant --op gemv.small_m --when "$rows" --set mma=true mma_vec=true mma_split_k=2 \
    --add '{"m_min": 33, "m_max": 64, "nvfp4": true, "n": 2048, "k": 4096}' --out $V/o2.json
variant --op gemv.small_m --when "$rows" --set mma=true mma_vec=true mma_split_k=4 \
    --add '{"m_min": 33, "m_max": 64, "nvfp4": true, "n": 2048, "k": 4096}' --out $V/o4.json
variant --table $V/o4.json --op gemv.small_m --when "$rows" --set mma=true mma_vec=true mma_split_k=2 \
    --add '{"m_min": 33, "m_max": 64, "nvfp4": true, "n": 2048, "k": 1024}' --out $V/o4d2.json
timeout 300 python3 benchmarks/decode.py --formats nvfp4 --batches 48 64 --contexts 1024 --prefill 0 \
    --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/o2.json $V/o4.json $V/o4d2.json \
    --out "$OUT/decode_nvfp4_mma_ab.json" > "$OUT/decode_mma_ab.txt" 2>&1
echo "== whole step: table vs o2 / o4 / o4d2"
ab_rounds "$OUT/decode_mma_ab.txt"
fi
# L2_AB=1: the MMA gate_up asking L2 for its codes 2 or 4 K steps ahead (MoEConfig.mma_l2_ahead, the twin kernel
# `_moe_gate_up_mma_l2_kernel`; built on CPU in the twenty-first session for the gate_up's ~44% of DRAM bandwidth
# at 32 tokens): its GPU tests, the kernel alone at 32 and 64 tokens, then the whole step at 32 and 64 with it on the
# table's gate_up entries from 25 tokens (l2_2, l2_4). ~4 minutes.
if [ "${L2_AB:-0}" = 1 ]; then
    gpu_tests "MMA gate_up GPU tests" l2_tests 200 tests/test_nvfp4_mma_moe.py -k "moe_gate_up_on_the_gpu"
    timeout 240 python3 benchmarks/nvfp4_mma.py --ms 1 --shapes qkv --warps 4 8 --vec 1 --prefetch 1 \
        --moe-tokens 32 64 --moe-l2-ahead 2 4 --out "$OUT/nvfp4_mma_l2.json" > "$OUT/nvfp4_mma_l2.txt" 2>&1
    sed -n '/^MoE gate_up/,$p' "$OUT/nvfp4_mma_l2.txt" | grep -v "^wrote"
    V=/tmp/variants; mkdir -p $V
    for a in 2 4; do moe_entries_variant mma_l2_ahead=$a $V/l2_$a.json 25 33; done
    timeout 240 python3 benchmarks/decode.py --formats nvfp4 --batches 32 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/l2_2.json $V/l2_4.json \
        --out "$OUT/decode_nvfp4_l2_ab.json" > "$OUT/decode_l2_ab.txt" 2>&1
    echo "== whole step: table vs l2_2 / l2_4"
    ab_rounds "$OUT/decode_l2_ab.txt"
fi
# DOWN_L2=1: the MMA down asking L2 for its codes (MoEConfig.mma_down_l2, the twin `_moe_down_mma_l2_kernel`; built
# on CPU in the twenty-second session after the gate_up's L2 requests won 3.8% at b32): 1 two K steps ahead in the
# loop (the down's K is 4 steps), 2 all of a tile's codes before the PDL wait for experts with pairs. Its GPU tests
# (incl. mode 2 after the router's PDL launch), the kernels alone at 16-64 tokens, then the whole step at 16, 32 and
# 64 with each mode on the table's three MMA-down entries (d1, d2); and the o projection in 8 K splits at 48 and 64
# rows (o8: 2 and 4 splits lost in the step, 8 won alone, 14.85 vs 19.72 us). ~4 minutes.
if [ "${DOWN_L2:-0}" = 1 ]; then
    gpu_tests "MMA down GPU tests" down_l2_tests 200 tests/test_nvfp4_mma_moe.py \
        -k "down_on_the_gpu or down_l2 or fused_moe_with"
    timeout 200 python3 benchmarks/nvfp4_mma.py --ms 1 --shapes qkv --warps 4 8 --vec 1 --moe-tokens 16 32 64 \
        --moe-down-l2 1 2 --out "$OUT/nvfp4_mma_down_l2.json" > "$OUT/nvfp4_mma_down_l2.txt" 2>&1
    sed -n '/^MoE gate_up/,$p' "$OUT/nvfp4_mma_down_l2.txt" | grep -v "^wrote"
    V=/tmp/variants; mkdir -p $V
    for m in 1 2; do moe_entries_variant mma_down_l2=$m $V/d$m.json 9 25 33; done
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m_min": 33, "m_max": 64, "nvfp4": true}' \
        --set mma=true mma_vec=true mma_split_k=8 \
        --add '{"m_min": 33, "m_max": 64, "nvfp4": true, "n": 2048, "k": 4096}' --out $V/o8.json > /dev/null
    timeout 200 python3 benchmarks/decode.py --formats nvfp4 --batches 16 32 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/d1.json $V/d2.json \
        --out "$OUT/decode_nvfp4_down_l2_ab.json" > "$OUT/decode_down_l2_ab.txt" 2>&1
    timeout 120 python3 benchmarks/decode.py --formats nvfp4 --batches 48 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/o8.json \
        --out "$OUT/decode_nvfp4_o8_ab.json" > "$OUT/decode_o8_ab.txt" 2>&1
    echo "== whole step: table vs d1 / d2, then vs o8"
    ab_rounds "$OUT/decode_down_l2_ab.txt" "$OUT/decode_o8_ab.txt"
fi
# WARP_K=1: the MMA gate_up with its warps splitting K as well as the columns (`MoEConfig.mma_warp_k`, twin
# `_moe_gate_up_mma_ks_kernel`, built in the twenty-third session without a GPU): a program's 16 dependent K steps a
# warp become 16 / N, the parts summed across warps. Its GPU tests (against moe_ref's h), the kernels alone at 16-64
# tokens, then the whole step at 24, 32 and 64: k2 / k4 (the table's three MMA gate_up entries split in 2 / 4 parts),
# w8k2 (the 4-warp entries in 8 warps split in 2: the same grid as now, half the chain a warp). ~6 minutes.
if [ "${WARP_K:-0}" = 1 ]; then
    gpu_tests "MMA gate_up GPU tests" warp_k_tests 240 tests/test_nvfp4_mma_moe.py \
        -k "moe_gate_up_on_the_gpu or fused_moe_with"
    timeout 240 python3 benchmarks/nvfp4_mma.py --ms 1 --shapes qkv --warps 4 8 --vec 1 --prefetch 1 \
        --moe-tokens 16 24 32 64 --moe-l2-ahead 2 --moe-warp-k 2 4 --out "$OUT/nvfp4_mma_warp_k.json" \
        > "$OUT/nvfp4_mma_warp_k.txt" 2>&1
    sed -n '/^MoE gate_up/,$p' "$OUT/nvfp4_mma_warp_k.txt" | grep -v "^wrote"
    V=/tmp/variants; mkdir -p $V
    for k in 2 4; do moe_entries_variant mma_warp_k=$k $V/k$k.json 17 25 33; done
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_min": 17}' \
        --set mma_warp_k=2 num_warps=8 --out $V/w8k2_17.json > /dev/null
    python3 benchmarks/tuning_variant.py --table $V/w8k2_17.json --op moe.decode \
        --when '{"nvfp4": true, "tokens_min": 33}' --set mma_warp_k=2 num_warps=8 --out $V/w8k2.json > /dev/null
    timeout 240 python3 benchmarks/decode.py --formats nvfp4 --batches 24 32 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/k2.json $V/k4.json $V/w8k2.json \
        --out "$OUT/decode_nvfp4_warp_k_ab.json" > "$OUT/decode_warp_k_ab.txt" 2>&1
    echo "== whole step: table vs k2 / k4 / w8k2"
    ab_rounds "$OUT/decode_warp_k_ab.txt"
fi
# GROUPED_MM=1: the MoE of long prefills on torch's grouped GEMM (`moe_grouped_gemm`, twenty-fourth session): its
# GPU tests, the MoE alone at GROUPED_MM_TS tokens against the Triton grouped kernels (each step timed, peak memory),
# then the whole 8K prefill with the table's `grouped_gemm_min_tokens` at GROUPED_MM_MIN against the table as
# shipped (prefill_ab.py, alternating rounds). GROUPED_MM_FORMAT=nvfp4: NVFP4 experts, both sides from the call's BF16
# copies (the variant sets the NVFP4 entry). ~5 minutes on a fresh machine.
if [ "${GROUPED_MM:-0}" = 1 ]; then
    fmt=${GROUPED_MM_FORMAT:-bf16}
    nv=false; [ "$fmt" = nvfp4 ] && nv=true
    # Every test of these files (not only -m gpu): on CUDA the sort and the reduce tests run there too.
    timeout 240 python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_kernels_moe_grouped_gemm.py \
        tests/test_kernels_moe_align.py > "$OUT/grouped_gemm_tests.txt" 2>&1
    echo "grouped GEMM and sort tests: $(tail -1 "$OUT/grouped_gemm_tests.txt")"
    grep -E "^E |FAILED" "$OUT/grouped_gemm_tests.txt" | head -6
    # shellcheck disable=SC2086
    timeout 240 python3 benchmarks/moe_grouped_mm.py --formats "$fmt" --ts ${GROUPED_MM_TS:-2048 3072 4096 8192} \
        --out "$OUT/moe_grouped_mm_$fmt.json" > "$OUT/moe_grouped_mm_$fmt.txt" 2>&1
    echo "== MoE on the grouped GEMM"; sed -n '/^MoE on/,$p' "$OUT/moe_grouped_mm_$fmt.txt" | grep -v "^wrote"
    grep -E "Error|error" "$OUT/moe_grouped_mm_$fmt.txt" | head -4
    mkdir -p /tmp/variants
    python3 benchmarks/tuning_variant.py --op moe.paths --when "{\"nvfp4\": $nv}" \
        --set grouped_gemm_min_tokens=${GROUPED_MM_MIN:-3072} --out /tmp/variants/grouped_gemm.json > /dev/null
    timeout 420 python3 benchmarks/prefill_ab.py --format "$fmt" --variant-tuning-file /tmp/variants/grouped_gemm.json \
        --rounds 3 --out "$OUT/prefill_ab_grouped_gemm_$fmt.json" > "$OUT/prefill_ab_grouped_gemm_$fmt.txt" 2>&1
    grep -E "^round|median|Error" "$OUT/prefill_ab_grouped_gemm_$fmt.txt"
fi
# CUDNN_ATTN=1: full layers' fresh prompts on torch's cuDNN attention (`attention_cudnn`, twenty-fifth session): the
# GPU tests of it and of the Triton prefill, each variant's prefill attention at 2-8K tokens and cuDNN's first call at
# new prompt lengths (benchmarks/prefill_attention_sdpa.py), then the whole 8K prefill in BF16 and NVFP4 with the
# table's `cudnn_min_tokens` at CUDNN_MIN (default 4096) against the table as shipped (prefill_ab.py). ~4 minutes.
# Twenty-fifth session: cuDNN won from 4,096 (8K BF16 119.4 -> 112.5 ms, NVFP4 150.5 -> 143.6), so the table has it;
# with the table as shipped both sides of the A/B now take it (CUDNN_MIN=0 in a variant would turn it off).
if [ "${CUDNN_ATTN:-0}" = 1 ]; then
    gpu_tests "cuDNN attention tests" cudnn_attention_tests 300 tests/test_kernels_attention_cudnn.py \
        tests/test_kernels_attention.py -k "cudnn or prefill"
    timeout 300 python3 benchmarks/prefill_attention_sdpa.py --ts 2048 4096 8192 --first-calls 4352 4608 8448 4352 \
        --out "$OUT/prefill_attention_sdpa.json" > "$OUT/prefill_attention_sdpa.txt" 2>&1
    sed -n '/^Prefill attention/,$p' "$OUT/prefill_attention_sdpa.txt" | grep -v "^wrote\|efficient\|expanded"
    mkdir -p /tmp/variants
    python3 benchmarks/tuning_variant.py --op attention.prefill \
        --when '{"sliding": false, "elem_bytes": 2, "tokens_min": 8192}' --set "cudnn_min_tokens=${CUDNN_MIN:-4096}" \
        --out /tmp/variants/cudnn_a.json > /dev/null || echo "variant failed"
    python3 benchmarks/tuning_variant.py --table /tmp/variants/cudnn_a.json --op attention.prefill \
        --when '{"elem_bytes": 2}' --set "cudnn_min_tokens=${CUDNN_MIN:-4096}" --out /tmp/variants/cudnn.json \
        > /dev/null || echo "variant failed"
    for fmt in ${CUDNN_FORMATS:-bf16 nvfp4}; do
        timeout 420 python3 benchmarks/prefill_ab.py --format "$fmt" --variant-tuning-file /tmp/variants/cudnn.json \
            --rounds 3 --out "$OUT/prefill_ab_cudnn_$fmt.json" > "$OUT/prefill_ab_cudnn_$fmt.txt" 2>&1
        echo "== $fmt"; grep -E "^round|median|Error" "$OUT/prefill_ab_cudnn_$fmt.txt"
    done
fi
# CUDNN_PREFIX=1: full layers' chunks after a cached prefix on cuDNN too (twenty-sixth session: the chunk's own keys
# causally, the prefix in `attention_cudnn.SEGMENT`-key segments, merged by their log-sum-exps): the GPU tests of the
# cuDNN path and the Triton prefill, the warm-up's plans timed, a full layer's chunk after 8K-56K of prefix alone
# (prefill_attention_sdpa.py --chunks), then a 32K prompt in the engine's 8,192-token chunks with it against
# `fresh_only` (prefill_ab.py), BF16 then NVFP4 (PREFIX_FORMATS). ~6 minutes. Twenty-sixth session: installed (the
# figures above); the per-call times inside the engine: benchmarks/prefill_attention_in_engine.py --segment 8192 / 0.
if [ "${CUDNN_PREFIX:-0}" = 1 ]; then
    gpu_tests "cuDNN attention tests" cudnn_prefix_tests 300 tests/test_kernels_attention_cudnn.py \
        tests/test_kernels_attention.py -k "cudnn or prefill"
    python3 - <<'PY' 2>&1 | tee "$OUT/cudnn_plans.txt"
import time, torch
from flint_kernels import attention_triton as at
t0 = time.perf_counter()
lengths = at.prepare_cudnn_plans(8192, 32, 4, 128, torch.bfloat16, torch.device("cuda"))
torch.cuda.synchronize()
print(f"warm-up plans: {len(lengths)} padded lengths ({lengths[:1]}..{lengths[-1:]}), causal + prefix segment, "
      f"{time.perf_counter() - t0:.2f} s")
PY
    timeout 400 python3 benchmarks/prefill_attention_sdpa.py --ts --chunks 8192:8192 24576:8192 57344:8192 \
        8192:5000 --out "$OUT/prefill_attention_chunks.json" > "$OUT/prefill_attention_chunks.txt" 2>&1
    grep -E "^full after|Error" "$OUT/prefill_attention_chunks.txt"
    for fmt in ${PREFIX_FORMATS:-bf16 nvfp4}; do
        timeout 500 python3 benchmarks/prefill_ab.py --format "$fmt" --tokens 32768 --chunk 8192 \
            --variant fresh_only --rounds "${PREFIX_ROUNDS:-2}" --out "$OUT/prefill_ab_prefix_$fmt.json" \
            > "$OUT/prefill_ab_prefix_$fmt.txt" 2>&1
        echo "== $fmt"; grep -E "^round|median|Error" "$OUT/prefill_ab_prefix_$fmt.txt"
    done
fi
# GLUE=1: the prefill's SiLU-and-mul with several rows a program (twenty-seventh session; its first run also timed a
# Triton gather and the scaled SiLU's rows, both removed after it): their GPU tests, each launch's variants
# (kernels_moe_glue.py), the
# prefill attention benchmark's Triton rows with cuDNN off (before, its "ours" rows ran the cuDNN path), then the 8K
# prefill in one step and in 2,048-token steps against `one_row_glue` (BF16: the NVFP4 experts' copies stay on the
# Triton kernels under torch 2.11), and the 8K BF16 prefill's kernels by name. ~8 minutes.
if [ "${GLUE:-0}" = 1 ]; then
    gpu_tests "glue tests" glue_tests 300 tests/test_kernels_router_act.py tests/test_kernels_moe_align.py \
        tests/test_kernels_moe_grouped_gemm.py -k "silu or gather or grouped or sort"
    timeout 300 python3 benchmarks/kernels_moe_glue.py --out "$OUT/kernels_moe_glue.json" > "$OUT/kernels_moe_glue.txt" 2>&1
    grep -vE "^wrote" "$OUT/kernels_moe_glue.txt" | tail -40
    timeout 300 python3 benchmarks/prefill_attention_sdpa.py --ts --chunks 8192:8192 24576:8192 8192:5000 \
        --out "$OUT/prefill_attention_chunks.json" > "$OUT/prefill_attention_chunks.txt" 2>&1
    grep -E "^full after|Error" "$OUT/prefill_attention_chunks.txt"
    for chunk in ${GLUE_CHUNKS:-0 2048}; do
        timeout 500 python3 benchmarks/prefill_ab.py --format bf16 --chunk "$chunk" --variant one_row_glue \
            --rounds "${GLUE_ROUNDS:-3}" --out "$OUT/prefill_ab_glue_bf16_$chunk.json" \
            > "$OUT/prefill_ab_glue_bf16_$chunk.txt" 2>&1
        echo "== bf16, chunk $chunk"; grep -E "^round|median|Error" "$OUT/prefill_ab_glue_bf16_$chunk.txt"
    done
    timeout 300 python3 benchmarks/decode.py --formats bf16 --batches 1 --contexts 1024 --prefill 8192 \
        --check-steps 0 --check-batches --no-plain-timing --reps 3 --out "$OUT/prefill_kernels_bf16.json" \
        > "$OUT/prefill_kernels_bf16.txt" 2>&1
    python3 - "$OUT/prefill_kernels_bf16.json" <<'PY'
import json, sys
row = next(r for r in json.load(open(sys.argv[1]))["rows"] if "prefill_kernels_by_name" in r)
print("8K BF16 prefill", row["prefill_ms"], "ms; by family", row["prefill_time_by_family_ms"])
for k in row["prefill_kernels_by_name"][:30]:
    print(" ", str(k)[:160])
PY
fi
# SLIDING=1 (twenty-seventh session, then removed): sliding layers' prefill attention with every key tile in one
# masked loop lost, 0.4315 against 0.3325 ms alone (8K chunk, 64 x 64 tiles), 0.437 against 0.340 inside the engine,
# the 8K BF16 prefill 112.0 -> 114.9 ms: a masked tile costs more than the pipeline the three loops give up.
# The sliding-only sweep stays: python3 benchmarks/kernels_attention.py --sweep --sweep-parts prefill-sliding.
# QKNORM=1 (twenty-seventh session, then removed): the prefill's Q/K norm + RoPE + cache write four tokens a program
# took 60.5 against 63.4 us a layer in the 8K BF16 prefill, and the whole prefill was even (113.1 / 112.9 ms against
# one token a program): that kernel is not short of bytes in flight, unlike SiLU-and-mul was.
# ROUTER_LAUNCH=1 (built in the forty-third session; ran in the forty-fourth on an H100, 3 GPU tests passed: NVFP4
# b1 2.166 -> 2.088 ms, -3.6%, b2-b16 -0.6 to -1.4%, BF16 b1 -2.1%; decode_h100_router_launch_ab_s44.json, installed):
# the small-batch router's top-k as a one-program launch of its own after a tailless router
# (`RouterSmallConfig.tail_launch`, the table's "router.small"), a PDL boundary in place of the barrier, the acq_rel
# atomic and the last arrival's wait; 47 more launches a step. Its GPU test (bit-equal to the counter tail, in and out
# of a graph), then the whole step at NVFP4 1, 2, 4, 8, 16 and BF16 1 sequences against the counter tail (the table's
# entry off). ~3 minutes.
if [ "${ROUTER_LAUNCH:-0}" = 1 ]; then
    gpu_tests "router top-k launch GPU tests" router_launch_tests 120 -n 3 tests/test_kernels_router_act.py \
        -k "launch_of_its_own"
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op router.small --when all --set tail_launch=false \
        --out $V/router_counter_tail.json > /dev/null
    decode_ab router_launch 240 "the router's counter tail" \
        "--formats nvfp4 --batches 1 2 4 8 16" $V/router_counter_tail.json
    decode_ab router_launch_bf16 150 "the router's counter tail" \
        "--formats bf16 --batches 1 --reserve-gib 2" $V/router_counter_tail.json
fi
# ATTN_LAUNCH=1 (forty-fourth session, after ROUTER_LAUNCH won; ran on an H100, 6 GPU tests passed,
# decode_h100_attn_launch_ab_s44.json: the launch alone even to -1%, with 64-key splits below 12 sequences NVFP4 b1
# -4.1%, BF16 b1 -3.2%): decode attention's splits merged by a launch of their own
# (`AttentionDecodeConfig.combine_launch`, `_decode_merge_kernel`: one program a sequence and KV head, the same
# `_merge_splits`) instead of by the last split to arrive on a counter; 49 more launches a step. Its GPU tests
# (bit-equal to the in-launch merge, in and out of a graph), then the whole step at NVFP4 1, 2, 4, 8, 16, 32 and BF16
# 1 sequences with it on every attention.decode entry, and with 64-key splits below 12 sequences. ~2 minutes.
if [ "${ATTN_LAUNCH:-0}" = 1 ]; then
    gpu_tests "attention merge launch GPU tests" attn_launch_tests 120 -n 3 tests/test_kernels_attention.py \
        -k "merge_launch"
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op attention.decode --when all --set combine_launch=true \
        --out $V/attn_merge_launch.json > /dev/null
    # and, below 12 sequences, twice the splits of 64-key tiles (the merge no longer in a split's critical path)
    python3 benchmarks/tuning_variant.py --table $V/attn_merge_launch.json --op attention.decode \
        --when '{"sliding": true, "elem_bytes": 2}' --set block_n=64 min_keys_per_split=64 --out $V/am64a.json >/dev/null
    python3 benchmarks/tuning_variant.py --table $V/am64a.json --op attention.decode --when '{"elem_bytes": 2}' \
        --set block_n=64 min_keys_per_split=64 --out $V/attn_merge_launch_64.json > /dev/null
    decode_ab attn_launch 290 "decode attention's merge as a launch of its own; and 64-key splits below 12" \
        "--formats nvfp4 --batches 1 2 4 8 16 32" $V/attn_merge_launch.json $V/attn_merge_launch_64.json
    decode_ab attn_launch_bf16 150 "decode attention's merge as a launch of its own; and 64-key splits below 12" \
        "--formats bf16 --batches 1 --reserve-gib 2" $V/attn_merge_launch.json $V/attn_merge_launch_64.json
fi
# ATTN_SPLITS=1 (forty-fourth session, after ATTN_LAUNCH; ran on an H100, decode_h100_attn_splits_ab_s44.json: 64-key
# splits by the launch best, NVFP4 b1 -4.3%, b2 -3.5%, b4 -1.6%, b8 -3.0%, BF16 b1 -3.2%; on the counter b1 -2.6%, b4
# +1.0%; 32-key by the launch b1 -3.9%; installed): which part of the merge launch with 64-key splits won below 12
# sequences: 64-key splits merged on the counter, merged by the launch, and 32-key splits by the launch, each on the
# two attention.decode entries below 12 sequences (the entries from 12 as in the table). ~2 minutes. Since the table
# has them, the variants now compare against the installed entries.
if [ "${ATTN_SPLITS:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    small_attn_variant() {  # OUT FIELD=VALUE...: the two attention.decode entries below 12 sequences with the fields
        local out=$1
        shift
        python3 benchmarks/tuning_variant.py --op attention.decode --when '{"sliding": true, "elem_bytes": 2}' \
            --set "$@" --out "$out.a" > /dev/null
        python3 benchmarks/tuning_variant.py --table "$out.a" --op attention.decode --when '{"elem_bytes": 2}' \
            --set "$@" --out "$out" > /dev/null
    }
    small_attn_variant $V/attn_counter_64.json block_n=64 min_keys_per_split=64
    small_attn_variant $V/attn_launch_64.json block_n=64 min_keys_per_split=64 combine_launch=true
    small_attn_variant $V/attn_launch_32.json block_n=32 min_keys_per_split=32 combine_launch=true
    decode_ab attn_splits 290 "64-key splits on the counter / by the merge launch; 32-key splits by the launch" \
        "--formats nvfp4 --batches 1 2 4 8" $V/attn_counter_64.json $V/attn_launch_64.json $V/attn_launch_32.json
    decode_ab attn_splits_bf16 150 "64-key splits on the counter / by the merge launch; 32-key by the launch" \
        "--formats bf16 --batches 1 --reserve-gib 2" $V/attn_counter_64.json $V/attn_launch_64.json \
        $V/attn_launch_32.json
fi
# H200_AB=1 (forty-fourth session; ran: decode_h200_table_ab_s44.json, NVFP4 b1 2.076 -> 1.880 ms, b8 -3.8%, BF16 b1
# 2.762 -> 2.648, b8 -4.5%, b32 even, 502 kernels at b1): the shipped table against the forty-third session's (OLD_TABLE, default
# .probe/table_s43.json: `git show fc64130:kernels/tuning/nvidia-h200.json > .probe/table_s43.json`, carry ".probe")
# on an H200, both formats at 1, 8 and 32 sequences, with the batch-1 kernel count and families: the H100-judged
# router and attention launches confirmed on the GPU the targets name. ~5 minutes.
if [ "${H200_AB:-0}" = 1 ]; then
    table_against h200 500 "forty-third" "${OLD_TABLE:-.probe/table_s43.json}" --batches 1 8 32 --deadline-s 460
fi
# ATTN_MORE=1 (forty-fourth session; parts ran on an H100 at its end, NVFP4 only, decode_h100_attn_32k_ab_s44.json
# and decode_h100_attn_mid_ab_s44.json: at 32K context b1 even, b8 +5.6%, so the 2K bound stays; from 12 sequences the
# launch with 256 keys a split b16 -1.2%, b32 +2.0%, 64-key tiles of 128 b16 -1.0%, b32 even. Whole, on an H100, in the
# forty-fifth (decode_h100_attn_32k_ab_s45.json, decode_h100_attn_mid_ab_s45.json, decode_h100_bf16_attn_mid_ab_s45.json):
# 32K b1 even, b4 +3.0%, b8 +5.6%; 256 keys a split b12 -2.8%, b16 -0.6%, b32 +1.9%, BF16 b16 -0.3%; 64-key tiles b12
# -2.5%, b16 -0.8%, b32 even, BF16 b16 +0.1%; so an entry at 12-16 sequences with 256 keys a split, installed after
# TABLE_AB's first run): where else the attention merge launch with more splits may
# pay. Full layers at 32K context below 12 sequences (the table stops its 64-key entry at 2K context: 32K keeps
# 128-key tiles on the counter; the variant's entry has no context bound) at NVFP4 1, 4, 8; and from 12 sequences at
# 1K (the table: 1 sliding split, full layers 512 keys a split at least, on the counter), the launch with 256 keys a
# split at least, and with 64-key tiles of 128 keys a split at least, at NVFP4 12, 16, 32 and BF16 16. ~5 minutes;
# an H100 will do.
if [ "${ATTN_MORE:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op attention.decode --new \
        --when '{"sliding": false, "elem_bytes": 2, "seqs_max": 11}' --set block_n=64 num_warps=4 num_stages=2 \
        min_keys_per_split=64 max_splits=64 merge_elems=16384 combine_launch=true --out $V/attn_32k.json > /dev/null
    mid_variant() {  # OUT FIELD=VALUE...: both attention.decode entries from 12 sequences with the fields
        local out=$1
        shift
        python3 benchmarks/tuning_variant.py --op attention.decode \
            --when '{"sliding": true, "elem_bytes": 2, "seqs_min": 12}' --set "$@" --out "$out.a" > /dev/null
        python3 benchmarks/tuning_variant.py --table "$out.a" --op attention.decode \
            --when '{"sliding": false, "elem_bytes": 2, "seqs_min": 12}' --set "$@" --out "$out" > /dev/null
    }
    mid_variant $V/attn_mid256.json combine_launch=true min_keys_per_split=256
    mid_variant $V/attn_mid64.json combine_launch=true block_n=64 min_keys_per_split=128
    timeout 200 python3 benchmarks/decode.py --formats nvfp4 --batches 1 4 8 --contexts 32768 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --ab-tuning-file $V/attn_32k.json --out "$OUT/decode_attn_32k_ab.json" \
        > "$OUT/decode_attn_32k_ab.txt" 2>&1
    echo "== whole step at 32K: the table vs full layers' 64-key splits by the launch at every context"
    ab_rounds "$OUT/decode_attn_32k_ab.txt"
    decode_ab attn_mid 240 "from 12 sequences: the merge launch with 256 keys a split / 64-key tiles of 128" \
        "--formats nvfp4 --batches 12 16 32" $V/attn_mid256.json $V/attn_mid64.json
    decode_ab attn_mid_bf16 150 "from 12 sequences: the merge launch with 256 keys a split / 64-key tiles of 128" \
        "--formats bf16 --batches 16 --reserve-gib 2" $V/attn_mid256.json $V/attn_mid64.json
fi
# EXPERTS_AHEAD=1 (forty-fourth session; ran in the forty-fifth on an H100, decode_h100_experts_ahead_ab_s45.json: every
# variant lost, NVFP4 b1 +1.3 / +2.2 / +3.3%, b2 +5-7%, b4 +9-11%, b8 +13-15%, BF16 b1 +6.4-7.5%; the GPU tests passed;
# the kernel and its field were removed, so this block no longer runs): the router's top-k launch in
# 66 / 132 / 264 programs, each taking the top-k (program 0 stores it) and asking L2 for its share of the chosen
# experts' gate_up lines (`RouterSmallConfig.experts_ahead_programs`, `_router_topk_ahead_kernel`): the routed
# gate_up programs otherwise start their DRAM reads only after their own PDL wait and the ids' load, since nothing
# can ask for a routed expert before the top-k (the 2026-12-01 bulk prefetch from the one top-k program went through
# one SM and lost; these are per-line hints from many programs, issued once the top-k is known). Its GPU tests
# (bit-equal to the counter tail, BF16 and NVFP4, in and out of a graph), then the whole step at NVFP4 1, 2, 4, 8 and
# BF16 1 sequences. ~4 minutes; an H100 will do. A win: the entry's field, RECORD_BOTH=1 (a new kernel).
if [ "${EXPERTS_AHEAD:-0}" = 1 ]; then
    gpu_tests "router experts-ahead GPU tests" experts_ahead_tests 150 -n 4 tests/test_kernels_router_act.py \
        -k "experts_ahead"
    V=/tmp/variants; mkdir -p $V
    for n in 66 132 264; do
        python3 benchmarks/tuning_variant.py --op router.small --when all --set experts_ahead_programs=$n \
            --out $V/experts_ahead_$n.json > /dev/null
    done
    decode_ab experts_ahead 290 "the top-k launch asking L2 for the chosen experts' gate_up lines, 66 / 132 / 264" \
        "--formats nvfp4 --batches 1 2 4 8" $V/experts_ahead_66.json $V/experts_ahead_132.json \
        $V/experts_ahead_264.json
    decode_ab experts_ahead_bf16 150 "the top-k launch asking L2 for the experts' gate_up lines, 66 / 132 / 264" \
        "--formats bf16 --batches 1 --reserve-gib 2" $V/experts_ahead_66.json $V/experts_ahead_132.json \
        $V/experts_ahead_264.json
fi
# OPS_AGAIN=1 (forty-fourth session; ran in the forty-fifth on an H100, decode_h100_ops_*_ab_s45.json: qkv_attention
# NVFP4 b1 +0.6%, b8 -0.4%, BF16 b1 +1.5%, b8 -0.2%; add_rms_norm_linear NVFP4 b1 +12%, b8 even, BF16 b1 -1.7%, b8 even;
# both together NVFP4 b1 +11%, b8 -0.5%, BF16 b1 -0.6%, b8 -0.2%; the BF16 b1 prologue installed as the table's `norm_prologue`, which
# since then decides where that op fuses, so `all,add_rms_norm_linear` is the default): the two experimental fused ops that remove a launch a layer
# at batch 1, judged again now that the step is shorter and attention runs 9-16 splits: `qkv_attention` (the Q/K
# norm, RoPE and cache write inside each attention split: even before, BF16 2.701 vs 2.707 ms) and
# `add_rms_norm_linear` (the pre-attention add+RMSNorm as the qkv projection's prologue), alone and together (502 ->
# ~404 kernels a step). NVFP4 b1 and b8, BF16 b1, 1K context. ~4 minutes; an H100 will do.
if [ "${OPS_AGAIN:-0}" = 1 ]; then
    for ops in all,qkv_attention all,add_rms_norm_linear all,qkv_attention,add_rms_norm_linear; do
        name=ops_$(echo "$ops" | tr ',' '_' | sed 's/^all_//')
        timeout 200 python3 benchmarks/decode.py --formats nvfp4 bf16 --batches 1 8 --contexts 1024 --prefill 0 \
            --reps 30 --check-steps 0 --no-plain-timing --reserve-gib 2 --ab-ops "$ops" \
            --out "$OUT/decode_${name}_ab.json" > "$OUT/decode_${name}_ab.txt" 2>&1
        echo "== whole step: the default ops vs $ops"
        ab_rounds "$OUT/decode_${name}_ab.txt"
    done
fi
# BF16_GU=1 (built in the forty-third session; ran in the forty-fourth on an H100: every variant lost,
# decode_h100_bf16_gate_up_ab_s44.json): BF16's gate_up at 1 token is the batch-1 step's largest launch (13.74 us a
# layer for ~21 MB on the H200, ~37% of the copy rate: decode_h200_table_s43.txt) in 8 x 1024 tiles, K split in two
# on a counter. The whole step at BF16 b1 (2.99 ms) with that entry's gate_up in whole-K programs: 4 warps 13.87 ms
# (the 8 x 2048 tile spills), 8 warps 3.25; in 4-column whole-K programs 3.08; in 16 x 512 tiles (4 splits) 3.17.
if [ "${BF16_GU:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    for variant in "k2048w4 gu_block_k=2048" "k2048w8 gu_block_k=2048 num_warps=8" \
        "i4k2048 gu_block_i=4 gu_block_k=2048" "i16k512 gu_block_i=16 gu_block_k=512"; do
        read -r name fields <<< "$variant"
        # shellcheck disable=SC2086  # the fields are a list of words
        python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": false, "tokens_max": 1}' \
            --set $fields --out "$V/gu_$name.json" > /dev/null || echo "variant failed: $variant"
    done
    decode_ab bf16_gu 300 "BF16's 1-token gate_up: whole K in 4 / 8 warps, 4 columns whole K, 16 x 512" \
        "--formats bf16 --batches 1 --reserve-gib 2" $V/gu_k2048w4.json $V/gu_k2048w8.json $V/gu_i4k2048.json \
        $V/gu_i16k512.json
fi
# ROUTER_TAIL=1 (forty-third session, as an in-place patch then: NVFP4 b1 -7.2%, BF16 -4.5% on an H100,
# decode_h100_router_skip_tail_ab_s43.json): the batch-1 router without its counter tail (fixed ids; an upper bound
# for removing it) against the router with its counter tail (the probe turns the table's top-k launch off in both
# arms), `benchmarks/router_tail_probe.py`. ~2 minutes; an H100 will do.
if [ "${ROUTER_TAIL:-0}" = 1 ]; then
    cp kernels/tuning/nvidia-h200.json /tmp/skip_tail.json
    timeout 300 python3 benchmarks/router_tail_probe.py --formats nvfp4 bf16 --batches 1 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --reserve-gib 2 --ab-tuning-file /tmp/skip_tail.json \
        --out "$OUT/decode_router_tail_ab.json" > "$OUT/decode_router_tail_ab.txt" 2>&1
    echo "== whole step: the router with its tail vs without (fixed ids)"
    ab_rounds "$OUT/decode_router_tail_ab.txt"
fi
# REG_CAP=1 (built in the forty-fifth session, run in the forty-sixth on an H100: decode_h100_nvfp4_prologue_cap_ab_s46
# and decode_h100_bf16_prologue_cap_ab_s46; lost, and `TileConfig.max_registers` is removed, so this block no longer
# runs): the likely reason the q|k|v norm prologue lost 12% in NVFP4 (OPS_AGAIN) while BF16 gained 1.7%, from sm_90
# SASS (`kernel_sass.py linear --nvfp4 --block-n 8 --block-k 2048 [--norm-in]`): the NVFP4 8 x 2048 GEMV compiles to
# 96 registers, 110 with the prologue, so an SM holds 4 of its 4-warp programs instead of 5 and the q|k|v's 640
# programs no longer fit one wave of 132 SMs. Capped at 96 (Triton's `maxnreg`) it compiled without spills. BF16's
# tile (212 registers with the prologue) spills 104 bytes at 168. Found: NVFP4 b1 1.999 ms (median of three rounds)
# against 2.132 capped at 96 (+6.7%) and 2.233 uncapped (+11.7%): the registers were half the loss, the row's
# reduction before the weights the rest; BF16 b1 2.792 against 2.817 capped at 168 (+0.9%).
if [ "${REG_CAP:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    base="block_n=8 block_m=1 block_k=2048 use_dot=false num_warps=4 num_stages=1 words=false norm_prologue=true"
    for cap in 96 0; do
        # shellcheck disable=SC2086  # the fields are a list of words
        python3 benchmarks/tuning_variant.py --op gemv.small_m --new \
            --when '{"m": 1, "nvfp4": true, "n": 5120, "k": 2048}' --set $base max_registers=$cap \
            --out $V/nv_prologue_$cap.json > /dev/null
    done
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m": 1, "nvfp4": false, "n": 5120, "k": 2048}' \
        --set max_registers=168 --out $V/bf16_prologue_168.json > /dev/null
    decode_ab nvfp4_prologue_cap 250 "NVFP4's q|k|v norm prologue capped at 96 registers / uncapped" \
        "--formats nvfp4 --batches 1" $V/nv_prologue_96.json $V/nv_prologue_0.json
    decode_ab bf16_prologue_cap 200 "BF16's q|k|v norm prologue capped at 168 registers" \
        "--formats bf16 --batches 1 --reserve-gib 2" $V/bf16_prologue_168.json
fi
# B1_PROBE=1 (forty-sixth session, on an H100: decode_h100_b1_probe_ab_s46; both lost): NVFP4 b1 against two table
# variants, the MoE gate_up at 1 token in whole-K 4-column tiles (1,024 programs of 126 registers, as now, but no K
# splits meeting on a counter; the sixteenth session found it +2%) and the lm_head at 1 row on the FMA path (8 x 2048
# tiles) instead of the MMA linear. Found (medians): 2.001 ms against 2.061 (+3.0%) and 2.008 (+0.3%). ~1 minute.
if [ "${B1_PROBE:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_max": 1}' \
        --set gu_block_i=4 gu_block_k=2048 --out $V/gu_4x2048.json > /dev/null
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m": 1, "nvfp4": true, "n": 150144, "k": 2048}' \
        --set block_n=8 block_k=2048 mma=false mma_vec=false mma_ready=false --out $V/lm_fma.json > /dev/null
    decode_ab b1_probe 280 "the gate_up in whole-K 4-column tiles / the lm_head on the FMA path" \
        "--formats nvfp4 --batches 1" $V/gu_4x2048.json $V/lm_fma.json
fi
# SHARED_SLOTS=1 (built in the forty-seventh session without a GPU; ran in the forty-eighth on an H100: NVFP4 b1 -1.8%
# at 2 columns, BF16 -1.3% at 4, installed): the batch-1 MoE down (`moe_down_slots_triton`,
# NVFP4 10.2 us a layer on the H200, the step's longest launch after the lm_head) with the shared expert's two
# 512-wide K parts in the slot rows that pad top-6 to 8 (`MoEConfig.dn_shared_slots`), which were decoded for
# nothing: sm_90 SASS (ready codes, 2 columns a program) 762 -> 650 instructions after the PDL wait, 96 registers
# either way; 4 columns 1,250 -> 1,072 at 167 registers. Its GPU tests, then NVFP4 and BF16 b1 against the 1-token
# entry with it at 2 and at 4 columns a program. ~4 minutes; an H100 will do. A win: the entry's fields, RECORD=1.
# (The entries now have it: run again, the variants compare 2 against 4 columns with it.)
if [ "${SHARED_SLOTS:-0}" = 1 ]; then
    gpu_tests "down token slots GPU tests" shared_slots_tests 200 -n 4 tests/test_kernels_moe.py -k token_slots_flint
    V=/tmp/variants; mkdir -p $V
    for fmt in nvfp4 bf16; do
        when="{\"nvfp4\": $([ $fmt = nvfp4 ] && echo true || echo false), \"tokens_max\": 1}"
        python3 benchmarks/tuning_variant.py --op moe.decode --when "$when" --set dn_shared_slots=true \
            --out $V/ss2_$fmt.json > /dev/null
        python3 benchmarks/tuning_variant.py --op moe.decode --when "$when" --set dn_shared_slots=true dn_block_n=4 \
            --out $V/ss4_$fmt.json > /dev/null
        decode_ab shared_slots_$fmt 200 "the shared expert in the down's padding slots at 2 / 4 columns ($fmt)" \
            "--formats $fmt --batches 1 --profile-batches 1 --reserve-gib 2" $V/ss2_$fmt.json $V/ss4_$fmt.json
        grep -E "x .* us = .*_moe_down" "$OUT/decode_shared_slots_${fmt}_ab.txt" | head -3
    done
fi
# ONE_WAVE=1 (built in the forty-eighth session without a GPU): the 1-token MoE down's tiles in h's layout
# (`moe_down_slots_triton._unvectorized`: one 8-byte load a group, so a thread's h values serve all its columns and no
# decoded plane moves between layouts): sm_90 SASS of the installed NVFP4 launch (ready codes and scales, shared
# slots, 2 columns) 96 -> 64 registers and 634 -> 554 instructions after the PDL wait, so its 1,024 programs a token
# run in one wave (8 an SM) instead of 1.55; 4 columns 174 -> 80 registers (one wave of 512). BF16 at 4 columns 96
# either way, 983 -> 919 instructions. Its GPU tests (the reference's output, and on ready bytes the bits of the
# engine's bytes, with the PTX move), then b1 against 4 columns (NVFP4) / 2 (BF16) with the eager profile's down
# time, and b2 with the token-slots down: on the H100 before it
# `_moe_down_shared_slots_kernel` took 9.54 us a launch at NVFP4 b1 (`decode_h100_nvfp4_table_s48.txt`; the whole
# step 1.888 ms). ~5 minutes; an H100 will do. Ran in the forty-ninth session (H100): 18 GPU tests passed; the down
# 11.36 us a launch (NVFP4), 10.20 (BF16), the step 1.969 ms: slower, which BODY_AB confirmed (the body is reverted).
# At 4 columns (NVFP4) and 2 (BF16) even; the token-slots down at 2 tokens still lost (2.50 -> 2.85 ms).
if [ "${ONE_WAVE:-0}" = 1 ]; then
    gpu_tests "down token slots GPU tests" one_wave_tests 200 -n 4 tests/test_kernels_moe.py \
        -k "token_slots_flint or token_slots_on_ready"
    V=/tmp/variants; mkdir -p $V
    for fmt in nvfp4 bf16; do
        when="{\"nvfp4\": $([ $fmt = nvfp4 ] && echo true || echo false), \"tokens_max\": 1}"
        cols=$([ $fmt = nvfp4 ] && echo 4 || echo 2)
        python3 benchmarks/tuning_variant.py --op moe.decode --when "$when" --set dn_block_n=$cols \
            --out $V/dn${cols}_$fmt.json > /dev/null
        decode_ab one_wave_$fmt 200 "the down in $cols columns a program ($fmt)" \
            "--formats $fmt --batches 1 --profile-batches 1 --reserve-gib 2" $V/dn${cols}_$fmt.json
        grep -E "^ +$fmt +1 +1024|x .* us = .*_moe_down" "$OUT/decode_one_wave_${fmt}_ab.txt" | head -3
    done
    # At 2 tokens the token-slots down lost 11% in the forty-second session (2,048 programs of ~100 registers, over
    # three waves); in h's layout at 4 columns it is 1,024 programs of 80 (1.3 waves): NVFP4 b2 against it.
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_min": 2, "tokens_max": 2}' \
        --set dn_token_slots=true dn_shared_slots=true dn_block_n=4 --out $V/slots_b2.json > /dev/null
    decode_ab one_wave_b2 200 "the token-slots down at 2 tokens, 4 columns (nvfp4)" \
        "--formats nvfp4 --batches 2 --profile-batches 2" $V/slots_b2.json
    grep -E "x .* us = .*_moe_down" "$OUT/decode_one_wave_b2_ab.txt" | head -3
fi
# BODY_AB=1 (forty-ninth session): ONE_WAVE's eager profile on an H100 had the 1-token down at 11.36 us a launch (NVFP4;
# BF16 10.20) and the step at 1.969 ms, against 9.54 us and 1.888 ms in the forty-eighth session's table run before
# the rewrite: the rewritten body against the one before it (OLD_DOWN, default .probe/moe_down_slots_s47.py:
# `git show 4e286a8^:kernels/moe_down_slots_triton.py`, carry ".probe") in separate processes of a copy of the tree,
# two alternating rounds, both formats at b1 with the eager profile's down. ~4 minutes; an H100 will do. Ran in
# the forty-ninth session on an H100 (`decode_h100_down_body_{new,old}_{1,2}_s49.json`): NVFP4 b1 1.962 / 1.971 ms
# with the one-wave body against 1.893 / 1.895 with the one before, the down 11.40 against 9.57 us a launch; BF16
# 2.962 / 2.942 against 2.836 / 2.940 ms, the down 10.13 against 10.30 us. The old body is back.
if [ "${BODY_AB:-0}" = 1 ]; then
    old=/tmp/flint-old-down; rm -rf $old $old-pp; mkdir -p $old $old-pp; cp -r . $old/
    cp "${OLD_DOWN:-.probe/moe_down_slots_s47.py}" $old/kernels/moe_down_slots_triton.py
    # gpu_env.sh links flint_kernels to this tree: the old copy gets links of its own
    ln -sfn $old/kernels $old-pp/flint_kernels; ln -sfn $old/deployments $old-pp/flint_serve
    (cd $old && PYTHONPATH=$old-pp:$old:/tmp/site python3 -c "import flint_kernels.moe_down_slots_triton as m
print('old copy imports', m.__file__, 'with the opaque move' if hasattr(m, '_unvectorized') else 'without the move')")
    for round in 1 2; do
        for body in new old; do
            dir=.; path=$PYTHONPATH
            [ $body = old ] && dir=$old && path=$old-pp:$old:/tmp/site
            (cd $dir && PYTHONPATH=$path timeout 150 python3 benchmarks/decode.py --formats nvfp4 bf16 --batches 1 \
                --profile-batches 1 --contexts 1024 --prefill 0 --reps 30 --check-steps 0 --no-plain-timing \
                --reserve-gib 2 \
                --out "$OUT/decode_body_${body}_$round.json" > "$OUT/decode_body_${body}_$round.txt" 2>&1)
            echo "== round $round, $body body"
            grep -E "^ +(nvfp4|bf16) +1 +1024|x .* us = .*_moe_down|Error" "$OUT/decode_body_${body}_$round.txt" \
                | head -6
        done
    done
fi
# SHARED_BESIDE=1 (forty-ninth session, built without a GPU): BF16's shared expert, which runs apart from 9 tokens
# (cuBLAS GEMMs and the SiLU: 94 x 5.1 + 47 x 1.2 us of the b32 step on the H200, `decode_h200_bf16_tiles_ab_s49.txt`,
# for 12.6 MB a layer that take ~3 us at the copy rate), on a side stream beside the routed launches, joined before
# the slot reduce adds it (`MoEPaths.shared_beside`): its GPU tests (bits of the in-line run, eager and in a graph),
# then BF16 at 9, 16, 32 and 64 sequences against it. ~3 minutes; an H100 will do (the b32 target is the H200's).
# Ran in the forty-ninth session on an H100 (`decode_h100_shared_beside_ab_s49.json`; b64 skipped: its KV cache did
# not fit the 80 GB card beside the BF16 weights): 3 GPU tests passed; b9 8.42 -> 8.06 ms, b16 11.70 -> 11.32, b32
# 17.00 -> 16.60. A second call, both beside, the fold to 1 or 2 tokens against 8
# (`decode_h100_beside_fold_ab_s49.json`, with FLINT_TUNING_FILE the table with `shared_beside`): b2 3.93 -> 3.90,
# b4 5.74 -> 5.63, b8 8.24 -> 7.99 ms. Installed: BF16 `moe.paths` shared_fold_max_tokens 1, shared_beside.
if [ "${SHARED_BESIDE:-0}" = 1 ]; then
    gpu_tests "shared beside GPU tests" shared_beside_tests 150 tests/test_kernels_moe.py -k "shared_beside"
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op moe.paths --when '{"nvfp4": false}' --set shared_beside=true \
        --out $V/shared_beside.json > /dev/null
    decode_ab shared_beside 300 "the shared expert beside the routed launches (bf16)" \
        "--formats bf16 --batches 9 16 32 64 --profile-batches 32 --reserve-gib 2" $V/shared_beside.json
    grep -E "GPU ms by kernel family|x .* us = " "$OUT/decode_shared_beside_ab.txt" | head -6
fi
# TWIN256=1 (fifty-first session; no kernel change, new tiles): the NVFP4 prefill twins at 8K take 0.952 ms (gate_up)
# + 0.431 (down) a layer, where BF16's launches take ~0.48 + 0.29: with the decoded tile the MMA's register operand,
# each K step's decode runs about as long as its MMAs, and 128-row blocks decode each expert twice for the ~192 pairs
# an expert of an 8K prompt. 256-row blocks (8 warps, two [64, 256] FP32 accumulators) decode it once.
# `benchmarks/moe_grouped_tma.py --twins-only --nv-block-m 128 256 --packed-only` at 6,144 and 8,192 tokens, then
# the whole 8K NVFP4 prefill (prefill_ab.py, 2 rounds) with the best 256-row tiles from 144 pairs an expert (6,144
# tokens). ~6 minutes. A win: the entry, then RECORD=1. Ran in the fifty-first session on an H100
# (`moe_twins_256_h100_s51.json`, `prefill_ab_twin256_h100_s51.json`): at 8,192 tokens the gate_up 935.9 -> 879.8 us
# (64 columns by 128 K, 8 warps, 2 stages, gathered), the down even (398.9 in 128 columns against 403.3; in 64
# columns it left NaN in y: `fits` declines that), the routed MoE 1.419 -> 1.398 ms a layer, the prefill 134.0 ->
# 132.6 ms: installed from 144 pairs an expert, the manifest recorded (120 variants). Again (TWIN256_BLOCK_M=256), the
# variant now sets that entry: deeper pipelines, the sorted copy at 128 deep, 3 prefill rounds. Ran so in the
# fifty-second session (H100, `moe_twins_256_h100_s52.json`, `prefill_ab_twin256_h100_s52.json`; its first try died in
# the whole check: the copies' plain down 128 deep in 3 stages needs 295 KB too, now at <= 2 stages there as well):
# the down 128 deep 394.7 against 400.0 us at 8K (379.9 / 382.5 at 6,144), the routed MoE 1.255 -> 1.218 ms a layer,
# the prefill 127.3 -> 125.8 ms (every round's GPU time lower): installed. The gate_up 64 deep in 6 stages 1,085-1,157
# us (against 742-801 at 128 deep in 3); from the sorted copy 768.5 against 801.1 gathered at 6,144 but 825.5 against
# 742.1 at 8K.
if [ "${TWIN256:-0}" = 1 ]; then
    timeout 300 python3 benchmarks/moe_grouped_tma.py --twins-only --nv-block-m ${TWIN256_BLOCK_M:-128 256} --packed-only \
        --ts ${TWIN256_TS:-6144 8192} --formats nvfp4 --out "$OUT/moe_twins_256.json" > "$OUT/moe_twins_256.txt" 2>&1
    grep -E "nvfp4 in launches m|installed|Error" "$OUT/moe_twins_256.txt" | grep -v "^  nvfp4 in launches" | cut -c1-260
    grep -E "^  nvfp4 in launches (gate_up|down) m256" "$OUT/moe_twins_256.txt" | cut -c1-160
    # The best 256-row whole MoE at the largest size: its config as --set arguments.
    sets=$(python3 - "$OUT/moe_twins_256.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1])).get("rows", [])
whole = rows[-1]["nvfp4_in_launches"]["whole"] if rows else {}
best = min(((v["ms"], v["config"]) for k, v in whole.items() if " m256 " in k), default=None, key=lambda p: p[0])
if best:
    print(" ".join(f"{k}={json.dumps(v)}" for k, v in best[1].items()))
PY
)
    if [ -n "$sets" ]; then
        mkdir -p /tmp/variants
        # shellcheck disable=SC2086  # the --set list is words
        python3 benchmarks/tuning_variant.py --op moe.grouped_tma --when '{"nvfp4": true, "pairs_per_expert_min": 144.0}' \
            --set $sets --out /tmp/variants/twin256.json > /dev/null || echo "variant failed: $sets"
        echo "== whole 8K NVFP4 prefill: table vs the best 256-row twins from 144 pairs an expert ($sets)"
        timeout 300 python3 benchmarks/prefill_ab.py --format nvfp4 --variant-tuning-file /tmp/variants/twin256.json \
            --rounds 3 --out "$OUT/prefill_ab_twin256.json" > "$OUT/prefill_ab_twin256.txt" 2>&1
        grep -E "^round|median|Error" "$OUT/prefill_ab_twin256.txt"
        cp /tmp/variants/twin256.json "$OUT/"
    fi
fi
# TWIN256_S3=1 (fifty-first session): TWIN256's second run (H100, `moe_twins_256_s3_h100_s51.txt`) had the 256-row
# gate_up 128 deep in 3 stages at 738.9 us against the installed 2 stages' 878.2 (8,192 tokens); its whole-MoE check
# did not run (the copies' plain launch at those tiles needs 295 KB of shared memory). The whole 8K NVFP4 prefill
# with 3 stages (3 rounds); a win of 0.5% or more installs it in the call's table, then the TMA launches' GPU tests
# (3 stages against 2: the same sums); the table comes back under $OUT (then RECORD=1 in a call of its own).
if [ "${TWIN256_S3:-0}" = 1 ]; then
    mkdir -p /tmp/variants
    python3 benchmarks/tuning_variant.py --op moe.grouped_tma --when '{"nvfp4": true, "pairs_per_expert_min": 144.0}' \
        --set gate_up_stages=3 --out /tmp/variants/stages3.json > /dev/null || echo "variant failed"
    timeout 200 python3 benchmarks/prefill_ab.py --format nvfp4 --variant-tuning-file /tmp/variants/stages3.json \
        --rounds 3 --out "$OUT/prefill_ab_twin256_s3.json" > "$OUT/prefill_ab_twin256_s3.txt" 2>&1
    grep -E "^round|median|Error" "$OUT/prefill_ab_twin256_s3.txt"
    won=$(python3 - "$OUT/prefill_ab_twin256_s3.txt" <<'PY'
import re, sys
ms = dict(re.findall(r"tokens, (\S+): ([0-9.]+) ms \(median", open(sys.argv[1]).read()))
print(int(len(ms) == 2 and float(ms["stages3"]) < 0.995 * float(ms["engine"])))
PY
)
    [ "$won" = 1 ] && cp /tmp/variants/stages3.json kernels/tuning/nvidia-h200.json && cp /tmp/variants/stages3.json "$OUT/"
    gpu_tests "TMA launches' GPU tests (3 stages installed: $won)" gpu_tests_tma_s3 150 -n 4 \
        tests/test_kernels_moe_grouped_tma.py
fi
# ADD_IN_DOWN=1 (fiftieth session, built): with the shared expert beside the routed launches at 2-8 tokens, the
# per-pair decode down (NVFP4 and BF16 there) is followed by a separate add of its output (a PyTorch launch, 1.3 us,
# and its boundary: no PDL overlap into the next layer's norm). `MoEConfig.dn_add` has the down's last arrivals add
# it (`moe_triton._moe_down_add_kernel`), the side stream joined before the down instead. Its GPU tests first (the
# beside test's dn_add cases: the same bits eagerly and from a graph), then both formats at 2, 4 and 8 sequences
# against the table with dn_add in their 2-8 token entries. ~4 minutes; an H100 will do. Ran in the fifty-first
# session on an H100 (`decode_h100_add_in_down_{nvfp4,bf16}_ab_s51.json`): the tests passed (5) and every size lost,
# NVFP4 b2 2.433 -> 2.580, b4 3.292 -> 3.502, b8 4.634 -> 4.896, BF16 b2 3.910 -> 4.094, b4 5.475 -> 5.804, b8 7.886 ->
# 8.161 ms (+3.5 to +6.4%): the down waiting on the side stream costs more than the add; `dn_add` and its twin kernel
# are removed, so this block is kept as the command only.
if [ "${ADD_IN_DOWN:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    gpu_tests "dn_add GPU tests" gpu_tests_dn_add 200 -n 4 tests/test_kernels_moe.py -k "shared_beside_equals_in_line"
    variant() { python3 benchmarks/tuning_variant.py "$@" > /dev/null || echo "variant failed: $*"; }
    variant --op moe.decode --when '{"nvfp4": true, "tokens_min": 2, "tokens_max": 2}' --set dn_add=true \
        --out $V/add2_nvfp4.json
    variant --table $V/add2_nvfp4.json --op moe.decode --when '{"nvfp4": true}' --set dn_add=true \
        --out $V/add_nvfp4.json
    variant --op moe.decode --when '{"nvfp4": false, "tokens_max": 2}' --set dn_add=true --out $V/add2_bf16.json
    variant --table $V/add2_bf16.json --op moe.decode --when '{"nvfp4": false, "tokens_max": 8}' --set dn_add=true \
        --out $V/add_bf16.json
    decode_ab add_in_down_nvfp4 150 "the shared expert added in the down (nvfp4)" "--formats nvfp4 --batches 2 4 8" \
        $V/add_nvfp4.json
    decode_ab add_in_down_bf16 150 "the shared expert added in the down (bf16)" \
        "--formats bf16 --batches 2 4 8 --reserve-gib 2" $V/add_bf16.json
fi
# AFTER_BESIDE=1 (fiftieth session, built; a table A/B, no new code): NVFP4's MoE tiles at 3-8 tokens were chosen
# with the shared expert folded into the launches (the gate_up's extra programs, the down's extra slots); since the
# fiftieth session it runs beside them from 2 tokens, so the routed launches are narrower grids and other tiles may
# win. At 3, 4, 6 and 8 sequences against: gu8, the gate_up in 8-row programs (twice the programs); dn16, the down in
# 16 columns; mma, the 9-16 token entry's MMA launches (expert-major, the shared expert inside their grids again) from
# 5 tokens (the twenty-third session's d8 / gd8 lost with the fold at 4). ~3 minutes; an H100 will do. A win: the
# entry, then RECORD=1 (new variants). Ran in the fiftieth session on an H100 (`decode_h100_after_beside_ab_s50.json`,
# and b5 / b7 / b8 again in `decode_h100_after_beside_b8_ab_s50.json`, the first call's b8 rounds disturbed): gu8
# won at every size (b3 -1.4%, b4 -0.9%, b5 -0.8%, b6 -0.7%, b7 -3.1%, b8 -2.6%: installed); dn16 lost 5-10%; mma5
# lost at 5-6 tokens (+8%, +4%) and was even to -2.6% at 7-8.
if [ "${AFTER_BESIDE:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    variant() { python3 benchmarks/tuning_variant.py "$@" > /dev/null || echo "variant failed: $*"; }
    variant --op moe.decode --when '{"nvfp4": true}' --set gu_block_i=8 --out $V/gu8.json
    variant --op moe.decode --when '{"nvfp4": true}' --set dn_block_n=16 --out $V/dn16.json
    mma="mma_down=true mma_vec=true mma_down_l2=2 mma_down_wide=true mma_ready=true mma=true mma_prefetch=true"
    mma="$mma mma_l2_ahead=2 expert_major=true mma_wide=true mma_shared=true mma_perm_h=true mma_shared_first=true"
    # shellcheck disable=SC2086  # the fields are a list of words
    variant --op moe.decode --when '{"nvfp4": true}' --add '{"nvfp4": true, "tokens_min": 5, "tokens_max": 8}' \
        --set $mma mma_ready_codes=true --out $V/mma5.json
    decode_ab after_beside 420 "the NVFP4 MoE tiles at 3-8 tokens with the shared expert beside" \
        "--formats nvfp4 --batches 3 4 6 8" $V/gu8.json $V/dn16.json $V/mma5.json
fi
# BESIDE_MORE=1 (forty-ninth session, built; a table A/B, no new code): the shared expert beside the routed launches
# where it is folded into them now. NVFP4 folds it at 1-8 tokens (its gate_up in the gate_up launch's extra programs,
# its down in the down's padding slots at 1 token, extra slots at 2-8) and takes it into the MMA launches' own
# programs from 9; BF16 at 1 token in the padding slots only. `shared_fold_max_tokens=0` with `shared_beside` runs it
# apart and beside at those sizes (the MMA launches keep theirs: `_paths` folds it there at any size). NVFP4 at 1,
# 2, 4 and 8 sequences, BF16 at 1, against the table; then NVFP4 at 16, 32 and 64 with the shared expert out of
# the MMA launches (`mma_shared` off in every entry) and beside (its own MMA linear launches on the side stream:
# the thirty-fifth session's fold took b32 9.21 -> 8.91 ms against it in line). The routed launches without the
# shared expert are variants the manifest lacks: they compile in the warm-up. ~6 minutes; an H100 will do. A win:
# the table's `moe.paths` (and `moe.decode`) entries, then RECORD=1 (or `gpu_record_manifest.sh` with
# MODEL=random:full:layers=8 for BF16). Ran in the fiftieth session on an H200 (`decode_h200_beside_more_*_s50.json`,
# `decode_h200_beside_mma_nvfp4_ab_s50.json`): NVFP4 apart and beside b1 1.773 -> 1.885 (lost), b2 2.519 -> 2.460,
# b4 3.219 -> 3.158, b8 4.629 -> 4.409 (won: installed as `shared_fold_max_tokens` 1 with `shared_beside`); BF16 at
# 1 token 2.392 -> 2.533 (lost); out of the MMA launches b16 6.325 -> 6.311, b32 8.258 -> 8.278, b64 12.606 -> 12.699
# (even: not installed).
if [ "${BESIDE_MORE:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    for fmt in nvfp4 bf16; do
        nv=$([ $fmt = nvfp4 ] && echo true || echo false)
        python3 benchmarks/tuning_variant.py --op moe.paths --when "{\"nvfp4\": $nv}" \
            --set shared_fold_max_tokens=0 shared_beside=true --out $V/beside_all_$fmt.json > /dev/null
    done
    decode_ab beside_more_nvfp4 240 "the shared expert apart and beside at 1-8 tokens (nvfp4)" \
        "--formats nvfp4 --batches 1 2 4 8 --profile-batches 1" $V/beside_all_nvfp4.json
    decode_ab beside_more_bf16 150 "the shared expert apart and beside at 1 token (bf16)" \
        "--formats bf16 --batches 1 --profile-batches 1 --reserve-gib 2" $V/beside_all_bf16.json
    python3 benchmarks/tuning_variant.py --op moe.paths --when '{"nvfp4": true}' --set shared_beside=true \
        --out $V/beside_nvfp4.json > /dev/null
    python3 benchmarks/tuning_variant.py --table $V/beside_nvfp4.json --op moe.decode --when all \
        --set mma_shared=false --out $V/beside_mma_nvfp4.json > /dev/null
    decode_ab beside_mma_nvfp4 240 "the shared expert out of the MMA launches and beside (nvfp4)" \
        "--formats nvfp4 --batches 16 32 64 --profile-batches 32" $V/beside_mma_nvfp4.json
fi
# BF16_TILES=1 (forty-ninth session): BF16 b32 is 0.5-3.8% over its 13 ms target on the H200; on an H100 its profile
# (`decode_h100_bf16_b32_profile_s49.txt`) has the expert-major MoE at 14.5 of 18.4 GPU ms, the gate_up 183 us a layer
# (~136 experts' 571 MB at ~3.1 TB/s, the copy rate) and the down 116 us (285 MB at ~2.5 TB/s, 82% of it): its 128 x
# 512 tiles run 4 K steps of 128 in 3 stages, so each program's ramp is a large part of it. The 9-64 token entry
# against the down in 64 columns (n64), in K steps of 64 (k64) and of 256 over 64 columns (k256), and both launches
# in 2 and 4 stages (s2, s4), at 16, 32 and 64 sequences. ~5 minutes; an H100 will do. Ran in the forty-ninth session
# on an H200 (`decode_h200_bf16_tiles_ab_s49.json`): all lost (b32 12.96-13.02 ms as shipped; n64 15.6, k64 13.2,
# k256 19.8, s2 13.1, s4 14.4; s2 at b64 within noise); on the H200 the down reads at ~4.0 TB/s (70.9 us a layer)
# and the gate_up at ~4.3 (132.9 us): the H100's 82% was that card's.
if [ "${BF16_TILES:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    for v in "n64 dn_block_n=64" "k64 dn_block_k=64" "k256 dn_block_n=64 dn_block_k=256" "s2 num_stages=2" \
        "s4 num_stages=4"; do
        set -- $v
        name=$1; shift
        python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": false}' --set "$@" \
            --out $V/bf16_$name.json > /dev/null || echo "variant $name failed"
    done
    decode_ab bf16_tiles 480 "the BF16 expert-major down's tiles and the stages" \
        "--formats bf16 --batches 16 32 64 --profile-batches 32 --reserve-gib 2" $V/bf16_n64.json $V/bf16_k64.json \
        $V/bf16_k256.json $V/bf16_s2.json $V/bf16_s4.json
    grep -E "x .* us = .*_moe" "$OUT/decode_bf16_tiles_ab.txt" | head -3
fi
# LM_PROBE=1 (forty-sixth session, on an H100: decode_h100_lm_probe_ab_s46; neither won, 2 warps 2.005 ms and 8 warps
# 2.017 against 2.007 as shipped): NVFP4 b1 against the lm_head's MMA launch at one row in 2 and in 8
# warps (32 or 128 weight rows a program instead of 64; its 83 us on the H100, 66 on the H200, read 173 MB at ~2.1-2.6
# TB/s, against a copy rate of 3.0-4.3). ~1 minute; an H100 will do. A win: the entry, RECORD=1 (new variants).
if [ "${LM_PROBE:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    for w in 2 8; do
        python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m": 1, "nvfp4": true, "n": 150144, "k": 2048}' \
            --set num_warps=$w --out $V/lm_warps_$w.json > /dev/null
    done
    decode_ab lm_probe 200 "the lm_head's MMA launch in 2 / 8 warps" "--formats nvfp4 --batches 1" \
        $V/lm_warps_2.json $V/lm_warps_8.json
fi
# TABLE_AB=1 (forty-fifth session; ran on an H100, the device lending no H200: decode_h100_table_ab_s45.json, NVFP4 b1
# 2.002 -> 2.002 ms, b12 6.562 -> 6.404, b16 7.255 -> 7.180, BF16 b1 2.931 -> 2.876, b12 10.14 -> 10.08, b16 even;
# BF16 b1 454 kernels, was 502): the shipped table against the forty-fourth session's (OLD_TABLE, default
# .probe/table_s44.json: `git show bdd0536:kernels/tuning/nvidia-h200.json > .probe/table_s44.json`, carry ".probe") at
# 1, 12 and 16 sequences, both formats, with the batch-1 kernel count and families. ~4 minutes.
if [ "${TABLE_AB:-0}" = 1 ]; then
    table_against table 480 "forty-fourth" "${OLD_TABLE:-.probe/table_s44.json}" --batches 1 12 16 --deadline-s 440 \
        --reserve-gib 2
fi
# H200_TABLE=1 (ran in the forty-third session: decode_h200_table_s43.json): the shipped table's figures on an H200,
# both formats, for the status table after sessions that measured only on an H100: the step at 1-64 sequences (1K
# context), the 8K prefill and the batch-1 kernel count and families (eager profile); no path check (CHECK runs
# it), no plain-path timing. ~6 minutes.
if [ "${H200_TABLE:-0}" = 1 ]; then
    timeout 540 python3 benchmarks/decode.py --formats nvfp4 bf16 --batches 1 8 16 32 64 --contexts 1024 \
        --prefill 8192 --check-steps 0 --no-plain-timing --profile-batches 1 --deadline-s 480 \
        --out "$OUT/decode_table.json" > "$OUT/decode_table.txt" 2>&1
    grep -E "^ *(fmt|bf16|nvfp4) |GPU ms by|copy bandwidth|Error" "$OUT/decode_table.txt" | head -40
fi
# RECORD_BOTH=1: both kernel-manifest profiles recorded again (NVFP4, then BF16; ~5 minutes), after a kernel change.
# BF16 on the full model's first 8 layers (`random:full:layers=8`: the same kernel profile and variants), which an
# 80 GB H100 holds with a KV cache (the whole BF16 model left it none).
if [ "${RECORD_BOTH:-0}" = 1 ]; then
    (OUT=$OUT/record_nvfp4 bash benchmarks/gpu_record_manifest.sh 2>&1 | tail -3)
    (OUT=$OUT/record_bf16 MODEL=random:full:layers=8 bash benchmarks/gpu_record_manifest.sh 2>&1 | tail -3)
fi
# EDGE_AB=1 (run in the twenty-eighth session: even on the whole prefill): the twenty-seventh session's edge masks on the whole prefill, which its device time did not
# reach. Before the call: `git show e9437d1:kernels/attention_triton.py > .probe/attention_before.py` and carry
# [".whl", ".probe"]. The prefill attention GPU tests, the kernel A/B (prefill_attention_ab.py), the 8K BF16 prefill
# in one step and a 32K prompt in 2,048-token steps against `attention_before`, and the sliding sweep again (the
# masks' cost changed, so other tiles may win now). ~7 minutes.
if [ "${EDGE_AB:-0}" = 1 ]; then
    # Every attention GPU test: the decode kernel's mask argument changed in the review after the edge masks.
    gpu_tests "attention GPU tests" edge_tests 300 -n 8 tests/test_kernels_attention.py
    timeout 200 python3 benchmarks/prefill_attention_ab.py --before .probe/attention_before.py \
        --out "$OUT/prefill_attention_ab.json" 2>&1 | grep -v "^wrote"
    export FLINT_AB_ATTENTION_BEFORE=$PWD/.probe/attention_before.py
    for spec in 8192:0 32768:2048; do
        [ "$spec" = 32768:2048 ] && [ "${EDGE_32K:-1}" = 0 ] && continue
        set -- ${spec/:/ }
        timeout 500 python3 benchmarks/prefill_ab.py --format bf16 --tokens "$1" --chunk "$2" \
            --variant attention_before --rounds 3 --out "$OUT/prefill_ab_edges_$1_$2.json" \
            > "$OUT/prefill_ab_edges_$1_$2.txt" 2>&1
        echo "== bf16 $1 tokens, chunk $2"; grep -E "^round|median|Error" "$OUT/prefill_ab_edges_$1_$2.txt"
    done
    unset FLINT_AB_ATTENTION_BEFORE
    [ "${EDGE_SWEEP:-1}" = 1 ] && timeout 300 python3 benchmarks/kernels_attention.py --sweep --sweep-parts prefill-sliding > "$OUT/sweep_sliding.txt" 2>&1
    if [ "${EDGE_SWEEP:-1}" = 1 ]; then
    cp benchmarks/results/kernels_attention_sweep.json "$OUT/kernels_attention_sweep_sliding.json"
    python3 - "$OUT/kernels_attention_sweep_sliding.json" <<'PY'
import json, sys
for r in sorted(json.load(open(sys.argv[1])), key=lambda r: r["ms"])[:6]:
    print(f"  {r['ms']:.4f} ms  err {r['rel_err']:.1e}  {r['config']}")
PY
    fi
fi
# SLIDING_CUDNN=1 (twenty-eighth session): a sliding layer's fresh prompt on cuDNN cut into blocks (flipped: two
# causal calls over 512-query blocks, merged; band: one call with a bias over 128 / 256-query blocks) against our
# Triton kernel, each path's error and its cuDNN calls alone. ~1 minute.
if [ "${SLIDING_CUDNN:-0}" = 1 ]; then
    timeout 200 python3 benchmarks/sliding_attention_cudnn.py --ts 4096 8192 --out "$OUT/sliding_attention_cudnn.json" \
        > "$OUT/sliding_attention_cudnn.txt" 2>&1
    sed -n '/^Sliding prefill/,$p' "$OUT/sliding_attention_cudnn.txt" | grep -v "^wrote"; grep Traceback -A5 "$OUT/sliding_attention_cudnn.txt"
fi
# L2_AHEAD (twenty-eighth session, its first build; the block is a comment now that the tuning table's
# weights_ahead op holds those settings): the next layer's static weights asked into L2 on a side stream of the decode
# graphs, forked before each layer's MLP or at its start, by parts, as `decode.py --ab-ops all,l2_ahead` runs:
# NVFP4 b1 all parts 2.274 -> 2.199 ms, q|k|v and o 2.273 -> 2.140 (installed), q|k|v 2.293 -> 2.186, router + shared
# expert 2.278 -> 2.199, a layer earlier 2.286 -> 2.316; b2-b8 and every BF16 variant slower
# (benchmarks/results/decode_h200_l2_ahead_*_s28.json).
# AHEAD_TABLE=1 (twenty-eighth session, after L2_AHEAD=1 found NVFP4 batch 1 faster with the next layer's q|k|v and o
# asked ahead, 2.273 -> 2.140 ms, and every BF16 and 2-8 token variant slower): the op as the tuning table's
# `weights_ahead` entries, NVFP4 at one token: n2 (next_qkv, next_o), n2m (and own_mlp), n1om (next_qkv, own_o,
# own_mlp), n1o (next_qkv, own_o). Its GPU tests, then the whole step at batch 1. ~3 minutes.
if [ "${AHEAD_TABLE:-0}" = 1 ]; then
    gpu_tests "weights-ahead GPU tests" ahead_tests 200 tests/test_weights_ahead.py
    V=/tmp/variants; mkdir -p $V
    one='{"nvfp4": true, "tokens_max": 1}'
    for spec in n2:next_qkv,next_o n2m:next_qkv,next_o,own_mlp n1om:next_qkv,own_o,own_mlp n1o:next_qkv,own_o; do
        fields=${spec#*:}
        # shellcheck disable=SC2046
        python3 benchmarks/tuning_variant.py --op weights_ahead --new --when "$one" \
            --set $(echo "$fields" | tr ',' '\n' | sed 's/$/=true/') --out "$V/${spec%%:*}.json" > /dev/null
    done
    timeout 300 python3 benchmarks/decode.py --formats nvfp4 --batches 1 --contexts 1024 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --ab-tuning-file $V/n2.json $V/n2m.json $V/n1om.json $V/n1o.json \
        --out "$OUT/decode_ahead_table.json" > "$OUT/decode_ahead_table.txt" 2>&1
    echo "== whole step: table vs n2 / n2m / n1om / n1o"
    ab_rounds "$OUT/decode_ahead_table.txt"
fi
# AHEAD_CHUNKS (twenty-eighth session, run; CHUNK_SWEEP below is its recipe): 1,024 lines a side program 2.195 ->
# 2.177 ms (installed), 4,096 lines 2.451, 4,096 with the MLP parts 2.548
# (benchmarks/results/decode_h200_weights_ahead_chunks_ab_s28.json).
# CHUNK_SWEEP=1 (ran in the thirty-second session: 512 lines 2.127 against 1,024's 2.145 ms, installed; 2,048 lines
# 2.255, the MLP parts 2.171): the side programs' lines around the installed 1,024 (256 lost 0.8%, 4,096 lost 11%): c512,
# c2048 on the installed NVFP4 entry, and the 1,024-line entry with the next layer's MLP parts (router, shared expert)
# too, m1 (in 256-line programs they lost with q|k|v and o, 2.200 vs 2.140). ~2 minutes.
if [ "${CHUNK_SWEEP:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    nv='{"nvfp4": true, "tokens_max": 1}'
    for spec in c512:chunk_lines=512 c2048:chunk_lines=2048 m1:next_mlp=true; do
        # shellcheck disable=SC2046
        python3 benchmarks/tuning_variant.py --op weights_ahead --when "$nv" --set $(echo "${spec#*:}" | tr ',' ' ') \
            --out "$V/${spec%%:*}.json" > /dev/null || echo "variant failed: $spec"
    done
    timeout 150 python3 benchmarks/decode.py --formats nvfp4 --batches 1 --contexts 1024 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --ab-tuning-file $V/c512.json $V/c2048.json $V/m1.json \
        --out "$OUT/decode_ahead_chunk_sweep.json" > "$OUT/decode_ahead_chunk_sweep.txt" 2>&1
    echo "== whole step: table vs c512 / c2048 / m1"
    ab_rounds "$OUT/decode_ahead_chunk_sweep.txt"
fi
# TMA_MOE=1: the TMA-fed MoE launches' tiles against the installed paths at prefill sizes, each launch alone and the
# whole routed MoE (benchmarks/moe_grouped_tma.py; the twenty-ninth session's run chose the H200 table's entries), then
# the whole 8K prefill in 2048-token steps against the table before them (TMA_BEFORE: that table's file). ~4 minutes.
# Thirtieth session: the NVFP4 twins that decode in registers won from 256 to 4,096 tokens (installed), then with
# the weights decoded two at a time on 64-row blocks of 64 columns (`packed_decode`, installed: 8K NVFP4 in 2048-token
# steps 273.4 -> 215.5 -> 175.5 ms GPU); each expert's short last block on 64-row tiles ("tail") lost at every size
# and was removed. The benchmark's --twins-only times the twins alone (both decodes).
if [ "${TMA_MOE:-0}" = 1 ]; then
    gpu_tests "TMA MoE launches" tma_moe_tests 200 tests/test_kernels_moe_grouped_tma.py
    timeout 400 python3 benchmarks/moe_grouped_tma.py --ts 512 2048 8192 --formats nvfp4 bf16 \
        --out "$OUT/moe_grouped_tma.json" > "$OUT/moe_grouped_tma.txt" 2>&1
    sed -n '/^Routed MoE/,$p' "$OUT/moe_grouped_tma.txt"
    if [ -n "${TMA_BEFORE:-}" ]; then
        for f in bf16 nvfp4; do
            timeout 200 python3 benchmarks/prefill_ab.py --variant-tuning-file "$TMA_BEFORE" --format $f --chunk 2048 \
                --rounds 2 --out "$OUT/prefill_ab_${f}_tma.json" 2>&1 | grep -i "median"
        done
    fi
fi
# TWINS=1 (ran in the thirty-first session: the twins from 65 tokens at every size, the 128-row entry not installed;
# see docs/performance.md "Prefill and mixed steps on CUDA graphs"): the packed twins where the table does not yet use them at their best. Each launch
# and the whole routed MoE at 96-192 tokens (below the twins' 256, where the Triton grouped kernels run: if the twins
# win there, lower `tma_nvfp4_min_tokens` towards the decode path's 65) and at 3,072-8,192, then two whole-prefill A/Bs: (a) 128-row packed blocks of 64
# columns from 72 pairs an expert (4,096 tokens: 0.789 against the installed 0.856 ms a layer), in 4096-token steps;
# (b) the twins also for 8,192-token steps (level with the copies there, 1.453 against 1.475), the 8K prompt in one
# step. Whichever wins goes into the table, then `bash benchmarks/gpu_record_manifest.sh` (NVFP4). ~5 minutes.
if [ "${TWINS:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    timeout 240 python3 benchmarks/moe_grouped_tma.py --twins-only --ts 96 192 3072 4096 6144 8192 --formats nvfp4 \
        --out "$OUT/moe_twins_large.json" > "$OUT/moe_twins_large.txt" 2>&1
    sed -n '/^Routed MoE/,$p' "$OUT/moe_twins_large.txt" | cut -c1-150
    python3 benchmarks/tuning_variant.py --op moe.grouped_tma --new --when '{"nvfp4": true, "pairs_per_expert_min": 72.0}' \
        --set block_m=128 gate_up_block_n=64 gate_up_warps=4 gate_up_stages=3 down_block_n=64 down_warps=4 \
        down_stages=3 gather=true packed_decode=true --out $V/m128.json > /dev/null
    python3 benchmarks/tuning_variant.py --op moe.paths --when '{"nvfp4": true}' --set tma_nvfp4_max_tokens=0 \
        --out $V/all.json > /dev/null
    timeout 150 python3 benchmarks/prefill_ab.py --variant-tuning-file $V/m128.json --format nvfp4 --chunk 4096 \
        --rounds 2 --out "$OUT/prefill_ab_twins_m128.json" 2>&1 | grep -i "^round\|median\|error"
    timeout 150 python3 benchmarks/prefill_ab.py --variant-tuning-file $V/all.json --format nvfp4 --rounds 2 \
        --out "$OUT/prefill_ab_twins_8k.json" 2>&1 | grep -i "^round\|median\|error"
fi
# STEP_GRAPHS=1 (ran in the thirty-second session with step graphs only: TTFT p50 116 ms, ITL p99 63 ms): the engine under mixed traffic at the serving default (64 sequences, 128 requests) with and
# without step graphs, NVFP4 (`engine_gpu.py --churn`; the thirty-first session ran 16 sequences and 64 with 96
# requests), and the host cost of BF16 forwards (`prefill_host.py --step-graphs`). ~5 minutes.
if [ "${STEP_GRAPHS:-0}" = 1 ]; then
    for sg in step-graphs no-step-graphs; do
        timeout 200 python3 benchmarks/engine_gpu.py --model random:full:nvfp4 --max-num-seqs 64 --churn 128 \
            --long-prompt 2048 --no-sampling-rows --$sg --out "$OUT/engine_gpu_churn64_$sg.json" > "$OUT/churn64_$sg.txt" 2>&1
        echo "== $sg"; grep -h '^churn\|TTFT\|captured' "$OUT/churn64_$sg.txt" | cut -c1-200
    done
    timeout 200 python3 benchmarks/prefill_host.py --format bf16 --lengths 16 128 512 2048 --step-graphs \
        --profile-length 0 --out "$OUT/prefill_host_bf16.json" 2>&1 | grep -v Warn | tail -12
fi
# READY=1 (ran in the thirty-fourth session: installed, b32 -5.2%, b64 -4.3%; benchmarks/results/
# decode_h200_nvfp4_ready_ab_s34.json, nvfp4_mma_ready_h200_s34.json; the table now sets mma_ready, so this block now
# compares it against the variant with mma_ready off): the MMA kernels reading ready scale bytes (`kernels/nvfp4_mma_scales.py`: each block scale's BF16
# pair in one multiply-add instead of the E4M3 decode, 11-14% fewer instructions in the K loops on sm_90; built on CPU
# in the thirty-third session after Nsight Compute had the wide MoE kernels' schedulers issuing on 63-65% of cycles).
# FLINT_MMA_READY_SCALES=1 makes the bytes when the model is built (both tables then run on the same weights); the
# variant sets mma_ready on every gemv.small_m and moe.decode entry (it matters only where the MMA kernels run). Its
# GPU tests (every output the same bits), the kernels alone, then the whole step at 1-64. ~5 minutes. If it wins:
# make the bytes by default (~6% more NVFP4 weight bytes, or move every NVFP4 path to them), record the manifest.
if [ "${READY:-0}" = 1 ]; then
    export FLINT_MMA_READY_SCALES=1
    gpu_tests "ready scales GPU tests" ready_tests 240 -n 4 tests/test_nvfp4_mma_moe.py -k "ready_scales_on_the_gpu"
    timeout 200 python3 benchmarks/nvfp4_mma.py --ms 8 32 --shapes qkv o_proj lm_head --warps 4 --vec 1 --wide \
        --ready --moe-tokens 16 32 64 --moe-l2-ahead 2 --moe-down-l2 2 --moe-wide --out "$OUT/nvfp4_mma_ready.json" \
        > "$OUT/nvfp4_mma_ready.txt" 2>&1
    sed -n '/^NVFP4 linear on/,$p' "$OUT/nvfp4_mma_ready.txt" | grep -v "^wrote"
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when all --set mma_ready=false --out $V/r_gemv.json \
        > /dev/null
    python3 benchmarks/tuning_variant.py --table $V/r_gemv.json --op moe.decode --when all --set mma_ready=false \
        --out $V/ready.json > /dev/null
    timeout 330 python3 benchmarks/decode.py --formats nvfp4 --batches 1 8 16 32 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/ready.json \
        --out "$OUT/decode_ready_ab.json" > "$OUT/decode_ready_ab.txt" 2>&1
    echo "== whole step: table (mma_ready on its MMA entries) vs mma_ready off (ready bytes made for both)"
    ab_rounds "$OUT/decode_ready_ab.txt"
    cp $V/ready.json "$OUT/"
    unset FLINT_MMA_READY_SCALES
fi
# SHARED_MOE=1 (ran in the thirty-fifth session: shared + perm_h installed, b16 -4.7%, b32 -3.3%, b64 -3.5%;
# benchmarks/results/decode_h200_nvfp4_shared_ab_s35.json): the shared expert inside the MMA MoE launches
# (MoEConfig.mma_shared: `nvfp4_mma_moe_triton`'s wide twins with programs of their own for it), instead of two NVFP4
# linears and a SiLU-and-mul beside them, which took ~0.85 ms of the b32 step (94 launches of ~9 us, 6 MB each). Its
# GPU tests (the folded output against the shared expert run apart and `moe_ref`, at 9-64 tokens, with and without
# ready bytes, and with h in the MMA's order, MoEConfig.mma_perm_h) and the MMA kernels' others, then the whole step
# with mma_shared on every NVFP4 entry from 9 tokens, and with mma_perm_h as well. ~5 minutes. If it wins: set it in the table, RECORD=1 (the twins are new kernels for the manifest).
if [ "${SHARED_MOE:-0}" = 1 ]; then
    gpu_tests "shared expert GPU tests" shared_tests 300 -n 8 tests/test_nvfp4_mma_moe.py
    V=/tmp/variants; mkdir -p $V
    moe_entries_variant mma_shared=true $V/shared.json 9 17 25 33
    t=$V/shared.json
    for lo in 9 17 25 33; do  # the same entries with h in the MMA's order as well
        python3 benchmarks/tuning_variant.py --table $t --op moe.decode --when "{\"nvfp4\": true, \"tokens_min\": $lo}" \
            --set mma_perm_h=true --out $V/shared_perm.$lo > /dev/null || echo "variant failed: perm from $lo"
        t=$V/shared_perm.$lo
    done
    cp $t $V/shared_perm.json
    timeout 400 python3 benchmarks/decode.py --formats nvfp4 --batches 9 16 32 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --profile-batches 32 --ab-tuning-file $V/shared.json \
        $V/shared_perm.json --out "$OUT/decode_shared_ab.json" > "$OUT/decode_shared_ab.txt" 2>&1
    echo "== whole step: table vs the shared expert in the MoE launches from 9 tokens (shared), and with h in the"
    echo "   MMA's order (shared_perm)"
    ab_rounds "$OUT/decode_shared_ab.txt"
    grep -E "GPU ms by kernel family|x .* us = " "$OUT/decode_shared_ab.txt" | head -12
    cp $V/shared.json $V/shared_perm.json "$OUT/"
fi
# HEAD_TESTS=1 (NEXT, first): the GPU tests of the NVFP4 MMA, MoE and GEMV kernels at the head (287), verbose, in a
# limit they fit (they ran out of 240-250 s twice in the thirty-sixth session, 7-9 failures unnamed). Their time is
# likely Triton compiling each test's variants on the host's CPUs (--durations will say), so 12 workers on the machine's 16 cores (the
# thirty-second session ran 14 over fifteen files; its four out-of-memory failures sat beside a cuDNN attention
# reference test holding 41 GB, which this set does not run).
if [ "${HEAD_TESTS:-0}" = 1 ]; then
    gpu_tests "MMA, MoE and GEMV GPU tests at the head" head_tests 540 -n 12 --durations=15 tests/test_nvfp4_mma.py \
        tests/test_nvfp4_mma_moe.py tests/test_kernels_moe.py tests/test_kernels_gemv.py
    grep -c " PASSED" "$OUT/head_tests.txt"
    sed -n '/slowest 15 durations/,/^$/p' "$OUT/head_tests.txt" | head -17  # where the set's time goes
fi
# READY_CODES=1 (built in the thirty-eighth session without a GPU; on an H200 in the forty-seventh: b16 -5.1%, b32
# -4.1%, b64 -1.8%, b1 even, installed; now that the table's MMA entries set it, the A/B compares the same kernels
# unless the variant is made from an older table): the NVFP4 MMA kernels reading ready codes
# (`kernels/nvfp4_mma_codes.py`, TileConfig / MoEConfig.mma_ready_codes): each word of 8 codes in the order the K step
# decodes in 8 integer instructions instead of 13, so the installed K steps are 15-31% shorter on sm_90 (the gate_up's
# loop also takes two steps an iteration; `benchmarks/mma_k_loops.py`); the MoE at b32 issues on ~2 of 3 cycles, and the ready scale bytes' 13% fewer gave
# b32 -5%. Its GPU tests (test_nvfp4_mma_codes.py: the same bits as from the engine's codes) run in
# `benchmarks/gpu_tests.sh`; here the kernels alone (the ready-scale variants against the same with ready codes,
# "_rc"), then the whole step with
# mma_ready_codes on every gemv.small_m and moe.decode entry against the table, the codes made for both
# (FLINT_MMA_READY_CODES=1: ~20 GB more on the full model). ~8 minutes (under the device's 600 s a call). A win: set it in the table's MMA entries
# (then `auto` makes the codes), RECORD=1 (ready codes are new compile variants: an int8 code pointer).
if [ "${READY_CODES:-0}" = 1 ]; then
    export FLINT_MMA_READY_CODES=1
    # the kernels alone: each ready-scale variant against the same with ready codes (_rc), loads a step ahead or not
    # (with them and L2 requests ahead the ready-code gate_up runs two steps an iteration)
    timeout 180 python3 benchmarks/nvfp4_mma.py --ms 8 32 --shapes qkv o_proj lm_head --warps 4 --vec 1 --prefetch 0 1 \
        --wide --ready-codes --moe-tokens 16 32 64 --moe-l2-ahead 2 --moe-down-l2 2 --moe-wide \
        --out "$OUT/nvfp4_mma_ready_codes.json" > "$OUT/nvfp4_mma_ready_codes.txt" 2>&1
    sed -n '/^NVFP4 linear on/,$p' "$OUT/nvfp4_mma_ready_codes.txt" | grep -v "^wrote"
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when all --set mma_ready_codes=true \
        --out $V/rc_gemv.json > /dev/null
    python3 benchmarks/tuning_variant.py --table $V/rc_gemv.json --op moe.decode --when all \
        --set mma_ready_codes=true --out $V/ready_codes.json > /dev/null
    timeout 330 python3 benchmarks/decode.py --formats nvfp4 --batches 1 8 16 32 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --profile-batches 32 --ab-tuning-file $V/ready_codes.json \
        --out "$OUT/decode_ready_codes_ab.json" > "$OUT/decode_ready_codes_ab.txt" 2>&1
    echo "== whole step: table vs mma_ready_codes on every gemv.small_m and moe.decode entry (codes made for both)"
    ab_rounds "$OUT/decode_ready_codes_ab.txt"
    grep -E "GPU ms by kernel family|x .* us = " "$OUT/decode_ready_codes_ab.txt" | head -8
    cp $V/ready_codes.json "$OUT/"
    unset FLINT_MMA_READY_CODES
fi
# REPLACE_CODES=1 (built in the thirty-eighth session without a GPU; on an H200 in the forty-seventh: 8 GPU tests
# passed, b32 8.887 -> 8.432 ms, what `auto` does since): ready codes in the codes' place
# (FLINT_MMA_READY_CODES=replace), which every NVFP4 path reads (the FMA and tensor-core GEMV tiles, the MoE's decode
# and grouped kernels, the prefill twins, through an unsigned code pointer; the MMA kernels whatever the table says),
# so they cost no memory. Its GPU tests (the same bits as from the engine's codes at 1-2,048 tokens), then the step at
# 1-64 sequences and the 8K prefill, with the codes in place and without (separate processes: each makes its bytes at
# build), the fast path checked against the plain one. ~8 minutes. If READY_CODES wins and this holds: make `replace`
# what `auto` does when the table reads ready codes.
if [ "${REPLACE_CODES:-0}" = 1 ]; then
    gpu_tests "replaced codes GPU tests" replace_codes_tests 240 -n 4 tests/test_ready_bytes_everywhere.py \
        -k "codes or both"
    modes_ab FLINT_MMA_READY_CODES codes 150 0 replace
fi
# MOE_NEXT=1, L2_ALL=1 and USED=1 ran in the fortieth session on an H100 (one model build, the H200 table against
# ready codes on every MMA entry, MoEConfig.mma_l2_all and mma_used_experts on the NVFP4 moe.decode entries from 9
# tokens; benchmarks/results/decode_h100_moe_next_ab_s40.json): ready codes b32 -2.1%, within 1% elsewhere; the
# other two lost 13-16% and 3-15% at b9-b64, and their kernel options were removed, so their blocks went with them
# (git show 1787883:benchmarks/gpu_pending.sh has them). READY_CODES=1 above is the ready codes' A/B alone.
# REPLACE=1 (ran in the thirty-sixth session: same bits and decode speed; one 8K prefill timing 157.6 vs 134.2 ms;
# again in the forty-eighth on an H100: 8 tests passed, b1 1.974 -> 1.918 ms, 8K prefill 135.56 / 135.59: installed):
# the ready scale bytes in the UE4M3 bytes' place (FLINT_MMA_READY_SCALES=replace): every NVFP4 path reads them (the FMA, tensor-core and prefill kernels through
# `nvfp4_decode_triton.scale_value`), so the weights keep one byte a block and the 2.47 GB the ready bytes add now comes back
# to the KV cache. Its GPU tests (every path's bits at 1-2,048 tokens), the whole step with it against the table as
# it is (separate processes: each makes its bytes at build), and the fast path against the plain one under it. ~4
# minutes. Since auto makes them in that place, the A/B runs `1` (beside the UE4M3 bytes, as auto did when it ran)
# against replace.
if [ "${REPLACE:-0}" = 1 ]; then
    gpu_tests "replaced scales GPU tests" replace_tests 300 -n 4 tests/test_ready_bytes_everywhere.py -k scales
    modes_ab FLINT_MMA_READY_SCALES scales 200 1 replace
fi
# BF16_SHARED=1 ran in the thirty-sixth session: BF16's shared expert inside the expert-major tensor-core launches
# (MoEConfig.shared_blocks) lost, b32 12.87 -> 14.19 ms, and was removed (docs/performance.md).
# SHARED_FIRST=1 (ran in the thirty-sixth session: installed, b32 8.845 -> 8.751 ms; built in the thirty-fifth): the shared expert's programs first in the MMA
# MoE launches' grids (MoEConfig.mma_shared_first) instead of last. With them the b32 gate_up went 70.2 -> 74.7 us a
# layer and the down 40.6 -> 44.7 for ~3.5 MB more; the down's shared programs run K_S = 1,024, twice an expert's
# K, and started last. Its GPU test (the same bits as without, at 9-64 tokens), then the whole step with it on the
# four entries from 9 tokens. ~4 minutes. A win: set it in the table, RECORD=1 (the
# `_first` twins are new kernels for the manifest).
if [ "${SHARED_FIRST:-0}" = 1 ]; then
    moe_field_ab shared_first mma_shared_first "the shared expert's programs first in the MMA MoE launches"
fi
# ATTN_WARPS=1 (ran in the thirty-sixth session: lost, b32 8.847 -> 9.361 ms; thirty-fifth session, no kernel change): decode attention at 32-64 sequences in 8 warps. At b32 1K
# the step's 49 attention launches take 19 us each (0.93 ms; NVFP4 profile), the kernels alone 22.9 us (full layer,
# 33.5 MB of KV: ~1.5 TB/s) and 13.1 us (sliding, 17 MB: ~1.3 TB/s), with one 4-warp program of 8 query heads per
# sequence, KV head and split, about one an SM. The decode sweep (it now adds 8-warp tiles at 32-64 sequences), then
# the whole step with 8 warps on the two 12+-sequence entries (NVFP4, and BF16 at b32). ~5 minutes.
if [ "${ATTN_WARPS:-0}" = 1 ]; then
    timeout 240 python3 benchmarks/kernels_attention.py --sweep --sweep-parts decode \
        --out "$OUT/kernels_attention_sweep_decode.json" > "$OUT/kernels_attention_sweep_decode.txt" 2>&1
    python3 - "$OUT/kernels_attention_sweep_decode.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r.get("seqs", 0) >= 32 and r.get("context") == 1024]
for shape in sorted({r["shape"] for r in rows}):
    best = sorted((round(r["ms"] * 1e3, 2), r["config"]["num_warps"], r["config"]["block_n"],
                   r["config"]["num_stages"] or 0, r["splits"], f"{r['rel_err']:.0e}")
                  for r in rows if r["shape"] == shape)[:4]
    print(shape, "us, warps, block_n, stages, splits, rel. error:", best)
PY
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op attention.decode \
        --when '{"sliding": true, "elem_bytes": 2, "seqs_min": 12}' --set num_warps=8 --out $V/attn8.s > /dev/null
    python3 benchmarks/tuning_variant.py --table $V/attn8.s --op attention.decode \
        --when '{"sliding": false, "elem_bytes": 2, "seqs_min": 12}' --set num_warps=8 --out $V/attn8.json > /dev/null
    step_ab nvfp4 attn8 $V/attn8.json "decode attention in 8 warps from 12 sequences"
fi
# WIDE_SPLIT=1 (after SHARED_MOE): the wide NVFP4 linear's K splits at 17-32 rows with the ready bytes. Its own
# choice (~4 programs an SM) splits qkv and o 8 ways at 32 rows, and each split then stores and sums 32 FP32 values a
# thread: ~5 MB of workspace for qkv's 5.2 MB of weights (qkv 12.3, o 13.4 us against 6.9 / 6.4 at 8 rows). The
# kernels alone with 1, 2, 4 and 8 splits, then the whole step with mma_split_k 4 and 2 on the 17-32-row NVFP4 entry
# (new compile variants: RECORD=1 if one is installed). ~4 minutes.
if [ "${WIDE_SPLIT:-0}" = 1 ]; then
    timeout 200 python3 benchmarks/nvfp4_mma.py --ms 16 24 32 --shapes qkv o_proj shared_gate_up shared_down \
        --warps 4 --vec 1 --wide --ready --splits 1 2 4 8 --moe-tokens --out "$OUT/nvfp4_mma_wide_split.json" \
        > "$OUT/nvfp4_mma_wide_split.txt" 2>&1
    sed -n '/^NVFP4 linear on/,$p' "$OUT/nvfp4_mma_wide_split.txt" | grep -v "^wrote"
    V=/tmp/variants; mkdir -p $V
    for sk in 4 2; do
        python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m_min": 17, "m_max": 32, "nvfp4": true}' \
            --set mma_split_k=$sk --out $V/split$sk.json > /dev/null
    done
    timeout 300 python3 benchmarks/decode.py --formats nvfp4 --batches 24 32 --contexts 1024 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --ab-tuning-file $V/split4.json $V/split2.json \
        --out "$OUT/decode_wide_split_ab.json" > "$OUT/decode_wide_split_ab.txt" 2>&1
    echo "== whole step: table vs the 17-32-row NVFP4 linear in 4 and in 2 K splits"
    ab_rounds "$OUT/decode_wide_split_ab.txt"
    cp $V/split4.json $V/split2.json "$OUT/"
fi
# TOKEN_SLOTS=1 (ran in the forty-second session on an H100: its 8 GPU tests passed; NVFP4 b1 2.297 -> 2.165 ms in
# 2 columns a program, 2.249 in 1, installed at 1 token; at 2 tokens +11%, not; BF16 skipped by decode.py's 6 GiB reserve;
# decode_h100_nvfp4_token_slots_ab_s42.json; BF16_SLOTS below is its BF16 half): the decode MoE's down at 1-2
# tokens in a program
# a (output tile, token) that loads all of the token's experts' rows (and the shared expert's) before the PDL wait
# and adds the slots in registers (`kernels/moe_down_slots_triton.py`, MoEConfig.dn_token_slots), instead of a
# program a (tile, pair) whose last arrival on a counter adds them: at batch 1 the down took 9.1 us (NVFP4) and 11.4
# (BF16) a layer for ~1 us of weights. Its GPU tests (Flint's shapes at the tiles tried, against the reference and
# the per-pair launch), then the whole step at b1 (NVFP4, BF16) with it on the 1-2-token entries in 2 and in 1 columns a
# program (4 warps: sm_90 compiles give 96 / 64 registers for NVFP4, 111 / 77 for BF16, no spills; the per-pair
# kernel 52 and 103; each thread then decodes 4 / 2 NVFP4 groups, the per-pair kernel 2). ~7 minutes. A win: set it
# in the table, RECORD=1 (a new kernel for the manifest).
if [ "${TOKEN_SLOTS:-0}" = 1 ]; then
    gpu_tests "token-slots down GPU tests" token_slots_tests 150 -n 8 tests/test_kernels_moe.py -k token_slots
    V=/tmp/variants; mkdir -p $V
    for variant in "a 2 2" "b 1 1"; do  # name, NVFP4 columns a program, BF16 columns
        read -r name nv bf <<< "$variant"
        python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_max": 1}' \
            --set dn_token_slots=true "dn_block_n=$nv" --out "$V/ts_$name.1" > /dev/null
        python3 benchmarks/tuning_variant.py --table "$V/ts_$name.1" --op moe.decode \
            --when '{"nvfp4": true, "tokens_min": 2, "tokens_max": 2}' --set dn_token_slots=true "dn_block_n=$nv" \
            --out "$V/ts_$name.2" > /dev/null
        python3 benchmarks/tuning_variant.py --table "$V/ts_$name.2" --op moe.decode \
            --when '{"nvfp4": false, "tokens_max": 2}' --set dn_token_slots=true "dn_block_n=$bf" \
            --out "$V/ts_$name.json" > /dev/null
    done
    decode_ab token_slots 330 "the down's slots in one program, 2 columns a program / 1" \
        "--formats nvfp4 bf16 --batches 1" "$V/ts_a.json" "$V/ts_b.json"
fi
# BF16_SLOTS=1 (ran in the forty-third session on an H100, installed: BF16 b1 3.066 -> 2.994 ms with 2 columns, 2.995
# with 1; decode_h100_bf16_token_slots_ab_s43.json) (forty-second session): TOKEN_SLOTS's BF16 half, which an 80 GB H100
# skipped with decode.py's 6 GiB reserve (~5 GiB are left beside BF16's weights there); here with 2 GiB, so it runs at
# batch 1 on an H100 too. The whole step at BF16 b1 with a 1-token entry (a copy of the 1-2-token one) whose down adds a
# token's slots in one program of 2 / 1 columns (BF16 sm_90 compiles: 111 / 77 registers, no spills). A win: that entry
# in the table and RECORD_BOTH=1.
if [ "${BF16_SLOTS:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    for cols in 2 1; do
        python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": false, "tokens_max": 2}' \
            --add '{"nvfp4": false, "tokens_max": 1}' --set dn_token_slots=true "dn_block_n=$cols" \
            --out "$V/bs_$cols.json" > /dev/null
    done
    decode_ab bf16_slots 300 "BF16's down with a token's slots in one program, 2 columns a program / 1" \
        "--formats bf16 --batches 1 --reserve-gib 2" "$V/bs_2.json" "$V/bs_1.json"
fi
# SLOTS4=1 (ran in the forty-third session on an H100: b1 2.148 -> 2.141 ms, noise; b2 2.929 -> 3.072, lost; nothing
# changed; decode_h100_nvfp4_slots4_ab_s43.json) (forty-second session): the token-slots down in 4 columns a program
# (NVFP4, 4 warps: a thread's tiles at MAX_THREAD_BYTES exactly; sm_90, Triton 3.9: 193 registers, no spills, against 96
# at 2), at 1 token against the installed 2, and at 2 tokens, where 2 columns (2,048 programs) lost 11% to the per-pair
# 32-column tiles (896 programs); 4 columns there run 1,024. A win: the entry's dn_block_n (and dn_token_slots at 2
# tokens), then RECORD=1. ~3 minutes.
if [ "${SLOTS4:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_max": 1}' \
        --set dn_block_n=4 --out $V/s4_1.json > /dev/null
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_min": 2, "tokens_max": 2}' \
        --set dn_token_slots=true dn_block_n=4 --out $V/s4_2.json > /dev/null
    decode_ab slots4 240 "the token-slots down in 4 columns a program at 1 token / at 2 tokens" \
        "--formats nvfp4 --batches 1 2" "$V/s4_1.json" "$V/s4_2.json"
fi
# O_SPLIT=1 (ran in the forty-second session on an H100, installed: b9 -2.2%, b16 -3.1%, b24 -1.6%, b32 -0.9%;
# decode_h100_nvfp4_o_split_ab_s42.json) (after WIDE_SPLIT, fortieth session): WIDE_SPLIT's kernels alone on an H100 had the o projection
# (K 4096) at 16-32 rows in 8 K splits at 9.2-10.1 us against the table's 12.5-13.6, and qkv at 16 rows in 4 at 11.0
# against 13.2 (nvfp4_mma_h100_wide_split_s40.json), while 2 and 4 splits on every 17-32-row shape lost in the whole
# step (+3%, +12-19%). So: the whole step with o alone in 8 splits at 9-32 rows, and with qkv at 9-16 in 4 as well
# (new entries before the table's, `tuning_variant.py --add`; new compile variants: RECORD=1 if one is installed).
# ~3 minutes.
if [ "${O_SPLIT:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m_min": 2, "m_max": 16, "nvfp4": true}' \
        --add '{"m_min": 9, "m_max": 16, "nvfp4": true, "k": 4096}' --set mma_split_k=8 --out $V/o8a.json > /dev/null
    python3 benchmarks/tuning_variant.py --table $V/o8a.json --op gemv.small_m \
        --when '{"m_min": 17, "m_max": 32, "nvfp4": true}' --add '{"m_min": 17, "m_max": 32, "nvfp4": true, "k": 4096}' \
        --set mma_split_k=8 --out $V/o8.json > /dev/null
    python3 benchmarks/tuning_variant.py --table $V/o8.json --op gemv.small_m \
        --when '{"m_min": 2, "m_max": 16, "nvfp4": true}' --add '{"m_min": 9, "m_max": 16, "nvfp4": true, "n": 5120}' \
        --set mma_split_k=4 --out $V/o8_qkv4.json > /dev/null
    decode_ab o_split 300 "o in 8 K splits at 9-32 rows / and qkv in 4 at 9-16" \
        "--formats nvfp4 --batches 9 16 24 32" "$V/o8.json" "$V/o8_qkv4.json"
fi
# TWIN8K=1 (ran in the thirty-fifth session: 128-row twins from 96 pairs an expert installed, 8K NVFP4 prefill
# 136.1 -> 133.2 ms; benchmarks/results/prefill_ab_twin8k_h200_s35.json): the NVFP4 prefill MoE's twins (NVFP4 decoded in the TMA-fed launches) at 4,096 and 8,192 tokens with
# every tile of benchmarks/moe_grouped_tma.py's NV lists, three added this session (deeper K steps, 8 warps on 128
# rows): the table runs one tile at every size (64 rows, 64 columns), and at 8,192 the twins take 1.460 ms a layer
# where BF16's launches take ~1.0, most of the 8K prefill's NVFP4 - BF16 gap (136.0 against 112.8 ms). Prints each
# launch's best and the whole routed MoE with them. ~3 minutes. A win: a moe.grouped_tma entry from ~144 pairs an
# expert, a whole-prefill A/B (`prefill_ab.py --variant-tuning-file`, as TWINS did), then RECORD=1.
if [ "${TWIN8K:-0}" = 1 ]; then
    timeout 400 python3 benchmarks/moe_grouped_tma.py --twins-only --ts 4096 8192 --formats nvfp4 \
        --out "$OUT/moe_twins_8k.json" > "$OUT/moe_twins_8k.txt" 2>&1
    grep -E "installed|nvfp4 in launches m|Error" "$OUT/moe_twins_8k.txt" | cut -c1-220 | tail -12
    python3 - "$OUT/moe_twins_8k.json" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1])).get("rows", []):
    nv = row.get("nvfp4_in_launches", {})
    for part in ("gate_up_us", "down_us"):
        ok = sorted((v, k) for k, v in nv.get(part, {}).items() if isinstance(v, float))[:3]
        print(row["T"], part, ok)
PY
fi
# NINE16=1 (ran in the thirty-fourth session, from a probe script: g9w installed, b12 -0.6%, b16 -1.9%; g9r b12
# +0.9%, b16 -2.5%; l9w b12 +1.2%, b16 -0.3%; benchmarks/results/decode_h200_nvfp4_9_16_ab_s34.json): with the ready
# bytes the MMA gate_up at 9-16 tokens against the FMA one, single-tile (g9r) and wide (g9w), and the wide linear at
# 9-16 rows (l9w). The table now has g9w, so g9r and l9w are measured against it. ~3 minutes.
if [ "${NINE16:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_min": 9}' \
        --set mma_wide=false --out $V/g9r.json > /dev/null
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m_min": 2, "m_max": 16, "nvfp4": true}' \
        --set mma_wide=true --out $V/l9w.json > /dev/null
    timeout 240 python3 benchmarks/decode.py --formats nvfp4 --batches 12 16 --contexts 1024 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --ab-tuning-file $V/g9r.json $V/l9w.json --out "$OUT/decode_9_16_ab.json" \
        > "$OUT/decode_9_16_ab.txt" 2>&1
    echo "== whole step: table vs g9r (the single-tile MMA gate_up at 9-16), l9w (the wide linear at 9-16 rows)"
    ab_rounds "$OUT/decode_9_16_ab.txt"
    cp $V/g9r.json $V/l9w.json "$OUT/"
fi
# MOE_WIDE3 (thirty-third session, removed after its run; benchmarks/results/decode_h200_nvfp4_moe_wide4_ab_s33.json,
# nvfp4_mma_moe_wide4_h200_s33.json): four weight tiles a warp (32 gate_up columns, 64 down rows, no loads a step
# ahead: 154 registers uncapped) lost, both from 17 tokens b32 +15%, b64 +8.5%, the down alone even to +2.3%; the
# wide MMA kernels at 5-8 tokens with the shared expert folded only up to 4 lost too (the down b5 +7.9%, b8 even;
# with the gate_up b5 +23%).
# MOE_WIDE2=1 (ran in the thirty-third session: w4 installed, b32 -2.5%; g9 lost, b12 +2.3%): after MOE_WIDE installed both wide MoE kernels (b32 10.593 -> 10.116 ms): the kernels alone
# had the wide ones faster in 4 warps than in 8 at 32 tokens (gate_up 91.4 vs 98.8 us, down 43.0 vs 46.7), so w4: the
# 25-32-token entry in 4 warps; g9: the wide MMA gate_up from 9 tokens (the 9-16 entry runs the FMA one; the plain
# MMA gate_up lost there at 12 tokens in the twenty-third session). ~3 minutes.
if [ "${MOE_WIDE2:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_min": 25}' \
        --set num_warps=4 --out $V/w4.json > /dev/null
    python3 benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": true, "tokens_min": 9}' \
        --set mma=true mma_prefetch=true mma_l2_ahead=2 expert_major=true mma_wide=true --out $V/g9.json > /dev/null
    timeout 300 python3 benchmarks/decode.py --formats nvfp4 --batches 12 16 32 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/w4.json $V/g9.json \
        --out "$OUT/decode_moe_wide2_ab.json" > "$OUT/decode_moe_wide2_ab.txt" 2>&1
    echo "== whole step: table vs w4 (25-32 tokens in 4 warps), g9 (the wide MMA gate_up from 9 tokens)"
    ab_rounds "$OUT/decode_moe_wide2_ab.txt"
    cp $V/w4.json $V/g9.json "$OUT/"
fi
# MOE_WIDE=1 (ran in the thirty-third session: both installed, b16 -1.3%, b24 -3.8%, b32 -4.5%, b64 -6.8%): the MMA MoE with two weight tiles a warp sharing the activations' loads (MoEConfig.mma_wide for
# the gate_up, 16 columns a warp; mma_down_wide for the down, 32 rows a warp; thirty-third session, built on CPU after
# the linear's wide tiles won): their GPU tests, the kernels alone at 8-64 tokens in 4 and 8 warps, then the whole
# step at 16-64 tokens with either or both on the table's MMA entries (gu: gate_up from 17 tokens, dn: down from 9,
# both). ~6 minutes on a fresh machine.
if [ "${MOE_WIDE:-0}" = 1 ]; then
    gpu_tests "MMA MoE GPU tests" moe_wide_tests 240 -n 4 tests/test_nvfp4_mma_moe.py
    timeout 240 python3 benchmarks/nvfp4_mma.py --ms 1 --shapes qkv --warps 4 8 --vec 1 --prefetch 0 1 \
        --moe-tokens 8 16 32 64 --moe-l2-ahead 2 --moe-down-l2 2 --moe-wide --out "$OUT/nvfp4_mma_moe_wide.json" \
        > "$OUT/nvfp4_mma_moe_wide.txt" 2>&1
    sed -n '/^MoE gate_up/,$p' "$OUT/nvfp4_mma_moe_wide.txt" | grep -v "^wrote"
    V=/tmp/variants; mkdir -p $V
    moe_entries_variant mma_wide=true $V/gu.json 17 25 33
    moe_entries_variant mma_down_wide=true $V/dn.json 9 17 25 33
    python3 - "$V" <<'PY'
import json, sys
v = sys.argv[1]
gu, dn = json.load(open(f"{v}/gu.json")), json.load(open(f"{v}/dn.json"))
for a, b in zip(gu["moe.decode"], dn["moe.decode"]):  # both: the gate_up's entries from gu, the down's from dn
    if b["config"].get("mma_down_wide"):
        a["config"]["mma_down_wide"] = True
json.dump(gu, open(f"{v}/both.json", "w"), indent=2)
PY
    timeout 330 python3 benchmarks/decode.py --formats nvfp4 --batches 16 24 32 64 --contexts 1024 --prefill 0 \
        --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/gu.json $V/dn.json $V/both.json \
        --out "$OUT/decode_moe_wide_ab.json" > "$OUT/decode_moe_wide_ab.txt" 2>&1
    echo "== whole step: table vs wide gate_up (gu), wide down (dn), both"
    ab_rounds "$OUT/decode_moe_wide_ab.txt"
    cp $V/gu.json $V/dn.json $V/both.json "$OUT/"
fi
# WIDE=1 (ran in the thirty-third session: installed, b24 -0.8%, b32 -1.6%): the NVFP4 linear with 32 weight rows a warp at 17-32 rows (`TileConfig.mma_wide`; thirty-second
# session: lm_head at 32 rows 218 -> 138 us, whole step b32 10.83 -> 10.68 ms with it at 9-32 rows, b16 7.79 -> 7.83):
# the table with it on the 17-32-row NVFP4 entry recorded into the manifest's NVFP4 profile (copy
# $OUT/nvidia-h200.json to kernels/precompile/ and the variant table to kernels/tuning/ if it holds), then b24 / b32 /
# b64 against the installed table in alternating rounds. ~6 minutes.
if [ "${WIDE:-0}" = 1 ]; then
    V=/tmp/variants; mkdir -p $V
    python3 benchmarks/tuning_variant.py --op gemv.small_m --when '{"m_min": 17, "m_max": 32, "nvfp4": true}' \
        --set mma_wide=true --out $V/wide.json > /dev/null
    cp kernels/tuning/nvidia-h200.json $V/installed.json
    timeout 300 python3 benchmarks/decode.py --formats nvfp4 --batches 24 32 64 --contexts 1024 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --ab-tuning-file $V/wide.json --out "$OUT/decode_wide_ab.json" \
        > "$OUT/decode_wide_ab.txt" 2>&1
    echo "== whole step: table vs wide at 17-32 rows"
    ab_rounds "$OUT/decode_wide_ab.txt"
    cp $V/wide.json kernels/tuning/nvidia-h200.json && OUT="$OUT" bash benchmarks/gpu_record_manifest.sh
    cp $V/wide.json "$OUT/nvidia-h200-tuning-wide.json"
    cp $V/installed.json kernels/tuning/nvidia-h200.json
fi
# GRAPH_PROFILE=1 (ran in the twenty-ninth session: by family moe 1.359, gemv/gemm 0.901, norm 0.587, other 0.503 with
# the side stream's prefetches 0.481, router 0.435, attention 0.434 ms; under PDL each kernel's span includes its wait
# for the one before, so the spans overlap and do not say which kernel the L2 requests shortened): NVFP4 batch 1 profiled as its graph replays (`decode.py --profile-graph`: the side stream's
# prefetch launches beside the step's kernels, each kernel as long as it runs there), to see which kernels the L2
# requests shortened and by how much. ~1 minute.
if [ "${GRAPH_PROFILE:-0}" = 1 ]; then
    timeout 150 python3 benchmarks/decode.py --formats nvfp4 --batches 1 --contexts 1024 --prefill 0 --reps 30 \
        --check-steps 0 --no-plain-timing --profile-graph --out "$OUT/decode_graph_profile.json" \
        > "$OUT/decode_graph_profile.txt" 2>&1
    sed -n '/GPU ms by kernel family/,$p' "$OUT/decode_graph_profile.txt" | head -16
fi
# AHEAD_DATA (twenty-eighth session, removed after its run): side-stream kernels that asked for a layer's routed
# experts' down projections from the router's ids, and the next layer's newest K/V blocks, on top of the installed
# entry. NVFP4 batch 1 2.137 -> 2.150 / 2.143 / 2.134 ms (experts / K/V / both), BF16 2.786 -> 2.875 / 2.849 / 2.910
# (benchmarks/results/decode_h200_weights_ahead_data_ab_s28.json): both kernels already ask for them before their
# PDL wait.
# ROUTER8K=1 (run in the twenty-eighth session: the installed tiles stay): the router's tiles at 4,096+ tokens beyond the four shapes swept in 2026-11 (the installed 128 x
# 128 x 64 in 3 stages holds 192 KB of shared memory, one program an SM, 84 us a layer in the 8K prefill against ~27
# us of MMAs): fewer stages or K steps, all 256 experts a program, K split over programs. ~2 minutes. A winner goes
# into the table's `router.tiles` entry from 4,096 tokens and is judged on the whole prefill with
# `prefill_ab.py --variant-tuning-file`.
if [ "${ROUTER8K:-0}" = 1 ]; then
    timeout 300 python3 benchmarks/kernels_router.py --tokens 4096 8192 --out "$OUT/kernels_router_8k.json" \
        > "$OUT/kernels_router_8k.txt" 2>&1
    tail -30 "$OUT/kernels_router_8k.txt"
fi
# SMALL_AB=1: the MMA MoE with its L2 requests below the batches it is installed at (twenty-third session). g16: the
# 9-24 token entry's gate_up on the expert-major MMA kernel, two K steps ahead (4 warps; g16w8 in 8); d8: the shared
# expert folded only up to 4 tokens and the MMA down (all codes asked before the PDL wait) at 5-8; gd8: the MMA
# gate_up there too. ~4 minutes. Twenty-third session: g16 won at b16 (8.187 -> 8.027 ms) and b24 (9.885 -> 9.427 in a
# second call) and lost at b12 (6.889 -> 7.055), so the table has it from 17 tokens; g16w8, d8 and gd8 lost.
if [ "${SMALL_AB:-0}" = 1 ]; then
V=/tmp/variants; mkdir -p $V
variant() { python3 benchmarks/tuning_variant.py "$@" > /dev/null || echo "variant failed: $*"; }
mma_gu="mma=true mma_prefetch=true mma_l2_ahead=2 expert_major=true"
# shellcheck disable=SC2086
variant --op moe.decode --when '{"nvfp4": true, "tokens_min": 9}' --set $mma_gu --out $V/g16.json
# shellcheck disable=SC2086
variant --op moe.decode --when '{"nvfp4": true, "tokens_min": 9}' --set $mma_gu num_warps=8 --out $V/g16w8.json
variant --op moe.paths --when '{"nvfp4": true}' --set shared_fold_max_tokens=4 --out $V/f4.json
small='{"nvfp4": true, "tokens_min": 5, "tokens_max": 8}'
variant --table $V/f4.json --op moe.decode --when '{"nvfp4": true}' --add "$small" \
    --set mma_down=true mma_vec=true mma_down_l2=2 --out $V/d8.json
# shellcheck disable=SC2086
variant --table $V/f4.json --op moe.decode --when '{"nvfp4": true}' --add "$small" \
    --set mma_down=true mma_vec=true mma_down_l2=2 $mma_gu --out $V/gd8.json
timeout 300 python3 benchmarks/decode.py --formats nvfp4 --batches 8 16 --contexts 1024 --prefill 0 \
    --reps 30 --check-steps 0 --no-plain-timing --ab-tuning-file $V/g16.json $V/g16w8.json $V/d8.json $V/gd8.json \
    --out "$OUT/decode_nvfp4_small_ab.json" > "$OUT/decode_small_ab.txt" 2>&1
echo "== whole step: table vs g16 / g16w8 / d8 / gd8"
ab_rounds "$OUT/decode_small_ab.txt"
fi
if [ "${SKIP_CHECK:-0}" != 1 ]; then
# On a fresh machine Triton compiles everything here (no cache): the tests take ~200 s and the table ~300 s, so
# CHECK_TESTS=0 / CHECK_TABLE=0 split them over two calls when the recording runs too.
if [ "${CHECK_TESTS:-1}" = 1 ]; then
gpu_tests "gpu tests (GEMV, MoE, sampling)" gpu_tests 330 -n 12 tests/test_kernels_gemv.py tests/test_kernels_moe.py \
    tests/test_kernels_sampling.py
fi
# The table as installed: the whole step at 1-64 and the fused path against the plain one at batch 1 and 2.
if [ "${CHECK_TABLE:-1}" = 1 ]; then
timeout 420 python3 benchmarks/decode.py --formats nvfp4 --batches 1 2 4 8 32 64 --contexts 1024 --prefill 0 \
    --reps 30 --check-batches 1 2 --check-steps 32 --profile-batches 1 2 32 64 \
    --out "$OUT/decode_nvfp4_table.json" > "$OUT/decode_table.txt" 2>&1
sed -n '/^ *fmt *batch/,$p' "$OUT/decode_table.txt" | grep -v " x .* us = " | head -40
grep "Error" "$OUT/decode_table.txt" | head -5
fi
fi
# RADIX=1: the sampler's GPU tests (sorted rows, radix selects, the filter on radix fallbacks), then the op's time
# with the radix selects off and on at Flint's default top_k 20 (the filtered kernels, whose fallbacks differ).
if [ "${RADIX:-0}" = 1 ]; then
    gpu_tests "sampler GPU tests" radix_tests 200 tests/test_kernels_sampling.py
    timeout 200 python3 benchmarks/sampler.py --device cuda --chunks 4096 --top-k 20 --radix --batch 1 8 64 \
        > "$OUT/sampler_radix.txt" 2>&1
    tail -6 "$OUT/sampler_radix.txt"
fi
# PREFILL_AB=1: NVFP4 prefill with each segment's global scale as cuBLAS's alpha (`dequant_matmul`, twenty-first
# session, built on CPU) against the FP32 output and scale pass it replaced: the GEMV GPU tests of that path, the
# projections alone at 8192 rows (kernels_moe_gemv.py: `ms` against `scale_pass_ms`), then the whole 8K prefill
# both ways in alternating rounds (prefill_ab.py). ~3 minutes; measured 158.4 -> 149.6 ms on 2026-12-02.
if [ "${PREFILL_AB:-0}" = 1 ]; then
    gpu_tests "dequant_matmul GPU tests" prefill_tests 120 tests/test_kernels_gemv.py -k "dequant or large_m"
    timeout 150 python3 benchmarks/kernels_moe_gemv.py --only gemv --ms 8192 --out "$OUT/prefill_gemv.json" \
        > "$OUT/prefill_gemv.txt" 2>&1
    grep -E "fmt=nvfp4|Error" "$OUT/prefill_gemv.txt" | head -8
    timeout 300 python3 benchmarks/prefill_ab.py --variant scale_pass --rounds 3 --out "$OUT/prefill_ab.json" \
        > "$OUT/prefill_ab.txt" 2>&1
    grep -E "^round|median|Error" "$OUT/prefill_ab.txt"
fi
# FORCED=1 (built in the fifty-seventh session, ran in the fifty-eighth on H100s: 0 differences beyond a near-tie at
# BF16 b1 / b8 and NVFP4 b1; BF16 b8 needed the check's prefill logits one sequence at a time on an 80 GB card, and
# NVFP4 b8 did not finish in one call): the fused path against the plain one over 256 greedy
# steps at 1 and 8 sequences, free-running and teacher-forced (the fused path fed the plain path's tokens, its own
# choice compared at every step; differences where the plain path's top two lie within decode.py's TIE are
# near-ties), BF16 (~2 minutes: the plain path's 256 steps at ~150 ms) and, with FORCED_FORMATS="bf16 nvfp4", NVFP4
# too (its plain path dequantises each use: ~900 ms a step, ~8 minutes more).
if [ "${FORCED:-0}" = 1 ]; then
    # shellcheck disable=SC2086  # the formats are a list of words
    timeout 560 python3 benchmarks/decode.py --formats ${FORCED_FORMATS:-bf16} --batches 1 --contexts 1024 --prefill 0 \
        --reps 5 --check-steps 256 --check-batches 1 8 --no-plain-timing --profile-batches \
        --out "$OUT/decode_forced.json" > "$OUT/decode_forced.txt" 2>&1
    grep -E "^check|Error" "$OUT/decode_forced.txt"
fi
# FORCED8=1 (sixty-first session, not yet run): NVFP4's check at 8 sequences after its plain path stopped un-permuting
# ready codes bit by bit and the check began prefilling its prompts together: first `prefill_probe.py` (a 6-layer
# model: each path's prefill per prompt length, the plain path's op profile; ~2 minutes), then the check with
# FORCED8_STEPS (32) steps; each phase prints as it ends, so a cut call still says how far it got.
# Sixty-second session: FORCED8_PROBE=0 leaves the probe out, and FORCED8_STEPS may list several step counts (e.g.
# "32 256"), each a run of its own within FORCED8_BUDGET seconds in all (a later one only where 120 s are left).
if [ "${FORCED8:-0}" = 1 ]; then
    if [ "${FORCED8_PROBE:-1}" = 1 ]; then
        timeout 150 python3 benchmarks/prefill_probe.py --layers 6 --lengths 37 48 114 --out "$OUT/prefill_probe.json" \
            > "$OUT/prefill_probe.txt" 2>&1
        grep -E "tokens:|Error" "$OUT/prefill_probe.txt"
    fi
    forced8_end=$(($(date +%s) + ${FORCED8_BUDGET:-400}))
    for steps in ${FORCED8_STEPS:-32}; do
        left=$((forced8_end - $(date +%s)))
        [ "$left" -ge 120 ] || break
        timeout "$left" python3 benchmarks/decode.py --formats nvfp4 --batches 1 --contexts 1024 --prefill 0 --reps 5 \
            --check-steps "$steps" --check-batches 8 --no-plain-timing --profile-batches \
            --out "$OUT/decode_forced8_$steps.json" > "$OUT/decode_forced8_$steps.txt" 2>&1
        echo "== $steps steps"
        grep -E "^check|forced|Error" "$OUT/decode_forced8_$steps.txt"
    done
fi
# OLD_TREE=DIR (fifty-third session; ran in the fifty-seventh on an H100: the head and ad14112's tree even at b1,
# the head 0.3-1.1% faster at b2-b8, both 5-12% below earlier H100s there, so the gap below was the machines'): another tree's whole step against this one's, alternating on this
# machine, ROUNDS (2) of each: DIR holds that commit's kernels, flint_engine, benchmarks and deployments (here:
# `mkdir -p variants/old && git archive ad14112 kernels flint_engine benchmarks deployments | tar -x -C variants/old`,
# carry ["variants"]), to tell a change from the spread between machines (NVFP4 b2-b8 3-7% above the fiftieth
# session's figures on another H100). OLD_ARGS replaces decode.py's arguments.
if [ -n "${OLD_TREE:-}" ]; then
    mkdir -p /tmp/pp_old
    ln -sfn "$PWD/$OLD_TREE/kernels" /tmp/pp_old/flint_kernels
    ln -sfn "$PWD/$OLD_TREE/deployments" /tmp/pp_old/flint_serve
    old_args=${OLD_ARGS:-"--formats nvfp4 --batches 1 2 4 8 --contexts 1024 --prefill 0 --reps 30 --check-steps 0 --no-plain-timing --profile-batches"}
    for r in $(seq "${ROUNDS:-2}"); do
        # shellcheck disable=SC2086  # the arguments are a list of words
        (cd "$OLD_TREE" && PYTHONPATH="/tmp/pp_old:$PWD:/tmp/site" timeout 120 python3 benchmarks/decode.py $old_args \
            --out "$OUT/old_tree_$r.json" > "$OUT/old_tree_$r.txt" 2>&1)
        # shellcheck disable=SC2086
        timeout 120 python3 benchmarks/decode.py $old_args --out "$OUT/this_tree_$r.json" > "$OUT/this_tree_$r.txt" 2>&1
    done
    for f in "$OUT"/old_tree_*.txt "$OUT"/this_tree_*.txt; do
        echo "== $(basename "$f" .txt): $(grep -E "^ +(nvfp4|bf16) +[0-9]+ +[0-9]+ " "$f" | awk '{printf "b%s %s  ", $2, $4}')"
    done
fi
# FLEX=1 (fifty-ninth session; ran at 8K on an H100 in 28 s: Flex's kernel 0.279-0.284 ms against our 0.320, but
# 0.328-0.333 with the sinks added from its log-sum-exp, so not installed): the sliding layers' prefill attention at
# 2K and 8K tokens on torch's FlexAttention (band block mask, sinks from its log-sum-exp) against our Triton kernel,
# three of Flex's launch parameter sets.
if [ "${FLEX:-0}" = 1 ]; then
    timeout 240 python3 benchmarks/sliding_attention_flex.py --ts 2048 8192 --out "$OUT/sliding_attention_flex.json" \
        > "$OUT/sliding_attention_flex.txt" 2>&1
    sed -n '/^Sliding prefill/,$p' "$OUT/sliding_attention_flex.txt"; grep -E "Error|Traceback" "$OUT/sliding_attention_flex.txt" | head -5
fi
# RECORD=1: then the NVFP4 profile of the kernel manifest again, for the table as installed (~220 s).
[ "${RECORD:-0}" = 1 ] && OUT="$OUT" bash benchmarks/gpu_record_manifest.sh
[ "${SKIP_HOST:-0}" = 1 ] && SKIP_TESTS=1
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    gpu_tests "tests" tests 200 tests/test_cuda_graphs.py tests/test_sampler.py tests/test_kernels_sampling.py
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
