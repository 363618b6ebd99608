#!/usr/bin/env bash
# 47th session: build (kick-stored ready words), A/B GPUOS_KICK_READY on callcost + traced ew loop, GPU suite part 2.
S=$(date +%s); export GPUOS_GIT_SHA=${SHA:-unknown}
el() { echo $(( $(date +%s) - S )); }
OUT=$OUT/b bash tools/gpu_check.sh build 2>&1 | tail -3; echo "built at $(el) s"
so=$(ls $OUT/b/so/*.so 2>/dev/null | head -1); [ -z "$so" ] && { echo "no .so"; exit 1; }
export GPUOS_CACHE_DIR=/tmp/gpuos-cache
for i in 1 2; do for k in 1 0; do
  [ $(el) -gt 300 ] && break 2
  echo "== KICK_READY=$k run $i at $(el) s"
  GPUOS_KICK_READY=$k timeout 40 python3 tools/program_probe.py callcost 2>&1 |
    tee -a $OUT/callcost.log | python3 -c "
import sys, json
for l in sys.stdin:
    try: d = json.loads(l)
    except Exception: print(l.rstrip()[:200]); continue
    print({k: d.get(k) for k in ('rounds', 'back_to_back_us', 'host_p10_p50_p90', 'span_p10_p50_p90', 'cudagraph_us', 'generation')})"
done; done
for k in 1 0; do
  [ $(el) -gt 330 ] && break
  echo "== trace ew KICK_READY=$k at $(el) s"
  GPUOS_KICK_READY=$k CALLS_SIZE=ew CALLS_N=300 timeout 60 python3 tools/worker_trace.py calls 2>&1 |
    tee -a $OUT/trace.log | grep "^calls" | cut -c1-700
done
echo "tests2 at $(el) s"
CARRY_SO=$so OUT=$OUT/t2 PYTEST_TIMEOUT=$(( 590 - $(el) )) bash tools/gpu_check.sh tests2 2>&1 | tail -15
echo "done at $(el) s"
