// csrc/tensor/submit.h -- the explicit API (gpuos_ext.submit_add/..., submit, submit_many, submit_reduce,
// submit_matmul):
// argument checks with messages that name the op, shapes/dtypes and the fix, then the one recording path
// (tensor/record.h). Nothing is recorded when a check fails.
#pragma once
#include "tensor/tensor.h"

namespace gpuos {

// out = op(a, b) for the seed ops (add, sub, mul, div): tensors of one float dtype and shape, any strides.
void submit_binary(uint32_t op, PyObject* a, PyObject* b, PyObject* out);
// Lists of the same: every element is checked before anything is recorded.
void submit_many(const std::string& opname, pybind11::handle a_list, pybind11::handle b_list,
                 pybind11::handle out_list);
// Any elementwise op of the table or an injected op: inputs are tensors (broadcast) or numbers; scalars by keyword.
void submit_generic(pybind11::handle op, pybind11::handle inputs, pybind11::handle out, pybind11::kwargs scalars);
// A last-dim reduction of x into out.
void submit_reduce(PyObject* op, PyObject* x, PyObject* out, bool keepdim);
// out = alpha * a @ b + beta * bias (tensor/matmul.cpp): 2-D, one float dtype, bias None or broadcast to out.
void submit_matmul(PyObject* a, PyObject* b, PyObject* out, PyObject* bias, float alpha, float beta);

}  // namespace gpuos
