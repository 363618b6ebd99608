// csrc/sched/api.cpp -- see api.h.
#include "sched/api.h"

#include <chrono>

#include "config/config.h"
#include "inject/linked.h"
#include "jit/jit.h"
#include "jit/link.h"
#include "sched/deferred.h"
#include "sched/outpool.h"

namespace py = pybind11;

namespace gpuos {

void init(uint32_t capacity, uint32_t threads_per_block, uint32_t worker_blocks, double idle_us) {
  driver();  // a clear CudaError on machines without a driver / GPU
  const int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices) throw std::invalid_argument("gpuos.init: bad device index");
  if (Runtime* rt = runtime_if(dev)) {  // idempotent for the same settings; a different ring is an error
    const Config& c = rt->config();
    if ((capacity && c.capacity != capacity) || (threads_per_block && c.threads_per_block != threads_per_block))
      throw std::invalid_argument(
          "gpuos.init(capacity=" + std::to_string(capacity) + ", threads_per_block=" +
          std::to_string(threads_per_block) + "): the runtime on cuda:" + std::to_string(dev) +
          " already runs with capacity=" + std::to_string(c.capacity) + ", threads_per_block=" +
          std::to_string(c.threads_per_block) + ". Fix: call gpuos.shutdown() first, or pass the same values.");
    return;
  }
  Config cfg = env_runtime_config();  // the environment's settings (config/config.h); arguments below win
  cfg.capacity = capacity ? capacity : 4096;
  cfg.threads_per_block = threads_per_block ? threads_per_block : 256;
  if (worker_blocks) cfg.worker_blocks = worker_blocks;
  if (env_config().idle_us < 0) cfg.idle_us = idle_us;
  set_runtime_config(cfg);
  runtime_for(dev);
}

// Per device, never across devices: `device` >= 0 (or a `stream`, which belongs to `device`, else to the current
// device) flushes that device alone, on `stream` or the calling thread's current stream of that device; with
// neither, every device with pending work is flushed, each on the calling thread's current stream of that device.
// The scheduler's deferred ops go out on the stream they were recorded under; when that is not the target stream
// it is returned as (device, stream), and gpuos.flush makes the target wait for it (an event: no host sync).
// sync waits (bounded) for the flushed devices only.
py::list flush(bool sync, py::object stream, int device) {
  if (device >= kMaxDevices || device < -1)
    throw std::invalid_argument("gpuos.flush(device=" + std::to_string(device) + "): not a CUDA device index (0.." +
                                std::to_string(kMaxDevices - 1) + ", or None for every device)");
  if (!stream.is_none() && device < 0) device = current_device();  // a raw stream: the current device's
  const CUstream given = stream.is_none() ? nullptr : reinterpret_cast<CUstream>(stream.cast<uintptr_t>());
  py::list others;
  std::vector<std::pair<Runtime*, uint32_t>> waits;
  const int lo = device < 0 ? 0 : device, hi = device < 0 ? kMaxDevices : device + 1;
  for (int dev = lo; dev < hi; ++dev) {
    Runtime* rt = runtime_if(dev);
    if (!rt) continue;
    const CUstream target = given ? given : current_stream(dev);
    uint32_t seq = 0;
    {
      RtLock lk(*rt);
      Deferred& D = deferred_of(dev);
      if (!D.ops.empty()) {
        const CUstream ds = D.stream;
        sched_publish(dev, *rt, "explicit");
        if (ds != target) others.append(py::make_tuple(dev, (uintptr_t)ds));
      }
      if (rt->has_pending()) seq = rt->flush(target);
    }
    waits.emplace_back(rt, seq);
  }
  forget_thread_devices(device < 0 ? ~0ull : 1ull << device);
  if (sync) {
    py::gil_scoped_release nogil;
    for (auto& w : waits) w.first->wait_done(w.second);
  }
  return others;
}

// Every device is shut down even if one fails; the first failure is raised at the end. A runtime whose work
// did not finish (a timeout) is abandoned, not freed -- the GPU may still use its memory -- so init() can start
// a fresh one.
void shutdown() {
  std::exception_ptr first;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = runtime_if(dev);
    if (!rt) continue;
    CUstream s = current_stream(dev);
    std::string failed;
    {
      RtLock lk(*rt);
      try {
        sched_publish(dev, *rt, "exit");
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      try {
        rt->shutdown(s);
      } catch (const std::exception& e) {
        if (!first) first = std::current_exception();
        failed = e.what();
      }
    }
    deferred_of(dev).ops.clear();
    pool_clear(dev);
    if (failed.empty()) delete_runtime(dev);
    else abandon_runtime(dev, failed);
  }
  if (first) std::rethrow_exception(first);
}

py::dict stats() {
  RuntimeStats s;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    Runtime* rt = runtime_if(dev);
    if (!rt) continue;
    s += rt->stats();
  }
  JitStats j = jit_stats();
  py::dict d;
#define GPUOS_STAT_ITEM(name) d[#name] = s.name;
  GPUOS_RUNTIME_STATS(GPUOS_STAT_ITEM)
#undef GPUOS_STAT_ITEM
  d["lock_waits"] = g_rt_lock_waits.load();  // a runtime's lock found held (RtLock), and the ns waited for it
  d["lock_wait_ns"] = g_rt_lock_wait_ns.load();
  d["jit_compiles"] = j.compiles;
  d["cache_hits"] = j.cache_hits;
  d["disk_cache_hits"] = j.disk_hits;
  d["jit_cache_evictions"] = j.evictions;  // files the disk cache's bound removed (GPUOS_CACHE_MAX_MB)
  d["object_compiles"] = j.object_compiles;  // relocatable objects among jit_compiles (linked generations)
  const LinkedGenStats lg = linked_gen_stats();
  d["linked_generations"] = lg.linked;       // generations built by linking cached objects (issue #18)
  d["whole_generations"] = lg.whole;         // ... by a whole NVRTC compile
  d["cached_whole_generations"] = lg.cached_whole;  // ... from an earlier whole build's image (inject/whole.h)
  d["link_mode"] = link_mode().linked ? "linked" : "whole";  // how the next generation is built (link_info())
  return d;
}

size_t pending_devices() {
  size_t n = 0;
  for (int dev = 0; dev < kMaxDevices; ++dev)
    if (Runtime* rt = runtime_if(dev)) {
      RtLock lk(*rt);  // (the timer may be publishing without the GIL)
      n += rt->has_pending() || !deferred_of(dev).ops.empty() ? 1 : 0;
    }
  return n;
}

// Diagnostics: ns per 64-byte descriptor write into pinned (cuMemHostAlloc) vs pageable memory, and per
// read of a word the GPU may write. Used to explain record-path costs on a given host.
py::dict probe_host_memory(size_t n) {
  const Driver& d = driver();
  runtime_for(current_device());  // a context on the current device
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

}  // namespace gpuos
