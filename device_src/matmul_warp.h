// device_src/matmul_warp.h -- no host-only code, no system #includes. Included by matmul.h after mm_store: the
// per-warp column-tile paths of the skinny matmul (anything the mma / ncol items do not take, and K == 0) --
// kvec (K-contiguous, lanes split K), nrow (N-contiguous b), scalar.
#pragma once

namespace gpuos {

// kvec: 4 columns x 4 rows per pass; lane l reads vectors l, l + 32, ... of each row.
template <class V>
__device__ __noinline__ void mm_kvec(const MmArgs& g, i64 n0, i64 n1, u32 lane) {
  const u32 esz = V::N == 4 ? 4 : 2;
  const i64 nv = g.K / V::N;
  for (i64 nc = n0; nc < n1; nc += 4) {
    const u32 cn = (u32)(n1 - nc < 4 ? n1 - nc : 4);
    for (i64 m0 = 0; m0 < g.M; m0 += 4) {
      const u32 rm = (u32)(g.M - m0 < 4 ? g.M - m0 : 4);
      float acc[4][4];
#pragma unroll
      for (u32 r = 0; r < 4; ++r)
#pragma unroll
        for (u32 c = 0; c < 4; ++c) acc[r][c] = 0.0f;
      for (i64 v = lane; v < nv; v += 32) {
        float bf[4][V::N];
#pragma unroll
        for (u32 c = 0; c < 4; ++c) {
          if (c < cn) V::load(g.b + (u64)(((nc + c) * g.bs1 + v * V::N) * esz), bf[c], g.dtb);
          else
#pragma unroll
            for (u32 i = 0; i < V::N; ++i) bf[c][i] = 0.0f;
        }
#pragma unroll
        for (u32 r = 0; r < 4; ++r) {
          if (r >= rm) break;
          float af[V::N];
          V::load(g.a + (u64)(((m0 + r) * g.as0 + v * V::N) * esz), af, g.dta);
#pragma unroll
          for (u32 c = 0; c < 4; ++c)
#pragma unroll
            for (u32 i = 0; i < V::N; ++i) acc[r][c] = fmaf(af[i], bf[c][i], acc[r][c]);
        }
      }
#pragma unroll
      for (u32 r = 0; r < 4; ++r)
#pragma unroll
        for (u32 c = 0; c < 4; ++c) {
          if (r >= rm || c >= cn) continue;  // warp-uniform
          const float s = mm_warp_sum(acc[r][c]);
          if (lane == r * 4 + c) mm_store(g, m0 + r, nc + c, s);
        }
    }
  }
}

// nrow: lane j owns column n0 + j (+ 32, ...); rows in passes of 4; b's rows are read coalesced.
__device__ __noinline__ void mm_nrow(const MmArgs& g, i64 n0, i64 n1, u32 lane) {
  for (i64 n = n0 + lane; n - lane < n1; n += 32) {
    const bool live = n < n1;
    for (i64 m0 = 0; m0 < g.M; m0 += 4) {
      const u32 rm = (u32)(g.M - m0 < 4 ? g.M - m0 : 4);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (i64 k = 0; k < g.K; ++k) {
        const float bv = live ? load_f32(g.b, g.dtb, k * g.bs0 + n * g.bs1) : 0.0f;
#pragma unroll
        for (u32 r = 0; r < 4; ++r)
          if (r < rm) acc[r] = fmaf(load_f32(g.a, g.dta, (m0 + r) * g.as0 + k * g.as1), bv, acc[r]);
      }
      if (live)
        for (u32 r = 0; r < rm; ++r) mm_store(g, m0 + r, n, acc[r]);
    }
  }
}

// scalar: one output at a time, lanes split K.
__device__ __noinline__ void mm_scalar(const MmArgs& g, i64 n0, i64 n1, u32 lane) {
  for (i64 n = n0; n < n1; ++n)
    for (i64 m = 0; m < g.M; ++m) {
      float acc = 0.0f;
      for (i64 k = lane; k < g.K; k += 32)
        acc = fmaf(load_f32(g.a, g.dta, m * g.as0 + k * g.as1), load_f32(g.b, g.dtb, k * g.bs0 + n * g.bs1), acc);
      acc = mm_warp_sum(acc);
      if (lane == 0) mm_store(g, m, n, acc);
    }
}

}  // namespace gpuos
