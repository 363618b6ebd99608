// csrc/tensor/tensor.h -- torch tensors as the runtime sees them: dtype codes, Operands (pointer, shape,
// strides, storage and byte range) and TensorRefs; the checks of the explicit API and their messages (each
// names the op, the shapes/dtypes and the fix).
#pragma once
#include <torch/extension.h>

#include <string>
#include <vector>

#include "core/runtime.h"

namespace gpuos {

// ---- conversion (tensor/operand.cpp)
int dtype_code(at::ScalarType s);  // kF32 / kF16 / kBF16, or -1 (the float paths: elementwise, reductions, matmul)
int dtype_code_any(at::ScalarType s);  // also kI64 / kI32 / kBool (the data-movement ops), or -1
// Byte range [lo, hi) a strided view can touch.
void extent(uint64_t ptr, int ndim, const int64_t* sizes, const int64_t* strides, int64_t es, uint64_t& lo,
            uint64_t& hi);
Operand operand(const at::Tensor& t);  // borrows t's sizes/strides: t must outlive the Operand
TensorRef make_ref(const at::Tensor& t, int ndim);
inline const void* storage_of(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
}
inline bool is_number(PyObject* o) { return PyFloat_Check(o) || PyLong_Check(o) || PyBool_Check(o); }
// `o` as a tensor, or TypeError naming op and argument.
const at::Tensor& as_tensor(PyObject* o, const char* op, const char* argname);

// ---- checks and messages (tensor/checks.cpp)
std::string shape_str(const at::Tensor& t);
std::string shape_vec_str(const std::vector<int64_t>& v);
std::string dtype_name(at::ScalarType st);
std::string dtype_str(const at::Tensor& t);
std::string describe(const char* name, const at::Tensor& t);
// Does `in` share memory with `out` other than as exactly the same view (the allowed in-place case)?
bool partially_overlaps(const at::Tensor& out, const at::Tensor& in, bool allow_identical = true);
bool has_internal_overlap(const at::Tensor& t);  // a stride-0 dim of size > 1
// A matmul bias: 1 to shape.size() dims, each equal to shape's trailing dim or 1 (what the product broadcasts).
bool bias_broadcasts(const at::Tensor& bias, at::IntArrayRef shape);
// out = op(a, b) of the seed API: CUDA, one float dtype, one device, equal shapes, no partial overlap.
void check_binary(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out);
void check_overlap(const char* who, const at::Tensor& out, const at::Tensor& in, const std::string& inname);
void check_cuda_float(const char* who, const at::Tensor& t, const std::string& name);

}  // namespace gpuos
