// csrc/sched/cfront.cpp -- see cfront.h.
#include "sched/cfront.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/PyInterpreter.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sched/dispatch.h"
#include "sched/record.h"

namespace py = pybind11;

namespace gpuos {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::DeferredInit;

struct FastEntry {  // a functional fast overload as the dispatcher's stack holds its arguments
  CallSpec spec;
  int alpha = -1;  // stack index of `alpha` (scalars 1), of `rounding_mode` (scalars 2); -1: none
};
// The tables, an immutable snapshot replaced whole by the setters (gpuos/scheduler.py: on import and whenever a user
// op is registered -- possibly while another thread runs under a scheduler). The fallback runs without the GIL, so
// it never reads a table that can change: each thread keeps the snapshot it looked up its cache in alive, and its
// cache holds copies of the entries (the stress test's registrations freed a swapped-out map under a reader: a
// garbage op id in the worker, an illegal address).
struct Tables {
  std::unordered_map<c10::OperatorName, FastEntry> fast;
  std::unordered_set<c10::OperatorName> nodata;
};
std::mutex g_tables_mu;  // guards g_tables (the pointer; the snapshot it points to never changes)
std::shared_ptr<const Tables> g_tables = std::make_shared<const Tables>();
std::atomic<uint64_t> g_seen{0}, g_recorded{0}, g_nodata{0}, g_direct{0};
// Bumped by every table change: a thread's cache of what each operator is (below) is dropped when it is stale.
std::atomic<uint64_t> g_tables_version{1};

void replace_tables(const std::function<void(Tables&)>& edit) {
  std::lock_guard<std::mutex> lock(g_tables_mu);
  auto t = std::make_shared<Tables>(*g_tables);
  edit(*t);
  g_tables = std::move(t);
  g_tables_version.fetch_add(1, std::memory_order_acq_rel);
}

// What an operator is to the front, cached per thread by its schema's address (stable for the process), so that a
// pass-through op costs a pointer lookup, not two string hashes: its fast entry (a copy), no-data, or neither.
// No-data excludes operators with a CompositeImplicitAutograd kernel: the front sits above Autograd and would see
// them whole -- reshape, which copies when no view can do (repeat_kv's expand + reshape), run below the mode would
// read deferred outputs before they are written, and its copy would be hidden from the mode's rewrites and from a
// program's capture. Left alone, they decompose below and their parts (view, clone) come back through the front.
struct OpKind {
  bool fast = false, nodata = false;
  bool direct = false;  // neither, functional, no CompositeImplicitAutograd kernel: cfront_call_mode may take it
  FastEntry entry;
};
const OpKind& kind_of(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const void*, OpKind> cache;
  thread_local uint64_t version = 0;
  thread_local std::shared_ptr<const Tables> tables;
  const uint64_t v = g_tables_version.load(std::memory_order_acquire);
  if (version != v) {
    std::lock_guard<std::mutex> lock(g_tables_mu);
    cache.clear();
    tables = g_tables;
    version = g_tables_version.load(std::memory_order_acquire);
  }
  auto [it, fresh] = cache.try_emplace(&op.schema());
  if (fresh) {
    const c10::OperatorName& name = op.operator_name();
    auto f = tables->fast.find(name);
    const bool composite = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    if (f != tables->fast.end()) it->second.fast = true, it->second.entry = f->second;
    else if (tables->nodata.count(name)) it->second.nodata = !composite;
    else it->second.direct = !composite && functional_schema(op.schema());
  }
  return it->second;
}

struct Frame {  // one entered context on this thread
  PyObject* mode;
  int64_t threshold;
  bool was_included;
};
thread_local std::vector<Frame> t_frames;

// The fallback's registration: once, on the first enter (the extension's load registers nothing, so another
// library that holds the key loads as before).
std::once_flag g_reg_once;
bool g_available = false;
std::string g_reason = "not registered yet (no scheduler context entered)";
bool g_direct_on = true;  // GPUOS_CFRONT_DIRECT=0: no direct calls, every op the front does not take goes to the mode

c10::OperatorName name_of(PyObject* overload) {
  py::handle h(overload);
  py::object schema = h.attr("_schema");
  return c10::OperatorName(schema.attr("name").cast<std::string>(), schema.attr("overload_name").cast<std::string>());
}

// The innermost dispatch mode is this thread's entered scheduler and nothing could see the op differently first.
bool scheduler_on_top(const Frame& f) {
  using c10::impl::TorchDispatchModeTLS;
  const int64_t n = TorchDispatchModeTLS::stack_len();
  if (n < 1) return false;  // inside the mode's own __torch_dispatch__ (it is popped), or after its exit
  for (auto k : {c10::impl::TorchDispatchModeKey::FAKE, c10::impl::TorchDispatchModeKey::PROXY,
                 c10::impl::TorchDispatchModeKey::FUNCTIONAL})
    if (TorchDispatchModeTLS::get_mode(k).has_value()) return false;
  if (TorchDispatchModeTLS::get_stack_at(n - 1)->ptr(getPyInterpreter()) != f.mode) return false;
  return !at::autocast::is_autocast_enabled(at::kCUDA);
}

// Every tensor argument (tensors and lists of them) plain CUDA (dispatch.h plain_cuda_keys); `any`: one was seen.
bool plain_args(const torch::jit::Stack& stack, size_t first, bool* any) {
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && !plain_cuda_keys(t)) return false;
      *any = true;
    } else if (v.isList()) {  // sizes, dims, tensor lists (all lists are generic lists of IValues)
      for (const c10::IValue& x : v.toListRef()) {
        if (!x.isTensor()) continue;
        if (x.toTensor().defined() && !plain_cuda_keys(x.toTensor())) return false;
        *any = true;
      }
    }
  }
  return true;
}

// The direct call's arguments: every tensor (and tensor list element) a dense CPU or CUDA tensor with no other
// functionality than autograd's and autocast's (no subclass, no negative / conjugate / zero bit), none needing grad
// while grad mode is on -- so that Autograd, ADInplaceOrView and the math-bit fallbacks, which the direct call
// skips, would have done nothing.
bool direct_args(const torch::jit::Stack& stack, size_t first) {
  static const c10::DispatchKeySet allowed({c10::DispatchKey::CUDA, c10::DispatchKey::CPU,
                                            c10::DispatchKey::AutogradCUDA, c10::DispatchKey::AutogradCPU,
                                            c10::DispatchKey::ADInplaceOrView, c10::DispatchKey::AutocastCUDA,
                                            c10::DispatchKey::AutocastCPU});
  const bool grad = at::GradMode::is_enabled();
  auto ok = [&](const at::Tensor& t) {
    if (!t.defined()) return true;
    const c10::DispatchKeySet ks = t.unsafeGetTensorImpl()->key_set();
    return (ks & allowed) == ks && !(grad && t.requires_grad());
  };
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      if (!ok(v.toTensor())) return false;
    } else if (v.isList()) {
      for (const c10::IValue& x : v.toListRef())
        if (x.isTensor() && !ok(x.toTensor())) return false;
    } else if (v.isObject() || v.isCapsule() || v.isPyObject()) {
      return false;  // (what the Python key would see differently: nothing the aten ops here take)
    }
  }
  return true;
}

// Record the functional fast op from the stack (its nargs arguments on top); true: the output replaced them.
bool try_record(const FastEntry& e, size_t nargs, const Frame& f, torch::jit::Stack* stack) {
  const CallSpec& s = e.spec;
  if (nargs < s.nin) return false;
  const size_t base = stack->size() - nargs;
  EwIn in[3];
  bool any = false, wrapped = false, all_float = true;
  for (uint32_t k = 0; k < s.nin; ++k) {
    const c10::IValue& v = (*stack)[base + k];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number()) {  // a Python number (x * 0.5): a 0-d CPU
        const c10::ScalarType st = t.scalar_type();                         // tensor at the dispatcher
        if (st != at::kDouble && st != at::kLong && st != at::kBool) return false;  // (complex: eager)
        in[k].number = true;
        in[k].v = st == at::kDouble ? *t.const_data_ptr<double>()
                  : st == at::kLong ? (double)*t.const_data_ptr<int64_t>() : (double)*t.const_data_ptr<bool>();
        wrapped = true;
        continue;
      }
      if (!t.defined() || !plain_cuda_keys(t)) return false;
      in[k].t = &t;
      all_float &= at::isFloatingType(t.scalar_type());
      any = true;
    } else if (v.isDouble() || v.isInt() || v.isBool()) {
      in[k].number = true;
      in[k].v = v.isDouble() ? v.toDouble() : v.isInt() ? (double)v.toInt() : (double)v.toBool();
    } else {
      return false;
    }
  }
  // A number takes no part in the result's dtype only beside floating tensors (an integer tensor times 0.5 is float).
  if (!any || (wrapped && !all_float)) return false;
  float s0 = s.d0;
  if (e.alpha >= 0) {
    const c10::IValue& a = (*stack)[base + e.alpha];
    if (s.scalars == 1) {
      if (a.isDouble()) s0 = (float)a.toDouble();
      else if (a.isInt()) s0 = (float)a.toInt();
      else if (a.isBool()) s0 = (float)a.toBool();
      else if (!a.isNone()) return false;
    } else if (s.scalars == 2 && !a.isNone()) {
      return false;  // rounding_mode other than None: the Python path decides
    }
  }
  // The record path reads Python's view of tensors (liveness at lowering) and counts under the GIL, as from
  // sched_dispatch; its allocation must not reach the dispatch mode (nor this front again).
  py::gil_scoped_acquire gil;
  EwRecorded r;
  try {
    c10::impl::ExcludeDispatchKeyGuard below(
        c10::DispatchKeySet({kKey, c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    r = ew_record(s.op, s.nin, kModeFunctional, in, nullptr, s0, s.d1, f.threshold);
  } catch (const std::invalid_argument&) {  // outside what GPUOS takes (sched_dispatch: "rejected:<type>", eager)
    return false;
  } catch (const c10::TypeError&) {
    return false;
  } catch (const c10::ValueError&) {
    return false;
  }
  if (r.reason >= 0) return false;  // the dispatch mode below runs the same checks and counts the fallback
  torch::jit::drop(*stack, nargs);
  stack->emplace_back(std::move(r.out));
  return true;
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);  // the keys under it
  g_seen.fetch_add(1, std::memory_order_relaxed);
  if (t_frames.empty()) return op.redispatchBoxed(below, stack);
  const OpKind k = kind_of(op);  // a copy
  if ((!k.fast && !k.nodata && !k.direct) || !scheduler_on_top(t_frames.back()))
    return op.redispatchBoxed(below, stack);
  const Frame& f = t_frames.back();
  const size_t nargs = op.schema().arguments().size();
  if (k.direct) {
    if (g_direct_on && !at::autocast::is_autocast_enabled(at::kCPU) && direct_args(*stack, stack->size() - nargs)) {
      g_direct.fetch_add(1, std::memory_order_relaxed);
      return cfront_call_mode(op, f.mode, stack);
    }
    return op.redispatchBoxed(below, stack);
  }
  if (k.fast) {
    if (try_record(k.entry, nargs, f, stack)) {
      g_recorded.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  } else if (c10::impl::TorchDispatchModeTLS::stack_len() == 1) {
    // Reads no data: below the mode, as sched_dispatch runs it -- unless a tensor argument is not plain (a Python
    // subclass must still see it; a conjugate view's bit must still be resolved by its kernel).
    bool any = false;
    if (plain_args(*stack, stack->size() - nargs, &any)) {
      g_nodata.fetch_add(1, std::memory_order_relaxed);
      // Out of this call's key set (the mode's Python key is in it: the guard alone would still have sent it to
      // the mode with the mode's state half restored -- PyTorch's internal assert, found by a factory op after a
      // gloo collective) and out of any call it makes.
      c10::impl::ExcludeDispatchKeyGuard no_modes(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      return op.redispatchBoxed(below.remove(c10::DispatchKey::Python).remove(c10::DispatchKey::PythonTLSSnapshot),
                                stack);
    }
  }
  op.redispatchBoxed(below, stack);
}

void register_once() {
  std::call_once(g_reg_once, [] {
    if (const char* v = std::getenv("GPUOS_CFRONT_DIRECT"); v && std::string(v) == "0") g_direct_on = false;
    if (const char* v = std::getenv("GPUOS_CFRONT"); v && std::string(v) == "0") {
      g_reason = "off (GPUOS_CFRONT=0)";
      return;
    }
    auto& d = c10::Dispatcher::singleton();
    if (d.hasBackendFallbackForDispatchKey(kKey)) {
      g_reason = "another library holds the DeferredInit dispatch key (torchdistx?): the dispatch mode alone";
      return;
    }
    try {
      static c10::RegistrationHandleRAII handle = d.registerFallback(
          kKey, c10::KernelFunction::makeFromBoxedFunction<&fallback>(), "gpuos scheduler dispatcher front");
      g_available = true;
      g_reason = "";
    } catch (const std::exception& e) {
      g_reason = std::string("registering the fallback failed: ") + e.what();
    }
  });
}

}  // namespace

void cfront_set_fast(const std::vector<std::pair<PyObject*, CallSpec>>& table) {
  std::unordered_map<c10::OperatorName, FastEntry> t;
  for (const auto& [ov, spec] : table) {
    if (spec.mode != kModeFunctional) continue;  // in place / out=: the dispatch mode (version counters, aliasing)
    FastEntry e;
    e.spec = spec;
    if (spec.scalars != 0) {
      const char* want = spec.scalars == 1 ? "alpha" : "rounding_mode";
      py::list args = py::handle(ov).attr("_schema").attr("arguments");
      for (size_t i = 0; i < args.size(); ++i)
        if (args[i].attr("name").cast<std::string>() == want) e.alpha = (int)i;
    }
    t.emplace(name_of(ov), e);
  }
  replace_tables([&](Tables& tb) { tb.fast.swap(t); });
}

void cfront_set_nodata(const std::vector<PyObject*>& overloads) {
  std::unordered_set<c10::OperatorName> t;
  for (PyObject* ov : overloads) t.insert(name_of(ov));
  replace_tables([&](Tables& tb) { tb.nodata.swap(t); });
}

bool cfront_enter(PyObject* mode, int64_t threshold) {
  register_once();
  if (!g_available) return false;
  t_frames.push_back({mode, threshold, c10::impl::tls_is_dispatch_key_included(kKey)});
  c10::impl::tls_set_dispatch_key_included(kKey, true);
  return true;
}

void cfront_exit() {
  if (t_frames.empty()) return;
  const bool was = t_frames.back().was_included;
  t_frames.pop_back();
  c10::impl::tls_set_dispatch_key_included(kKey, was);
}

py::dict cfront_info() {
  py::dict d;
  d["available"] = g_available;
  d["reason"] = g_reason;
  d["key"] = c10::toString(kKey);
  d["enabled_here"] = c10::impl::tls_is_dispatch_key_included(kKey);
  d["depth"] = t_frames.size();
  d["seen"] = g_seen.load();
  d["recorded"] = g_recorded.load();
  d["nodata"] = g_nodata.load();
  d["direct"] = g_direct.load();
  d["direct_on"] = g_direct_on;
  {
    std::lock_guard<std::mutex> lock(g_tables_mu);
    d["fast_ops"] = g_tables->fast.size();
  }
  return d;
}

}  // namespace gpuos
