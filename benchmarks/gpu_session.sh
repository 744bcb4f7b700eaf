#!/usr/bin/env bash
# The GPU acceptance runs of the fast path in one device call (one H200, 10-minute limit), results under $OUT: a
# quick part of the kernel tests (every GPU test is benchmarks/gpu_tests.sh, a call of its own), the whole-model
# benchmark and the accuracy checks.
#
#   here, once:  mkdir -p .whl && echo /.whl/ >> .git/info/exclude && python3 -m pip download --no-deps
#                --only-binary=:all: --python-version 3.12 -d .whl gguf==0.19.0      (the GPU image lacks gguf)
#   run:         bash benchmarks/gpu_session.sh     (device `run`, carry [".whl"]; $OUT is the folder that comes back)
#
# When the call also carries .rayA (half of Ray's wheel, see benchmarks/gpu_serve.sh), it is stashed for the next
# call. Order is by value: the kernel tests (correctness), the whole-model benchmark (batch 1 and 32 profiled by
# kernel; each graphed row also timed against a variant, $AB_OPS or $AB_TUNING_FILE), the accuracy check against
# FP32 and on the trained demo model. Each step has its own time limit so a slow one cannot starve the rest (540 s
# together). The kernel microbenchmarks (sampler, router, dequantisation) are benchmarks/gpu_kernels.sh, a second
# call.
# Measured 2026-11-30 (sixth session): tests ~112 s, decode.py (with the A/B) and accuracy ~285 s together; 398 s in all.
set -u
. benchmarks/gpu_env.sh
CHECK_STEPS=${CHECK_STEPS:-16}
[ -d .rayA ] && mkdir -p /tmp/stash && cp .rayA/* /tmp/stash/
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"

timeout "${TESTS_S:-130}" python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider -n 12 \
    tests/test_kernels_gemv.py tests/test_kernels_moe.py tests/test_kernels_attention.py \
    tests/test_kernels_norm_rope.py tests/test_kernels_router_act.py tests/test_cuda_graphs.py \
    tests/test_kernels_sampling.py tests/test_kernels_qkv_attention.py tests/test_kernels_moe_align.py \
    tests/test_late_compiles.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.txt")"

# The A/B variant: another fused-op list ($AB_OPS) or, when $AB_TUNING_FILE names one, another tuning table.
AB=(--ab-ops "${AB_OPS:-all,-add_rms_norm_router}")
[ -n "${AB_TUNING_FILE:-}" ] && AB=(--ab-tuning-file "$AB_TUNING_FILE")
# The quick fast-vs-plain check here; the judgement of accuracy is fast_path_accuracy.py's (against FP32).
timeout 230 python3 benchmarks/decode.py --formats nvfp4 bf16 --batches 1 8 32 --check-steps "$CHECK_STEPS" \
    --check-batches 1 --profile-batches 1 32 --gain 0.5 --deadline-s 190 --out "$OUT/decode.json" \
    "${AB[@]}" > "$OUT/decode.txt" 2>&1
sed -n '/^ *fmt *batch/,$p' "$OUT/decode.txt" | grep -v "at::native\|cublasLt" | head -60

timeout 200 python3 benchmarks/fast_path_accuracy.py --steps 32 --bf16-layers 8 --nvfp4-layers 8 \
    --demo-steps 128 --out "$OUT/accuracy.json" > "$OUT/accuracy.txt" 2>&1
grep -v '^{' "$OUT/accuracy.txt" | tail -12
