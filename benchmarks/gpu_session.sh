#!/usr/bin/env bash
# Every GPU acceptance run of the fast path in one device call (one H200, 10-minute limit), results under $OUT.
#
#   run: bash benchmarks/gpu_session.sh          (the device tool's `run`; $OUT is the folder that comes back)
#
# When the call carries .rayA (half of Ray's wheel, see benchmarks/gpu_serve.sh), it is stashed for the next call.
#
# Order is by value: the kernel tests first (correctness), then the whole-model decode benchmark with its
# fast-vs-plain greedy check, then the sampler. Each step has its own time limit so a slow one cannot starve the rest.
set -u
OUT=${OUT:-/tmp/flint-gpu}
CHECK_STEPS=${CHECK_STEPS:-256}
[ -d .rayA ] && mkdir -p /tmp/stash && cp .rayA/* /tmp/stash/
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels  # the device's python3 has torch/triton; the project runs from source
export PYTHONPATH=/tmp/pp:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"

timeout 150 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider \
    tests/test_kernels_gemv.py tests/test_kernels_moe.py tests/test_kernels_attention.py \
    tests/test_kernels_norm_rope.py tests/test_kernels_router_act.py tests/test_cuda_graphs.py \
    > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.txt")"

timeout 330 python3 benchmarks/decode.py --formats nvfp4 bf16 --check-steps $CHECK_STEPS --check-batches 1 8 \
    --gain 0.5 --deadline-s 280 --out "$OUT/decode.json" > "$OUT/decode.txt" 2>&1
tail -30 "$OUT/decode.txt"

timeout 60 python3 benchmarks/sampler.py --device cuda > "$OUT/sampler.txt" 2>&1
cp benchmarks/results/sampler_cuda.json "$OUT/" 2>/dev/null
tail -8 "$OUT/sampler.txt"
