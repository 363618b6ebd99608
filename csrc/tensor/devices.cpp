// csrc/tensor/devices.cpp -- see devices.h.
#include "tensor/devices.h"

#include "config/config.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace py = pybind11;

namespace gpuos {
namespace {

DeviceState g_dev[kMaxDevices];  // runtimes leaked at exit on purpose: atexit shutdown() releases them
std::mutex g_life;  // g_dev[].rt changes (create / delete) under it: the compile thread's ready hook reads them
Config g_cfg;       // configuration of runtimes created from now on
bool g_cfg_set = false;  // set_runtime_config (gpuos.init) was called: g_cfg holds its arguments
std::function<void(int, Runtime&)> g_before_record;
std::mutex g_keep_mu;  // every device's keep / release / hold lists (devices.h)

void move_keep_to_release(int dev) {
  DeviceState& d = g_dev[dev];
  std::lock_guard<std::mutex> g(g_keep_mu);
  if (d.capture) {  // a capture keeps them (its program's tape points at them)
    d.hold.insert(d.hold.end(), d.keep.begin(), d.keep.end());
    d.keep.clear();
    for (auto& t : d.keep_t) d.hold_t.push_back(std::move(t));
    d.keep_t.clear();
    return;
  }
  d.release.insert(d.release.end(), d.keep.begin(), d.keep.end());
  d.keep.clear();
  for (auto& t : d.keep_t) d.release_t.push_back(std::move(t));
  d.keep_t.clear();
}

}  // namespace

DeviceState& device_state(int dev) { return g_dev[dev]; }
Runtime* runtime_if(int dev) { return dev >= 0 && dev < kMaxDevices ? g_dev[dev].rt : nullptr; }
Config env_runtime_config() {
  if (runtimes().empty()) reload_env_config();  // read afresh while no runtime runs
  return config_from_env();
}

void set_runtime_config(const Config& cfg) {
  g_cfg = cfg;
  g_cfg_set = true;
}

Runtime& runtime_for(int dev) {
  if (dev < 0 || dev >= kMaxDevices)
    throw std::invalid_argument("gpuos: CUDA device index " + std::to_string(dev) + " out of range");
  if (!g_dev[dev].rt && !g_dev[dev].abandoned.empty())
    throw CudaError("gpuos: cannot start a runtime on cuda:" + std::to_string(dev) + ": " + g_dev[dev].abandoned +
                    " Its worker may still occupy the GPU, and module loads and allocations in this CUDA context "
                    "can wait for it without bound. Restart the process.");
  if (!g_dev[dev].rt) {
    // Created on first use (an op or submit without gpuos.init()): the environment's settings, as init() reads
    // them -- not the bare defaults, which ignored every GPUOS_* variable.
    if (!g_cfg_set) g_cfg = env_runtime_config();
    auto* rt = new Runtime(dev, g_cfg, [dev] { return current_stream(dev); });
    rt->set_publish_hook([dev] { move_keep_to_release(dev); });
    std::lock_guard<std::mutex> life(g_life);
    g_dev[dev].rt = rt;
  }
  return *g_dev[dev].rt;
}

std::vector<Runtime*> runtimes() {
  std::vector<Runtime*> v;
  for (auto& d : g_dev)
    if (d.rt) v.push_back(d.rt);
  return v;
}

void delete_runtime(int dev) {
  Runtime* rt = g_dev[dev].rt;
  release_keep(dev);
  {
    std::lock_guard<std::mutex> life(g_life);
    g_dev[dev].rt = nullptr;
  }
  delete rt;
}

void abandon_runtime(int dev, const std::string& why) {
  DeviceState& d = g_dev[dev];
  d.abandoned = "the previous runtime was abandoned after its shutdown failed (" + why + ").";
  static std::vector<DeviceState>* graveyard = new std::vector<DeviceState>();  // never freed, by design
  DeviceState dead;
  dead.rt = d.rt;
  {
    std::lock_guard<std::mutex> g(g_keep_mu);
    dead.keep.swap(d.keep);
    dead.keep_t.swap(d.keep_t);
  }
  graveyard->push_back(std::move(dead));
  std::lock_guard<std::mutex> life(g_life);
  d.rt = nullptr;
}

int current_device() { return py::module_::import("torch").attr("cuda").attr("current_device")().cast<int>(); }

// Through c10's device guard interface: no Python call, no CUDA headers (the CUDA guard is registered when
// torch loads its CUDA library). A call of torch._C._cuda_getCurrentRawStream cost ~0.4 us per recorded op.
CUstream current_stream(int dev) {
  static const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream st = impl->getStream(c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)dev));
  return reinterpret_cast<CUstream>(st.native_handle());
}

void set_before_record_hook(std::function<void(int, Runtime&)> hook) { g_before_record = std::move(hook); }
void before_record(int dev, Runtime& rt) {
  if (g_before_record) g_before_record(dev, rt);
}

void keep_object(int dev, PyObject* o) {
  Py_INCREF(o);
  std::lock_guard<std::mutex> g(g_keep_mu);
  g_dev[dev].keep.push_back(o);
}
void keep_tensor(int dev, at::Tensor&& t) {
  std::lock_guard<std::mutex> g(g_keep_mu);
  g_dev[dev].keep_t.push_back(std::move(t));
}
void release_tensor(int dev, at::Tensor&& t) {
  std::lock_guard<std::mutex> g(g_keep_mu);
  g_dev[dev].release_t.push_back(std::move(t));
}

// The lists are taken under g_keep_mu and dropped outside it (a dealloc can run Python, which may publish).
void drain_release() {
  std::vector<PyObject*> objs;
  std::vector<at::Tensor> ts;
  for (auto& d : g_dev) {
    {
      std::lock_guard<std::mutex> g(g_keep_mu);
      if (d.release.empty() && d.release_t.empty()) continue;
      objs.swap(d.release);
      ts.swap(d.release_t);
    }
    for (PyObject* o : objs) Py_DECREF(o);
    objs.clear();
    ts.clear();
  }
}

void release_held(DeviceState& d) {
  std::lock_guard<std::mutex> g(g_keep_mu);
  d.release.insert(d.release.end(), d.hold.begin(), d.hold.end());
  d.hold.clear();
  for (auto& t : d.hold_t) d.release_t.push_back(std::move(t));
  d.hold_t.clear();
}

void release_keep(int dev) {
  move_keep_to_release(dev);
  drain_release();
}

std::atomic<uint64_t> g_rt_lock_waits{0}, g_rt_lock_wait_ns{0};

RtLock::RtLock(Runtime& rt) : lk(rt.mu, std::try_to_lock) {
  if (!lk.owns_lock()) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      py::gil_scoped_release nogil;
      lk.lock();
    }
    g_rt_lock_waits.fetch_add(1, std::memory_order_relaxed);
    g_rt_lock_wait_ns.fetch_add(
        (uint64_t)std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count(), std::memory_order_relaxed);
  }
}

void apply_alias_everywhere(uint32_t need, const uint8_t table[256]) {
  for (Runtime* rt : runtimes()) {
    std::lock_guard<std::mutex> lk(rt->mu);
    rt->ensure_generation(need);
    rt->set_alias_table(table);
  }
}

void adopt_generation_everywhere() {
  std::lock_guard<std::mutex> life(g_life);
  for (auto& d : g_dev)
    if (d.rt) d.rt->adopt_generation_if_idle();
}

}  // namespace gpuos
