// csrc/tensor/devices.h -- the per-device state of the process: each device's runtime and the references that
// keep the tensors of its unpublished work alive. The one place that creates, finds and deletes runtimes.
//
// Lock discipline (GIL vs Runtime::mu): a thread never waits for mu while holding the GIL (RtLock releases it
// while waiting), and code holding mu never runs Python that could hand the GIL to another thread. So
// keep-alive references are not dropped under mu (a tensor's dealloc can run arbitrary Python, e.g. GC):
// publication moves them to the release lists, and RtLock's destructor drops them after mu is released.
// The keep / release / hold lists have a lock of their own (devices.cpp g_keep_mu): the flush timer publishes
// without the GIL (sched/flush.cpp sched_flush_due), so the publish hook moves them while another thread, holding
// the GIL, drains or appends.
#pragma once
#include <torch/extension.h>

#include <atomic>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <vector>

#include "core/runtime.h"

namespace gpuos {

constexpr int kMaxDevices = 64;

struct DeviceState {
  Runtime* rt = nullptr;                    // null until first use on the device
  std::vector<PyObject*> keep, release;     // strong refs (GIL held) of recorded work: unpublished / published
  std::vector<at::Tensor> keep_t, release_t;  // the same, for tensors the scheduler's lowering recorded
  std::string abandoned;                    // why this device's runtime was abandoned (empty: it was not)
  // A program capture on this device (issue #17, sched/program.cpp): while set, published work's keep-alive
  // references move here instead of to the release lists (a captured program keeps every storage its tape
  // points at), and the scheduler notes the byte ranges of the outputs it allocated (`fresh`).
  Tape* capture = nullptr;
  std::vector<PyObject*> hold;
  std::vector<at::Tensor> hold_t;
  std::vector<std::pair<uint64_t, uint64_t>> fresh;  // [lo, hi) of storages allocated during the capture
};

// The device's state (0 <= dev < kMaxDevices).
DeviceState& device_state(int dev);
Runtime* runtime_if(int dev);     // the device's runtime, or null
Runtime& runtime_for(int dev);    // created on first use: set_runtime_config's configuration, else the environment's
std::vector<Runtime*> runtimes();  // every live runtime
void set_runtime_config(const Config& cfg);
// Defaults with the environment's GPUOS_* settings, the environment read afresh while no runtime runs (init() and
// a runtime created on first use).
Config env_runtime_config();
// Delete the device's runtime (after Runtime::shutdown); its keep-alive references are released.
void delete_runtime(int dev);
// Unregister a runtime whose shutdown failed (a worker that did not finish in time may still read its memory
// and the tensors it kept): the runtime and those references are leaked. The device gets no new runtime in this
// process (runtime_for raises CudaError with `why`): a stuck kernel in the context can make module loads and
// allocations wait without bound.
void abandon_runtime(int dev, const std::string& why);

int current_device();               // torch.cuda.current_device()
CUstream current_stream(int dev);   // the caller's current stream on `dev`, without a Python call

// Called under the runtime's lock before the explicit API records on `dev`: the scheduler lowers its deferred
// work there first, so that recording order is kept (set once by the scheduler layer).
void set_before_record_hook(std::function<void(int dev, Runtime& rt)> hook);
void before_record(int dev, Runtime& rt);

// Keep-alive references (GIL held).
void keep_object(int dev, PyObject* o);  // new strong reference
void keep_tensor(int dev, at::Tensor&& t);
void release_tensor(int dev, at::Tensor&& t);  // a reference of work already published: dropped by drain_release
// Run `record` (it stages sub-ops reading / writing `objs`), then keep `objs` alive until publication. Kept
// after recording, not before: a ring-full flush inside the recording releases what is kept at that moment,
// while the rest of this op's tiles are still unpublished. Kept also when recording throws: the tiles staged
// before the failure still point at them. Null entries are skipped.
template <class Record>
void record_keeping(int dev, std::initializer_list<PyObject*> objs, Record&& record) {
  try {
    record();
  } catch (...) {
    for (PyObject* o : objs)
      if (o) keep_object(dev, o);
    throw;
  }
  for (PyObject* o : objs)
    if (o) keep_object(dev, o);
}
void release_keep(int dev);  // everything kept on `dev` goes now (after shutdown)
void release_held(DeviceState& d);  // a failed capture's references join the release lists
void drain_release();        // drop references whose work is published (never under a runtime's lock)

// Times a runtime's lock was found held (by the timer's flush, another thread's record) and the host ns waited.
extern std::atomic<uint64_t> g_rt_lock_waits, g_rt_lock_wait_ns;

// Holds a runtime's lock for a binding call (waiting without the GIL); drops released references after.
// While it is held, torch calls made under the lock (allocating outputs, the output pool) skip Python
// dispatch: an active TorchDispatchMode would otherwise re-enter the scheduler on this thread, which would
// wait for the lock this thread holds.
struct RtLock {
  c10::impl::ExcludeDispatchKeyGuard no_python{
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot})};
  std::unique_lock<std::mutex> lk;
  explicit RtLock(Runtime& rt);
  ~RtLock() {
    if (lk.owns_lock()) lk.unlock();
    drain_release();
  }
};

// Switch the alias table of every runtime (inject/registry.h ApplyAlias).
void apply_alias_everywhere(uint32_t need, const uint8_t table[256]);
// Hand a newly ready generation to every idle runtime (the registry's ready hook).
void adopt_generation_everywhere();

}  // namespace gpuos
