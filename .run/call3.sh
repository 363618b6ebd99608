#!/usr/bin/env bash
# Final call of the forty-sixth session: build, the tests the busy adoption touches, callcost twice, then more tests.
S=$(date +%s); export GPUOS_GIT_SHA=${SHA:-unknown}
el() { echo $(( $(date +%s) - S )); }
OUT=$OUT/b bash tools/gpu_check.sh build 2>&1 | tail -3; echo "built at $(el) s"
rm -rf $OUT/b/so
nvcc -std=c++17 -arch=native -O2 tools/hop_bench.cu -lcuda -o /tmp/hop_bench && timeout 60 /tmp/hop_bench 2>&1 | tee $OUT/hop_bench.log
echo "hop_bench at $(el) s"
pt() {  # name, timeout, files...
  local name=$1 to=$2; shift 2
  GPUOS_FAIL_LOG=$OUT/failures_$name.log GPUOS_TIMEOUT_S=20 timeout $to python3 -m pytest -q --tb=short -p no:cacheprovider \
    --durations=5 "$@" > $OUT/pytest_$name.log 2>&1
  echo "pytest $name rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_$name.log | tail -12
}
pt A 260 tests/test_gpu_kicks.py tests/test_gpu_injection.py tests/test_gpu_fusion.py tests/test_gpu_programs.py \
  tests/test_gpu_program_calls.py "tests/test_gpu_reliability.py::test_publication_beside_device_wide_blocking_calls"
for i in 1 2; do
  [ $(el) -gt 420 ] && break
  echo "== callcost $i"; timeout 45 python3 tools/program_probe.py callcost 2>&1 | tee -a $OUT/callcost.log | python3 -c "
import json, sys
for l in sys.stdin:
    if not l.startswith('{'): print(l.strip()[:200]); continue
    d = json.loads(l)
    if 'back_to_back_us' in d: print(d['rounds'], 'b2b', d['back_to_back_us'], 'host', d['host_us'], 'span', d['span_p10_p50_p90'], 'gen', d['generation'], 'busy', d['busy_adoptions'])
    else: print(d)"
done
[ $(el) -lt 450 ] && pt B 65 tests/test_gpu_faults.py
echo "end at $(el) s"
