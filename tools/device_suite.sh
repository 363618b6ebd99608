#!/usr/bin/env bash
# One device call: build (or reuse a carried build), the whole GPU suite, examples. Logs into $OUT.
#   STRESS_SMALL=1 shrinks tests/test_gpu_stress.py (20 s stress, 20,000-op soak, 5,000 flushes).
set -u
export MAX_JOBS=${MAX_JOBS:-16} GPUOS_USE_NINJA=1 PYTHONUNBUFFERED=1 GPUOS_CACHE_DIR=${GPUOS_CACHE_DIR:-/tmp/gpuos-cache}
OUTD=${OUT:-gpu_logs}; mkdir -p "$OUTD"
t0=$(date +%s)
python3 -m pip install --no-build-isolation -e . > "$OUTD/build.log" 2>&1 || { tail -40 "$OUTD/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
python3 -c "import gpuos; gpuos.init(); print(gpuos.runtime_info())" 2>&1 | tail -2
if [ "${STRESS_SMALL:-0}" = 1 ]; then export GPUOS_STRESS_S=20 GPUOS_SOAK_OPS=20000 GPUOS_DRIFT_FLUSHES=5000; fi
GPUOS_FAIL_LOG=$OUTD/failures.log GPUOS_TIMEOUT_S=20 timeout ${PYTEST_TIMEOUT:-400} python3 -m pytest -q --tb=short --durations=15 ${PYTEST_ARGS:-tests} -p no:cacheprovider > "$OUTD/pytest.log" 2>&1
echo "pytest rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUTD/pytest.log" | tail -40
if [ "${EXAMPLES:-1}" = 1 ]; then
for f in examples/*.py; do
  case "$f" in */_*) continue ;; esac
  timeout 60 python3 "$f" > "/tmp/ex_$(basename "$f" .py).log" 2>&1; echo "$f rc=$?"
done
fi
echo "total $(( $(date +%s) - t0 )) s"
