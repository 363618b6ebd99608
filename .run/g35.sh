#!/usr/bin/env bash
# Session 21: warp_bench table + ncu source view of the LayerNorm row (tier-2 form) through fused_rows.
set -u
mkdir -p $OUT/r
T0=$(date +%s)
nvcc -std=c++17 -arch=sm_90 -O3 -lineinfo -I . tools/warp_bench.cu -o /tmp/warp_bench 2>&1 | head -5
echo "nvcc $(( $(date +%s) - T0 )) s"
/tmp/warp_bench 2>&1 | grep -E "SMs|none" | tee $OUT/r/wb.txt
for k in ${KINDS:-10}; do
  WB_ONLY=$k timeout 200 ncu --set full --import-source yes -k bench -o $OUT/r/k$k -f /tmp/warp_bench > $OUT/r/ncu_run_$k.log 2>&1; echo "ncu $k rc=$?"
  ncu -i $OUT/r/k$k.ncu-rep --page source --csv --print-source sass > $OUT/r/k${k}_sass.csv 2>$OUT/r/k${k}_sass.err; echo "src rc=$? $(wc -l < $OUT/r/k${k}_sass.csv) lines"
  ncu -i $OUT/r/k$k.ncu-rep --page details > $OUT/r/k${k}_details.txt 2>&1
  grep -iE "Duration|Warp Cycles Per Issued|Stall|Issued Ipc|Executed Instructions " $OUT/r/k${k}_details.txt | head -20
done
echo "end $(( $(date +%s) - T0 )) s"
tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
