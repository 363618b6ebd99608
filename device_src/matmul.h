// device_src/matmul.h -- no host-only code, no system #includes. Included by worker.cu after its vector helpers.
// Skinny matmul (issue #16): out = alpha * (a @ b) + beta * bias, a: M x K, b: K x N, bias: M x N (broadcast
// strides allowed, or absent), fp32 accumulation. The decode shape is M <= 64 activation rows and a large
// weight: the GPU time is about that of reading the weight once, so every path streams it once per 16 rows
// with many 16-byte loads in flight. The host picks the path (Runtime::record_matmul, SubOp::reserved):
//   mma (fp16 / bf16, a and b K-contiguous -- the weight of linear / addmm(bias, x, w.t()) -- 16-byte aligned,
//        K % 8 == 0): tensor cores, swapped operands: out^T tile (16 columns x 8 rows) = W (16 x k16, A) @ x^T
//        (k16 x 8, B), mma.sync m16n8k16 with fp32 accumulators. The reduction runs over K in any order, so A
//        and B use one permutation of K that lets each lane load 32 contiguous bytes of a weight row per 64-k
//        chunk (4 lanes read 128 contiguous bytes: whole lines) and of an activation row, with no shuffles;
//   ncol (fp16 / bf16, b N-contiguous -- GPT-2's Conv1D weight, K x N row-major): lane l owns 8 columns of a
//        256-column tile, K walked in steps of 8 rows of b (8 loads of 16 bytes in flight), rows of a broadcast;
//        at M = 1 (ncol1) a 64-column tile, the lanes in 4 row groups over K (16 loads in flight);
//   warp tiles (anything else, and K == 0; matmul_warp.h): one warp per tile of columns -- kvec (K-contiguous,
//        lanes split K),
//        nrow (N-contiguous b), scalar.
// An mma / ncol item is a column tile over one slice of K (config.h kMm*); split products meet in the scratch. The
// item functions are in matmul_items.h; this file has the arguments, the outputs' epilogue, the split-K finish and
// the dispatch (matmul_op).
#pragma once

namespace gpuos {

__device__ __forceinline__ float mm_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct MmArgs {
  const char* a;
  const char* b;
  char* out;
  const char* bias;  // nullptr: none
  const char* b2;    // kFlagMmDual: the second weight (b's shape and layout; its row stride b2s1), else nullptr
  i64 M, K, N;
  i64 as0, as1, bs0, bs1, os0, os1, cs0, cs1, b2s1;  // element strides (a, b, out, bias, b2's rows)
  u32 dta, dtb, dto, dtc;
  float alpha, beta;
  const Program* epi;  // kFlagMmEpilogue: the program every output value (pair, dual) goes through (nullptr: none)
  u32 epi_id;          // its id (tier 2's code for it)
  u32 epi_dt;          // kFlagMmEpilogue / kFlagMmCast: the product's dtype, each value rounded to it first (kF32:
                       // no rounding before the store's)
};
static_assert(kMaxPrograms - 1 <= kMmEpiMask, "an epilogue's program id fits its descriptor bits");

// An output value (the product, rounded as eager stores it: mm_put) through the epilogue program, its
// intermediates rounded as it says; x1: a dual item's second product (input 1 of a two-input program; a one-input
// program never reads it). Out of line: the interpreter's registers stay out of the item functions that call
// mm_put (ptxas sm_90: their spill loads grow by 4-48 bytes, mm_ncol's the most, 196 -> 244).
// Tier 2 first (worker.cu epi_spec: the program's straight-line code in this generation), the interpreter when the
// generation has none yet.
__device__ bool epi_spec(u32 prog, float x0, float x1, float* y);
__device__ __noinline__ float mm_epi(const Program* p, u32 prog, float x0, float x1) {
  float y;
  if (epi_spec(prog, x0, x1, &y)) return y;
  float r[kProgMaxRegs][1];
#pragma unroll
  for (u32 k = 0; k < kProgMaxRegs; ++k) r[k][0] = 0.0f;
  r[0][0] = x0;
  r[1][0] = x1;
  float out[1];
  run_program_v<1>(*p, r, out);
  return out[0];
}

// v rounded to the product's dtype (g.epi_dt), as eager stores the product before a folded chain reads it.
__device__ __forceinline__ float mm_round(const MmArgs& g, float v) {
  if (g.epi_dt == kF16) return f16_to_f32(f32_to_f16(v));
  if (g.epi_dt == kBF16) return bf16_to_f32(f32_to_bf16(v));
  return v;
}

// The epilogue: out[m, n] = alpha * acc (+ beta * bias[m, n], its value already loaded: `bias`), through the
// epilogue program when there is one, in the product's dtype first when that is not out's (a program or a cast).
__device__ __forceinline__ void mm_put(const MmArgs& g, i64 m, i64 n, float acc, float bias) {
  float v = g.alpha * acc;
  if (g.bias) v += g.beta * bias;
  v = mm_round(g, v);
  if (g.epi) v = mm_epi(g.epi, g.epi_id, v, 0.0f);
  store_f32(g.out, g.dto, m * g.os0 + n * g.os1, v);
}
// A dual item's output (m, n): its two products (acc: a @ b, acc2: a @ b2), each rounded, through the program.
__device__ __forceinline__ void mm_put_dual(const MmArgs& g, i64 m, i64 n, float acc, float acc2) {
  if (m >= g.M || n >= g.N) return;
  const float v = mm_epi(g.epi, g.epi_id, mm_round(g, g.alpha * acc), mm_round(g, g.alpha * acc2));
  store_f32(g.out, g.dto, m * g.os0 + n * g.os1, v);
}
__device__ __forceinline__ void mm_store(const MmArgs& g, i64 m, i64 n, float acc) {
  mm_put(g, m, n, acc, g.bias ? load_f32(g.bias, g.dtc, m * g.cs0 + n * g.cs1) : 0.0f);
}

}  // namespace gpuos
#include "device_src/matmul_warp.h"
namespace gpuos {

// ---------------------------------------------------------------- items (mma, ncol) and split-K
// N outputs of one lane, (m[i], n0 + nl[i]): stored, added to the tile's partials (part: its scratch, nullptr when
// the product is not split over K), or -- `local` -- written to this item's own partial in shared memory (part: its
// kLocalSlot floats, M x tw). Stored ones load their bias values together first: out may alias bias as far as the
// compiler knows, so storing each value before the next one's bias load cost a round trip per value (an unsplit
// mma item with a residual: two per lane at M = 1, four at M = 2..8).
template <u32 N>
__device__ __forceinline__ void mm_emit(const MmArgs& g, float* part, bool local, u32 tw, const i64 (&m)[N], i64 n0,
                                        const u32 (&nl)[N], const float (&v)[N]) {
  u32 braw[N];
#pragma unroll
  for (u32 i = 0; i < N; ++i) {
    const bool load = !part && !local && g.bias && m[i] < g.M && n0 + nl[i] < g.N;
    braw[i] = load ? load_bits(g.bias, g.dtc, m[i] * g.cs0 + (n0 + nl[i]) * g.cs1) : 0u;
  }
#pragma unroll
  for (u32 i = 0; i < N; ++i) {
    if (m[i] >= g.M || n0 + nl[i] >= g.N) continue;
    if (local) part[m[i] * tw + nl[i]] = v[i];
    else if (part) atomicAdd(part + kMmScratchHead + m[i] * tw + nl[i], v[i]);
    else mm_put(g, m[i], n0 + nl[i], v[i], bits_value(braw[i], g.dtc));
  }
}

// A split tile's epilogue, 8 outputs per lane at once: sum(e) is output e's (m * tw + nl) fp32 total, clear(e) runs
// once it is read; the outputs' bias values are all loaded before any is used (one memory round trip per 8, not
// two per output).
template <class Sum, class Clear>
__device__ __forceinline__ void mm_epilogue(const MmArgs& g, u32 tw, i64 n0, u32 lane, Sum sum, Clear clear) {
  const u32 total = (u32)(g.M * tw);
  for (u32 e0 = lane; e0 < total; e0 += 32 * 8) {
    float v[8];
    u32 braw[8];
#pragma unroll
    for (u32 u = 0; u < 8; ++u) {
      const u32 e = e0 + 32 * u, m = e / tw, nl = e - m * tw;
      const bool live = e < total, ok = live && n0 + nl < g.N;
      v[u] = live ? sum(e) : 0.0f;
      braw[u] = ok && g.bias ? load_bits(g.bias, g.dtc, (i64)m * g.cs0 + (n0 + nl) * g.cs1) : 0u;
    }
#pragma unroll
    for (u32 u = 0; u < 8; ++u) {
      const u32 e = e0 + 32 * u, m = e / tw, nl = e - m * tw;
      if (e >= total) break;
      clear(e);
      if (n0 + nl < g.N) mm_put(g, m, n0 + nl, v[u], bits_value(braw[u], g.dtc));
    }
  }
}

// After this item's partials: the tile's last item (the counter) writes the outputs and zeroes the scratch.
// Returns whether this item finished the tile.
__device__ __noinline__ bool mm_finish(const MmArgs& g, float* part, u32 tw, u32 ksplit, i64 n0, u32 lane) {
  fence_acq_rel();  // this item's partials before the counter (release)
  __syncwarp();
  u32 old = 0;
  if (lane == 0) old = atomicAdd((unsigned*)part, 1u);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != ksplit - 1) return false;
  fence_acq_rel();  // acquire: every item's partials before they are read
  // The scratch holds M x tw < 2^32 floats (kMmMaxSplit slots); each is zeroed once read.
  mm_epilogue(g, tw, n0, lane, [&](u32 e) { return __ldcg(part + kMmScratchHead + e); },
              [&](u32 e) { __stcg(part + kMmScratchHead + e, 0.0f); });
  if (lane == 0) atomicExch((unsigned*)part, 0u);
  return true;
}

}  // namespace gpuos
#include "device_src/matmul_items.h"
namespace gpuos {

// The product's arguments from its descriptor and TensorRefs: [0] out (M x N), [1] a (M x K), [2] b (K x N),
// [3] bias (M x N view; absent when in[2] is a constant); progs: the device program table (an epilogue's).
// A prologue (kFlagMmPrologue): [1..2] the row program's FusedArgs, [3] b; `pro` holds a (M x K, contiguous, the
// row program's output dtype: mm_prologue).
__device__ __forceinline__ MmArgs mm_args(const SubOp& d, const TensorRef* refs, const Program* progs,
                                          const u16* pro = nullptr) {
  MmArgs g;
  const bool prologue = d.flags & kFlagMmPrologue;
  const TensorRef &ro = refs[0], &ra = refs[1], &rb = refs[prologue ? 3 : 2];
  g.out = (char*)ro.ptr;
  g.a = prologue ? (const char*)pro : (const char*)ra.ptr;
  g.b = (const char*)rb.ptr;
  // beta == 0 ignores the bias (NaN / inf included), as torch.addmm does. A dual item's refs[3] is its second
  // weight.
  const bool dual = d.flags & kFlagMmDual;
  g.bias = dual || prologue || (d.flags & (kFlagConst0 << 2)) || d.scalar[1] == 0.0f ? nullptr
                                                                                    : (const char*)refs[3].ptr;
  g.b2 = dual ? (const char*)refs[3].ptr : nullptr;
  g.b2s1 = dual ? refs[3].strides[1] : 0;
  g.M = ro.sizes[0];
  g.K = rb.sizes[0];
  g.N = ro.sizes[1];
  g.as0 = prologue ? g.K : ra.strides[0], g.as1 = prologue ? 1 : ra.strides[1];
  g.bs0 = rb.strides[0], g.bs1 = rb.strides[1];
  g.os0 = ro.strides[0], g.os1 = ro.strides[1];
  g.cs0 = g.bias ? refs[3].strides[0] : 0, g.cs1 = g.bias ? refs[3].strides[1] : 0;
  g.dto = d.dtype & 0xffu, g.dta = (d.dtype >> 8) & 0xffu, g.dtb = (d.dtype >> 16) & 0xffu;
  g.dtc = (d.dtype >> 24) & 0xffu;
  g.alpha = d.scalar[0], g.beta = d.scalar[1];
  g.epi_id = (d.flags >> kMmEpiShift) & kMmEpiMask;
  g.epi_dt = d.flags & (kFlagMmEpilogue | kFlagMmCast) ? (d.flags >> kMmEpiDtShift) & 3u : (u32)kF32;
  g.epi = (d.flags & kFlagMmEpilogue) ? progs + g.epi_id : nullptr;
  return g;
}
__device__ __forceinline__ u32 mm_ksplit(const SubOp& d) {
  const u32 ks = (d.reserved >> 8) & 0xffu;
  return ks ? ks : 1u;
}

// The local path's finish (kMmLocal: the claim holds the tile's ksplit K slices, one descriptor per warp): this
// item's partial is in its shared-memory slot, slice s's at slot0 + s * kLocalSlot. The last slice to arrive (the
// tile's counter: `arrived`, in its slice 0's FinishNote) adds the tile's partials in slice order and writes the
// outputs, as the global path's last item does (mm_finish) -- with the MmArgs this item already holds, and without
// the block barriers, ballots and second mm_args of the finish phase that the slice-0 warp's combine needed (traced,
// a program chain of 4,096^2 products: the combine 2 us and the tail 4.4 us of a 27-us level; bench_matmul's
// program chain at M = 1 29.1-29.5 -> 23.5-24.1 us per product, H200, one call, forty-first session). Returns
// whether this item finished the tile.
__device__ __noinline__ bool mm_finish_local(const MmArgs& g, const float* slot0, u32* arrived, u32 tw, u32 ksplit,
                                             i64 n0, u32 lane) {
  __syncwarp();  // every lane's partial stores before lane 0's release
  u32 old = 0;
  if (lane == 0) {
    __threadfence_block();  // release: this slice's partial before its count
    old = atomicAdd(arrived, 1u);
    __threadfence_block();  // acquire (the last slice): the other slices' partials before they are read
  }
  __syncwarp();
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != ksplit - 1) return false;
  mm_epilogue(g, tw, n0, lane, [&](u32 e) {
    float v = 0.0f;
    for (u32 s = 0; s < ksplit; ++s) v += slot0[s * kLocalSlot + e];
    return v;
  }, [](u32) {});
  return true;
}

// A prologue's activations (kFlagMmPrologue): the row program whose FusedArgs are in refs[1..2] (its id: the bits
// of scalar[1]) over a's M rows of K, written into `pro` (this warp's shared buffer, M x K contiguous) instead of the
// tensor the host never allocated a write for -- tier 2's code once the program is hot, else the interpreter (the
// Program read from the device table). The FusedArgs' output operand is pointed at `pro` in the warp's slots
// (every item of this warp points it there: a later descriptor finding the slots cached sees the same value).
__device__ __noinline__ void mm_prologue(const SubOp& d, TensorRef* refs, const Program* progs, u32 lane, u16* pro) {
  FusedArgs& fa = *(FusedArgs*)&refs[1];
  if (lane == 0) fa.opnd[0].ptr = (u64)pro;
  __syncwarp();
  const u32 prog = __float_as_uint(d.scalar[1]);
  const i64 M = refs[0].sizes[0], K = refs[3].sizes[0];
  SubOp r{};
  r.op = kOpFused;
  r.flags = kFlagFused;
  r.in[0] = prog;
  r.base = 0;
  r.n = (u32)(M * K);
  r.reserved = (u32)K;  // rows of K
  if (!exec_fused_spec(r, fa, prog, lane)) fused_prog_op(r, fa, progs[prog], lane);
  __syncwarp();  // the buffer before the item's loads of it
}

// refs, progs: as mm_args. ri: the sub-op's ring index (its scratch); scratch, capacity: WorkerArgs::scratch /
// capacity;
// note: the claim's place and this descriptor's shared-memory slot (the local path: a tile the claim holds whole,
// its counter in its slice 0's note); tb: the trace (nullptr: off), where each mma / ncol item records its own and
// its split finish's duration.
__device__ __noinline__ void matmul_op(const SubOp& d, TensorRef* refs, const Program* progs, u32 lane, u32 ri,
                                       float* scratch, u32 capacity, FinishNote* note, TraceBuf* tb) {
  const u64 t_entry = kTraceSubops && tb ? globaltimer() : 0;
  if (d.flags & kFlagMmPrologue) mm_prologue(d, refs, progs, lane, note->pro);
  const u64 t_pro = kTraceSubops && tb ? globaltimer() : 0;
  const MmArgs g = mm_args(d, refs, progs, note->pro);
  const u32 variant = d.reserved & 0xffu, ksplit = mm_ksplit(d);
  const u32 group = (d.reserved >> 16) & 0x7fffu ? (d.reserved >> 16) & 0x7fffu : 1u;
  if (variant == kMmMma && group > 1) {  // an unsplit item of `group` column tiles: tiles d.base * group, ...
    const u64 t0 = tb ? globaltimer() : 0;
    u64 tk = 0;  // the traced worker: the last tile's K loop's end (the record's load / exec split)
    for (u32 t = 0; t < group; ++t) {
      const i64 n0 = ((i64)d.base * group + t) * kMmMmaCols;
      if (n0 >= g.N) break;
      mm_mma_tile(g, n0, 0, g.K, nullptr, false, lane, kTraceSubops && tb ? &tk : nullptr);
    }
    if (tb && lane == 0) {
      const u64 t1 = globaltimer();
      trace_item(tb, note->tslot, ri, t0, tk ? tk : t1, t1, lead_bits(note->t1, t_entry, t_pro, t0));
    }
    return;
  }
  if (variant != kMmWarp) {  // an item: tile d.base / ksplit, K slice d.base % ksplit
    // An unsplit item (ksplit 1: most decode products) takes no division: the dispatch up to the item's first load
    // was ~400 dependent instructions more than the item alone (tools/warp_bench.cu kinds 12 / 9 under ncu, H200:
    // 1,114 against 775 instructions per call, 1.2 us), three of its four divisions here.
    const u32 tw = mm_cols(variant);
    u32 kp = 0;
    i64 n0 = (i64)d.base * tw, k0 = 0, k1 = g.K;
    bool local = false;
    float* part = nullptr;
    if (ksplit > 1) {
      const u32 tile = d.base / ksplit;
      kp = d.base - tile * ksplit;
      const i64 kspan = mm_kspan(g.K, ksplit, mm_unit(variant));
      n0 = (i64)tile * tw;
      k0 = kp * kspan, k1 = k0 + kspan < g.K ? k0 + kspan : g.K;
      // The tile's items are consecutive in the ring: its scratch is that of the first one's slot -- unless the
      // claim holds all of them with one descriptor per warp (kMmLocal: the host saw the partial fit a slot).
      // Ring arithmetic without a division: ri, c0 < capacity and kp < ksplit <= capacity.
      const u32 first = ri >= kp ? ri - kp : ri + capacity - kp;
      const u32 o = first >= note->c0 ? first - note->c0 : first + capacity - note->c0;
      local = (d.reserved & kMmLocal) && note->local != nullptr && o + ksplit <= note->ck;
      part = local ? note->local : scratch + (u64)first * kMmScratchPerSlot;
    }
    const u64 t0 = tb ? globaltimer() : 0;
    u64 tk = 0;  // as above (unsplit items only: a split item's exec is its finish)
    if (variant == kMmMma) {
      mm_mma_tile(g, n0, k0, k1, part, local, lane, kTraceSubops && tb && !part ? &tk : nullptr);
    } else if (variant == kMmNcol1) {
      if (g.dtb == kBF16) mm_ncol1<true>(g, n0, k0, k1, part, local, lane, mm_ncol_avec(g));
      else mm_ncol1<false>(g, n0, k0, k1, part, local, lane, mm_ncol_avec(g));
    } else {
      mm_ncol(g, n0, k0, k1, part, local, lane);
    }
    const u64 t1 = tb ? globaltimer() : 0;
    // A split tile's last item writes its outputs: from the shared-memory slots (local: slice 0's slot and note are
    // kp before this item's -- the claim's descriptors are consecutive) or from the scratch.
    const bool finished = part && (local ? mm_finish_local(g, part - kp * kLocalSlot, &(note - kp)->arrived, tw, ksplit,
                                                           n0, lane)
                                         : mm_finish(g, part, tw, ksplit, n0, lane));
    if (tb && lane == 0)
      trace_item(tb, note->tslot, ri, t0, tk ? tk : t1, tk ? t1 : globaltimer(),
                 (finished ? 1u : 0u) | lead_bits(note->t1, t_entry, t_pro, t0));
    return;
  }
  const i64 n0 = d.base, n1 = (i64)d.base + d.n;
  if (g.K == 0) {  // an empty sum: out = beta * bias (or 0)
    for (i64 e = lane; e < g.M * (n1 - n0); e += 32) mm_store(g, e / (n1 - n0), n0 + e % (n1 - n0), 0.0f);
    return;
  }
  const u32 vn = g.dta == kF32 ? 4 : 8;
  const bool kvec = g.as1 == 1 && g.bs0 == 1 && g.dta == g.dtb && g.K % vn == 0 && g.as0 % vn == 0 &&
                    g.bs1 % vn == 0 && ((u64)g.a & 15) == 0 && ((u64)g.b & 15) == 0;
  if (kvec) {
    if (g.dta == kF32) mm_kvec<VecF32>(g, n0, n1, lane);
    else mm_kvec<Vec16>(g, n0, n1, lane);
  } else if (g.bs1 == 1) {
    mm_nrow(g, n0, n1, lane);
  } else {
    mm_scalar(g, n0, n1, lane);
  }
}

}  // namespace gpuos
