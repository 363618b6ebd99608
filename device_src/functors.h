// device_src/functors.h -- no host-only code, no system #includes.
// The math of every operator in fp32: plain C++ that the worker calls on the GPU and that g++ compiles into
// the extension for the CPU numerics tests (gpuos_ext._cpu_apply / _cpu_reduce).
#pragma once
#include "device_src/config.h"
#include "device_src/numeric.h"

namespace gpuos {

// ---- math wrappers: CUDA builtins under NVRTC, GCC builtins on the host (no <cmath> needed) ----
#if defined(GPUOS_DEVICE_COMPILE)
#define GPUOS_M(f) f
#else
#define GPUOS_M(f) __builtin_##f
#endif
GPUOS_HD float m_exp(float x) { return GPUOS_M(expf)(x); }
GPUOS_HD float m_expm1(float x) { return GPUOS_M(expm1f)(x); }
GPUOS_HD float m_log(float x) { return GPUOS_M(logf)(x); }
GPUOS_HD float m_log1p(float x) { return GPUOS_M(log1pf)(x); }
GPUOS_HD float m_sqrt(float x) { return GPUOS_M(sqrtf)(x); }
GPUOS_HD float m_tanh(float x) { return GPUOS_M(tanhf)(x); }
GPUOS_HD float m_erf(float x) { return GPUOS_M(erff)(x); }
GPUOS_HD float m_sin(float x) { return GPUOS_M(sinf)(x); }
GPUOS_HD float m_cos(float x) { return GPUOS_M(cosf)(x); }
GPUOS_HD float m_pow(float x, float y) { return GPUOS_M(powf)(x, y); }
GPUOS_HD float m_abs(float x) { return GPUOS_M(fabsf)(x); }
#undef GPUOS_M
GPUOS_HD bool is_nan(float x) { return x != x; }
GPUOS_HD float m_inf() { return bits_f32(0x7f800000u); }
GPUOS_HD float m_nan() { return bits_f32(0x7fc00000u); }
// NaN-propagating max / min (torch.maximum / minimum / amax semantics).
GPUOS_HD float max_nan(float a, float b) { return is_nan(a) || is_nan(b) ? m_nan() : (a > b ? a : b); }
GPUOS_HD float min_nan(float a, float b) { return is_nan(a) || is_nan(b) ? m_nan() : (a < b ? a : b); }
GPUOS_HD float sigmoid_f(float x) { return 1.0f / (1.0f + m_exp(-x)); }
GPUOS_HD float relu6_f(float x) { return x < 0.0f ? 0.0f : (x > 6.0f ? 6.0f : x); }

// ---- elementwise functors: apply(a, b, c, s0, s1); unused inputs are 0 ----
#define GPUOS_EW(name, expr) \
  struct name { static GPUOS_HD float apply(float a, float b, float c, float s0, float s1) { (void)a; (void)b; (void)c; (void)s0; (void)s1; return (expr); } };
GPUOS_EW(AddF, s0 == 1.0f ? a + b : a + s0 * b)
GPUOS_EW(SubF, s0 == 1.0f ? a - b : a - s0 * b)
GPUOS_EW(MulF, a * b)
GPUOS_EW(DivF, a / b)
GPUOS_EW(MaximumF, max_nan(a, b))
GPUOS_EW(MinimumF, min_nan(a, b))
GPUOS_EW(PowF, m_pow(a, b))
GPUOS_EW(NegF, -a)
GPUOS_EW(CopyF, a)  // copy / cast: the conversion is the load and the store
GPUOS_EW(ReciprocalF, 1.0f / a)
GPUOS_EW(AbsF, m_abs(a))
GPUOS_EW(ReluF, a <= 0.0f ? 0.0f : a)  // NaN stays NaN
GPUOS_EW(SigmoidF, sigmoid_f(a))
GPUOS_EW(TanhF, m_tanh(a))
GPUOS_EW(ExpF, m_exp(a))
GPUOS_EW(LogF, m_log(a))
GPUOS_EW(SqrtF, m_sqrt(a))
GPUOS_EW(RsqrtF, 1.0f / m_sqrt(a))
GPUOS_EW(SinF, m_sin(a))
GPUOS_EW(CosF, m_cos(a))
GPUOS_EW(ErfF, m_erf(a))
GPUOS_EW(SiluF, a * sigmoid_f(a))
GPUOS_EW(HardsigmoidF, relu6_f(a + 3.0f) / 6.0f)
GPUOS_EW(HardswishF, a * relu6_f(a + 3.0f) / 6.0f)
GPUOS_EW(GeluF, 0.5f * a * (1.0f + m_erf(a * 0.70710678118654752f)))
GPUOS_EW(GeluTanhF, 0.5f * a * (1.0f + m_tanh(0.79788456080286536f * (a + 0.044715f * a * a * a))))
GPUOS_EW(LeakyReluF, a > 0.0f ? a : a * s0)
GPUOS_EW(EluF, a > 0.0f ? a : s0 * m_expm1(a))
GPUOS_EW(SoftplusF, a * s0 > s1 ? a : m_log1p(m_exp(a * s0)) / s0)
// clamp / hardtanh: NaN input stays NaN; min > max gives max (as torch.clamp)
GPUOS_EW(ClampF, (a < s0 ? s0 : a) > s1 ? s1 : (a < s0 ? s0 : a))
GPUOS_EW(ClampMinF, a < s0 ? s0 : a)
GPUOS_EW(ClampMaxF, a > s0 ? s0 : a)
GPUOS_EW(ClampTensorF, min_nan(max_nan(a, b), c))
#undef GPUOS_EW

// ---- last-dim reduction rules: identity + combine (fp32 accumulation) ----
// Row rules. Rule: the instantiation the worker runs (ops that share a fold share one copy of the code);
// kRowOut: the rule can end in softmax / log_softmax's per-element pass.
struct SumR {
  using Rule = SumR;
  static constexpr bool kRowOut = false;
  static GPUOS_HD float init() { return 0.0f; }
  static GPUOS_HD float combine(float x, float y) { return x + y; }
};
struct MeanR : SumR {};
struct AmaxR {
  using Rule = AmaxR;
  static constexpr bool kRowOut = true;
  static GPUOS_HD float init() { return -m_inf(); }
  static GPUOS_HD float combine(float x, float y) { return max_nan(x, y); }
};
struct AminR {
  using Rule = AminR;
  static constexpr bool kRowOut = false;
  static GPUOS_HD float init() { return m_inf(); }
  static GPUOS_HD float combine(float x, float y) { return min_nan(x, y); }
};
struct SoftmaxR : AmaxR {};
struct LogSoftmaxR : AmaxR {};

// kind 2: matmul (device_src/matmul.h); its functor column names this tag (no per-element rule).
struct MatmulK {};
// kind 4: data movement (device_src/dataops.h); its functor column names this tag.
struct DataK {};

// kind 3: decode attention (device_src/attention.h).
struct AttentionK {};

enum OpKind : u32 { kKindEw = 0, kKindReduce = 1, kKindMatmul = 2, kKindAttention = 3, kKindData = 4 };
enum OpId : u32 {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) kOp_##name = id,
#include "device_src/ops.def"
#undef GPUOS_OP
  kNumOps
};

}  // namespace gpuos
