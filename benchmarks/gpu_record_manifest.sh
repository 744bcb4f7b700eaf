#!/usr/bin/env bash
# Record one profile of the H200 kernel manifest again after its kernels or tuning table changed, in one device call
# (one H200, ~4 minutes): a cold start with no manifest records what its warm-up compiles, replacing the profile
# (`--replace`: recordings otherwise merge, so stale variants would stay), and a second cold start compiles from the
# new manifest and must compile nothing in its warm-up; its workers' compile times go into the manifest (`--save-times`),
# so later starts compile the longest first (the eighteenth session's recordings lacked them). The manifest comes back
# under $OUT (copy it over kernels/precompile/nvidia-h200.json).
#
#   bash benchmarks/gpu_record_manifest.sh            # the NVFP4 profile (MODEL=random:full:layers=8 for BF16 on an
#                                                     # 80 GB card: the same profile and kernels as random:full)
#
# Device `run`, carry [".whl"].
set -u
. benchmarks/gpu_env.sh
MODEL=${MODEL:-random:full:nvfp4}
MANIFEST=kernels/precompile/nvidia-h200.json
timeout 560 python3 benchmarks/cold_start.py --models "$MODEL" --record "$MANIFEST" --replace --no-warm --save-times \
    --max-num-seqs 128 --out "$OUT/cold_start_record.json" > "$OUT/cold_start.txt" 2>&1
tail -15 "$OUT/cold_start.txt"
cp "$MANIFEST" "$OUT/nvidia-h200.json"
