// device_src/elementwise.h -- no host-only code, no system #includes.
// The elementwise sub-op template ew_op<F, arity> (strides, broadcast, fp16/bf16, 16-byte vectors) and tier-2
// fused_spec_op<F>, with the element access helpers they use. Included by the worker (device_src/worker.cu: the
// built-in ops, inlined as their own out-of-line instantiations) and, in linked mode (issue #18), by each
// injected op's or tier-2 program's own relocatable object (csrc/inject/linked.cpp), which instantiates the
// same templates for its functor. Everything here is a template, inline or `static` (one private copy per
// object), so two objects that include it link without duplicate symbols.
#pragma once
#include "device_src/config.h"
#include "device_src/types.h"
#include "device_src/numeric.h"
#include "device_src/interp.h"  // row programs: kRowMaxRed, row_init / row_combine

namespace gpuos {

// ---------------------------------------------------------------- element access
// ref_offset (the address walk of strided operands): device_src/types.h.

// 16-byte vectors: 4 fp32 values (VecF32), or 8 fp16 / bf16 values (Vec16, dtype chosen at run time: one copy
// of each op's vector loop serves both 16-bit types, which keeps the worker module -- and so the module load
// of a generation handover -- smaller; the conversions are a select, free next to the memory traffic).
struct VecF32 {
  static constexpr u32 N = 4;
  static __device__ __forceinline__ void unpack(const uint4& q, float* f, u32) {
    f[0] = __uint_as_float(q.x); f[1] = __uint_as_float(q.y); f[2] = __uint_as_float(q.z); f[3] = __uint_as_float(q.w);
  }
  static __device__ __forceinline__ void load(const void* p, float* f, u32 dt) { unpack(*(const uint4*)p, f, dt); }
  static __device__ __forceinline__ void store(void* p, const float* f, u32) {
    *(float4*)p = make_float4(f[0], f[1], f[2], f[3]);
  }
};
struct Vec16 {
  static constexpr u32 N = 8;
  static __device__ __forceinline__ float cvt(u16 h, u32 dt) { return dt == kF16 ? f16_to_f32(h) : bf16_to_f32(h); }
  static __device__ __forceinline__ u32 rnd(float f, u32 dt) { return dt == kF16 ? f32_to_f16(f) : f32_to_bf16(f); }
  static __device__ __forceinline__ void unpack(const uint4& q, float* f, u32 dt) {
    const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = cvt((u16)(w[i] & 0xffffu), dt);
      f[2 * i + 1] = cvt((u16)(w[i] >> 16), dt);
    }
  }
  static __device__ __forceinline__ void load(const void* p, float* f, u32 dt) { unpack(*(const uint4*)p, f, dt); }
  static __device__ __forceinline__ void store(void* p, const float* f, u32 dt) {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = rnd(f[2 * i], dt) | (rnd(f[2 * i + 1], dt) << 16);
    *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

__device__ __forceinline__ u32 dt_of(const SubOp& d, u32 k) { return (d.dtype >> (8 * k)) & 0xffu; }

// One 16-byte vector holds 4 fp32 or 8 fp16 / bf16 values; the functor runs on chunks of 4 (one chunk for fp32,
// two for 16-bit, in a loop that is not unrolled), so every op has one copy of its vector code for all three
// dtypes: the worker module -- and with it the module load of a generation handover -- stays small.
__device__ __forceinline__ void unpack4(const uint4& q, u32 dt, u32 c, float* f) {
  if (dt == kF32) {
    f[0] = __uint_as_float(q.x); f[1] = __uint_as_float(q.y); f[2] = __uint_as_float(q.z); f[3] = __uint_as_float(q.w);
    return;
  }
  const u32 w0 = c ? q.z : q.x, w1 = c ? q.w : q.y;
  f[0] = Vec16::cvt((u16)(w0 & 0xffffu), dt); f[1] = Vec16::cvt((u16)(w0 >> 16), dt);
  f[2] = Vec16::cvt((u16)(w1 & 0xffffu), dt); f[3] = Vec16::cvt((u16)(w1 >> 16), dt);
}
__device__ __forceinline__ void pack4(uint4& r, u32 dt, u32 c, const float* f) {
  if (dt == kF32) {
    r = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    return;
  }
  const u32 a = Vec16::rnd(f[0], dt) | (Vec16::rnd(f[1], dt) << 16), b = Vec16::rnd(f[2], dt) | (Vec16::rnd(f[3], dt) << 16);
  if (c) r.z = a, r.w = b;
  else r.x = a, r.y = b;
}

// One warp's loops are latency-bound (decode-sized tiles run one per warp): an iteration must issue all of its
// loads before it uses any. Measured with tools/warp_bench.cu (one warp, H200, 4,096 fp32 adds, L2-warm data):
// one 16-byte load per lane in flight 6.5 us, four 2.4 us; a loop that converts or spills each loaded value before
// the next load waits a round trip per element (the element loop's cast: 34 us; a load staged through a
// local-memory array: 85 us for a 4,096-element copy). So each iteration loads kEwLoads vectors / elements per
// lane into registers (static indices), then runs a non-unrolled loop over them that shifts the register array
// down (static indices again: the functor's code appears once per op, which keeps the worker module small).
constexpr u32 kEwLoads = 4;

// Contiguous, 16-byte aligned, every tensor operand of the output's dtype (constants allowed): the tile's whole
// vectors; returns how many elements it did (the rest goes through the element loop).
template <class F, u32 A>
__device__ __forceinline__ u32 ew_vec(const SubOp& d, u32 lane) {
  const u32 dt = d.dtype & 0xffu;
  const u32 per = dt == kF32 ? 4u : 8u;
  const u64 boff = (u64)d.base * (dt == kF32 ? 4u : 2u);
  const u32 nv = d.n / per;
  const float s0 = d.scalar[0], s1 = d.scalar[1];
  for (u32 v0 = lane; v0 < nv; v0 += 32 * kEwLoads) {
    uint4 q[kEwLoads][A];
#pragma unroll
    for (u32 u = 0; u < kEwLoads; ++u)
#pragma unroll
      for (u32 k = 0; k < A; ++k)
        q[u][k] = (d.flags & (kFlagConst0 << k)) || v0 + 32 * u >= nv
                      ? make_uint4(0u, 0u, 0u, 0u)
                      : *(const uint4*)((const char*)d.in[k] + boff + (u64)(v0 + 32 * u) * 16);
#pragma unroll 1
    for (u32 v = v0; v < nv && v < v0 + 32 * kEwLoads; v += 32) {
      uint4 r = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 1
      for (u32 c = 0; c < per / 4; ++c) {
        float x[3][4] = {};
#pragma unroll
        for (u32 k = 0; k < A; ++k) {
          if (d.flags & (kFlagConst0 << k)) x[k][0] = x[k][1] = x[k][2] = x[k][3] = bits_f32((u32)d.in[k]);
          else unpack4(q[0][k], dt, c, x[k]);
        }
#pragma unroll
        for (u32 i = 0; i < 4; ++i) x[0][i] = F::apply(x[0][i], x[1][i], x[2][i], s0, s1);
        pack4(r, dt, c, x[0]);
      }
      *(uint4*)((char*)d.out + boff + (u64)v * 16) = r;
#pragma unroll
      for (u32 u = 0; u + 1 < kEwLoads; ++u)
#pragma unroll
        for (u32 k = 0; k < A; ++k) q[u][k] = q[u + 1][k];
    }
  }
  return nv * per;
}

// A built-in elementwise sub-op: its 16-byte vector loop (ew_vec), then its element loops for the rest (mixed
// dtypes, unaligned, the vectors' tail, strided), one copy per op. __noinline__: one out-of-line function per op
// keeps the worker's NVRTC/ptxas time bounded (inlining every op into the dispatch switch made one huge function:
// ~50 s to compile on a 2-core machine). The element loops were shared per arity from the thirty-fifth to the
// fortieth session (the op through a switch, one call per element: ptxas 47 -> 29 s at -O1); under ptxas's
// fast-compile mode that no longer saves time (7.5 s shared, 7.7 s per op), and per op they are faster (H200,
// tools/ew_paths.py, 16M elements, one call: mixed fp16 + fp32 add 446 -> 327 us, strided add 780 -> 630, sin
// 664 -> 551, fp16 mul 768 -> 661; the vector loop 208 / 211).
template <class F, u32 A>
__device__ __noinline__ void ew_op(const SubOp& ds, const TensorRef* refs, u32 lane) {
  // The descriptor in registers: through a generic reference (it lives in shared memory), the compiler must
  // reload its fields after every global store.
  const SubOp d = ds;
  const u32 done = (d.flags & kFlagVec) ? ew_vec<F, A>(d, lane) : 0u;
  const u32 dto = d.dtype & 0xffu;
  const float s0 = d.scalar[0], s1 = d.scalar[1];
  if (!(d.flags & kFlagStrided)) {  // contiguous: mixed dtypes, unaligned, or the vectors' tail
    for (u32 i0 = done + lane; i0 < d.n; i0 += 32 * kEwLoads) {
      u32 raw[kEwLoads][3];
#pragma unroll
      for (u32 u = 0; u < kEwLoads; ++u)
#pragma unroll
        for (u32 k = 0; k < A; ++k)
          raw[u][k] = (d.flags & (kFlagConst0 << k)) ? (u32)d.in[k]
                      : i0 + 32 * u < d.n ? load_bits((const void*)d.in[k], dt_of(d, k + 1), (i64)d.base + i0 + 32 * u)
                                          : 0u;
#pragma unroll
      for (u32 u = 0; u < kEwLoads; ++u) {
        if (i0 + 32 * u >= d.n) break;
        float x[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
        for (u32 k = 0; k < A; ++k)
          x[k] = (d.flags & (kFlagConst0 << k)) ? bits_f32(raw[u][k]) : bits_value(raw[u][k], dt_of(d, k + 1));
        store_f32((void*)d.out, dto, (i64)d.base + i0 + 32 * u, F::apply(x[0], x[1], x[2], s0, s1));
      }
    }
    return;
  }
  // Strided: the address of every operand from its TensorRef (ref_offset, out of line: inlined per operand and
  // per op it made the worker module 2.8x larger, and its load at a generation handover as much slower).
  // kEwLoads elements per lane at once: their offsets in one walk per operand (ref_offset4: the divisions of the
  // four interleaved), then every load, then the stores. One walk per element and operand, each waiting on the
  // last, took ~2,000 cycles per element (eleventh session, warp_bench: a 4,096-element transposed add 130 us).
  static_assert(kEwLoads == 4, "ref_offset4 walks 4 elements");
  for (u32 i0 = lane; i0 < d.n; i0 += 32 * kEwLoads) {
    RefOffs<kEwLoads> off[A + 1];  // indices past d.n get offsets too (never used)
#pragma unroll
    for (u32 k = 0; k <= A; ++k)
      if (k == 0 || !(d.flags & (kFlagConst0 << (k - 1)))) off[k] = ref_offset4(refs[k], (i64)d.base + i0);
    u32 raw[kEwLoads][3];
#pragma unroll
    for (u32 u = 0; u < kEwLoads; ++u)
#pragma unroll
      for (u32 k = 0; k < A; ++k)
        raw[u][k] = (d.flags & (kFlagConst0 << k)) ? (u32)d.in[k]
                    : i0 + 32 * u < d.n ? load_bits((const void*)refs[k + 1].ptr, dt_of(d, k + 1), off[k + 1].v[u])
                                        : 0u;
#pragma unroll
    for (u32 u = 0; u < kEwLoads; ++u) {
      if (i0 + 32 * u >= d.n) break;
      float x[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
      for (u32 k = 0; k < A; ++k)
        x[k] = (d.flags & (kFlagConst0 << k)) ? bits_f32(raw[u][k]) : bits_value(raw[u][k], dt_of(d, k + 1));
      store_f32((void*)refs[0].ptr, dto, off[0].v[u], F::apply(x[0], x[1], x[2], s0, s1));
    }
  }
}

// ---------------------------------------------------------------- fused chains: operand offsets, tier 2
// An operand of a fused tile in registers (FusedArgs lives in shared memory and is reached through a generic
// reference: its fields would be reloaded after every store).
struct FusedReg {
  u64 ptr;
  i64 stride;
  u32 div, mod, dt;
};
// A tile's linear indices are below 2^32 (SubOp::base and n are 32-bit): 32-bit divisions, a fraction of the
// instructions of 64-bit ones.
__device__ __forceinline__ i64 fused_off(const FusedReg& o, i64 e) {
  u32 q = (u32)e;
  if (o.div > 1) q /= o.div;
  if (o.mod) q %= o.mod;
  return (i64)q * o.stride;
}

// The vector path of fused_rows (V = 4 evaluations): when the tile's rows are 8-aligned and every operand is either
// contiguous in aligned runs of 8 (one 16-byte vector, two for fp32; the output must be) or constant over each
// aligned 8 (one scalar load: a broadcast, a per-row value), a lane takes 8 consecutive elements of a row per
// 256-column chunk: one offset and one or two loads per operand, instead of the element path's per-element
// offset divisions and dtype branches (ncu on tools/warp_bench.cu, H200, 21st session: a LayerNorm row of 256
// fp16 took ~2,600 dependent warp instructions, 8.4 us, in the element path). A row that fits one chunk keeps its
// inputs in registers across the passes. Returns false (nothing done) when the tile does not qualify.
template <u32 R, u32 RI, class Ev>
__device__ __forceinline__ bool fused_rows_vec(const FusedReg* o, u32 n, u32 cols, i64 base, u32 nin, u32 nred,
                                               const u32* rop, const float* rscale, u32 lane, float (*r)[4],
                                               float* red, Ev& ev) {
  if (cols % 8 != 0 || (base & 7) != 0 || n % cols != 0) return false;
  u32 vmask = 0;  // bit k: operand k loads vectors (else one scalar per aligned 8)
#pragma unroll
  for (u32 k = 0; k <= RI; ++k) {
    if (k > nin) break;
    const FusedReg& x = o[k];
    const bool vec = x.div <= 1 && x.stride == 1 && x.mod % 8 == 0 && (x.ptr & 15) == 0;
    const bool uni = x.stride == 0 || (x.div >= 8 && x.div % 8 == 0);
    if (k == 0 ? !vec : !(vec || uni)) return false;
    if (vec) vmask |= 1u << k;
  }
  const bool one = cols <= 256;  // the row is one chunk: its inputs are loaded once for every pass
  const u32 c0 = 8 * lane;
  uint4 raw[RI][2];
  auto load = [&](i64 e) {
#pragma unroll
    for (u32 k = 0; k < RI; ++k) {
      if (k >= nin) break;
      const FusedReg& x = o[1 + k];
      if (vmask & (2u << k)) {
        const uint4* p = (const uint4*)((const char*)x.ptr + fused_off(x, e) * (x.dt == kF32 ? 4 : 2));
        raw[k][0] = p[0];
        raw[k][1] = x.dt == kF32 ? p[1] : make_uint4(0u, 0u, 0u, 0u);
      } else {
        raw[k][0].x = load_bits((const void*)x.ptr, x.dt, fused_off(x, e));
      }
    }
  };
  for (u32 r0 = 0; r0 < n; r0 += cols) {
    const i64 row = base + r0;
    if (one && c0 < cols) load(row + c0);
    for (u32 q = 0; q <= nred; ++q) {
      const bool out = q == nred;
      const u32 op = out ? 0u : rop[q];
      float acc = row_init(op);
      for (u32 c = c0; c < cols; c += 256) {
        if (!one) load(row + c);
        uint4 res[2] = {make_uint4(0u, 0u, 0u, 0u), make_uint4(0u, 0u, 0u, 0u)};
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
#pragma unroll
          for (u32 k = 0; k < RI; ++k) {
            if (k >= nin) break;
            const u32 dt = o[1 + k].dt;
            if (vmask & (2u << k)) {
              unpack4(raw[k][dt == kF32 ? h : 0], dt, h, r[k]);
            } else {
              const float v = bits_value(raw[k][0].x, dt);
              r[k][0] = r[k][1] = r[k][2] = r[k][3] = v;
            }
          }
          float val[4];
          ev(r, val, red, out ? ~0u : q);
          if (out) {
            pack4(res[o[0].dt == kF32 ? h : 0], o[0].dt, h, val);
          } else {
#pragma unroll
            for (u32 i = 0; i < 4; ++i) acc = row_combine(op, acc, val[i]);
          }
        }
        if (out) {
          uint4* p = (uint4*)((char*)o[0].ptr + fused_off(o[0], row + c) * (o[0].dt == kF32 ? 4 : 2));
          p[0] = res[0];
          if (o[0].dt == kF32) p[1] = res[1];
        }
      }
      if (out) break;
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) acc = row_combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, o2));
      red[q] = acc * rscale[q];
    }
  }
  return true;
}

// A fused program's tile. A row program (SubOp::reserved = the row length, cols; the tile holds whole rows): for
// each row, one pass per reduction (`ev` stopped at the q-th kOpRowRed gives the values it folds; folded over the
// lane's elements, then over the warp by shuffles), then the output pass. A chain (no reduction) is one row of
// the tile's d.n elements: the output pass alone. A lane takes V elements at once: ev(r, val, red, stop)
// evaluates them from r[k][v] (input k of element v) into val[v]. One loop for the interpreter (worker.cu
// fused_prog_op: R = kProgMaxRegs, the registers) and tier 2 (fused_spec_op: R = its inputs). The passes re-read
// the row's inputs (L1 / L2: a decode row is a few KiB).
template <u32 V, u32 R, class Ev>
__device__ __forceinline__ void fused_rows(const SubOp& d, const FusedArgs& fa, u32 nin, u32 nred, const u32* rop,
                                           const float* rscale, u32 lane, Ev ev) {
  // Inputs are loaded into `raw` (static indices: registers) before any is converted or copied into r (the
  // interpreter indexes r by register number: local memory), so that a lane's V x nin loads are in flight at once.
  constexpr u32 RI = R < kProgMaxInputs ? R : kProgMaxInputs;
  const u32 n = d.n, cols = d.reserved ? d.reserved : d.n;
  const i64 base = d.base;
  FusedReg o[RI + 1];
#pragma unroll
  for (u32 k = 0; k <= RI; ++k) {
    const bool used = k <= nin;
    o[k].ptr = used ? fa.opnd[k].ptr : 0u;
    o[k].stride = used ? fa.opnd[k].stride : 0;
    o[k].div = used ? fa.opnd[k].div : 1u;
    o[k].mod = used ? fa.opnd[k].mod : 0u;
    o[k].dt = used ? fa.dtype[k] : 0u;
  }
  float red[kRowMaxRed];
  float r[R][V];
  if constexpr (V == 4) {
    if (fused_rows_vec<R, RI>(o, n, cols, base, nin, nred, rop, rscale, lane, r, red, ev)) return;
  }
  for (u32 r0 = 0; r0 < n; r0 += cols) {
    const i64 row = base + r0;
    for (u32 q = 0; q <= nred; ++q) {
      const bool out = q == nred;
      const u32 op = out ? 0u : rop[q];
      float acc = row_init(op);
      for (u32 c0 = 0; c0 < cols; c0 += 32 * V) {
        u32 raw[RI][V];
#pragma unroll
        for (u32 k = 0; k < RI; ++k)
#pragma unroll
          for (u32 v = 0; v < V; ++v) {
            const u32 c = c0 + lane + 32 * v;
            raw[k][v] = k < nin && c < cols ? load_bits((const void*)o[1 + k].ptr, o[1 + k].dt, fused_off(o[1 + k], row + c))
                                            : 0u;
          }
#pragma unroll
        for (u32 k = 0; k < RI; ++k) {
          if (k >= nin) break;
#pragma unroll
          for (u32 v = 0; v < V; ++v) r[k][v] = bits_value(raw[k][v], o[1 + k].dt);
        }
        float val[V];
        ev(r, val, red, out ? ~0u : q);
#pragma unroll
        for (u32 v = 0; v < V; ++v) {
          const u32 c = c0 + lane + 32 * v;
          if (c >= cols) continue;
          if (out) store_f32((void*)o[0].ptr, o[0].dt, fused_off(o[0], row + c), val[v]);
          else acc = row_combine(op, acc, val[v]);
        }
      }
      if (out) break;
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) acc = row_combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, o2));
      red[q] = acc * rscale[q];
    }
  }
}

// Tier 2: a program with generated straight-line code (device_src/user_ops.h GPUOS_FUSED_SPECS): F::eval(x, red,
// stop) as run_program_v, F::kRows its reductions (0 for a chain), F::row_info their op ids and scales.
template <class F>
__device__ __noinline__ void fused_spec_op(const SubOp& d, const FusedArgs& fa, u32 lane) {
  u32 rop[kRowMaxRed];
  float rscale[kRowMaxRed];
  F::row_info(rop, rscale);
  fused_rows<4, F::kInputs>(d, fa, F::kInputs, F::kRows, rop, rscale, lane,
                            [](float (*r)[4], float* val, const float* red, u32 stop) {
#pragma unroll
                              for (u32 v = 0; v < 4; ++v) {
                                float x[F::kInputs];
#pragma unroll
                                for (u32 k = 0; k < F::kInputs; ++k) x[k] = r[k][v];
                                val[v] = F::eval(x, red, stop);
                              }
                            });
}

}  // namespace gpuos
