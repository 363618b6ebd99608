#!/usr/bin/env bash
# Code variants A/B'd in one device call. A variant is the tree plus zero or more patches (`git diff` output,
# applied with `patch -p1`), built by `python setup.py build_ext --inplace` -- ninja recompiles what a patch touches:
# a device_src/ patch only csrc/jit/jit.cpp, which embeds the sources (15-20 s on the device), a header csrc/
# includes more (~95 s); the first build is whole (~100 s) -- and its .so kept aside. Then each command runs once
# per variant, the variants in the order given for every command, each with its own .so.
#   device run: VARIANTS="main u4=/tmp/u4.patch both=a.patch+b.patch" CMDS="w7;mm" bash tools/gpu_variants.sh
# VARIANTS: NAME[=PATCH[+PATCH...]] separated by spaces (a bare NAME: the tree as it is). A name given twice is
# built once and run twice (`VARIANTS="main u4=... main"`): a drift of the machine during the call then shows.
# CMDS, separated by ';': w7 (W7's program and CUDA-graph rows, GPUOS_BENCH_MODELS: default the two small
# static-cache models; each model's settle waits for its whole build, ~90 s of NVRTC per model and variant: export
# GPUOS_WHOLE_BUILD=0 for a quicker A/B of the linked images only), mm (tools/worker_trace.py mm: MM_SHAPES, MM_WEIGHTS, TPB), hf (worker_trace.py hf), or any
# other shell command (run in the repository root with the variant's .so on PYTHONPATH and its name in $GV_NAME; join
# its parts with &&, since ; separates commands). GV_PICK: the regex of the lines such a command's summary shows.
# Logs: $OUT/<command #>_<variant #>_<name>.log, their summary lines on stdout. CALL_LIMIT (default 560 s from
# the script's start, the builds included): a run starts only with RUN_MIN (default 60) s left, and is cut at the limit.
# GV_DRY=1: apply and reverse each variant's patches, no build and no run (checks that they apply and that the
# tree comes back; tests/test_cpu_gpu_variants.py).
# GV_KEEP=NAME: that variant's .so, stripped, goes to $OUT/so/ for the next calls' CARRY_SO (tools/gpu_check.sh
# tests1 / tests2: the GPU suite on the variant without a build), and the logs are packed into $OUT/logs.tgz at
# the end -- the device tool returns at most 8 files, and a call's logs left the .so out (forty-first session).
set -u
T0=$(date +%s)
LOGS=${OUT:-gpu_logs}
mkdir -p "$LOGS"
SO_DIR=$(mktemp -d /tmp/gpu_variants.XXXX)
source "$(dirname "$0")/gpu_env.sh"  # build environment, W7_ROWS, W7_AB_MODELS
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "[gpu_variants $(elapsed)s] $*"; }
tree_sum() { find device_src csrc gpuos -type f ! -path "csrc/generated/*" ! -name "*.pyc" -print0 2>/dev/null |
             sort -z | xargs -0 md5sum | md5sum; }

APPLIED=()  # patches applied now, reversed by unapply (and on exit)
unapply() {
  local i
  for (( i=${#APPLIED[@]}-1; i>=0; i-- )); do
    patch -R -p1 -s --no-backup-if-mismatch < "${APPLIED[$i]}" || say "ERROR: could not reverse ${APPLIED[$i]}: the tree is left modified"
  done
  APPLIED=()
}
trap unapply EXIT

names=(); specs=()
for v in ${VARIANTS:-main}; do
  names+=("${v%%=*}")
  [[ "$v" == *=* ]] && specs+=("${v#*=}") || specs+=("")
done

before=$(tree_sum)
for i in "${!names[@]}"; do
  name=${names[$i]}
  [ -d "$SO_DIR/$name" ] && continue  # named before: built once
  IFS='+' read -r -a patches <<< "${specs[$i]}"
  ok=1
  for p in "${patches[@]}"; do
    [ -z "$p" ] && continue
    if [ ! -f "$p" ]; then say "variant $name: no patch file '$p'"; ok=0; break; fi
    if patch -p1 -s --forward --dry-run < "$p" > /dev/null && patch -p1 -s --forward --no-backup-if-mismatch < "$p"; then APPLIED+=("$p")
    else say "variant $name: '$p' does not apply to this tree (made against another commit?)"; ok=0; break; fi
  done
  if [ "$ok" = 1 ] && [ -z "${GV_DRY:-}" ]; then
    if python3 setup.py build_ext --inplace > "$LOGS/build_$name.log" 2>&1; then
      mkdir -p "$SO_DIR/$name" && cp _gpuos_C*.so "$SO_DIR/$name/" && say "built $name"
    else
      say "variant $name: build failed (last lines of $LOGS/build_$name.log):"; tail -15 "$LOGS/build_$name.log"; ok=0
    fi
  fi
  [ "$ok" = 1 ] && [ -n "${GV_DRY:-}" ] && say "variant $name: patches apply"
  unapply
  [ "$ok" = 1 ] || { say "stopping: variant $name is broken"; exit 1; }
done
[ "$(tree_sum)" = "$before" ] || { say "ERROR: the tree differs from before the variants"; exit 1; }
[ -n "${GV_DRY:-}" ] && exit 0
if [ -n "${GV_KEEP:-}" ]; then
  if [ -d "$SO_DIR/$GV_KEEP" ]; then
    mkdir -p "$LOGS/so" && cp "$SO_DIR/$GV_KEEP"/_gpuos_C*.so "$LOGS/so/" && strip -g "$LOGS/so/"_gpuos_C*.so &&
      say "kept $GV_KEEP's .so in $LOGS/so/ (CARRY_SO)"
  else
    say "GV_KEEP=$GV_KEEP: no such variant"
  fi
fi
# Everything under $LOGS but so/ into logs.tgz (GV_KEEP's calls: the .so must come back).
pack_logs() {
  local items
  items=$(cd "$LOGS" && find . -mindepth 1 -maxdepth 1 ! -name so ! -name logs.tgz -printf "%P\n")
  [ -z "$items" ] && return 0
  (cd "$LOGS" && tar czf logs.tgz $items && rm -rf $items) && say "logs packed into $LOGS/logs.tgz"
}
# The last build leaves its .so in the root: every run below copies its variant's over it.
so_name=$(basename "$(ls "$SO_DIR/${names[0]}"/_gpuos_C*.so)")
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export GPUOS_BENCH_MODELS=${GPUOS_BENCH_MODELS:-$W7_AB_MODELS}

LIMIT=${CALL_LIMIT:-560}
IFS=';' read -r -a cmds <<< "${CMDS:-w7}"
for c in "${!cmds[@]}"; do
  cmd=$(echo "${cmds[$c]}" | sed 's/^ *//; s/ *$//')
  for i in "${!names[@]}"; do
    name=${names[$i]}
    left=$(( LIMIT - $(elapsed) ))
    [ "$left" -lt "${RUN_MIN:-60}" ] && { say "no time left for '$cmd' on $name"; continue; }
    cp "$SO_DIR/$name/$so_name" .
    export GV_NAME=$name  # a command may run on one variant only: [ "$GV_NAME" = main ] && ...
    log="$LOGS/${c}_${i}_$name.log"
    case "$cmd" in
      w7) run=(python3 "${W7_ROWS[@]}" --out-dir "$LOGS/w7_${i}_$name"); pick="GPUOS vs best peer|median" ;;
      mm) run=(python3 tools/worker_trace.py mm); pick="^mm |items: duration|after the split" ;;
      hf) run=(python3 tools/worker_trace.py hf); pick="span|item medians|levels" ;;
      *) run=(bash -c "$cmd"); pick=${GV_PICK:-"passed|failed|error|Error"} ;;
    esac
    timeout "$left" "${run[@]}" > "$log" 2>&1
    say "$cmd on $name: rc=$?"
    grep -E "$pick" "$log" | cut -c1-200 | head -12
  done
done
[ -n "${GV_KEEP:-}" ] && pack_logs
exit 0
