#!/usr/bin/env bash
# Measurements on 923c9aa's build (carried): rounds-8 traces kicks on/off, KICK_WAIT / KICK_ALONE by env alone.
S=$(date +%s); export GPUOS_GIT_SHA=923c9aa
cp .run/so/*.so . ; export PYTHONPATH=$PWD
python3 -c "import gpuos; gpuos.init(); print(gpuos.runtime_info())" 2>&1 | tail -1
t() { [ $(( $(date +%s) - S )) -gt ${2:-500} ] && { echo "skip: $1"; return; }; echo "== $1"; env $1 2>&1 | tee -a $OUT/log.txt | grep -v "^{0:" | cut -c1-600; }
for e in "GPUOS_KICKS=1" "GPUOS_KICKS=0" "GPUOS_KICK_WAIT=1" "GPUOS_KICKS=1"; do
  t "$e CALLS_SIZE=rounds8 CALLS_N=300 timeout 40 python3 tools/worker_trace.py calls"; done
t "GPUOS_KICKS=1 CALLS_SIZE=ew CALLS_N=300 GPUOS_KICK_WAIT=1 timeout 40 python3 tools/worker_trace.py calls"
for e in "GPUOS_KICK_WAIT=1" "GPUOS_KICK_ALONE=100000" "GPUOS_KICKS=1"; do
  t "$e timeout 45 python3 tools/program_probe.py callcost" 200; done
for e in "GPUOS_KICKS=1" "GPUOS_KICK_ALONE=100000" "GPUOS_KICK_WAIT=1"; do
  t "$e PROBE_TOP=0 PROBE_RUNS=3 timeout 90 python3 tools/sched_model_probe.py" 250; done
