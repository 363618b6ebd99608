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
// An mma / ncol item is a column tile over one slice of K (config.h kMm*); split products meet in the scratch.
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

__device__ __forceinline__ uint4 mm_ld16(const char* p, bool live) {
  return live ? *(const uint4*)p : make_uint4(0u, 0u, 0u, 0u);
}
// A weight's 16 bytes (global memory, read once per item), not allocated in L1: a level's streamed weights (8 KB per
// warp per K-256 tile) leave L1 to the warps' frames and activations. W7 0.71x / 0.50x -> 0.76x / 0.53x of the graph
// (H200, one call; DEVELOPING Verification state, thirty-second session); an M = 1 item alone did not change.
__device__ __forceinline__ uint4 mm_ld16_stream(const char* p, bool live) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (live)
    asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(__cvta_generic_to_global(p)));
  return v;
}
// Word w (0..7) of two 16-byte vectors (w is a constant once unrolled).
__device__ __forceinline__ u32 mm_word(const uint4* q, u32 w) {
  const uint4& v = q[w >> 2];
  const u32 c = w & 3u;
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}
template <bool BF16>
__device__ __forceinline__ void mm_mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  if constexpr (BF16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// mma item: columns [n0, n0 + 16) over k in [k0, k1), rows in passes of 8 (TWO: 16, two m8 tiles). Lane
// (q = lane / 4, t = lane % 4) holds weight rows n0 + q and n0 + q + 8 and activation rows m0 + q (and m0 + q + 8);
// per 64-k chunk it loads k = kc + 16t .. 16t + 15 of each (two 16-byte vectors, 8 words). mma step s (k16) takes
// words 2s and 2s + 1 as the fragment's k pairs (2t, 2t+1) and (2t+8, 2t+9): A and B see one permutation of the
// chunk's k. U chunks of the weight and of the activations are loaded before any is used (4 U + 2 U loads of
// 16 bytes in flight per lane, 4 U + 4 U with TWO).
// DUAL (kFlagMmDual, unsplit, one m8 tile): the second weight's loads and mma steps in the same loop, into its
// own accumulators, and each output pair through the epilogue program (mm_put_dual).
// Byte offsets along K are 32-bit (the host keeps K * 2 < 2^31 on this path).
// tk (the traced worker's unsplit items; else nullptr): lane 0 stores the time its K loop ended (every load consumed)
// before the outputs go out, so that the item's record splits into loads + mma and the epilogue / stores.
template <bool BF16, bool TWO, u32 U, bool DUAL = false>
__device__ __noinline__ void mm_mma(const MmArgs& g, i64 n0, i64 k0, i64 k1, float* part, bool local, u32 lane,
                                    u64* tk = nullptr) {
  static_assert(!(DUAL && TWO), "a dual item is one m8 tile");
  const u32 q = lane >> 2, t = lane & 3u;
  const bool w0 = n0 + q < g.N, w1 = n0 + q + 8 < g.N;
  const u32 kb1 = (u32)k1 * 2, koff = 32 * t;  // bytes: end of the slice, this lane's offset in a chunk
  const i64 M = g.M, as0 = g.as0;
  for (i64 m0 = 0; m0 < M; m0 += TWO ? 16 : 8) {
    const bool xa = m0 + q < M, xb = TWO && m0 + q + 8 < M;
    const char* xpa = g.a + (u64)((xa ? m0 + q : 0) * as0) * 2 + 32 * t;
    const char* xpb = g.a + (u64)((xb ? m0 + q + 8 : 0) * as0) * 2 + 32 * t;
    // The pass over the slice: weight b (its row stride bs1) into acc[0] -- and, DUAL, b2 into acc[1] in the same
    // loop: both weights' loads in flight at once (one round trip per U chunks for the pair, not two).
    constexpr u32 NW = DUAL ? 2 : 1;
    const char* wp[NW][2];
#pragma unroll
    for (u32 v = 0; v < NW; ++v) {
      const char* b = v == 0 ? g.b : g.b2;
      const i64 bs1 = v == 0 ? g.bs1 : g.b2s1;
      wp[v][0] = b + (u64)((w0 ? n0 + q : 0) * bs1) * 2 + 32 * t;
      wp[v][1] = b + (u64)((w1 ? n0 + q + 8 : 0) * bs1) * 2 + 32 * t;
    }
    float acc[NW][2][4];
#pragma unroll
    for (u32 v = 0; v < NW; ++v)
#pragma unroll
      for (u32 j = 0; j < 2; ++j)
#pragma unroll
        for (u32 i = 0; i < 4; ++i) acc[v][j][i] = 0.0f;
    for (u32 kc = (u32)k0 * 2; kc < kb1; kc += kMmChunk * 2 * U) {
      uint4 w[NW][U][2][2];
#pragma unroll
      for (u32 v = 0; v < NW; ++v)
#pragma unroll
        for (u32 u = 0; u < U; ++u)
#pragma unroll
          for (u32 h = 0; h < 2; ++h) {
            const u32 o = kc + u * kMmChunk * 2 + h * 16;
            const bool in = o + koff < kb1;  // k1 - k0 and K are multiples of 8: a vector is wholly in or out
            w[v][u][0][h] = mm_ld16_stream(wp[v][0] + o, in && w0);
            w[v][u][1][h] = mm_ld16_stream(wp[v][1] + o, in && w1);
          }
      uint4 x0[U][2], x1[U][2];  // the activations' chunks too, before any mma waits on a load
#pragma unroll
      for (u32 u = 0; u < U; ++u)
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
          const u32 o = kc + u * kMmChunk * 2 + h * 16;
          const bool in = o + koff < kb1;
          x0[u][h] = mm_ld16(xpa + o, in && xa);
          x1[u][h] = TWO ? mm_ld16(xpb + o, in && xb) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
      for (u32 v = 0; v < NW; ++v)
#pragma unroll
        for (u32 u = 0; u < U; ++u) {
#pragma unroll
          for (u32 s = 0; s < 4; ++s) {
            const u32 a0 = mm_word(w[v][u][0], 2 * s), a1 = mm_word(w[v][u][1], 2 * s);
            const u32 a2 = mm_word(w[v][u][0], 2 * s + 1), a3 = mm_word(w[v][u][1], 2 * s + 1);
            mm_mma16816<BF16>(acc[v][0], a0, a1, a2, a3, mm_word(x0[u], 2 * s), mm_word(x0[u], 2 * s + 1));
            if (TWO)
              mm_mma16816<BF16>(acc[v][1], a0, a1, a2, a3, mm_word(x1[u], 2 * s), mm_word(x1[u], 2 * s + 1));
          }
        }
    }
    if (tk && lane == 0) *tk = globaltimer();
    // Accumulator i of m8 tile j: column n0 + q (+ 8 for i >= 2), row m0 + 8j + 2t (+ 1 for odd i).
    if constexpr (DUAL) {
      const i64 m = m0 + 2 * t;
      mm_put_dual(g, m, n0 + q, acc[0][0][0], acc[NW - 1][0][0]);
      mm_put_dual(g, m + 1, n0 + q, acc[0][0][1], acc[NW - 1][0][1]);
      mm_put_dual(g, m, n0 + q + 8, acc[0][0][2], acc[NW - 1][0][2]);
      mm_put_dual(g, m + 1, n0 + q + 8, acc[0][0][3], acc[NW - 1][0][3]);
    } else {
#pragma unroll
      for (u32 j = 0; j < (TWO ? 2u : 1u); ++j) {
        const i64 m = m0 + 8 * j + 2 * t;
        const i64 ms[4] = {m, m + 1, m, m + 1};
        const u32 ns[4] = {q, q, q + 8, q + 8};
        const float vs[4] = {acc[0][j][0], acc[0][j][1], acc[0][j][2], acc[0][j][3]};
        mm_emit<4>(g, part, local, kMmMmaCols, ms, n0, ns, vs);
      }
    }
  }
}

// One mma tile: the instance for the dtype and the rows (two m8 tiles per pass above 8 rows). U = 2 chunks in
// flight: 3 for one m8 tile changed nothing measurable (H200, 4,096^2 at M = 1: items 13.7 us either way,
// `worker_trace.py mm`; 50 % of copy in bench_matmul), and 4 spilled at 128 registers (the cap is 255 since
// the thirty-second session: U 4 not measured at 255).
__device__ __forceinline__ void mm_mma_tile(const MmArgs& g, i64 n0, i64 k0, i64 k1, float* part, bool local,
                                            u32 lane, u64* tk = nullptr) {
  if (g.b2) {  // a dual item (unsplit, M <= kMmDualMaxRows)
    if (g.dta == kBF16) mm_mma<true, false, 2, true>(g, n0, k0, k1, part, local, lane, tk);
    else mm_mma<false, false, 2, true>(g, n0, k0, k1, part, local, lane, tk);
    return;
  }
  const bool two = g.M > 8;
  if (g.dta == kBF16)
    two ? mm_mma<true, true, 2>(g, n0, k0, k1, part, local, lane, tk)
        : mm_mma<true, false, 2>(g, n0, k0, k1, part, local, lane, tk);
  else
    two ? mm_mma<false, true, 2>(g, n0, k0, k1, part, local, lane, tk)
        : mm_mma<false, false, 2>(g, n0, k0, k1, part, local, lane, tk);
}

// Whether a's rows can be read as 16-byte vectors along K (unit stride, a's dtype b's, aligned rows); otherwise the
// ncol items read a's values one by one.
__device__ __forceinline__ bool mm_ncol_avec(const MmArgs& g) {
  return g.as1 == 1 && g.dta == g.dtb && (((u64)g.a | (u64)(g.as0 * 2)) & 15u) == 0;
}

// ncol1 item (kMmNcol1: one activation row -- batch-1 decode --, 16-bit, b N-contiguous): columns [n0, n0 + 64)
// over rows [k0, k1) of b. Lane (c = lane % 8, r = lane / 8) holds columns n0 + 8c .. 8c + 7 of rows
// kb + 32u + 8r .. + 7 (u = 0, 1) of each 64-row step: 16 loads of 16 bytes in flight per lane, the 8 lanes of a
// row group reading 128 contiguous bytes of a row, a's 8 values of a row group as one vector. The 4 row groups'
// sums meet by shuffles. A 64-column tile leaves 4x the tiles of the 256-column ncol item, so a decode product
// needs ~4x fewer K slices (<= a block's warps: summed in shared memory, not by contended atomics -- GPT-2-small's
// 256 x 768 was 32 slices of 8 rows per 256-column tile, 8.6-us items). The dtype is a template parameter
// (static conversions: fewer registers).
template <bool BF16>
__device__ __noinline__ void mm_ncol1(const MmArgs& g, i64 n0, i64 k0, i64 k1, float* part, bool local, u32 lane,
                                      bool avec) {
  const u32 c = lane & 7u, r = lane >> 3;
  const i64 n = n0 + 8 * (i64)c;
  const bool live = n < g.N;
  const u32 dt = BF16 ? kBF16 : kF16;
  const u64 rowb = (u64)g.bs0 * 2;  // bytes between rows of b
  float acc[8];
#pragma unroll
  for (u32 i = 0; i < 8; ++i) acc[i] = 0.0f;
  for (i64 kb = k0; kb < k1; kb += 8 * kMmNcolRows) {
    uint4 bq[2][8], aq[2];
    u32 rows[2];
#pragma unroll
    for (u32 u = 0; u < 2; ++u) {
      const i64 k = kb + 32 * u + 8 * r;
      rows[u] = k >= k1 ? 0u : k1 - k < 8 ? (u32)(k1 - k) : 8u;
      const char* bp = g.b + (u64)((rows[u] ? k : k0) * g.bs0 + n) * 2;
#pragma unroll
      for (u32 j = 0; j < 8; ++j) bq[u][j] = mm_ld16(bp + j * rowb, live && j < rows[u]);
      if (avec && rows[u] == 8) {
        aq[u] = *(const uint4*)(g.a + (u64)k * 2);
      } else {  // a strided or misaligned (its dtype is b's on this path), or the slice's last rows: one by one
        u32 h[8];
#pragma unroll
        for (u32 j = 0; j < 8; ++j) h[j] = j < rows[u] ? *(const u16*)(g.a + (u64)((k + j) * g.as1) * 2) : 0u;
        aq[u] = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
      }
    }
#pragma unroll
    for (u32 u = 0; u < 2; ++u)
#pragma unroll
      for (u32 j = 0; j < 8; ++j) {  // (rows past the slice: b and a are zero)
        float bf[8];
        Vec16::unpack(bq[u][j], bf, dt);
        const u32 w = mm_word(&aq[u], j >> 1);
        const float av = Vec16::cvt((u16)((j & 1u) ? w >> 16 : w & 0xffffu), dt);
#pragma unroll
        for (u32 i = 0; i < 8; ++i) acc[i] = fmaf(av, bf[i], acc[i]);
      }
  }
#pragma unroll
  for (u32 i = 0; i < 8; ++i) {
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 8);
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 16);
  }
  float vs[2] = {0.0f, 0.0f};  // row group r emits columns 2r, 2r + 1 of its lane's 8 (static indices: registers)
#pragma unroll
  for (u32 i = 0; i < 8; ++i)
    if ((i >> 1) == r) vs[i & 1u] = acc[i];
  const i64 ms[2] = {0, 0};
  const u32 ns[2] = {8 * c + 2 * r, 8 * c + 2 * r + 1};
  mm_emit<2>(g, part, local, kMmNcol1Cols, ms, n0, ns, vs);
}

// ncol item: columns [n0, n0 + 256), lane l owns n0 + 8l .. 8l + 7 (N % 8 == 0), k in [k0, k1) in steps of 8 rows
// of b (kMmNcolRows), rows of a in passes of 4. Every load of a step is issued before any is used: the 8 rows of b and, for a
// 16-byte aligned a with unit stride along K, its 8 values per row as one vector (a broadcast load); otherwise
// (or past the last whole 8 of K) a's values are read one by one.
__device__ __noinline__ void mm_ncol(const MmArgs& g, i64 n0, i64 k0, i64 k1, float* part, bool local,
                                     u32 lane) {
  const i64 n = n0 + 8 * (i64)lane;
  const bool live = n < g.N;
  const bool avec = mm_ncol_avec(g);
  for (i64 m0 = 0; m0 < g.M; m0 += 4) {
    const u32 rm = (u32)(g.M - m0 < 4 ? g.M - m0 : 4);
    float acc[4][8];
#pragma unroll
    for (u32 r = 0; r < 4; ++r)
#pragma unroll
      for (u32 i = 0; i < 8; ++i) acc[r][i] = 0.0f;
    for (i64 k = k0; k < k1; k += 8) {
      uint4 bq[8], aq[4];
#pragma unroll
      for (u32 j = 0; j < 8; ++j) bq[j] = mm_ld16(g.b + (u64)((k + j) * g.bs0 + n) * 2, live && k + j < k1);
      const bool full = avec && k + 8 <= k1;  // a's k..k+7 of each row as one vector (k - k0 is a multiple of 8)
#pragma unroll
      for (u32 r = 0; r < 4; ++r) aq[r] = mm_ld16(g.a + (u64)((m0 + r) * g.as0 + k) * 2, full && r < rm);
#pragma unroll
      for (u32 j = 0; j < 8; ++j) {
        float bf[8];
        Vec16::unpack(bq[j], bf, g.dtb);
#pragma unroll
        for (u32 r = 0; r < 4; ++r) {
          if (r >= rm) break;
          const u32 w = mm_word(&aq[r], j >> 1);
          const float av = full ? Vec16::cvt((u16)((j & 1u) ? w >> 16 : w & 0xffffu), g.dta)
                           : k + j < k1 ? load_f32(g.a, g.dta, (m0 + r) * g.as0 + (k + j) * g.as1) : 0.0f;
#pragma unroll
          for (u32 i = 0; i < 8; ++i) acc[r][i] = fmaf(av, bf[i], acc[r][i]);
        }
      }
    }
    // One output at a time here (M > 1: off the decode path): emitting a row's 8 together spilled (236 -> 368 B of
    // spill loads; unrolled over the rows, 1,052).
    for (u32 r = 0; r < rm; ++r)
#pragma unroll
      for (u32 i = 0; i < 8; ++i) {
        const i64 ms[1] = {m0 + r};
        const u32 ns[1] = {8 * lane + i};
        const float vs[1] = {acc[r][i]};
        mm_emit<1>(g, part, local, kMmNcolCols, ms, n0, ns, vs);
      }
  }
}

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
