// csrc/tensor/attention.cpp -- decode attention (issue #16): the checks shared by gpuos_ext.submit_attention and
// the scheduler's sdpa handlers, the one tensor -> Runtime::record_attention path, and the explicit API.
#include "tensor/attention.h"

#include <cmath>

#include "tensor/devices.h"

namespace py = pybind11;

namespace gpuos {

namespace {
bool pow2_head_dim(int64_t d) { return d >= 8 && d <= (int64_t)kAttnMaxHeadDim && (d & (d - 1)) == 0; }
// A 16-byte aligned row-major run of D values per row: what the item's 16-byte loads need of k and v.
bool rows_vectorizable(const at::Tensor& t) {
  return t.stride(3) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0 &&
         ((uintptr_t)t.data_ptr() & 15) == 0;
}
std::string shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  return "(q " + shape_str(q) + " " + dtype_str(q) + ", k " + shape_str(k) + " " + dtype_str(k) + ", v " +
         shape_str(v) + " " + dtype_str(v) + (mask.defined() ? ", attn_mask " + shape_str(mask) + " " + dtype_str(mask)
                                                                : std::string()) + ")";
}
}  // namespace

AttnCheck check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          bool is_causal) {
  const std::string s = shapes(q, k, v, mask);
  for (const at::Tensor* t : {&q, &k, &v, &mask}) {
    if (!t->defined()) continue;
    if (!t->is_cuda()) return {kAttnBadDevice, s + ": every tensor must be a CUDA tensor"};
    if (t->layout() != at::kStrided) return {kAttnBadLayout, s + ": sparse / non-strided tensors are not supported"};
    if (t->get_device() != q.get_device()) return {kAttnBadDevice, s + ": every tensor must be on q's device"};
  }
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type() ||
      (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16))
    return {kAttnBadDtype, s + ": q, k and v must be one dtype, float16 or bfloat16. Fix: cast with .to(dtype), "
                              "or use torch.nn.functional.scaled_dot_product_attention for float32"};
  if (mask.defined() && mask.scalar_type() != at::kBool && dtype_code(mask.scalar_type()) < 0)
    return {kAttnBadDtype, s + ": attn_mask must be bool or a float dtype (float32 / float16 / bfloat16)"};
  if (mask.defined() && is_causal)
    return {kAttnBadShape, s + ": attn_mask and is_causal=True together are not supported (torch refuses them too)"};
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    return {kAttnBadShape, s + ": q, k and v must be 4-D (batch, heads, length, head_dim)"};
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), D = q.size(3), Hkv = k.size(1), Lk = k.size(2);
  if (k.size(0) != B || v.size(0) != B || v.size(1) != Hkv || v.size(2) != Lk || k.size(3) != D || v.size(3) != D)
    return {kAttnBadShape, s + ": k and v must be (batch, kv_heads, kv_len, head_dim) with q's batch and head_dim"};
  if (Hkv == 0 || Hq % Hkv != 0)
    return {kAttnBadShape, s + ": q's heads must be a multiple of k's heads (GQA / MQA)"};
  if (Lq < 1 || Lq > (int64_t)kAttnMaxQuery)
    return {kAttnBadShape, s + ": query length " + std::to_string(Lq) + " is outside 1.." +
                               std::to_string(kAttnMaxQuery) + " (the worker's decode attention). Fix: use "
                               "torch.nn.functional.scaled_dot_product_attention for prefill"};
  if (Lk < 1 || Lk >= (int64_t(1) << 31))
    return {kAttnBadShape, s + ": kv length must be 1 .. 2^31 - 1"};
  if (!pow2_head_dim(D))
    return {kAttnBadShape, s + ": head_dim " + std::to_string(D) + " is not supported (8, 16, 32, 64, 128 or 256)"};
  if (B >= (int64_t(1) << 24) || Hq >= (int64_t(1) << 24))
    return {kAttnBadShape, s + ": batch and heads must be below 2^24"};
  if (!rows_vectorizable(k) || !rows_vectorizable(v))
    return {kAttnBadLayout, s + ": k and v need head_dim contiguous (stride 1), 16-byte aligned rows. Fix: "
                               ".contiguous() them"};
  if (mask.defined()) {
    if (mask.dim() > 4) return {kAttnBadShape, s + ": attn_mask has more than 4 dims"};
    const int64_t want[4] = {B, Hq, Lq, Lk};
    for (int64_t i = 0; i < mask.dim(); ++i) {
      const int64_t m = mask.size(mask.dim() - 1 - i), w = want[3 - i];
      if (m != w && m != 1) return {kAttnBadShape, s + ": attn_mask must broadcast to (batch, heads, q_len, kv_len)"};
    }
  }
  return {kAttnOk, ""};
}

void record_attention_tensors(Runtime& rt, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mask, bool is_causal, float scale, const at::Tensor& out,
                              const at::Tensor& lse, const at::Tensor& written) {
  AttnArgs a{};
  a.B = (uint32_t)q.size(0), a.Hq = (uint32_t)q.size(1), a.Lq = (uint32_t)q.size(2), a.D = (uint32_t)q.size(3);
  a.Hkv = (uint32_t)k.size(1), a.Lk = (uint32_t)k.size(2);
  a.out = (uint64_t)(uintptr_t)out.data_ptr();
  for (int i = 0; i < 4; ++i) a.os[i] = out.stride(i);
  a.mode = is_causal ? kAttnCausal : 0u;
  at::Tensor me;
  if (mask.defined()) {
    me = mask.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
    a.mask = (uint64_t)(uintptr_t)me.data_ptr();
    for (int i = 0; i < 4; ++i) a.ms[i] = me.stride(i);
    a.mode |= mask.scalar_type() == at::kBool ? kAttnMaskBool
                                              : kAttnMaskFloat | (uint32_t)dtype_code(mask.scalar_type()) << kAttnMaskDtypeShift;
  }
  if (lse.defined()) {
    a.lse = (uint64_t)(uintptr_t)lse.data_ptr();
    for (int i = 0; i < 3; ++i) a.ls[i] = lse.stride(i);
    a.mode |= kAttnLse;
  }
  Operand w = operand(written.defined() ? written : out);
  const Operand oo = operand(out);
  w.dtype = oo.dtype;
  Operand mo;
  if (mask.defined()) {
    mo = operand(me);
    mo.dtype = 0;  // a bool mask has no DType code; the footprint is what the hazard model reads
  }
  rt.record_attention(w, a, operand(q), make_ref(q, 4), operand(k), make_ref(k, 4), operand(v), make_ref(v, 4),
                      mask.defined() ? &mo : nullptr, scale);
}

void submit_attention(PyObject* pq, PyObject* pk, PyObject* pv, PyObject* pout, PyObject* pmask, bool is_causal,
                      PyObject* pscale) {
  const char* who = "gpuos_ext.submit_attention";
  const at::Tensor& q = as_tensor(pq, who, "q");
  const at::Tensor& k = as_tensor(pk, who, "k");
  const at::Tensor& v = as_tensor(pv, who, "v");
  const at::Tensor& out = as_tensor(pout, who, "out");
  at::Tensor mask;
  if (pmask && pmask != Py_None) mask = as_tensor(pmask, who, "attn_mask");
  const AttnCheck c = check_attention(q, k, v, mask, is_causal);
  if (c.code == kAttnBadDtype) throw py::type_error(std::string(who) + c.message);
  if (c.code != kAttnOk) throw py::value_error(std::string(who) + c.message);
  if (!out.is_cuda() || out.get_device() != q.get_device() || out.sizes() != q.sizes() ||
      out.scalar_type() != q.scalar_type())
    throw py::value_error(std::string(who) + ": out must be a CUDA tensor of q's shape " + shape_str(q) + ", dtype " +
                          dtype_str(q) + " and device; got " + shape_str(out) + " " + dtype_str(out));
  if (has_internal_overlap(out))
    throw py::value_error(std::string(who) + ": out has stride-0 (expanded) dims. Fix: write to a separate tensor.");
  for (const at::Tensor* in : {&q, &k, &v, (const at::Tensor*)&mask})
    if (in->defined() && partially_overlaps(out, *in, /*allow_identical=*/false))
      throw py::value_error(std::string(who) + ": out overlaps an input. Fix: write to a separate tensor.");
  double scale = 1.0 / std::sqrt((double)q.size(3));
  if (pscale && pscale != Py_None) {
    scale = PyFloat_AsDouble(pscale);
    if (PyErr_Occurred()) throw py::error_already_set();
  }
  const int dev = q.get_device();
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  before_record(dev, rt);
  record_keeping(dev, {pq, pk, pv, pout, mask.defined() ? pmask : nullptr}, [&] {
    record_attention_tensors(rt, q, k, v, mask, is_causal, (float)scale, out, at::Tensor(), at::Tensor());
  });
}

}  // namespace gpuos
