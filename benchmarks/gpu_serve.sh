#!/usr/bin/env bash
# The serving acceptance run on one GPU, in one device call (measured 2026-11-29: 157 s).
#
# Ray's wheel is larger than one call may carry, so it travels in two halves (../shared/tools/ray-on-device.sh):
#   call 1 (carry [".rayA"]):  mkdir -p /tmp/stash && cp .rayA/* /tmp/stash/ && ...   (benchmarks/gpu_session.sh)
#   call 2 (carry [".rayB"]):  bash benchmarks/gpu_serve.sh
# .rayB also holds the wheels the GPU image lacks (gguf, openai and their needs); after the script above:
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .rayB openai httpx2 httpcore2 truststore distro jiter sniffio regex \
#     python-multipart
#   cp .whl/gguf-*.whl .rayB/
# (On 2026-12-01 .rayB had openai without httpx2: serve_smoke.py failed to import, serve_load.py ran.) regex serves
# guided_regex and python-multipart the Batch API's uploads (/v1/files answers 501 without it).
#
# flint-serve with one replica of the full-size model (random NVFP4 weights built on the GPU; MODEL=random:full for
# BF16) through the router: serve_smoke.py (openai client; the replica must report a CUDA device), serve_load.py.
# REQUESTS (48) sets serve_load.py's requests a level: at 48 the concurrency-32 level lasts 2.4-3.2 s, and five runs
# of the same build on one machine gave 548-730 output tokens/s there (2026-12-02), so an A/B through the server
# needs more (and alternating runs, e.g. FLINT_SAMPLER_FILTER=0 / 1 in one call: the environment reaches the replica).
set -u
OUT=${OUT:-/tmp/flint-gpu}
MODEL=${MODEL:-random:full:nvfp4}
mkdir -p "$OUT" /tmp/pp
# Ray's first half must be stashed by the call before, on the same (still warm) machine.
[ -f /tmp/stash/ray.part.aa ] || { echo "no /tmp/stash/ray.part.aa: run call 1 first, then this at once"; exit 1; }
source .rayB/install.sh || exit 1
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels
ln -sfn "$PWD/deployments" /tmp/pp/flint_serve
export PYTHONPATH=/tmp/pp:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
python3 -c 'import ray, torch; print("ray", ray.__version__, "torch", torch.__version__, torch.cuda.get_device_name())'

setsid python3 -m flint_serve.cli --model "$MODEL" --replicas 1 --port 8000 > "$OUT/serve.log" 2>&1 &
server=$!
t0=$(date +%s)
until curl -sf http://127.0.0.1:8000/health > /dev/null; do
  if ! kill -0 $server 2> /dev/null || [ $(($(date +%s) - t0)) -gt 240 ]; then
    echo "flint-serve did not become healthy"; tail -40 "$OUT/serve.log"; kill -INT -- -$server 2> /dev/null; exit 1
  fi
  sleep 2
done
echo "healthy after $(($(date +%s) - t0)) s"
curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model": "flint", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}' | head -c 600
echo
timeout 60 python3 benchmarks/serve_smoke.py --expect-device cuda --out "$OUT/serve_smoke.json"
timeout 300 python3 benchmarks/serve_load.py --concurrency 1 8 32 --rates --requests "${REQUESTS:-48}" \
  --out "$OUT/serve_load_gpu.json" > "$OUT/serve_load.txt" 2>&1
tail -8 "$OUT/serve_load.txt"
# Any Triton kernel compiled after the warm-up stalled the requests of its step (flint_engine/late_compiles.py).
curl -s http://127.0.0.1:8000/metrics | grep -E '^(ray_)?flint[:_]late_kernel_compiles' | head -4
grep -h "after the warm-up" "$OUT/serve.log" /tmp/ray/session_latest/logs/*.log 2> /dev/null | cut -c1-300 | head -4
kill -INT -- -$server 2> /dev/null
wait $server
echo "flint-serve exited with $?"
grep -rhE "ready on|Traceback" /tmp/ray/session_latest/logs/ 2> /dev/null | head -8
python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1  # free the GPU for whatever runs next

