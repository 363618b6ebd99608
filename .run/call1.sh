#!/usr/bin/env bash
# 47th session call 1: build, hop_bench, GPU suite part 2.
S=$(date +%s); export GPUOS_GIT_SHA=f72dfcd
el() { echo $(( $(date +%s) - S )); }
OUT=$OUT/b bash tools/gpu_check.sh build 2>&1 | tail -3; echo "built at $(el) s"
OUT=$OUT/h bash tools/gpu_check.sh hops 2>&1 | tail -40; echo "hops at $(el) s"
CARRY_SO=$(ls $OUT/b/so/*.so) OUT=$OUT/t2 PYTEST_TIMEOUT=$(( 585 - $(el) )) bash tools/gpu_check.sh tests2 2>&1 | tail -15
echo "done at $(el) s"
