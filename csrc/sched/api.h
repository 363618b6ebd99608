// csrc/sched/api.h -- the module-level runtime API (gpuos_ext.init / flush / shutdown / stats / pending): it
// spans every device and both recording paths (the scheduler's deferred ops and explicit-API work).
#pragma once
#include <torch/extension.h>

namespace gpuos {

void init(uint32_t capacity, uint32_t threads_per_block, uint32_t worker_blocks, double idle_us);
// Publish everything on each device (stream: a raw cudaStream_t for the current device; None = the current
// stream); sync: also wait (bounded) for completion.
void flush(bool sync, pybind11::object stream);
void shutdown();
pybind11::dict stats();
size_t pending_devices();
pybind11::dict probe_host_memory(size_t n);

}  // namespace gpuos
