// csrc/sched/deferred.h -- the scheduler's deferred queue. gpuos.scheduler_context's handlers call sched_ew /
// sched_reduce (sched/record.cpp): one C++ call validates, allocates the output and defers the op. Deferred ops
// are lowered into runtime sub-ops (sched/lower.cpp) when they are flushed, or before anything else is recorded
// on the device; lowering fuses chains of elementwise ops whose intermediates nothing else can read into one
// interpreter sub-op.
// Locks: the queue (Deferred) belongs to the GIL -- recording appends to it holding the GIL alone. Lowering and
// publishing hold the GIL and Runtime::mu. A dependency check (does an eager op share storage with deferred
// work?) reads `touched` under the GIL, so no eager op runs ahead of deferred work it depends on. The flush timer
// (sched_flush_due) takes the ops out of the queue under both and reads Python's side of their tensors' liveness
// (a snapshot), then analyses, emits and publishes them without the GIL (mu held): recording goes on meanwhile
// into the emptied queue. While it holds mu (Deferred::inflight) their storages stay visible to GIL holders
// (Deferred::inflight_touched), so only a check that touches them waits for mu; once mu is let go every check
// takes mu (work lowered since may be staged, which no storage tracks). The lowering's counters in g_sched are
// written by whoever holds mu.
#pragma once
#include <torch/extension.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/hazards.h"
#include "tensor/devices.h"

namespace gpuos {

// Why an op runs eagerly (Python reads the names through gpuos_ext.sched_reasons()).
#define GPUOS_SCHED_REASONS(X) \
  X(1, not_cuda) X(2, layout) X(3, dtype) X(4, size) X(5, autograd) X(6, unsupported_args) X(7, device)     \
  X(8, matmul_off) X(9, matmul_rows) X(10, subclass) X(11, attention_off) X(12, attention_shape)          \
  X(13, attention_layout) X(14, attention_lse) X(15, math_bits)
enum SchedReason : int {
#define GPUOS_REASON(n, name) kR_##name = n,
  GPUOS_SCHED_REASONS(GPUOS_REASON)
#undef GPUOS_REASON
};
// Where a recorded elementwise op's result goes (gpuos_ext.sched_modes()).
enum SchedMode : int { kModeFunctional = 0, kModeInplace = 1, kModeOut = 2 };

constexpr uint32_t kDeferredMaxIn = 4;  // q, k, v, mask of an attention; elementwise ops use up to 3
struct DeferredOp {
  uint32_t op = 0, nin = 0;
  bool reduce = false, keepdim = false, fresh = false;  // fresh: out was allocated by the scheduler
  bool matmul = false;  // out = s0 * in[0] @ in[1] + s1 * in[2] (in[2] undefined: no bias); never fused
  // Decode attention (never fused): out = softmax(s0 * in[0] @ in[1]^T + in[3]) @ in[2] (in[3] undefined: no
  // mask); attn_causal: torch's is_causal; lse: also written (B x Hq x Lq fp32, in out's storage); `written`: the
  // buffer holding out (and lse).
  bool attention = false, attn_causal = false;
  at::Tensor lse, written;
  bool data = false;    // a data-movement op (ops.def kind 4: tensor/record.h record_data_tensors); never fused
  int64_t dim = 0, ival = 0;             // data ops: the indexed dim; alpha / index rule
  uint64_t bits[3] = {0, 0, 0};          // data ops: constant inputs as bits
  float s0 = 0.f, s1 = 0.f;
  at::Tensor out;
  at::Tensor in[kDeferredMaxIn];  // undefined: constant cv[k]
  float cv[kDeferredMaxIn] = {0.f, 0.f, 0.f, 0.f};
  // An elementwise op of the table: the only kind fusion takes (as producer or consumer).
  bool elementwise() const { return !reduce && !matmul && !attention && !data; }
};

struct Deferred {
  std::vector<DeferredOp> ops;
  Hazards touched;  // every storage the deferred ops read or write (the hazard model; levels unused here)
  // While the timer emits and publishes taken ops without the GIL (`inflight`): the storages they touch, and
  // whether explicit-API work (tracked by no storage) was staged with them. inflight_touched / inflight_untracked
  // are written by the timer holding the GIL, so a GIL holder reads them without mu: a dependency check that
  // touches neither needs no wait. `inflight` is true only while the timer holds mu -- set with the GIL and mu,
  // cleared before mu is let go -- so while a GIL holder sees it, no one else can have lowered or staged work
  // since the take (that takes mu): e.g. the explicit API's before-record hook stages newer deferred ops, tracked
  // by no storage until published (the fifty-third session's stress mismatches, when it was cleared only once the
  // timer had the GIL back).
  // inflight_touched belongs to the timer whose `inflight` is set: a timer that has let mu go and waits for the
  // GIL must not clear it, for another timer may have taken the queue meanwhile (the fifty-fifth session's stress
  // mismatches: one timer's regain wiped the next one's set, and eager ops ran ahead of its publication).
  Hazards inflight_touched;
  std::atomic<bool> inflight{false};
  bool inflight_untracked = false;
  // A GIL holder's dependency question: may the deferred ops -- queued, or taken by a timer publishing without
  // the GIL -- read or write storage s?
  bool may_touch(uintptr_t s) const {
    return touched.touches(s) || (inflight.load(std::memory_order_acquire) && inflight_touched.touches(s));
  }
  CUstream stream = nullptr;
  std::chrono::steady_clock::time_point oldest;
};
Deferred& deferred_of(int dev);

struct SchedStats {
  uint64_t intercepted = 0, flushed_ops = 0, fused_groups = 0, fused_ops = 0, flushes = 0;
  uint64_t row_groups = 0;  // of fused_groups: row programs (a last-dim reduction inside: RMSNorm, LayerNorm)
  uint64_t independent_eager = 0;  // eager ops that ran without flushing (no shared storage)
  uint64_t front_ops = 0;          // of `intercepted`: recorded by the __torch_function__ front
  uint64_t recycled = 0;           // outputs given a fused-away intermediate's storage (sched/outpool.cpp)
  uint64_t epilogues = 0;          // residual adds folded into their matmul (sched/rewrite.cpp)
  uint64_t act_epilogues = 0;      // elementwise chains run as their matmul's epilogue program (sched/epilogue.cpp)
  uint64_t dual_epilogues = 0;     // ... of those, two products' chains as one dual item (silu(gate) * up)
  uint64_t prologues = 0;          // row programs run as the prologue of the matmuls reading them (sched/prologue.cpp)
  uint64_t copies_folded = 0;      // copies whose producer writes their destination (sched/rewrite.cpp)
  uint64_t dead_ops = 0;           // ops dropped because nobody could read their output (sched/rewrite.cpp)
  uint64_t gqa_reads = 0;          // attention k / v read from repeat_kv's source (sched/rewrite.cpp gqa_source)
  uint64_t inflight_skips = 0;     // dependency checks answered without waiting for the timer's publication
  uint64_t live_yields = 0;        // eager ops that asked a worker to leave because the live window kept it
  // Host time of publication (steady clock, ns): fusion analysis, emitting sub-ops, keep-alive, Runtime::flush.
  uint64_t analyse_ns = 0, emit_ns = 0, keep_ns = 0, publish_ns = 0;
  // Per flush cause ("exit", "dependency", "timer", "size", "explicit", "stream_change", ...): flushes, the
  // batches they published and the worker launches they caused (gpuos.stats(): *_by_cause).
  struct Cause {
    uint64_t flushes = 0, batches = 0, launches = 0;
  };
  std::map<std::string, Cause> by_cause;
};
extern SchedStats g_sched;
extern bool g_fusion;  // flush-time fusion on (gpuos.set_fusion)
extern bool g_row_fusion;  // row programs and shared producers in groups (gpuos.set_row_fusion; needs g_fusion)
// Activation chains after a matmul run as its epilogue program (sched/epilogue.cpp; gpuos_ext._testing.set_mm_epilogue,
// needs g_fusion; GPUOS_MM_EPILOGUE=0 turns it off for the process).
extern bool g_mm_epilogue;
// Row programs read only by matmuls run as their prologue (sched/prologue.cpp; gpuos_ext._testing.set_mm_prologue,
// needs g_fusion; GPUOS_MM_PROLOGUE=0 turns it off for the process).
extern bool g_mm_prologue;
// aten::mm / addmm with at most kWorkerMatmulMaxRows activation rows run as worker tasks (gpuos.set_worker_matmul;
// off by default, GPUOS_WORKER_MATMUL=1 turns it on: read on first use, config/config.h).
bool worker_matmul_enabled();
void set_worker_matmul(bool on);
// F.scaled_dot_product_attention's CUDA backend ops with a query of <= 16 rows run as worker tasks
// (gpuos.set_worker_attention; off by default, GPUOS_WORKER_ATTENTION=1 turns it on).
bool worker_attention_enabled();
void set_worker_attention(bool on);
constexpr int64_t kWorkerMatmulMaxRows = 64;

// Does Python still see the tensor (sched/lower.cpp)? True when its only references are `ours` (plus the
// preserved Python object, whose own refcount is then 1). calibrate_liveness() first, once. GIL held, or inside
// the timer's lowering, which answers from a snapshot of Python's side taken under the GIL (dead stays dead).
void calibrate_liveness();
bool dead_to_python(const at::TensorBase& t, long ours);

// A publication without the GIL (the flush timer's): lower_deferred emits the ops, calls `publish` with the stream
// they were recorded under, unlocks `lk` (the caller's RtLock: mu) and only then retakes the GIL, for the
// references (straight to the release lists: published) and the output pool.
struct OffGilPublish {
  RtLock* lk;
  std::function<void(CUstream)> publish;
};
// Lower the device's deferred ops into sub-ops (sched/lower.cpp). GIL and mu held (`off`: see OffGilPublish).
void lower_deferred(int dev, Runtime& rt, const OffGilPublish* off = nullptr);
// Lower and publish the device's deferred ops on the stream they were recorded under (cause counted). GIL and mu
// held; with `off_gil` (the caller's lock of mu) emission and publication run without the GIL, and mu is
// released on return.
void sched_publish(int dev, Runtime& rt, const char* cause, RtLock* off_gil = nullptr);
// Runtime::flush(s) and what it published (batches, worker launches). mu held.
struct FlushCount {
  uint64_t batches = 0, launches = 0;
};
FlushCount flush_measured(Runtime& rt, CUstream s);
void count_flush(const char* cause, const FlushCount& c);  // into g_sched (GIL held)
void flush_counted(Runtime& rt, CUstream s, const char* cause);  // both
// Tests (gpuos_ext._testing): hold off-GIL timer publications until released (at most 10 s) at the points of a
// mask -- kTimerHoldPublish: before Runtime::flush (mu held, ops in flight); kTimerHoldUnlocked: published, mu let
// go, the GIL not yet retaken -- and wait (GIL released) until a publication is held at one of `point`'s.
enum TimerHold : int { kTimerHoldNone = 0, kTimerHoldPublish = 1, kTimerHoldUnlocked = 2 };
void hold_timer_publication(int where);
bool timer_publication_held(double timeout_s, int point = kTimerHoldPublish | kTimerHoldUnlocked);
void timer_hold_point(int here);  // (the timer, without the GIL)
// The flush timer publishes without the GIL (GPUOS_TIMER_OFF_GIL=1, gpuos_ext.sched_set_timer_off_gil; off by default
// until a long stress A/B with the live window is clean after the fifty-fifth session's fix, docs/design/limitations.md).
bool timer_off_gil();
void set_timer_off_gil(bool on);
// A new deferred op on `dev` recorded under stream `s` (work deferred under another stream is published
// first: batches are per stream). The caller fills it in, then calls note_deferred(), which publishes when the
// queue could fill the ring. GIL held, mu not held (either takes it to publish).
DeferredOp& defer(int dev, Runtime& rt, CUstream s);
void note_deferred(int dev, Runtime& rt);
// Installs lower_deferred as the explicit API's before-record hook (module init).
void init_deferred();

// Flushes (sched/flush.cpp): every device / only devices whose deferred work shares storage with the tensors in
// args and kwargs / work older than age_s.
// The first two return [(device, raw stream published on)]; sched_flush(this_thread) flushes only the devices the
// calling thread deferred ops on; sched_flush_for(yield_worker) then asks the workers of the op's devices to yield:
// kYieldAlways (a heavy kernel: cuBLAS, cuDNN, a collective), or kYieldInLiveWindow (any other kernel: only while a
// live window keeps the worker resident, on every SM but one).
enum SchedYield : int { kYieldNever = 0, kYieldAlways = 1, kYieldInLiveWindow = 2 };
pybind11::list sched_flush(const std::string& cause, bool this_thread = false);
pybind11::list sched_flush_for(pybind11::handle args, pybind11::handle kwargs, const std::string& cause,
                               int yield_worker = kYieldNever);
// The live window of a scheduler context with a flush timer (core/runtime.h live_idle_us): open returns the window
// applied (GPUOS_LIVE_IDLE_US, when set, instead of `us`; 0: none), which close takes back. The last close asks the
// resident workers to leave.
double sched_live_window_open(double us);
void sched_live_window_close(double us);
// Bit d: the calling thread deferred ops or recorded explicit-API work on device d since its last take (which
// clears them).
uint64_t take_thread_devices();
void note_thread_devices(uint64_t mask);
void forget_thread_devices(uint64_t mask);  // flushed by gpuos.flush
int sched_flush_due(double age_s);
pybind11::dict sched_stats();
size_t deferred_count();

}  // namespace gpuos
