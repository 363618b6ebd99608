// csrc/bindings.cpp -- the Python module `gpuos_ext`: validation, tensors -> operands, errors.
// The hot submit_* functions are METH_FASTCALL CPython functions (pybind11's dispatcher costs more than the
// whole record path); everything else is bound with pybind11.
#include <torch/extension.h>

#include <chrono>
#include <memory>
#include <mutex>

#include "cuda_api.h"
#include "jit.h"
#include "runtime.h"

namespace py = pybind11;
using namespace gpuos;

namespace {

constexpr int kMaxDevices = 64;

PyObject* g_GpuosError = nullptr;
PyObject* g_CudaError = nullptr;
PyObject* g_CompileError = nullptr;

Config g_cfg;                            // config for runtimes created from now on
Runtime* g_rt[kMaxDevices] = {nullptr};  // leaked at exit on purpose: atexit shutdown() releases them
std::vector<PyObject*> g_keep[kMaxDevices];  // strong refs (GIL held) until the pending work is published
PyObject* g_raw_stream_fn = nullptr;          // torch._C._cuda_getCurrentRawStream

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
CUstream current_stream(int dev) {
  if (!g_raw_stream_fn) {
    py::object f = py::module_::import("torch._C").attr("_cuda_getCurrentRawStream");
    g_raw_stream_fn = f.release().ptr();
  }
  PyObject* r = PyObject_CallFunction(g_raw_stream_fn, "i", dev);
  if (!r) throw py::error_already_set();
  const unsigned long long v = PyLong_AsUnsignedLongLong(r);
  Py_DECREF(r);
  return reinterpret_cast<CUstream>(v);
}

// Publishing happens with the GIL held (every path into Runtime::flush comes from Python).
void release_keep(int dev) {
  for (PyObject* o : g_keep[dev]) Py_DECREF(o);
  g_keep[dev].clear();
}

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
    rt->set_publish_hook([dev] { release_keep(dev); });
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
std::string dtype_str(const at::Tensor& t) {
  std::string s = c10::toString(t.scalar_type());
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
void extent(const at::Tensor& t, uint64_t& lo, uint64_t& hi) {
  int64_t mn = 0, mx = 0;
  for (int64_t i = 0; i < t.dim(); ++i) {
    const int64_t span = t.stride(i) * (t.size(i) - 1);
    if (span < 0) mn += span; else mx += span;
  }
  const int64_t es = (int64_t)t.element_size();
  const uint64_t p = (uint64_t)(uintptr_t)t.data_ptr();
  lo = p + mn * es;
  hi = p + (mx + 1) * es;
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
  if (out.numel() == 0) return;
  const c10::StorageImpl* os = out.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
  uint64_t olo = 0, ohi = 0;
  bool have_out_extent = false;
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& in = *ts[i];
    if (in.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl() != os) continue;  // cheap common case
    if (!have_out_extent) { extent(out, olo, ohi); have_out_extent = true; }
    uint64_t lo, hi;
    extent(in, lo, hi);
    const bool overlap = lo < ohi && olo < hi;
    const bool identical = in.data_ptr() == out.data_ptr() && in.strides() == out.strides();
    if (overlap && !identical)
      throw py::value_error(std::string(op) + ": out partially overlaps input '" + names[i] + "' (" + all() +
                            "); only exact in-place (out is the same view as the input) is allowed. Fix: "
                            "write to a separate tensor, or clone the input first.");
  }
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
    int64_t mn = 0, mx = 0;
    for (int i = 0; i < o.ndim; ++i) {
      const int64_t span = o.strides[i] * (o.sizes[i] - 1);
      if (span < 0) mn += span; else mx += span;
    }
    o.lo = o.ptr + mn * es;
    o.hi = o.ptr + (mx + 1) * es;
  }
  return o;
}

const char* const kOpNames[] = {
#define GPUOS_OP(id, name, arity, functor) #name,
#include "device_src/ops.def"
#undef GPUOS_OP
};
const char* const kSubmitNames[] = {
#define GPUOS_OP(id, name, arity, functor) "gpuos.submit_" #name,
#include "device_src/ops.def"
#undef GPUOS_OP
};

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
  std::lock_guard<std::mutex> lk(rt.mu);
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

uint32_t op_id(const std::string& name, const char* who) {
  for (uint32_t i = 0; i < sizeof(kOpNames) / sizeof(kOpNames[0]); ++i)
    if (name == kOpNames[i]) return i;
  std::string valid;
  for (auto* n : kOpNames) valid += std::string(valid.empty() ? "" : ", ") + "'" + n + "'";
  throw py::value_error(std::string(who) + ": unknown op '" + name + "'; valid ops: " + valid);
}

void submit_many(const std::string& opname, py::handle A, py::handle B, py::handle C) {
  const uint32_t op = op_id(opname, "gpuos.submit_many");
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
  std::unique_lock<std::mutex> lk;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Rec& r = recs[i];
    if (r.numel == 0) continue;
    if (!rt || rt->device() != r.dev) {
      if (lk.owns_lock()) lk.unlock();
      rt = &runtime_for(r.dev);
      lk = std::unique_lock<std::mutex>(rt->mu);
    }
    rt->record_binary(op, r.out, r.a, r.b, r.numel);
    keep3(r.dev, ia[i], ib[i], ic[i]);
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
  if (const char* v = std::getenv("GPUOS_TIMEOUT_S"); v && *v) cfg.timeout_s = std::atof(v);
  const int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices) throw py::value_error("gpuos.init: bad device index");
  if (g_rt[dev]) return;  // idempotent
  g_cfg = cfg;
  runtime_for(dev);
}

void flush(bool sync) {
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = g_rt[dev];
    if (!rt) continue;
    uint32_t seq;
    {
      CUstream s = rt->has_pending() ? current_stream(dev) : nullptr;  // Python call: before taking mu
      std::lock_guard<std::mutex> lk(rt->mu);
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
      // The GIL stays held: publishing drops keep-alive tensors, whose release may touch Python objects.
      std::lock_guard<std::mutex> lk(rt->mu);
      rt->shutdown(s);
    }
    release_keep(dev);
    g_rt[dev] = nullptr;
    delete rt;
  }
}

py::dict stats() {
  RuntimeStats s;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    if (!g_rt[dev]) continue;
    RuntimeStats r = g_rt[dev]->stats();
    s.submitted += r.submitted; s.subops += r.subops; s.batches += r.batches; s.flushes += r.flushes;
    s.worker_launches += r.worker_launches; s.handovers += r.handovers;
    s.full_queue_flushes += r.full_queue_flushes; s.room_waits += r.room_waits; s.levels_split += r.levels_split;
    s.dma_batches += r.dma_batches;
  }
  JitStats j = jit_stats();
  py::dict d;
  d["submitted"] = s.submitted;
  d["subops"] = s.subops;
  d["batches"] = s.batches;
  d["flushes"] = s.flushes;
  d["worker_launches"] = s.worker_launches;
  d["handovers"] = s.handovers;
  d["jit_compiles"] = j.compiles;
  d["cache_hits"] = j.cache_hits;
  d["disk_cache_hits"] = j.disk_hits;
  d["full_queue_flushes"] = s.full_queue_flushes;
  d["room_waits"] = s.room_waits;
  d["levels_split"] = s.levels_split;
  d["dma_batches"] = s.dma_batches;
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
#define GPUOS_OP(id, name, arity, functor)                                                  \
  {"submit_" #name, (PyCFunction)(void (*)(void))submit_fast<id>, METH_FASTCALL,             \
   "submit_" #name "(a, b, out)\n\nRecord out = " #name "(a, b) for CUDA tensors of one dtype (float32, "  \
   "float16, bfloat16) and equal shape, any strides. Runs at the next flush()."},
#include "device_src/ops.def"
#undef GPUOS_OP
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

  m.def("init", &init, py::arg("capacity") = 4096, py::arg("threads_per_block") = 256,
        py::arg("worker_blocks") = 0, py::arg("idle_us") = 200.0,
        "Start the runtime on the current CUDA device (idempotent). capacity: descriptor ring slots "
        "(one per 4096-element tile); worker_blocks: persistent grid size (0 = about 1/4 of the SMs); "
        "idle_us: the worker exits after this long with nothing to do.");
  m.def("submit_many", &submit_many, py::arg("op"), py::arg("a_list"), py::arg("b_list"), py::arg("out_list"),
        "Record out_list[i] = op(a_list[i], b_list[i]) for every i; op in ('add', 'sub', 'mul', 'div').");
  m.def("flush", &flush, py::arg("sync") = false,
        "Publish pending work on the current stream (stream-ordered, no host sync); sync=True also waits.");
  m.def("shutdown", &shutdown, "Complete pending work, stop the worker and free the queue. init() may follow.");
  m.def("stats", &stats, "Counters: submitted, batches, flushes, worker_launches, handovers, jit_compiles, ...");
  m.def("is_initialized", [] {
    for (auto* r : g_rt) if (r) return true;
    return false;
  });
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
#define GPUOS_OP(id, name, arity, functor) \
  l.append(py::dict(py::arg("id") = id, py::arg("name") = #name, py::arg("arity") = arity, py::arg("functor") = #functor));
#include "device_src/ops.def"
#undef GPUOS_OP
    return l;
  });
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    try {
      shutdown();
    } catch (...) {
      // At exit there is no one to report to; the process is ending either way.
    }
  }));
}
