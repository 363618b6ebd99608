// csrc/sched/dispatch.h -- the scheduler's two entry points from PyTorch, both C++ functions bound to Python
// mode objects: __torch_dispatch__ (sched_dispatch: every aten op under the mode) and the __torch_function__
// front (sched_function: plain functional calls before PyTorch boxes them). Their tables come from Python
// (gpuos/scheduler.py builds them from ops.def's aten column).
#pragma once
#include <torch/extension.h>

#include "sched/deferred.h"  // SchedMode

#include <string>
#include <vector>

namespace gpuos {

// One recordable call: sched_dispatch's table is keyed by OpOverload, the front's by torch function / Tensor
// method, the dispatcher front's (sched/cfront.cpp) by operator name; Python gives the first two as
// {key: (op_id, mode, nin, d0, d1, scalars, number_ok)}.
struct CallSpec {
  uint32_t op = 0, nin = 0;
  int mode = kModeFunctional;
  float d0 = 0.f, d1 = 0.f;
  int scalars = 0;         // 0 none, 1 alpha (kwarg, or 3rd positional at the aten level) -> s0, 2 rounding_mode None
  bool number_ok = false;  // front: a Python number may stand for the 2nd operand (the op has a .Scalar overload)
};

PyObject* sched_dispatch(PyObject*, PyObject* const* a, Py_ssize_t n);
PyObject* sched_function(PyObject*, PyObject* const* a, Py_ssize_t n);
void sched_set_fast(pybind11::dict table);
void sched_set_nodata(pybind11::iterable overloads, pybind11::iterable front_views);
void sched_set_front(pybind11::dict table, pybind11::object sched_type);
std::vector<std::string> sched_fast_ops();
std::vector<std::string> sched_front_ops();
pybind11::dict front_diag(pybind11::object tensor);
// A plain CUDA tensor: no dispatch key beyond CUDA's dense, autograd, in-place-or-view and autocast ones (no
// conjugate / negative bit, no Python subclass, no batching), so that an op on it may be recorded or run below the
// modes with nothing skipped that would change its meaning.
bool plain_cuda_keys(const at::Tensor& t);  // why the front would or would not record on `tensor`

}  // namespace gpuos
