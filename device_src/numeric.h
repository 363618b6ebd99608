// device_src/numeric.h -- no host-only code, no system #includes.
// fp16 / bf16 <-> fp32 conversions usable by g++ (host, bit arithmetic) and NVRTC (device, cvt).
// Storage types are raw 16-bit words; math is always done in fp32 and rounded on store.
#pragma once
#include "device_src/config.h"

namespace gpuos {

GPUOS_HD u32 f32_bits(float f) {
  union { float f; u32 u; } v;
  v.f = f;
  return v.u;
}
GPUOS_HD float bits_f32(u32 u) {
  union { float f; u32 u; } v;
  v.u = u;
  return v.f;
}

GPUOS_HD float bf16_to_f32(u16 h) { return bits_f32(((u32)h) << 16); }

GPUOS_HD u16 f32_to_bf16(float f) {
#if defined(GPUOS_DEVICE_COMPILE) && defined(__CUDA_ARCH__)
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  u32 u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                      // round to nearest even
  return (u16)(u >> 16);
#endif
}

GPUOS_HD float f16_to_f32(u16 h) {
#if defined(GPUOS_DEVICE_COMPILE) && defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  u32 sign = ((u32)h & 0x8000u) << 16;
  u32 exp = ((u32)h >> 10) & 0x1fu;
  u32 man = (u32)h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // subnormal: value = man * 2^-24
    float v = (float)man * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
#endif
}

GPUOS_HD u16 f32_to_f16(float f) {
#if defined(GPUOS_DEVICE_COMPILE) && defined(__CUDA_ARCH__)
  u16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  u32 u = f32_bits(f);
  u32 sign = (u >> 16) & 0x8000u;
  u32 a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (u16)(sign | 0x7e00u);  // nan
  if (a >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // rounds to inf (>= 65520)
  if (a < 0x38800000u) {                               // below smallest normal 2^-14: subnormal / zero
    // value * 2^24 rounded to nearest even gives the subnormal mantissa
    float v = bits_f32(a) * 16777216.0f;
    u32 m = (u32)v;
    float frac = v - (float)m;
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m++;
    return (u16)(sign | m);
  }
  u32 exp = (a >> 23) - 112u;
  u32 man = a & 0x7fffffu;
  u32 h = (exp << 10) | (man >> 13);
  u32 rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // carries into exponent correctly
  return (u16)(sign | h);
#endif
}

// Element i of a buffer of dtype `dt` in two steps: its bits (fp32, or fp16 / bf16 in the low half), then their
// value. One warp's loops issue every load of an iteration before they convert any (a conversion right after its
// load stalls the warp until the load returns: each element then costs a memory round trip).
GPUOS_HD u32 load_bits(const void* p, u32 dt, i64 i) { return dt == 0 ? ((const u32*)p)[i] : (u32)((const u16*)p)[i]; }
GPUOS_HD float bits_value(u32 b, u32 dt) {
  return dt == 0 ? bits_f32(b) : dt == 1 ? f16_to_f32((u16)b) : bf16_to_f32((u16)b);
}
// Load element i as fp32 (both steps at once); store fp32 to it rounded to dtype.
GPUOS_HD float load_f32(const void* p, u32 dt, i64 i) { return bits_value(load_bits(p, dt, i), dt); }
GPUOS_HD void store_f32(void* p, u32 dt, i64 i, float v) {
  if (dt == 0) { ((float*)p)[i] = v; return; }
  ((u16*)p)[i] = dt == 1 ? f32_to_f16(v) : f32_to_bf16(v);
}

}  // namespace gpuos
