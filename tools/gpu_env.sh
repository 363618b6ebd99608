# Sourced by tools/gpu_check.sh and tools/gpu_variants.sh: the device scripts' one build environment and one W7 run.
# shellcheck shell=bash
export MAX_JOBS=${MAX_JOBS:-$(nproc)} GPUOS_USE_NINJA=1 PYTHONUNBUFFERED=1
export GPUOS_CACHE_DIR=${GPUOS_CACHE_DIR:-/tmp/gpuos-cache}
# W7's labels for an A/B when the caller names none (GPUOS_BENCH_MODELS=${GPUOS_BENCH_MODELS:-$W7_AB_MODELS}): the
# two small static-cache models. (`gpu_check.sh bench` leaves bench_models.py its own default set.)
W7_AB_MODELS=llama-small-fp16-sdpa-static,gpt2-small-fp16-sdpa-static
# W7's program and CUDA-graph rows: python3 "${W7_ROWS[@]}" --out-dir DIR
W7_ROWS=(benchmarks/bench_models.py --configs cudagraph gpuos_program --progress plain --no-plots)
