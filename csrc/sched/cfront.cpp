// csrc/sched/cfront.cpp -- see cfront.h.
#include "sched/cfront.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/forward_grad.h>

#include <atomic>
#include <chrono>
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

constexpr c10::DispatchKey kKey = kCfrontKey;

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
  std::unordered_set<c10::OperatorName> native;  // cfront_native.cpp's ops no registered op took
  std::unordered_map<c10::OperatorName, uint32_t> reductions;  // and its reductions: op ids
};
std::mutex g_tables_mu;  // guards g_tables (the pointer; the snapshot it points to never changes)
std::shared_ptr<const Tables> g_tables = std::make_shared<const Tables>();
std::atomic<uint64_t> g_seen{0}, g_recorded{0}, g_nodata{0}, g_direct{0}, g_native{0};
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
  bool composite = false;  // a CompositeImplicitAutograd kernel: its parts must come back through the front
  bool inplace = false;    // an in-place native (index_copy_): recorded by the front, or handed on
  CfrontNative native = CfrontNative::none;  // recorded by the front itself first (then direct)
  uint32_t code = 0;                          // (native reduce: the row's op id; compare: its rule)
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
    it->second.composite = composite;
    if (f != tables->fast.end()) it->second.fast = true, it->second.entry = f->second;
    else if (tables->nodata.count(name)) it->second.nodata = !composite;
    else it->second.direct = !composite && functional_schema(op.schema());
    if (it->second.direct && tables->native.count(name)) {
      it->second.native = cfront_native_of(name);
      if (it->second.native == CfrontNative::compare) it->second.code = (uint32_t)cfront_compare_rule(name);
    }
    if (!composite && !it->second.direct && tables->native.count(name) &&
        cfront_native_of(name) == CfrontNative::index_copy)
      it->second.inplace = true, it->second.native = CfrontNative::index_copy;
    if (auto r = tables->reductions.find(name); it->second.direct && r != tables->reductions.end())
      it->second.native = CfrontNative::reduce, it->second.code = r->second;
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
// GPUOS_CFRONT_DIRECT=0 / cfront_set_direct(false): no direct calls, every op the front does not take to the mode.
std::atomic<bool> g_direct_on{true};

// cfront_set_timing(true): each pass's own time (less the front passes nested in it: a composite's parts, a
// handler's calls that came back through the front) by what the front did with the op, and per operator for the
// ops it recorded natively, sent to Python or handed on -- where a step's host time under the scheduler goes.
// Off: one relaxed load per pass.
enum Cat : int { kCatPass, kCatComposite, kCatRecord, kCatNodata, kCatDirect, kCatNative, kCatHanded, kCats };
constexpr const char* kCatNames[kCats] = {"pass", "composite", "record", "nodata", "direct", "native", "handed"};
std::atomic<bool> g_timing{false};
std::atomic<uint64_t> g_cat_ns[kCats], g_cat_n[kCats];
struct OpTime {
  std::string name;
  uint64_t n[kCats] = {}, ns[kCats] = {};
};
std::mutex g_byop_mu;  // guards g_byop (timing only)
std::unordered_map<const void*, OpTime> g_byop;
thread_local uint64_t t_nested_ns = 0;  // front time of the passes nested in the current one

c10::OperatorName name_of(PyObject* overload) {
  py::handle h(overload);
  py::object schema = h.attr("_schema");
  return c10::OperatorName(schema.attr("name").cast<std::string>(), schema.attr("overload_name").cast<std::string>());
}

// The innermost dispatch mode is this thread's entered scheduler and nothing could see the op differently first --
// nor must: while a forward-AD level is open (torch.autograd.forward_ad.dual_level, one level at a time), Autograd's
// forward-mode kernels, below the front, must see every op to carry the tangents (recorded here, a dual tensor's
// result had none); ops then take the mode's way, through Autograd.
bool scheduler_on_top(const Frame& f) {
  using c10::impl::TorchDispatchModeTLS;
  if (torch::autograd::ForwardADLevel::try_get_by_idx(0)) return false;
  const int64_t n = TorchDispatchModeTLS::stack_len();
  if (n < 1) return false;  // inside the mode's own __torch_dispatch__ (it is popped), or after its exit
  for (auto k : {c10::impl::TorchDispatchModeKey::FAKE, c10::impl::TorchDispatchModeKey::PROXY,
                 c10::impl::TorchDispatchModeKey::FUNCTIONAL})
    if (TorchDispatchModeTLS::get_mode(k).has_value()) return false;
  if (TorchDispatchModeTLS::get_stack_at(n - 1)->ptr(getPyInterpreter()) != f.mode) return false;
  return !at::autocast::is_autocast_enabled(at::kCUDA);
}

// Whether ok(tensor) holds for every tensor argument from stack[first] on (tensors and lists of them: sizes, dims
// and tensor lists are all generic lists of IValues); `no_objects`: also no script object, capsule or Python object
// (what the Python key would see differently: nothing the aten ops here take).
template <class Ok>
bool tensors_ok(const torch::jit::Stack& stack, size_t first, bool no_objects, Ok ok) {
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      if (!ok(v.toTensor())) return false;
    } else if (v.isList()) {
      for (const c10::IValue& x : v.toListRef())
        if (x.isTensor() && !ok(x.toTensor())) return false;
    } else if (no_objects && (v.isObject() || v.isCapsule() || v.isPyObject())) {
      return false;
    }
  }
  return true;
}

// Every tensor argument plain CUDA (dispatch.h plain_cuda_keys) or undefined: what a no-data op runs below the mode.
bool plain_args(const torch::jit::Stack& stack, size_t first) {
  return tensors_ok(stack, first, false, [](const at::Tensor& t) { return !t.defined() || plain_cuda_keys(t); });
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
  return tensors_ok(stack, first, true, [&](const at::Tensor& t) {
    if (!t.defined()) return true;
    const c10::DispatchKeySet ks = t.unsafeGetTensorImpl()->key_set();
    return (ks & allowed) == ks && !(grad && t.requires_grad());
  });
}

// Record the fast op from the stack (its nargs arguments on top); true: the output replaced them. In place
// (add_, mul_, ...): self, a plain CUDA tensor of the result's dtype and shape (ew_record checks), written and
// returned, its version bumped (cfront_inplace_done).
bool try_record(const FastEntry& e, size_t nargs, const Frame& f, torch::jit::Stack* stack) {
  const CallSpec& s = e.spec;
  if (nargs < s.nin) return false;
  const size_t base = stack->size() - nargs;
  const bool inplace = s.mode == kModeInplace;
  if (inplace) {
    const c10::IValue& self = (*stack)[base];
    if (!self.isTensor() || !self.toTensor().defined() || self.toTensor().unsafeGetTensorImpl()->is_wrapped_number() ||
        !cfront_inplace_ok(self.toTensor()))
      return false;
  }
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
    } else if (cfront_number(v, &in[k].v)) {
      in[k].number = true;
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
      double alpha = 0.0;
      if (cfront_number(a, &alpha)) s0 = (float)alpha;
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
    r = ew_record(s.op, s.nin, inplace ? kModeInplace : kModeFunctional, in, nullptr, s0, s.d1, f.threshold);
  } catch (const std::invalid_argument&) {  // outside what GPUOS takes (sched_dispatch: "rejected:<type>", eager)
    return false;
  } catch (const c10::TypeError&) {
    return false;
  } catch (const c10::ValueError&) {
    return false;
  }
  if (r.reason >= 0) return false;  // the dispatch mode below runs the same checks and counts the fallback
  if (inplace) return cfront_inplace_done(nargs, stack), true;
  torch::jit::drop(*stack, nargs);
  stack->emplace_back(std::move(r.out));
  return true;
}

// On to the keys below the front. The calls a kernel (or the dispatch mode's handler) makes inside skip the front
// -- as under the Python key, where a handler's calls never reach it -- unless the op decomposes
// (CompositeImplicitAutograd): its parts are what the front and the mode must see. Without this, each eager op's
// inner calls (a CPU mean's sum and div, ...) paid a pass each: on the CPU machine 1.3-2.0 us per op of the
// Llama-like layers (tools/dispatch_overhead.py), Llama-small ~1,030 passes per step for 231 ops on an H200.
void pass_on(const c10::OperatorHandle& op, const OpKind& k, c10::DispatchKeySet below, torch::jit::Stack* stack) {
  if (k.composite) return op.redispatchBoxed(below, stack);
  c10::impl::ExcludeDispatchKeyGuard no_front(kKey);
  op.redispatchBoxed(below, stack);
}

// The front's work for one op; `cat` says what it did (set before the work: an exception keeps it).
void front(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack, Cat& cat) {
  const c10::DispatchKeySet below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);  // the keys under it
  g_seen.fetch_add(1, std::memory_order_relaxed);
  if (t_frames.empty()) return op.redispatchBoxed(below, stack);
  const OpKind k = kind_of(op);  // a copy
  if (!scheduler_on_top(t_frames.back())) return pass_on(op, k, below, stack);
  cat = k.composite ? kCatComposite : kCatHanded;
  if (!k.fast && !k.nodata && !k.direct && !k.inplace) return pass_on(op, k, below, stack);
  cat = kCatHanded;
  const Frame& f = t_frames.back();
  const size_t nargs = op.schema().arguments().size();
  if (k.inplace) {
    if (cfront_try_native(op, k.native, 0, f.threshold, nargs, stack)) {
      g_native.fetch_add(1, std::memory_order_relaxed);
      cat = kCatNative;
      return;
    }
    return pass_on(op, k, below, stack);
  }
  if (k.direct) {
    if (k.native != CfrontNative::none && cfront_try_native(op, k.native, k.code, f.threshold, nargs, stack)) {
      g_native.fetch_add(1, std::memory_order_relaxed);
      cat = kCatNative;
      return;
    }
    if (g_direct_on.load(std::memory_order_relaxed) && !at::autocast::is_autocast_enabled(at::kCPU) &&
        direct_args(*stack, stack->size() - nargs)) {
      g_direct.fetch_add(1, std::memory_order_relaxed);
      cat = kCatDirect;
      return cfront_call_mode(op, f.mode, stack);
    }
    return pass_on(op, k, below, stack);
  }
  if (k.fast) {
    if (try_record(k.entry, nargs, f, stack)) {
      g_recorded.fetch_add(1, std::memory_order_relaxed);
      cat = kCatRecord;
      return;
    }
    if (cfront_try_int_arith(op, f.threshold, nargs, stack)) {  // integer operands (positions, cache lengths)
      g_native.fetch_add(1, std::memory_order_relaxed);
      cat = kCatNative;
      return;
    }
  } else if (c10::impl::TorchDispatchModeTLS::stack_len() == 1) {
    // Reads no data: below the mode, as sched_dispatch runs it -- unless a tensor argument is not plain (a Python
    // subclass must still see it; a conjugate view's bit must still be resolved by its kernel).
    if (plain_args(*stack, stack->size() - nargs)) {
      g_nodata.fetch_add(1, std::memory_order_relaxed);
      cat = kCatNodata;
      // Out of this call's key set (the mode's Python key is in it: the guard alone would still have sent it to
      // the mode with the mode's state half restored -- PyTorch's internal assert, found by a factory op after a
      // gloo collective) and out of any call it makes.
      c10::impl::ExcludeDispatchKeyGuard no_modes(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, kKey}));
      return op.redispatchBoxed(below.remove(c10::DispatchKey::Python).remove(c10::DispatchKey::PythonTLSSnapshot),
                                stack);
    }
  }
  pass_on(op, k, below, stack);
}

struct PassTimer {  // times one pass (see g_timing); the nested passes' time is taken out of its own
  const c10::OperatorHandle& op;
  Cat cat = kCatPass;
  uint64_t outer = t_nested_ns;
  std::chrono::steady_clock::time_point t0 = (t_nested_ns = 0, std::chrono::steady_clock::now());
  ~PassTimer() {
    const uint64_t all = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - t0).count();
    const uint64_t own = all > t_nested_ns ? all - t_nested_ns : 0;
    t_nested_ns = outer + all;
    g_cat_ns[cat].fetch_add(own, std::memory_order_relaxed);
    g_cat_n[cat].fetch_add(1, std::memory_order_relaxed);
    if (cat == kCatRecord || cat == kCatNodata || cat == kCatPass) return;  // per operator: the rest
    std::lock_guard<std::mutex> lock(g_byop_mu);
    auto [it, fresh] = g_byop.try_emplace(&op.schema());
    if (fresh) it->second.name = c10::toString(op.operator_name());
    it->second.n[cat]++, it->second.ns[cat] += own;
  }
};

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  Cat cat = kCatPass;
  if (!g_timing.load(std::memory_order_relaxed)) return front(op, ks, stack, cat);
  PassTimer timer{op};
  front(op, ks, stack, timer.cat);
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

bool cfront_number(const c10::IValue& v, double* out) {
  if (v.isDouble()) *out = v.toDouble();
  else if (v.isInt()) *out = (double)v.toInt();
  else if (v.isBool()) *out = v.toBool() ? 1.0 : 0.0;
  else return false;
  return true;
}

void cfront_set_fast(const std::vector<std::pair<PyObject*, CallSpec>>& table) {
  std::unordered_map<c10::OperatorName, FastEntry> t;
  for (const auto& [ov, spec] : table) {
    if (spec.mode == kModeOut) continue;  // out=: the dispatch mode (in place: try_record bumps the version)
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

void cfront_set_native(const std::vector<PyObject*>& overloads,
                       const std::vector<std::pair<PyObject*, uint32_t>>& reductions) {
  std::unordered_set<c10::OperatorName> t;
  for (PyObject* ov : overloads)
    if (c10::OperatorName n = name_of(ov); cfront_native_of(n) != CfrontNative::none) t.insert(std::move(n));
  std::unordered_map<c10::OperatorName, uint32_t> r;
  for (const auto& [ov, id] : reductions) r.emplace(name_of(ov), id);
  replace_tables([&](Tables& tb) { tb.native.swap(t), tb.reductions.swap(r); });
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

void cfront_set_direct(bool on) { g_direct_on.store(on); }

void cfront_set_timing(bool on) {
  if (on) {
    for (int c = 0; c < kCats; ++c) g_cat_ns[c] = 0, g_cat_n[c] = 0;
    std::lock_guard<std::mutex> lock(g_byop_mu);
    g_byop.clear();
  }
  g_timing.store(on);
}

py::dict cfront_times() {
  py::dict d, cats, ops;
  for (int c = 0; c < kCats; ++c) cats[kCatNames[c]] = py::make_tuple(g_cat_n[c].load(), g_cat_ns[c].load());
  std::lock_guard<std::mutex> lock(g_byop_mu);
  for (const auto& [schema, t] : g_byop) {
    py::dict per;
    for (int c = 0; c < kCats; ++c)
      if (t.n[c]) per[kCatNames[c]] = py::make_tuple(t.n[c], t.ns[c]);
    ops[py::str(t.name)] = per;
  }
  d["timing"] = g_timing.load();
  d["by_category"] = cats;
  d["by_op"] = ops;
  return d;
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
  d["native"] = g_native.load();
  d["direct_on"] = g_direct_on.load();
  {
    std::lock_guard<std::mutex> lock(g_tables_mu);
    d["fast_ops"] = g_tables->fast.size();
  }
  return d;
}

}  // namespace gpuos
