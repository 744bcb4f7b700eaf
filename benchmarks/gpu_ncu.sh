#!/usr/bin/env bash
# Nsight Compute on the NVFP4 decode kernels (`benchmarks/ncu_nvfp4.py`), one device call (Firecracker machines: ncu
# reads the hardware counters there; the clocks are left alone). Prints each kernel's time, throughput, occupancy,
# issue rate and ncu's notes on where its warps stall; the full report comes back as ncu.txt.
#
#   bash benchmarks/gpu_ncu.sh                      # device `run`, carry [".whl"]; ROWS="1 8 32" TOKENS="32"
set -u
. benchmarks/gpu_env.sh
# shellcheck disable=SC2086
timeout 500 ncu --profile-from-start off --clock-control none \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 benchmarks/ncu_nvfp4.py --rows ${ROWS:-1 8 32} --tokens ${TOKENS:-32} > "$OUT/ncu.txt" 2>&1
echo "ncu exit $?"
grep -E "^  [_a-zA-Z].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Grid Size|Block Size|Warp Cycles Per Issued|Issued Warp Per Scheduler|No Eligible|stall|Stall|profiled|Error|ERR" \
    "$OUT/ncu.txt" | cut -c1-400 | head -150
