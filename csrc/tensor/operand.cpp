// csrc/tensor/operand.cpp -- tensors -> Operands and TensorRefs (see tensor.h).
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {

int dtype_code(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return kF32;
    case at::kHalf: return kF16;
    case at::kBFloat16: return kBF16;
    default: return -1;
  }
}

int dtype_code_any(at::ScalarType s) {
  switch (s) {
    case at::kLong: return kI64;
    case at::kInt: return kI32;
    case at::kBool: return kBool;
    default: return dtype_code(s);
  }
}

const at::Tensor& as_tensor(PyObject* o, const char* op, const char* argname) {
  if (!THPVariable_Check(o))
    throw py::type_error(std::string(op) + ": argument '" + argname + "' must be a torch.Tensor, got " +
                         Py_TYPE(o)->tp_name);
  return THPVariable_Unpack(o);
}

void extent(uint64_t ptr, int ndim, const int64_t* sizes, const int64_t* strides, int64_t es, uint64_t& lo,
            uint64_t& hi) {
  int64_t mn = 0, mx = 0;
  for (int i = 0; i < ndim; ++i) {
    const int64_t span = strides[i] * (sizes[i] - 1);
    if (span < 0) mn += span; else mx += span;
  }
  lo = ptr + mn * es;
  hi = ptr + (mx + 1) * es;
}

Operand operand(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  Operand o;
  o.ptr = (uint64_t)(uintptr_t)impl->data();  // const: no copy-on-write materialisation
  o.dtype = (uint32_t)dtype_code_any(impl->dtype().toScalarType());
  o.ndim = (int)impl->dim();
  o.sizes = impl->sizes().data();
  o.strides = impl->strides().data();
  o.contiguous = impl->is_contiguous();
  o.fp.storage = (uintptr_t)impl->storage().unsafeGetStorageImpl();
  const int64_t es = (int64_t)impl->itemsize();
  if (o.contiguous) {
    o.fp.lo = o.ptr;
    o.fp.hi = o.ptr + (uint64_t)(impl->numel() * es);
  } else {
    extent(o.ptr, o.ndim, o.sizes, o.strides, es, o.fp.lo, o.fp.hi);
    o.fp.win = period_window(o.ptr, o.ndim, o.sizes, o.strides, es);
  }
  return o;
}

TensorRef make_ref(const at::Tensor& t, int ndim) {
  TensorRef r{};
  r.ptr = (uint64_t)(uintptr_t)t.data_ptr();
  r.ndim = (uint32_t)ndim;
  r.dtype = (uint32_t)dtype_code_any(t.scalar_type());
  for (int i = 0; i < (int)kMaxDims; ++i) {
    r.sizes[i] = i < ndim ? t.size(i) : 1;
    r.strides[i] = i < ndim ? t.stride(i) : 0;
  }
  return r;
}

}  // namespace gpuos
