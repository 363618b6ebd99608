#!/usr/bin/env bash
# 47th session, last call (f72dfcd's runtime, carried .so): hop_bench non-blocking vs legacy caller stream, callcost on the
# default vs a new torch stream (alternating), then W7's two small static models (program vs CUDA graph) in what is left.
S=$(date +%s); export GPUOS_GIT_SHA=${SHA:-unknown}
el() { echo $(( $(date +%s) - S )); }
source tools/gpu_env.sh
nvcc -std=c++17 -arch=native -O2 tools/hop_bench.cu -lcuda -o /tmp/hop_bench && for l in 0 1; do
  HOP_LEGACY=$l timeout 30 /tmp/hop_bench 2>&1 | tee -a $OUT/hop_bench.log; done
echo "hops at $(el) s"
cp .run/so/*.so . ; export PYTHONPATH=$PWD
for i in 1 2; do for st in default new; do
  [ $(el) -gt 120 ] && break 2
  echo "== PROBE_STREAM=$st run $i at $(el) s"
  PROBE_STREAM=$st timeout 40 python3 tools/program_probe.py callcost 2>&1 | tee -a $OUT/callcost.log | python3 -c "
import sys, json
for l in sys.stdin:
    try: d = json.loads(l)
    except Exception: print(l.rstrip()[:200]); continue
    print({k: d.get(k) for k in ('probe_stream', 'rounds', 'back_to_back_us', 'host_p10_p50_p90', 'span_p10_p50_p90', 'single_call_us', 'cudagraph_us', 'generation') if k in d})"
done; done
echo "W7 at $(el) s"
GPUOS_BENCH_MODELS=$W7_AB_MODELS timeout $(( 310 - $(el) )) python3 "${W7_ROWS[@]}" --out-dir $OUT/w7 2>&1 | tail -25
echo "done at $(el) s"
