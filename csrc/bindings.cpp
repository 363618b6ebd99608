// csrc/bindings.cpp -- the Python module `gpuos_ext`: validation, tensors -> operands, errors.
// The hot submit_* functions are METH_FASTCALL CPython functions (pybind11's dispatcher costs more than the
// whole record path); everything else is bound with pybind11.
#include <torch/extension.h>
#include <ATen/EmptyTensor.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/PyInterpreter.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "cuda_api.h"
#include "device_src/functors.h"
#include "device_src/interp.h"
#include "fusion.h"
#include "generations.h"
#include "jit.h"
#include "runtime.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <unordered_map>

namespace py = pybind11;
using namespace gpuos;

namespace gpuos {
// csrc/injection_bindings.cpp: register_elementwise, register_op, install, switch, rollback, user_ops, ...
void add_injection_bindings(py::module_& m, std::function<std::vector<Runtime*>()> runtimes,
                            std::function<Runtime*()> current_runtime);
}  // namespace gpuos

namespace {

constexpr int kMaxDevices = 64;

PyObject* g_GpuosError = nullptr;
PyObject* g_CudaError = nullptr;
PyObject* g_CompileError = nullptr;

Config g_cfg;                            // config for runtimes created from now on
Runtime* g_rt[kMaxDevices] = {nullptr};  // leaked at exit on purpose: atexit shutdown() releases them
std::mutex g_rt_life;  // g_rt slots change (create / delete) under it: the compile thread's ready hook reads them
std::vector<PyObject*> g_keep[kMaxDevices];  // strong refs (GIL held) until the pending work is published

// ------------------------------------------------------------------ errors
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

// ------------------------------------------------------------------ runtimes
// The caller's current stream on `dev` (what torch.cuda.current_stream(dev) gives), through c10's device
// guard interface: no Python call, no CUDA headers (the CUDA guard is registered when torch loads its CUDA
// library). It used to be a call of torch._C._cuda_getCurrentRawStream: ~0.4 us per recorded op.
CUstream current_stream(int dev) {
  static const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream st = impl->getStream(c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)dev));
  return reinterpret_cast<CUstream>(st.native_handle());
}

// Lock discipline (GIL vs Runtime::mu): a thread never waits for mu while holding the GIL (lock_rt releases
// it while waiting), and code holding mu never runs Python that could hand the GIL to another thread. So
// keep-alive references are not dropped under mu (a tensor's dealloc can run arbitrary Python, e.g. GC):
// publication moves them to g_release, and drain_release() drops them after mu is released. Breaking this
// deadlocked the scheduler's timer thread against a recording thread.
std::vector<PyObject*> g_release[kMaxDevices];
std::vector<at::Tensor> g_keep_t[kMaxDevices], g_release_t[kMaxDevices];  // the same, for lowered deferred ops

void move_keep_to_release(int dev) {
  auto& r = g_release[dev];
  r.insert(r.end(), g_keep[dev].begin(), g_keep[dev].end());
  g_keep[dev].clear();
  auto& rt = g_release_t[dev];
  for (auto& t : g_keep_t[dev]) rt.push_back(std::move(t));
  g_keep_t[dev].clear();
}

void keep_tensor(int dev, at::Tensor&& t) { g_keep_t[dev].push_back(std::move(t)); }

void drain_release() {
  for (auto& r : g_release) {
    if (r.empty()) continue;
    std::vector<PyObject*> batch;
    batch.swap(r);
    for (PyObject* o : batch) Py_DECREF(o);
  }
  for (auto& r : g_release_t) {
    if (r.empty()) continue;
    std::vector<at::Tensor> batch;
    batch.swap(r);
  }
}

void release_keep(int dev) {
  move_keep_to_release(dev);
  drain_release();
}

void lower_deferred(int dev, Runtime& rt);  // the scheduler's deferred ops (below)

std::unique_lock<std::mutex> lock_rt(Runtime& rt) {
  std::unique_lock<std::mutex> lk(rt.mu, std::try_to_lock);
  if (!lk.owns_lock()) {
    py::gil_scoped_release nogil;
    lk.lock();
  }
  return lk;
}

// Holds a runtime's lock for a binding call; drops released keep-alive references after unlocking.
struct RtLock {
  std::unique_lock<std::mutex> lk;
  explicit RtLock(Runtime& rt) : lk(lock_rt(rt)) {}
  ~RtLock() {
    if (lk.owns_lock()) lk.unlock();
    drain_release();
  }
};

void keep3(int dev, PyObject* a, PyObject* b, PyObject* c) {
  auto& k = g_keep[dev];
  Py_INCREF(a);
  Py_INCREF(b);
  Py_INCREF(c);
  k.push_back(a);
  k.push_back(b);
  k.push_back(c);
}

Runtime& runtime_for(int dev) {
  if (dev < 0 || dev >= kMaxDevices) throw py::value_error("gpuos: CUDA device index out of range");
  if (!g_rt[dev]) {
    auto* rt = new Runtime(dev, g_cfg, [dev] { return current_stream(dev); });
    rt->set_publish_hook([dev] { move_keep_to_release(dev); });
    std::lock_guard<std::mutex> life(g_rt_life);
    g_rt[dev] = rt;
  }
  return *g_rt[dev];
}

int current_device() {
  return py::module_::import("torch").attr("cuda").attr("current_device")().cast<int>();
}

// ------------------------------------------------------------------ validation
std::string shape_str(const at::Tensor& t) {
  // No iostreams: torch wheels and this extension may carry different libstdc++ locale facets, and
  // numeric ostream insertion crashed on torch 2.11 (seen on the H200 machine).
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  if (t.dim() == 1) s += ",";
  return s + ")";
}
std::string shape_vec_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() == 1) s += ",";
  return s + ")";
}
std::string dtype_name(at::ScalarType st) {
  std::string s = c10::toString(st);
  // c10 names: Float, Half, BFloat16, Long ... -> torch names
  if (s == "Float") return "float32";
  if (s == "Half") return "float16";
  if (s == "BFloat16") return "bfloat16";
  if (s == "Double") return "float64";
  if (s == "Long") return "int64";
  if (s == "Int") return "int32";
  if (s == "Bool") return "bool";
  return s;
}
std::string dtype_str(const at::Tensor& t) { return dtype_name(t.scalar_type()); }
std::string describe(const char* name, const at::Tensor& t) {
  return std::string(name) + ": " + t.device().str() + " " + dtype_str(t) + " " + shape_str(t);
}

int dtype_code(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return kF32;
    case at::kHalf: return kF16;
    case at::kBFloat16: return kBF16;
    default: return -1;
  }
}

const at::Tensor& as_tensor(PyObject* o, const char* op, const char* argname) {
  if (!THPVariable_Check(o))
    throw py::type_error(std::string(op) + ": argument '" + argname + "' must be a torch.Tensor, got " +
                         Py_TYPE(o)->tp_name);
  return THPVariable_Unpack(o);
}

// Byte range [lo, hi) a strided view can touch.
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

// Does `in` share memory with `out` other than as exactly the same view (the allowed in-place case)?
bool partially_overlaps(const at::Tensor& out, const at::Tensor& in, bool allow_identical = true) {
  if (in.numel() == 0 || out.numel() == 0) return false;
  if (in.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl() !=
      out.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl())
    return false;  // the common case, without touching sizes or strides
  uint64_t lo, hi, olo, ohi;
  extent((uint64_t)(uintptr_t)in.data_ptr(), (int)in.dim(), in.sizes().data(), in.strides().data(),
         (int64_t)in.element_size(), lo, hi);
  extent((uint64_t)(uintptr_t)out.data_ptr(), (int)out.dim(), out.sizes().data(), out.strides().data(),
         (int64_t)out.element_size(), olo, ohi);
  if (!(lo < ohi && olo < hi)) return false;
  const bool identical =
      in.data_ptr() == out.data_ptr() && in.sizes() == out.sizes() && in.strides() == out.strides();
  return !(allow_identical && identical);
}

bool has_internal_overlap(const at::Tensor& t) {
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.stride(i) == 0 && t.size(i) > 1) return true;
  return false;
}

// Checks for out = op(a, b); throws TypeError / ValueError naming op, shapes, dtypes and the fix.
void check_binary(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const at::Tensor* ts[3] = {&a, &b, &out};
  const char* names[3] = {"a", "b", "out"};
  auto all = [&] {
    return describe(names[0], a) + "; " + describe(names[1], b) + "; " + describe(names[2], out);
  };
  for (int i = 0; i < 3; ++i)
    if (!ts[i]->is_cuda())
      throw py::type_error(std::string(op) + ": every tensor must be a CUDA tensor, but '" + names[i] +
                           "' is on " + ts[i]->device().str() + " (" + all() +
                           "). Fix: move inputs and output to the GPU with .cuda() / .to('cuda').");
  if (dtype_code(a.scalar_type()) < 0 || a.scalar_type() != b.scalar_type() ||
      a.scalar_type() != out.scalar_type())
    throw py::type_error(std::string(op) + ": dtypes must be equal and one of float32, float16, bfloat16; got " +
                         all() + ". Fix: cast with .to(torch.float32) (or float16 / bfloat16).");
  if (a.get_device() != b.get_device() || a.get_device() != out.get_device())
    throw py::value_error(std::string(op) + ": tensors are on different devices (" + all() +
                          "). Fix: put all three on one GPU.");
  if (a.sizes() != b.sizes() || a.sizes() != out.sizes())
    throw py::value_error(std::string(op) + ": shapes must be equal, got a " + shape_str(a) + ", b " +
                          shape_str(b) + ", out " + shape_str(out) + " (" + all() +
                          "). Fix: expand inputs to the output shape (a.expand(out.shape)) or allocate out "
                          "with the inputs' shape; submit_* does not broadcast.");
  if (!out.is_contiguous() && has_internal_overlap(out))
    throw py::value_error(std::string(op) + ": out " + shape_str(out) + " has stride-0 (expanded) dims, so "
                          "several elements would write one location. Fix: pass a freshly allocated out.");
  for (int i = 0; i < 2; ++i)
    if (partially_overlaps(out, *ts[i]))
      throw py::value_error(std::string(op) + ": out partially overlaps input '" + names[i] + "' (" + all() +
                            "); only exact in-place (out is the same view as the input) is allowed. Fix: "
                            "write to a separate tensor, or clone the input first.");
}

Operand operand(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  Operand o;
  o.ptr = (uint64_t)(uintptr_t)impl->data();  // const: no copy-on-write materialisation
  o.dtype = (uint32_t)dtype_code(impl->dtype().toScalarType());
  o.ndim = (int)impl->dim();
  o.sizes = impl->sizes().data();
  o.strides = impl->strides().data();
  o.contiguous = impl->is_contiguous();
  o.storage = (uintptr_t)impl->storage().unsafeGetStorageImpl();
  const int64_t es = (int64_t)impl->itemsize();
  if (o.contiguous) {
    o.lo = o.ptr;
    o.hi = o.ptr + (uint64_t)(impl->numel() * es);
  } else {
    extent(o.ptr, o.ndim, o.sizes, o.strides, es, o.lo, o.hi);
  }
  return o;
}

// The op table (device_src/ops.def), as the host sees it.
struct OpInfo {
  const char* name;
  uint32_t arity, kind, nscalars;
  const char* scalar_names;  // comma-separated
  float d0, d1;
  const char* aten;  // '|'-separated
};
const OpInfo kOps[] = {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) {#name, arity, kind, ns, snames, d0, d1, aten},
#include "device_src/ops.def"
#undef GPUOS_OP
};
constexpr uint32_t kNumOpsHost = sizeof(kOps) / sizeof(kOps[0]);
const char* const kSubmitNames[] = {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) "gpuos.submit_" #name,
#include "device_src/ops.def"
#undef GPUOS_OP
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t e = s.find(sep, start);
    if (e == std::string::npos) e = s.size();
    if (e > start) out.push_back(s.substr(start, e - start));
    start = e + 1;
  }
  return out;
}

void record_one(uint32_t op, PyObject* pa, PyObject* pb, PyObject* pout) {
  const char* nm = kSubmitNames[op];
  const at::Tensor& a = as_tensor(pa, nm, "a");
  const at::Tensor& b = as_tensor(pb, nm, "b");
  const at::Tensor& out = as_tensor(pout, nm, "out");
  check_binary(nm, a, b, out);
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const int dev = out.get_device();
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  lower_deferred(dev, rt);
  rt.record_binary(op, operand(out), operand(a), operand(b), numel);
  keep3(dev, pa, pb, pout);
}

template <uint32_t OP>
PyObject* submit_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 3)
      throw py::type_error(std::string(kSubmitNames[OP]) + "(a, b, out) takes 3 positional arguments, got " +
                           std::to_string(nargs));
    record_one(OP, args[0], args[1], args[2]);
    Py_RETURN_NONE;
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

uint32_t op_id(const std::string& name, const char* who, int kind = -1, uint32_t max_id = kNumOpsHost) {
  for (uint32_t i = 0; i < max_id; ++i)
    if (name == kOps[i].name && (kind < 0 || kOps[i].kind == (uint32_t)kind)) return i;
  std::string valid;
  for (uint32_t i = 0; i < max_id; ++i)
    if (kind < 0 || kOps[i].kind == (uint32_t)kind) valid += std::string(valid.empty() ? "" : ", ") + "'" + kOps[i].name + "'";
  throw py::value_error(std::string(who) + ": unknown op '" + name + "'; supported: " + valid);
}

void submit_many(const std::string& opname, py::handle A, py::handle B, py::handle C) {
  const uint32_t op = op_id(opname, "gpuos.submit_many", -1, 4);  // the seed's binary ops
  for (auto* s : {&A, &B, &C})
    if (!PySequence_Check(s->ptr()))
      throw py::type_error("gpuos.submit_many: a_list, b_list and out_list must be lists or tuples of tensors");
  PyObject* fa = PySequence_Fast(A.ptr(), "a_list must be a sequence");
  PyObject* fb = PySequence_Fast(B.ptr(), "b_list must be a sequence");
  PyObject* fc = PySequence_Fast(C.ptr(), "out_list must be a sequence");
  py::object ga = py::reinterpret_steal<py::object>(fa), gb = py::reinterpret_steal<py::object>(fb),
             gc = py::reinterpret_steal<py::object>(fc);
  if (!fa || !fb || !fc) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fa);
  if (PySequence_Fast_GET_SIZE(fb) != n || PySequence_Fast_GET_SIZE(fc) != n)
    throw py::value_error("gpuos.submit_many('" + opname + "'): list lengths differ: a_list " + std::to_string(n) +
                          ", b_list " + std::to_string(PySequence_Fast_GET_SIZE(fb)) + ", out_list " +
                          std::to_string(PySequence_Fast_GET_SIZE(fc)) + ". Fix: pass three lists of equal length.");
  PyObject** ia = PySequence_Fast_ITEMS(fa);
  PyObject** ib = PySequence_Fast_ITEMS(fb);
  PyObject** ic = PySequence_Fast_ITEMS(fc);
  const char* nm = kSubmitNames[op];
  // Pass 1 validates everything (a bad element leaves nothing recorded) and extracts the operands, so pass 2
  // never touches the tensor objects again. The objects are scattered in memory: prefetch ahead in stages
  // (PyObject, then its TensorImpl, then the StorageImpl that holds the data pointer).
  struct Rec { Operand out, a, b; int64_t numel; int dev; };
  // Reused across calls: a fresh multi-MB vector per call costs page faults (seen as 2x run-to-run spread).
  static std::vector<Rec> recs;
  recs.resize((size_t)n);
  PyObject** lists[3] = {ia, ib, ic};
  auto impl_of = [](PyObject* o) -> const c10::TensorImpl* {
    return THPVariable_Check(o) ? THPVariable_Unpack(o).unsafeGetTensorImpl() : nullptr;
  };
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (i + 16 < n)
      for (auto* l : lists) __builtin_prefetch(l[i + 16]);
    if (i + 8 < n)
      for (auto* l : lists)
        if (const c10::TensorImpl* t = impl_of(l[i + 8])) {
          __builtin_prefetch(t);
          __builtin_prefetch((const char*)t + 64);
          __builtin_prefetch((const char*)t + 128);
        }
    if (i + 4 < n)
      for (auto* l : lists)
        if (const c10::TensorImpl* t = impl_of(l[i + 4])) __builtin_prefetch(t->storage().unsafeGetStorageImpl());
    try {
      const at::Tensor& a = as_tensor(ia[i], nm, "a");
      const at::Tensor& b = as_tensor(ib[i], nm, "b");
      const at::Tensor& out = as_tensor(ic[i], nm, "out");
      check_binary(nm, a, b, out);
      recs[i] = {operand(out), operand(a), operand(b), out.numel(), out.get_device()};
    } catch (py::builtin_exception& e) {
      std::string msg = std::string("gpuos.submit_many element ") + std::to_string(i) + ": " + e.what();
      if (dynamic_cast<py::type_error*>(&e)) throw py::type_error(msg);
      throw py::value_error(msg);
    }
  }
  Runtime* rt = nullptr;
  std::unique_ptr<RtLock> lk;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Rec& r = recs[i];
    if (r.numel == 0) continue;
    if (!rt || rt->device() != r.dev) {
      lk.reset();
      rt = &runtime_for(r.dev);
      lk = std::make_unique<RtLock>(*rt);
      lower_deferred(r.dev, *rt);
    }
    rt->record_binary(op, r.out, r.a, r.b, r.numel);
    keep3(r.dev, ia[i], ib[i], ic[i]);
  }
}

const std::vector<const char*>& functor_names() {
  static const std::vector<const char*> v = {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) #functor,
#include "device_src/ops.def"
#undef GPUOS_OP
  };
  return v;
}

// ------------------------------------------------------------------ generic ops (issue 3)
bool is_number(PyObject* o) { return PyFloat_Check(o) || PyLong_Check(o) || PyBool_Check(o); }

void check_overlap(const char* who, const at::Tensor& out, const at::Tensor& in, const std::string& inname) {
  if (partially_overlaps(out, in))
    throw py::value_error(std::string(who) + ": out " + shape_str(out) + " partially overlaps " + inname + " " +
                          shape_str(in) + "; only exact in-place is allowed. Fix: write to a separate tensor.");
}

void check_cuda_float(const char* who, const at::Tensor& t, const std::string& name) {
  if (!t.is_cuda())
    throw py::type_error(std::string(who) + ": " + name + " must be a CUDA tensor, got " + describe(name.c_str(), t) +
                         ". Fix: move it to the GPU with .cuda().");
  if (dtype_code(t.scalar_type()) < 0)
    throw py::type_error(std::string(who) + ": " + name + " has dtype " + dtype_str(t) +
                         "; supported: float32, float16, bfloat16. Fix: cast with .float() / .half() / .bfloat16().");
}

// Record out = op(ins; s0, s1) (undefined ins[k]: constant cv[k]) once validated; inputs broadcast to out's
// shape as stride-0 views. The one lowering of an elementwise op: submit() and the scheduler both use it.
void record_ew_tensors(Runtime& rt, uint32_t op, uint32_t arity, const at::Tensor& out, const at::Tensor* ins,
                       const float* cv, float s0, float s1) {
  const int64_t numel = out.numel();
  if (numel == 0) return;
  at::Tensor expanded[3];
  Operand opnd[3];
  for (uint32_t k = 0; k < arity; ++k) {
    if (!ins[k].defined()) {
      opnd[k].is_const = true;
      opnd[k].value = cv[k];
      continue;
    }
    expanded[k] = ins[k].sizes() == out.sizes() ? ins[k] : ins[k].expand(out.sizes());
    opnd[k] = operand(expanded[k]);
  }
  rt.record_ew(op, arity, operand(out), opnd, s0, s1, numel);
}

// submit()'s op: a table op (name or id), or an injected op (name or id returned by register_*; issue #5,
// generations.h), whose description goes into `user` (scalars s0, s1).
uint32_t submit_op(py::handle opobj, std::string& opname, OpInfo& user) {
  int64_t id = -1;
  if (PyUnicode_Check(opobj.ptr())) {
    opname = opobj.cast<std::string>();
    for (uint32_t i = 0; i < kNumOpsHost; ++i)
      if (opname == kOps[i].name) return i;
    if (!is_user_op_name(opname)) return op_id(opname, "gpuos.submit");  // raises, listing the table ops
  } else if (PyLong_Check(opobj.ptr())) {
    id = opobj.cast<int64_t>();
    if (id >= 0 && id < (int64_t)kNumOpsHost) {
      opname = kOps[id].name;
      return (uint32_t)id;
    }
  } else {
    throw py::type_error("gpuos.submit: op must be an op name (str) or id (int), got " +
                         std::string(Py_TYPE(opobj.ptr())->tp_name));
  }
  SubmitOp so;
  {
    py::gil_scoped_release nogil;  // may wait for the op's generation to finish compiling
    so = user_op_for_submit(opname, id);
  }
  opname = so.name;
  user = OpInfo{opname.c_str(), so.arity, 0, 2, "s0,s1", 0.0f, 0.0f, ""};
  return so.id;
}

void submit_generic(py::handle opobj, py::handle inputs, py::handle pout, py::kwargs kwargs) {
  std::string opname;
  OpInfo user_info{};
  const uint32_t op = submit_op(opobj, opname, user_info);
  const OpInfo& info = op < kNumOpsHost ? kOps[op] : user_info;
  const std::string who = "gpuos.submit('" + opname + "')";
  if (info.kind != 0)
    throw py::value_error(who + ": '" + opname + "' is a reduction; use gpuos.submit_reduce(op, x, out)");
  if (!PySequence_Check(inputs.ptr()) || PyUnicode_Check(inputs.ptr()))
    throw py::type_error(who + ": inputs must be a list or tuple of tensors / numbers");
  py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(inputs.ptr(), "inputs must be a sequence"));
  if (!fast) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
  if ((uint32_t)n != info.arity)
    throw py::value_error(who + " takes " + std::to_string(info.arity) + " input(s), got " + std::to_string(n));
  // Scalars: table defaults, overridden by keyword (None -> unbounded for clamp's min/max).
  const std::vector<std::string> snames = split(info.scalar_names, ',');
  float sc[2] = {info.d0, info.d1};
  for (auto item : kwargs) {
    const std::string key = py::str(item.first);
    size_t idx = 0;
    while (idx < snames.size() && snames[idx] != key) ++idx;
    if (idx == snames.size()) {
      std::string valid;
      for (auto& nm : snames) valid += (valid.empty() ? "" : ", ") + nm;
      throw py::type_error(who + ": unexpected scalar '" + key + "'; this op takes: " + (valid.empty() ? "none" : valid));
    }
    if (item.second.is_none()) sc[idx] = idx == 0 ? -__builtin_huge_valf() : __builtin_huge_valf();
    else sc[idx] = item.second.cast<float>();
  }
  PyObject* out_obj = pout.ptr();
  const at::Tensor& out = as_tensor(out_obj, who.c_str(), "out");
  check_cuda_float(who.c_str(), out, "out");
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<at::Tensor> tens;
  std::vector<int> tidx;
  c10::optional<at::ScalarType> promoted;
  std::vector<at::IntArrayRef> shapes;
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (is_number(items[k])) continue;
    const std::string nm = "input " + std::to_string(k);
    const at::Tensor& t = as_tensor(items[k], who.c_str(), nm.c_str());
    check_cuda_float(who.c_str(), t, nm);
    if (t.get_device() != out.get_device())
      throw py::value_error(who + ": " + nm + " is on " + t.device().str() + " but out is on " + out.device().str());
    tens.push_back(t);
    tidx.push_back((int)k);
  }
  // PyTorch's rule (all our dtypes are floats, one category): 0-d tensors take part in promotion only when
  // no dimensioned tensor is present.
  bool any_dimensioned = false;
  for (auto& t : tens) any_dimensioned |= t.dim() > 0;
  for (auto& t : tens)
    if (!any_dimensioned || t.dim() > 0)
      promoted = promoted ? c10::promoteTypes(*promoted, t.scalar_type()) : t.scalar_type();
  if (promoted && *promoted != out.scalar_type()) {
    std::string got;
    for (auto& t : tens) got += (got.empty() ? "" : ", ") + dtype_str(t);
    throw py::type_error(who + ": out dtype " + dtype_str(out) + " is not the promoted dtype of the inputs (" + got +
                         " -> " + dtype_name(*promoted) + "). Fix: allocate out with that dtype.");
  }
  std::vector<int64_t> bshape;
  if (!tens.empty()) {
    bshape = tens[0].sizes().vec();
    for (size_t i = 1; i < tens.size(); ++i) {
      try {
        bshape = at::infer_size(bshape, tens[i].sizes());
      } catch (const c10::Error&) {
        std::string shapes_s;
        for (auto& t : tens) shapes_s += (shapes_s.empty() ? "" : ", ") + shape_str(t);
        throw py::value_error(who + ": input shapes " + shapes_s + " do not broadcast together");
      }
    }
    if (at::IntArrayRef(bshape) != out.sizes()) {
      std::string shapes_s;
      for (auto& t : tens) shapes_s += (shapes_s.empty() ? "" : ", ") + shape_str(t);
      throw py::value_error(who + ": out shape " + shape_str(out) + " must equal the broadcast shape of the inputs (" +
                            shapes_s + "). Fix: allocate out with the broadcast shape.");
    }
  }
  if (!out.is_contiguous() && has_internal_overlap(out))
    throw py::value_error(who + ": out " + shape_str(out) + " has stride-0 (expanded) dims. Fix: pass a fresh out.");
  for (size_t i = 0; i < tens.size(); ++i) check_overlap(who.c_str(), out, tens[i], "input " + std::to_string(tidx[i]));
  if (out.numel() == 0) return;
  at::Tensor ins[3];
  float cv[3] = {0.f, 0.f, 0.f};
  for (Py_ssize_t k = 0, t = 0; k < n; ++k) {
    if (is_number(items[k])) cv[k] = (float)PyFloat_AsDouble(items[k]);
    else ins[k] = tens[t++];
  }
  const int dev = out.get_device();
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  lower_deferred(dev, rt);
  record_ew_tensors(rt, op, info.arity, out, ins, cv, sc[0], sc[1]);
  auto& keep = g_keep[dev];
  Py_INCREF(out_obj);
  keep.push_back(out_obj);
  for (Py_ssize_t k = 0; k < n; ++k)
    if (!is_number(items[k])) {
      Py_INCREF(items[k]);
      keep.push_back(items[k]);
    }
}

TensorRef make_ref(const at::Tensor& t, int ndim) {
  TensorRef r{};
  r.ptr = (uint64_t)(uintptr_t)t.data_ptr();
  r.ndim = (uint32_t)ndim;
  r.dtype = (uint32_t)dtype_code(t.scalar_type());
  for (int i = 0; i < (int)kMaxDims; ++i) {
    r.sizes[i] = i < ndim ? t.size(i) : 1;
    r.strides[i] = i < ndim ? t.stride(i) : 0;
  }
  return r;
}

// Record a validated last-dim reduction (the one lowering: submit_reduce() and the scheduler use it).
void record_reduce_tensors(Runtime& rt, uint32_t op, const at::Tensor& x, const at::Tensor& out, bool keepdim) {
  const bool row_out = kOps[op].name == std::string("softmax") || kOps[op].name == std::string("log_softmax");
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? out.numel() : x.numel() / cols;
  if (rows == 0 || out.numel() == 0) return;
  const TensorRef xr = make_ref(x, (int)x.dim());
  TensorRef orf = make_ref(out, row_out ? (int)out.dim() : (int)x.dim() - 1);
  if (!row_out && keepdim) orf = make_ref(out.squeeze(-1), (int)x.dim() - 1);
  rt.record_reduce(op, operand(out), orf, operand(x), xr, rows, cols);
}

// submit_reduce(op, x, out, keepdim=False): METH_FASTCALL | METH_KEYWORDS (the W3 loop calls it 1,000 times
// per batch: pybind11's dispatch and the eager error-message strings cost more than the record path).
void submit_reduce_impl(PyObject* pop, PyObject* px, PyObject* pout, bool keepdim) {
  if (!PyUnicode_Check(pop))
    throw py::type_error(std::string("gpuos.submit_reduce: op must be a reduction name (str), e.g. 'sum'; got ") +
                         Py_TYPE(pop)->tp_name + ". gpuos.supported_ops() lists them.");
  const char* opname = PyUnicode_AsUTF8(pop);
  if (!opname) throw py::error_already_set();
  uint32_t op = kNumOpsHost;
  for (uint32_t i = 0; i < kNumOpsHost; ++i)
    if (kOps[i].kind == 1 && std::strcmp(opname, kOps[i].name) == 0) op = i;
  if (op == kNumOpsHost) op_id(opname, "gpuos.submit_reduce", 1);  // raises, listing the reductions
  auto who = [&] { return std::string("gpuos.submit_reduce('") + opname + "')"; };
  const at::Tensor& x = as_tensor(px, "gpuos.submit_reduce", "x");
  const at::Tensor& out = as_tensor(pout, "gpuos.submit_reduce", "out");
  check_cuda_float("gpuos.submit_reduce", x, "x");
  check_cuda_float("gpuos.submit_reduce", out, "out");
  if (x.scalar_type() != out.scalar_type())
    throw py::type_error(who() + ": out dtype " + dtype_str(out) + " must equal x dtype " + dtype_str(x));
  if (x.get_device() != out.get_device()) throw py::value_error(who() + ": x and out are on different devices");
  const int64_t xd = x.dim();
  if (xd < 1 || xd > (int64_t)kMaxDims)
    throw py::value_error(who() + ": x must have 1.." + std::to_string(kMaxDims) + " dims, got " + shape_str(x));
  const bool row_out = op == kOp_softmax || op == kOp_log_softmax;
  // out's shape: x's (softmax / log_softmax), else x's without the last dim (keepdim: with it as 1)
  const at::IntArrayRef xs = x.sizes(), os = out.sizes();
  const int64_t want_dim = row_out || keepdim ? xd : xd - 1;
  bool shape_ok = (int64_t)os.size() == want_dim;
  for (int64_t i = 0; shape_ok && i < want_dim; ++i)
    shape_ok = os[i] == (i < xd - 1 || row_out ? xs[i] : 1);
  if (!shape_ok) {
    std::vector<int64_t> want = xs.vec();
    if (!row_out) {
      want.pop_back();
      if (keepdim) want.push_back(1);
    }
    throw py::value_error(who() + ": out shape " + shape_str(out) + " must be " + shape_vec_str(want) + " for x " +
                          shape_str(x) + (row_out ? "" : (keepdim ? " with keepdim=True" : " with keepdim=False")));
  }
  const int64_t cols = xs[xd - 1];
  if ((op == kOp_amax || op == kOp_amin) && cols == 0 && out.numel() > 0)
    throw py::value_error(who() + ": the last dim of x " + shape_str(x) + " is empty; amax/amin have no identity");
  if (!out.is_contiguous() && has_internal_overlap(out))
    throw py::value_error(who() + ": out " + shape_str(out) + " has stride-0 (expanded) dims");
  if (row_out) check_overlap(who().c_str(), out, x, "x");  // in-place softmax is allowed
  else if (partially_overlaps(out, x, /*allow_identical=*/false))
    throw py::value_error(who() + ": out overlaps x. Fix: write to a separate tensor.");
  const int dev = out.get_device();
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  lower_deferred(dev, rt);
  record_reduce_tensors(rt, op, x, out, keepdim);
  keep3(dev, px, pout, pout);
}

PyObject* submit_reduce_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  try {
    static const char* const kNames[4] = {"op", "x", "out", "keepdim"};
    PyObject* a[4] = {nullptr, nullptr, nullptr, nullptr};
    if (nargs > 4)
      throw py::type_error("gpuos.submit_reduce(op, x, out, keepdim=False) takes at most 4 arguments, got " +
                           std::to_string(nargs));
    for (Py_ssize_t i = 0; i < nargs; ++i) a[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      const char* kw = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
      int slot = -1;
      for (int i = 0; i < 4 && kw; ++i)
        if (std::strcmp(kw, kNames[i]) == 0) slot = i;
      if (slot < 0)
        throw py::type_error(std::string("gpuos.submit_reduce() got an unexpected keyword argument '") +
                             (kw ? kw : "?") + "'");
      if (a[slot]) throw py::type_error(std::string("gpuos.submit_reduce() got multiple values for '") + kw + "'");
      a[slot] = args[nargs + k];
    }
    for (int i = 0; i < 3; ++i)
      if (!a[i]) throw py::type_error(std::string("gpuos.submit_reduce() missing required argument '") + kNames[i] + "'");
    int keepdim = 0;
    if (a[3] && (keepdim = PyObject_IsTrue(a[3])) < 0) throw py::error_already_set();
    submit_reduce_impl(a[0], a[1], a[2], keepdim != 0);
    Py_RETURN_NONE;
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// ------------------------------------------------------------------ scheduler record path (issues 4, 5)
// gpuos.scheduler_context's handlers call sched_ew / sched_reduce: one C++ call validates, allocates the
// output and defers the op. Deferred ops are lowered into sub-ops when they are flushed (or before anything
// else is recorded on the device); lowering fuses chains of elementwise ops whose intermediates nothing else
// can read (only our references to the tensor and its storage remain) into one interpreter sub-op, so those
// intermediates are never written. Everything here runs under Runtime::mu except the argument checks.
enum SchedReason : int { kRNotCuda = 1, kRLayout, kRDtype, kRSize, kRAutograd, kRArgs, kRDevice };
enum SchedMode : int { kModeFunctional = 0, kModeInplace = 1, kModeOut = 2 };

struct DeferredOp {
  uint32_t op = 0, nin = 0;
  bool reduce = false, keepdim = false, fresh = false;  // fresh: out was allocated by the scheduler
  float s0 = 0.f, s1 = 0.f;
  at::Tensor out;
  at::Tensor in[3];  // undefined: constant cv[k]
  float cv[3] = {0.f, 0.f, 0.f};
};

// A set of pointers without an allocation per insert (open addressing, linear probing; clear() is O(1): slots
// of an older generation are empty), for the three inserts per recorded op (std::unordered_set allocated a node
// for each).
class PtrSet {
 public:
  void insert(const void* p) {
    if ((n_ + 1) * 2 > slots_.size()) grow();
    place(p);
  }
  bool count(const void* p) const {
    if (slots_.empty()) return false;
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash(p) & mask;; i = (i + 1) & mask) {
      if (slots_[i].gen != gen_) return false;
      if (slots_[i].key == p) return true;
    }
  }
  void clear() {
    n_ = 0;
    if (++gen_ == 0) {  // generations wrapped: really empty the slots
      std::fill(slots_.begin(), slots_.end(), Slot{});
      gen_ = 1;
    }
  }

 private:
  struct Slot {
    const void* key = nullptr;
    uint32_t gen = 0;
  };
  static size_t hash(const void* p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return (size_t)(x ^ (x >> 33));
  }
  void place(const void* p) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash(p) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.gen != gen_) {
        s = {p, gen_};
        ++n_;
        return;
      }
      if (s.key == p) return;
    }
  }
  void grow() {
    std::vector<Slot> old(std::max<size_t>(64, slots_.size() * 2));
    old.swap(slots_);
    const uint32_t live = gen_;
    gen_ = 1;
    n_ = 0;
    for (const Slot& s : old)
      if (s.gen == live) place(s.key);
  }
  std::vector<Slot> slots_;  // size: a power of two
  uint32_t gen_ = 1;
  size_t n_ = 0;
};

struct Deferred {
  std::vector<DeferredOp> ops;
  PtrSet storages;  // every storage the deferred ops read or write
  CUstream stream = nullptr;
  std::chrono::steady_clock::time_point oldest;
};
Deferred g_def[kMaxDevices];

// Storages of fused-away intermediates (dead to Python, never written or read by any GPU work), kept for the
// next scheduler outputs of the same byte size, allocator and stream: such an output costs a TensorImpl instead
// of a caching-allocator malloc and, later, free (W2 on one H200 host: 3.96 -> 3.14 us per op, record + exit).
// Stream safety: the caching allocator handed the block out for that stream and nothing touched it since, so
// stream order covers its reuse exactly as it covers the allocator's own reuse. At most kPoolMaxBytes per
// device; shutdown() empties it.
struct OutPool {
  struct Bucket {
    CUstream stream;
    c10::Allocator* alloc;
    size_t nbytes;
    std::vector<c10::Storage> v;
  };
  std::mutex mu;
  std::vector<Bucket> buckets;
  size_t bytes = 0;
};
OutPool* const g_pool = new OutPool[kMaxDevices];  // leaked at exit on purpose (no frees after CUDA teardown)
constexpr size_t kPoolMaxBytes = size_t(64) << 20;
uint64_t g_recycled = 0;  // outputs served from the pool

void pool_put(int dev, CUstream s, const c10::Storage& st) {
  OutPool& P = g_pool[dev];
  const size_t nb = st.nbytes();
  std::lock_guard<std::mutex> g(P.mu);
  if (nb == 0 || P.bytes + nb > kPoolMaxBytes) return;
  for (auto& b : P.buckets)
    if (b.stream == s && b.alloc == st.allocator() && b.nbytes == nb) {
      b.v.push_back(st);
      P.bytes += nb;
      return;
    }
  P.buckets.push_back({s, st.allocator(), nb, {st}});
  P.bytes += nb;
}

// A pooled storage nothing else references any more (its intermediate's tensor already dropped), or false.
bool pool_take(int dev, CUstream s, c10::Allocator* a, size_t nb, c10::Storage& out) {
  OutPool& P = g_pool[dev];
  std::lock_guard<std::mutex> g(P.mu);
  if (P.bytes == 0) return false;
  for (auto& b : P.buckets) {
    if (b.stream != s || b.alloc != a || b.nbytes != nb || b.v.empty()) continue;
    if (b.v.back().use_count() != 1) return false;
    out = std::move(b.v.back());
    b.v.pop_back();
    P.bytes -= nb;
    return true;
  }
  return false;
}

void pool_clear(int dev) {
  std::vector<OutPool::Bucket> gone;
  {
    std::lock_guard<std::mutex> g(g_pool[dev].mu);
    gone.swap(g_pool[dev].buckets);
    g_pool[dev].bytes = 0;
  }
}

struct SchedStats {
  uint64_t intercepted = 0, flushed_ops = 0, fused_groups = 0, fused_ops = 0, flushes = 0;
  uint64_t independent_eager = 0;  // eager ops that ran without flushing (no shared storage)
  uint64_t front_ops = 0;          // of `intercepted`: recorded by the __torch_function__ front
  // Host time of publication (steady clock, ns): fusion analysis, emitting sub-ops, keep-alive, Runtime::flush.
  uint64_t analyse_ns = 0, emit_ns = 0, keep_ns = 0, publish_ns = 0;
  std::map<std::string, uint64_t> by_cause;
} g_sched;
bool g_fusion = true;

const c10::TensorImpl* impl_of(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Does Python still see the tensor? PyTorch's PyObject preservation differs between versions: either the
// Python object keeps a strong reference to the TensorImpl (and C++ references beyond it keep the Python
// object alive), or a Python object dropped while C++ holds the tensor is resurrected as a borrowed one.
// calibrate_liveness() finds out which, once; then a tensor whose only references are `ours` (plus the
// preserved Python object, whose own refcount is then 1) is dead to the program.
int g_pyobj_holds_impl = -1;  // -1: not calibrated

void calibrate_liveness() {
  if (g_pyobj_holds_impl >= 0) return;
  at::Tensor held = at::empty({1});
  PyObject* o = THPVariable_Wrap(held);  // a Python object as an op result would have
  if (!o) throw py::error_already_set();
  Py_DECREF(o);                          // the program drops it; C++ still holds `held`
  g_pyobj_holds_impl = held.use_count() >= 2 ? 1 : 0;
}

bool dead_to_python(const at::Tensor& t, long ours) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  PyObject* po = impl->pyobj_slot()->load_pyobj();
  if (!po) return (long)t.use_count() == ours;
  return Py_REFCNT(po) == 1 && (long)t.use_count() == ours + g_pyobj_holds_impl;
}
const void* storage_of(const at::Tensor& t) { return t.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl(); }

// offset(e) = ((e / div) % mod) * stride of `t` read at linear index e of `shape` (t broadcast to it).
bool fused_rule(const at::Tensor& t, at::IntArrayRef shape, FusedOperand& r) {
  const int64_t nd = (int64_t)shape.size(), td = t.dim();
  r.ptr = (uint64_t)(uintptr_t)t.data_ptr();
  r.stride = 0;
  r.div = 1;
  r.mod = 0;
  int64_t inner = 1;      // product of sizes inside the current dim
  int64_t blk_lo = -1, blk_hi = -1, blk_stride = 0, expect = 0;
  bool outer_bcast = false;
  for (int64_t d = nd - 1; d >= 0; --d) {
    const int64_t sz = shape[d];
    const int64_t td_i = d - (nd - td);
    const int64_t st = (td_i >= 0 && t.size(td_i) != 1) ? t.stride(td_i) : 0;
    if (sz == 1) continue;
    if (st != 0) {
      if (blk_lo >= 0 && blk_lo != d + 1 && blk_hi >= 0) {
        // a second block of strided dims (a zero-stride dim sits between): not one block
        bool gap = false;
        for (int64_t g = d + 1; g < blk_lo; ++g) gap |= shape[g] != 1;
        if (gap) return false;
      }
      if (blk_lo < 0) {
        blk_hi = d;
        blk_stride = st;
        expect = st;
        r.div = (uint32_t)inner;
      }
      if (st != expect) return false;
      expect = st * sz;
      blk_lo = d;
    } else if (blk_lo >= 0) {
      outer_bcast = true;
    }
    inner *= sz;
  }
  if (blk_lo < 0) return true;  // every dim broadcast: one element
  int64_t blk = 1;
  for (int64_t d = blk_lo; d <= blk_hi; ++d) blk *= shape[d];
  r.stride = blk_stride;
  r.mod = outer_bcast ? (uint32_t)blk : 0u;
  if (inner > 0xffffffffll) return false;
  return true;
}

// Emit op r and the producers fused into it as one interpreter sub-op; false if it cannot be expressed
// (too many inputs/instructions, a layout the fused rule cannot address, a full program table).
bool emit_fused(Runtime& rt, std::vector<DeferredOp>& ops, const std::vector<std::array<int, 3>>& child, int r) {
  const DeferredOp& root = ops[r];
  std::vector<ExprNode> nodes;
  std::vector<const at::Tensor*> leaves;
  nodes.reserve(2 * kProgMaxInstr);
  leaves.reserve(kProgMaxInputs + 1);
  std::function<uint32_t(int)> visit;  // returns the value index (inputs numbered later: fix-up below)
  // Values: leaves first get provisional ids (1 << 20) + leaf index; nodes get their node index.
  visit = [&](int i) -> uint32_t {
    const DeferredOp& o = ops[i];
    ExprNode n{};
    n.op = o.op;
    n.nsrc = o.nin;
    n.s0 = o.s0;
    n.s1 = o.s1;
    n.round = (i == r) ? (uint32_t)kF32 : (uint32_t)dtype_code(o.out.scalar_type());
    for (uint32_t k = 0; k < o.nin; ++k) {
      if (child[i][k] >= 0) {
        n.src[k] = visit(child[i][k]);
      } else if (!o.in[k].defined()) {
        ExprNode c{};
        c.op = kOpConst;
        c.s0 = o.cv[k];
        c.round = kF32;
        nodes.push_back(c);
        n.src[k] = (uint32_t)(nodes.size() - 1);
      } else {
        const at::Tensor& t = o.in[k];
        size_t li = 0;
        for (; li < leaves.size(); ++li)
          if (leaves[li]->data_ptr() == t.data_ptr() && leaves[li]->sizes() == t.sizes() &&
              leaves[li]->strides() == t.strides() && leaves[li]->scalar_type() == t.scalar_type())
            break;
        if (li == leaves.size()) leaves.push_back(&t);
        n.src[k] = (1u << 20) + (uint32_t)li;
      }
    }
    nodes.push_back(n);
    return (uint32_t)(nodes.size() - 1);
  };
  const uint32_t outv = visit(r);
  const uint32_t nin = (uint32_t)leaves.size();
  if (nin < 1 || nin > kProgMaxInputs) return false;
  for (auto& n : nodes)
    for (uint32_t k = 0; k < n.nsrc; ++k) n.src[k] = n.src[k] >= (1u << 20) ? n.src[k] - (1u << 20) : n.src[k] + nin;
  FusedArgs fa;
  std::memset((void*)&fa, 0, sizeof fa);
  const at::IntArrayRef shape = root.out.sizes();
  if (!fused_rule(root.out, shape, fa.opnd[0]) || (fa.opnd[0].mod != 0 || fa.opnd[0].div != 1)) return false;
  fa.dtype[0] = (uint8_t)dtype_code(root.out.scalar_type());
  Operand ins[kProgMaxInputs];
  at::Tensor expanded[kProgMaxInputs];
  for (uint32_t k = 0; k < nin; ++k) {
    const at::Tensor& t = *leaves[k];
    if (!fused_rule(t, shape, fa.opnd[1 + k])) return false;
    // A leaf in the output's storage must be the output's exact view (read and write at the same index).
    if (storage_of(t) == storage_of(root.out) &&
        !(t.data_ptr() == root.out.data_ptr() && t.sizes() == shape && t.strides() == root.out.strides()))
      return false;
    fa.dtype[1 + k] = (uint8_t)dtype_code(t.scalar_type());
    expanded[k] = t.sizes() == shape ? t : t.expand(shape);
    ins[k] = operand(expanded[k]);
  }
  Program prog;
  try {
    prog = build_program(nin, nodes, nin + outv);
  } catch (const std::invalid_argument&) {
    return false;
  }
  const int32_t pid = rt.program_id(prog);
  if (pid < 0) return false;
  note_program_use(pid);
  fa.prog = (uint32_t)pid;
  fa.ninputs = nin;
  rt.record_fused((uint32_t)pid, fa, operand(root.out), ins, nin, root.out.numel());
  return true;
}

void emit_plain(Runtime& rt, const DeferredOp& o) {
  if (o.reduce) record_reduce_tensors(rt, o.op, o.in[0], o.out, o.keepdim);
  else record_ew_tensors(rt, o.op, o.nin, o.out, o.in, o.cv, o.s0, o.s1);
}

// Emit the tree rooted at r op by op (its producers first), materialising every intermediate.
void emit_unfused(Runtime& rt, std::vector<DeferredOp>& ops, const std::vector<std::array<int, 3>>& child, int r) {
  for (uint32_t k = 0; k < ops[r].nin; ++k)
    if (child[r][k] >= 0) emit_unfused(rt, ops, child, child[r][k]);
  emit_plain(rt, ops[r]);
}

// The order in which lower_deferred emits its units (a plain op, or a fused root with its subtree; fused-away
// ops are not units): by dependency level, recording order within a level. A unit's level is 1 + the highest
// level of an earlier unit it must follow (it reads memory that unit writes, or writes memory it reads or
// writes), judged per storage by the union byte range and the highest level of the reads and of the writes
// so far: conservative, so every conflicting pair keeps its recording order. The runtime starts a new batch
// level where a sub-op conflicts with the open level, so emitting level by level lets independent chains share
// levels: recorded in order, W2 without fusion (1,000 interleaved 5-op chains) was 5,000 one-sub-op levels.
std::vector<int> emission_order(const std::vector<DeferredOp>& ops, const std::vector<std::array<int, 3>>& child,
                                const std::vector<char>& fused_away) {
  struct Span {
    uint64_t rlo = ~0ull, rhi = 0, wlo = ~0ull, whi = 0;
    int rlev = 0, wlev = 0;
  };
  const int n = (int)ops.size();
  std::unordered_map<uintptr_t, Span> spans;
  spans.reserve(64);
  std::vector<int> order, level(n, 0), stack;
  std::vector<Operand> reads;
  order.reserve(n);
  bool sorted = true;
  int last = 0;
  const auto overlaps = [](uint64_t lo, uint64_t hi, uint64_t a, uint64_t b) { return lo < b && a < hi; };
  for (int j = 0; j < n; ++j) {
    if (fused_away[j]) continue;
    reads.clear();
    stack.assign(1, j);
    while (!stack.empty()) {  // the unit's inputs: the leaves of its subtree
      const int x = stack.back();
      stack.pop_back();
      for (uint32_t k = 0; k < ops[x].nin; ++k) {
        if (child[x][k] >= 0) stack.push_back(child[x][k]);
        else if (ops[x].in[k].defined()) reads.push_back(operand(ops[x].in[k]));
      }
    }
    const Operand w = operand(ops[j].out);
    int lev = 1;
    for (const Operand& r : reads) {
      auto it = spans.find(r.storage);
      if (it != spans.end() && overlaps(r.lo, r.hi, it->second.wlo, it->second.whi))
        lev = std::max(lev, it->second.wlev + 1);
    }
    auto wi = spans.find(w.storage);
    if (wi != spans.end()) {
      if (overlaps(w.lo, w.hi, wi->second.wlo, wi->second.whi)) lev = std::max(lev, wi->second.wlev + 1);
      if (overlaps(w.lo, w.hi, wi->second.rlo, wi->second.rhi)) lev = std::max(lev, wi->second.rlev + 1);
    }
    for (const Operand& r : reads) {
      Span& sp = spans[r.storage];
      sp.rlo = std::min(sp.rlo, r.lo);
      sp.rhi = std::max(sp.rhi, r.hi);
      sp.rlev = std::max(sp.rlev, lev);
    }
    Span& sw = spans[w.storage];
    sw.wlo = std::min(sw.wlo, w.lo);
    sw.whi = std::max(sw.whi, w.hi);
    sw.wlev = std::max(sw.wlev, lev);
    level[j] = lev;
    sorted &= lev >= last;
    last = lev;
    order.push_back(j);
  }
  if (!sorted) std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return level[a] < level[b]; });
  return order;
}

void lower_deferred(int dev, Runtime& rt) {
  auto& ops = g_def[dev].ops;
  if (ops.empty()) return;
  // Publications during lowering (ring full, early) go on the stream these ops were recorded under.
  rt.set_record_stream(true, g_def[dev].stream);
  struct Reset { Runtime& rt; ~Reset() { rt.set_record_stream(false); } } reset{rt};
  using clk = std::chrono::steady_clock;
  const auto ns_since = [](clk::time_point t) { return (uint64_t)std::chrono::nanoseconds(clk::now() - t).count(); };
  auto t0 = clk::now();
  const int n = (int)ops.size();
  std::vector<std::array<int, 3>> child(n, {-1, -1, -1});
  std::vector<char> fused_away(n, 0);
  if (g_fusion && n > 1) {
    // Readers of each op's output (by TensorImpl, the producer being the latest writer before the reader).
    std::unordered_map<const c10::TensorImpl*, int> producer;
    producer.reserve((size_t)n * 2);
    std::vector<int> readers(n, 0);
    std::vector<std::array<int, 3>> prod_of(n, {-1, -1, -1});
    for (int j = 0; j < n; ++j) {
      const DeferredOp& o = ops[j];
      for (uint32_t k = 0; k < o.nin; ++k) {
        if (!o.in[k].defined()) continue;
        auto it = producer.find(impl_of(o.in[k]));
        if (it != producer.end()) {
          readers[it->second]++;
          prod_of[j][k] = it->second;
        }
      }
      producer[impl_of(o.out)] = j;
    }
    // Instruction budget, first op of each subtree, and how many ops before each position write memory they
    // did not allocate (in-place / out= ops): only those can be a write hazard for a subtree.
    std::vector<int> size(n, 1), first(n), not_fresh(n + 1, 0);
    for (int m = 0; m < n; ++m) not_fresh[m + 1] = not_fresh[m] + (ops[m].fresh ? 0 : 1);
    std::vector<int> stack;
    for (int j = 0; j < n; ++j) {
      DeferredOp& o = ops[j];
      first[j] = j;
      if (o.reduce) continue;
      for (uint32_t k = 0; k < o.nin; ++k) {
        const int i = prod_of[j][k];
        if (i < 0) continue;
        const DeferredOp& p = ops[i];
        // Switched built-ins run their slot-1 code, which the interpreter does not have: never fused.
        bool ok = !p.reduce && p.fresh && !fused_away[i] && readers[i] == 1 && j - i <= 64 &&
                  !op_switched(p.op) && !op_switched(o.op) &&
                  o.in[k].sizes() == o.out.sizes() && dead_to_python(p.out, 2) &&
                  p.out.storage().use_count() == 1 && size[i] + size[j] <= (int)kProgMaxInstr / 2;
        // Nothing between the subtree's first op and j may write memory the subtree reads (it is evaluated
        // at j's position): checked against the subtree's leaves when such a writer exists.
        for (int m = first[i] + 1; ok && m < j && not_fresh[j] > not_fresh[first[i] + 1]; ++m) {
          if (ops[m].fresh) continue;
          const void* w = storage_of(ops[m].out);
          stack.assign(1, i);
          while (ok && !stack.empty()) {
            const int x = stack.back();
            stack.pop_back();
            for (uint32_t q = 0; q < ops[x].nin; ++q) {
              if (child[x][q] >= 0) stack.push_back(child[x][q]);
              else if (ops[x].in[q].defined()) ok &= storage_of(ops[x].in[q]) != w;
            }
          }
        }
        if (!ok) continue;
        child[j][k] = i;
        fused_away[i] = 1;
        size[j] += size[i];
        first[j] = std::min(first[j], first[i]);
      }
    }
  }
  const std::vector<int> order = emission_order(ops, child, fused_away);
  g_sched.analyse_ns += ns_since(t0);
  t0 = clk::now();
  std::vector<char> elided(n, 0);  // fused away into an emitted interpreter sub-op: never written
  for (const int j : order) {
    const bool has_child = child[j][0] >= 0 || child[j][1] >= 0 || child[j][2] >= 0;
    if (!has_child) {
      emit_plain(rt, ops[j]);
      continue;
    }
    if (emit_fused(rt, ops, child, j)) {
      int members = 0;
      std::function<void(int)> count = [&](int i) {
        ++members;
        elided[i] = i != j;
        for (int c : child[i]) if (c >= 0) count(c);
      };
      count(j);
      g_sched.fused_groups++;
      g_sched.fused_ops += members;
    } else {
      emit_unfused(rt, ops, child, j);
    }
  }
  g_sched.emit_ns += ns_since(t0);
  t0 = clk::now();
  // Keep every tensor alive until publication (the publish hook moves them to the release list): moved, as
  // the ops are cleared below (no reference-count traffic).
  for (int j = 0; j < n; ++j) {
    DeferredOp& o = ops[j];
    if (elided[j] && o.fresh) pool_put(dev, g_def[dev].stream, o.out.storage());
    keep_tensor(dev, std::move(o.out));
    for (auto& t : o.in) if (t.defined()) keep_tensor(dev, std::move(t));
  }
  g_sched.flushed_ops += ops.size();
  ops.clear();
  g_def[dev].storages.clear();
  g_sched.keep_ns += ns_since(t0);
}

// Lower and publish the device's deferred ops on the stream they were recorded under (mu held).
void sched_publish(int dev, Runtime& rt, const char* cause) {
  Deferred& D = g_def[dev];
  if (D.ops.empty()) return;
  CUstream s = D.stream;
  lower_deferred(dev, rt);
  const auto t0 = std::chrono::steady_clock::now();
  rt.flush(s);
  g_sched.publish_ns += (uint64_t)std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count();
  g_sched.flushes++;
  g_sched.by_cause[cause]++;
}

// A new deferred op on `dev`, recorded under stream `s` (mu held): work deferred under another stream is
// published first (batches are per stream). The caller fills it in, then calls deferred().
DeferredOp& defer(int dev, Runtime& rt, CUstream s) {
  Deferred& D = g_def[dev];
  if (!D.ops.empty() && D.stream != s) sched_publish(dev, rt, "stream_change");
  if (D.ops.empty()) {
    D.stream = s;
    D.oldest = std::chrono::steady_clock::now();
  }
  D.ops.emplace_back();
  return D.ops.back();
}

// Count the op; publish when the deferred ops could fill the ring (ops up to size_threshold use up to 8 tiles).
void deferred(int dev, Runtime& rt) {
  g_sched.intercepted++;
  if (g_def[dev].ops.size() * 8 >= rt.config().capacity) sched_publish(dev, rt, "size");
}

PyObject* reason(int r) { return PyLong_FromLong(r); }

// A new contiguous CUDA tensor on `like`'s device from the allocator that made `like`'s storage (PyTorch's
// CUDA caching allocator, or whichever allocator or pool the program gave it): at::empty's CUDA kernel without
// the dispatcher, or a recycled storage (OutPool). Storages without an allocator (from_blob, DLPack) fall back
// to at::empty.
at::Tensor empty_like_device(const at::Tensor& like, at::IntArrayRef shape, at::ScalarType dt) {
  c10::Allocator* alloc = like.storage().allocator();
  if (!alloc) return at::empty(shape, like.options().dtype(dt));
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int dev = like.get_device();
  c10::Storage st;
  if (numel > 0 && pool_take(dev, current_stream(dev), alloc, (size_t)numel * c10::elementSize(dt), st)) {
    g_recycled++;
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(st), c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                                            c10::scalarTypeToTypeMeta(dt));
    t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
    return t;
  }
  static const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  c10::OptionalDeviceGuard guard;
  if (impl->getDevice() != like.device()) guard.reset_device(like.device());
  return at::detail::empty_generic(shape, alloc, c10::DispatchKeySet(c10::DispatchKey::CUDA), dt, std::nullopt);
}

// Record elementwise op `op` over inputs ins[0..arity) (tensors or numbers) as a deferred op: `mode` says where the
// result goes (a new tensor, ins[0], or pout). Returns the output tensor, an int reason to run eagerly, or null
// with a Python error set.
PyObject* sched_ew_record(uint32_t op, int mode, PyObject* const* ins, PyObject* pout, float s0, float s1,
                          int64_t thr) {
  try {
    const uint32_t nin = kOps[op].arity;
    const bool grad = at::GradMode::is_enabled();
    calibrate_liveness();
    const at::Tensor* ts[3] = {nullptr, nullptr, nullptr};
    float cv[3] = {0.f, 0.f, 0.f};
    int first = -1;
    bool same_shape = true, any_dim = false;
    for (uint32_t k = 0; k < nin; ++k) {
      PyObject* o = ins[k];
      if (THPVariable_Check(o)) {
        const at::Tensor& t = THPVariable_Unpack(o);
        if (!t.is_cuda()) return reason(kRNotCuda);
        if (t.layout() != at::kStrided) return reason(kRLayout);
        if (dtype_code(t.scalar_type()) < 0) return reason(kRDtype);
        if (t.numel() > thr) return reason(kRSize);
        if (grad && t.requires_grad()) return reason(kRAutograd);
        if (first < 0) first = (int)k;
        else same_shape &= t.sizes() == ts[first]->sizes();
        any_dim |= t.dim() > 0;
        ts[k] = &t;
      } else if (is_number(o)) {
        cv[k] = (float)PyFloat_AsDouble(o);
      } else {
        return reason(kRArgs);
      }
    }
    if (first < 0) return reason(kRArgs);
    const at::Tensor& t0 = *ts[first];
    at::ScalarType dt = t0.scalar_type();
    bool have = false;
    for (uint32_t k = 0; k < nin; ++k) {
      if (!ts[k]) continue;
      if (ts[k]->get_device() != t0.get_device()) return reason(kRDevice);
      if (any_dim && ts[k]->dim() == 0) continue;  // 0-d tensors promote only without dimensioned ones
      dt = have ? c10::promoteTypes(dt, ts[k]->scalar_type()) : ts[k]->scalar_type();
      have = true;
    }
    std::vector<int64_t> shape_v;
    at::IntArrayRef shape = t0.sizes();
    if (!same_shape) {
      shape_v = t0.sizes().vec();
      try {
        for (uint32_t k = 0; k < nin; ++k)
          if (ts[k]) shape_v = at::infer_size(shape_v, ts[k]->sizes());
      } catch (const c10::Error&) {
        return reason(kRArgs);
      }
      shape = shape_v;
    }
    at::Tensor out;
    PyObject* ret = nullptr;
    if (mode == kModeFunctional) {
      int64_t numel = 1;
      for (int64_t s : shape) numel *= s;
      if (numel > thr) return reason(kRSize);
      out = empty_like_device(t0, shape, dt);
    } else {
      PyObject* o = mode == kModeInplace ? ins[0] : pout;
      if (!o || !THPVariable_Check(o)) return reason(kRArgs);
      const at::Tensor& ot = THPVariable_Unpack(o);
      if (!ot.is_cuda() || ot.get_device() != t0.get_device()) return reason(kRDevice);
      if (ot.scalar_type() != dt || ot.sizes() != shape) return reason(kRArgs);
      if (!ot.is_contiguous() && has_internal_overlap(ot)) return reason(kRArgs);
      for (uint32_t k = 0; k < nin; ++k)
        if (ts[k] && partially_overlaps(ot, *ts[k])) return reason(kRArgs);
      out = ot;
      ret = o;
    }
    const int dev = out.get_device();
    Runtime& rt = runtime_for(dev);
    CUstream s = current_stream(dev);
    {
      RtLock lk(rt);
      Deferred& D = g_def[dev];
      DeferredOp& d = defer(dev, rt, s);
      d.op = op;
      d.nin = nin;
      d.fresh = mode == kModeFunctional;
      d.s0 = s0;
      d.s1 = s1;
      d.out = out;
      D.storages.insert(storage_of(out));
      for (uint32_t k = 0; k < nin; ++k) {
        if (ts[k]) {
          d.in[k] = *ts[k];
          D.storages.insert(storage_of(*ts[k]));
        }
        d.cv[k] = cv[k];
      }
      deferred(dev, rt);
    }
    if (ret) {
      Py_INCREF(ret);
      return ret;
    }
    return THPVariable_Wrap(std::move(out));
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// sched_ew(op, mode, inputs: tuple, out: Tensor | None, s0, s1, size_threshold) -> Tensor | int (reason)
PyObject* sched_ew(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "sched_ew takes 7 arguments");
    return nullptr;
  }
  const uint32_t op = (uint32_t)PyLong_AsUnsignedLong(args[0]);
  const int mode = (int)PyLong_AsLong(args[1]);
  PyObject* tup = args[2];
  const float s0 = (float)PyFloat_AsDouble(args[4]), s1 = (float)PyFloat_AsDouble(args[5]);
  const int64_t thr = PyLong_AsLongLong(args[6]);
  if (PyErr_Occurred()) return nullptr;
  if (op >= kNumOpsHost || kOps[op].kind != 0 || !PyTuple_Check(tup) ||
      (uint32_t)PyTuple_GET_SIZE(tup) != kOps[op].arity)
    return reason(kRArgs);
  return sched_ew_record(op, mode, &PyTuple_GET_ITEM(tup, 0), args[3] == Py_None ? nullptr : args[3], s0, s1, thr);
}

// sched_reduce(op, x, keepdim, size_threshold) -> Tensor | int (reason); last dim only (the handler checks dim).
PyObject* sched_reduce(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 4) throw py::type_error("sched_reduce takes 4 arguments");
    const uint32_t op = (uint32_t)PyLong_AsUnsignedLong(args[0]);
    PyObject* px = args[1];
    const bool keepdim = PyObject_IsTrue(args[2]) == 1;
    const int64_t thr = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return nullptr;
    if (op >= kNumOpsHost || kOps[op].kind != 1 || !THPVariable_Check(px)) return reason(kRArgs);
    const at::Tensor& x = THPVariable_Unpack(px);
    if (!x.is_cuda()) return reason(kRNotCuda);
    if (x.layout() != at::kStrided) return reason(kRLayout);
    if (dtype_code(x.scalar_type()) < 0) return reason(kRDtype);
    if (x.numel() > thr) return reason(kRSize);
    if (at::GradMode::is_enabled() && x.requires_grad()) return reason(kRAutograd);
    if (x.dim() < 1 || x.dim() > (int64_t)kMaxDims) return reason(kRArgs);
    const std::string name = kOps[op].name;
    const bool row_out = name == "softmax" || name == "log_softmax";
    if ((name == "amax" || name == "amin") && x.size(-1) == 0) return reason(kRArgs);
    at::Tensor out;
    if (row_out) {
      out = empty_like_device(x, x.sizes(), x.scalar_type());
    } else {
      std::vector<int64_t> shape = x.sizes().vec();
      shape.pop_back();
      if (keepdim) shape.push_back(1);
      out = empty_like_device(x, shape, x.scalar_type());
    }
    const int dev = x.get_device();
    Runtime& rt = runtime_for(dev);
    CUstream s = current_stream(dev);
    {
      RtLock lk(rt);
      Deferred& D = g_def[dev];
      DeferredOp& d = defer(dev, rt, s);
      d.op = op;
      d.nin = 1;
      d.reduce = true;
      d.keepdim = keepdim;
      d.fresh = true;
      d.out = out;
      d.in[0] = x;
      D.storages.insert(storage_of(out));
      D.storages.insert(storage_of(x));
      deferred(dev, rt);
    }
    return THPVariable_Wrap(std::move(out));
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// ------------------------------------------------------------------ the scheduler's __torch_dispatch__
// gpuos.GpuosScheduler sets its instance's __torch_dispatch__ to this function bound to the mode
// (types.MethodType), so torch calls C++ directly for every op under the mode: no Python frame on the hot path.
// Overloads with a fast spec (elementwise ops whose scalars are none, `alpha`, or `rounding_mode=None`) are
// recorded here; every other overload goes to the mode's Python path (_dispatch_py: reductions, ops with other
// scalars, user ops), and every op that must run eagerly to the mode's _eager(func, args, kwargs, reason).
// One recordable call: sched_dispatch's table is keyed by OpOverload, the front's by torch function / Tensor
// method; Python gives both as {key: (op_id, mode, nin, d0, d1, scalars, number_ok)}.
struct OpSpec {
  uint32_t op = 0, nin = 0;
  int mode = kModeFunctional;
  float d0 = 0.f, d1 = 0.f;
  int scalars = 0;         // 0 none, 1 alpha (kwarg, or 3rd positional at the aten level) -> s0, 2 rounding_mode None
  bool number_ok = false;  // front: a Python number may stand for the 2nd operand (the op has a .Scalar overload)
};
using SpecTable = std::unordered_map<PyObject*, OpSpec>;  // keys: strong references
SpecTable g_fast;                                        // sched_dispatch: OpOverload -> spec

// Replace `dst` with `table` (checked first: a bad spec changes nothing).
void set_spec_table(SpecTable& dst, py::dict table, const char* who) {
  SpecTable t;
  for (auto item : table) {
    auto v = item.second.cast<py::tuple>();
    OpSpec f;
    f.op = v[0].cast<uint32_t>();
    f.mode = v[1].cast<int>();
    f.nin = v[2].cast<uint32_t>();
    f.d0 = v[3].cast<float>();
    f.d1 = v[4].cast<float>();
    f.scalars = v[5].cast<int>();
    f.number_ok = v[6].cast<bool>();
    if (f.op >= kNumOpsHost || kOps[f.op].kind != 0 || f.nin != kOps[f.op].arity || f.mode < 0 || f.mode > 2 ||
        f.scalars < 0 || f.scalars > 2)
      throw py::value_error(std::string(who) + ": bad spec for " + py::str(item.first).cast<std::string>());
    t[item.first.ptr()] = f;
  }
  for (auto& kv : t) Py_INCREF(kv.first);
  for (auto& kv : dst) Py_DECREF(kv.first);
  dst.swap(t);
}

std::vector<std::string> spec_table_names(const SpecTable& t) {  // str() of every key, sorted
  std::vector<std::string> v;
  for (auto& kv : t) v.push_back(py::str(kv.first).cast<std::string>());
  std::sort(v.begin(), v.end());
  return v;
}

PyObject* interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) throw py::error_already_set();
  return o;  // kept for the process's life
}

PyObject* call_mode(PyObject* mode, PyObject* name, PyObject* const* a, size_t n) {
  PyObject* argv[6] = {mode};
  for (size_t i = 0; i < n; ++i) argv[1 + i] = a[i];
  return PyObject_VectorcallMethod(name, argv, (1 + n) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}

// The names sched_dispatch / sched_function look up (interned once).
struct SchedNames {
  PyObject* dispatch_py = interned("_dispatch_py");
  PyObject* eager = interned("_eager");
  PyObject* thr = interned("size_threshold");
  PyObject* alpha = interned("alpha");
  PyObject* rmode = interned("rounding_mode");
  PyObject* out = interned("out");
};
const SchedNames& names() {
  static const SchedNames* n = new SchedNames;
  return *n;
}

// A __torch_dispatch__ / __torch_function__ call: (self, func, types, args=(), kwargs=None).
bool check_mode_call(Py_ssize_t n, const char* what) {
  if (n >= 3 && n <= 5) return true;
  PyErr_Format(PyExc_TypeError, "%s(func, types, args=(), kwargs=None)", what);
  return false;
}

// The scheduler's size_threshold (false with a Python error set).
bool read_threshold(PyObject* sched, int64_t& thr) {
  PyObject* t = PyObject_GetAttr(sched, names().thr);
  if (!t) return false;
  thr = PyLong_AsLongLong(t);
  Py_DECREF(t);
  return !(thr == -1 && PyErr_Occurred());
}

// sched_dispatch(mode, func, types, args=(), kwargs=None)
PyObject* sched_dispatch(PyObject*, PyObject* const* a, Py_ssize_t n) {
  const SchedNames& nm = names();
  PyObject *s_py = nm.dispatch_py, *s_eager = nm.eager, *s_alpha = nm.alpha, *s_rmode = nm.rmode, *s_out = nm.out;
  if (!check_mode_call(n, "__torch_dispatch__")) return nullptr;
  PyObject* mode = a[0];
  PyObject* func = a[1];
  PyObject* args = n > 3 ? a[3] : nullptr;
  PyObject* kwargs = n > 4 && a[4] != Py_None ? a[4] : nullptr;
  auto it = g_fast.find(func);
  if (it == g_fast.end() || !args || !PyTuple_Check(args) || (kwargs && !PyDict_Check(kwargs)))
    return call_mode(mode, s_py, a + 1, (size_t)n - 1);
  const OpSpec& f = it->second;
  const Py_ssize_t na = PyTuple_GET_SIZE(args);
  PyObject* why = nullptr;  // new reference: the reason to run eagerly
  if (na < (Py_ssize_t)f.nin) why = reason(kRArgs);
  float s0 = f.d0;
  PyObject* pout = nullptr;
  if (!why && f.scalars == 1) {
    PyObject* al = kwargs ? PyDict_GetItemWithError(kwargs, s_alpha) : nullptr;
    if (!al && PyErr_Occurred()) return nullptr;
    if (!al && na > 2) al = PyTuple_GET_ITEM(args, 2);
    if (al) {
      const double v = is_number(al) ? PyFloat_AsDouble(al) : 0.0;
      if (v == -1.0 && PyErr_Occurred()) return nullptr;  // an int beyond a double's range
      if (!is_number(al)) why = reason(kRArgs);
      else s0 = (float)v;
    }
  } else if (!why && f.scalars == 2 && kwargs) {
    PyObject* rm = PyDict_GetItemWithError(kwargs, s_rmode);
    if (!rm && PyErr_Occurred()) return nullptr;
    if (rm && rm != Py_None) why = reason(kRArgs);
  }
  if (!why && f.mode == kModeOut && kwargs) {
    pout = PyDict_GetItemWithError(kwargs, s_out);
    if (!pout && PyErr_Occurred()) return nullptr;
  }
  if (!why) {
    int64_t thr = 0;
    if (!read_threshold(mode, thr)) return nullptr;
    PyObject* r = sched_ew_record(f.op, f.mode, &PyTuple_GET_ITEM(args, 0), pout, s0, f.d1, thr);
    if (!r) {
      // Outside what GPUOS takes (as the Python handlers do): run it eagerly, the error's type as the reason.
      if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError)) return nullptr;
      PyObject *et, *ev, *tb;
      PyErr_Fetch(&et, &ev, &tb);
      why = PyUnicode_FromFormat("rejected:%s", ((PyTypeObject*)et)->tp_name);
      Py_XDECREF(et);
      Py_XDECREF(ev);
      Py_XDECREF(tb);
      if (!why) return nullptr;
    } else if (!PyLong_CheckExact(r)) {
      return r;  // recorded: the output tensor
    } else {
      why = r;
    }
  }
  PyObject* empty = nullptr;
  if (!kwargs) {
    empty = PyDict_New();
    if (!empty) {
      Py_DECREF(why);
      return nullptr;
    }
  }
  PyObject* ea[4] = {func, args, kwargs ? kwargs : empty, why};
  PyObject* r = call_mode(mode, s_eager, ea, 4);
  Py_XDECREF(empty);
  Py_DECREF(why);
  return r;
}

// ------------------------------------------------------------------ the scheduler's __torch_function__ front
// Entering a TorchDispatchMode costs PyTorch ~3-6 us per op on an H100 host (boxing into IValues, the mode
// stack, the Python call, unboxing), above the whole record path. The scheduler therefore also pushes a
// TorchFunctionMode whose __torch_function__ is this function: the plain functional elementwise calls
// (a + b, x * 2, torch.sigmoid(x), x.relu(), torch.add(a, b, alpha=2), ...) are recorded here, before any
// dispatch. Whatever it does not take -- and every call while anything could see the op differently: another
// torch-function mode, a dispatch mode other than a GpuosScheduler on top, an infra mode (fake, proxy,
// functional), autocast, a tensor subclass or a tensor with extra dispatch keys (conj, neg, batched, ...) --
// goes on unchanged (func(*args, **kwargs)) to the dispatcher and the GpuosScheduler below.
SpecTable g_front;                 // sched_function: torch function / Tensor method -> spec (mode functional)
PyObject* g_sched_type = nullptr;  // gpuos.scheduler.GpuosScheduler

void sched_set_front(py::dict table, py::object sched_type) {
  if (!PyType_Check(sched_type.ptr())) throw py::type_error("sched_set_front: sched_type must be a class");
  set_spec_table(g_front, table, "sched_set_front");
  Py_INCREF(sched_type.ptr());
  Py_XDECREF(g_sched_type);
  g_sched_type = sched_type.ptr();
}

// The innermost dispatch mode if it is a GpuosScheduler and nothing else could see the op first; else null.
PyObject* front_scheduler() {
  using c10::impl::TorchDispatchModeTLS;
  if (!g_sched_type || at::impl::PythonTorchFunctionTLS::stack_len() != 0) return nullptr;  // (ours is popped)
  const int64_t n = TorchDispatchModeTLS::stack_len();
  if (n < 1) return nullptr;
  for (auto k : {c10::impl::TorchDispatchModeKey::FAKE, c10::impl::TorchDispatchModeKey::PROXY,
                 c10::impl::TorchDispatchModeKey::FUNCTIONAL})
    if (TorchDispatchModeTLS::get_mode(k).has_value()) return nullptr;
  PyObject* top = TorchDispatchModeTLS::get_stack_at(n - 1)->ptr(getPyInterpreter());
  if (!top || !PyObject_TypeCheck(top, (PyTypeObject*)g_sched_type)) return nullptr;
  if (at::autocast::is_autocast_enabled(at::kCUDA)) return nullptr;
  return top;
}

bool plain_cuda_tensor(PyObject* o) {
  static const c10::DispatchKeySet allowed({c10::DispatchKey::CUDA, c10::DispatchKey::AutogradCUDA,
                                            c10::DispatchKey::ADInplaceOrView, c10::DispatchKey::AutocastCUDA});
  if (!THPVariable_CheckExact(o)) return false;
  // (operator- of DispatchKeySet keeps backend bits: a subset test is an intersection that changes nothing)
  const c10::DispatchKeySet ks = THPVariable_Unpack(o).unsafeGetTensorImpl()->key_set();
  return ks.has(c10::DispatchKey::CUDA) && (ks & allowed) == ks;
}

// sched_function(front, func, types, args=(), kwargs=None)
PyObject* sched_function(PyObject*, PyObject* const* a, Py_ssize_t n) {
  PyObject *s_alpha = names().alpha, *s_rmode = names().rmode;
  if (!check_mode_call(n, "__torch_function__")) return nullptr;
  PyObject* func = a[1];
  PyObject* args = n > 3 ? a[3] : nullptr;
  PyObject* kwargs = n > 4 && a[4] != Py_None ? a[4] : nullptr;
  auto it = g_front.find(func);
  PyObject* sched = nullptr;
  if (it != g_front.end() && args && PyTuple_Check(args) && PyTuple_GET_SIZE(args) == (Py_ssize_t)it->second.nin &&
      (!kwargs || PyDict_Check(kwargs)) && (sched = front_scheduler()) != nullptr) {
    const OpSpec& f = it->second;
    // The first operand a plain CUDA tensor (self / input), the second a tensor or, where the op has a Scalar
    // overload, a Python number: other calls are PyTorch's to accept or refuse.
    bool ok = true;
    float s0 = f.d0;
    for (uint32_t k = 0; ok && k < f.nin; ++k) {
      PyObject* o = PyTuple_GET_ITEM(args, k);
      ok = THPVariable_Check(o) ? plain_cuda_tensor(o) : (k == 1 && f.number_ok && is_number(o));
    }
    if (ok && kwargs && PyDict_GET_SIZE(kwargs) > 0) {  // only the op's own scalar may be given
      PyObject* v = nullptr;
      if (PyDict_GET_SIZE(kwargs) != 1) ok = false;
      else if (f.scalars == 1) ok = (v = PyDict_GetItemWithError(kwargs, s_alpha)) != nullptr && is_number(v);
      else if (f.scalars == 2) ok = (v = PyDict_GetItemWithError(kwargs, s_rmode)) != nullptr && v == Py_None;
      else ok = false;
      if (PyErr_Occurred()) return nullptr;
      if (ok && f.scalars == 1) {
        const double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) PyErr_Clear(), ok = false;  // PyTorch reports it (pass the call on)
        else s0 = (float)d;
      }
    }
    if (ok) {
      int64_t thr = 0;
      if (!read_threshold(sched, thr)) return nullptr;
      PyObject* r;
      {
        // The dispatch modes are still pushed at this level: without this the output's at::empty went through
        // the scheduler's own __torch_dispatch__ (Python) and cost ~9 us per op on an H100 host.
        c10::impl::ExcludeDispatchKeyGuard no_modes(
            c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
        r = sched_ew_record(f.op, kModeFunctional, &PyTuple_GET_ITEM(args, 0), nullptr, s0, f.d1, thr);
      }
      if (r && !PyLong_CheckExact(r)) {  // recorded
        g_sched.front_ops++;
        return r;
      }
      // A reason (or a Type/ValueError): the dispatch path below runs the same checks and counts the fallback.
      if (!r) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError)) return nullptr;
        PyErr_Clear();
      }
      Py_XDECREF(r);
    }
  }
  if (!args || !PyTuple_Check(args) || (kwargs && !PyDict_Check(kwargs))) {  // not what torch passes: as Python would
    PyObject* star = args ? PySequence_Tuple(args) : PyTuple_New(0);
    PyObject* kw = kwargs ? PyDict_New() : nullptr;
    if (!star || (kwargs && (!kw || PyDict_Merge(kw, kwargs, 1) < 0))) {
      Py_XDECREF(star);
      Py_XDECREF(kw);
      return nullptr;
    }
    PyObject* r = PyObject_Call(func, star, kw);
    Py_DECREF(star);
    Py_XDECREF(kw);
    return r;
  }
  return PyObject_Call(func, args, kwargs);
}

// Publish every device's deferred ops (cause counted). Returns the raw streams published on.
py::list sched_flush(const std::string& cause) {
  py::list streams;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = g_rt[dev];
    if (!rt) continue;
    RtLock lk(*rt);
    if (g_def[dev].ops.empty()) {
      if (!rt->has_pending()) continue;
      // Ops the scheduler recorded directly (registered ops mapped to aten): publish on the current stream.
      const CUstream s = current_stream(dev);
      streams.append((uintptr_t)s);
      rt->flush(s);
      g_sched.flushes++;
      g_sched.by_cause[cause]++;
      continue;
    }
    streams.append((uintptr_t)g_def[dev].stream);
    sched_publish(dev, *rt, cause.c_str());
  }
  return streams;
}

// Before an eager op: publish the deferred ops of a device only if the op's tensors share storage with them
// (it reads their results, or writes what they read or write) or explicit-API work is pending there.
// Independent eager ops run ahead; the deferred batch keeps accumulating (stream order still holds: it is
// published later on the same stream). Returns the streams published on.
void collect_storages(PyObject* o, std::vector<std::pair<int, const void*>>& out, int depth = 0) {
  if (THPVariable_Check(o)) {
    const at::Tensor& t = THPVariable_Unpack(o);
    if (t.defined() && t.is_cuda() && t.has_storage()) out.emplace_back(t.get_device(), storage_of(t));
    else if (t.defined() && t.is_cuda()) out.emplace_back(t.get_device(), nullptr);  // no storage: be safe
    return;
  }
  if (depth > 2) return;
  if (PyList_Check(o) || PyTuple_Check(o)) {
    PyObject* f = PySequence_Fast(o, "");
    if (!f) { PyErr_Clear(); return; }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
    for (Py_ssize_t i = 0; i < n; ++i) collect_storages(PySequence_Fast_GET_ITEM(f, i), out, depth + 1);
    Py_DECREF(f);
  } else if (PyDict_Check(o)) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(o, &pos, &k, &v)) collect_storages(v, out, depth + 1);
  }
}

py::list sched_flush_for(py::handle args, py::handle kwargs, const std::string& cause) {
  std::vector<std::pair<int, const void*>> used;
  collect_storages(args.ptr(), used);
  if (!kwargs.is_none()) collect_storages(kwargs.ptr(), used);
  py::list streams;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = g_rt[dev];
    if (!rt) continue;
    RtLock lk(*rt);
    Deferred& D = g_def[dev];
    if (D.ops.empty() && !rt->has_pending()) continue;
    if (D.ops.empty()) {  // only directly recorded work: publish it on the current stream (conservative)
      const CUstream s = current_stream(dev);
      streams.append((uintptr_t)s);
      rt->flush(s);
      g_sched.flushes++;
      g_sched.by_cause[cause]++;
      continue;
    }
    bool touch = rt->has_pending();
    for (auto& u : used) touch |= u.first == dev && (u.second == nullptr || D.storages.count(u.second));
    if (!touch) {
      g_sched.independent_eager++;
      continue;
    }
    streams.append((uintptr_t)D.stream);
    sched_publish(dev, *rt, cause.c_str());
  }
  return streams;
}

// Timer: publish deferred ops older than age_s. Returns how many devices were flushed.
int sched_flush_due(double age_s) {
  int n = 0;
  const auto now = std::chrono::steady_clock::now();
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = g_rt[dev];
    if (!rt) continue;
    RtLock lk(*rt);
    Deferred& D = g_def[dev];
    if (D.ops.empty() || std::chrono::duration<double>(now - D.oldest).count() < age_s) continue;
    sched_publish(dev, *rt, "timer");
    ++n;
  }
  return n;
}

py::dict sched_stats() {
  py::dict d;
  d["ops_intercepted"] = g_sched.intercepted;
  d["flushed_ops"] = g_sched.flushed_ops;
  d["sched_flushes"] = g_sched.flushes;
  d["fused_groups"] = g_sched.fused_groups;
  d["fused_ops"] = g_sched.fused_ops;
  d["independent_eager"] = g_sched.independent_eager;
  d["front_ops"] = g_sched.front_ops;
  d["recycled_outputs"] = g_recycled;
  py::dict h;  // host time spent publishing deferred ops, in microseconds
  h["analyse_us"] = g_sched.analyse_ns / 1e3;
  h["emit_us"] = g_sched.emit_ns / 1e3;
  h["keep_us"] = g_sched.keep_ns / 1e3;
  h["publish_us"] = g_sched.publish_ns / 1e3;
  d["flush_host_us"] = h;
  d["specializations_requested"] = specializations_requested();
  py::dict c;
  for (auto& kv : g_sched.by_cause) c[py::str(kv.first)] = kv.second;
  d["flushes_by_cause"] = c;
  size_t pending = 0;
  for (auto& D : g_def) pending += D.ops.size();
  d["deferred"] = pending;
  return d;
}

// ---- CPU evaluation of the same functors (numerics tests without a GPU) ----
template <class F>
void cpu_ew(const std::vector<const at::Tensor*>& ins, const std::vector<float>& consts, at::Tensor& out, float s0, float s1) {
  const int64_t n = out.numel();
  const uint32_t dto = (uint32_t)dtype_code(out.scalar_type());
  void* op = out.data_ptr();
  for (int64_t i = 0; i < n; ++i) {
    float v[3] = {0.f, 0.f, 0.f};
    for (size_t k = 0; k < ins.size(); ++k)
      v[k] = ins[k] ? load_f32(ins[k]->data_ptr(), (uint32_t)dtype_code(ins[k]->scalar_type()), i) : consts[k];
    store_f32(op, dto, i, F::apply(v[0], v[1], v[2], s0, s1));
  }
}

void cpu_apply(const std::string& opname, py::sequence inputs, at::Tensor out, float s0, float s1) {
  const uint32_t op = op_id(opname, "gpuos_ext._cpu_apply", 0);
  const OpInfo& info = kOps[op];
  if ((uint32_t)inputs.size() != info.arity) throw py::value_error("_cpu_apply: wrong arity");
  if (out.is_cuda() || !out.is_contiguous() || dtype_code(out.scalar_type()) < 0)
    throw py::type_error("_cpu_apply: out must be a contiguous CPU float32/float16/bfloat16 tensor");
  std::vector<at::Tensor> hold;
  std::vector<const at::Tensor*> ins;
  std::vector<float> consts;
  hold.reserve(3);
  for (auto item : inputs) {
    if (is_number(item.ptr())) {
      ins.push_back(nullptr);
      consts.push_back(item.cast<float>());
      continue;
    }
    at::Tensor t = item.cast<at::Tensor>();
    if (t.is_cuda() || t.sizes() != out.sizes() || !t.is_contiguous() || dtype_code(t.scalar_type()) < 0)
      throw py::type_error("_cpu_apply: inputs must be contiguous CPU float tensors with out's shape");
    hold.push_back(t);
    ins.push_back(&hold.back());
    consts.push_back(0.f);
  }
  switch (op) {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  case id: if constexpr (kind == 0) cpu_ew<functor>(ins, consts, out, s0, s1); break;
#include "device_src/ops.def"
#undef GPUOS_OP
    default: break;
  }
}

template <class R>
void cpu_reduce_rows(uint32_t op, const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const uint32_t dt = (uint32_t)dtype_code(x.scalar_type());
  const void* xp = x.data_ptr();
  void* op_ = out.data_ptr();
  for (int64_t r = 0; r < rows; ++r) {
    float acc = R::init();
    for (int64_t j = 0; j < cols; ++j) acc = R::combine(acc, load_f32(xp, dt, r * cols + j));
    if (op == kOp_softmax || op == kOp_log_softmax) {
      float sum = 0.f;
      for (int64_t j = 0; j < cols; ++j) sum += m_exp(load_f32(xp, dt, r * cols + j) - acc);
      const float lse = m_log(sum);
      for (int64_t j = 0; j < cols; ++j) {
        const float v = load_f32(xp, dt, r * cols + j) - acc;
        store_f32(op_, dt, r * cols + j, op == kOp_softmax ? m_exp(v) / sum : v - lse);
      }
    } else {
      store_f32(op_, dt, r, op == kOp_mean ? acc / (float)cols : acc);
    }
  }
}

void cpu_reduce(const std::string& opname, at::Tensor x, at::Tensor out) {
  const uint32_t op = op_id(opname, "gpuos_ext._cpu_reduce", 1);
  if (x.is_cuda() || x.dim() != 2 || !x.is_contiguous() || !out.is_contiguous() || x.scalar_type() != out.scalar_type() ||
      dtype_code(x.scalar_type()) < 0)
    throw py::type_error("_cpu_reduce: x must be a contiguous 2-D CPU float tensor and out contiguous of x's dtype");
  switch (op) {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  case id: if constexpr (kind == 1) cpu_reduce_rows<functor>(op, x, out); break;
#include "device_src/ops.def"
#undef GPUOS_OP
    default: break;
  }
}

// Evaluate interpreter bytecode (device_src/interp.h, built by gpuos.fusion) on CPU tensors.
void cpu_run_program(py::bytes program, py::sequence inputs, at::Tensor out) {
  const std::string blob = program;
  if (blob.size() != sizeof(Program))
    throw py::value_error("_cpu_run_program: program must be " + std::to_string(sizeof(Program)) + " bytes, got " +
                          std::to_string(blob.size()));
  Program p;
  std::memcpy(&p, blob.data(), sizeof p);
  if (p.ninputs != (uint32_t)inputs.size() || p.ninputs > kProgMaxInputs || p.ninstr > kProgMaxInstr ||
      p.out_reg >= kProgMaxRegs)
    throw py::value_error("_cpu_run_program: malformed program or wrong number of inputs");
  for (uint32_t i = 0; i < p.ninstr; ++i) {
    const Instr& I = p.code[i];
    bool ok = I.dst < kProgMaxRegs && I.nsrc <= 3 && (I.op == kOpConst || I.op == kOpRoundF16 || I.op == kOpRoundBF16 || (I.op < kNumOpsHost && kOps[I.op].kind == 0));
    for (uint32_t k = 0; k < I.nsrc; ++k) ok &= I.src[k] < kProgMaxRegs;
    if (!ok) throw py::value_error("_cpu_run_program: malformed instruction " + std::to_string(i));
  }
  if (out.is_cuda() || !out.is_contiguous() || dtype_code(out.scalar_type()) < 0)
    throw py::type_error("_cpu_run_program: out must be a contiguous CPU float32/float16/bfloat16 tensor");
  std::vector<at::Tensor> ins;
  for (auto item : inputs) {
    at::Tensor t = item.cast<at::Tensor>();
    if (t.is_cuda() || t.sizes() != out.sizes() || !t.is_contiguous() || dtype_code(t.scalar_type()) < 0)
      throw py::type_error("_cpu_run_program: inputs must be contiguous CPU float tensors with out's shape");
    ins.push_back(t);
  }
  const int64_t n = out.numel();
  float v[kProgMaxInputs];
  for (int64_t e = 0; e < n; ++e) {
    for (size_t k = 0; k < ins.size(); ++k)
      v[k] = load_f32(ins[k].data_ptr(), (uint32_t)dtype_code(ins[k].scalar_type()), e);
    store_f32(out.data_ptr(), (uint32_t)dtype_code(out.scalar_type()), e, run_program(p, v));
  }
}

// ------------------------------------------------------------------ module-level API
void init(uint32_t capacity, uint32_t threads_per_block, uint32_t worker_blocks, double idle_us) {
  driver();  // a clear CudaError on machines without a driver / GPU
  Config cfg;
  cfg.capacity = capacity;
  cfg.threads_per_block = threads_per_block;
  cfg.worker_blocks = worker_blocks;
  cfg.idle_us = idle_us;
  if (const char* v = std::getenv("GPUOS_WORKER_BLOCKS"); v && *v && !worker_blocks) cfg.worker_blocks = std::atoi(v);
  if (const char* v = std::getenv("GPUOS_IDLE_US"); v && *v) cfg.idle_us = std::atof(v);
  if (const char* v = std::getenv("GPUOS_BURST_MIN"); v && *v) cfg.burst_min = (uint32_t)std::atoi(v);
  if (const char* v = std::getenv("GPUOS_BURST_BLOCKS"); v && *v) cfg.burst_blocks = (uint32_t)std::atoi(v);
  if (const char* v = std::getenv("GPUOS_PUBLISH_MIN"); v && *v) cfg.publish_min = (uint32_t)std::atoi(v);
  if (const char* v = std::getenv("GPUOS_TIMEOUT_S"); v && *v) cfg.timeout_s = std::atof(v);
  if (const char* v = std::getenv("GPUOS_TRACE"); v && *v) cfg.trace_records = (uint32_t)std::atoi(v);
  const int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices) throw py::value_error("gpuos.init: bad device index");
  if (g_rt[dev]) return;  // idempotent
  g_cfg = cfg;
  runtime_for(dev);
}

// stream: a raw cudaStream_t (torch.cuda.Stream.cuda_stream) to publish on; None = the current stream.
void flush(bool sync, py::object stream) {
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = g_rt[dev];
    if (!rt) continue;
    uint32_t seq;
    {
      CUstream s = nullptr;  // Python call: before taking mu
      // An explicit stream belongs to the current device; other devices publish on their own current stream.
      if (!g_def[dev].ops.empty()) {  // the scheduler's deferred ops go out on the stream they were recorded on
        RtLock lk(*rt);
        sched_publish(dev, *rt, "explicit");
      }
      if (rt->has_pending())
        s = stream.is_none() || dev != current_device() ? current_stream(dev)
                                                        : reinterpret_cast<CUstream>(stream.cast<uintptr_t>());
      RtLock lk(*rt);
      seq = s || rt->has_pending() ? rt->flush(s ? s : current_stream(dev)) : 0;
    }
    if (sync) {
      py::gil_scoped_release nogil;
      rt->wait_done(seq);
    }
  }
}

void shutdown() {
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = g_rt[dev];
    if (!rt) continue;
    CUstream s = current_stream(dev);
    {
      RtLock lk(*rt);
      sched_publish(dev, *rt, "exit");
      rt->shutdown(s);
    }
    release_keep(dev);
    pool_clear(dev);
    {
      std::lock_guard<std::mutex> life(g_rt_life);
      g_rt[dev] = nullptr;
    }
    delete rt;
  }
}

py::dict stats() {
  RuntimeStats s;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    if (!g_rt[dev]) continue;
    RuntimeStats r = g_rt[dev]->stats();
    s.submitted += r.submitted; s.subops += r.subops; s.batches += r.batches; s.flushes += r.flushes;
    s.worker_launches += r.worker_launches; s.handovers += r.handovers; s.idle_adoptions += r.idle_adoptions;
    s.burst_launches += r.burst_launches;
    s.early_publishes += r.early_publishes;
    s.full_queue_flushes += r.full_queue_flushes; s.room_waits += r.room_waits; s.levels_split += r.levels_split;
    s.dma_batches += r.dma_batches;
    s.fused_subops += r.fused_subops;
    s.programs += r.programs;
  }
  JitStats j = jit_stats();
  py::dict d;
  d["submitted"] = s.submitted;
  d["subops"] = s.subops;
  d["batches"] = s.batches;
  d["flushes"] = s.flushes;
  d["worker_launches"] = s.worker_launches;
  d["handovers"] = s.handovers;
  d["idle_adoptions"] = s.idle_adoptions;
  d["burst_launches"] = s.burst_launches;
  d["early_publishes"] = s.early_publishes;
  d["jit_compiles"] = j.compiles;
  d["cache_hits"] = j.cache_hits;
  d["disk_cache_hits"] = j.disk_hits;
  d["full_queue_flushes"] = s.full_queue_flushes;
  d["room_waits"] = s.room_waits;
  d["levels_split"] = s.levels_split;
  d["dma_batches"] = s.dma_batches;
  d["fused_subops"] = s.fused_subops;
  d["programs"] = s.programs;
  return d;
}

// Diagnostics: ns per 64-byte descriptor write into pinned (cuMemHostAlloc) vs pageable memory, and per
// read of a word the GPU may write. Used to explain record-path costs on a given host.
py::dict probe_host_memory(size_t n) {
  const Driver& d = driver();
  Runtime& rt = runtime_for(current_device());
  (void)rt;
  void* pinned = nullptr;
  GPUOS_CU(d.cuMemHostAlloc(&pinned, n * sizeof(SubOp), CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  std::vector<SubOp> pageable(n);
  auto bench = [&](SubOp* dst) {
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      SubOp& s = dst[i];
      s.op = 1; s.flags = 2; s.n = 256; s.base = 0; s.out = i; s.in[0] = i; s.in[1] = i; s.in[2] = 0;
      s.scalar[0] = s.scalar[1] = 0.f; s.dtype = 0; s.reserved = 0;
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  };
  py::dict r;
  r["pinned_ns_per_desc"] = bench((SubOp*)pinned);
  r["pinned_ns_per_desc_2nd"] = bench((SubOp*)pinned);
  r["pageable_ns_per_desc"] = bench(pageable.data());
  r["pageable_ns_per_desc_2nd"] = bench(pageable.data());
  d.cuMemFreeHost(pinned);
  return r;
}

}  // namespace

static PyMethodDef kFastMethods[] = {
#define GPUOS_SEED_OP(name, id)                                                                   \
  {"submit_" #name, (PyCFunction)(void (*)(void))submit_fast<id>, METH_FASTCALL,                   \
   "submit_" #name "(a, b, out)\n\nRecord out = " #name "(a, b) for CUDA tensors of one dtype (float32, "  \
   "float16, bfloat16) and equal shape, any strides. Runs at the next flush()."},
    GPUOS_SEED_OP(add, kOp_add) GPUOS_SEED_OP(sub, kOp_sub) GPUOS_SEED_OP(mul, kOp_mul) GPUOS_SEED_OP(div, kOp_div)
#undef GPUOS_SEED_OP
    {"sched_ew", (PyCFunction)(void (*)(void))sched_ew, METH_FASTCALL,
     "sched_ew(op_id, mode, inputs, out, s0, s1, size_threshold) -> Tensor | int\n\nThe scheduler's record path "
     "(gpuos/scheduler.py): validates, allocates the output and defers the op; an int is the fallback reason."},
    {"submit_reduce", (PyCFunction)(void (*)(void))submit_reduce_fast, METH_FASTCALL | METH_KEYWORDS,
     "submit_reduce(op, x, out, keepdim=False)\n\nRecord a last-dim reduction of x into out: op in ('sum', "
     "'mean', 'amax', 'amin') (out: x's shape without the last dim, or with it as 1 when keepdim), or 'softmax' / "
     "'log_softmax' (out: x's shape; may be x itself). float32 / float16 / bfloat16, any strides. Runs at the next "
     "flush()."},
    {"sched_dispatch", (PyCFunction)(void (*)(void))sched_dispatch, METH_FASTCALL,
     "sched_dispatch(mode, func, types, args=(), kwargs=None)\n\nThe scheduler's __torch_dispatch__ (bound to the "
     "mode): records ops with a fast spec (sched_set_fast), hands the rest to mode._dispatch_py, runs rejected ops "
     "through mode._eager(func, args, kwargs, reason)."},
    {"sched_function", (PyCFunction)(void (*)(void))sched_function, METH_FASTCALL,
     "sched_function(front, func, types, args=(), kwargs=None)\n\nThe scheduler's __torch_function__ front (bound "
     "to its TorchFunctionMode): records plain functional elementwise calls (sched_set_front) when a GpuosScheduler "
     "is the innermost dispatch mode and nothing else could see the op first; calls func(*args, **kwargs) otherwise."},
    {"sched_reduce", (PyCFunction)(void (*)(void))sched_reduce, METH_FASTCALL,
     "sched_reduce(op_id, x, keepdim, size_threshold) -> Tensor | int: a deferred last-dim reduction."},
    {nullptr, nullptr, 0, nullptr}};

PYBIND11_MODULE(gpuos_ext, m) {
  m.doc() = "GPUOS core: work queue, elastic persistent worker, NVRTC JIT (see README.md)";
  g_GpuosError = PyErr_NewExceptionWithDoc("gpuos_ext.GpuosError", "Base class of GPUOS errors.",
                                           PyExc_RuntimeError, nullptr);
  g_CudaError = PyErr_NewExceptionWithDoc("gpuos_ext.CudaError",
                                          "A CUDA driver call failed, or no usable GPU / driver / NVRTC.",
                                          g_GpuosError, nullptr);
  g_CompileError = PyErr_NewExceptionWithDoc(
      "gpuos_ext.CompileError", "NVRTC failed; attributes: log, arch, options, source_path.", g_GpuosError, nullptr);
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
  PyModule_AddFunctions(m.ptr(), kFastMethods);
  set_generation_ready_hook([](uint32_t) {
    std::lock_guard<std::mutex> life(g_rt_life);
    for (Runtime* r : g_rt)
      if (r) r->adopt_generation_if_idle();
  });
  add_injection_bindings(
      m,
      [] {
        std::vector<Runtime*> v;
        for (Runtime* r : g_rt)
          if (r) v.push_back(r);
        return v;
      },
      [] { return &runtime_for(current_device()); });
  // NVRTC may come from the nvidia-cuda-nvrtc wheel (CUDA builds of torch install it): find its lib dirs.
  try {
    py::object spec = py::module_::import("importlib.util").attr("find_spec")("nvidia");
    std::vector<std::string> dirs;
    if (!spec.is_none() && !spec.attr("submodule_search_locations").is_none()) {
      py::object glob = py::module_::import("glob").attr("glob");
      for (auto base : spec.attr("submodule_search_locations"))
        for (auto lib : glob(py::str(base) + py::str("/*/lib/libnvrtc.so*")))
          dirs.push_back(py::str(py::module_::import("os.path").attr("dirname")(lib)));
    }
    set_nvrtc_search_dirs(std::move(dirs));
  } catch (py::error_already_set& e) {
    // No nvidia namespace package: CUDA_HOME / GPUOS_NVRTC_PATH / the loader path still apply.
  }

  m.def("init", &init, py::arg("capacity") = 4096, py::arg("threads_per_block") = 256,
        py::arg("worker_blocks") = 0, py::arg("idle_us") = 200.0,
        "Start the runtime on the current CUDA device (idempotent). capacity: descriptor ring slots "
        "(one per 4096-element tile); worker_blocks: persistent grid size (0 = about 1/4 of the SMs); "
        "idle_us: the worker exits after this long with nothing to do.");
  m.def("submit_many", &submit_many, py::arg("op"), py::arg("a_list"), py::arg("b_list"), py::arg("out_list"),
        "Record out_list[i] = op(a_list[i], b_list[i]) for every i; op in ('add', 'sub', 'mul', 'div').");
  m.def("pending", [] {
    size_t n = 0;
    for (int dev = 0; dev < kMaxDevices; ++dev)
      if (g_rt[dev]) n += g_rt[dev]->has_pending() || !g_def[dev].ops.empty() ? 1 : 0;
    return n;
  }, "Number of devices with recorded work that no flush() has yet ordered a stream after (unpublished, or published early).");
  m.def("yield_worker", [] {
    for (auto* r : g_rt) if (r) r->request_yield();
  }, "Ask resident workers to exit as soon as nothing published is pending (before foreign heavy kernels).");
  m.def("flush", &flush, py::arg("sync") = false, py::arg("stream") = py::none(),
        "Publish pending work on the current stream (stream-ordered, no host sync); sync=True also waits.");
  m.def("shutdown", &shutdown, "Complete pending work, stop the worker and free the queue. init() may follow.");
  m.def("stats", &stats, "Counters: submitted, batches, flushes, worker_launches, handovers, jit_compiles, ...");
  m.def("is_initialized", [] {
    for (auto* r : g_rt) if (r) return true;
    return false;
  });
  m.def("worker_trace", [] {
    py::dict d;
    for (int dev = 0; dev < kMaxDevices; ++dev) {
      Runtime* rt = g_rt[dev];
      if (!rt) continue;
      uint64_t dropped = 0;
      std::vector<TraceRec> recs;
      {
        std::lock_guard<std::mutex> lk(rt->mu);
        recs = rt->take_trace(&dropped);
      }
      py::list l;
      for (const TraceRec& r : recs)
        l.append(py::make_tuple(r.block == kTraceOpen ? -1 : (int64_t)r.block, r.seq, r.idx, r.k, r.t0, r.load_ns,
                                r.exec_ns));
      d[py::int_(dev)] = py::dict(py::arg("records") = l, py::arg("dropped") = dropped);
    }
    return d;
  }, "Claim trace since the last call, per device: {'records': [(block, seq, idx, k, t0_ns, load_ns, exec_ns)], "
     "'dropped': n}; block -1 = the poller opening batch seq (idx = ring start, k = count). Needs GPUOS_TRACE=<records "
     "per block> before init; call after flush(sync=True). See tools/worker_trace.py.");
  m.def("runtime_info", [] {
    py::dict d;
    for (int dev = 0; dev < kMaxDevices; ++dev)
      if (g_rt[dev]) d[py::int_(dev)] = g_rt[dev]->describe();
    return d;
  });
  m.def("jit_compile", [](const std::string& arch) { return py::bytes(jit_compile_arch(arch)); }, py::arg("arch"),
        "Compile the embedded device sources with NVRTC for `arch` ('sm_90', 'compute_90'); returns the image.");
  m.def("nvrtc_version", [] {
    int a = 0, b = 0;
    nvrtc().nvrtcVersion(&a, &b);
    return py::make_tuple(a, b);
  });
  m.def("nvrtc_path", [] { return nvrtc().path; });
  m.def("device_sources", [] {
    py::dict d;
    for (auto& kv : embedded_sources()) d[py::str(kv.first)] = kv.second;
    return d;
  });
  m.def("jit_cache_dir", &jit_cache_dir);
  m.def("_probe_host_memory", &probe_host_memory, py::arg("n") = 1 << 20);
  m.def("_set_nvrtc_search_dirs", &set_nvrtc_search_dirs);
  m.def("op_table", [] {
    py::list l;
    for (uint32_t i = 0; i < kNumOpsHost; ++i) {
      const OpInfo& o = kOps[i];
      py::list defaults;
      if (o.nscalars > 0) defaults.append(o.d0);
      if (o.nscalars > 1) defaults.append(o.d1);
      py::list sn, aten;
      for (auto& x : split(o.scalar_names, ',')) sn.append(x);
      for (auto& x : split(o.aten, '|')) aten.append(x);
      l.append(py::dict(py::arg("id") = i, py::arg("name") = o.name, py::arg("arity") = o.arity,
                        py::arg("kind") = o.kind == 0 ? "ew" : "reduce", py::arg("functor") = functor_names()[i],
                        py::arg("scalars") = sn, py::arg("defaults") = defaults, py::arg("aten") = aten));
    }
    return l;
  });
  m.def("submit", &submit_generic, py::arg("op"), py::arg("inputs"), py::arg("out"),
        "submit(op, inputs, out, **scalars): record out = op(*inputs) for any elementwise op of the table; "
        "inputs are CUDA tensors (broadcast to out.shape, mixed float dtypes) or Python numbers.");
  m.def("sched_flush", &sched_flush, py::arg("cause") = "explicit",
        "Publish the scheduler's deferred ops (lowered, fused) on the streams they were recorded on; returns those "
        "streams.");
  m.def("sched_flush_for", &sched_flush_for, py::arg("args"), py::arg("kwargs"), py::arg("cause") = "dependency",
        "Before an eager op: publish deferred ops that share storage with the op's tensors; returns the streams.");
  m.def("sched_flush_due", &sched_flush_due, py::arg("age_s"), "Timer flush: publish deferred ops older than age_s.");
  m.def("sched_stats", &sched_stats);
  m.def("sched_fast_ops", [] { return spec_table_names(g_fast); },
        "The overloads sched_dispatch records without calling Python (sorted names).");
  m.def("sched_front_ops", [] { return spec_table_names(g_front); }, "The callables sched_function records (sorted).");
  m.def("_front_diag", [](py::object t) {
    using c10::impl::TorchDispatchModeTLS;
    py::dict d;
    d["torch_function_stack"] = at::impl::PythonTorchFunctionTLS::stack_len();
    const int64_t n = TorchDispatchModeTLS::stack_len();
    d["dispatch_stack"] = n;
    if (n > 0) {
      PyObject* top = TorchDispatchModeTLS::get_stack_at(n - 1)->ptr(getPyInterpreter());
      d["top"] = py::str(py::handle((PyObject*)Py_TYPE(top)));
      d["top_is_scheduler"] = g_sched_type && PyObject_TypeCheck(top, (PyTypeObject*)g_sched_type);
    }
    d["autocast_cuda"] = at::autocast::is_autocast_enabled(at::kCUDA);
    d["plain_cuda_tensor"] = plain_cuda_tensor(t.ptr());
    if (THPVariable_Check(t.ptr())) d["key_set"] = c10::toString(THPVariable_Unpack(t.ptr()).key_set());
    d["front_scheduler"] = front_scheduler() != nullptr;
    return d;
  }, py::arg("tensor"), "Why the __torch_function__ front would or would not record an op on `tensor` here.");
  m.def("sched_set_front", &sched_set_front, py::arg("table"), py::arg("sched_type"),
        "Replace sched_function's table {callable: (op_id, mode, nin, d0, d1, scalars, number_ok)}; sched_type: the "
        "scheduler class that must be the innermost dispatch mode.");
  m.def("sched_set_fast", [](py::dict t) { set_spec_table(g_fast, t, "sched_set_fast"); }, py::arg("table"),
        "Replace sched_dispatch's table {OpOverload: (op_id, mode, nin, d0, d1, scalars, number_ok)}; scalars: 0 "
        "none, 1 alpha, 2 rounding_mode must be None.");
  m.def("set_fusion", [](bool on) { g_fusion = on; }, py::arg("enabled"),
        "Enable / disable flush-time fusion of the scheduler's elementwise chains (default on).");
  m.def("fusion_enabled", [] { return g_fusion; });
  m.def("set_specialize_after", &set_specialize_after, py::arg("uses"),
        "Tier 2: a fused-chain program run this many times gets straight-line code in a later generation "
        "(compiled in the background; 0 = never). Default 64, or GPUOS_SPECIALIZE_AFTER.");
  m.def("specialize_after", &specialize_after);
  m.def("_liveness_probe", [](py::handle o) {  // tests: hold C++ references, then ask which Python dropped
    static std::vector<at::Tensor> held;
    calibrate_liveness();
    if (o.is_none()) {
      py::list r;
      for (auto& t : held) r.append(dead_to_python(t, 1));
      held.clear();
      return py::object(r);
    }
    held.push_back(THPVariable_Unpack(o.ptr()));
    return py::object(py::none());
  }, py::arg("tensor"), "Hold a C++ reference to `tensor`; with None: for each held tensor, whether the program "
     "dropped it (the scheduler's fusion liveness rule), then release them.");
  m.def("_build_program", [](uint32_t ninputs, py::list nodes, uint32_t out) {
    std::vector<ExprNode> v;
    for (auto item : nodes) {
      py::tuple t = item.cast<py::tuple>();
      ExprNode n{};
      n.op = t[0].cast<uint32_t>();
      py::list srcs = t[1].cast<py::list>();
      if (srcs.size() > 3) throw py::value_error("_build_program: at most 3 operands per node");
      n.nsrc = (uint32_t)srcs.size();
      for (size_t k = 0; k < srcs.size(); ++k) n.src[k] = srcs[k].cast<uint32_t>();
      n.s0 = t[2].cast<float>();
      n.s1 = t[3].cast<float>();
      n.round = t.size() > 4 ? t[4].cast<uint32_t>() : (uint32_t)kF32;
      v.push_back(n);
    }
    const Program p = build_program(ninputs, v, out);
    return py::bytes((const char*)&p, sizeof p);
  }, py::arg("ninputs"), py::arg("nodes"), py::arg("out"),
        "Bytecode (device_src/interp.h Program) for nodes [(op, [srcs], s0, s1[, round_dtype])].");
  m.def("_cpu_apply", &cpu_apply, py::arg("op"), py::arg("inputs"), py::arg("out"), py::arg("s0") = 0.0f,
        py::arg("s1") = 0.0f, "Evaluate an op's device functor on the CPU with g++ (numerics tests).");
  m.def("_cpu_run_program", &cpu_run_program, py::arg("program"), py::arg("inputs"), py::arg("out"),
        "Evaluate fused-chain bytecode (gpuos.fusion) with the device functors on the CPU.");
  m.def("_cpu_reduce", &cpu_reduce, py::arg("op"), py::arg("x"), py::arg("out"),
        "Evaluate a reduction's row rule on the CPU (x: contiguous 2-D).");
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    try {
      shutdown();
    } catch (...) {
      // At exit there is no one to report to; the process is ending either way.
    }
  }));
}
