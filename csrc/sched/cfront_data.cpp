// csrc/sched/cfront_data.cpp -- the dispatcher front's own records of data-movement ops (cfront.h,
// cfront_native.cpp's data kinds): the mask builders' and fills' data ops (scalar_tensor, zeros / ones / full,
// where.self, integer arange: _data_handlers -> sched_data), comparisons and integer add / sub / mul (functional and
// in place: _int_handlers), embedding, argmax, and KV cache writes (index_copy_, in place) -- each through
// data_record, the core of the sched_data entry point its Python handler calls, from the dispatcher's stack. A
// refusal: the handler decides (functional ops: a direct call; in place: the dispatch mode).
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/bit_cast.h>

#include <cmath>

#include "device_src/dataops.h"
#include "ops/op_table.h"
#include "sched/cfront.h"
#include "sched/dispatch.h"
#include "sched/record.h"
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {
namespace {

// A number operand of a binary op: a Scalar on the stack, or a CPU 0-d tensor (a Python number at the dispatcher, or
// a real one: read on the host, as _data_handlers._scalar_value reads it).
bool number_of(const c10::IValue& v, c10::Scalar* s) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || t.dim() != 0 || !t.device().is_cpu() || t.is_complex()) return false;
    *s = t.item();
    return true;
  }
  if (!v.isScalar()) return false;
  *s = v.toScalar();
  return !s->isComplex();
}

// The operands of a binary data op (a[0], a[1]) as the integer and compare handlers take them: each CUDA tensor
// (plain) into ins[k], their broadcast shape into *shape and the first of them into *first; each other operand a
// number (number_of) whose constant bits bits_of_number(k, value, &bits[k]) gives, or refuses with a reason. Returns a
// reason, or -1 (kR_not_cuda: no CUDA tensor).
template <class Bits>
int binary_operands(const c10::IValue* a, at::Tensor* ins, uint64_t* bits, std::vector<int64_t>* shape,
                    const at::Tensor** first, Bits bits_of_number) {
  for (int k = 0; k < 2; ++k) {
    if (a[k].isTensor() && a[k].toTensor().defined() && a[k].toTensor().is_cuda()) {
      const at::Tensor& t = a[k].toTensor();
      if (!plain_cuda_keys(t)) return kR_unsupported_args;
      *shape = *first ? at::infer_size(*shape, t.sizes()) : t.sizes().vec();
      *first = *first ? *first : &t;
      ins[k] = t;
      continue;
    }
    c10::Scalar v;
    if (!number_of(a[k], &v)) return kR_unsupported_args;
    if (int r = bits_of_number(k, v, &bits[k]); r >= 0) return r;
  }
  return *first ? -1 : kR_not_cuda;
}

// lt / le / gt / ge / eq / ne (.Tensor / .Scalar) as _int_handlers._compare takes them: a bool mask of the CUDA
// operands' broadcast shape; integer operands compared as int64 (integer constants), float operands of the result's
// dtype (fp32 / fp16 / bf16; a number rounded to that dtype first, as torch rounds it) in fp32.
EwRecorded compare_record(uint32_t rule, const c10::IValue* a, size_t n, int64_t thr) {
  if (n != 2) return ew_reason(kR_unsupported_args);
  at::ScalarType dt;
  c10::Scalar s1;
  if (a[0].isTensor() && a[1].isTensor()) dt = at::result_type(a[0].toTensor(), a[1].toTensor());
  else if (a[0].isTensor() && number_of(a[1], &s1)) dt = at::result_type(a[0].toTensor(), s1);
  else return ew_reason(kR_unsupported_args);
  const bool fl = at::isFloatingType(dt);
  if (fl && dtype_code(dt) < 0) return ew_reason(kR_dtype);
  for (int k = 0; k < 2; ++k)
    if (fl && a[k].isTensor() && a[k].toTensor().defined() && a[k].toTensor().is_cuda() &&
        a[k].toTensor().scalar_type() != dt)
      return ew_reason(kR_dtype);
  at::Tensor ins[2];
  uint64_t bits[2] = {0, 0};
  const at::Tensor* first = nullptr;
  std::vector<int64_t> shape;
  const int why = binary_operands(a, ins, bits, &shape, &first, [&](int, const c10::Scalar& v, uint64_t* b) {
    if (fl) {  // rounded to the tensor's dtype first, then compared in fp32
      const float f = (float)(v.isBoolean() ? (double)v.toBool() : v.isIntegral(false) ? (double)v.toLong()
                                                                                         : v.toDouble());
      const float r = dt == at::kHalf ? (float)c10::Half(f) : dt == at::kBFloat16 ? (float)c10::BFloat16(f) : f;
      *b = c10::bit_cast<uint32_t>(r);
    } else if (v.isFloatingPoint()) {
      const double d = v.toDouble();
      if (!std::isfinite(d) || d != std::trunc(d)) return (int)kR_dtype;
      *b = (uint64_t)(int64_t)d;
    } else {
      *b = (uint64_t)(v.isBoolean() ? (int64_t)v.toBool() : v.toLong());
    }
    return -1;
  });
  if (why >= 0) return ew_reason(why);
  at::Tensor out = at::empty(shape, first->options().dtype(at::kBool));
  if (int r = data_record(kOp_cmp, out, ins, bits, 2, 0, rule | (fl ? kCmpFloat : 0), false, true, thr))
    return ew_reason(r);
  return EwRecorded{std::move(out), -1, false};
}

// embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False) as _data_handlers._embedding:
// a row gather of a 2-D weight (the other arguments change only the backward).
EwRecorded embedding_record(const c10::IValue* a, size_t n, int64_t thr) {
  const at::Tensor &w = a[0].toTensor(), &idx = a[1].toTensor();
  if (n < 2 || w.dim() != 2) return ew_reason(kR_unsupported_args);
  std::vector<int64_t> shape = idx.sizes().vec();
  shape.push_back(w.size(1));
  at::Tensor out = at::empty(shape, w.options());
  const at::Tensor ins[2] = {w, idx};
  const uint64_t bits[2] = {0, 0};
  if (int r = data_record(kOp_gather, out, ins, bits, 2, 0, 0, false, true, thr)) return ew_reason(r);
  return EwRecorded{std::move(out), -1, false};
}

// A factory's (dtype, layout, device, pin_memory) from a[0..3] as _data_handlers._factory_device takes them: strided,
// not pinned, on a CUDA device named with its index (no index: the handler finds the current one).
bool factory_args(const c10::IValue* a, at::ScalarType dflt, at::TensorOptions* o) {
  if (!a[1].isNone() && (c10::Layout)a[1].toInt() != c10::kStrided) return false;
  if (!a[3].isNone() && a[3].toBool()) return false;
  if (a[2].isNone()) return false;
  const c10::Device dev = a[2].toDevice();
  if (!dev.is_cuda() || !dev.has_index()) return false;
  *o = at::TensorOptions().device(dev).dtype(a[0].isNone() ? dflt : (at::ScalarType)a[0].toInt());
  return true;
}

bool scalar_of(const c10::IValue& v, c10::Scalar* s) {
  if (v.isBool()) *s = c10::Scalar(v.toBool());
  else if (v.isInt()) *s = c10::Scalar(v.toInt());
  else if (v.isDouble()) *s = c10::Scalar(v.toDouble());
  else return false;
  return true;
}

// A fresh tensor of `shape` filled with v, as _data_handlers._fill_new makes it: the fill data op.
EwRecorded fill_new(const c10::Scalar& v, at::IntArrayRef shape, const at::TensorOptions& o, int64_t thr) {
  uint64_t b = 0;
  try {
    b = bits_of(v, o.dtype().toScalarType());
  } catch (const std::exception&) {  // overflow / not an integer: the handler's reason
    return ew_reason(kR_unsupported_args);
  }
  at::Tensor out = at::empty(shape, o);
  const at::Tensor none;
  if (int r = data_record(kOp_fill, out, &none, &b, 1, 0, 0, false, true, thr)) return ew_reason(r);
  return EwRecorded{std::move(out), -1, false};
}

// scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None) as _data_handlers._scalar_tensor: a
// fill of a fresh 0-d tensor (the default dtype when none is given). torch.where(cond, number, number) makes two.
EwRecorded scalar_tensor_record(const c10::IValue* a, size_t n, int64_t thr) {
  c10::Scalar v;
  at::TensorOptions o;
  if (n != 5 || !scalar_of(a[0], &v) || !factory_args(a + 1, c10::get_default_dtype_as_scalartype(), &o))
    return ew_reason(kR_unsupported_args);
  return fill_new(v, {}, o, thr);
}

// zeros / ones (size, *, dtype=None, layout=None, device=None, pin_memory=None) and full (size, fill_value, *, ...)
// as _data_handlers._full: a fill of a fresh tensor; the dtype when none is given: the default dtype for zeros /
// ones, full's by its value (bool, int64, or the default dtype).
EwRecorded full_record(const c10::OperatorName& name, const c10::IValue* a, size_t n, int64_t thr) {
  const bool full = name.name == "aten::full";
  c10::Scalar v = name.name == "aten::ones" ? c10::Scalar(int64_t(1)) : c10::Scalar(int64_t(0));
  if (n != (full ? 6u : 5u) || !a[0].isIntList() || (full && !scalar_of(a[1], &v)))
    return ew_reason(kR_unsupported_args);
  at::ScalarType dflt = c10::get_default_dtype_as_scalartype();
  if (full && v.isBoolean()) dflt = at::kBool;
  else if (full && v.isIntegral(false)) dflt = at::kLong;
  at::TensorOptions o;
  if (!factory_args(a + (full ? 2 : 1), dflt, &o)) return ew_reason(kR_unsupported_args);
  const std::vector<int64_t> shape = a[0].toIntVector();
  return fill_new(v, shape, o, thr);
}

// where.self(condition, self, other) as _data_handlers._where for tensor operands already of the result dtype (0-d
// ones of another float dtype, and wrapped numbers, go to the handler, which casts them or takes them as constants).
EwRecorded where_record(const c10::IValue* a, size_t n, int64_t thr) {
  if (n != 3 || !a[1].isTensor() || !a[2].isTensor()) return ew_reason(kR_unsupported_args);
  const at::Tensor &c = a[0].toTensor(), &x = a[1].toTensor(), &y = a[2].toTensor();
  if (!x.defined() || !y.defined() || !plain_cuda_keys(x) || !plain_cuda_keys(y) || c.scalar_type() != at::kBool)
    return ew_reason(kR_unsupported_args);
  const at::ScalarType dt = at::result_type(x, y);
  if (x.scalar_type() != dt || y.scalar_type() != dt) return ew_reason(kR_dtype);
  const std::vector<int64_t> shape = at::infer_size(at::infer_size(c.sizes(), x.sizes()), y.sizes());
  at::Tensor out = at::empty(shape, c.options().dtype(dt));
  const at::Tensor ins[3] = {c, x, y};
  const uint64_t bits[3] = {0, 0, 0};
  if (int r = data_record(kOp_where, out, ins, bits, 3, 0, 0, false, true, thr)) return ew_reason(r);
  return EwRecorded{std::move(out), -1, false};
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// arange(end) / arange.start(start, end) / arange.start_step(start, end, step), each with (dtype, layout, device,
// pin_memory), as _data_handlers._arange: integer bounds and an integer dtype (int64 by default); float ones go to the
// handler (which leaves them eager).
EwRecorded arange_record(const c10::IValue* a, size_t n, int64_t thr) {
  if (n < 5 || n > 7) return ew_reason(kR_unsupported_args);
  const size_t nb = n - 4;  // bounds
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < nb; ++i) {
    if (a[i].isInt()) v[nb == 1 ? 1 : i] = a[i].toInt();
    else if (a[i].isBool()) v[nb == 1 ? 1 : i] = a[i].toBool();
    else return ew_reason(kR_unsupported_args);
  }
  at::TensorOptions o;
  if (!factory_args(a + nb, at::kLong, &o)) return ew_reason(kR_unsupported_args);
  const at::ScalarType dt = o.dtype().toScalarType();
  const int64_t start = v[0], end = v[1], step = v[2];
  if ((dt != at::kLong && dt != at::kInt) || step == 0) return ew_reason(kR_unsupported_args);
  const __int128 span = (__int128)end - start;
  if (span > INT64_MAX || span <= INT64_MIN) return ew_reason(kR_unsupported_args);
  const int64_t count = std::max<int64_t>(0, -floor_div(-(int64_t)span, step));
  uint64_t bits[2] = {0, 0};
  try {
    bits[0] = bits_of(c10::Scalar(start), dt), bits[1] = bits_of(c10::Scalar(step), dt);
    const __int128 last = (__int128)start + (__int128)(count ? count - 1 : 0) * step;
    if (last > INT64_MAX || last < INT64_MIN) return ew_reason(kR_unsupported_args);
    bits_of(c10::Scalar((int64_t)last), dt);
  } catch (const std::exception&) {
    return ew_reason(kR_unsupported_args);
  }
  at::Tensor out = at::empty({count}, o);
  const at::Tensor ins[2];
  if (int r = data_record(kOp_arange, out, ins, bits, 2, 0, 0, false, true, thr)) return ew_reason(r);
  return EwRecorded{std::move(out), -1, false};
}

// add / sub / mul (.Tensor / .Scalar; functional, or in place: add_ / sub_ / mul_) on integer operands as
// _int_handlers._int_arith takes them: the result dtype int64 / int32, CUDA tensors broadcast, numbers and CPU 0-d
// tensors (Python numbers at the dispatcher) as integer constants, an integer alpha; add_int / mul_int in integer
// arithmetic (wrapping like torch). In place: the result is self, which must have the result's dtype and shape.
EwRecorded int_arith_record(uint32_t op, int64_t sign, bool inplace, const c10::IValue* a, size_t n, int64_t thr) {
  if (n < 2) return ew_reason(kR_unsupported_args);
  int64_t alpha = 1;
  if (n > 2) {
    if (a[2].isInt()) alpha = a[2].toInt();
    else if (a[2].isBool()) alpha = a[2].toBool();
    else return ew_reason(kR_unsupported_args);
  }
  at::ScalarType dt;
  if (a[0].isTensor() && a[1].isTensor()) dt = at::result_type(a[0].toTensor(), a[1].toTensor());
  else if (a[0].isTensor() && a[1].isScalar()) dt = at::result_type(a[0].toTensor(), a[1].toScalar());
  else return ew_reason(kR_unsupported_args);
  if (dt != at::kLong && dt != at::kInt) return ew_reason(kR_dtype);
  at::Tensor ins[2];
  uint64_t bits[2] = {0, 0};
  const at::Tensor* first = nullptr;
  std::vector<int64_t> shape;
  const int why = binary_operands(a, ins, bits, &shape, &first, [](int, const c10::Scalar& v, uint64_t* b) {
    if (!v.isIntegral(true)) return (int)kR_unsupported_args;  // (an integer constant only)
    *b = (uint64_t)(v.isBoolean() ? (int64_t)v.toBool() : v.toLong());
    return -1;
  });
  if (why >= 0) return ew_reason(why);
  if (inplace && (!ins[0].defined() || ins[0].scalar_type() != dt || ins[0].sizes() != at::IntArrayRef(shape)))
    return ew_reason(kR_unsupported_args);  // (eager casts or raises)
  at::Tensor out = inplace ? ins[0] : at::empty(shape, first->options().dtype(dt));
  if (int r = data_record(op, out, ins, bits, 2, 0, sign * alpha, false, !inplace, thr)) return ew_reason(r);
  return EwRecorded{std::move(out), -1, inplace};
}

// index_copy_(self, dim, index, source) as _data_handlers._index_copy_ takes it (a KV cache write): self[..., index[i],
// ...] = source[..., i, ...] along dim, index int64 of one dim (or 0-d: one position), source of self's rank and
// exactly the written shape (torch's rules); the worker's scatter, self written in place.
EwRecorded index_copy_record(const c10::IValue* a, size_t n, int64_t thr) {
  if (n != 4 || !a[1].isInt() || !a[2].isTensor() || !a[3].isTensor()) return ew_reason(kR_unsupported_args);
  const at::Tensor &self = a[0].toTensor(), &idx = a[2].toTensor();
  const at::Tensor& src = a[3].toTensor();
  if (!idx.defined() || !src.defined() || !plain_cuda_keys(idx) || !plain_cuda_keys(src))
    return ew_reason(kR_unsupported_args);
  int64_t dim = a[1].toInt();
  const int64_t nd = self.dim();
  if (nd == 0 || dim < -nd || dim >= nd || idx.dim() > 1 || idx.scalar_type() != at::kLong)
    return ew_reason(kR_unsupported_args);
  dim = (dim + nd) % nd;
  const at::Tensor idx1 = idx.dim() == 0 ? idx.reshape({1}) : idx;
  std::vector<int64_t> target = self.sizes().vec();
  target[dim] = idx1.size(0);
  if (src.sizes() != at::IntArrayRef(target)) return ew_reason(kR_unsupported_args);  // (eager raises torch's error)
  const at::Tensor ins[2] = {src, idx1};
  const uint64_t bits[2] = {0, 0};
  if (int r = data_record(kOp_scatter, self, ins, bits, 2, dim, 0, false, false, thr)) return ew_reason(r);
  return EwRecorded{self, -1, true};
}
// argmax(self, dim=None, keepdim=False) as _data_handlers._argmax: the int64 index of the maximum along dim (the
// worker's argmax over x with dim moved last; keepdim's kept 1 moved last in the out view), or over every element of
// a contiguous x (greedy decoding's next token).
EwRecorded argmax_record(const c10::IValue* a, size_t n, int64_t thr) {
  if (n != 3 || !(a[1].isNone() || a[1].isInt()) || !a[2].isBool()) return ew_reason(kR_unsupported_args);
  const at::Tensor& x = a[0].toTensor();
  const bool keepdim = a[2].toBool(), all = a[1].isNone();
  at::Tensor xv, out, view;
  if (all) {
    if (keepdim || !x.is_contiguous() || x.numel() == 0) return ew_reason(kR_unsupported_args);
    xv = x.view({-1});
    out = view = at::empty({}, x.options().dtype(at::kLong));
  } else {
    const int64_t nd = x.dim();
    int64_t dim = a[1].toInt();
    if (nd == 0 || dim < -nd || dim >= nd) return ew_reason(kR_unsupported_args);
    dim = (dim + nd) % nd;
    xv = x.movedim(dim, -1);
    std::vector<int64_t> shape = x.sizes().vec();
    if (keepdim) shape[dim] = 1;
    else shape.erase(shape.begin() + dim);
    out = at::empty(shape, x.options().dtype(at::kLong));
    view = keepdim ? out.movedim(dim, -1) : out;
  }
  const uint64_t bits = 0;
  if (int r = data_record(kOp_argmax, view, &xv, &bits, 1, 0, 0, keepdim && !all, true, thr)) return ew_reason(r);
  return EwRecorded{std::move(out), -1, false};
}

}  // namespace

bool cfront_try_int_arith(const c10::OperatorHandle& op, int64_t threshold, size_t nargs, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.operator_name();
  if (name.overload_name != "Tensor" && name.overload_name != "Scalar") return false;
  const std::string& base = name.name;
  const bool inplace = !base.empty() && base.back() == '_';
  const std::string fn = inplace ? base.substr(0, base.size() - 1) : base;
  const bool add = fn == "aten::add", sub = fn == "aten::sub", mul = fn == "aten::mul";
  if (!add && !sub && !mul) return false;
  const c10::IValue* a = stack->data() + (stack->size() - nargs);
  if (!a[0].isTensor() || !a[0].toTensor().defined() || !plain_cuda_keys(a[0].toTensor())) return false;
  if (inplace && !cfront_inplace_ok(a[0].toTensor())) return false;
  if (at::isFloatingType(a[0].toTensor().scalar_type())) return false;  // a float result (refused for another reason)
  py::gil_scoped_acquire gil;  // as cfront_try_native
  EwRecorded r;
  try {
    c10::impl::ExcludeDispatchKeyGuard below(
        c10::DispatchKeySet({kCfrontKey, c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    r = int_arith_record(mul ? kOp_mul_int : kOp_add_int, sub ? -1 : 1, inplace, a, nargs, threshold);
  } catch (const c10::Error&) {  // (shapes that do not broadcast, ...): the mode's handler decides
    return false;
  }
  if (r.reason >= 0) return false;
  if (inplace) return cfront_inplace_done(nargs, stack), true;
  torch::jit::drop(*stack, nargs);
  stack->emplace_back(std::move(r.out));
  return true;
}

bool cfront_inplace_ok(const at::Tensor& self) { return !self.is_inference() || c10::InferenceMode::is_enabled(); }

void cfront_inplace_done(size_t nargs, torch::jit::Stack* stack) {
  c10::IValue self = std::move((*stack)[stack->size() - nargs]);
  if (!self.toTensor().is_inference()) self.toTensor().unsafeGetTensorImpl()->bump_version();
  torch::jit::drop(*stack, nargs);
  stack->emplace_back(std::move(self));
}

int cfront_compare_rule(const c10::OperatorName& name) {
  if (name.overload_name != "Tensor" && name.overload_name != "Scalar") return -1;
  static const std::pair<const char*, CmpOp> rules[] = {{"aten::lt", kCmpLt}, {"aten::le", kCmpLe},
                                                        {"aten::gt", kCmpGt}, {"aten::ge", kCmpGe},
                                                        {"aten::eq", kCmpEq}, {"aten::ne", kCmpNe}};
  for (const auto& [n, rule] : rules)
    if (name.name == n) return (int)rule;
  return -1;
}
bool cfront_data_kind(CfrontNative kind) {
  switch (kind) {
    case CfrontNative::scalar_tensor: case CfrontNative::full: case CfrontNative::where: case CfrontNative::arange:
    case CfrontNative::compare: case CfrontNative::embedding: case CfrontNative::index_copy: case CfrontNative::argmax:
      return true;
    default:
      return false;
  }
}

EwRecorded cfront_data_record(CfrontNative kind, const c10::OperatorName& name, uint32_t code, const c10::IValue* a,
                              size_t n, int64_t thr) {
  switch (kind) {
    case CfrontNative::scalar_tensor: return scalar_tensor_record(a, n, thr);
    case CfrontNative::full: return full_record(name, a, n, thr);
    case CfrontNative::where: return where_record(a, n, thr);
    case CfrontNative::arange: return arange_record(a, n, thr);
    case CfrontNative::compare: return compare_record(code, a, n, thr);
    case CfrontNative::embedding: return embedding_record(a, n, thr);
    case CfrontNative::index_copy: return index_copy_record(a, n, thr);
    case CfrontNative::argmax: return argmax_record(a, n, thr);
    default: return ew_reason(kR_unsupported_args);
  }
}

}  // namespace gpuos
