// device_src/config.h -- no host-only code, no system #includes.
// Compiled by g++ (host: csrc/ includes it) and by NVRTC (device: the worker module).
// Constants shared by host and device live here and nowhere else.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GPUOS_DEVICE_COMPILE 1
#define GPUOS_HD __host__ __device__ __forceinline__
#define GPUOS_UNROLL _Pragma("unroll")
#else
#define GPUOS_HD inline
#define GPUOS_UNROLL
#endif

namespace gpuos {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// Most dims a TensorRef holds after merging contiguous dims.
constexpr u32 kMaxDims = 8;
// Batch slots in flight (power of two). A batch = one dependency level of a flush.
constexpr u32 kMaxBatches = 1024;
// Largest number of elements one sub-op descriptor covers; bigger ops are split into tiles.
constexpr u32 kTileElems = 4096;
// Most threads per worker block (init(threads_per_block=...)), and worker blocks that fit one SM: the worker
// is compiled for them (__launch_bounds__(kMaxThreads, kWorkerBlocksPerSm): 255 registers per thread). One block
// per SM: a block then holds every register of its SM, so a foreign kernel runs on the SMs the worker grid leaves
// free (the bounded grid, a quarter of the SMs) or after a burst worker shrinks (DevCtl::shrink). Measured on an
// H200 (thirty-second session, DEVELOPING Verification state): at 128 registers (2 blocks per SM) the separately
// compiled (-rdc) item functions store their callee-saved registers at every call (mm_mma 51 STL, ew_op<Add> 49;
// 2 each at 255), and W7's program rows ran 4-6 % slower (0.71x / 0.50x of CUDA-graph replay against 0.74x /
// 0.53x, Llama-small / GPT-2-small; an M = 1 mma item alone did not change); 1,024 threads per block (64
// registers) was slower still (H100).
constexpr u32 kMaxThreads = 256;
constexpr u32 kWorkerBlocksPerSm = 1;
// Sub-op descriptors a block claims at once, per warp.
constexpr u32 kClaimPerWarp = 4;
// Op id space (SubOp::op): built-in ops of device_src/ops.def are 0 .. kFirstUserOp-1; ops registered at run
// time (issue #5: register_elementwise / register_op / install) take kFirstUserOp .. kMaxOps-1; kOpFused marks
// a fused elementwise chain run by the interpreter (device_src/interp.h).
constexpr u32 kFirstUserOp = 64;
constexpr u32 kMaxOps = 255;
constexpr u32 kOpFused = 255;
// Skinny matmul (device_src/matmul.h). A product is cut into items: a tile of output columns (kMmMmaCols for the
// tensor-core path, kMmNcolCols for the row-major-weight path) over one of `ksplit` slices of K. With ksplit > 1
// the items of a tile add fp32 partials into the scratch of the ring slot of the tile's first item
// (kMmScratchPerSlot floats per ring slot, WorkerArgs::scratch): a counter word, then cols x M partials; the last
// item to finish writes the output and zeroes the scratch, so a later batch finds it clean.
constexpr u32 kMmScratchPerSlot = 128;
constexpr u32 kMmScratchHead = 16;     // floats before the partials (the counter word, padding to 64 bytes)
constexpr u32 kMmMaxSplit = 64;        // most K slices (the scratch array has this many slots past the ring)
constexpr u32 kMmMaxGroup = 16;        // most column tiles of one unsplit mma item
constexpr u32 kMmDualMaxRows = 8;      // most activation rows of a dual item (one m8 tile: kFlagMmDual)
// Most 16-bit values (M x K) of a prologue's activations: each warp's buffer in shared memory (worker.cu
// BlockFinish::pro; kFlagMmPrologue). 1,024: K = 256 at M <= 4, K = 1,024 at M = 1.
constexpr u32 kMmPrologueElems = 1024;
constexpr u32 kMmChunk = 64;           // K per tensor-core chunk (4 mma k16 steps)
constexpr u32 kMmMmaCols = 16, kMmNcolCols = 256, kMmNcol1Cols = 64;
// SubOp::reserved of an mm sub-op: variant | ksplit << 8 | tiles << 16 (15 bits) (variant 0: a column tile of the per-warp
// paths; tiles: column tiles per item of an unsplit mma product, 0 = 1 -- an LM head of 2,000-3,142 tiles of 16
// columns was that many items, each paying a claim's round trips for 8 KB of weights).
// kMmNcol1: the ncol path at M = 1 (64-column tiles, matmul.h mm_ncol1).
constexpr u32 kMmWarp = 0, kMmMma = 1, kMmNcol = 2, kMmNcol1 = 3;
// ... and bit kMmLocal: a split product whose partial fits kLocalSlot: a tile whose K slices one claim holds whole
// (one descriptor per warp) is summed in shared memory by the slice that finishes last (matmul.h mm_finish_local),
// the other tiles meet in the scratch as above.
constexpr u32 kMmLocal = 1u << 31;
// K per item: ceil(K / ksplit) rounded up to whole slice units (host and device agree through this function): a
// tensor-core chunk (mma), or one step of the ncol loop (kMmNcolRows rows of b: a slice of one step is one round
// trip of loads -- GPT-2-small's 256 x 768 product in 64-row slices was 12 items of 8 steps, ~30 us a level).
constexpr u32 kMmNcolRows = 8;
GPUOS_HD u32 mm_unit(u32 variant) { return variant == kMmMma ? kMmChunk : kMmNcolRows; }
// Output columns of an item's tile (mma / ncol / ncol1).
GPUOS_HD u32 mm_cols(u32 variant) {
  return variant == kMmMma ? kMmMmaCols : variant == kMmNcol1 ? kMmNcol1Cols : kMmNcolCols;
}
// 32-bit divisions when K fits (a 64-bit division is a ~70-instruction call on the device, on every split item's
// path); the same value either way.
GPUOS_HD i64 mm_kspan(i64 K, u32 ksplit, u32 unit) {
  if (K <= 0x7fffffff) return (i64)((((u32)K + ksplit - 1) / ksplit + unit - 1) / unit * unit);
  return ((K + ksplit - 1) / ksplit + unit - 1) / unit * unit;
}
// Decode attention (device_src/attention.h). An item is one (batch, KV head, KV split, group of query rows): the
// group is up to kAttnRowsPerItem of the G x Lq query rows of the KV head's query heads (G = Hq / Hkv). With nsplit > 1
// each item writes its partial (per row: max, sum, D accumulators, fp32) into the attention scratch of its own ring
// slot (kAttnScratchPerSlot floats per ring slot, after the matmul scratch in WorkerArgs::scratch); the op's items
// are consecutive in the ring, and the last of a tile to finish (a counter word in its first slot) combines.
constexpr u32 kAttnScratchPerSlot = 528;
constexpr u32 kAttnScratchHead = 4;   // floats before the partials (the counter word in a tile's first slot)
constexpr u32 kAttnMaxSplit = 64;     // most KV splits of one tile
constexpr u32 kAttnMaxQuery = 16;     // longest query the task takes (decode)
constexpr u32 kAttnMaxHeadDim = 256;
// Query rows per item: a warp holds them in registers (q and the accumulators: 16 per row and lane); with 4 the
// worker's 128-register budget spilled (ptxas: 216-304 bytes per item function, the worker's stack +160 bytes).
constexpr u32 kAttnRowsPerItem = 2;
// AttnArgs::mode bits.
constexpr u32 kAttnCausal = 1u;           // top-left causal (torch): query i sees kv positions j <= i
constexpr u32 kAttnMaskFloat = 2u;        // additive float mask (its DType in mode >> kAttnMaskDtypeShift)
constexpr u32 kAttnMaskBool = 4u;         // boolean mask (1 byte per element; false = masked out)
constexpr u32 kAttnLse = 8u;              // write the log-sum-exp of each row (natural log, fp32)
// Items in tile-major order, item = ((b * Hkv + kh) * row groups + rg) * nsplit + s: a tile's splits are neighbours,
// so a claim may hold a whole tile and combine it in shared memory (attention.h attn_local_*). Without it the row
// groups of one KV slice are neighbours (they read the same K / V rows, mostly from cache).
constexpr u32 kAttnTileMajor = 16u;
// Floats of one item's partial in shared memory (worker.cu BlockFinish::local_part, one slot per warp): a split of
// an attention tile (kAttnTileMajor, head dim <= 128; the scratch slot's layout) or a K slice of a matmul tile
// (kMmLocal: M x tile columns <= kLocalSlot).
constexpr u32 kLocalSlot = kAttnScratchHead + 8 + kAttnRowsPerItem * 128;
constexpr u32 kAttnMaskDtypeShift = 8u;
// Worker state words (HostCtl::worker_state).
constexpr u32 kWorkerExiting = 0;  // not running, or about to exit: the host must launch one
constexpr u32 kWorkerRunning = 1;

}  // namespace gpuos
