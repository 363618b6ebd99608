// csrc/sched/record_data.cpp -- the scheduler's data-movement ops (ops.def kind 4): embedding / index_select,
// index_copy_ / index_put_, argmax, where / masked_fill, int64 arithmetic, arange / fill. gpuos/_data_handlers.py
// parses the aten call and allocates the output; this checks everything the worker relies on (dtypes, shapes,
// devices, overlap, sizes) and defers the op through the one recording path (defer_filled). Anything else: a
// reason code, and the op runs eagerly.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/bit_cast.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "device_src/dataops.h"
#include "ops/op_table.h"
#include "sched/deferred.h"
#include "sched/record.h"
#include "tensor/errors.h"
#include "tensor/tensor.h"

namespace gpuos {

namespace {

bool is_index(const at::Tensor& t) { return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt; }
bool is_int(const at::Tensor& t) { return is_index(t) || t.scalar_type() == at::kBool; }

// Can `t` be broadcast to `shape` (torch's rule: trailing dims equal or 1)?
bool broadcasts_to(const at::Tensor& t, at::IntArrayRef shape) {
  if (t.dim() > (int64_t)shape.size()) return false;
  const int64_t off = (int64_t)shape.size() - t.dim();
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.size(i) != 1 && t.size(i) != shape[off + i]) return false;
  return true;
}

// The reason an op on these tensors must run eagerly, or 0.
int common_reason(const at::Tensor& out, const at::Tensor* ins, uint32_t nin) {
  const bool grad = at::GradMode::is_enabled();
  for (int k = -1; k < (int)nin; ++k) {
    const at::Tensor& t = k < 0 ? out : ins[k];
    if (!t.defined()) continue;
    if (!t.is_cuda()) return kR_not_cuda;
    if (const int r = foreign_reason(t); r >= 0) return r;
    if (t.layout() != at::kStrided) return kR_layout;
    if (dtype_code_any(t.scalar_type()) < 0) return kR_dtype;
    if (t.get_device() != out.get_device()) return kR_device;
    if (grad && t.requires_grad()) return kR_autograd;
    if (t.dim() > (int64_t)kMaxDims) return kR_layout;
  }
  return 0;
}

// The op-specific checks; returns a reason or 0. `work`: iteration units (for the size threshold).
int check(uint32_t op, const at::Tensor& out, const at::Tensor* ins, uint32_t nin, int64_t dim, int64_t ival,
          bool keepdim, int64_t& work) {
  work = out.numel();
  switch (op) {
    case kOp_gather: {
      const at::Tensor &w = ins[0], &idx = ins[1];
      if (!w.defined() || !idx.defined() || !is_index(idx) || w.scalar_type() != out.scalar_type()) return kR_dtype;
      if (dim < 0 || dim >= w.dim()) return kR_unsupported_args;
      std::vector<int64_t> shape(w.sizes().begin(), w.sizes().begin() + dim);
      shape.insert(shape.end(), idx.sizes().begin(), idx.sizes().end());
      shape.insert(shape.end(), w.sizes().begin() + dim + 1, w.sizes().end());
      if (out.sizes() != at::IntArrayRef(shape) || (int64_t)shape.size() > (int64_t)kMaxDims) return kR_unsupported_args;
      if (storage_of(out) == storage_of(w) || storage_of(out) == storage_of(idx)) return kR_unsupported_args;
      return 0;
    }
    case kOp_scatter: {
      const at::Tensor &src = ins[0], &idx = ins[1];
      if (!src.defined() || !idx.defined() || !is_index(idx) || src.scalar_type() != out.scalar_type()) return kR_dtype;
      if (idx.dim() != 1 || dim < 0 || dim >= out.dim() || src.dim() != out.dim()) return kR_unsupported_args;
      for (int64_t i = 0; i < out.dim(); ++i)
        if (src.size(i) != (i == dim ? idx.size(0) : out.size(i))) return kR_unsupported_args;
      // The written tensor must not share memory with what the op reads (the worker reads while it writes), nor
      // reach one element through two indices.
      if (storage_of(src) == storage_of(out) || storage_of(idx) == storage_of(out)) return kR_unsupported_args;
      if (!out.is_contiguous() && has_internal_overlap(out)) return kR_unsupported_args;
      work = src.numel();
      return 0;
    }
    case kOp_argmax: {
      const at::Tensor& x = ins[0];
      if (!x.defined() || dtype_code(x.scalar_type()) < 0 || out.scalar_type() != at::kLong) return kR_dtype;
      if (x.dim() < 1 || x.size(-1) == 0) return kR_unsupported_args;
      std::vector<int64_t> shape = x.sizes().vec();
      shape.pop_back();
      if (keepdim) shape.push_back(1);
      if (out.sizes() != at::IntArrayRef(shape) || storage_of(out) == storage_of(x)) return kR_unsupported_args;
      work = x.numel();
      return 0;
    }
    case kOp_where:  // a constant condition: a copy of one input (integer / bool clones and copies)
      if (ins[0].defined() && ins[0].scalar_type() != at::kBool) return kR_dtype;
      break;
    case kOp_add_int: {  // a cast when one side is a float dtype: add_int(x, constant 0)
      const bool cast = ins[0].defined() && !ins[1].defined() && (!is_index(out) || !is_int(ins[0]));
      if (cast) {
        if (out.scalar_type() == at::kBool || is_int(ins[0]) == is_int(out)) return kR_dtype;
        break;
      }
      [[fallthrough]];
    }
    case kOp_mul_int:
    case kOp_arange:
      if (!is_index(out)) return kR_dtype;
      for (uint32_t k = 0; k < nin; ++k)
        if (ins[k].defined() && !is_int(ins[k])) return kR_dtype;
      break;
    case kOp_fill: break;
    case kOp_cmp: {
      // ival's kCmpFloat (device_src/dataops.h) says how the worker reads the operands: it must match them.
      if (out.scalar_type() != at::kBool) return kR_dtype;
      const bool fl = (ival & kCmpFloat) != 0;
      at::ScalarType ft = at::kFloat;
      bool have = false;
      for (uint32_t k = 0; k < nin; ++k) {
        if (!ins[k].defined()) continue;
        if (fl ? dtype_code(ins[k].scalar_type()) < 0 : !is_int(ins[k])) return kR_dtype;
        if (fl && have && ins[k].scalar_type() != ft) return kR_dtype;
        ft = ins[k].scalar_type();
        have = true;
      }
      if (!have) return kR_unsupported_args;
      break;
    }
    default: return kR_unsupported_args;
  }
  // Elementwise data ops: inputs broadcast to out; where's values of out's dtype; in place only as out's own view.
  for (uint32_t k = 0; k < nin; ++k) {
    const at::Tensor& t = ins[k];
    if (!t.defined()) continue;
    if (!broadcasts_to(t, out.sizes())) return kR_unsupported_args;
    if (op == kOp_where && k > 0 && t.scalar_type() != out.scalar_type()) return kR_dtype;
    if (partially_overlaps(out, t)) return kR_unsupported_args;
  }
  if (!out.is_contiguous() && has_internal_overlap(out)) return kR_unsupported_args;
  return 0;
}

}  // namespace

uint64_t bits_of(const c10::Scalar& v, at::ScalarType dt) {
  if (dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16) {
    const double d = v.isBoolean() ? (double)v.toBool() : v.isIntegral(false) ? (double)v.toLong() : v.toDouble();
    const float f = (float)d;
    if (std::isinf(f) && std::isfinite(d)) throw std::overflow_error(std::to_string(d) + " does not fit " + c10::toString(dt));
    if (dt == at::kFloat) return c10::bit_cast<uint32_t>(f);
    if (dt == at::kBFloat16) return c10::BFloat16(f).x;  // round to nearest even; NaN 0x7FC0
    const c10::Half h(f);
    if (std::isinf((float)h) && std::isfinite(d)) throw std::overflow_error(std::to_string(d) + " does not fit Half");
    return h.x;
  }
  if (dt == at::kBool) return v.isBoolean() ? v.toBool() : v.isIntegral(false) ? v.toLong() != 0 : v.toDouble() != 0.0;
  if (dt != at::kLong && dt != at::kInt) throw std::overflow_error(std::string("no constants of ") + c10::toString(dt));
  int64_t i = 0;
  if (v.isFloatingPoint()) {
    const double d = v.toDouble();
    if (!std::isfinite(d) || d != std::trunc(d)) throw std::domain_error(std::to_string(d) + " is not an integer");
    if (d < -9223372036854775808.0 || d >= 9223372036854775808.0)
      throw std::overflow_error(std::to_string(d) + " does not fit " + c10::toString(dt));
    i = (int64_t)d;
  } else {
    i = v.isBoolean() ? (int64_t)v.toBool() : v.toLong();
  }
  if (dt == at::kInt && (i < INT32_MIN || i > INT32_MAX))
    throw std::overflow_error(std::to_string(i) + " does not fit Int");
  return (uint64_t)i;
}

int data_record(uint32_t op, const at::Tensor& out, const at::Tensor* ins, const uint64_t* bits, uint32_t nin,
                int64_t dim, int64_t ival, bool keepdim, bool fresh, int64_t thr) {
  if (op >= kNumOps || kOps[op].kind != kKindData || nin != kOps[op].arity) return kR_unsupported_args;
  if (int r = common_reason(out, ins, nin)) return r;
  int64_t work = 0;
  if (int r = check(op, out, ins, nin, dim, ival, keepdim, work)) return r;
  if (work > thr) return kR_size;
  DeferredOp d;
  d.op = op;
  d.nin = nin;
  d.data = true;
  d.fresh = fresh;
  d.keepdim = keepdim;
  d.dim = dim;
  d.ival = ival;
  d.out = out;
  for (uint32_t k = 0; k < nin; ++k) {
    d.in[k] = ins[k];
    d.bits[k] = bits[k];
  }
  defer_filled(out.get_device(), std::move(d));
  return 0;
}

// sched_data(op, out, ins: tuple[Tensor | None], bits: tuple[int], dim, ival, keepdim, fresh, size_threshold)
PyObject* sched_data(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return python_call([&]() -> PyObject* {
    if (nargs != 9) throw py::type_error("sched_data takes 9 arguments");
    const uint32_t op = (uint32_t)PyLong_AsUnsignedLong(args[0]);
    PyObject *pout = args[1], *pins = args[2], *pbits = args[3];
    const int64_t dim = PyLong_AsLongLong(args[4]), ival = PyLong_AsLongLong(args[5]);
    const bool keepdim = PyObject_IsTrue(args[6]) == 1, fresh = PyObject_IsTrue(args[7]) == 1;
    const int64_t thr = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred()) return nullptr;
    if (op >= kNumOps || kOps[op].kind != kKindData || !THPVariable_Check(pout) || !PyTuple_Check(pins) ||
        !PyTuple_Check(pbits))
      return reason(kR_unsupported_args);
    const uint32_t nin = (uint32_t)PyTuple_GET_SIZE(pins);
    if (nin != kOps[op].arity || (uint32_t)PyTuple_GET_SIZE(pbits) != nin) return reason(kR_unsupported_args);
    const at::Tensor& out = THPVariable_Unpack(pout);
    at::Tensor ins[3];
    uint64_t bits[3] = {0, 0, 0};
    for (uint32_t k = 0; k < nin; ++k) {
      PyObject* o = PyTuple_GET_ITEM(pins, k);
      if (THPVariable_Check(o)) ins[k] = THPVariable_Unpack(o);
      else if (o != Py_None) return reason(kR_unsupported_args);
      bits[k] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(pbits, k));
      if (PyErr_Occurred()) return nullptr;
    }
    if (int r = data_record(op, out, ins, bits, nin, dim, ival, keepdim, fresh, thr)) return reason(r);
    Py_INCREF(pout);
    return pout;
  });
}

}  // namespace gpuos
