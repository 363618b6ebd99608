// device_src/matmul_items.h -- no host-only code, no system #includes. Included by matmul.h after mm_finish: the
// item functions of the tile paths (matmul.h's header comment) -- mma (tensor cores, mm_mma / mm_mma_tile), ncol1
// (M = 1, b N-contiguous) and ncol -- and their load helpers. Each writes its outputs, its K slice's partial to the
// scratch, or (local) to its shared-memory slot through mm_emit.
#pragma once

namespace gpuos {

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

}  // namespace gpuos
