// device_src/types.h -- no host-only code, no system #includes.
// The ONE definition of every struct that crosses host <-> device.
#pragma once
#include "device_src/config.h"

namespace gpuos {

// Float dtypes (0-2) are the only ones elementwise ops, reductions, matmuls and fused chains take (the host
// refuses the rest there); the integer dtypes (kI64, kI32, kBool: indices, positions, masks) reach only the
// data-movement ops (ops.def kind 4, device_src/dataops.h).
enum DType : u32 { kF32 = 0, kF16 = 1, kBF16 = 2, kI64 = 3, kI32 = 4, kBool = 5, kNumDTypes = 6 };

// A strided view: pointer, dtype, sizes and strides in elements (dims merged where contiguous).
struct TensorRef {
  u64 ptr;
  u32 ndim;
  u32 dtype;
  i64 sizes[kMaxDims];
  i64 strides[kMaxDims];
};

// One operand of a fused chain, addressed by a one-block broadcast rule over the output's linear index e:
//   offset(e) = ((e / div) % mod) * stride   (mod == 0: no modulo; stride 0: a single element)
// Covers contiguous and stepped operands, scalars, and a broadcast of any contiguous block of dims (bias rows,
// per-row scales). Other layouts are not fused (the scheduler runs those ops unfused).
struct FusedOperand {
  u64 ptr;
  i64 stride;
  u32 div;
  u32 mod;
};

constexpr u32 kFusedMaxOperands = 9;  // out + up to 8 inputs (interp.h kProgMaxInputs)

// Arguments of a fused sub-op; occupies two consecutive TensorRef slots of the arena.
struct FusedArgs {
  FusedOperand opnd[kFusedMaxOperands];  // [0] = out, [1 + k] = program input k
  u8 dtype[kFusedMaxOperands];           // DType per operand
  u8 reserved0[3];
  u32 prog;                              // program id in the device program table
  u32 ninputs;
  u32 reserved1[13];
};

// Arguments of a decode-attention sub-op (op sdpa, device_src/attention.h); occupies one TensorRef slot of the
// arena (SubOp::out points at it). q, k, v are the sub-op's in[0..2] (4-D TensorRefs: B x H x L x D).
struct AttnArgs {
  u64 out;         // B x Hq x Lq x D, strides os
  i64 os[4];
  u64 mask;        // broadcast to B x Hq x Lq x Lk (stride 0 where broadcast), or 0
  i64 ms[4];
  u64 lse;         // B x Hq x Lq fp32 (kAttnLse), or 0
  i64 ls[3];
  u32 B, Hq, Hkv, Lq;
  u32 Lk, D;
  u32 mode;        // kAttn* bits (config.h)
  u32 nsplit;      // KV splits per tile (items of a tile are consecutive in the ring)
};

// Sub-op descriptor flags.
constexpr u32 kFlagStrided = 1u;  // ptr fields point at TensorRefs (device-visible), not data
constexpr u32 kFlagVec = 2u;      // contiguous, tensors of the out dtype (constants allowed), 16-byte aligned
constexpr u32 kFlagFused = 4u;   // op == kOpFused: `out` points at a FusedArgs (device-visible), in[0] = program id
constexpr u32 kFlagConst0 = 1u << 8;  // in[k] holds an fp32 constant (bits in the low word): kFlagConst0 << k
// op mm: every output value goes through an elementwise program of one input (interp.h; the program table's entry
// (flags >> kMmEpiShift) & kMmEpiMask) before it is stored -- an activation chain folded into its matmul
// (sched/lower.cpp): out = prog(round(alpha * a @ b + beta * bias)), `round` to the product's dtype (eager stores
// the product so before the chain reads it; kMmEpiDtShift), out in the chain's output dtype.
constexpr u32 kFlagMmEpilogue = 1u << 12;
constexpr u32 kMmEpiShift = 16, kMmEpiMask = 0x3ffu;
// The product's own dtype (bits 26-27: kF32 / kF16 / kBF16), which each value is rounded to before the program
// runs; the descriptor's out dtype is the group's output's (a cast epilogue: an fp16 LM head's logits .float()).
constexpr u32 kMmEpiDtShift = 26;
// op mm: a lone cast folded (no program): each value rounded to the product's dtype (kMmEpiDtShift), stored in
// out's dtype.
constexpr u32 kFlagMmCast = 1u << 13;
// op mm with kFlagMmEpilogue: a dual product (Llama's silu(gate) * up): refs[3] is a second weight b2 of b's shape
// and layout (no bias), and the program has two inputs: out = prog(round(a @ b), round(a @ b2)). Tensor-core path,
// unsplit, M <= kMmDualMaxRows (Runtime::record_matmul_dual).
constexpr u32 kFlagMmDual = 1u << 14;
// op mm: a prologue (a norm as the matmul's first step: Llama's RMSNorm before q / k / v). The activations `a` are
// a row program's output that no one else reads: refs[1..2] hold that program's FusedArgs (its inputs, in the arena
// as any fused sub-op's) instead of a's TensorRef, refs[3] the weight b (no bias), the program id is the bits of
// scalar[1]. Each item first runs the row program over a's M rows of K into its warp's shared buffer
// (kMmPrologueElems), then multiplies that (matmul.h mm_prologue; Runtime::record_matmul_prologue).
constexpr u32 kFlagMmPrologue = 1u << 15;

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
  u32 reserved;  // op mm: variant | ksplit << 8 (config.h kMm*); kOpFused: a row program's row length (0: a chain)
};

// Lives in pinned, device-mapped host memory. The host writes host_published and yield_request; the worker
// writes worker_state and done[]. (A batch's seq and descriptor count travel in its DevCtl::ready word.) Never in a module global: it outlives every worker generation.
struct HostCtl {
  u32 host_published;  // last seq the host has published (plain CPU store, then a full fence)
  u32 worker_state;    // kWorkerRunning / kWorkerExiting
  u32 yield_request;   // != 0: exit as soon as nothing published is pending
  // Diagnostics (hang reports; the host never waits on them): the launch number of the last worker that started
  // and of the last that exited, and the seq the poller last waited >= 32 polls for.
  u32 worker_started, worker_exited, polling_seq;
  // Standby (one 64-bit host store, read by the poller): low word = the batch the newest standby worker is
  // gated on (its launch waits on the side stream for that batch's ready word), high word = its launch number.
  // A resident worker waiting longer than idle_ns for batch `next` leaves if a later launch is gated on a batch
  // >= next: whatever stream work holds the ready word back may need the device free of resident kernels.
  u64 standby;  // offset 24
  // Sticky flag, set (plain store) by a data-movement sub-op that met an index out of range (device_src/dataops.h:
  // it wrote NaN / 0 instead of reading, or skipped the write); the host reads and clears it (stats: index_faults).
  u32 index_fault;
  // Worker launches that ran at least one batch (the poller's block, at its exit; launches are serial on the
  // side stream): against RuntimeStats::worker_launches, how many were standbys that found nothing and left.
  u32 working_launches;
  // Kicks (WorkerArgs::standby & kStandbyKicks): bumped by the host at each generation handover, after every
  // published batch completed; a kick launched before it (its epoch in the standby word) exits at once.
  u32 module_epoch;
  u32 reserved[5];
  u32 done[kMaxBatches];  // done[seq % kMaxBatches] = seq once the batch has completed
};

// Lives in device memory; the worker's own bookkeeping, persistent across worker launches.
// Ready word of a batch, written by a 64-bit stream memory op on the user's stream:
//   low 32 bits: seq; high 32 bits: descriptor count | kReadyDevRing (descriptors are in the device ring, and the
//   TensorRefs they point at in the device mirror of the arena: WorkerArgs::refs_dev).
constexpr u32 kReadyDevRing = 0x80000000u;
// ... | kReadyResident (with kReadyDevRing): the batch's descriptors are not in the ring but at DevCtl::bdesc[slot]
// (a program's resident image, issue #17), written by the host's stream memop before the ready word.
constexpr u32 kReadyResident = 0x40000000u;
// ... | kReadyProgram (with both above): one doorbell for a run of `count` resident levels of a program (issue
// #17): bdesc[slot] holds the address of their ProgLevel table in device memory; they take the seqs seq ..
// seq + count - 1, and the poller fills those slots from the table itself (no ready words of their own).
constexpr u32 kReadyProgram = 0x20000000u;
// ... | kReadyJoin: the batch runs beside the one before it (the host's hazard model found nothing between them:
// an early publication's next piece of the same level, Runtime::append_tiles): it waits only for what that batch
// waited for (DevCtl::bdep), and its done word still lands after that batch's (done words stay in seq order).
constexpr u32 kReadyJoin = 0x10000000u;
constexpr u32 kReadyFlags = kReadyDevRing | kReadyResident | kReadyProgram | kReadyJoin;
// One level of a program's resident image (Runtime::prepare_image uploads the table beside the descriptors).
struct ProgLevel {
  u64 desc;   // SubOp* of the level's first resident descriptor
  u32 count;  // descriptors
  u32 home;   // 0, or the level's home blocks (kHome*: only they claim it; walk.h home_skips)
};
// Sub-op descriptors one claim on a batch of `count` takes, for a block of `nwarps` warps in a grid of `grid`
// blocks (walk.h claim_next; core/tape.cpp piece_homes sizes a home with it): kClaimPerWarp per warp amortise a
// claim's latency over small sub-ops, but a batch of few claims per block leaves blocks idle (an early publication
// of 1,024 sub-ops fed 32 of 132) and ends on the slowest one: fewer per warp until there are >= 4 claims per
// block. (Any size is correct: the executing block uses the size it claimed.)
GPUOS_HD constexpr u32 claim_size(u32 count, u32 grid, u32 nwarps) {
  const u32 cpw = count / (grid * nwarps * 4);
  return nwarps * (cpw < 1 ? 1 : cpw > kClaimPerWarp ? kClaimPerWarp : cpw);
}
// A level's home (ProgLevel::home, DevCtl::bhome): blocks first .. first + span - 1 on the ring of the bounded grid's
// blocks 1 .. nb - 1 (home_has) claim it, no other block does. Runtime::prepare_image gives every level of one kind of work (op, flags, fused program)
// the same blocks, so that kind's code stays in those SMs' instruction caches (a level's sub-op run on an SM whose
// cache does not hold its code cost 2-6 us more: tools/warp_bench.cu, twenty-fifth session).
constexpr u32 kHomeSpanShift = 16;  // home = first | span << 16 (first < 2^16, span >= 1); 0: every block claims
GPUOS_HD constexpr u32 home_word(u32 first, u32 span) { return first | span << kHomeSpanShift; }
// Whether block b of a bounded grid of nb blocks claims a level of home word `home`: homes are ranges on the ring of
// blocks 1 .. nb - 1 (block 0 polls); a level without a home (0, or one the ring cannot hold) is every block's.
GPUOS_HD bool home_has(u32 home, u32 nb, u32 b) {
  const u32 span = home >> kHomeSpanShift, first = home & ((1u << kHomeSpanShift) - 1);
  if (home == 0 || nb < 2 || span == 0 || span >= nb - 1 || first == 0) return true;
  if (b == 0 || b >= nb) return false;
  const u32 ring = nb - 1;
  return (b - 1 + ring - (first - 1) % ring) % ring < span;
}

// Dual-slot alias table (issue #5): every op id has two physical slots (0: built-in functor or the op's
// registered code, 1: an installed alternative). Two versions of the per-op choice: the host rewrites the
// version not in use (only once no batch that may have read it is still running), then flips `ver`. The
// poller copies `ver` into bver[] when it fills a batch's slot and warps read slot[bver & 1][op]: a batch, and with
// it every sub-op, runs wholly on one version. Lives in DevCtl (device memory; GPU reads of pinned memory
// cost ~1 us each, DESIGN F5) and so outlives every generation.
constexpr u32 kAliasActive = 2u;  // `ver` bit: some op selects slot 1 in the version in use
struct AliasCtl {
  u32 ver;                  // bit 0: version in use; kAliasActive: that version is not all slot 0
  u32 reserved[31];
  u32 bver[kMaxBatches];    // `ver` as the poller saw it when it filled the batch in this slot
  u8 slot[2][256];          // slot[version][op id]: 0 or 1 (indexed by u8 op ids, kMaxOps < 256)
};

struct DevCtl {
  u64 ready[kMaxBatches];      // see kReadyDevRing
  u64 claim[kMaxBatches];      // (seq << 32) | next descriptor index of the batch in this slot (set when filled)
  u64 bdesc[kMaxBatches];      // SubOp* of a kReadyResident batch (host-written before its ready word)
  u32 remaining[kMaxBatches];  // sub-ops of the batch not yet finished
  u32 bstart[kMaxBatches];
  u32 bcount[kMaxBatches];
  u32 bsrc[kMaxBatches];       // 1: descriptors in the device ring, 0: read them from the pinned ring, 2: at bdesc
  u32 bseq[kMaxBatches];       // = seq once the poller has filled the slot (the fields above, claim, bver)
  u32 done[kMaxBatches];       // = seq once the batch completed: what the next batch's blocks and stream waits
                               // poll (device memory is polled faster than the pinned HostCtl::done the host reads)
  u32 bdep[kMaxBatches];       // the batch's claims wait until every batch up to this one has completed: seq - 1,
                               // or for a kReadyJoin batch the bdep of the batch before it (set when filled)
  u32 bhome[kMaxBatches];      // the batch's home blocks (ProgLevel::home; 0 for every batch outside a program run)
  u64 bsh[kMaxBatches];        // (seq << 32) | bhome, stored with bseq (walk.h mark_filled): what a block reads to
                               // pass levels homed elsewhere
  u32 next_seq;                // next batch the poller fills (stored when a launch exits; read when one starts)
  u32 exit_flag;               // grid-wide: poller decided to exit
  u32 ring_pos;                // ring index where the next batch starts (batches are contiguous)
  u32 shrink;                  // = launch gen: blocks >= WorkerArgs::keep_blocks leave (poller: stuck on a batch
                               // published but not ready, maybe behind stream work that needs their SMs)
  u32 owner;                   // kicks: the gen of the launch that polls (fills slots), 0: none (walk.h take_token)
  u32 kicks_done;              // kicks that have exited (the host waits for all of them before freeing this)
  u32 reserved[26];
  AliasCtl alias;              // dual-slot alias table (zero = every op on slot 0)
};

struct WorkerArgs {
  u64 host_ctl;   // HostCtl* (device pointer of the mapped pinned block)
  u64 dev_ctl;    // DevCtl*
  u64 ring;       // SubOp* (device pointer of the pinned descriptor ring)
  u64 ring_dev;   // SubOp* device-memory mirror (filled by DMA or memops for batches flagged kReadyDevRing)
  u32 capacity;   // ring slots
  u32 gen;        // launch number: DevCtl::exit_flag == gen tells this launch's blocks to exit
  u64 idle_ns;    // exit after this long with nothing published
  u64 progs;      // Program* device program table (interp.h; fused sub-ops)
  u64 trace;      // TraceBuf* (device pointer of a mapped pinned block), 0: tracing off
  u32 keep_blocks;  // blocks that stay when the grid shrinks (the bounded grid; DevCtl::shrink)
  u32 standby;      // kStandby* flags: launched gated on a ready word (HostCtl::standby); leave at once if nothing
                    // is published
  u64 refs;       // TensorRef* arena (device pointer of the pinned block) that descriptors point into
  u64 refs_dev;   // its device-memory mirror: batches flagged kReadyDevRing read their TensorRefs here
  u64 scratch;    // float[(capacity + kMmMaxSplit) * kMmScratchPerSlot], zeroed: split-K matmul partials
  u32 handover;   // standby launches queued behind this one at which it leaves once idle (0: never)
  u32 trace_records;  // TraceBuf::per_block when tracing (a copy in the kernel's parameters: a traced item must
                      // not read the mapped host block after its last timestamp -- ~1,000 such reads at once
                      // stretched every claim's tail by 10-20 us, thirty-seventh session)
  u32 kick_first, kick_last;  // a kick with kStandbyKickWait: the first and last batch of its publication
};

// WorkerArgs::standby. kStandbyGated: the launch waited on the side stream for a ready word (HostCtl::standby):
// if it finds nothing to run (the resident worker ran that batch) it leaves. kStandbyFirstLook: it decides so at
// its first idle poll, not after the 32 polls an idle worker spends between exit checks (~1 us each): a back-to-back
// program loop runs one such launch per call on the side stream (Runtime::publish, step 1b), and each cost ~90 us
// of device time before (W5 1x256, 1,000 calls, H200: 174 vs 84 us per call; _testing.set_standby_first_look).
constexpr u32 kStandbyGated = 1, kStandbyFirstLook = 2;
// Kicks (Config::kicks; docs/design/programs.md *Kicks*). kStandbyKicks: the runtime covers every publication with a
// kick instead of a gated standby, so the poller role is a token (DevCtl::owner) and a resident worker leaves after
// idle_ns whatever is published. kStandbyKick: this launch is a kick -- one block on the publishing stream, behind
// its ready words: it exits at once unless it takes the token; with it, it runs what has landed and exits. The
// module epoch (HostCtl::module_epoch) it was launched under sits above kStandbyEpochShift.
constexpr u32 kStandbyKick = 4, kStandbyKicks = 8, kStandbyEpochShift = 8;
// kStandbyKickWait (Config::kick_wait, GPUOS_KICK_WAIT): a kick that finds the token held stays until its
// publication's last batch (WorkerArgs::kick_last) is done, running claims -- its stream then passes its wait word
// at once, where the stream's wait on the done word is otherwise released late (the caller's stream round trip,
// *Kicks* in docs/design/programs.md). It waits only for batches already filled (runnable by its own block, so it
// depends on no other stream's progress), and for the fill at most kKickFillWaitNs; otherwise it leaves as before.
constexpr u32 kStandbyKickWait = 16;
constexpr u64 kKickFillWaitNs = 20000;
// A kick's claim, fill and launch records go to the trace region of the last traced block (a worker's grid never reaches
// it), not to block 0's and the poller's, which a worker running beside the kick writes (the regions' counts are
// plain stores: one writer each; kicks alive at once on several streams share it, and may lose records).
constexpr u32 kTraceKicks = 255;

// Claim trace (GPUOS_TRACE=<records per block>; tools/worker_trace.py): thread 0 of block b appends one record
// per claim it ran to its own region (no atomics on host memory), then bumps count[b]; the poller's batch
// slot fills go to region kTraceBlocks. Pinned and mapped: the host reads it without a copy. Region kTraceItems
// holds one record per traced item (decode attention, split matmul: lane 0 of the warp that ran it), at its ring index modulo
// per_block (each ring slot's warp writes its own record: no index word; the host takes the records whose t0 is
// set and clears them) -- since the 21st session every sub-op leaves one in the worker built for GPUOS_TRACE, at its
// FinishNote::tslot (worker.cu item_rec: a resident level's first 61 by the level's seq, so that a replayed
// program's levels keep apart).
constexpr u32 kTraceBlocks = 256;    // blocks traced (block index >= this: not traced)
static_assert(kTraceKicks < kTraceBlocks, "the kicks' trace region is one of the traced blocks'");
constexpr u32 kTraceItems = kTraceBlocks + 1, kTraceRegions = kTraceBlocks + 2;
constexpr u32 kTraceOpen = 0xffffffffu;  // TraceRec::block of a batch-filling record
constexpr u32 kTraceItem = 0xfffffffeu;  // TraceRec::block of a sub-op record: seq = the SM, idx = the ring
                                         // index; decode attention / mma / ncol matmul items: k = 1 if the item
                                         // also combined its tile's splits, load_ns = the item, exec_ns = the
                                         // combine; fused chains k = 2 (tier 2) / 3 (interpreter), other kinds
                                         // k = 4 + kind: load_ns = arguments fetched, exec_ns = the rest
constexpr u32 kTraceLaunch = 0xfffffffdu;  // TraceRec::block of a launch record (the poller's region): seq = the
                                           // launch's gen; k = 0 its start (idx = the first batch it looks for,
                                           // load_ns = WorkerArgs::standby), k = 1 its exit (idx = the first batch
                                           // it did not fill; k = 3 if it ran work)
struct TraceRec {
  u64 t0;         // %globaltimer (ns) at the claim (fill record: when the poller filled the batch's slot)
  u32 load_ns;    // claim -> its descriptors in shared memory and the previous batch complete
  u32 exec_ns;    // descriptors loaded -> every warp done (block barrier)
  u32 block;      // blockIdx.x, or kTraceOpen
  u32 seq;        // batch
  u32 idx;        // first descriptor index of the claim within the batch
  u32 k;          // descriptors claimed (fill record: the batch's count)
};
struct TraceBuf {
  u32 per_block;  // records per region
  u32 reserved[15];
  u32 count[kTraceRegions];  // records written per region (may exceed per_block: the rest were dropped)
  u32 pad[14];
  // TraceRec rec[kTraceRegions * per_block] follows (region r starts at rec + r * per_block)
};

// Element offsets (in elements) of the linear indices e0, e0 + step, ... (U of them) of r's shape: the one address
// walk of strided operands (the worker's elementwise and data ops, the host's CPU checks). The U walks are
// independent chains of divisions, interleaved: one warp's strided loop was bound by the latency of one walk per
// element and operand (eleventh session, warp_bench: ~2,000 cycles per element of a transposed fp32 add).
template <u32 U>
struct RefOffs {
  i64 v[U];
};
template <u32 U>
GPUOS_HD RefOffs<U> ref_offsets(const TensorRef& r, i64 e0, u32 step) {
  RefOffs<U> o;
  for (u32 u = 0; u < U; ++u) o.v[u] = 0;
  if (r.ndim == 0) return o;
  if ((((u64)e0 + (u64)step * (U - 1)) >> 32) == 0) {  // 32-bit divisions: a fraction of the 64-bit instructions
    u32 l[U];
    for (u32 u = 0; u < U; ++u) l[u] = (u32)e0 + step * u;
    for (int d = (int)r.ndim - 1; d > 0; --d) {
      const u64 s = (u64)r.sizes[d];
      const i64 st = r.strides[d];
      for (u32 u = 0; u < U; ++u) {
        const u32 q = (s >> 32) ? 0u : l[u] / (u32)s;
        o.v[u] += (i64)(l[u] - q * (u32)s) * st;
        l[u] = q;
      }
    }
    for (u32 u = 0; u < U; ++u) o.v[u] += (i64)l[u] * r.strides[0];
    return o;
  }
  for (u32 u = 0; u < U; ++u) {
    i64 linear = e0 + (i64)step * u;
    for (int d = (int)r.ndim - 1; d > 0; --d) {
      const i64 s = r.sizes[d];
      const i64 q = linear / s;
      o.v[u] += (linear - q * s) * r.strides[d];
      linear = q;
    }
    o.v[u] += linear * r.strides[0];
  }
  return o;
}
// One offset, and four at once (indices e0 + 32 u: a lane's elements of the strided loops). Out of line on the
// device: inlined at each call site, the walk's divisions grew the worker's cubin by 160 KB (a generation handover
// loads the whole module).
#if defined(GPUOS_DEVICE_COMPILE)
#define GPUOS_REF_FN static __host__ __device__ __noinline__
#else
#define GPUOS_REF_FN inline
#endif
GPUOS_REF_FN i64 ref_offset(const TensorRef& r, i64 linear) { return ref_offsets<1>(r, linear, 0).v[0]; }
GPUOS_REF_FN RefOffs<4> ref_offset4(const TensorRef& r, i64 e0) { return ref_offsets<4>(r, e0, 32); }
#undef GPUOS_REF_FN

static_assert(sizeof(TensorRef) == 16 + 16 * kMaxDims, "TensorRef layout");
static_assert(sizeof(FusedOperand) == 24, "FusedOperand layout");
static_assert(sizeof(FusedArgs) == 2 * sizeof(TensorRef), "FusedArgs must fill exactly two TensorRef arena slots");
static_assert(sizeof(AttnArgs) == sizeof(TensorRef), "AttnArgs fills exactly one TensorRef arena slot");
static_assert(sizeof(SubOp) == 64, "SubOp must stay 64 bytes (4 x 16-byte loads)");
static_assert(sizeof(HostCtl) == 64 + 4 * kMaxBatches, "HostCtl layout");
static_assert(sizeof(WorkerArgs) == 112, "WorkerArgs layout");
static_assert(sizeof(TraceRec) == 32 && sizeof(TraceBuf) % 16 == 0, "trace layout");
static_assert((kMaxBatches & (kMaxBatches - 1)) == 0, "kMaxBatches must be a power of two");
static_assert(sizeof(AliasCtl) == 128 + 4 * kMaxBatches + 512 && kMaxOps < 256, "AliasCtl layout");

}  // namespace gpuos

#if !defined(__CUDACC_RTC__)  // NVRTC has no offsetof; the host compile checks the shared layout
namespace gpuos {
static_assert(__builtin_offsetof(SubOp, out) == 16 && __builtin_offsetof(SubOp, scalar) == 48, "SubOp offsets");
static_assert(__builtin_offsetof(HostCtl, done) == 64 && __builtin_offsetof(HostCtl, standby) == 24, "HostCtl offsets");
static_assert(__builtin_offsetof(DevCtl, alias) % 16 == 0 && __builtin_offsetof(AliasCtl, slot) % 16 == 0,
              "alias table rows are read as 16-byte aligned words");
}  // namespace gpuos
#endif
