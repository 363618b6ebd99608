// device_src/worker.cu -- no host-only code, no system #includes. CUDA-only: the elastic persistent worker.
//
// One launch = one bounded grid. Block 0 thread 0 is the grid's only poller: between its own claims it watches the
// per-batch ready words in device memory (written by a stream memory op on the user's stream, so a batch runs only
// after the stream work before its flush), fills each landed batch's slot (its header, a fresh claim word), and
// exits after an idle period with nothing published (Dekker handshake with the host: see HostCtl).
// Every block walks the batches (= dependency levels) itself (see *the level walk* below): it claims descriptors of
// the next filled batch in chunks, copies them into shared memory with coalesced 16-byte loads, waits for the
// previous batch to complete, and runs one sub-op per warp. The block that finishes the last chunk of a batch
// signals completion once, into device memory (the next level, stream waits) and pinned memory (the host).
#include "device_src/config.h"
#include "device_src/types.h"
#include "device_src/numeric.h"
#include "device_src/functors.h"
#include "device_src/interp.h"
#include "device_src/elementwise.h"  // ew_op, the element access helpers, tier-2 fused_spec_op
#include "device_src/user_ops.h"  // this generation's injected ops (issue #5); generated per generation

namespace gpuos {

constexpr u32 kMaxWarps = kMaxThreads / 32;
// Every sub-op leaves a trace record (exec_subop) only in the worker built for GPUOS_TRACE (csrc/jit/jit.cpp
// compile_options); decode attention and split matmul items record themselves in every build.
#ifndef GPUOS_TRACE_SUBOPS
#define GPUOS_TRACE_SUBOPS 0
#endif
constexpr bool kTraceSubops = GPUOS_TRACE_SUBOPS != 0;
constexpr u32 kWarpSlots = 5;  // per-warp TensorRef slots in shared memory: 4 operand refs, or FusedArgs + Program
static_assert(sizeof(FusedArgs) + sizeof(Program) <= kWarpSlots * sizeof(TensorRef), "fused scratch fits");
constexpr u32 kCmdRun = 1, kCmdExit = 2;

__device__ __forceinline__ u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Message passing between blocks (a level's writes, then its counter; split-K partials, then the tile counter)
// needs release / acquire ordering only: fence.acq_rel, not __threadfence()'s fence.sc (sequentially consistent,
// a heavier MEMBAR). Only the host<->worker handshakes (Dekker, done words) keep __threadfence[_system].
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// Barrier of n threads (whole warps) on named barrier id (0 is __syncthreads()'s): a group of the block's warps.
__device__ __forceinline__ void bar_sync(u32 id, u32 n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ u32 ld_vol(const u32* p) { return *(const volatile u32*)p; }
__device__ __forceinline__ void st_vol(u32* p, u32 v) { *(volatile u32*)p = v; }
__device__ __forceinline__ u64 ld_vol64(const u64* p) { return *(const volatile u64*)p; }
__device__ __forceinline__ uint4 ld_cg4(const void* p) {  // L2 only: the device ring is rewritten per batch
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_vol4(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace gpuos
#include "device_src/reduce.h"
namespace gpuos {

// ---------------------------------------------------------------- fused programs (interpreter tier)
// A fused chain (out[e] = program(in_0[e], ..., in_k[e])) or row program run by the interpreter: any never-seen
// program runs at once (elementwise.h fused_rows: the element loop and the row passes). A lane takes kInterpVec
// elements at once (run_program_v: their loads and register traffic overlap).
constexpr u32 kInterpVec = 4;
__device__ __noinline__ void fused_prog_op(const SubOp& d, const FusedArgs& fa, const Program& p, u32 lane) {
  u32 rop[kRowMaxRed];
  float rscale[kRowMaxRed];
  const u32 nred = d.reserved ? row_reductions(p, rop, rscale) : 0u;
  const u32 nin = p.ninputs < kProgMaxInputs ? p.ninputs : kProgMaxInputs;
  fused_rows<kInterpVec, kProgMaxRegs>(d, fa, nin, nred, rop, rscale, lane,
                                       [&p](float (*r)[kInterpVec], float* val, const float* red, u32 stop) {
                                         run_program_v<kInterpVec>(p, r, val, red, stop);
                                       });
}

__device__ __forceinline__ bool exec_fused_spec(const SubOp& d, const FusedArgs& fa, u32 prog, u32 lane) {
#if GPUOS_USER_OPS_LINKED  // linked generation (issue #18): the dispatch object of device_src/linked.h
  return gpuos_linked_fused_exec(&d, &fa, prog, lane);
#else
  switch (prog) {
#define GPUOS_FUSED_CASE(id, F) \
  case id:                      \
    fused_spec_op<F>(d, fa, lane); \
    return true;
    GPUOS_FUSED_SPECS(GPUOS_FUSED_CASE)
#undef GPUOS_FUSED_CASE
    default: break;
  }
  return false;
#endif
}

// A matmul's activation epilogue (matmul.h mm_epi): one value (a dual item's pair: x0, x1) through tier 2's code
// for program `prog`; false when this generation has none (the interpreter runs it).
__device__ bool epi_spec(u32 prog, float x0, float x1, float* y) {
#if GPUOS_USER_OPS_LINKED
  return gpuos_linked_epi_eval(prog, x0, x1, y);
#else
  float in[kProgMaxInputs] = {x0, x1};
  switch (prog) {
#define GPUOS_EPI_CASE(id, F) \
  case id:                    \
    *y = F::eval(in);         \
    return true;
    GPUOS_FUSED_SPECS(GPUOS_EPI_CASE)
#undef GPUOS_EPI_CASE
    default: break;
  }
  (void)in;
  return false;
#endif
}

// A fused sub-op's FusedArgs (pinned arena) and Program (device table) go into the warp's shared slots:
// FusedArgs in slots 0-1, the Program from slot 2 on (slots 2-4). Tags in cached[] keep a later strided
// sub-op of the same claim from mistaking those bytes for its TensorRefs.
constexpr u64 kProgTag = 1ull << 63;
__device__ __forceinline__ void fetch_fused_args(const SubOp& d, TensorRef* refs, u64* cached, u32 lane, i64 rd) {
  if (cached[0] != d.out) {
    for (u32 w = lane; w < sizeof(FusedArgs) / 4; w += 32) ((u32*)&refs[0])[w] = ld_vol((const u32*)(d.out + rd) + w);
    cached[0] = d.out;
  }
  cached[1] = kProgTag;  // slot 1 holds the second half of the FusedArgs
  __syncwarp();
}

// Returns 2 when tier 2 ran it, 3 for the interpreter (the trace's k); t1 (trace on): when its arguments (and the
// interpreter's Program) were in shared memory.
__device__ __forceinline__ u32 exec_fused(const SubOp& d, TensorRef* refs, u64* cached, u32 lane,
                                          const Program* progs, i64 rd, u64* t1) {  // t1: in the FinishNote
  const u32 prog = (u32)d.in[0];
  fetch_fused_args(d, refs, cached, lane, rd);
  if (t1 && lane == 0) *t1 = globaltimer();
  if (exec_fused_spec(d, *(const FusedArgs*)&refs[0], prog, lane)) {
    __syncwarp();
    return 2;
  }
  Program* sp = (Program*)&refs[2];
  if (cached[2] != (kProgTag | prog)) {
    const u32* src = (const u32*)(progs + prog);
    for (u32 w = lane; w < sizeof(Program) / 4; w += 32) ((u32*)sp)[w] = __ldcg(src + w);
    cached[2] = cached[3] = kProgTag | prog;
  }
  __syncwarp();
  if (t1 && lane == 0) *t1 = globaltimer();
  fused_prog_op(d, *(const FusedArgs*)&refs[0], *sp, lane);
  __syncwarp();  // the next sub-op of this warp may overwrite the slots
  return 3;
}

// Copy the TensorRefs a strided sub-op points at into this warp's shared slots (skipped when unchanged).
// rd: added to each pointer when the batch's TensorRefs were copied into the device mirror (see run_claims).
__device__ __forceinline__ void fetch_refs(const SubOp& d, TensorRef* refs, u64* cached, u32 lane, i64 rd) {
  constexpr u32 kWords = sizeof(TensorRef) / 4;
  for (u32 k = 0; k < 4; ++k) {
    if (k > 0 && (d.flags & (kFlagConst0 << (k - 1)))) continue;
    const u64 src = k == 0 ? d.out : d.in[k - 1];
    if (src == 0 || cached[k] == src) continue;
    for (u32 w = lane; w < kWords; w += 32) ((u32*)&refs[k])[w] = ld_vol((const u32*)(src + rd) + w);
    cached[k] = src;
  }
  __syncwarp();
}

// A warp's first sub-op of a claim: its TensorRefs (or FusedArgs) into the warp's slots while the block still
// waits for the previous level (they are the host's, immutable while the batch is in flight); execution finds
// them cached.
__device__ __forceinline__ void prefetch_refs(const SubOp& d, TensorRef* refs, u64* cached, u32 lane, i64 rd) {
  if (d.op == kOpFused) fetch_fused_args(d, refs, cached, lane, rd);
  else if (d.flags & kFlagStrided) fetch_refs(d, refs, cached, lane, rd);
}

// A split item's note (shared memory, one per descriptor of the claim). run_claim sets local / c0 / ck and zeroes
// the counts before the items run. Decode attention leaves either its tile's counter (global path) or, when the
// claim holds its whole tile (kAttnTileMajor order), head = 1 on the tile's split 0 (local path: partials in shared
// memory, combined by that warp in run_claim's finish phase -- no counter, fence or L2 round trip). A kMmLocal
// matmul tile's K slices count themselves off in their slice 0's `arrived` and the last one combines at once
// (matmul.h mm_finish_local: no finish phase); a matmul's global path finishes inside its item too.
struct FinishNote {
  u64 counter;    // global path (attention): device address of the tile's u32 counter (0: nothing to count)
  float* local;   // this descriptor's partial slot in BlockFinish::local_part, or nullptr (no local path here)
  u32 expected;   // global path (attention): the tile's items
  u32 head;       // local path (attention): 1 on the split 0 of a tile this claim combines
  u32 c0, ck;     // the claim: its first descriptor's ring index and its number of descriptors
  u32 tslot;      // trace on: the index of this sub-op's record in the trace (item_rec; run_claim computes it)
  u32 arrived;    // local matmul path, on a tile's slice 0: how many of its K slices have left their partial
  u16* pro;       // the running warp's prologue buffer (BlockFinish::pro; kFlagMmPrologue)
  u64 t0, t1;     // trace on: the sub-op's start and when its arguments were in shared memory (kept here, not in
                  // registers live across the dispatch: the untraced worker's spills stay as they were)
};
// What the finish phase needs in shared memory: the notes, the tiles this block completed, the warps' sums, the
// local path's partials (one slot per warp: the local path needs one descriptor per warp).
struct BlockFinish {
  FinishNote note[kMaxWarps * kClaimPerWarp];
  u32 todo;   // bit di: this block completed sub-op di's tile (global path)
  u32 split;  // bit di: sub-op di may leave a note (may_split): no bit, no finish phase
  u32 ltodo;  // bit di: sub-op di is split 0 of a tile combined locally
  u32 pad;
  float red[kMaxWarps * kAttnRowsPerItem * 128];
  __align__(16) float local_part[kMaxWarps][kLocalSlot];
  __align__(16) u16 pro[kMaxWarps][kMmPrologueElems];  // a matmul prologue's activations (one buffer per warp)
};
static_assert(kMaxWarps * kClaimPerWarp <= 32, "one lane of warp 0 per claimed descriptor");

// One item's record in region kTraceItems (lane 0 of the warp that ran it; its ring slot is its own). No fence of
// its own (a system-scope fence per item made the claims' tails several times longer): the host reads the records
// after the batch's done word, which the claim's release and the last block's system fence order after them.
// `rec`: FinishNote::tslot, the record's index from the first region's start (item_slot); nothing here reads the
// mapped host block (its per_block word is in WorkerArgs::trace_records).
constexpr u32 kTraceLevelSlots = 61;
__device__ __forceinline__ TraceRec* item_rec(TraceBuf* tb, u32 rec) { return (TraceRec*)(tb + 1) + rec; }
// The record index of the sub-op at ring index ri (claim position idx + j of batch seq) in region kTraceItems: the
// ring index modulo per_block, or for the first kTraceLevelSlots resident descriptors of a level (a replayed
// program's levels all count from 0) seq x kTraceLevelSlots + the position, so that small levels keep apart; the
// rest of a large resident level keep their ring index (later levels overwrite them, as before).
__device__ __forceinline__ u32 item_slot(u32 per_block, bool resident, u32 seq, u32 pos, u32 ri) {
  const u32 slot = resident && pos < kTraceLevelSlots ? seq * kTraceLevelSlots + pos : ri;
  return kTraceItems * per_block + slot % per_block;
}
__device__ __noinline__ void trace_item(TraceBuf* tb, u32 slot, u32 ri, u64 t0, u64 t1, u64 t2, u32 k) {
  u32 sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  TraceRec* rec = item_rec(tb, slot);
  rec->load_ns = (u32)(t1 - t0);
  rec->exec_ns = (u32)(t2 - t1);
  rec->block = kTraceItem;
  rec->seq = sm;
  rec->idx = ri;
  rec->k = k;
  rec->t0 = t0;  // the host takes records whose t0 is set
}
// The traced worker's matmul / attention items (kTraceSubops) pack the dispatch ahead of their first timestamp into
// their record's k above the kind byte: bits [8, 16) exec_subop's arguments in shared memory (FinishNote::t1) -> the
// item function's entry, [16, 24) a matmul prologue (the row program: kFlagMmPrologue), [24, 32) the item's
// arguments and tile arithmetic up to its first timestamp; 16-ns units (the prologue's 128), saturated at 255
// (tools/worker_trace.py item_lead). The untraced worker records kind bytes only.
__device__ __forceinline__ u32 lead_units(u64 ns, u32 shift) {
  const u64 u = ns >> shift;
  return u > 255u ? 255u : (u32)u;
}
__device__ __forceinline__ u32 lead_bits(u64 t_args, u64 t_entry, u64 t_pro, u64 t_first) {
  if (!kTraceSubops || t_args == 0 || t_entry < t_args) return 0u;
  return lead_units(t_entry - t_args, 4) << 8 | lead_units(t_pro - t_entry, 7) << 16 |
         lead_units(t_first - t_pro, 4) << 24;
}
// The kind (ops.def) of a built-in op id; fused chains, injected ops and unknown ids: kKindEw.
__device__ __forceinline__ constexpr u32 op_kind(u32 op) {
  switch (op) {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  case id:                                                              \
    return kind;
#include "device_src/ops.def"
#undef GPUOS_OP
    default: return kKindEw;
  }
}
// How many of ops.def's rows are of kind k.
__device__ __forceinline__ constexpr u32 ops_of_kind(u32 k) {
  u32 n = 0;
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) n += (kind) == k ? 1u : 0u;
#include "device_src/ops.def"
#undef GPUOS_OP
  return n;
}
// Whether a sub-op may leave a FinishNote for the finish phase: a decode attention split over kv ranges (a split-K
// matmul item finishes its tile inside the item on either path: mm_finish, mm_finish_local).
__device__ __forceinline__ bool may_split(const SubOp& d) { return op_kind(d.op) == kKindAttention; }
// The finish phase's time for the item at ring index ri (its record, written before the claim's barrier).
__device__ __noinline__ void trace_finish(TraceBuf* tb, u32 slot, u64 t0, u64 t1) {
  TraceRec* rec = item_rec(tb, slot);
  rec->exec_ns = (u32)(t1 - t0);
  rec->k = kTraceSubops ? (rec->k & ~0xffu) | 1u : 1u;  // the item's lead bits stay (lead_bits)
}

}  // namespace gpuos
#include "device_src/matmul.h"
#include "device_src/attention.h"
#include "device_src/dataops.h"
namespace gpuos {

__device__ __forceinline__ void exec_subop(const SubOp& d, TensorRef* refs, u64* cached, u32 lane,
                                           const Program* progs, i64 rd, u32 ri, const WorkerArgs& args,
                                           FinishNote* note) {
  TraceBuf* tb = kTraceSubops ? (TraceBuf*)args.trace : nullptr;
  if (tb && lane == 0) note->t0 = note->t1 = globaltimer();
  if (d.op == kOpFused) {
    const u32 how = exec_fused(d, refs, cached, lane, progs, rd, tb ? &note->t1 : nullptr);
    if (tb && lane == 0) trace_item(tb, note->tslot, ri, note->t0, note->t1, globaltimer(), how);
    return;
  }
  if (d.flags & kFlagStrided) fetch_refs(d, refs, cached, lane, rd);
  if (tb && lane == 0) note->t1 = globaltimer();
  // Matmul and attention items (they record themselves) ahead of the switch over every other op id, whose tree of
  // compares and branches they crossed before: from here to matmul_op's entry 1.57-1.60 us against 1.76 (H200,
  // `worker_trace.py mm`, thirty-seventh session; the rest of it is not this switch).
  if (d.op == kOp_mm) {
    matmul_op(d, refs, progs, lane, ri, (float*)args.scratch, args.capacity, note, (TraceBuf*)args.trace);
    return;
  }
  if (d.op == kOp_sdpa) {
    attention_op(d, refs, lane, ri, (float*)args.scratch, args.capacity, note, (TraceBuf*)args.trace);
    return;
  }
  static_assert(op_kind(kOp_mm) == kKindMatmul && op_kind(kOp_sdpa) == kKindAttention &&
                    ops_of_kind(kKindMatmul) == 1 && ops_of_kind(kKindAttention) == 1,
                "ops.def: a second matmul / attention op needs its own case above");
  switch (d.op) {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  case id:                                                              \
    if constexpr (kind == kKindEw) ew_op<functor, arity>(d, refs, lane); \
    else if constexpr (kind == kKindReduce) reduce_op<functor>(d, refs, lane); \
    else if constexpr (kind == kKindData) data_op(d, refs, lane, (HostCtl*)args.host_ctl); \
    break;
#include "device_src/ops.def"
#undef GPUOS_OP
    default: break;  // the host validates op ids; an unknown id is never published
  }
  // Every other kind's sub-op: k = 4 + its kind.
  if (tb && lane == 0) trace_item(tb, note->tslot, ri, note->t0, note->t1, globaltimer(), 4u + op_kind(d.op));
}

// ---------------------------------------------------------------- injected ops and the dual-slot alias
// Run (op, slot) if this generation has code for it (device_src/user_ops.h). Returns false otherwise.
__device__ __forceinline__ bool user_exec(const SubOp& d, const TensorRef* refs, u32 lane, u32 slot) {
#if GPUOS_USER_OPS_LINKED  // linked generation (issue #18): the dispatch object of device_src/linked.h
  return gpuos_linked_user_exec(&d, refs, lane, d.op * 2u + slot);
#else
  switch (d.op * 2u + slot) {
#define GPUOS_USER_CASE(op, sl, arity, functor) \
  case (op) * 2u + (sl):                        \
    ew_op<functor, arity>(d, refs, lane);       \
    return true;
    GPUOS_USER_OPS(GPUOS_USER_CASE)
#undef GPUOS_USER_CASE
    default: break;
  }
  return false;
#endif
}

// Dispatch one sub-op through the alias table: `alias` (shared memory, nullptr when every op is on slot 0)
// is the batch's version of the per-op slot choice, read once per sub-op (warp-uniform). Injected ops
// (kFirstUserOp..kMaxOps-1) and built-ins switched to slot 1 run their generated functor; the rest (built-ins,
// fused chains) go through exec_subop. The host publishes a sub-op only to a generation that has its code.
__device__ __forceinline__ void exec_routed(const SubOp& d, TensorRef* refs, u64* cached, u32 lane,
                                            const Program* progs, const u8* alias, i64 rd, u32 ri,
                                            const WorkerArgs& args, FinishNote* note) {
  const u32 op = d.op;
  const u32 slot = (alias != nullptr && op < kMaxOps) ? (u32)alias[op] : 0u;
  const bool user = op >= kFirstUserOp && op < kMaxOps;
  if (user || slot != 0) {
    if (d.flags & kFlagStrided) fetch_refs(d, refs, cached, lane, rd);
    if (user_exec(d, refs, lane, slot)) return;
    if (user) {  // slot 1 not in this generation: its slot 0 (never published that way by the host)
      if (slot != 0) user_exec(d, refs, lane, 0);
      return;
    }
  }
  exec_subop(d, refs, cached, lane, progs, rd, ri, args, note);
}

// ---------------------------------------------------------------- claiming
// Append one record to region `r` of the trace (thread 0 of one block: no other writer of the region).
__device__ __noinline__ void trace_put(TraceBuf* tb, u32 r, u32 block, u64 t0, u32 load_ns, u32 exec_ns, u32 seq,
                                       u32 idx, u32 k) {
  if (r > kTraceBlocks) return;
  const u32 n = ld_vol(&tb->count[r]);
  if (n < tb->per_block) {
    TraceRec* rec = (TraceRec*)(tb + 1) + (u64)r * tb->per_block + n;
    rec->t0 = t0;
    rec->load_ns = load_ns;
    rec->exec_ns = exec_ns;
    rec->block = block;
    rec->seq = seq;
    rec->idx = idx;
    rec->k = k;
    __threadfence_system();
  }
  st_vol(&tb->count[r], n + 1);
}
// A claim record of block r (region kTraceBlocks: the resident poller's batch fills, kTraceOpen).
__device__ __forceinline__ void trace_claim(TraceBuf* tb, u32 r, u64 t0, u64 t1, u64 t2, u32 seq, u32 idx, u32 k) {
  trace_put(tb, r, r == kTraceBlocks ? kTraceOpen : r, t0, (u32)(t1 - t0), (u32)(t2 - t1), seq, idx, k);
}
// The trace region of a launch's records that would go to region r (a block's claims; kTraceBlocks: batch fills and
// launch records): a kick's all go to its own region (kTraceKicks), since a kick that holds the poller token fills
// batches while the resident worker's block 0 writes its launch records, and a region has one writer.
__device__ __forceinline__ u32 trace_region(const WorkerArgs& args, u32 r) {
  return (args.standby & kStandbyKick) ? kTraceKicks : r;
}
__device__ __forceinline__ u32 poller_region(const WorkerArgs& args) { return trace_region(args, kTraceBlocks); }
// A launch record (kTraceLaunch) in the poller's region: its start (what 0) or exit (what 1 | 2 if it ran work).
__device__ __forceinline__ void trace_launch(const WorkerArgs& args, u32 what, u32 idx) {
  if (args.trace)
    trace_put((TraceBuf*)args.trace, poller_region(args), kTraceLaunch, globaltimer(), args.standby, 0, args.gen, idx,
              what);
}

}  // namespace gpuos
#include "device_src/walk.h"
namespace gpuos {

// run_claim's finish phase. Split items (decode attention) left their tiles' counters in notes. Lane di of warp 0
// counts item di off -- its fence releases the block's partials, ordered before it by the claim's barrier (fences
// are cumulative) -- and the block combines every tile whose count it completed (below: groups of its warps).
// first: the ring position of the claim's first descriptor (start + idx, before the modulo).
__device__ __forceinline__ void finish_phase(const WorkerArgs& args, const SubOp* sdesc, TensorRef* wrefs, u64* cached,
                                            u32 lane, u32 warp, u32 nwarps, u32 k, u64 first, i64 rd,
                                            BlockFinish* fin) {
  TraceBuf* tb = (TraceBuf*)args.trace;
  if (warp == 0) {
    bool last = false;
    if (lane < k && fin->note[lane].counter != 0) {
      fence_acq_rel();  // release
      const u32 old = atomicAdd((unsigned*)fin->note[lane].counter, 1u);
      last = old + 1 == fin->note[lane].expected;
      if (last) fence_acq_rel();  // acquire: every item's partials before the block reads them (barrier below)
    }
    const u32 todo = __ballot_sync(0xffffffffu, last);
    const u32 ltodo = __ballot_sync(0xffffffffu, lane < k && fin->note[lane].head != 0);
    if (lane == 0) fin->todo = todo, fin->ltodo = ltodo;
  }
  __syncthreads();
  // Local path: the warp that ran a tile's split 0 combines it from shared memory (its TensorRefs are still in its
  // slots: one descriptor per warp), then a barrier orders the outputs before the claim's release.
  const u32 ltodo = fin->ltodo;
  if (ltodo != 0) {  // block-uniform
    if (ltodo & (1u << warp)) {
      const u32 ri = (u32)((first + warp) % args.capacity);
      const u64 tf = tb ? globaltimer() : 0;
      attn_local_combine(sdesc[warp], wrefs, lane, ri, args.capacity, &fin->local_part[warp][0]);
      if (tb && lane == 0) trace_finish(tb, fin->note[warp].tslot, tf, globaltimer());
    }
    __syncthreads();
  }
  // The completed tiles are shared out to groups of gs warps (the block's warps halved until every tile has a
  // group, or one warp each: the whole block for one tile), which combine side by side; group g takes the tiles
  // g, g + ng, ... in bit order. One tile per warp is what the combine was before (16-22 us at KV 2,048).
  const u32 todo = fin->todo;
  if (todo != 0) {  // block-uniform
    const u32 nt = (u32)__popc(todo);
    u32 gs = nwarps;
    while (gs > 1 && gs * nt > nwarps) gs >>= 1;
    const u32 ng = nwarps / gs, g = warp / gs, gw = warp % gs;
    u32 j = 0;
    for (u32 m = todo; m != 0; m &= m - 1, ++j) {  // group-uniform: attn_finish has the group's barriers
      if (j % ng != g || g >= ng) continue;
      const u32 di = (u32)__ffs((int)m) - 1, ri = (u32)(((u64)first + di) % args.capacity);
      const u64 tf = tb ? globaltimer() : 0;
      attn_finish(sdesc[di], wrefs, cached, lane, warp, gw, gs, 1 + g, rd, ri, (float*)args.scratch, args.capacity,
                  fin->red);
      if (tb && gw == 0 && lane == 0) trace_finish(tb, fin->note[di].tslot, tf, globaltimer());
    }
    __syncthreads();
  }
}

// Run one claimed chunk (every thread of the block): descriptors into shared memory, wait for the previous
// level, execute one sub-op per warp, then count the chunk off; the block that finishes the batch signals.
__device__ void run_claim(const WorkerArgs& args, DevCtl* dc, HostCtl* hc, Poller& p, SubOp* sdesc,
                          TensorRef* wrefs, u64* cached, const u64* s_claim, const u32* s_batch, u32* s_alias,
                          BlockFinish* fin) {
  const SubOp* ring = (const SubOp*)args.ring;
  const SubOp* ring_dev = (const SubOp*)args.ring_dev;
  const u32 nwarps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  TraceBuf* tb = (TraceBuf*)args.trace;
  const u64 t_claim = tb && threadIdx.x == 0 ? globaltimer() : 0;
  const u64 c = *s_claim;
  const u32 seq = (u32)(c >> 32), idx = (u32)c, slot = seq & (kMaxBatches - 1);
  const u32 count = s_batch[0], start = s_batch[1], bver = s_batch[3], per_claim = s_batch[4];
  const bool dev_src = s_batch[2] != 0;
  const SubOp* resident = s_batch[2] == 2 ? (const SubOp*)(((u64)s_batch[6] << 32) | s_batch[5]) : nullptr;
  if (bver & kAliasActive)  // L2 loads: the host rewrites a version while it is not in use
    for (u32 j = threadIdx.x; j < 64; j += blockDim.x)
      s_alias[j] = __ldcg((const unsigned int*)&dc->alias.slot[bver & 1u][0] + j);
  const u32 k = count - idx < per_claim ? count - idx : per_claim;
  cached[0] = cached[1] = cached[2] = cached[3] = 0;  // TensorRef slots are reused: refetch per claim
  {  // the notes: empty, with the claim's place (the local path needs one descriptor per warp)
    const u32 c0 = (u32)(((u64)start + idx) % args.capacity);
    for (u32 j = threadIdx.x; j < k; j += blockDim.x) {
      FinishNote& n = fin->note[j];
      n.counter = 0, n.expected = 0, n.head = 0, n.arrived = 0, n.c0 = c0, n.ck = k;
      n.tslot = tb ? item_slot(args.trace_records, resident != nullptr, seq, idx + j, (c0 + j) % args.capacity) : 0u;
      n.local = k <= nwarps && j < kMaxWarps ? fin->local_part[j] : nullptr;
      n.pro = fin->pro[j % nwarps];  // descriptor j runs on warp j % nwarps
    }
  }
  for (u32 j = threadIdx.x; j < k * 4; j += blockDim.x) {
    const u32 di = j >> 2, part = j & 3;
    const u32 ri = (u32)(((u64)start + idx + di) % args.capacity);
    ((uint4*)&sdesc[di])[part] = resident ? ld_cg4((const uint4*)(resident + idx + di) + part)
                                 : dev_src ? ld_cg4((const uint4*)(ring_dev + ri) + part)
                                           : ld_vol4((const uint4*)(ring + ri) + part);
  }
  // A batch whose descriptors came by DMA has its TensorRefs in the device mirror too (GPU reads of pinned
  // memory cost ~1 us each, DESIGN F5; many warps reading the same pinned TensorRef at once were far slower).
  const i64 rd = dev_src ? (i64)(args.refs_dev - args.refs) : 0;
  __syncthreads();
  if (warp == 0) {  // which descriptors may leave a note: read after the next barrier (block-uniform)
    const u32 split = __ballot_sync(0xffffffffu, lane < k && may_split(sdesc[lane]));
    if (lane == 0) fin->split = split;
  }
  if (warp < k) prefetch_refs(sdesc[warp], wrefs, cached, lane, rd);
  if (threadIdx.x == 0) wait_prev(args, dc, hc, p, s_batch[7]);
  __syncthreads();
  const u64 t_loaded = tb && threadIdx.x == 0 ? globaltimer() : 0;
  const u8* alias = (bver & kAliasActive) ? (const u8*)s_alias : nullptr;
  for (u32 di = warp; di < k; di += nwarps)
    exec_routed(sdesc[di], wrefs, cached, lane, (const Program*)args.progs, alias, rd,
                (u32)(((u64)start + idx + di) % args.capacity), args, &fin->note[di]);
  __syncthreads();
  // Finish phase, only for claims with a descriptor that may split (block-uniform; every other claim goes on to
  // its release: no extra barrier on the levels of elementwise ops, rows, matmuls and data movement).
  if (fin->split != 0) finish_phase(args, sdesc, wrefs, cached, lane, warp, nwarps, k, (u64)start + idx, rd, fin);
  // Release: every warp's writes (ordered before thread 0's fence by the barrier: fences are cumulative) before
  // the count. One fence per block, not one per warp.
  if (threadIdx.x == 0) {
    if (tb && blockIdx.x < kTraceBlocks)
      trace_claim(tb, trace_region(args, blockIdx.x), t_claim, t_loaded, globaltimer(), seq, idx, k);
    fence_acq_rel();
    const u32 old = atomicSub(&dc->remaining[slot], k);
    if (old == k) {  // this block finished the batch: signal once, the next level's blocks first
      // Done words land in seq order: a join batch may finish before the batch it runs beside.
      if (s_batch[7] != seq - 1) {
        const u32 ps = (seq - 1) & (kMaxBatches - 1);
        while (!seq_reached(ld_vol(&dc->done[ps]), seq - 1))
          if (blockIdx.x == 0) poll_step(args, dc, hc, p, true);
      }
      __threadfence();
      st_vol(&dc->done[slot], seq);
      __threadfence_system();
      st_vol(&hc->done[slot], seq);
    }
  }
  __syncthreads();  // sdesc, s_claim and s_batch are rewritten by the next claim
}

}  // namespace gpuos

extern "C" __global__ void __launch_bounds__(gpuos::kMaxThreads, gpuos::kWorkerBlocksPerSm) gpuos_worker(gpuos::WorkerArgs args) {
  using namespace gpuos;
  __shared__ __align__(16) SubOp sdesc[kMaxWarps * kClaimPerWarp];  // written as uint4
  __shared__ __align__(16) TensorRef srefs[kMaxWarps][kWarpSlots];
  __shared__ unsigned long long s_claim;
  __shared__ u32 s_cmd, s_batch[8], s_alias[64];  // the claim's batch: count, start, source, alias version, size,
                                                  // bdesc (low, high)
  __shared__ __align__(16) BlockFinish s_fin;
  HostCtl* hc = (HostCtl*)args.host_ctl;
  DevCtl* dc = (DevCtl*)args.dev_ctl;
  const u32 warp = threadIdx.x / 32;
  u64 cached[4] = {0, 0, 0, 0};  // per-warp: which TensorRefs srefs[warp] holds (all lanes agree)

  Walk w;
  Poller p;
  if (threadIdx.x == 0) {
    w.cur = ld_vol(&dc->next_seq);  // every batch before it completed before the previous launch exited
    s_cmd = kCmdRun;
    if (blockIdx.x == 0) {
      p.next = w.cur;
      trace_launch(args, 0, w.cur);
      if (args.standby & kStandbyKick) {
        // A kick: launched under an older module (a handover since: its batches all completed) or behind a
        // launch that holds the token (it will see this kick's ready words) -- nothing to do, unless it waits
        // for its batches (kStandbyKickWait: it runs claims meanwhile).
        const bool stale = ((args.standby >> kStandbyEpochShift) ^ ld_vol(&hc->module_epoch)) &
                           (0xffffffffu >> kStandbyEpochShift);
        if (stale) {
          s_cmd = leave(args, dc, hc, p, p.next);
        } else if (!take_token(args, dc, p)) {
          p.holder = false;  // a waiting kick runs claims until its batches are done (kicks_idle), from its first
          // (next_seq moves only when the token does: it may lag far behind while one worker holds it)
          if (!(args.standby & kStandbyKickWait)) s_cmd = leave(args, dc, hc, p, p.next);
          else if ((int)(args.kick_first - w.cur) > 0) w.cur = args.kick_first;
        }
      } else {
        if (args.standby & kStandbyKicks) p.holder = take_token(args, dc, p);  // else a kick polls: take it later
        st_vol(&hc->worker_state, kWorkerRunning);
        st_vol(&hc->worker_started, args.gen);
      }
    }
  }
  __syncthreads();
  if (s_cmd == kCmdExit) return;
  for (;;) {
    if (threadIdx.x == 0) s_cmd = claim_next(args, dc, hc, w, p, blockDim.x / 32, &s_claim, s_batch);
    __syncthreads();
    if (s_cmd == kCmdExit) return;
    run_claim(args, dc, hc, p, sdesc, srefs[warp], cached, &s_claim, s_batch, s_alias, &s_fin);
  }
}
