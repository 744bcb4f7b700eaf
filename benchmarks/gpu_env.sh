# Sourced by the device scripts (gpu_session.sh, gpu_kernels.sh, gpu_pending.sh, gpu_record_manifest.sh): the device's
# python3 has torch and Triton but not the project's other wheels, so the carried .whl folder goes to /tmp/site, the
# project runs from source (flint_kernels and flint_serve linked under /tmp/pp), and $OUT (the folder that comes back)
# gets the GPU's name.
OUT=${OUT:-/tmp/flint-gpu}
if [ -d .whl ] && [ ! -d /tmp/site/gguf ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
mkdir -p "$OUT" /tmp/pp
ln -sfn "$PWD/kernels" /tmp/pp/flint_kernels
ln -sfn "$PWD/deployments" /tmp/pp/flint_serve
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
