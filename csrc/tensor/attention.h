// csrc/tensor/attention.h -- decode attention (device_src/attention.h) at the tensor layer: one set of checks for
// the explicit API (typed errors) and the scheduler (fallback reasons), and the one recording path.
#pragma once
#include <string>

#include "tensor/tensor.h"

namespace gpuos {

enum AttnCheckCode : int { kAttnOk = 0, kAttnBadDtype, kAttnBadShape, kAttnBadLayout, kAttnBadDevice };
struct AttnCheck {
  int code;
  std::string message;  // starts with "(q ... k ... v ...)": prefix the caller's name
};
// Can the worker run softmax(scale * q @ k^T + mask) @ v for these tensors? q: B x Hq x Lq x D, k / v:
// B x Hkv x Lk x D (Hq % Hkv == 0), fp16 / bf16, Lq <= kAttnMaxQuery, D a power of two in 8..256, k and v with
// 16-byte aligned head_dim-contiguous rows; mask (undefined: none) bool or float, broadcast to B x Hq x Lq x Lk.
AttnCheck check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          bool is_causal);
// Record it (checked): out B x Hq x Lq x D (any strides), lse (undefined: not written) B x Hq x Lq fp32; `written`
// (undefined: out) is a tensor whose storage range covers out and lse: the op's write footprint. Caller holds the
// runtime's lock and keeps the tensors alive until publication.
void record_attention_tensors(Runtime& rt, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mask, bool is_causal, float scale, const at::Tensor& out,
                              const at::Tensor& lse, const at::Tensor& written);
// gpuos_ext.submit_attention(q, k, v, out, attn_mask=None, is_causal=False, scale=None): typed errors.
void submit_attention(PyObject* q, PyObject* k, PyObject* v, PyObject* out, PyObject* mask, bool is_causal,
                      PyObject* scale);

}  // namespace gpuos
