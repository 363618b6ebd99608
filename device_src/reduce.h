// device_src/reduce.h -- no host-only code, no system #includes. CUDA-only: included by device_src/worker.cu.
// Last-dim reductions (device_src/ops.def kind 1: sum, mean, amax, amin, softmax, log_softmax), one warp per row,
// and row_offset, the row addressing the data ops share (device_src/dataops.h argmax).
#pragma once

namespace gpuos {

// ---------------------------------------------------------------- last-dim reductions, one warp per row
// Offset of row `row` over the first `nouter` dims; the outermost needs no division (row < its size by then).
__device__ __noinline__ i64 row_offset(const TensorRef& r, u32 nouter, i64 row) {
  if (nouter == 0) return 0;
  i64 off = 0;
  for (int k = (int)nouter - 1; k > 0; --k) {
    const i64 s = r.sizes[k];
    const i64 q = row / s;
    off += (row - q * s) * r.strides[k];
    row = q;
  }
  return off + row * r.strides[0];
}

template <class R>
__device__ __forceinline__ float warp_combine(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = R::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Fold one row into a per-lane partial with R::combine over T(x). Memory-level parallelism bounds long rows
// (the worker has few warps: bounded grid, DESIGN F7), so each lane issues U independent loads before it
// combines any: 16-byte vector loads for contiguous, 16-byte aligned rows (4 fp32 or 8 fp16/bf16 values),
// predicated scalar loads otherwise. With two loads in flight per lane, 128x1024 fp32 sums ran at ~0.2 TB/s.
// A row's first pass uses kRowLoads; softmax's second pass re-reads the row from cache and uses fewer.
constexpr u32 kRowLoads = 8, kRowLoadsCached = 2;

// The 16-byte loads stay raw (4 registers each) until they are combined: converted arrays of U x 8 floats made
// ptxas spill ~800 bytes per thread under a 64-register bound.
template <class R, class V, class T>
__device__ __forceinline__ float fold16(const uint4& q, u32 dt, T t) {
  float f[V::N];
  V::unpack(q, f, dt);
  float part = t(f[0]);
#pragma unroll
  for (u32 i = 1; i < V::N; ++i) part = R::combine(part, t(f[i]));
  return part;
}

// Out of line (as fold_strided): inlined into reduce_rows, all the variants' registers competed and ptxas
// spilled ~500 bytes per thread.
template <class R, u32 U, class V, class T>
__device__ __noinline__ float fold_vec_n(const void* xp, u32 dt, i64 cols, u32 lane, T t) {
  const uint4* p = (const uint4*)xp;
  const u32 nv = (u32)(cols / V::N);  // the host refuses rows of 2^32 elements or more (Runtime::record_reduce)
  float acc = R::init();
  for (u32 v = lane; v < nv; v += 32 * U) {
    uint4 q[U];
#pragma unroll
    for (u32 k = 0; k < U; ++k)
      if (v + 32 * k < nv) q[k] = p[v + 32 * k];
#pragma unroll
    for (u32 k = 0; k < U; ++k)
      if (v + 32 * k < nv) acc = R::combine(acc, fold16<R, V>(q[k], dt, t));
  }
  for (i64 j = (i64)nv * V::N + lane; j < cols; j += 32) acc = R::combine(acc, t(load_f32(xp, dt, j)));
  return acc;
}

// Strided or unaligned rows: U predicated scalar loads of the storage type E (float, or u16 for fp16 / bf16),
// one dtype branch per row rather than per element.
__device__ __forceinline__ float elem_f32(float v, u32) { return v; }
__device__ __forceinline__ float elem_f32(u16 v, u32 dt) { return dt == kF16 ? f16_to_f32(v) : bf16_to_f32(v); }

template <class R, u32 U, class E, class T>
__device__ __noinline__ float fold_strided(const void* xp, u32 dt, i64 cols, i64 xs, u32 lane, T t) {
  const E* p = (const E*)xp;
  float acc = R::init();
  for (i64 j = lane; j < cols; j += 32 * U) {
    E e[U];
#pragma unroll
    for (u32 k = 0; k < U; ++k)
      if (j + 32 * k < cols) e[k] = p[(j + 32 * k) * xs];
#pragma unroll
    for (u32 k = 0; k < U; ++k)
      if (j + 32 * k < cols) acc = R::combine(acc, t(elem_f32(e[k], dt)));
  }
  return acc;
}

template <class R, u32 U, class T>
__device__ __forceinline__ float fold_row(const void* xp, u32 dt, i64 cols, i64 xs, u32 lane, T t) {
  if (xs == 1 && ((u64)xp & 15) == 0) {
    if (dt == kF32) return fold_vec_n<R, U, VecF32>(xp, dt, cols, lane, t);
    return fold_vec_n<R, (U + 1) / 2, Vec16>(xp, dt, cols, lane, t);  // same elements in flight, half the loads
  }
  if (dt == kF32) return fold_strided<R, (U + 1) / 2, float>(xp, dt, cols, xs, lane, t);
  return fold_strided<R, (U + 1) / 2, u16>(xp, dt, cols, xs, lane, t);
}

// softmax / log_softmax's last pass: out[j] = f(x[j] - mx). Vector loads and stores when both rows are
// contiguous, 16-byte aligned and of one dtype.
// (softmax: exp(x - mx) / sum; log_softmax: x - mx - log(sum); `soft` picks, warp-uniform)
template <class V>
__device__ __forceinline__ void write_row_vec(const void* xp, void* op, u32 dt, i64 cols, u32 lane, bool soft,
                                              float mx, float sum, float lse) {
  const i64 nv = cols / V::N;
  for (i64 v = lane; v < nv; v += 32) {
    float f[V::N];
    V::load((const char*)xp + (u64)v * 16, f, dt);
#pragma unroll
    for (u32 i = 0; i < V::N; ++i) f[i] = soft ? m_exp(f[i] - mx) / sum : f[i] - mx - lse;
    V::store((char*)op + (u64)v * 16, f, dt);
  }
}

__device__ __forceinline__ void write_row(const void* xp, u32 dtx, i64 xs, void* op, u32 dto, i64 os, i64 cols,
                                          u32 lane, bool soft, float mx, float sum) {
  const float lse = m_log(sum);
  i64 j0 = 0;
  if (xs == 1 && os == 1 && dtx == dto && ((u64)xp & 15) == 0 && ((u64)op & 15) == 0) {
    if (dtx == kF32) write_row_vec<VecF32>(xp, op, dtx, cols, lane, soft, mx, sum, lse), j0 = cols / 4 * 4;
    else write_row_vec<Vec16>(xp, op, dtx, cols, lane, soft, mx, sum, lse), j0 = cols / 8 * 8;
  }
  for (i64 j = j0 + lane; j < cols; j += 32) {
    const float x = load_f32(xp, dtx, j * xs) - mx;
    store_f32(op, dto, j * os, soft ? m_exp(x) / sum : x - lse);
  }
}

// One instantiation per row rule (device_src/functors.h R::Rule: sum and mean share SumR; amax, softmax and
// log_softmax share AmaxR), the op id picks the epilogue at run time.
template <class R>
__device__ __noinline__ void reduce_rows(const SubOp& d, const TensorRef* refs, u32 lane) {
  const TensorRef& ro = refs[0];
  const TensorRef& rx = refs[1];
  const u32 nd = rx.ndim;
  const i64 cols = rx.sizes[nd - 1], xs = rx.strides[nd - 1];
  const u32 dtx = dt_of(d, 1), dto = d.dtype & 0xffu;
  const bool row_out = R::kRowOut && (d.op == kOp_softmax || d.op == kOp_log_softmax);
  const float scale = d.op == kOp_mean ? 1.0f / (float)cols : 1.0f;
  const u32 esz = dtx == kF32 ? 4 : 2;
  for (u32 r = 0; r < d.n; ++r) {
    const i64 row = (i64)d.base + r;
    const void* xp = (const void*)(rx.ptr + (u64)(row_offset(rx, nd - 1, row) * esz));
    const float acc = warp_combine<R>(fold_row<R, kRowLoads>(xp, dtx, cols, xs, lane, [](float v) { return v; }));
    if (!row_out) {
      if (lane == 0) store_f32((void*)ro.ptr, dto, row_offset(ro, ro.ndim, row), d.op == kOp_mean ? acc * scale : acc);
      continue;
    }
    if constexpr (R::kRowOut) {  // softmax / log_softmax: max, then sum of exp(x - max), then write
      const float mx = acc;
      const float sum =
          warp_combine<SumR>(fold_row<SumR, kRowLoadsCached>(xp, dtx, cols, xs, lane, [mx](float v) { return m_exp(v - mx); }));
      void* op = (void*)(ro.ptr + (u64)(row_offset(ro, ro.ndim - 1, row) * (dto == kF32 ? 4 : 2)));
      write_row(xp, dtx, xs, op, dto, ro.strides[ro.ndim - 1], cols, lane, d.op == kOp_softmax, mx, sum);
    }
  }
}

template <class F>
__device__ __forceinline__ void reduce_op(const SubOp& d, const TensorRef* refs, u32 lane) {
  reduce_rows<typename F::Rule>(d, refs, lane);
}

}  // namespace gpuos
