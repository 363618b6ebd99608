// csrc/core/launch.cpp -- launching the elastic worker on the side stream and the kicks on publishing streams
// (docs/design/programs.md *Kicks*), their parameters, and the wait for every kick's exit. core/publish.cpp
// decides when (its step 1b).
#include <algorithm>
#include <atomic>
#include <string>

#include "core/runtime.h"

namespace gpuos {

static std::atomic<bool> g_standby_first_look{true};
void set_standby_first_look(bool on) { g_standby_first_look.store(on, std::memory_order_relaxed); }
bool standby_first_look() { return g_standby_first_look.load(std::memory_order_relaxed); }

static std::atomic<double> g_live_idle_us{0.0};
void set_live_idle_us(double us) { g_live_idle_us.store(us > 0 ? us : 0.0, std::memory_order_relaxed); }
double live_idle_us() { return g_live_idle_us.load(std::memory_order_relaxed); }

void Runtime::maybe_launch_worker(uint32_t grid) {
  if (__atomic_load_n(&hc_->worker_state, __ATOMIC_SEQ_CST) != kWorkerExiting) return;
  launch_worker(grid, 0);
}

void Runtime::launch_worker(uint32_t grid, uint32_t gate) {
  const Driver& d = driver();
  const uint64_t old_standby = __atomic_load_n(&hc_->standby, __ATOMIC_SEQ_CST);
  if (gate) {
    // The side stream waits for the gate batch's ready word (its low word is the seq; GEQ is wrap-aware, and a
    // slot's later seqs are larger), then runs the launch below.
    __atomic_store_n(&hc_->standby, ((uint64_t)(launches_ + 1) << 32) | gate, __ATOMIC_SEQ_CST);
    const CUdeviceptr ready = dc_d_ + __builtin_offsetof(DevCtl, ready) + 8ull * (gate & (kMaxBatches - 1));
    CUstreamBatchMemOpParams wt = wait_geq(ready, gate);
    PhaseMark pm(phase_, "publish step 1b: cuStreamBatchMemOp(side stream waits for the ready word)");
    const CUresult r = d.cuStreamBatchMemOp(side_, 1, &wt, 0);
    if (r != CUDA_SUCCESS) {
      __atomic_store_n(&hc_->standby, old_standby, __ATOMIC_SEQ_CST);
      throw_cuda(r, "cuStreamBatchMemOp(side stream, wait for a ready word)", __FILE__, __LINE__);
    }
    st_.gated_launches++;
  }
  __atomic_store_n(&hc_->worker_state, kWorkerRunning, __ATOMIC_SEQ_CST);
  __atomic_store_n(&hc_->yield_request, 0u, __ATOMIC_SEQ_CST);
  WorkerArgs args = worker_args(++launches_, cfg_.kicks ? kStandbyKicks
                                             : !gate ? 0u
                                             : standby_first_look() ? kStandbyGated | kStandbyFirstLook
                                                                    : kStandbyGated);
  void* params[] = {&args};
  PhaseMark pm(phase_, "cuLaunchKernel(worker)");
  const CUresult r = d.cuLaunchKernel(worker_fn_, grid, 1, 1, cfg_.threads_per_block, 1, 1, 0, side_, params, nullptr);
  if (r != CUDA_SUCCESS) {
    // No worker runs: say so, or every later publication would trust a worker that does not exist and every
    // wait would time out. The batches stay published; the next publication launches a worker for them.
    --launches_;
    __atomic_store_n(&hc_->worker_state, kWorkerExiting, __ATOMIC_SEQ_CST);
    if (gate) __atomic_store_n(&hc_->standby, old_standby, __ATOMIC_SEQ_CST);
    throw_cuda(r, "cuLaunchKernel(worker)", __FILE__, __LINE__);
  }
  launched_grid_ = grid;
  st_.worker_launches++;
  if (grid != grid_) st_.burst_launches++;
}

WorkerArgs Runtime::worker_args(uint32_t gen, uint32_t standby) const {
  WorkerArgs args{};
  args.host_ctl = hc_d_;
  args.dev_ctl = dc_d_;
  args.ring = ring_d_;
  args.ring_dev = ring_dev_;
  args.capacity = cfg_.capacity;
  args.gen = gen;
  const double idle_us = program_launches_ && cfg_.program_idle_us >= 0 ? cfg_.program_idle_us
                                                                         : std::max(cfg_.idle_us, live_idle_us());
  args.idle_ns = (uint64_t)(idle_us * 1000.0);
  args.progs = progs_d_;
  args.trace = trace_d_;
  args.trace_records = trace_d_ ? cfg_.trace_records : 0u;
  args.keep_blocks = grid_;
  args.refs = refs_d_;
  args.refs_dev = refs_dev_;
  args.scratch = scratch_d_;
  args.standby = standby;
  args.handover = cfg_.handover_queue;
  return args;
}

void Runtime::launch_kick(CUstream stream, bool wait, uint32_t first) {
  const Driver& d = driver();
  WorkerArgs args = worker_args(++launches_, kStandbyKicks | kStandbyKick | (wait ? kStandbyKickWait : 0u) |
                                                 (module_epoch_ << kStandbyEpochShift));
  args.kick_first = first;
  args.kick_last = last_seq_;
  void* params[] = {&args};
  PhaseMark pm(phase_, "cuLaunchKernel(kick)");
  const CUresult r = d.cuLaunchKernel(worker_fn_, 1, 1, 1, cfg_.threads_per_block, 1, 1, 0, stream, params, nullptr);
  if (r != CUDA_SUCCESS) {
    // The batches stay published with no cover: a worker launch (ungated) runs them if none is resident.
    --launches_;
    __atomic_store_n(&hc_->worker_state, kWorkerExiting, __ATOMIC_SEQ_CST);
    throw_cuda(r, "cuLaunchKernel(kick)", __FILE__, __LINE__);
  }
  ++kicks_launched_;
  st_.kicks++;
}

void Runtime::wait_kicks(const char* what) {
  if (!cfg_.kicks || kicks_launched_ == 0) return;
  // The control stream waits for the count, the host for the control stream (with the timeout).
  CUstreamBatchMemOpParams wt = wait_geq(dc_d_ + __builtin_offsetof(DevCtl, kicks_done), kicks_launched_);
  GPUOS_CU(driver().cuStreamBatchMemOp(ctl_, 1, &wt, 0));
  sync_ctl((std::string("the kicks launched on the publishing streams to exit (") + what + ")").c_str());
}

}  // namespace gpuos
