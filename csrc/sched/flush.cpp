// csrc/sched/flush.cpp -- when the scheduler's deferred work is published: on request (exit, explicit), before
// an eager op that shares storage with it (dependency), and by the timer (age).
#include "sched/deferred.h"

#include <mutex>
#include <set>

#include "config/config.h"
#include "inject/specialize.h"
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {
namespace {

// Publish the device's pending work: the deferred ops on the stream they were recorded under, else
// explicit-API work on the current stream. mu held. Appends (device, stream published on).
void publish_device(int dev, Runtime& rt, const std::string& cause, py::list& streams) {
  Deferred& D = deferred_of(dev);
  if (!D.ops.empty()) {
    streams.append(py::make_tuple(dev, (uintptr_t)D.stream));
    sched_publish(dev, rt, cause.c_str());
    return;
  }
  if (!rt.has_pending()) return;
  const CUstream s = current_stream(dev);
  streams.append(py::make_tuple(dev, (uintptr_t)s));
  flush_counted(rt, s, cause.c_str());
}

}  // namespace

// this_thread: the devices this thread deferred ops or recorded explicit-API work on (a context's exit / explicit flush: with one thread per
// device, a thread publishes its own device's batch, not another thread's half-recorded one). Else every device.
py::list sched_flush(const std::string& cause, bool this_thread) {
  py::list streams;
  const uint64_t mine = this_thread ? take_thread_devices() : ~0ull;
  int dev = 0;
  try {
    for (; dev < kMaxDevices; ++dev) {
      if (!(mine >> dev & 1)) continue;
      Runtime* rt = runtime_if(dev);
      if (!rt) continue;
      RtLock lk(*rt);
      publish_device(dev, *rt, cause, streams);
    }
  } catch (...) {
    if (this_thread) note_thread_devices(mine & (~0ull << dev));  // still this thread's to publish
    throw;
  }
  return streams;
}

// Before an eager op: publish the deferred ops of a device only if the op's tensors share storage with them
// (it reads their results, or writes what they read or write) or explicit-API work is pending there.
// Independent eager ops run ahead; the deferred batch keeps accumulating (stream order still holds: it is
// published later on the same stream). Returns the streams published on.
static void collect_storages(PyObject* o, std::vector<std::pair<int, const void*>>& out, int depth = 0) {
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

py::list sched_flush_for(py::handle args, py::handle kwargs, const std::string& cause, int yield_worker) {
  std::vector<std::pair<int, const void*>> used;
  collect_storages(args.ptr(), used);
  if (!kwargs.is_none()) collect_storages(kwargs.ptr(), used);
  py::list streams;
  uint64_t devs = 0;  // devices of the op's tensors
  for (auto& u : used)
    if (u.first >= 0 && u.first < kMaxDevices) devs |= 1ull << u.first;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = runtime_if(dev);
    if (!rt || !(devs >> dev & 1)) continue;  // an op with no tensor on `dev` cannot read or write its memory
    const Deferred& D = deferred_of(dev);
    if (D.inflight.load(std::memory_order_acquire) && !D.inflight_untracked) {
      // The timer is publishing without the GIL, mu held: an op that shares no storage with the queue or the ops
      // in flight runs at once instead of waiting for it (ordering only matters between sharers).
      bool touch = false;
      for (auto& u : used)
        touch |= u.first == dev && (u.second == nullptr || D.may_touch((uintptr_t)u.second));
      if (!touch) {
        g_sched.independent_eager++;
        g_sched.inflight_skips++;
        continue;
      }
    }
    RtLock lk(*rt);
    if (D.ops.empty() && !rt->has_pending()) continue;
    // Explicit-API work pending there is not tracked by storage: publish (conservative).
    bool touch = rt->has_pending();
    for (auto& u : used)
      touch |= u.first == dev && (u.second == nullptr || D.touched.touches((uintptr_t)u.second));
    if (!touch) {
      g_sched.independent_eager++;
      continue;
    }
    publish_device(dev, *rt, cause, streams);
  }
  // The op's kernel needs SMs: a heavy one (cuBLAS, cuDNN, an NCCL collective) always, any other while the live
  // window keeps a worker resident on every SM but one. Only its devices' workers go.
  const bool live = yield_worker == kYieldInLiveWindow && live_idle_us() > 0;
  if (yield_worker == kYieldAlways || live)
    for (int dev = 0; dev < kMaxDevices; ++dev)
      if (devs >> dev & 1)
        if (Runtime* rt = runtime_if(dev)) {
          rt->request_yield();
          g_sched.live_yields += live;
        }
  return streams;
}

// The live window: each scheduler context whose flush timer runs holds one while entered (any thread, nested);
// the longest open one applies (core/runtime.h live_idle_us). When the last closes, resident workers are asked to
// leave: a torch.cuda.synchronize() after the context would otherwise wait out the window (DESIGN F3).
namespace {
std::mutex g_live_mu;
std::multiset<double> g_live_windows;
void apply_live_windows() { set_live_idle_us(g_live_windows.empty() ? 0.0 : *g_live_windows.rbegin()); }
}  // namespace

double sched_live_window_open(double us) {
  if (env_config().live_idle_us >= 0) us = env_config().live_idle_us;
  if (!(us > 0)) return 0.0;
  std::lock_guard<std::mutex> g(g_live_mu);
  g_live_windows.insert(us);
  apply_live_windows();
  return us;
}

void sched_live_window_close(double us) {
  if (!(us > 0)) return;
  std::lock_guard<std::mutex> g(g_live_mu);
  const auto it = g_live_windows.find(us);
  if (it == g_live_windows.end()) return;
  g_live_windows.erase(it);
  apply_live_windows();
  if (g_live_windows.empty())
    for (Runtime* rt : runtimes()) rt->request_yield();
}

// Timer: publish deferred ops older than age_s. Returns how many devices were flushed. Emission and publication
// run without the GIL (timer_off_gil(), not during a capture): the recording thread, which waited for the GIL
// through all of it (the fifty-first session's sampler: 700-850 us per step of a small decoder), records on.
int sched_flush_due(double age_s) {
  int n = 0;
  const auto now = std::chrono::steady_clock::now();
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = runtime_if(dev);
    if (!rt) continue;
    RtLock lk(*rt);
    Deferred& D = deferred_of(dev);
    if (D.ops.empty() || std::chrono::duration<double>(now - D.oldest).count() < age_s) continue;
    const bool off = timer_off_gil() && !device_state(dev).capture;
    sched_publish(dev, *rt, "timer", off ? &lk : nullptr);
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
  d["row_groups"] = g_sched.row_groups;
  d["fused_ops"] = g_sched.fused_ops;
  d["independent_eager"] = g_sched.independent_eager;
  d["front_ops"] = g_sched.front_ops;
  d["recycled_outputs"] = g_sched.recycled;
  d["epilogues"] = g_sched.epilogues;
  d["act_epilogues"] = g_sched.act_epilogues;
  d["dual_epilogues"] = g_sched.dual_epilogues;
  d["prologues"] = g_sched.prologues;
  d["copies_folded"] = g_sched.copies_folded;
  d["dead_ops"] = g_sched.dead_ops;
  d["gqa_reads"] = g_sched.gqa_reads;
  d["inflight_skips"] = g_sched.inflight_skips;
  d["live_yields"] = g_sched.live_yields;
  d["live_idle_us"] = live_idle_us();
  py::dict h;  // host time spent publishing deferred ops, in microseconds
  h["analyse_us"] = g_sched.analyse_ns / 1e3;
  h["emit_us"] = g_sched.emit_ns / 1e3;
  h["keep_us"] = g_sched.keep_ns / 1e3;
  h["publish_us"] = g_sched.publish_ns / 1e3;
  d["flush_host_us"] = h;
  d["specializations_requested"] = specializations_requested();
  py::dict c, b, l;
  for (auto& kv : g_sched.by_cause) {
    c[py::str(kv.first)] = kv.second.flushes;
    b[py::str(kv.first)] = kv.second.batches;
    l[py::str(kv.first)] = kv.second.launches;
  }
  d["flushes_by_cause"] = c;
  d["batches_by_cause"] = b;
  d["launches_by_cause"] = l;
  d["deferred"] = deferred_count();
  return d;
}

}  // namespace gpuos
