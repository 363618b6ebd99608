#!/usr/bin/env bash
# One full GPU verification in one device call (build, GPU test suite, examples, benchmarks), logs under
# $OUT (or ./gpu_logs). Budget about 8 minutes on an H100/H200 when the NVRTC cache is cold.
#   device run: bash tools/gpu_check.sh [build|tests|tests1|tests2|bench|all|stress|stressab|sanitize|w7ab|hops]   (set GPUOS_GIT_SHA=<sha> so results name the commit)
#   env: BENCHES="reduce injection" (benchmarks/bench_<name>.py), PROBES="sched_cost_probe reduce_probe rowsum_baseline worker_trace"
# A device command may run 10 minutes: with a cold machine, run `tests` and `bench` as two back-to-back calls.
set -u
T0=$(date +%s)
MODE=${1:-all}
FINAL=${OUT:-gpu_logs}
OUT=$(mktemp -d /tmp/gpu_check.XXXX)   # logs gathered here, packed into $FINAL/logs.tgz at the end (the device
mkdir -p "$FINAL"                      # tool returns at most 8 files)
trap 'cp benchmarks/results/*.json "$OUT/" 2>/dev/null; tar czf "$FINAL/logs.tgz" -C "$OUT" . ; grep -E "passed|failed" "$OUT/pytest.log" > "$FINAL/summary.txt" 2>/dev/null' EXIT
source "$(dirname "$0")/gpu_env.sh"  # build environment, W7_ROWS, W7_AB_MODELS
if [ "$MODE" = hops ]; then  # tools/hop_bench.cu: a program call's stream hops outside the runtime (~5 s, no build)
  nvcc -std=c++17 -arch=native -O2 tools/hop_bench.cu -lcuda -o /tmp/hop_bench && timeout 60 /tmp/hop_bench 2>&1 |
    tee "$OUT/hop_bench.log"
  exit 0
fi
# --no-deps: the device machine is offline; torch and the nvidia wheels (nvrtc, nvjitlink) are there already.
# CARRY_SO=<path of a _gpuos_C*.so built by an earlier call>: no build (a warm host's `pip install -e .` rebuilt
# everything, 118 s); else the build's stripped .so goes to $FINAL/so/ for the next call to carry (it holds the
# device sources too: valid while csrc/ and device_src/ are unchanged).
rm -f gpuos_ext*.so  # a stale one from before this layout would shadow gpuos_ext.py
if [ -n "${CARRY_SO:-}" ]; then
  cp "$CARRY_SO" . && export PYTHONPATH=$PWD || { echo "CARRY_SO=$CARRY_SO: not found"; exit 1; }
else
  python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  so=$(ls _gpuos_C*.so 2>/dev/null | head -1)  # (torch first: the extension links against libtorch)
  [ -z "$so" ] && so=$(python3 -c "import torch, _gpuos_C; print(_gpuos_C.__file__)" 2>/dev/null)
  [ -n "$so" ] && mkdir -p "$FINAL/so" && cp "$so" "$FINAL/so/" && strip -g "$FINAL/so/$(basename "$so")"
fi
# Warm the JIT cache once (the suite's own cold-start tests use private cache dirs); say how generations are built.
# Outside the test modes, also wait (at most 300 s) for generation 0's base image compiled whole (csrc/inject/whole.h:
# 83 s at 747674a, about a third less since; once per machine and build, then every process's generation 0 is
# taken whole from the cache).
case "$MODE" in tests*) WARM_WHOLE=${WARM_WHOLE:-0} ;; *) WARM_WHOLE=${WARM_WHOLE:-1} ;; esac
python3 -c "import time, gpuos, gpuos_ext; gpuos.init(); print(gpuos.runtime_info()); print(gpuos_ext.link_info())
if $WARM_WHOLE and gpuos_ext.whole_build_info()['enabled']:
    t = time.monotonic(); ok = gpuos_ext.wait_whole_builds(300)
    print('base image:', gpuos_ext.generation_info()['generations'][0]['built'], 'waited', ok, round(time.monotonic() - t, 1), 's',
          {k: v for k, v in gpuos_ext.whole_build_info().items() if k != 'command'})" 2>&1 | tail -4
[ "$MODE" = build ] && exit 0  # the build alone, its .so in $FINAL/so/ (w7ab builds too without CARRY_SO)
case "$MODE" in tests|tests1|tests2|all)
# The GPU suite is two pytest parts of ~300 s each on an H200 (forty-seventh session's durations: test_gpu_kicks.py,
# ~100 s, moved to part 2), each with its own summary line (pytest_1.log, pytest_2.log). On a machine with two GPUs
# (device kind nvidia-h200-x2) `tests` runs them at once, part 1 on GPU 0 and part 2 on GPU 1, so the build and the
# whole suite fit one call (~150 + ~350 s; on one GPU, one after the other, they need two calls: `tests1` / `tests2`,
# with a build in the call or with CARRY_SO -- the build in an earlier call: `build`, `tests2`, or one that
# measures: `w7ab`). CPU=1 adds the CPU files to part 1 (CI runs them). Failures are written as they happen
# (GPUOS_FAIL_LOG: failures_<part>.log), so a part cut by the device's time limit still says what failed.
gpu_files() { for f in "$@"; do printf "tests/test_gpu_%s.py " "$f"; done; }
part1="$( [ "${CPU:-0}" = 1 ] && ls tests/test_cpu_*.py) $(gpu_files program_calls programs reliability faults fusion \
  stress vector_paths matmul index_ops prologue injection)"
part2="$(gpu_files link scheduler levels runtime foreign_work ops rows attention decode_ops rewrite multi kicks cfront)"
missing=$(comm -13 <(echo $part1 $part2 | tr ' ' '\n' | sort) <(ls tests/test_gpu_*.py | sort))
[ -n "$missing" ] && echo "gpu_check.sh: in neither part (add them): $missing"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
parallel=0; [ "$MODE" = tests ] || [ "$MODE" = all ] && [ "$ngpu" -ge 2 ] && parallel=1
# Each part's pytest on its own GPU when parallel (CUDA_VISIBLE_DEVICES: the multi-GPU tests skip, as on one GPU).
# Its time limit: PYTEST_TIMEOUT, else what is left of the device call's 600 s less the examples' ~60.
part() {  # n files
  local n=$1; shift
  # Only when parallel: an empty CUDA_VISIBLE_DEVICES would hide every GPU (the whole part skipped, "green").
  local gpu=(); [ $parallel = 1 ] && gpu=(CUDA_VISIBLE_DEVICES=$((n - 1)))
  env "${gpu[@]}" GPUOS_FAIL_LOG="$FINAL/failures_$n.log" GPUOS_TIMEOUT_S=20 \
    timeout ${PYTEST_TIMEOUT:-$(( 540 - $(date +%s) + T0 ))} python3 -m pytest -q --tb=short --durations=12 \
    -p no:cacheprovider "$@" > "$OUT/pytest_$n.log" 2>&1
  echo "pytest part $n rc=$? (${gpu[*]:-every GPU}, at $(( $(date +%s) - T0 )) s)"
}
examples() {
  timeout 60 python3 tools/scheduler_chain_repro.py > "$OUT/scheduler_chain_repro.log" 2>&1
  echo "scheduler_chain_repro rc=$?"; tail -4 "$OUT/scheduler_chain_repro.log"
  for f in examples/*.py; do
    case "$f" in */_*) continue ;; esac
    timeout 60 python3 "$f" > "$OUT/ex_$(basename "$f" .py).log" 2>&1; echo "$f rc=$?"
  done
}
if [ $parallel = 1 ]; then  # the examples on GPU 1 after part 2 (the shorter one), beside the rest of part 1
  echo "two GPUs: part 1 on GPU 0, part 2 then the examples on GPU 1"
  part 1 $part1 > "$OUT/part1.status" &
  { part 2 $part2; CUDA_VISIBLE_DEVICES=1 examples; } > "$OUT/part2.status"
  wait
  cat "$OUT/part1.status" "$OUT/part2.status"
else
  [ "$MODE" != tests2 ] && part 1 $part1
  [ "$MODE" != tests1 ] && part 2 $part2
  [ "$MODE" != tests2 ] && examples  # with part 1 (part 2 needs its call's time)
fi
for n in 1 2; do
  [ -f "$OUT/pytest_$n.log" ] || continue
  grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/pytest_$n.log" | tail -30
  grep -qE "[0-9]+ passed" "$OUT/pytest_$n.log" || echo "gpu_check.sh: part $n passed nothing (no GPU visible?)"
  cat "$OUT/pytest_$n.log" >> "$OUT/pytest.log"
done
;; esac
if [ "$MODE" = stress ]; then
# tests/test_gpu_stress.py (sizes: GPUOS_STRESS_S, GPUOS_SOAK_OPS, GPUOS_DRIFT_FLUSHES), then the release figures
# into benchmarks/results/reliability.json with RELIABILITY=1 (1,000,000-op soak, 100,000 flushes: ~6 minutes).
GPUOS_FAIL_LOG="$FINAL/failures.log" timeout ${PYTEST_TIMEOUT:-480} python3 -m pytest -q --tb=short tests/test_gpu_stress.py \
  -p no:cacheprovider > "$OUT/pytest.log" 2>&1; echo "stress pytest rc=$?"; tail -3 "$OUT/pytest.log"
[ "${RELIABILITY:-0}" = 1 ] && timeout 560 python3 tools/reliability_run.py 2>&1 | tail -12
exit 0
fi
if [ "$MODE" = stressab ]; then
# The live scheduler's ways under test_stress, rotated until STRESSAB_S (default 420 s) is spent: configs of
# STRESSAB_CONFIGS separated by spaces, each VAR=VALUE[,VAR=VALUE...] passed to the stress child (test_gpu_stress.py
# STRESS_AB), e.g. "GPUOS_TIMER_OFF_GIL=1,GPUOS_LIVE_IDLE_US=5000 GPUOS_LIVE_IDLE_US=5000"; GPUOS_STRESS_S per run
# (default 30), GPUOS_STRESS_ACTIVITIES a subset. One line per run: the config, pytest's summary and the first
# mismatch's activity (the test asserts that the child ran with the config's switches; logs: stressab_<n>.log).
n=0; end=$(( $(date +%s) + ${STRESSAB_S:-420} ))
while [ $(( $(date +%s) + ${GPUOS_STRESS_S:-30} + 15 )) -lt $end ]; do
  for cfg in ${STRESSAB_CONFIGS:-GPUOS_TIMER_OFF_GIL=1,GPUOS_LIVE_IDLE_US=5000}; do
    [ $(( $(date +%s) + ${GPUOS_STRESS_S:-30} + 15 )) -ge $end ] && break
    n=$((n + 1)); log="$OUT/stressab_$n.log"
    env ${cfg//,/ } GPUOS_STRESS_S=${GPUOS_STRESS_S:-30} timeout $(( ${GPUOS_STRESS_S:-30} + 120 )) python3 -m pytest -q \
      --tb=short -p no:cacheprovider tests/test_gpu_stress.py::test_stress > "$log" 2>&1
    echo "run $n [$cfg]: $(tail -1 "$log")" "$(grep -m1 '"activity"' "$log" | tr -d ' ')"
  done
done
exit 0
fi
if [ "$MODE" = w7ab ]; then
# W7's program and CUDA-graph rows (~210 s per variant with the whole builds, ~25 s with GPUOS_WHOLE_BUILD=0) once per variant of W7_ENVS: variants separated by spaces,
# each VAR=VALUE[,VAR=VALUE...] ("-": the defaults), e.g. W7_ENVS="- GPUOS_HOME_LEVELS=0 GPUOS_BURST_BLOCKS=33"; labels
# from GPUOS_BENCH_MODELS (default the two small static-cache models). Ratios compare variants of one call.
# HF=1: each variant also runs `worker_trace.py hf` (~35 s; HF_LABELS, default Llama-small), its item medians
# printed. The SM clock and power are sampled every 200 ms during each variant (clocks_<i>.log: whether a variant's
# speed came with other clocks -- e.g. ~100 blocks spinning on a 132-block grid). CALL_LIMIT (default 570 s, from the
# script's start, the build included): a variant starts only with 70 s (HF=1: 110 s) left, and the last one's
# timeouts shrink to the time left, so that the call ends before the device tool's limit and its logs come back.
export GPUOS_BENCH_MODELS=${GPUOS_BENCH_MODELS:-$W7_AB_MODELS}
i=0
left() { echo $(( ${CALL_LIMIT:-570} - ($(date +%s) - T0) )); }
for v in ${W7_ENVS:--}; do
  [ "$(left)" -lt $([ "${HF:-0}" = 1 ] && echo 110 || echo 70) ] && { echo "W7 [$v]: skipped (time left $(left) s)"; continue; }
  i=$((i + 1)); envs=(); [ "$v" = - ] || IFS=, read -ra envs <<< "$v"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw --format=csv,noheader -lms 200 > "$OUT/clocks_$i.log" 2>&1 &
  smi=$!
  # W7_TIMEOUT (default 360 s): a model's settle waits for its whole build (~90 s of the helper's NVRTC on an H200
  # at 747674a, less since, once per model and build; csrc/inject/whole.h), so W7 of two models took ~210 s, ~20 s
  # with GPUOS_WHOLE_BUILD=0.
  t=$(left); [ "$t" -gt "${W7_TIMEOUT:-360}" ] && t=${W7_TIMEOUT:-360}
  env "${envs[@]}" timeout $((t - 5)) python3 "${W7_ROWS[@]}" --out-dir "$OUT/w7_$i" > "$OUT/w7_$i.log" 2>&1
  echo "W7 [$v] rc=$?: $(grep -E 'GPUOS vs best peer' "$OUT/w7_$i.log" | tail -1)"
  cp "$OUT/w7_$i/models.json" "$FINAL/models_w7_$i.json" 2>/dev/null
  if [ "${HF:-0}" = 1 ] && [ "$(left)" -ge 40 ]; then
    t=$(left); [ "$t" -gt "${HF_TIMEOUT:-120}" ] && t=${HF_TIMEOUT:-120}
    env "${envs[@]}" HF_LABELS=${HF_LABELS:-llama-small-fp16-sdpa-static} timeout $((t - 5)) \
      python3 tools/worker_trace.py hf > "$OUT/hf_$i.log" 2>&1
    echo "  hf rc=$?"; grep -A1 -E "^    (mm|sdpa|fused|fused_rows@[0-9]+) " "$OUT/hf_$i.log" | grep -E "^    (mm|sdpa|fused|fused_rows@[0-9]+) |dispatch" | head -8
    grep -E "^hf " "$OUT/hf_$i.log"
  fi
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "  SM clock MHz / power W (min..max): $(awk -F', ' '{c=$1+0; w=$3+0; if (NR==1||c<c0) c0=c; if (c>c1) c1=c;
    if (NR==1||w<w0) w0=w; if (w>w1) w1=w} END {if (NR) printf "%d..%d / %.0f..%.0f", c0, c1, w0, w1}' "$OUT/clocks_$i.log")"
done
exit 0
fi
if [ "$MODE" = sanitize ]; then
# compute-sanitizer over tools/sanitize_workload.py (explicit API, scheduler + fusion, reductions, injection,
# handover); the ERROR SUMMARY lines are the result. SANITIZERS="memcheck racecheck synccheck" by default.
for t in ${SANITIZERS:-memcheck racecheck synccheck}; do
  timeout ${SANITIZE_TIMEOUT:-240} compute-sanitizer --tool $t --target-processes all python3 tools/sanitize_workload.py > "$OUT/sanitizer_$t.log" 2>&1
  echo "sanitizer $t rc=$?: $(grep -E 'ERROR SUMMARY|SANITIZE_WORKLOAD' "$OUT/sanitizer_$t.log" | tr '\n' ' ')"
  cp "$OUT/sanitizer_$t.log" "$FINAL/" 2>/dev/null
done
exit 0
fi
case "$MODE" in tests*) ;; *)
# BENCHES: which benchmarks/bench_<name>.py to run (default: all of them), each with its own time limit.
for b in ${BENCHES:-microbatch reduce scheduler fusion injection models matmul}; do
  case $b in microbatch) lim=240; args="--reps 10 --plain" ;; reduce) lim=100; args=--plain ;;
    models) lim=420; args="--progress plain" ;;  # W7: HF GPT-2 / Llama decode (GPUOS_BENCH_MODELS picks labels)
    matmul) lim=200; args= ;;  # worker skinny matmul vs cuBLAS (issue #16)
    scheduler) lim=150; args=--plain ;; *) lim=120; args= ;; esac
  [ -f benchmarks/bench_$b.py ] || continue
  timeout $lim python3 benchmarks/bench_$b.py $args > "$OUT/bench_$b.log" 2>&1; echo "bench_$b rc=$?"; tail -14 "$OUT/bench_$b.log"
done
# PROBES: tools/<name>.py breakdowns (seconds each; default none), e.g. PROBES="sched_cost_probe reduce_probe".
for p in ${PROBES:-}; do
  timeout 120 python3 tools/$p.py > "$OUT/$p.log" 2>&1; echo "$p rc=$?"; tail -12 "$OUT/$p.log"
done
;; esac
exit 0
