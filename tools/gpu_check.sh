#!/usr/bin/env bash
# One full GPU verification in one device call (build, GPU test suite, examples, benchmarks), logs under
# $OUT (or ./gpu_logs). Budget about 8 minutes on an H100/H200 when the NVRTC cache is cold.
#   device run: bash tools/gpu_check.sh [tests|bench|all]   (set GPUOS_GIT_SHA=<sha> so results name the commit)
# A device command may run 10 minutes: with a cold machine, run `tests` and `bench` as two back-to-back calls.
set -u
MODE=${1:-all}
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} GPUOS_USE_NINJA=1 PYTHONUNBUFFERED=1
export GPUOS_CACHE_DIR=${GPUOS_CACHE_DIR:-/tmp/gpuos-cache}
python3 -m pip install --no-build-isolation -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
# Warm the JIT cache once (the suite's own cold-start tests use private cache dirs).
python3 -c "import gpuos; gpuos.init(); print(gpuos.runtime_info())" 2>&1 | tail -2
if [ "$MODE" != bench ]; then
timeout 60 python3 tools/scheduler_chain_repro.py > "$OUT/scheduler_chain_repro.log" 2>&1; echo "scheduler_chain_repro rc=$?"; tail -4 "$OUT/scheduler_chain_repro.log"
GPUOS_TIMEOUT_S=20 timeout ${PYTEST_TIMEOUT:-420} python3 -m pytest -q --tb=short --durations=12 tests -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -20
for f in examples/*.py; do
  case "$f" in */_*) continue ;; esac
  timeout 60 python3 "$f" > "$OUT/ex_$(basename "$f" .py).log" 2>&1; echo "$f rc=$?"
done
fi
if [ "$MODE" != tests ]; then
timeout 240 python3 benchmarks/bench_microbatch.py --reps 10 --plain > "$OUT/bench_microbatch.log" 2>&1; tail -12 "$OUT/bench_microbatch.log"
timeout 100 python3 benchmarks/bench_reduce.py --plain > "$OUT/bench_reduce.log" 2>&1; tail -12 "$OUT/bench_reduce.log"
timeout 150 python3 benchmarks/bench_scheduler.py --plain > "$OUT/bench_scheduler.log" 2>&1; tail -12 "$OUT/bench_scheduler.log"
cp benchmarks/results/*.json "$OUT/" 2>/dev/null
fi
exit 0
