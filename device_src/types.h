// device_src/types.h -- no host-only code, no system #includes.
// The ONE definition of every struct that crosses host <-> device.
#pragma once
#include "device_src/config.h"

namespace gpuos {

enum DType : u32 { kF32 = 0, kF16 = 1, kBF16 = 2, kNumDTypes = 3 };

// A strided view: pointer, dtype, sizes and strides in elements (dims merged where contiguous).
struct TensorRef {
  u64 ptr;
  u32 ndim;
  u32 dtype;
  i64 sizes[kMaxDims];
  i64 strides[kMaxDims];
};

// Sub-op descriptor flags.
constexpr u32 kFlagStrided = 1u;  // ptr fields point at TensorRefs (device-visible), not data
constexpr u32 kFlagVec = 2u;      // contiguous, one dtype, every pointer 16-byte aligned: vector loads
constexpr u32 kFlagConst0 = 1u << 8;  // in[k] holds an fp32 constant (bits in the low word): kFlagConst0 << k

// One sub-op tile. Elementwise: out[base .. base+n) = op(in0, in1, in2; scalar0, scalar1) over the linear
// index of out's shape. Reduction: rows [base, base+n) of the input's last-dim rows (refs always).
// 64 bytes: 4 coalesced 16-byte loads.
struct SubOp {
  u32 op;        // op id (device_src/ops.def)
  u32 flags;     // kFlag*
  u32 n;         // elements in this tile
  u32 base;      // first linear element index of the tile
  u64 out;       // data pointer, or TensorRef* if kFlagStrided
  u64 in[3];     // same, per input
  float scalar[2];
  u32 dtype;     // packed DType per operand: out | in0 << 8 | in1 << 16 | in2 << 24
  u32 reserved;
};

// Lives in pinned, device-mapped host memory. The host writes host_published and yield_request; the worker
// writes worker_state and done[]. (A batch's seq and descriptor count travel in its DevCtl::ready word.) Never in a module global: it outlives every worker generation.
struct HostCtl {
  u32 host_published;  // last seq the host has published (plain CPU store, then a full fence)
  u32 worker_state;    // kWorkerRunning / kWorkerExiting
  u32 yield_request;   // != 0: exit as soon as nothing published is pending
  u32 reserved[13];
  u32 done[kMaxBatches];  // done[seq % kMaxBatches] = seq once the batch has completed
};

// Lives in device memory; the worker's own bookkeeping, persistent across worker launches.
// Ready word of a batch, written by a 64-bit stream memory op on the user's stream:
//   low 32 bits: seq; high 32 bits: descriptor count | kReadyDevRing (descriptors are in the device ring).
constexpr u32 kReadyDevRing = 0x80000000u;

struct DevCtl {
  u64 ready[kMaxBatches];      // see kReadyDevRing
  u32 remaining[kMaxBatches];  // sub-ops of the batch not yet finished
  u32 bstart[kMaxBatches];
  u32 bcount[kMaxBatches];
  u32 bsrc[kMaxBatches];       // 1: descriptors in the device ring, 0: read them from the pinned ring
  u64 claim;                   // (seq << 32) | next descriptor index of the open batch
  u32 next_seq;                // next batch the worker will open
  u32 epoch;                   // seq of the batch last opened for the grid
  u32 exit_flag;               // grid-wide: poller decided to exit
  u32 ring_pos;                // ring index where the next batch starts (batches are contiguous)
  u32 reserved[10];
};

struct WorkerArgs {
  u64 host_ctl;   // HostCtl* (device pointer of the mapped pinned block)
  u64 dev_ctl;    // DevCtl*
  u64 ring;       // SubOp* (device pointer of the pinned descriptor ring)
  u64 ring_dev;   // SubOp* device-memory mirror (filled by DMA or memops for batches flagged kReadyDevRing)
  u32 capacity;   // ring slots
  u32 gen;        // launch number: DevCtl::exit_flag == gen tells this launch's blocks to exit
  u64 idle_ns;    // exit after this long with nothing published
};

static_assert(sizeof(TensorRef) == 16 + 16 * kMaxDims, "TensorRef layout");
static_assert(sizeof(SubOp) == 64, "SubOp must stay 64 bytes (4 x 16-byte loads)");
static_assert(sizeof(HostCtl) == 64 + 4 * kMaxBatches, "HostCtl layout");
static_assert(sizeof(WorkerArgs) == 48, "WorkerArgs layout");
static_assert((kMaxBatches & (kMaxBatches - 1)) == 0, "kMaxBatches must be a power of two");

}  // namespace gpuos

#if !defined(__CUDACC_RTC__)  // NVRTC has no offsetof; the host compile checks the shared layout
namespace gpuos {
static_assert(__builtin_offsetof(SubOp, out) == 16 && __builtin_offsetof(SubOp, scalar) == 48, "SubOp offsets");
static_assert(__builtin_offsetof(HostCtl, done) == 64, "HostCtl offsets");
}  // namespace gpuos
#endif
