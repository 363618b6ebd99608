#!/usr/bin/env bash
# tests1 with the carried .so, then callcost kicks on/off alternately while time remains.
S=$(date +%s); export GPUOS_GIT_SHA=923c9aa
CARRY_SO=$(ls /tmp/so/*.so) OUT=$OUT/t1 PYTEST_TIMEOUT=430 bash tools/gpu_check.sh tests1 2>&1 | tail -15
cp /tmp/so/*.so . ; export PYTHONPATH=$PWD
for i in 1 2; do for k in 1 0; do
  [ $(( $(date +%s) - S )) -gt 540 ] && break 2
  echo "== KICKS=$k run $i"; GPUOS_KICKS=$k timeout 45 python3 tools/program_probe.py callcost 2>&1 | tee -a $OUT/callcost.log | cut -c1-220
done; done
