// csrc/runtime.cpp -- per-device runtime: ring, publication, stream ordering, the elastic worker.
//
// Data path (DESIGN.md §3): record() appends 64-byte descriptors to a pinned ring; flush() issues one
// cuStreamBatchMemOp on the user's stream that (a) writes each
// level's ready word in device memory -- so the worker opens a level only after the stream work queued
// before the flush -- and (b) makes the stream wait for the last level's done word -- so later stream work
// sees the outputs. No host sync. The worker is launched on a side stream when the Dekker handshake says
// none is running; it exits by itself after idle_us with nothing published.
#include "runtime.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "device_src/numeric.h"
#include "fusion.h"
#include "jit.h"

namespace gpuos {

// ------------------------------------------------------------------ Footprint
static inline size_t hash_ptr(uintptr_t k) { return (size_t)((k >> 4) * 0x9E3779B97F4A7C15ull >> 20); }

const Footprint::Entry* Footprint::find(uintptr_t k) const {
  const size_t mask = e_.size() - 1;
  for (size_t i = hash_ptr(k) & mask;; i = (i + 1) & mask) {
    if (e_[i].tag != gen_) return nullptr;
    if (e_[i].key == k) return &e_[i];
  }
}

bool Footprint::reads_overlap(uintptr_t k, uint64_t lo, uint64_t hi) const {
  const Entry* e = find(k);
  return e && e->rlo < hi && lo < e->rhi;
}

bool Footprint::writes_overlap(uintptr_t k, uint64_t lo, uint64_t hi) const {
  const Entry* e = find(k);
  return e && e->wlo < hi && lo < e->whi;
}

void Footprint::add(uintptr_t k, uint64_t lo, uint64_t hi, bool write) {
  if ((count_ + 1) * 2 > e_.size()) grow(e_.size() * 2);
  const size_t mask = e_.size() - 1;
  for (size_t i = hash_ptr(k) & mask;; i = (i + 1) & mask) {
    Entry& e = e_[i];
    if (e.tag != gen_) {  // new entry: empty ranges are [max, 0)
      e = Entry{k, gen_, ~0ull, 0, ~0ull, 0};
      ++count_;
    } else if (e.key != k) {
      continue;
    }
    uint64_t& l = write ? e.wlo : e.rlo;
    uint64_t& h = write ? e.whi : e.rhi;
    l = std::min(l, lo);
    h = std::max(h, hi);
    return;
  }
}

void Footprint::grow(size_t n) {
  std::vector<Entry> old;
  old.swap(e_);
  e_.assign(n, Entry{0, 0, 0, 0, 0, 0});
  const uint32_t g = gen_;
  count_ = 0;
  for (const Entry& o : old) {
    if (o.tag != g) continue;
    if (o.rlo < o.rhi) add(o.key, o.rlo, o.rhi, false);
    if (o.wlo < o.whi) add(o.key, o.wlo, o.whi, true);
  }
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
  burst_grid_ = std::max(grid_, std::min<uint32_t>(cfg_.burst_blocks ? cfg_.burst_blocks : (uint32_t)sms_, (uint32_t)sms_));

  // Module: worker + every op, one generation (DESIGN F2): the newest ready one (generations.cpp). Loaded
  // before any worker runs (F3).
  const std::string image = gen_startup_image();
  GPUOS_CU(d.cuModuleLoadData(&module_, image.data()));
  GPUOS_CU(d.cuModuleGetFunction(&worker_fn_, module_, "gpuos_worker"));
  fit_stack(worker_fn_);
  GPUOS_CU(d.cuStreamCreate(&side_, CU_STREAM_NON_BLOCKING));

  // Queue memory: independent of any module (F4).
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
    const size_t bytes = sizeof(TraceBuf) + sizeof(TraceRec) * (size_t)(kTraceBlocks + 1) * cfg_.trace_records;
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
  GPUOS_CU(d.cuMemHostAlloc(&p, sizeof(Program) * (size_t)kMaxPrograms, CU_MEMHOSTALLOC_PORTABLE));
  progs_h_ = (Program*)p;
  GPUOS_CU(d.cuStreamCreate(&ctl_, CU_STREAM_NON_BLOCKING));
  GPUOS_CU(d.cuMemsetD8Async(dc_d_, 0, sizeof(DevCtl), side_));
  // DevCtl::next_seq starts at 1 (seq 0 means "none"): set it with a one-word memop.
  CUstreamBatchMemOpParams w{};
  w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  w.writeValue.address = dc_d_ + __builtin_offsetof(DevCtl, next_seq);
  w.writeValue.value = 1;
  w.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  GPUOS_CU(d.cuStreamBatchMemOp(side_, 1, &w, 0));
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
         std::to_string(stack_limit_) + " B)";
}

RuntimeStats Runtime::stats() const { return st_; }

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
  return out;
}

// ------------------------------------------------------------------ recording
bool Runtime::seq_done(uint32_t seq) const {
  const uint32_t v = __atomic_load_n(&hc_->done[seq & (kMaxBatches - 1)], __ATOMIC_ACQUIRE);
  return (int32_t)(v - seq) >= 0 && v != 0;
}

void Runtime::retire() {
  while (!inflight_.empty() && seq_done(inflight_.front().seq)) {
    desc_tail_ = inflight_.front().desc_end;
    ref_tail_ = inflight_.front().ref_end;
    inflight_.pop_front();
  }
}

void Runtime::wait_seq(uint32_t seq, const char* what) {
  if (seq_done(seq)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(cfg_.timeout_s);
  for (uint32_t spin = 0;; ++spin) {
    if (seq_done(seq)) return;
    _mm_pause();
    if ((spin & 255) == 0) {
      if (std::chrono::steady_clock::now() - t0 > limit) {
        const uint32_t done = hc_->done[seq & (kMaxBatches - 1)];
        throw CudaError(std::string("gpuos: timed out after ") + std::to_string(cfg_.timeout_s) +
                        " s waiting for batch " + std::to_string(seq) + " (" + what + ") on " + name_ +
                        "; done word=" + std::to_string(done) + ", worker state=" +
                        std::to_string(hc_->worker_state) +
                        ". The stream it was flushed on may be blocked by other work; raise GPUOS_TIMEOUT_S "
                        "if that work is legitimately long.");
      }
      if (spin > (1u << 16)) std::this_thread::yield();
    }
  }
}

void Runtime::ensure_room(uint32_t ndesc, uint32_t nref) {
  retire();
  auto fits = [&] {
    return desc_head_ + ndesc - desc_tail_ <= cfg_.capacity && ref_head_ + nref - ref_tail_ <= ref_capacity_;
  };
  if (fits()) return;
  // Full: publish what is pending (it may be what fills the ring), then wait for the oldest batches.
  if (has_pending()) {
    st_.full_queue_flushes++;
    flush(record_stream());
  }
  while (!fits()) {
    if (inflight_.empty())
      throw std::logic_error("gpuos internal error: ring accounting broken (nothing in flight, no room)");
    st_.room_waits++;
    wait_seq(inflight_.front().seq, "room in the descriptor ring");
    retire();
  }
}

// cuStreamBatchMemOp takes fewer than 256 operations: one ready write per level plus the final wait.
constexpr size_t kMaxLevelsPerFlush = 200;

void Runtime::close_level() {
  if (cur_count_ == 0) return;
  levels_.push_back({cur_start_, cur_count_});
  cur_start_ = desc_head_;
  cur_count_ = 0;
  footprint_.clear();
  // One flush publishes at most kMaxLevelsPerFlush levels in one driver call; batch slots are finite too.
  if (levels_.size() >= kMaxLevelsPerFlush || levels_.size() + inflight_.size() >= kMaxBatches / 2)
    flush(record_stream());
}

// Merge dims (drop size-1, fuse dims contiguous across all operands) and fill TensorRefs. Returns the merged
// ndim; ndim == 1 with every stride 1 means every operand is contiguous.
uint32_t Runtime::merge_refs(const Operand* ops, int nops, TensorRef* out_refs) {
  const int nd = ops[0].ndim;
  int64_t sizes[64];
  int64_t strides[4][64];
  int m = 0;
  for (int i = 0; i < nd; ++i) {
    const int64_t sz = ops[0].sizes[i];
    if (sz == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < nops && merge; ++k) merge = strides[k][m - 1] == ops[k].strides[i] * sz;
    if (merge) {
      sizes[m - 1] *= sz;
      for (int k = 0; k < nops; ++k) strides[k][m - 1] = ops[k].strides[i];
    } else {
      sizes[m] = sz;
      for (int k = 0; k < nops; ++k) strides[k][m] = ops[k].strides[i];
      ++m;
    }
  }
  if (m == 0) {  // 0-d or all-ones shape: one element
    sizes[0] = 1;
    for (int k = 0; k < nops; ++k) strides[k][0] = 1;
    m = 1;
  }
  if (m > (int)kMaxDims)
    throw std::invalid_argument("gpuos: tensors with more than " + std::to_string(kMaxDims) +
                                " non-mergeable dims are not supported; call .contiguous() first");
  for (int k = 0; k < nops; ++k) {
    TensorRef& r = out_refs[k];
    r.ptr = ops[k].ptr;
    r.ndim = (uint32_t)m;
    r.dtype = ops[k].dtype;
    for (int i = 0; i < (int)kMaxDims; ++i) {
      r.sizes[i] = i < m ? sizes[i] : 1;
      r.strides[i] = i < m ? strides[k][i] : 0;
    }
  }
  return (uint32_t)m;
}

// Dependency levels: a sub-op that reads memory written earlier in the open level, or writes memory read or
// written there, starts a new level (the worker completes a level before opening the next).
bool Runtime::conflicts(const Operand& out, const Operand* ins, uint32_t nin) const {
  const Footprint& f = footprint_;
  if (f.writes_overlap(out.storage, out.lo, out.hi) || f.reads_overlap(out.storage, out.lo, out.hi)) return true;
  for (uint32_t k = 0; k < nin; ++k)
    if (!ins[k].is_const && f.writes_overlap(ins[k].storage, ins[k].lo, ins[k].hi)) return true;
  return false;
}

void Runtime::note_access(const Operand& out, const Operand* ins, uint32_t nin) {
  for (uint32_t k = 0; k < nin; ++k)
    if (!ins[k].is_const) footprint_.add_read(ins[k].storage, ins[k].lo, ins[k].hi);
  footprint_.add_write(out.storage, out.lo, out.hi);
}

void Runtime::append_tiles(SubOp proto, uint64_t total, uint64_t per_tile, const TensorRef* refs, uint32_t nref) {
  // A fused sub-op's FusedArgs spans two arena slots that must be adjacent: at the ring's end, skip a slot.
  const bool span = (proto.flags & kFlagFused) != 0;
  const uint64_t tiles_total = (total + per_tile - 1) / per_tile;
  uint64_t tile = 0;
  while (tile < tiles_total) {
    const uint32_t piece = (uint32_t)std::min<uint64_t>(tiles_total - tile, cfg_.capacity / 2);
    ensure_room(piece, nref + (span ? 1 : 0));
    if (span && ref_head_ % ref_capacity_ == ref_capacity_ - 1) ++ref_head_;
    if (nref) {
      uint64_t dev[4] = {0, 0, 0, 0};
      for (uint32_t k = 0; k < nref; ++k) {
        const uint32_t slot = (uint32_t)(ref_head_ % ref_capacity_);
        refs_[slot] = refs[k];
        dev[k] = refs_d_ + (uint64_t)slot * sizeof(TensorRef);
        ++ref_head_;
      }
      proto.out = dev[0];
      if (!span)
        for (uint32_t k = 0; k + 1 < nref; ++k)
          if (!(proto.flags & (kFlagConst0 << k))) proto.in[k] = dev[k + 1];
    }
    for (uint32_t t = 0; t < piece; ++t, ++tile) {
      SubOp& d = ring_[desc_head_ % cfg_.capacity];
      d = proto;
      const uint64_t base = tile * per_tile;
      d.n = (uint32_t)std::min<uint64_t>(per_tile, total - base);
      d.base = (uint32_t)base;
      ++desc_head_;
      ++cur_count_;
      ++pending_subops_;
      st_.subops++;
    }
  }
}

void Runtime::record_ew(uint32_t op, uint32_t arity, const Operand& out, const Operand* ins, float s0, float s1,
                        int64_t numel) {
  if (numel <= 0) return;
  note_op_gen(op);
  if (conflicts(out, ins, arity)) {
    st_.levels_split++;
    close_level();
  }
  SubOp proto{};
  proto.op = op;
  proto.scalar[0] = s0;
  proto.scalar[1] = s1;
  proto.dtype = out.dtype;
  // Tensor operands (out first) for dim merging; constants travel in the descriptor.
  Operand tens[4] = {out};
  int nt = 1;
  bool contiguous = out.contiguous, one_dtype = true;
  uint64_t ptr_bits = out.ptr;
  for (uint32_t k = 0; k < arity; ++k) {
    proto.dtype |= (ins[k].is_const ? 0u : ins[k].dtype) << (8 * (k + 1));
    if (ins[k].is_const) {
      proto.flags |= kFlagConst0 << k;
      proto.in[k] = f32_bits(ins[k].value);
      continue;
    }
    tens[nt++] = ins[k];
    contiguous &= ins[k].contiguous;
    one_dtype &= ins[k].dtype == out.dtype;
    ptr_bits |= ins[k].ptr;
  }
  TensorRef refs[4];
  bool strided = !contiguous;
  if (strided) {
    const uint32_t m = merge_refs(tens, nt, refs);
    strided = m != 1;
    for (int k = 0; k < nt && !strided; ++k) strided = refs[k].strides[0] != 1;
  }
  if (strided) {
    proto.flags |= kFlagStrided;
    // Refs in operand order: out, then each input slot (constants keep a zero ref that is never read).
    TensorRef slots[4] = {refs[0]};
    for (uint32_t k = 0, t = 1; k < arity; ++k) slots[k + 1] = ins[k].is_const ? TensorRef{} : refs[t++];
    append_tiles(proto, (uint64_t)numel, kTileElems, slots, arity + 1);
  } else {
    if (one_dtype && (ptr_bits & 15) == 0) proto.flags |= kFlagVec;
    proto.out = out.ptr;
    for (uint32_t k = 0; k < arity; ++k)
      if (!ins[k].is_const) proto.in[k] = ins[k].ptr;
    append_tiles(proto, (uint64_t)numel, kTileElems, nullptr, 0);
  }
  note_access(out, ins, arity);
  st_.submitted++;
  maybe_publish_early();
}

void Runtime::record_reduce(uint32_t op, const Operand& out, const TensorRef& out_ref, const Operand& x,
                            const TensorRef& x_ref, int64_t rows, int64_t cols) {
  if (rows <= 0) return;
  if (cols >= (int64_t(1) << 32))  // the worker indexes a row's 16-byte vectors with 32 bits
    throw std::invalid_argument("gpuos.submit_reduce: rows of " + std::to_string(cols) + " elements (2^32 or more) "
                                "are not supported; reduce such a tensor with torch directly.");
  if (conflicts(out, &x, 1)) {
    st_.levels_split++;
    close_level();
  }
  SubOp proto{};
  proto.op = op;
  proto.flags = kFlagStrided;
  proto.dtype = out.dtype | (x.dtype << 8);
  const TensorRef refs[2] = {out_ref, x_ref};
  // One warp per row, rows of a tile processed in turn: about kTileElems elements per descriptor, 4x that for
  // reductions of 32 x kTileElems elements or more (still >= 8 descriptors each): recording 32 descriptors per
  // 128 x 1,024 reduction cost more host time than the GPU spent on them.
  const int64_t elems = rows * std::max<int64_t>(cols, 1);
  const int64_t tile_elems = elems >= 32 * (int64_t)kTileElems ? 4 * (int64_t)kTileElems : (int64_t)kTileElems;
  const uint64_t per_tile = (uint64_t)std::max<int64_t>(1, std::min<int64_t>(32, tile_elems / std::max<int64_t>(cols, 1)));
  append_tiles(proto, (uint64_t)rows, per_tile, refs, 2);
  note_access(out, &x, 1);
  st_.submitted++;
  maybe_publish_early();
}

void Runtime::sync_ctl(const char* what) {
  const Driver& d = driver();
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t spin = 0;; ++spin) {
    CUresult r = d.cuStreamQuery(ctl_);
    if (r == CUDA_SUCCESS) return;
    if (r != CUDA_ERROR_NOT_READY) GPUOS_CU(r);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(cfg_.timeout_s))
      throw CudaError("gpuos: timed out after " + std::to_string(cfg_.timeout_s) + " s waiting for " + what +
                      " on " + name_);
    if (spin > 64) std::this_thread::yield();
  }
}

int32_t Runtime::program_id(const Program& p) {
  const int32_t id = intern_program(p);  // process-wide ids: a generation's tier-2 code names them
  if (id < 0) return -1;
  if (prog_uploaded_.size() <= (size_t)id) prog_uploaded_.resize((size_t)id + 1, 0);
  if (prog_uploaded_[(size_t)id]) return id;
  progs_h_[id] = p;
  // Uploaded once, on a control stream the resident worker does not occupy, and complete before any
  // descriptor naming it can be published (so no stream of the user needs ordering with it).
  make_current();
  const Driver& d = driver();
  GPUOS_CU(d.cuMemcpyHtoDAsync(progs_d_ + (uint64_t)id * sizeof(Program), &progs_h_[id], sizeof(Program), ctl_));
  sync_ctl("a fused-chain program upload");
  prog_uploaded_[(size_t)id] = 1;
  st_.programs++;
  return id;
}

void Runtime::record_fused(uint32_t prog, const FusedArgs& fa, const Operand& out, const Operand* ins, uint32_t nin,
                           int64_t numel) {
  if (numel <= 0) return;
  if (conflicts(out, ins, nin)) {
    st_.levels_split++;
    close_level();
  }
  SubOp proto{};
  proto.op = kOpFused;
  proto.flags = kFlagFused;
  proto.in[0] = prog;
  proto.dtype = out.dtype;
  TensorRef slots[2];
  std::memcpy((void*)slots, (const void*)&fa, sizeof(FusedArgs));
  append_tiles(proto, (uint64_t)numel, kTileElems, slots, 2);
  note_access(out, ins, nin);
  st_.submitted++;
  st_.fused_subops++;
  maybe_publish_early();
}

// ------------------------------------------------------------------ publication
// How a level's descriptors reach the worker (in stream order, before the level's ready word):
//   >= kDmaMin descriptors: one async copy-engine transfer into the device ring (PCIe at full rate);
//   fewer: the worker reads them from the pinned ring with coalesced 16-byte loads (one PCIe round trip).
// Measured on H200 (tools/roundtrip_probe.py): delivering a 1-descriptor level by 64-bit memop writes instead made the
// round trip slower (15.5 us vs 11.3 us), so small levels are read from pinned memory.
static uint32_t env_u32(const char* name, uint32_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? (uint32_t)std::strtoul(v, nullptr, 10) : dflt;
}
static const uint32_t kDmaMin = std::max<uint32_t>(1, env_u32("GPUOS_DMA_MIN", 128));

uint32_t Runtime::flush(CUstream stream, bool early) {
  close_level();
  if (levels_.empty()) {
    if (early || unwaited_seq_ == 0) return 0;
    // Everything was published early: only the stream wait is missing.
    make_current();
    CUstreamBatchMemOpParams wt{};
    wt.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    wt.waitValue.address = dc_d_ + __builtin_offsetof(DevCtl, done) + 4ull * (unwaited_seq_ & (kMaxBatches - 1));
    wt.waitValue.value = unwaited_seq_;
    wt.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    GPUOS_CU(driver().cuStreamBatchMemOp(stream, 1, &wt, 0));
    unwaited_seq_ = 0;
    st_.flushes++;
    if (on_publish_) on_publish_();
    return last_seq_;
  }
  make_current();
  // Generations (issue #5), before anything is published (a module load must not wait behind a stream that
  // waits for work no worker would run): a pending sub-op that needs a newer generation drains the worker and
  // loads it; otherwise a newer ready generation takes over if the worker has left (idle exit).
  // (pending_need_gen_ is never reset: an op whose tiles straddle a ring-full flush keeps its need.)
  if (pending_need_gen_ > active_gen_) ensure_generation(pending_need_gen_);
  else maybe_adopt_generation();
  const Driver& d = driver();
  // An early publication is bulk work: if a worker on the bounded grid is resident and idle (everything
  // published has run), let it leave so that this publication launches one on the burst grid. (A busy one keeps
  // the work: waiting for it here would block the recording thread.)
  retire();
  if (early && launched_grid_ < burst_grid_ && inflight_.empty() &&
      __atomic_load_n(&hc_->worker_state, __ATOMIC_SEQ_CST) == kWorkerRunning)
    drain_worker("an early publication moving to the burst grid");
  std::vector<CUstreamBatchMemOpParams>& ops = memops_;
  ops.clear();
  auto write64 = [&ops](CUdeviceptr addr, uint64_t v, unsigned flags) {
    CUstreamBatchMemOpParams w{};
    w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    w.writeValue.address = addr;
    w.writeValue.value64 = v;
    w.writeValue.flags = flags;
    ops.push_back(w);
  };
  retire();
  while (inflight_.size() + levels_.size() >= kMaxBatches - 1) {  // slot reuse needs the old batch done
    st_.room_waits++;
    wait_seq(inflight_.front().seq, "a free batch slot");
    retire();
  }
  std::vector<Level> publishing;
  publishing.swap(levels_);
  uint64_t publishing_subops = 0;
  for (const Level& lv : publishing) publishing_subops += lv.count;
  bool refs_sent = false;
  for (const Level& lv : publishing) {
    const uint32_t seq = ++last_seq_;
    const uint32_t slot = seq & (kMaxBatches - 1);
    const uint32_t start = (uint32_t)(lv.start % cfg_.capacity);
    uint32_t src = 0;
    if (lv.count >= kDmaMin) {
      // The TensorRefs recorded since the last publication (every level of this flush points only there) go to
      // the device mirror first, once per flush, before any DMA-delivered level's ready write.
      if (!refs_sent && ref_head_ > ref_pub_) {
        const uint64_t a = ref_pub_ % ref_capacity_, n = ref_head_ - ref_pub_;
        const uint64_t n1 = std::min<uint64_t>(n, ref_capacity_ - a);
        GPUOS_CU(d.cuMemcpyHtoDAsync(refs_dev_ + a * sizeof(TensorRef), &refs_[a], n1 * sizeof(TensorRef), stream));
        if (n1 < n) GPUOS_CU(d.cuMemcpyHtoDAsync(refs_dev_, &refs_[0], (n - n1) * sizeof(TensorRef), stream));
        refs_sent = true;
      }
      const uint32_t first = std::min(lv.count, cfg_.capacity - start);
      GPUOS_CU(d.cuMemcpyHtoDAsync(ring_dev_ + (uint64_t)start * sizeof(SubOp), &ring_[start],
                                   (size_t)first * sizeof(SubOp), stream));
      if (first < lv.count)
        GPUOS_CU(d.cuMemcpyHtoDAsync(ring_dev_, &ring_[0], (size_t)(lv.count - first) * sizeof(SubOp), stream));
      src = kReadyDevRing;
      st_.dma_batches++;
    }
    write64(dc_d_ + __builtin_offsetof(DevCtl, ready) + 8ull * slot,
            ((uint64_t)(lv.count | src) << 32) | seq, CU_STREAM_WRITE_VALUE_DEFAULT);
    inflight_.push_back({seq, lv.start + lv.count, ref_head_});
    st_.batches++;
  }
  // The stream waits for the last batch (batches complete in order: for all of them), except after an early
  // publication: the host is still recording, and the flush() that follows adds the wait.
  if (!early) {
    CUstreamBatchMemOpParams wt{};
    wt.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    wt.waitValue.address = dc_d_ + __builtin_offsetof(DevCtl, done) + 4ull * (last_seq_ & (kMaxBatches - 1));
    wt.waitValue.value = last_seq_;
    wt.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    ops.push_back(wt);
  }

  // One cuStreamBatchMemOp call publishes the whole flush (close_level keeps a flush under kMaxLevelsPerFlush
  // levels; the API takes fewer than 256 operations). If it fails, nothing was published: undo the
  // bookkeeping so the levels stay pending and no seq is left "published but never ready".
  CUresult r = d.cuStreamBatchMemOp(stream, (unsigned)ops.size(), ops.data(), 0);
  if (r != CUDA_SUCCESS) {
    for (size_t i = 0; i < publishing.size(); ++i) inflight_.pop_back();
    last_seq_ -= (uint32_t)publishing.size();
    st_.batches -= publishing.size();
    levels_ = std::move(publishing);
    throw_cuda(r, "cuStreamBatchMemOp(stream, n, ops, 0)", __FILE__, __LINE__);
  }
  // Dekker, host side: store host_published, full fence, then read worker_state (maybe_launch_worker).
  __atomic_store_n(&hc_->host_published, last_seq_, __ATOMIC_SEQ_CST);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  unwaited_seq_ = early ? last_seq_ : 0;
  pending_subops_ = 0;
  ref_pub_ = ref_head_;
  maybe_launch_worker(cfg_.burst_min && (early || publishing_subops >= cfg_.burst_min) ? burst_grid_ : grid_);
  if (!early) st_.flushes++;
  // Keep-alive references may go once the stream waits for the work (a later allocation on that stream cannot
  // reuse the memory before the worker is done with it): not after an early publication.
  if (!early && on_publish_) on_publish_();
  return last_seq_;
}

void Runtime::maybe_launch_worker(uint32_t grid) {
  if (__atomic_load_n(&hc_->worker_state, __ATOMIC_SEQ_CST) != kWorkerExiting) return;
  const Driver& d = driver();
  __atomic_store_n(&hc_->worker_state, kWorkerRunning, __ATOMIC_SEQ_CST);
  __atomic_store_n(&hc_->yield_request, 0u, __ATOMIC_SEQ_CST);
  WorkerArgs args{};
  args.host_ctl = hc_d_;
  args.dev_ctl = dc_d_;
  args.ring = ring_d_;
  args.ring_dev = ring_dev_;
  args.capacity = cfg_.capacity;
  args.gen = ++launches_;
  args.idle_ns = (uint64_t)(cfg_.idle_us * 1000.0);
  args.progs = progs_d_;
  args.trace = trace_d_;
  args.keep_blocks = grid_;
  args.refs = refs_d_;
  args.refs_dev = refs_dev_;
  void* params[] = {&args};
  GPUOS_CU(d.cuLaunchKernel(worker_fn_, grid, 1, 1, cfg_.threads_per_block, 1, 1, 0, side_, params, nullptr));
  launched_grid_ = grid;
  st_.worker_launches++;
  if (grid != grid_) st_.burst_launches++;
}

void Runtime::wait_done(uint32_t seq) {
  if (seq == 0) seq = last_seq_;
  if (seq == 0) return;
  wait_seq(seq, "flush(sync=True)");
}

void Runtime::shutdown(CUstream stream) {
  if (!alive_) return;
  const Driver& d = driver();
  make_current();
  if (has_pending()) flush(stream);
  if (last_seq_) wait_seq(last_seq_, "shutdown: pending work");
  inflight_.clear();
  // Ask the worker to leave now that nothing is published, and wait for the side stream to drain (F3:
  // freeing memory while it is resident would block).
  __atomic_store_n(&hc_->yield_request, 1u, __ATOMIC_SEQ_CST);
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    CUresult r = d.cuStreamQuery(side_);
    if (r == CUDA_SUCCESS) break;
    if (r != CUDA_ERROR_NOT_READY) GPUOS_CU(r);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(cfg_.timeout_s))
      throw CudaError("gpuos.shutdown: timed out after " + std::to_string(cfg_.timeout_s) +
                      " s waiting for the worker to exit on " + name_);
    std::this_thread::yield();
  }
  alive_ = false;
  d.cuStreamDestroy(side_);
  d.cuMemFree(dc_d_);
  d.cuMemFree(ring_dev_);
  d.cuMemFree(refs_dev_);
  d.cuMemFree(progs_d_);
  d.cuMemFreeHost(progs_h_);
  d.cuStreamDestroy(ctl_);
  d.cuMemFreeHost(refs_);
  d.cuMemFreeHost(ring_);
  d.cuMemFreeHost(hc_);
  if (trace_) d.cuMemFreeHost(trace_);
  trace_ = nullptr;
  gen_shutdown();
  d.cuModuleUnload(module_);
  d.cuDevicePrimaryCtxRelease(cu_dev_);
}

}  // namespace gpuos
