// csrc/tensor/errors.h -- C++ exceptions -> typed Python exceptions (gpuos_ext.GpuosError, CudaError,
// CompileError, and TypeError / ValueError for bad input). Every binding and fastcall function ends in these.
#pragma once
#include <torch/extension.h>

#include "driver/cuda_api.h"

namespace gpuos {

// Create the exception classes and register the pybind11 translator (module init).
void init_exceptions(pybind11::module_& m);
// Translate the in-flight C++ exception into a Python error (call inside a catch (...) block).
void set_python_error();
// Run a METH_FASTCALL body: its result, or null with the Python error set from whatever it threw.
template <class F>
PyObject* python_call(F&& body) {
  try {
    return body();
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}
void set_compile_error(const CompileError& e);

}  // namespace gpuos
