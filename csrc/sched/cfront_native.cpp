// csrc/sched/cfront_native.cpp -- the dispatcher front's own handlers (cfront.h): the ops whose Python handler only
// reads its arguments and calls the record path's C++ core -- the worker matmuls (mm / bmm / addmm / baddbmm:
// gpuos/_decode_handlers.py matmul_handlers -> sched_matmul), casts, copies and joins (_to_copy, clone, cat:
// cast_handlers / _data_handlers._clone -> sched_cast; integer casts: _int_handlers.int_cast -> sched_data), layer
// norm (_decode_handlers.layer_norm_handler: table ops), efficient SDPA (_attention.py -> sched_attention), last-dim
// reductions (gpuos/scheduler.py _reduce_handler -> sched_reduce) and the data-movement ops of cfront_data.cpp --
// recorded from the dispatcher's stack without the Python handler. Whatever they refuse goes on to that handler (a
// direct call; in place: the dispatch mode), which decides and counts the fallback exactly as before.
#include <ATen/core/dispatch/Dispatcher.h>

#include "ops/op_table.h"
#include "sched/cfront.h"
#include "sched/deferred.h"
#include "sched/dispatch.h"
#include "sched/record.h"
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {
namespace {

// _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None)
// as the Python handlers take it: a cast on the same device, nothing else asked; between the worker's float dtypes
// (cast_handlers -> sched_cast: op copy), or with an integer side (_int_handlers.int_cast: add_int(x, 0), a
// contiguous result) -- *integer says which; bool -> bool and casts to bool: the handler.
bool cast_args(const c10::IValue* a, const at::Tensor& x, at::ScalarType* dt, bool* integer) {
  *dt = a[1].isNone() ? x.scalar_type() : (at::ScalarType)a[1].toInt();
  if (!a[2].isNone() && (c10::Layout)a[2].toInt() != c10::kStrided) return false;
  if (!a[3].isNone() && a[3].toDevice() != x.device()) return false;
  if (!a[4].isNone() && a[4].toBool()) return false;
  if (a[5].toBool()) return false;
  if (!a[6].isNone() && (c10::MemoryFormat)a[6].toInt() != c10::MemoryFormat::Preserve) return false;
  const at::ScalarType from = x.scalar_type();
  *integer = false;
  if (dtype_code(from) >= 0 && dtype_code(*dt) >= 0) return true;
  const auto is_int = [](at::ScalarType t) { return t == at::kLong || t == at::kInt; };
  const bool from_int = is_int(from) || from == at::kBool;
  *integer = (is_int(*dt) && (from_int || dtype_code(from) >= 0)) || (dtype_code(*dt) >= 0 && from_int);
  return *integer;
}

// A last-dim reduction as gpuos/scheduler.py's _reduce_handler takes it: `dim` one int (or a list of one) naming the
// last dim, `keepdim` any, every other argument at its default (half_to_float, which has none: False -- True asks
// for a cast first, which the handler does).
bool reduce_args(const c10::FunctionSchema& schema, const c10::IValue* a, size_t n, const at::Tensor& x,
                 bool* keepdim) {
  if (x.dim() == 0) return false;
  *keepdim = false;
  bool dim_ok = false;
  const auto& args = schema.arguments();
  for (size_t i = 1; i < n; ++i) {
    const std::string& name = args[i].name();
    const c10::IValue& v = a[i];
    if (name == "dim") {
      int64_t d = 0;
      if (v.isInt()) d = v.toInt();
      else if (v.isIntList() && v.toIntList().size() == 1) d = v.toIntList().get(0);
      else return false;
      if (d != -1 && d != x.dim() - 1) return false;
      dim_ok = true;
    } else if (name == "keepdim") {
      if (!v.isBool()) return false;
      *keepdim = v.toBool();
    } else {
      const auto& d = args[i].default_value();
      if (d.has_value() ? (*d != v) : !(v.isBool() && !v.toBool())) return false;
    }
  }
  return dim_ok;
}

// clone(self, *, memory_format=None) as _data_handlers._clone takes it, for the worker's float dtypes: a fresh
// output in the preserved or contiguous format and a copy into it (integers: the handler's where).
bool clone_args(const c10::IValue* a, size_t n, at::MemoryFormat* mf) {
  if (n != 2 || dtype_code(a[0].toTensor().scalar_type()) < 0) return false;
  *mf = a[1].isNone() ? at::MemoryFormat::Preserve : (at::MemoryFormat)a[1].toInt();
  return *mf == at::MemoryFormat::Preserve || *mf == at::MemoryFormat::Contiguous;
}

EwRecorded copy_into(const at::Tensor& x, const at::Tensor& out, int64_t thr) {
  EwIn in;
  in.t = &x;
  return ew_record(kOp_copy, 1, kModeOut, &in, &out, 0.f, 0.f, thr, (int)out.scalar_type());
}

// cat(tensors, dim=0) as cast_handlers' join takes it (gpuos/_decode_handlers.py), for the worker's float dtypes:
// legacy empty 1-D pieces skipped, pieces of one rank and device equal but along `dim`, the dtype promoted; a fresh
// output and one copy per piece into its slice. A refused piece: the handler decides (the recorded pieces wrote
// only the output, which nothing reads).
EwRecorded cat_record(const c10::IValue* a, size_t n, int64_t thr) {
  if (n != 2 || !a[0].isTensorList() || !a[1].isInt()) return ew_reason(kR_unsupported_args);
  std::vector<at::Tensor> all = a[0].toTensorVector(), ts;
  for (const at::Tensor& t : all)
    if (!t.defined() || !plain_cuda_keys(t) || dtype_code(t.scalar_type()) < 0) return ew_reason(kR_unsupported_args);
  for (const at::Tensor& t : all)
    if (!(t.dim() == 1 && t.numel() == 0)) ts.push_back(t);
  if (ts.empty() && !all.empty()) ts.push_back(all[0]);
  if (ts.empty()) return ew_reason(kR_unsupported_args);
  const at::Tensor& t0 = ts[0];
  const int64_t nd = t0.dim();
  int64_t dim = a[1].toInt();
  if (nd == 0 || dim < -nd || dim >= nd) return ew_reason(kR_unsupported_args);
  dim = (dim + nd) % nd;
  std::vector<int64_t> shape = t0.sizes().vec();
  at::ScalarType dt = t0.scalar_type();
  shape[dim] = 0;
  for (const at::Tensor& t : ts) {
    if (t.device() != t0.device() || t.dim() != nd) return ew_reason(kR_unsupported_args);
    for (int64_t d = 0; d < nd; ++d)
      if (d != dim && t.size(d) != t0.size(d)) return ew_reason(kR_unsupported_args);
    shape[dim] += t.size(dim);
    dt = c10::promoteTypes(dt, t.scalar_type());
  }
  at::Tensor out = at::empty(shape, t0.options().dtype(dt));
  int64_t off = 0;
  for (const at::Tensor& t : ts) {
    EwRecorded r = copy_into(t, out.narrow(dim, off, t.size(dim)), thr);
    if (r.reason >= 0) return r;
    off += t.size(dim);
  }
  return EwRecorded{std::move(out), -1, false};
}

EwIn ew_in(const at::Tensor& t) { return EwIn{&t, false, 0.0}; }

// native_layer_norm(input, normalized_shape, weight, bias, eps) over the last dim as _decode_handlers.
// layer_norm_handler records it: table ops in fp32, as eager's kernel (x32 = copy(x), mean = mean(x32), xc = x32 -
// mean, rstd = rsqrt(mean(xc * xc) + eps), out = copy(xc * rstd * w + b)); its results out, and mean and rstd
// (in *extra). A refused step: the handler decides (the steps recorded wrote only their own fresh outputs).
EwRecorded layer_norm_record(const c10::IValue* a, size_t n, int64_t thr, std::vector<at::Tensor>* extra) {
  double eps = 0.0;
  if (n != 5 || !a[1].isIntList() || !cfront_number(a[4], &eps)) return ew_reason(kR_unsupported_args);
  const at::Tensor& x = a[0].toTensor();
  const std::vector<int64_t> shape = a[1].toIntVector();
  if (x.dim() == 0 || shape.size() != 1 || shape[0] != x.size(-1)) return ew_reason(kR_unsupported_args);
  const at::Tensor* wb[2] = {nullptr, nullptr};
  for (int k = 0; k < 2; ++k) {
    const c10::IValue& v = a[2 + k];
    if (v.isNone()) continue;
    if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().dim() != 1) return ew_reason(kR_unsupported_args);
    wb[k] = &v.toTensor();
  }
  int why = -1;  // the first refused step's reason
  const auto step = [&](EwRecorded r) {
    if (why < 0 && r.reason >= 0) why = r.reason;
    return why < 0 ? std::move(r.out) : at::Tensor();
  };
  const auto ew = [&](uint32_t op, std::initializer_list<EwIn> ins) {
    return why >= 0 ? at::Tensor() : step(ew_record(op, (uint32_t)ins.size(), kModeFunctional, ins.begin(), nullptr,
                                                    1.f, 0.f, thr));
  };
  const EwIn in_x = ew_in(x);
  const int f32 = (int)at::kFloat;
  const at::Tensor x32 = x.scalar_type() == at::kFloat
                             ? x : step(ew_record(kOp_copy, 1, kModeFunctional, &in_x, nullptr, 0.f, 0.f, thr, f32));
  const at::Tensor mean = why >= 0 ? at::Tensor() : step(reduce_record(kOp_mean, x32, true, thr));
  const at::Tensor xc = ew(kOp_sub, {ew_in(x32), ew_in(mean)});
  const at::Tensor sq = ew(kOp_mul, {ew_in(xc), ew_in(xc)});
  const at::Tensor var = why >= 0 ? at::Tensor() : step(reduce_record(kOp_mean, sq, true, thr));
  const at::Tensor var_eps = ew(kOp_add, {ew_in(var), EwIn{nullptr, true, eps}});
  const at::Tensor rstd = ew(kOp_rsqrt, {ew_in(var_eps)});
  at::Tensor y = ew(kOp_mul, {ew_in(xc), ew_in(rstd)});
  if (wb[0]) y = ew(kOp_mul, {ew_in(y), ew_in(*wb[0])});
  if (wb[1]) y = ew(kOp_add, {ew_in(y), ew_in(*wb[1])});
  if (why < 0 && x.scalar_type() != at::kFloat) {
    const EwIn in_y = ew_in(y);
    y = step(ew_record(kOp_copy, 1, kModeFunctional, &in_y, nullptr, 0.f, 0.f, thr, (int)x.scalar_type()));
  }
  if (why >= 0) return ew_reason(why);
  *extra = {mean, rstd};
  return EwRecorded{std::move(y), -1, false};
}

// _scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
// *, scale=None) as gpuos/_attention.py's efficient handler takes it: no log-sum-exp asked for (autograd's: the
// handler's reason), no dropout, a plain CUDA bias if any.
bool attention_args(const c10::IValue* a, size_t n, double* scale) {
  if (n != 8 || a[4].toBool() || !a[5].isDouble() || a[5].toDouble() != 0.0 || !a[6].isBool()) return false;
  if (!a[3].isNone() && !(a[3].isTensor() && a[3].toTensor().defined() && plain_cuda_keys(a[3].toTensor())))
    return false;
  if (!a[7].isNone()) {
    if (!a[7].isDouble()) return false;
    *scale = a[7].toDouble();
  }
  return true;
}
}  // namespace


CfrontNative cfront_native_of(const c10::OperatorName& name) {
  if (cfront_compare_rule(name) >= 0) return CfrontNative::compare;
  if (name.name == "aten::where") return name.overload_name == "self" ? CfrontNative::where : CfrontNative::none;
  if (name.name == "aten::arange") return CfrontNative::arange;  // (each overload: arange_record tells them apart)
  if (!name.overload_name.empty()) return CfrontNative::none;
  if (name.name == "aten::scalar_tensor") return CfrontNative::scalar_tensor;
  if (name.name == "aten::_scaled_dot_product_efficient_attention") return CfrontNative::attention;
  if (name.name == "aten::mm" || name.name == "aten::bmm") return CfrontNative::mm;
  if (name.name == "aten::addmm" || name.name == "aten::baddbmm") return CfrontNative::addmm;
  if (name.name == "aten::_to_copy") return CfrontNative::to_copy;
  if (name.name == "aten::clone") return CfrontNative::clone;
  if (name.name == "aten::cat") return CfrontNative::cat;
  if (name.name == "aten::index_copy_") return CfrontNative::index_copy;
  if (name.name == "aten::embedding") return CfrontNative::embedding;
  if (name.name == "aten::argmax") return CfrontNative::argmax;
  if (name.name == "aten::native_layer_norm") return CfrontNative::layer_norm;
  if (name.name == "aten::zeros" || name.name == "aten::ones" || name.name == "aten::full") return CfrontNative::full;
  return CfrontNative::none;
}

bool cfront_try_native(const c10::OperatorHandle& op, CfrontNative kind, uint32_t code, int64_t threshold,
                       size_t nargs, torch::jit::Stack* stack) {
  const size_t base = stack->size() - nargs;
  const c10::IValue* a = stack->data() + base;
  const bool matmul = kind == CfrontNative::mm || kind == CfrontNative::addmm;
  if (matmul && !worker_matmul_enabled()) return false;  // (cuBLAS: the handler counts it)
  if (kind == CfrontNative::attention && !worker_attention_enabled()) return false;  // (as for matmuls)
  size_t ntensors = 1;
  if (kind == CfrontNative::addmm || kind == CfrontNative::attention) ntensors = 3;
  else if (kind == CfrontNative::mm || kind == CfrontNative::embedding) ntensors = 2;
  else if (kind == CfrontNative::cat || kind == CfrontNative::scalar_tensor || kind == CfrontNative::arange ||
           kind == CfrontNative::compare || kind == CfrontNative::full)
    ntensors = 0;
  if (kind == CfrontNative::index_copy && !(nargs > 0 && a[0].isTensor() && cfront_inplace_ok(a[0].toTensor())))
    return false;
  if (nargs < (kind == CfrontNative::to_copy ? 7 : ntensors)) return false;
  for (size_t i = 0; i < ntensors; ++i)
    if (!a[i].isTensor() || !a[i].toTensor().defined() || !plain_cuda_keys(a[i].toTensor())) return false;
  double alpha = 1.0, beta = 1.0;
  at::ScalarType dt = at::kFloat;
  if (kind == CfrontNative::addmm && (nargs < 5 || !cfront_number(a[3], &beta) || !cfront_number(a[4], &alpha))) return false;
  bool integer = false;
  if (kind == CfrontNative::to_copy && !cast_args(a, a[0].toTensor(), &dt, &integer)) return false;
  bool keepdim = false;
  if (kind == CfrontNative::reduce && !reduce_args(op.schema(), a, nargs, a[0].toTensor(), &keepdim)) return false;
  at::MemoryFormat mf = at::MemoryFormat::Preserve;
  if (kind == CfrontNative::clone && !clone_args(a, nargs, &mf)) return false;
  double scale = 0.0;
  if (kind == CfrontNative::attention && !attention_args(a, nargs, &scale)) return false;
  // As try_record (cfront.cpp): the GIL, and the allocation below every mode and the front.
  py::gil_scoped_acquire gil;
  EwRecorded r;
  std::vector<at::Tensor> extra;  // results after the first
  try {
    c10::impl::ExcludeDispatchKeyGuard below(
        c10::DispatchKeySet({kCfrontKey, c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    if (kind == CfrontNative::to_copy && integer) {
      const at::Tensor& x = a[0].toTensor();
      const at::Tensor ins[2] = {x, at::Tensor()};
      const uint64_t bits[2] = {0, 0};
      at::Tensor out = at::empty_like(x, x.options().dtype(dt), at::MemoryFormat::Contiguous);
      const int why = data_record(kOp_add_int, out, ins, bits, 2, 0, 0, false, true, threshold);
      r = why ? ew_reason(why) : EwRecorded{std::move(out), -1, false};
    } else if (kind == CfrontNative::to_copy) {
      EwIn in;
      in.t = &a[0].toTensor();
      r = ew_record(kOp_copy, 1, kModeFunctional, &in, nullptr, 0.f, 0.f, threshold, (int)dt);
    } else if (cfront_data_kind(kind)) {
      r = cfront_data_record(kind, op.operator_name(), code, a, nargs, threshold);
    } else if (kind == CfrontNative::layer_norm) {
      r = layer_norm_record(a, nargs, threshold, &extra);
    } else if (kind == CfrontNative::clone) {
      const at::Tensor& x = a[0].toTensor();
      r = copy_into(x, at::empty_like(x, x.options(), mf), threshold);
    } else if (kind == CfrontNative::cat) {
      r = cat_record(a, nargs, threshold);
    } else if (kind == CfrontNative::attention) {
      const at::Tensor mask = a[3].isTensor() ? a[3].toTensor() : at::Tensor();
      r = attention_record(a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), mask, a[6].toBool(),
                           a[7].isNone() ? nullptr : &scale, false, nullptr);
      if (r.reason < 0) {  // the op's other results, as the handler makes them: an empty log-sum-exp, no RNG state
        const at::Tensor& q = a[0].toTensor();
        extra = {at::empty({q.size(0), q.size(1), 0}, q.options().dtype(at::kFloat)),
                 at::empty({}, q.options().dtype(at::kLong)), at::empty({}, q.options().dtype(at::kLong))};
      }
    } else if (kind == CfrontNative::reduce) {
      r = reduce_record(code, a[0].toTensor(), keepdim, threshold);
    } else if (kind == CfrontNative::mm) {
      r = mm_record(a[0].toTensor(), a[1].toTensor(), nullptr, 1.0, 1.0);
    } else {
      r = mm_record(a[1].toTensor(), a[2].toTensor(), &a[0].toTensor(), alpha, beta);
    }
  } catch (const c10::Error&) {  // outside what GPUOS takes: the Python handler decides
    return false;
  }
  if (r.reason >= 0) return false;
  if (kind == CfrontNative::index_copy) return cfront_inplace_done(nargs, stack), true;
  torch::jit::drop(*stack, nargs);
  stack->emplace_back(std::move(r.out));
  for (at::Tensor& t : extra) stack->emplace_back(std::move(t));
  return true;
}

}  // namespace gpuos
