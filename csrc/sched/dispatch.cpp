// csrc/sched/dispatch.cpp -- see dispatch.h.
#include "sched/dispatch.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/PyInterpreter.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "ops/op_table.h"
#include "sched/cfront.h"
#include "sched/deferred.h"
#include "sched/record.h"
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {

// gpuos.GpuosScheduler sets its instance's __torch_dispatch__ to this function bound to the mode
// (types.MethodType), so torch calls C++ directly for every op under the mode: no Python frame on the hot path.
// Overloads with a fast spec (elementwise ops whose scalars are none, `alpha`, or `rounding_mode=None`) are
// recorded here; every other overload goes to the mode's Python path (_dispatch_py: reductions, ops with other
// scalars, user ops), and every op that must run eagerly to the mode's _eager(func, args, kwargs, reason).
// One recordable call: CallSpec (dispatch.h).
using SpecTable = std::unordered_map<PyObject*, CallSpec>;  // keys: strong references
SpecTable g_fast;                                        // sched_dispatch: OpOverload -> spec

// Replace `dst` with `table` (checked first: a bad spec changes nothing).
void set_spec_table(SpecTable& dst, py::dict table, const char* who) {
  SpecTable t;
  for (auto item : table) {
    auto v = item.second.cast<py::tuple>();
    CallSpec f;
    f.op = v[0].cast<uint32_t>();
    f.mode = v[1].cast<int>();
    f.nin = v[2].cast<uint32_t>();
    f.d0 = v[3].cast<float>();
    f.d1 = v[4].cast<float>();
    f.scalars = v[5].cast<int>();
    f.number_ok = v[6].cast<bool>();
    if (f.op >= kNumOps || kOps[f.op].kind != kKindEw || f.nin != kOps[f.op].arity || f.mode < 0 || f.mode > 2 ||
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

// Calls that read no tensor data, run at once without the scheduler's Python (sched_set_nodata): in sched_dispatch the
// overloads of gpuos/scheduler.py's _NO_DATA that no handler took (views, metadata, allocation: GpuosScheduler._eager
// runs them as they come, after two Python frames), in sched_function the view callables (Tensor.view, transpose,
// ...) below the dispatch modes: a view under a dispatch mode costs PyTorch's boxing and a Python call (~3-4 us per
// op on the CPU machine, forty-first session), ~150-220 of them per step of a small HF decoder.
using KeySet = std::unordered_set<PyObject*>;  // keys: strong references
KeySet g_nodata, g_front_views;

void set_key_set(KeySet& dst, py::iterable keys) {
  KeySet t;
  for (auto k : keys) t.insert(k.ptr());
  for (PyObject* k : t) Py_INCREF(k);
  for (PyObject* k : dst) Py_DECREF(k);
  dst.swap(t);
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
  if (args && PyTuple_Check(args) && (!kwargs || PyDict_Check(kwargs)) && g_nodata.count(func))
    return PyObject_Call(func, args, kwargs);  // reads no data: no flush, nothing to record
  auto it = g_fast.find(func);
  if (it == g_fast.end() || !args || !PyTuple_Check(args) || (kwargs && !PyDict_Check(kwargs)))
    return call_mode(mode, s_py, a + 1, (size_t)n - 1);
  const CallSpec& f = it->second;
  const Py_ssize_t na = PyTuple_GET_SIZE(args);
  PyObject* why = nullptr;  // new reference: the reason to run eagerly
  if (na < (Py_ssize_t)f.nin) why = reason(kR_unsupported_args);
  float s0 = f.d0;
  PyObject* pout = nullptr;
  if (!why && f.scalars == 1) {
    PyObject* al = kwargs ? PyDict_GetItemWithError(kwargs, s_alpha) : nullptr;
    if (!al && PyErr_Occurred()) return nullptr;
    if (!al && na > 2) al = PyTuple_GET_ITEM(args, 2);
    if (al) {
      const double v = is_number(al) ? PyFloat_AsDouble(al) : 0.0;
      if (v == -1.0 && PyErr_Occurred()) return nullptr;  // an int beyond a double's range
      if (!is_number(al)) why = reason(kR_unsupported_args);
      else s0 = (float)v;
    }
  } else if (!why && f.scalars == 2 && kwargs) {
    PyObject* rm = PyDict_GetItemWithError(kwargs, s_rmode);
    if (!rm && PyErr_Occurred()) return nullptr;
    if (rm && rm != Py_None) why = reason(kR_unsupported_args);
  }
  if (!why && f.mode == kModeOut && kwargs) {
    pout = PyDict_GetItemWithError(kwargs, s_out);
    if (!pout && PyErr_Occurred()) return nullptr;
  }
  if (!why) {
    int64_t thr = 0;
    if (!read_threshold(mode, thr)) return nullptr;
    PyObject* r = sched_ew_record(f.op, f.nin, f.mode, &PyTuple_GET_ITEM(args, 0), pout, s0, f.d1, thr);
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


// ---- the scheduler's __torch_function__ front
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

bool plain_cuda_keys(const at::Tensor& t) {
  static const c10::DispatchKeySet allowed({c10::DispatchKey::CUDA, c10::DispatchKey::AutogradCUDA,
                                            c10::DispatchKey::ADInplaceOrView, c10::DispatchKey::AutocastCUDA});
  // (operator- of DispatchKeySet keeps backend bits: a subset test is an intersection that changes nothing)
  const c10::DispatchKeySet ks = t.unsafeGetTensorImpl()->key_set();
  return ks.has(c10::DispatchKey::CUDA) && (ks & allowed) == ks;
}
bool plain_cuda_tensor(PyObject* o) { return THPVariable_CheckExact(o) && plain_cuda_keys(THPVariable_Unpack(o)); }

// A view call whose only tensor is its first argument, a plain CUDA tensor: its other arguments (dims, sizes, a
// dtype) hold no tensor -- a tensor there (narrow's start, a size given as a tensor) would have its value read on
// the host, which must wait for the deferred ops that write it (the dispatch path's flush).
bool view_of_plain_cuda(PyObject* args, PyObject* kwargs) {
  auto has_tensor = [](PyObject* o) {
    if (THPVariable_Check(o)) return true;
    if (PyList_Check(o) || PyTuple_Check(o)) {
      PyObject* seq = o;
      const Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
      for (Py_ssize_t j = 0; j < m; ++j)
        if (THPVariable_Check(PySequence_Fast_GET_ITEM(seq, j))) return true;
    }
    return false;
  };
  const Py_ssize_t na = PyTuple_GET_SIZE(args);
  if (na < 1 || !plain_cuda_tensor(PyTuple_GET_ITEM(args, 0))) return false;
  for (Py_ssize_t i = 1; i < na; ++i)
    if (has_tensor(PyTuple_GET_ITEM(args, i))) return false;
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (kwargs && PyDict_Next(kwargs, &pos, &k, &v))
    if (has_tensor(v)) return false;
  return true;
}

// sched_function(front, func, types, args=(), kwargs=None)
PyObject* sched_function(PyObject*, PyObject* const* a, Py_ssize_t n) {
  PyObject *s_alpha = names().alpha, *s_rmode = names().rmode;
  if (!check_mode_call(n, "__torch_function__")) return nullptr;
  PyObject* func = a[1];
  PyObject* args = n > 3 ? a[3] : nullptr;
  PyObject* kwargs = n > 4 && a[4] != Py_None ? a[4] : nullptr;
  if (args && PyTuple_Check(args) && (!kwargs || PyDict_Check(kwargs)) && g_front_views.count(func) &&
      view_of_plain_cuda(args, kwargs) && front_scheduler() != nullptr) {
    // A view of a plain CUDA tensor under a GpuosScheduler: below the dispatch modes (its _eager would run it as it
    // comes: no data read, no flush). Another tensor argument, another mode or autocast: the path below.
    c10::impl::ExcludeDispatchKeyGuard no_modes(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    return PyObject_Call(func, args, kwargs);
  }
  auto it = g_front.find(func);
  PyObject* sched = nullptr;
  if (it != g_front.end() && args && PyTuple_Check(args) && PyTuple_GET_SIZE(args) == (Py_ssize_t)it->second.nin &&
      (!kwargs || PyDict_Check(kwargs)) && (sched = front_scheduler()) != nullptr) {
    const CallSpec& f = it->second;
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
        r = sched_ew_record(f.op, f.nin, kModeFunctional, &PyTuple_GET_ITEM(args, 0), nullptr, s0, f.d1, thr);
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

void sched_set_fast(py::dict table) {
  set_spec_table(g_fast, table, "sched_set_fast");
  std::vector<std::pair<PyObject*, CallSpec>> byname(g_fast.begin(), g_fast.end());
  cfront_set_fast(byname);  // the dispatcher front's table (by operator name)
}
void sched_set_nodata(py::iterable overloads, py::iterable front_views) {
  set_key_set(g_nodata, overloads);
  set_key_set(g_front_views, front_views);
  cfront_set_nodata(std::vector<PyObject*>(g_nodata.begin(), g_nodata.end()));
}
std::vector<std::string> sched_fast_ops() { return spec_table_names(g_fast); }
std::vector<std::string> sched_front_ops() { return spec_table_names(g_front); }

py::dict front_diag(py::object t) {
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
}

}  // namespace gpuos
