// csrc/config/config.h -- every setting read from the environment, in one place (the lowest layer: no other
// gpuos header). Read on first use and again by init() while no runtime exists; gpuos.runtime_info() reports
// it. Nothing else in csrc/ calls getenv.
#pragma once
#include <cstdint>
#include <string>

namespace gpuos {

struct EnvConfig {
  // Runtime (init() arguments win where given): 0 / empty = the built-in default.
  uint32_t worker_blocks = 0;     // GPUOS_WORKER_BLOCKS: persistent grid (0: about a quarter of the SMs)
  double idle_us = -1.0;          // GPUOS_IDLE_US (< 0: init()'s argument)
  double program_idle_us = 20.0;  // GPUOS_PROGRAM_IDLE_US: the same for a worker a program call launches (< 0: idle_us)
  double live_idle_us = -1.0;     // GPUOS_LIVE_IDLE_US: the same while a scheduler context's flush timer runs (the
                                  // live window, sched/flush.cpp; < 0: the context's live_idle_us, default off; 0: off)
  uint32_t burst_min = 2048;      // GPUOS_BURST_MIN: flushes of >= this many sub-ops launch on the burst grid
  uint32_t burst_blocks = 0;      // GPUOS_BURST_BLOCKS (0: every SM)
  uint32_t publish_min = 1024;    // GPUOS_PUBLISH_MIN: publish during recording after this many sub-ops
  bool join_levels = true;        // GPUOS_JOIN_LEVELS=0: an early publication's next piece of the same level waits
                                  // for it like a new level (the A/B of Runtime::append_tiles' join)
  double timeout_s = 60.0;        // GPUOS_TIMEOUT_S: bound of every GPU wait
  uint32_t trace_records = 0;     // GPUOS_TRACE: claim-trace records per block (0: off)
  uint32_t dma_min = 128;         // GPUOS_DMA_MIN: levels of >= this many descriptors go by copy engine
  uint32_t dma_levels = 4;        // GPUOS_DMA_LEVELS: flushes of >= this many levels go by one copy (0: never)
  uint32_t mm_items = 1024;       // GPUOS_MM_ITEMS: about this many items per worker matmul (K slices; <= 1: none)
  uint32_t mm_items_live = 512;   // GPUOS_MM_ITEMS_LIVE: the same for a product recorded outside a capture (its
                                  // descriptors copied per publication; 0: mm_items)
  bool mm_spread = true;          // GPUOS_MM_SPREAD=0: a level's split products keep the cut each got alone (the
                                  // A/B of core/matmul_plan.h level_cut / spread_level)
  uint32_t attn_min_rows = 64;    // GPUOS_ATTN_MIN_ROWS: fewest kv positions per KV split of decode attention
  bool local_combine = true;      // GPUOS_LOCAL_COMBINE=0: a split tile (captured attention, split-K matmul) that one
                                  // claim holds whole is still combined through global partials and a counter (A/B)
  bool mm_epilogue = true;        // GPUOS_MM_EPILOGUE=0: activation chains on a matmul's product stay their own
                                  // level instead of running as its epilogue (sched/epilogue.cpp; the A/B)
  bool mm_prologue = true;        // GPUOS_MM_PROLOGUE=0: a row program read only by matmuls stays its own level
                                  // instead of running as their prologue (sched/prologue.cpp; the A/B)
  bool timer_off_gil = false;     // GPUOS_TIMER_OFF_GIL=1: the flush timer analyses, emits and publishes without the
                                  // GIL (sched/flush.cpp sched_flush_due; fifty-second session). Off by default since
                                  // the fifty-third: the stress test found wrong results with it (a dependency check
                                  // skipped staged work; fixed in lower.cpp regain), and with the live window beside
                                  // it still did (fifty-fourth; two timers' flights, fixed in the fifty-fifth): on
                                  // once a long stress A/B is clean (docs/design/limitations.md)
  uint32_t home_levels = 1;       // GPUOS_HOME_LEVELS: a program level's home blocks per claim (core/tape.cpp
                                  // piece_homes); 0: every block claims every level (no homes; the A/B)
  bool kicks = true;              // GPUOS_KICKS (default 1): every publication launches a kick behind its ready words;
                                  // 0: a gated standby on the side stream instead (docs/design/programs.md *Kicks*)
  uint32_t kick_alone = 0;        // GPUOS_KICK_ALONE: with kicks, a publication of at most this many sub-ops (no
                                  // heavy level) launches no worker when none is resident: its kick runs it alone
                                  // (one block); 0: every publication launches one then (the A/B)
  bool kick_wait = false;         // GPUOS_KICK_WAIT=1: a kick that finds the token held stays until its batches are
                                  // done (device_src/types.h kStandbyKickWait; the A/B)
  uint32_t handover_queue = 1;    // GPUOS_HANDOVER_QUEUE: standby launches queued behind an idle worker at
                                  // which it leaves at once (walk.h poll_step; 0: only after idle_us)
  uint32_t specialize_after = 64; // GPUOS_SPECIALIZE_AFTER: tier-2 threshold (0: never)
  uint32_t ptxas_opt = 1;        // GPUOS_PTXAS_OPT: ptxas -O level of every NVRTC compile (0..3; compile time vs code)
  std::string fast_compile = "ptxas-min";  // GPUOS_FAST_COMPILE: --Ofast-compile for the whole (not relocatable)
                                  // compiles: "ptxas-min" (the default) / "ptxas-mid" ptxas's alone, "min" / "mid"
                                  // NVRTC's own (NVVM and ptxas); "0": off (ptxas -O GPUOS_PTXAS_OPT in full);
                                  // anything else fails the compile (jit.cpp compile_options)
  bool worker_matmul = false;     // GPUOS_WORKER_MATMUL=1: the scheduler records skinny matmuls as worker tasks
  bool worker_attention = false;  // GPUOS_WORKER_ATTENTION=1: the scheduler records decode SDPA as worker tasks
  // JIT and libraries.
  bool forbid_compile = false;    // GPUOS_FORBID_COMPILE=1: any NVRTC compile is an error (warm-start proof)
  std::string cache_dir;          // GPUOS_CACHE_DIR, else $XDG_CACHE_HOME/gpuos, else ~/.cache/gpuos;
                                  // "" when GPUOS_DISABLE_CACHE=1 or no home is known
  uint32_t cache_max_mb = 2048;   // GPUOS_CACHE_MAX_MB: the disk cache's bound (least recently used files go
                                  // after a write that passes it; jit/jit.cpp trim_cache); 0: no bound
  std::string nvrtc_path;         // GPUOS_NVRTC_PATH: an explicit libnvrtc.so
  std::string nvjitlink_path;     // GPUOS_NVJITLINK_PATH: an explicit libnvJitLink.so (linked generations)
  bool whole_build = true;        // GPUOS_WHOLE_BUILD=0: no background whole build of linked generations, and
                                  // no whole image taken from the cache (inject/whole.h)
  bool link = true;               // GPUOS_LINK=0: every generation is a whole NVRTC compile (issue #18's
                                  // linked generations off; the inlined layout, for comparisons)
  std::string cuda_home;          // CUDA_HOME, else CUDA_PATH: <cuda_home>/lib64/libnvrtc.so.*
};

// The settings as last read (first use reads them).
const EnvConfig& env_config();
// Read the environment again (init() does, while no runtime exists).
void reload_env_config();
// "KEY=value" lines of every setting (gpuos.runtime_info()).
std::string describe_env_config();

}  // namespace gpuos
