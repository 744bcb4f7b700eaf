#!/usr/bin/env bash
# Every GPU test of the project (`pytest -m gpu` over tests/) in one device call (one H200), results under $OUT:
# gpu_tests_all.txt (verbose, so a run cut short by its limit still names each test that failed; the slowest 25 at
# its end) and, for the tests that failed, a second run of just those on one worker (gpu_tests_rerun.txt): a failure
# that passes alone is a neighbour's memory, not the kernel. Run: bash benchmarks/gpu_tests.sh (device `run`, carry
# [".whl"]). LIMIT (s, default 470) bounds the first run, WORKERS (default 12 of the machine's 16 cores: the time is
# mostly Triton compiling each test's variants) its parallelism. On an 80 GB H100 twelve workers left 11
# lm_head-sized tests out of memory, which passed in the rerun, and the first run needed more than 420 s (fortieth
# session): fewer workers would not fit a call; the rerun sorts memory from kernels. Only the files that hold GPU
# tests are collected: the others import what the device's image lacks (Ray, openai, FastAPI), and their collection
# errors (10 in the thirty-ninth session's run, beside 573 passed) would hide a GPU file's own. The whole run no
# longer fits one call on an H100 (612 of 617 within 440 s in the fifty-second session). In halves (fifty-third
# session) the first took over 470 s for its 292 tests and the second 218 s for 325: use SHARD=1/3, 2/3 and 3/3. On an
# H100 (fifty-sixth session) the first third took 120 s, the second ~60 s (+ its rerun), the third over 380 s: give
# SHARD=3/3 a call of its own with LIMIT=450 (fifty-seventh session: 242 passed in 416 s).
set -u
. benchmarks/gpu_env.sh
mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
# SHARD=i/n keeps every n-th file from the i-th (1-based), so n calls run them all, each with its summary line.
if [ -n "${SHARD:-}" ]; then
    IFS=/ read -r shard_i shard_n <<< "$SHARD"
    mapfile -t files < <(printf '%s\n' "${files[@]}" | awk -v i="$shard_i" -v n="$shard_n" '(NR - i) % n == 0')
fi
timeout "${LIMIT:-470}" python3 -m pytest -v -m gpu --noconftest -p no:cacheprovider -n "${WORKERS:-12}" \
    --durations=25 "${files[@]}" > "$OUT/gpu_tests_all.txt" 2>&1
echo "every GPU test (${#files[@]} files): $(tail -1 "$OUT/gpu_tests_all.txt")"
echo "passed: $(grep -c " PASSED" "$OUT/gpu_tests_all.txt"), failed: $(grep -c " FAILED" "$OUT/gpu_tests_all.txt")"
grep -E "^ERROR " "$OUT/gpu_tests_all.txt" | head -12
mapfile -t failed < <(grep -oE "FAILED tests/[^ ]+" "$OUT/gpu_tests_all.txt" | sed 's/^FAILED //' | sort -u)
if [ "${#failed[@]}" -gt 0 ]; then
    printf '%s\n' "${failed[@]}" | head -20
    timeout "${RERUN_S:-90}" python3 -m pytest -v -m gpu --noconftest -p no:cacheprovider "${failed[@]}" \
        > "$OUT/gpu_tests_rerun.txt" 2>&1
    echo "the failed ones again, alone: $(tail -1 "$OUT/gpu_tests_rerun.txt")"
    grep -E "^E " "$OUT/gpu_tests_rerun.txt" | head -12
fi
sed -n '/slowest 25 durations/,/^$/p' "$OUT/gpu_tests_all.txt" | head -27
