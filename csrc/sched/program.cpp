// csrc/sched/program.cpp -- see program.h.
#include "sched/program.h"

#include <set>
#include <stdexcept>

#include "sched/deferred.h"
#include "tensor/devices.h"
#include "tensor/errors.h"

namespace gpuos {

CapturedTape::~CapturedTape() {
  if (hold.empty()) return;
  if (Py_IsInitialized()) {
    pybind11::gil_scoped_acquire gil;
    for (PyObject* o : hold) Py_DECREF(o);
  }
}

uint64_t CapturedTape::held_bytes() const {
  std::set<const void*> seen;
  uint64_t n = 0;
  for (const at::Tensor& t : hold_t) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) n += (uint64_t)t.storage().nbytes();
  }
  return n;
}

static Runtime& device_runtime(int dev, const char* what) {
  Runtime* rt = runtime_if(dev);
  if (!rt)
    throw std::invalid_argument(std::string("gpuos.") + what + ": no GPUOS runtime on cuda:" + std::to_string(dev) +
                                ". Fix: call gpuos.init() (or enter gpuos.scheduler_context()) on that device first.");
  return *rt;
}

bool capturing(int dev) { return dev >= 0 && dev < kMaxDevices && device_state(dev).capture != nullptr; }

void capture_begin(int dev) {
  Runtime& rt = device_runtime(dev, "capture");
  RtLock lk(rt);
  DeviceState& ds = device_state(dev);
  if (ds.capture)
    throw std::runtime_error("gpuos.capture: a capture is already running on cuda:" + std::to_string(dev) +
                             " (captures do not nest). Fix: capture the outer function only.");
  if (!deferred_of(dev).ops.empty()) sched_publish(dev, rt, "capture");
  if (rt.has_pending()) flush_counted(rt, current_stream(dev), "capture");
  ds.capture = new Tape();
  rt.set_tape(ds.capture);
}

size_t capture_mark(int dev) {
  Runtime& rt = device_runtime(dev, "capture");
  RtLock lk(rt);
  const DeviceState& ds = device_state(dev);
  return ds.capture ? ds.capture->entries.size() : 0;
}

std::vector<std::pair<uint64_t, uint64_t>> capture_fresh(int dev) {
  Runtime& rt = device_runtime(dev, "capture");
  RtLock lk(rt);
  return device_state(dev).fresh;
}

std::shared_ptr<CapturedTape> capture_end(int dev) {
  Runtime& rt = device_runtime(dev, "capture");
  auto c = std::make_shared<CapturedTape>();
  c->dev = dev;
  RtLock lk(rt);
  DeviceState& ds = device_state(dev);
  if (!ds.capture) throw std::logic_error("gpuos internal error: capture_end without capture_begin");
  struct Detach {
    Runtime& rt;
    DeviceState& ds;
    ~Detach() {  // on failure, what the capture held is released like any published work's references
      rt.set_tape(nullptr);
      ds.release.insert(ds.release.end(), ds.hold.begin(), ds.hold.end());
      ds.hold.clear();
      for (auto& t : ds.hold_t) ds.release_t.push_back(std::move(t));
      ds.hold_t.clear();
      ds.fresh.clear();
      delete ds.capture;
      ds.capture = nullptr;
    }
  } detach{rt, ds};
  if (!deferred_of(dev).ops.empty()) sched_publish(dev, rt, "capture");  // still taped
  if (rt.has_pending()) flush_counted(rt, current_stream(dev), "capture");
  c->tape = std::move(*ds.capture);
  c->hold.swap(ds.hold);
  c->hold_t.swap(ds.hold_t);
  c->fresh.swap(ds.fresh);
  return c;
}

void tape_replay(CapturedTape& c, size_t b, size_t e, const std::vector<std::tuple<uint64_t, uint64_t, int64_t>>& rel) {
  if (b >= e) return;
  Runtime& rt = device_runtime(c.dev, "Program");
  RtLock lk(rt);
  if (device_state(c.dev).capture)
    throw std::runtime_error("gpuos: a program was called while another capture runs on cuda:" +
                             std::to_string(c.dev) + ". Fix: call captured programs outside gpuos.capture().");
  if (!deferred_of(c.dev).ops.empty()) sched_publish(c.dev, rt, "program");
  Reloc r;
  for (const auto& x : rel) r.add(std::get<0>(x), std::get<1>(x), std::get<2>(x));
  rt.replay(c.tape, b, e, r);
  flush_counted(rt, current_stream(c.dev), "program");
}

}  // namespace gpuos
