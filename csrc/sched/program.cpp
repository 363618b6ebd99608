// csrc/sched/program.cpp -- see program.h.
#include "sched/program.h"

#include <algorithm>
#include <chrono>
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
      release_held(ds);
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

// Stage [b, e) of c's tape with pointers moved by r, publish it (see tape_replay).
static void replay_range(CapturedTape& c, size_t b, size_t e, const Reloc& r) {
  if (b >= e) return;
  Runtime& rt = device_runtime(c.dev, "Program");
  RtLock lk(rt);
  if (device_state(c.dev).capture)
    throw std::runtime_error("gpuos: a program was called while another capture runs on cuda:" +
                             std::to_string(c.dev) + ". Fix: call captured programs outside gpuos.capture().");
  if (!deferred_of(c.dev).ops.empty()) sched_publish(c.dev, rt, "program");
  Runtime::ProgramLaunches launches(rt);
  if (tape_images()) {
    auto it = c.images.find({b, e});
    if (it == c.images.end()) {  // first replay of the range: its image, resident on the device
      CapturedTape::Image img;
      const MmSpread spread = rt.mm_spread();
      img.im = stage_image(c.tape, b, e, std::max<uint32_t>(1, rt.config().capacity / 2), &spread);
      // On the replay's stream: the caching allocator orders a reuse of the memory after the replays.
      img.resident = at::empty({(int64_t)img.im.resident_bytes()},
                               at::TensorOptions().dtype(at::kByte).device(at::kCUDA, (c10::DeviceIndex)c.dev));
      rt.prepare_image(img.im, (uint64_t)(uintptr_t)img.resident.data_ptr());
      it = c.images.emplace(std::make_pair(b, e), std::move(img)).first;
    }
    rt.replay_image(it->second.im, r);
  } else {
    rt.replay(c.tape, b, e, r);
  }
  flush_counted(rt, current_stream(c.dev), "program");
}

void tape_replay(CapturedTape& c, size_t b, size_t e, const std::vector<std::tuple<uint64_t, uint64_t, int64_t>>& rel) {
  Reloc r;
  for (const auto& x : rel) r.add(std::get<0>(x), std::get<1>(x), std::get<2>(x));
  replay_range(c, b, e, r);
}

pybind11::object ProgramCall::call(const pybind11::args& args) {
  namespace py = pybind11;
  if (args.size() != ins.size()) return py::none();
  const int dev = tape->dev;
  struct Timed {  // program_call_ns: the whole C++ call (guards to outputs) of a call that ran
    int dev;
    bool ran = false;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Timed() {
      Runtime* rt = ran ? runtime_if(dev) : nullptr;
      if (!rt) return;
      const uint64_t ns = (uint64_t)std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count();
      RtLock lk(*rt);
      rt->note_call_ns(ns);
    }
  } timed{dev};
  std::vector<at::Tensor> xs(ins.size());
  Reloc r;
  for (size_t i = 0; i < ins.size(); ++i) {
    PyObject* o = args[i].ptr();
    if (!THPVariable_Check(o)) return py::none();
    at::Tensor& x = xs[i];
    x = THPVariable_Unpack(o);
    const In& g = ins[i];
    if (!x.is_cuda() || x.get_device() != dev || x.scalar_type() != g.dtype || x.sizes() != at::IntArrayRef(g.sizes) ||
        x.strides() != at::IntArrayRef(g.strides))
      return py::none();
    const uint64_t p = (uint64_t)(uintptr_t)x.data_ptr();
    if ((p & 15) != g.mod16) return py::none();
    r.add(g.lo, g.hi, (int64_t)(p - g.lo));
  }
  if (ins.size() > 1) {  // the capture's inputs did not overlap (else no fast path): neither may these
    std::vector<std::pair<uint64_t, uint64_t>> sp;
    for (size_t i = 0; i < ins.size(); ++i) {
      const uint64_t p = (uint64_t)(uintptr_t)xs[i].data_ptr();
      if (ins[i].hi > ins[i].lo) sp.emplace_back(p, p + (ins[i].hi - ins[i].lo));
    }
    std::sort(sp.begin(), sp.end());
    for (size_t i = 1; i < sp.size(); ++i)
      if (sp[i].first < sp[i - 1].second) return py::none();
  }
  std::vector<at::Tensor> fb(fresh.size());
  const at::TensorOptions opt = at::TensorOptions().device(at::Device(at::kCUDA, (c10::DeviceIndex)dev));
  for (size_t k = 0; k < fresh.size(); ++k) {
    const Fresh& f = fresh[k];
    fb[k] = f.direct ? at::empty_strided(f.sizes, f.strides, opt.dtype(f.dtype))
                     : at::empty({(int64_t)(f.hi - f.lo)}, opt.dtype(at::kByte));
    r.add(f.lo, f.hi, (int64_t)((uint64_t)(uintptr_t)fb[k].data_ptr() - f.lo));
  }
  replay_range(*tape, b, e, r);
  timed.ran = true;
  auto view = [&](const Out& o, const at::Tensor& base, int64_t delta) {
    const uint64_t p = o.ptr + (uint64_t)delta, st = (uint64_t)(uintptr_t)base.storage().data();
    const int64_t es = (int64_t)c10::elementSize(o.dtype);
    return at::empty({0}, opt.dtype(o.dtype)).set_(base.storage(), (int64_t)(p - st) / es, o.sizes, o.strides);
  };
  py::tuple res(outs.size());
  for (size_t k = 0; k < outs.size(); ++k) {
    const Out& o = outs[k];
    if (o.kind == 0) res[k] = o.value;
    else if (o.kind == 2) res[k] = py::cast(fb[(size_t)o.idx]);
    else if (o.kind == 1) {
      const at::Tensor& x = xs[(size_t)o.idx];
      res[k] = py::cast(view(o, x, (int64_t)((uint64_t)(uintptr_t)x.data_ptr() - ins[(size_t)o.idx].lo)));
    } else {
      const at::Tensor& x = fb[(size_t)o.idx];
      res[k] = py::cast(view(o, x, (int64_t)((uint64_t)(uintptr_t)x.data_ptr() - fresh[(size_t)o.idx].lo)));
    }
  }
  if (single) return res[0];
  return std::move(res);
}

}  // namespace gpuos
