// csrc/tensor/errors.cpp -- see errors.h.
#include "tensor/errors.h"

#include <stdexcept>

namespace py = pybind11;

namespace gpuos {
namespace {
PyObject* g_GpuosError = nullptr;
PyObject* g_CudaError = nullptr;
PyObject* g_CompileError = nullptr;
}  // namespace

void set_compile_error(const CompileError& e) {
  PyObject* exc = PyObject_CallFunction(g_CompileError, "s", e.what());
  if (!exc) return;
  auto set = [&](const char* k, const std::string& v) {
    PyObject* s = PyUnicode_DecodeUTF8(v.data(), (Py_ssize_t)v.size(), "replace");
    PyObject_SetAttrString(exc, k, s);
    Py_XDECREF(s);
  };
  set("log", e.log);
  set("arch", e.arch);
  set("options", e.options);
  set("source_path", e.source_path);
  PyErr_SetObject(g_CompileError, exc);
  Py_DECREF(exc);
}

// Translate the in-flight C++ exception into a Python error (used by fastcall functions and pybind).
void set_python_error() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const CompileError& e) {
    set_compile_error(e);
  } catch (const CudaError& e) {
    PyErr_SetString(g_CudaError, e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(g_GpuosError, e.what());
  }
}

void init_exceptions(py::module_& m) {
  g_GpuosError = PyErr_NewExceptionWithDoc("gpuos.GpuosError", "Base class of GPUOS errors.",
                                           PyExc_RuntimeError, nullptr);
  g_CudaError = PyErr_NewExceptionWithDoc("gpuos.CudaError",
                                          "A CUDA driver call failed, or no usable GPU / driver / NVRTC.",
                                          g_GpuosError, nullptr);
  g_CompileError = PyErr_NewExceptionWithDoc(
      "gpuos.CompileError", "NVRTC failed; attributes: log, arch, options, source_path.", g_GpuosError, nullptr);
  m.attr("GpuosError") = py::handle(g_GpuosError);
  m.attr("CudaError") = py::handle(g_CudaError);
  m.attr("CompileError") = py::handle(g_CompileError);
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const CompileError& e) {
      set_compile_error(e);
    } catch (const CudaError& e) {
      PyErr_SetString(g_CudaError, e.what());
    }
  });
}

}  // namespace gpuos
