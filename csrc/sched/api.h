// csrc/sched/api.h -- the module-level runtime API (gpuos_ext.init / flush / shutdown / stats / pending): it
// spans every device and both recording paths (the scheduler's deferred ops and explicit-API work).
#pragma once
#include <torch/extension.h>

namespace gpuos {

void init(uint32_t capacity, uint32_t threads_per_block, uint32_t worker_blocks, double idle_us);
// Publish pending work of one device (device >= 0, or the device of a raw `stream`; None = the calling thread's
// current stream there) or of every device; sync: also wait (bounded) for those devices. Returns the (device,
// stream) pairs deferred scheduler work went out on when that is not the target stream (see api.cpp).
pybind11::list flush(bool sync, pybind11::object stream, int device);
void shutdown();
pybind11::dict stats();
size_t pending_devices();
pybind11::dict probe_host_memory(size_t n);

}  // namespace gpuos
