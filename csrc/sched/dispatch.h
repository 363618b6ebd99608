// csrc/sched/dispatch.h -- the scheduler's two entry points from PyTorch, both C++ functions bound to Python
// mode objects: __torch_dispatch__ (sched_dispatch: every aten op under the mode) and the __torch_function__
// front (sched_function: plain functional calls before PyTorch boxes them). Their tables come from Python
// (gpuos/scheduler.py builds them from ops.def's aten column).
#pragma once
#include <torch/extension.h>

#include <string>
#include <vector>

namespace gpuos {

PyObject* sched_dispatch(PyObject*, PyObject* const* a, Py_ssize_t n);
PyObject* sched_function(PyObject*, PyObject* const* a, Py_ssize_t n);
void sched_set_fast(pybind11::dict table);
void sched_set_nodata(pybind11::iterable overloads, pybind11::iterable front_views);
void sched_set_front(pybind11::dict table, pybind11::object sched_type);
std::vector<std::string> sched_fast_ops();
std::vector<std::string> sched_front_ops();
pybind11::dict front_diag(pybind11::object tensor);  // why the front would or would not record on `tensor`

}  // namespace gpuos
