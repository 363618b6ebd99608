// csrc/core/runtime.cpp -- runtime setup and teardown of one device (see runtime.h for the other files).
#include "core/runtime.h"

#include <algorithm>
#include <cstring>

#include "config/config.h"
#include "driver/wait.h"
#include "inject/registry.h"

namespace gpuos {

Config config_from_env() {
  const EnvConfig& e = env_config();
  Config c;
  c.worker_blocks = e.worker_blocks;
  if (e.idle_us >= 0) c.idle_us = e.idle_us;
  c.program_idle_us = e.program_idle_us;
  c.burst_min = e.burst_min;
  c.burst_blocks = e.burst_blocks;
  c.publish_min = e.publish_min;
  c.join_levels = e.join_levels;
  c.timeout_s = e.timeout_s;
  c.trace_records = e.trace_records;
  c.dma_min = e.dma_min;
  c.dma_levels = e.dma_levels;
  c.mm_items = e.mm_items;
  c.mm_items_live = e.mm_items_live ? e.mm_items_live : e.mm_items;
  c.mm_spread = e.mm_spread;
  c.attn_min_rows = e.attn_min_rows;
  c.local_combine = e.local_combine;
  c.home_levels = e.home_levels;
  c.handover_queue = e.handover_queue;
  c.kicks = e.kicks;
  c.kick_alone = e.kick_alone;
  c.kick_wait = e.kick_wait;
  return c;
}

// ------------------------------------------------------------------ setup / teardown
Runtime::Runtime(int device, const Config& cfg, StreamFn stream_fn)
    : device_(device), cfg_(cfg), stream_fn_(std::move(stream_fn)) {
  const Driver& d = driver();
  int count = 0;
  GPUOS_CU(d.cuDeviceGetCount(&count));
  if (device < 0 || device >= count)
    throw CudaError("gpuos.init: CUDA device " + std::to_string(device) + " does not exist (" +
                    std::to_string(count) + " visible)");
  GPUOS_CU(d.cuDeviceGet(&cu_dev_, device));
  GPUOS_CU(d.cuDevicePrimaryCtxRetain(&ctx_, cu_dev_));
  make_current();
  char name[256] = {0};
  GPUOS_CU(d.cuDeviceGetName(name, sizeof name, cu_dev_));
  name_ = name;
  GPUOS_CU(d.cuDeviceGetAttribute(&sms_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cu_dev_));
  GPUOS_CU(d.cuDeviceGetAttribute(&cc_major_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu_dev_));
  GPUOS_CU(d.cuDeviceGetAttribute(&cc_minor_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu_dev_));
  int memops64 = 0;
  GPUOS_CU(d.cuDeviceGetAttribute(&memops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, cu_dev_));
  if (!memops64)
    throw CudaError("gpuos.init: " + name_ + " does not support 64-bit CUDA stream memory operations "
                    "(cuStreamBatchMemOp with WRITE_VALUE_64), which GPUOS uses to publish batches in stream order");
  if (cfg_.threads_per_block < 32 || cfg_.threads_per_block > kMaxThreads || cfg_.threads_per_block % 32)
    throw std::invalid_argument("gpuos.init: threads_per_block=" + std::to_string(cfg_.threads_per_block) +
                                " must be a multiple of 32 in [32, " + std::to_string(kMaxThreads) +
                                "] (the worker is compiled for at most " + std::to_string(kMaxThreads) +
                                " threads per block; one block runs per SM)");
  if (cfg_.capacity < 64 || cfg_.capacity > (1u << 26))
    throw std::invalid_argument("gpuos.init: capacity=" + std::to_string(cfg_.capacity) +
                                " must be in [64, 67108864]");
  grid_ = cfg_.worker_blocks ? cfg_.worker_blocks : (uint32_t)std::max(1, sms_ / 4);
  grid_ = std::min<uint32_t>(grid_, (uint32_t)sms_);
  // The burst grid holds at most kWorkerBlocksPerSm blocks per SM (one since the worker takes 255 registers:
  // device_src/config.h), and every register of each SM it runs on; it still shrinks to the bounded grid when
  // stuck behind stream work (DevCtl::shrink). (At 128 registers, 2 x SMs ran 16 independent decode attentions in
  // one level 1.4x faster on an H200 and one attention per level 9-14 % slower: DEVELOPING, Next on the GPU 4.)
  burst_grid_ = std::max(grid_, std::min<uint32_t>(cfg_.burst_blocks ? cfg_.burst_blocks : (uint32_t)sms_,
                                                   (uint32_t)sms_ * kWorkerBlocksPerSm));
  // Kicks: one SM stays free of the burst grid, so that a kick (one worker block on the publishing stream) starts
  // beside a worker on it instead of waiting for its idle exit.
  if (cfg_.kicks && sms_ > 1) burst_grid_ = std::max(grid_, std::min<uint32_t>(burst_grid_, (uint32_t)sms_ - 1));

  // Module: worker + every op, one generation (a device function pointer is valid only inside its module): the
  // newest ready one (inject/registry.h). Loaded before any worker runs: a module load waits for resident kernels.
  const std::string image = gen_startup_image();
  GPUOS_CU(d.cuModuleLoadData(&module_, image.data()));
  GPUOS_CU(d.cuModuleGetFunction(&worker_fn_, module_, "gpuos_worker"));
  fit_stack(worker_fn_);
  GPUOS_CU(d.cuStreamCreate(&side_, CU_STREAM_NON_BLOCKING));
  int loading = 0;  // CU_MODULE_EAGER_LOADING = 1, CU_MODULE_LAZY_LOADING = 2
  GPUOS_CU(d.cuModuleGetLoadingMode(&loading));
  lazy_loading_ = loading == 2;

  // Queue memory: independent of any module (a handover relaunches a new module's worker on the same queue).
  const unsigned hflags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
  void* p = nullptr;
  GPUOS_CU(d.cuMemHostAlloc(&p, sizeof(HostCtl), hflags));
  hc_ = (HostCtl*)p;
  std::memset((void*)hc_, 0, sizeof(HostCtl));
  hc_->worker_state = kWorkerExiting;
  GPUOS_CU(d.cuMemHostGetDevicePointer(&hc_d_, p, 0));
  GPUOS_CU(d.cuMemHostAlloc(&p, sizeof(SubOp) * (size_t)cfg_.capacity, hflags));
  ring_ = (SubOp*)p;
  GPUOS_CU(d.cuMemHostGetDevicePointer(&ring_d_, p, 0));
  ref_capacity_ = std::max<uint32_t>(256, cfg_.capacity / 2);
  GPUOS_CU(d.cuMemHostAlloc(&p, sizeof(TensorRef) * (size_t)ref_capacity_, hflags));
  refs_ = (TensorRef*)p;
  GPUOS_CU(d.cuMemHostGetDevicePointer(&refs_d_, p, 0));
  if (cfg_.trace_records) {
    const size_t bytes = sizeof(TraceBuf) + sizeof(TraceRec) * (size_t)kTraceRegions * cfg_.trace_records;
    GPUOS_CU(d.cuMemHostAlloc(&p, bytes, hflags));
    trace_ = (TraceBuf*)p;
    std::memset(p, 0, bytes);
    trace_->per_block = cfg_.trace_records;
    GPUOS_CU(d.cuMemHostGetDevicePointer(&trace_d_, p, 0));
  }
  GPUOS_CU(d.cuMemAlloc(&dc_d_, sizeof(DevCtl)));
  GPUOS_CU(d.cuMemAlloc(&ring_dev_, sizeof(SubOp) * (size_t)cfg_.capacity));
  GPUOS_CU(d.cuMemAlloc(&refs_dev_, sizeof(TensorRef) * (size_t)ref_capacity_));
  GPUOS_CU(d.cuMemAlloc(&progs_d_, sizeof(Program) * (size_t)kMaxPrograms));
  // Split-K matmul scratch, then the decode-attention partials (kAttnScratchPerSlot floats per ring slot).
  const size_t scratch_bytes = sizeof(float) * (kMmScratchPerSlot * ((size_t)cfg_.capacity + kMmMaxSplit) +
                                                (size_t)kAttnScratchPerSlot * cfg_.capacity);
  GPUOS_CU(d.cuMemAlloc(&scratch_d_, scratch_bytes));
  GPUOS_CU(d.cuMemHostAlloc(&p, sizeof(Program) * (size_t)kMaxPrograms, CU_MEMHOSTALLOC_PORTABLE));
  progs_h_ = (Program*)p;
  GPUOS_CU(d.cuStreamCreate(&ctl_, CU_STREAM_NON_BLOCKING));
  GPUOS_CU(d.cuMemsetD8Async(dc_d_, 0, sizeof(DevCtl), side_));
  GPUOS_CU(d.cuMemsetD8Async(scratch_d_, 0, scratch_bytes, side_));  // split-K / attention counters start clean
  // DevCtl::next_seq starts at 1 (seq 0 means "none"): set it with a one-word memop.
  CUstreamBatchMemOpParams w{};
  w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  w.writeValue.address = dc_d_ + __builtin_offsetof(DevCtl, next_seq);
  w.writeValue.value = 1;
  w.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  GPUOS_CU(d.cuStreamBatchMemOp(side_, 1, &w, 0));
  // The first publication writes ready words from the user's stream, which is not ordered after side_: the
  // zeroing above must have landed first, or it could erase a ready word and the batch would never open.
  wait_stream(side_, cfg_.timeout_s, "the device control block's initialisation");
  gen_init();
  alive_ = true;
}

Runtime::~Runtime() {
  try {
    shutdown(nullptr);  // legacy default stream: never calls back into Python
  } catch (...) {
    // Destructors never throw; shutdown() already reported through the explicit call path.
  }
}

// A launch that needs a larger per-thread stack than the context has makes the driver grow it first, which
// waits for all preceding work on the device -- including stream waits on the very batches this launch is
// to run: a deadlock (seen: a worker with a 1,104-byte frame against the 1,024-byte default). So the limit is
// raised here, when a module is loaded and no worker is resident or awaited (construction, handover).
void Runtime::fit_stack(CUfunction f) {
  const Driver& d = driver();
  int local = 0;
  GPUOS_CU(d.cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f));
  size_t cur = 0;
  GPUOS_CU(d.cuCtxGetLimit(&cur, CU_LIMIT_STACK_SIZE));
  if (local > 0 && (size_t)local > cur) GPUOS_CU(d.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, (size_t)local));
  worker_local_bytes_ = local;
  GPUOS_CU(d.cuCtxGetLimit(&stack_limit_, CU_LIMIT_STACK_SIZE));
}

void Runtime::make_current() {
  const Driver& d = driver();
  CUcontext cur = nullptr;
  d.cuCtxGetCurrent(&cur);
  if (cur != ctx_) GPUOS_CU(d.cuCtxSetCurrent(ctx_));
}

std::string Runtime::describe() const {
  return name_ + " (sm_" + std::to_string(cc_major_) + std::to_string(cc_minor_) + ", " + std::to_string(sms_) +
         " SMs), worker grid " + std::to_string(grid_) + " x " + std::to_string(cfg_.threads_per_block) +
         (cfg_.burst_min ? " (" + std::to_string(burst_grid_) + " blocks for flushes of >= " +
                               std::to_string(cfg_.burst_min) + " sub-ops)" : std::string()) +
         ", worker local memory " + std::to_string(worker_local_bytes_) + " B/thread (stack limit " +
         std::to_string(stack_limit_) + " B), " +
         (lazy_loading_ ? "lazy module loading (publications behind busy streams drain the worker first)"
                        : "eager module loading");
}

RuntimeStats Runtime::stats() const {
  RuntimeStats s = st_;
  // The worker's sticky flag (device_src/dataops.h): 1 once a data-movement sub-op met an index out of range.
  if (alive_ && hc_) s.index_faults = __atomic_load_n(&hc_->index_fault, __ATOMIC_ACQUIRE);
  // Counted by the worker (HostCtl::working_launches), since this runtime's start.
  if (alive_ && hc_) s.working_launches = __atomic_load_n(&hc_->working_launches, __ATOMIC_ACQUIRE);
  return s;
}

void Runtime::clear_index_fault() {
  if (alive_ && hc_) __atomic_store_n(&hc_->index_fault, 0u, __ATOMIC_RELEASE);
}

std::vector<TraceRec> Runtime::take_trace(uint64_t* dropped) {
  std::vector<TraceRec> out;
  *dropped = 0;
  if (!trace_) return out;
  const TraceRec* rec = (const TraceRec*)(trace_ + 1);
  for (uint32_t r = 0; r <= kTraceBlocks; ++r) {
    const uint32_t n = __atomic_load_n(&trace_->count[r], __ATOMIC_ACQUIRE);
    const uint32_t kept = std::min(n, trace_->per_block);
    out.insert(out.end(), rec + (size_t)r * trace_->per_block, rec + (size_t)r * trace_->per_block + kept);
    *dropped += n - kept;
    __atomic_store_n(&trace_->count[r], 0u, __ATOMIC_RELEASE);
  }
  TraceRec* items = (TraceRec*)(trace_ + 1) + (size_t)kTraceItems * trace_->per_block;
  for (uint32_t i = 0; i < trace_->per_block; ++i)
    if (items[i].t0 != 0) out.push_back(items[i]), items[i] = TraceRec{};
  return out;
}

}  // namespace gpuos
