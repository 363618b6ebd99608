#!/usr/bin/env bash
S=$(date +%s); export GPUOS_GIT_SHA=f72dfcd
el() { echo $(( $(date +%s) - S )); }
CARRY_SO=$(ls .run/so/*.so) OUT=$OUT/t1 PYTEST_TIMEOUT=440 bash tools/gpu_check.sh tests1 2>&1 | tail -25
echo "tests1 done at $(el) s"
cp .run/so/*.so . ; export PYTHONPATH=$PWD
[ $(el) -lt 520 ] && timeout $(( 580 - $(el) )) python3 tools/program_probe.py callcost 2>&1 | tee $OUT/callcost.log | cut -c1-300
echo "done at $(el) s"
