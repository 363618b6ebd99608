// device_src/matmul.h -- no host-only code, no system #includes. Included by worker.cu after its vector helpers.
// Skinny matmul (issue #16): out = alpha * (a @ b) + beta * bias, a: M x K, b: K x N, bias: M x N (broadcast
// strides allowed, or absent), fp32 accumulation. One sub-op = one warp = output columns [base, base + n) of
// every row; the host tiles N (Runtime::record_matmul). The decode shape is M <= 64 (activation rows) and a large
// weight: the warp streams the weight once per 4 rows, so the GPU time is about that of reading it.
//
// Three paths, picked per sub-op at run time:
//   kvec: b is K-contiguous (b.strides[0] == 1: the transposed weight of linear / addmm(bias, x, w.t())), a is
//         K-contiguous, everything 16-byte aligned: lanes split K in 16-byte vectors, 4 columns x 4 rows per pass,
//         then a warp all-reduce;
//   nrow: b is N-contiguous (row-major b): lanes split the columns, K walked in order (coalesced b rows);
//   scalar: anything else (lanes split K, element loads).
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
  i64 M, K;
  i64 as0, as1, bs0, bs1, os0, os1, cs0, cs1;  // element strides (a, b, out, bias)
  u32 dta, dtb, dto, dtc;
  float alpha, beta;
};

__device__ __forceinline__ void mm_store(const MmArgs& g, i64 m, i64 n, float acc) {
  float v = g.alpha * acc;
  if (g.bias) v += g.beta * load_f32(g.bias, g.dtc, m * g.cs0 + n * g.cs1);
  store_f32(g.out, g.dto, m * g.os0 + n * g.os1, v);
}

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

// refs: [0] out (M x N), [1] a (M x K), [2] b (K x N), [3] bias (M x N view; absent when in[2] is a constant).
__device__ __noinline__ void matmul_op(const SubOp& d, const TensorRef* refs, u32 lane) {
  MmArgs g;
  const TensorRef &ro = refs[0], &ra = refs[1], &rb = refs[2];
  g.out = (char*)ro.ptr;
  g.a = (const char*)ra.ptr;
  g.b = (const char*)rb.ptr;
  // beta == 0 ignores the bias (NaN / inf included), as torch.addmm does.
  g.bias = (d.flags & (kFlagConst0 << 2)) || d.scalar[1] == 0.0f ? nullptr : (const char*)refs[3].ptr;
  g.M = ra.sizes[0];
  g.K = ra.sizes[1];
  g.as0 = ra.strides[0], g.as1 = ra.strides[1];
  g.bs0 = rb.strides[0], g.bs1 = rb.strides[1];
  g.os0 = ro.strides[0], g.os1 = ro.strides[1];
  g.cs0 = g.bias ? refs[3].strides[0] : 0, g.cs1 = g.bias ? refs[3].strides[1] : 0;
  g.dto = d.dtype & 0xffu, g.dta = (d.dtype >> 8) & 0xffu, g.dtb = (d.dtype >> 16) & 0xffu;
  g.dtc = (d.dtype >> 24) & 0xffu;
  g.alpha = d.scalar[0], g.beta = d.scalar[1];
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
