// device_src/dataops.h -- no host-only code, no system #includes.
// The data-movement ops (device_src/ops.def kind 4): index gathers and scatters (embedding, index_select,
// index_copy_, index_put_), where / masked_fill, int64 / int32 arithmetic, arange / fill, argmax. Elements are
// moved as raw bits of their dtype (any DType, integers included), so nothing goes through fp32 but argmax's
// compare. The per-element rule (data_elem) and argmax's order (arg_before) are plain C++: g++ compiles them
// into the extension for the CPU tests (gpuos_ext._testing.cpu_data); the warp loops at the end are CUDA-only.
//
// Every tensor is addressed through a TensorRef (sizes / strides in elements, ref.dtype its DType). An index out
// of range never reads or writes outside the tensor: a gather writes NaN (float) or 0 (integer) for that element,
// a scatter skips it, and the sub-op raises HostCtl::index_fault (torch's CUDA kernels stop the process with a
// device-side assert instead; the host reports the flag as stats()["index_faults"]).
#pragma once
#include "device_src/config.h"
#include "device_src/functors.h"
#include "device_src/numeric.h"
#include "device_src/types.h"

namespace gpuos {

GPUOS_HD u32 dtype_size(u32 dt) { return dt == kI64 ? 8u : (dt == kF32 || dt == kI32) ? 4u : dt == kBool ? 1u : 2u; }

GPUOS_HD u64 ld_raw(u64 p, u32 sz) {
  if (sz == 8) return *(const u64*)p;
  if (sz == 4) return *(const u32*)p;
  if (sz == 2) return *(const u16*)p;
  return *(const u8*)p;
}
GPUOS_HD void st_raw(u64 p, u32 sz, u64 v) {
  if (sz == 8) *(u64*)p = v;
  else if (sz == 4) *(u32*)p = (u32)v;
  else if (sz == 2) *(u16*)p = (u16)v;
  else *(u8*)p = (u8)v;
}
// Integer value of raw bits of an integer dtype; bits of an integer value for dtype dt (st_raw truncates).
GPUOS_HD i64 raw_to_int(u64 raw, u32 dt) {
  if (dt == kI64) return (i64)raw;
  if (dt == kI32) return (i64)(int)(u32)raw;
  return (raw & 0xffu) != 0;  // kBool
}
// (a float dtype: the value rounded to it through fp32, as torch's integer -> half / bfloat16 conversion does)
GPUOS_HD u64 int_to_raw(i64 v, u32 dt) {
  if (dt == kF32) return f32_bits((float)v);
  if (dt == kF16) return f32_to_f16((float)v);
  if (dt == kBF16) return f32_to_bf16((float)v);
  return dt == kBool ? (u64)(v != 0) : (u64)v;
}
// What a gather writes for an index out of range: NaN for float dtypes, 0 for integers.
GPUOS_HD u64 poison_bits(u32 dt) { return dt == kF32 ? 0x7fc00000ull : dt == kF16 ? 0x7e00ull : dt == kBF16 ? 0x7fc0ull : 0ull; }

GPUOS_HD u64 data_addr(const TensorRef& r, i64 linear) {
  return r.ptr + (u64)(ref_offset(r, linear) * (i64)dtype_size(r.dtype));
}
// Raw bits of input k at linear index e (a constant: the descriptor's in[k]).
GPUOS_HD u64 data_in(const SubOp& d, const TensorRef* refs, u32 k, i64 e) {
  if (d.flags & (kFlagConst0 << k)) return d.in[k];
  return ld_raw(data_addr(refs[k + 1], e), dtype_size(refs[k + 1].dtype));
}
// Input k as an integer (a float operand: truncated toward zero, as torch's float -> integer casts).
GPUOS_HD i64 data_int(const SubOp& d, const TensorRef* refs, u32 k, i64 e) {
  if (d.flags & (kFlagConst0 << k)) return (i64)d.in[k];
  const u32 dt = refs[k + 1].dtype;
  const u64 raw = data_in(d, refs, k, e);
  return dt <= kBF16 ? (i64)bits_value((u32)raw, dt) : raw_to_int(raw, dt);
}
// add_int's alpha and scatter's negative-index rule travel as the 64 bits of SubOp::scalar[0..1].
GPUOS_HD i64 data_scalar_bits(const SubOp& d) {
  return (i64)((u64)f32_bits(d.scalar[0]) | ((u64)f32_bits(d.scalar[1]) << 32));
}

// cmp's rule (the low bits of its scalar bits), and kCmpFloat: both operands are float dtypes of one kind (or fp32
// constants) compared in fp32; otherwise integers (int64 / int32 / bool; int64 constants) compared as int64.
enum CmpOp : u32 { kCmpLt = 0, kCmpLe = 1, kCmpGt = 2, kCmpGe = 3, kCmpEq = 4, kCmpNe = 5, kCmpFloat = 8 };
GPUOS_HD float data_f32(const SubOp& d, const TensorRef* refs, u32 k, i64 e) {
  if (d.flags & (kFlagConst0 << k)) return bits_f32((u32)d.in[k]);
  return bits_value((u32)data_in(d, refs, k, e), refs[k + 1].dtype);
}
template <class T>
GPUOS_HD bool cmp_apply(u32 rule, T a, T b) {
  switch (rule & 7u) {
    case kCmpLt: return a < b;
    case kCmpLe: return a <= b;
    case kCmpGt: return a > b;
    case kCmpGe: return a >= b;
    case kCmpEq: return a == b;
    default: return a != b;
  }
}

// Gather / scatter: the address in the indexed tensor (gather: refs[1], scatter: refs[0], each without the indexed
// dim) that linear index e moves from / to -- its index value read (index_put_'s negative rule applied) -- or 0 when
// that index is out of range. refs[3] describes the indexed dim (see data_elem).
GPUOS_HD u64 gs_addr(const SubOp& d, const TensorRef* refs, i64 e) {
  const TensorRef& dim = refs[3];
  const i64 inner = dim.sizes[1] > 0 ? dim.sizes[1] : 1;
  const i64 i0 = ((u64)e >> 32) == 0 && ((u64)inner >> 32) == 0 ? (i64)((u32)e / (u32)inner) : e / inner;
  const i64 r = e - i0 * inner;
  i64 iv = raw_to_int(ld_raw(data_addr(refs[2], i0), dtype_size(refs[2].dtype)), refs[2].dtype);
  if (iv < 0 && d.op == kOp_scatter && data_scalar_bits(d) == 1) iv += dim.sizes[0];
  if (iv < 0 || iv >= dim.sizes[0]) return 0;
  const TensorRef& side = d.op == kOp_gather ? refs[1] : refs[0];
  return side.ptr + (u64)((ref_offset(side, r) + iv * dim.strides[0]) * (i64)dtype_size(refs[0].dtype));
}

// One element (linear index e of the sub-op's iteration space) of a data-movement op other than argmax.
// Returns 1 when an index was out of range (nothing was read or written outside a tensor), else 0.
//   gather / scatter: refs[3] describes the indexed dim: sizes[0] its extent, strides[0] its stride, sizes[1] the
//   elements per index (the product of the other dims); the iteration space is the "linear" side (gather: out, whose
//   index dims come first; scatter: src with the indexed dim first). Scatter with scalar bits 1: negative indices
//   count from the end (index_put_), as torch's advanced indexing does; otherwise they are out of range.
GPUOS_HD u32 data_elem(const SubOp& d, const TensorRef* refs, i64 e) {
  const TensorRef& o = refs[0];
  const u32 sz = dtype_size(o.dtype);
  switch (d.op) {
    case kOp_gather:
    case kOp_scatter: {
      const bool gather = d.op == kOp_gather;
      const u64 lin = gather ? data_addr(o, e) : data_addr(refs[1], e);
      const u64 at = gs_addr(d, refs, e);
      if (at == 0) {
        if (gather) st_raw(lin, sz, poison_bits(o.dtype));
        return 1;
      }
      if (gather) st_raw(lin, sz, ld_raw(at, sz));
      else st_raw(at, sz, ld_raw(lin, sz));
      return 0;
    }
    case kOp_where: {
      const bool c = (data_in(d, refs, 0, e) & 0xffu) != 0;
      st_raw(data_addr(o, e), sz, data_in(d, refs, c ? 1u : 2u, e));
      return 0;
    }
    case kOp_add_int:
    case kOp_mul_int: {
      const u64 a = (u64)data_int(d, refs, 0, e), b = (u64)data_int(d, refs, 1, e);  // unsigned: wraps like torch
      const u64 v = d.op == kOp_add_int ? a + (u64)data_scalar_bits(d) * b : a * b;
      st_raw(data_addr(o, e), sz, int_to_raw((i64)v, o.dtype));
      return 0;
    }
    case kOp_arange:
      st_raw(data_addr(o, e), sz, int_to_raw((i64)(d.in[0] + (u64)e * d.in[1]), o.dtype));
      return 0;
    case kOp_fill:
      st_raw(data_addr(o, e), sz, d.in[0]);
      return 0;
    case kOp_cmp: {
      const u32 rule = (u32)data_scalar_bits(d);
      const bool v = (rule & kCmpFloat) ? cmp_apply(rule, data_f32(d, refs, 0, e), data_f32(d, refs, 1, e))
                                        : cmp_apply(rule, data_int(d, refs, 0, e), data_int(d, refs, 1, e));
      st_raw(data_addr(o, e), sz, v ? 1u : 0u);
      return 0;
    }
    default: break;
  }
  return 0;
}

// argmax order: does (v, i) come before (bv, bi)? NaN is the largest value; ties (and NaNs) take the first index.
GPUOS_HD bool arg_before(float v, i64 i, float bv, i64 bi) {
  if (is_nan(v)) return !is_nan(bv) || i < bi;
  if (is_nan(bv)) return false;
  return v > bv || (v == bv && i < bi);
}

#if defined(GPUOS_DEVICE_COMPILE)
// Rows [base, base + n) of argmax: one warp per row (refs: out over the leading dims, x with all dims; the
// worker's row_offset addresses both).
__device__ __noinline__ void argmax_rows(const SubOp& d, const TensorRef* refs, u32 lane) {
  const TensorRef& ro = refs[0];
  const TensorRef& rx = refs[1];
  const u32 nd = rx.ndim, dt = rx.dtype, esz = dtype_size(dt);
  const i64 cols = rx.sizes[nd - 1], xs = rx.strides[nd - 1];
  for (u32 k = 0; k < d.n; ++k) {
    const i64 row = (i64)d.base + k;
    const u64 xp = rx.ptr + (u64)(row_offset(rx, nd - 1, row) * (i64)esz);
    float bv = 0.0f;
    i64 bi = -1;
    for (i64 j = lane; j < cols; j += 32) {
      const float v = load_f32((const void*)xp, dt, j * xs);
      if (bi < 0 || arg_before(v, j, bv, bi)) bv = v, bi = j;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const i64 oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || arg_before(ov, oi, bv, bi))) bv = ov, bi = oi;
    }
    if (lane == 0) *(i64*)(ro.ptr + (u64)(row_offset(ro, ro.ndim, row) * 8)) = bi;
  }
}

// Whether a gather / scatter moves 16-byte vectors: the linear side's and the indexed side's last dims contiguous,
// both tensors 16-byte aligned with every other stride (and the indexed dim's) a multiple of a vector's elements,
// the per-index element count and the tile's base and size too -- so that a lane's ve consecutive elements share
// one index and are consecutive (and aligned) in both tensors. Returns the elements per vector, or 0.
__device__ __forceinline__ u32 data_vec_elems(const SubOp& d, const TensorRef* refs) {
  if (d.op != kOp_gather && d.op != kOp_scatter) return 0;
  const u32 sz = dtype_size(refs[0].dtype), ve = 16 / sz;
  const TensorRef& dim = refs[3];
  const i64 inner = dim.sizes[1] > 0 ? dim.sizes[1] : 1;
  if (sz < 2 || inner % ve != 0 || d.base % ve != 0 || d.n % ve != 0 || dim.strides[0] % ve != 0) return 0;
  for (u32 k = 0; k < 2; ++k) {
    const TensorRef& r = refs[k];
    if (r.ndim == 0 || (r.ptr & 15) != 0 || r.strides[r.ndim - 1] != 1 || r.sizes[r.ndim - 1] % ve != 0) return 0;
    for (u32 j = 0; j + 1 < r.ndim; ++j)
      if (r.sizes[j] > 1 && r.strides[j] % ve != 0) return 0;
  }
  return ve;
}
// The vector form of data_elem's gather / scatter: ve elements (one 16-byte vector) from linear index e.
__device__ __forceinline__ u32 data_gs_vec(const SubOp& d, const TensorRef* refs, i64 e) {
  const TensorRef& o = refs[0];
  const bool gather = d.op == kOp_gather;
  uint4* lin = (uint4*)(gather ? data_addr(o, e) : data_addr(refs[1], e));
  uint4* at = (uint4*)gs_addr(d, refs, e);
  if (at == nullptr) {
    if (gather) {
      const u64 pb = poison_bits(o.dtype);
      const u32 w = dtype_size(o.dtype) == 2 ? (u32)(pb | (pb << 16)) : (u32)pb;
      *lin = make_uint4(w, w, w, w);  // poison_bits is 0 for the 8-byte (integer) dtypes
    }
    return 1;
  }
  if (gather) *lin = *at;
  else *at = *lin;
  return 0;
}

// A data-movement sub-op: argmax's rows, or the elements [base, base + n) of the others (one warp).
__device__ __noinline__ void data_op(const SubOp& d, const TensorRef* refs, u32 lane, HostCtl* hc) {
  if (d.op == kOp_argmax) {
    argmax_rows(d, refs, lane);
    return;
  }
  u32 bad = 0;
  const u32 ve = data_vec_elems(d, refs);  // warp-uniform
  if (ve != 0)
    for (u32 i = lane * ve; i < d.n; i += 32 * ve) bad |= data_gs_vec(d, refs, (i64)d.base + i);
  else
    for (u32 i = lane; i < d.n; i += 32) bad |= data_elem(d, refs, (i64)d.base + i);
  if (__any_sync(0xffffffffu, bad != 0) && lane == 0) *(volatile u32*)&hc->index_fault = 1u;
}
#endif

}  // namespace gpuos
