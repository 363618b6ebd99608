// csrc/core/generation.cpp -- the runtime's side of operator injection: which generation's module the worker
// runs (handover: drain the worker, load the new module, relaunch on the same queue memory) and the dual-slot
// alias table the worker reads to pick an op's slot.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "core/runtime.h"
#include "driver/wait.h"
#include "inject/registry.h"
#include "jit/jit.h"

namespace gpuos {
namespace {
std::atomic<int> g_fail_loads{0};
constexpr CUresult kInvalidImage = 200;  // cuda.h CUDA_ERROR_INVALID_IMAGE
}  // namespace

void fail_next_module_loads(int n) { g_fail_loads.store(n); }

std::string Runtime::gen_startup_image() {
  arch_ = jit_arch_for(cc_major_, cc_minor_);
  registry_add_arch(arch_);
  const uint32_t g = g_latest_ready_gen.load();
  std::string image = *generation_image(g, arch_);
  active_gen_ = g;
  return image;
}

void Runtime::gen_init() {
  // The registry's alias choices (ops switched before this runtime existed), in stream order after the
  // DevCtl memset on the side stream and before any worker launch there.
  uint8_t table[256];
  current_alias_table(table);
  bool any = false;
  for (uint8_t v : table) any |= v != 0;
  std::memcpy(alias_host_[0], table, 256);
  alias_ver_ = any ? kAliasActive : 0u;
  if (!any) return;
  std::vector<CUstreamBatchMemOpParams> ops;
  const CUdeviceptr base = dc_d_ + __builtin_offsetof(DevCtl, alias);
  for (uint32_t j = 0; j < 64; ++j) {
    CUstreamBatchMemOpParams w{};
    w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    w.writeValue.address = base + __builtin_offsetof(AliasCtl, slot) + 4ull * j;
    std::memcpy(&w.writeValue.value, &table[4 * j], 4);
    ops.push_back(w);
  }
  CUstreamBatchMemOpParams w{};
  w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  w.writeValue.address = base + __builtin_offsetof(AliasCtl, ver);
  w.writeValue.value = alias_ver_;
  ops.push_back(w);
  GPUOS_CU(driver().cuStreamBatchMemOp(side_, (unsigned)ops.size(), ops.data(), 0));
}

void Runtime::gen_shutdown() {
  const Driver& d = driver();
  for (CUmodule m : old_modules_) d.cuModuleUnload(m);
  old_modules_.clear();
}

// Wait until no worker of ours is resident or queued (the side stream is idle), asking it to leave.
double Runtime::drain_worker(const char* why) {
  PhaseMark pm(phase_, "drain_worker");
  const Driver& d = driver();
  const auto t0 = std::chrono::steady_clock::now();
  CUresult r = d.cuStreamQuery(side_);
  if (r == CUDA_SUCCESS) return 0.0;
  __atomic_store_n(&hc_->yield_request, 1u, __ATOMIC_SEQ_CST);
  spin_wait(
      cfg_.timeout_s,
      [&] {
        const CUresult q = d.cuStreamQuery(side_);
        if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) GPUOS_CU(q);
        return q == CUDA_SUCCESS;
      },
      [&] {
        return "gpuos: timed out after " + std::to_string(cfg_.timeout_s) + " s waiting for the worker to exit (" +
               why + ") on " + name_ + "; worker state=" + std::to_string(hc_->worker_state) +
               ", last published batch " + std::to_string(last_seq_) + ". A batch flushed on a stream that never "
               "reaches its ready write keeps the worker resident; raise GPUOS_TIMEOUT_S if that stream's work is "
               "legitimately long.";
      });
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

Runtime::HandoverTimes Runtime::handover(uint32_t gen, const char* why) {
  const Driver& d = driver();
  make_current();
  HandoverTimes t;
  // Kicks: a kick still queued from the old module exits once it sees the new epoch (HostCtl::module_epoch), so
  // the batches it covers must have completed first (their kicks, or the resident worker, run them). The epoch
  // moves before the module load: a kick that started before it is resident during the load, which waits for it
  // (F3: nothing can land for it to run, the runtime's lock holds every publication); one that starts after it
  // exits at once. (Bumped after the load, a kick delayed past the load could take the token in between and run
  // the new module's first batch with the old module's code.) A failed load keeps the old module: the kicks
  // launched after it carry the new epoch, and every older one had nothing left to cover.
  if (cfg_.kicks && last_seq_) wait_seq(last_seq_, "a handover: every batch published before it");
  t.drain_us = drain_worker(why);
  __atomic_store_n(&hc_->module_epoch, ++module_epoch_ & (0xffffffffu >> kStandbyEpochShift), __ATOMIC_SEQ_CST);
  const auto t1 = std::chrono::steady_clock::now();
  const std::shared_ptr<const std::string> image = generation_image(gen, arch_);
  CUmodule m = nullptr;
  CUresult r = g_fail_loads.load() > 0 && g_fail_loads.fetch_sub(1) > 0 ? kInvalidImage
                                                                          : d.cuModuleLoadData(&m, image->data());
  CUfunction f = nullptr;
  if (r == CUDA_SUCCESS) {
    r = d.cuModuleGetFunction(&f, m, "gpuos_worker");
    if (r != CUDA_SUCCESS) d.cuModuleUnload(m);
  }
  if (r == CUDA_SUCCESS) {
    try {
      fit_stack(f);  // drained: no worker resident or awaited
    } catch (...) {
      d.cuModuleUnload(m);
      throw;
    }
  }
  if (r != CUDA_SUCCESS) {
    failed_load_gen_ = gen;
    const char* nm = "?";
    const char* text = "";
    d.cuGetErrorName(r, &nm);
    d.cuGetErrorString(r, &text);
    const std::string log = std::string("cuModuleLoadData / cuModuleGetFunction: ") + nm + ": " + text;
    const std::string msg = "gpuos: generation " + std::to_string(gen) + " (" + arch_ + ") failed to load on " +
                            name_ + "; generation " + std::to_string(active_gen_) + " keeps running. " + log;
    note_generation_load_error(gen, msg);
    throw CompileError(msg, log, arch_, "", "");  // a load failure counts as a failed generation
  }
  old_modules_.push_back(module_);  // kept until shutdown: unloading would wait on resident kernels (F3)
  module_ = m;
  worker_fn_ = f;
  active_gen_ = gen;
  st_.handovers++;
  t.load_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count();
  return t;
}

void Runtime::ensure_generation(uint32_t gen) {
  if (active_gen_ >= gen) return;
  const uint32_t target = g_latest_ready_gen.load();
  if (target < gen)
    throw std::logic_error("gpuos internal error: generation " + std::to_string(gen) + " needed but only " +
                           std::to_string(target) + " is ready");
  handover(target, "handover to a newer generation");
}

// Busy adoption (kicks, from a publication): a loop that publishes again within the worker's idle time keeps it
// resident for good -- a kick covers every batch, so nothing else makes it leave -- and a host that runs ahead of
// the device finds batches outstanding at every publication: without this, a newer generation (a program's tier-2
// code) waited for the loop to pause. Measured (H200, `program_probe.py callcost`, 16 x 256 programs of k
// mean-subtract rounds): back to back on a fast host, k = 4 / 8 ran 43.6 / 75.8 us per call on the interpreter
// against ~30 where the host was slow enough for the worker to idle out between calls. The wait is bounded
// (kAdoptWaitS: the published batches may wait for stream work that takes long); after one that timed out the next
// try waits a backoff (doubling from kAdoptBackoffS up to kAdoptBackoffMaxS), so that a stream held for long does not
// cost every publication the wait.
constexpr double kAdoptWaitS = 0.05, kAdoptBackoffS = 0.1, kAdoptBackoffMaxS = 10.0;

void Runtime::maybe_adopt_generation(bool busy) {
  const uint32_t latest = g_latest_ready_gen.load(std::memory_order_relaxed);
  if (latest <= active_gen_ || latest == failed_load_gen_) return;
  const bool resident = driver().cuStreamQuery(side_) != CUDA_SUCCESS;  // a worker is still resident or queued
  if (resident && !(busy && cfg_.kicks)) return;
  // Kicks: the handover waits for every published batch; one held back by stream work waits for its kick, and
  // an adoption must not hold the lock through that for long: an idle adoption leaves it to the next flush, a busy
  // one waits kAdoptWaitS at most.
  if (cfg_.kicks && last_seq_ && !seq_done(last_seq_)) {
    if (!busy || std::chrono::steady_clock::now() < adopt_retry_) return;
    PhaseMark pm(phase_, "a busy adoption: the published batches (bounded)");
    if (!spin_until(kAdoptWaitS, [&] { return seq_done(last_seq_); })) {
      adopt_backoff_s_ = adopt_backoff_s_ <= 0.0 ? kAdoptBackoffS : std::min(2.0 * adopt_backoff_s_, kAdoptBackoffMaxS);
      adopt_retry_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(adopt_backoff_s_));
      return;
    }
  }
  try {
    handover(latest, resident ? "a publication's adoption" : "idle exit");  // resident: drain asks it to yield
    adopt_backoff_s_ = 0.0;
    if (resident) st_.busy_adoptions++;
  } catch (const std::exception&) {
    // Recorded (note_generation_load_error); the old generation keeps running. A flush that needs the
    // generation retries the load and raises.
  }
}

bool Runtime::adopt_generation_if_idle() {
  std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
  if (!lk.owns_lock() || !alive_) return false;  // busy: the next flush adopts it (maybe_adopt_generation)
  const uint64_t before = st_.handovers;
  try {
    make_current();
    maybe_adopt_generation(false);
  } catch (const std::exception&) {
    return false;  // no context on this thread: the flush path adopts it
  }
  if (st_.handovers == before) return false;
  st_.idle_adoptions++;
  return true;
}

Runtime::HandoverTimes Runtime::force_handover() {
  HandoverTimes t = handover(active_gen_, "explicit handover");
  const auto t0 = std::chrono::steady_clock::now();
  maybe_launch_worker(grid_);
  t.launch_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

void Runtime::sync_ctl(const char* what) {
  wait_stream(ctl_, cfg_.timeout_s, std::string(what) + " on " + name_);
}

void Runtime::set_alias_table(const uint8_t* table) {
  const uint32_t cur = alias_ver_ & 1u, nxt = cur ^ 1u;
  if (std::memcmp(table, alias_host_[cur], 256) == 0) return;
  make_current();
  // Batches published before the last flip may have opened on the version about to be rewritten.
  if (alias_flip_seq_) wait_seq(alias_flip_seq_, "batches that may still read the alias-table version being rewritten");
  std::memcpy(alias_host_[nxt], table, 256);
  bool any = false;
  for (uint32_t i = 0; i < 256; ++i) any |= table[i] != 0;
  const uint32_t ver = nxt | (any ? kAliasActive : 0u);
  CUstreamBatchMemOpParams ops[65];
  const CUdeviceptr base = dc_d_ + __builtin_offsetof(DevCtl, alias);
  for (uint32_t j = 0; j < 64; ++j) {
    CUstreamBatchMemOpParams& w = ops[j];
    w = CUstreamBatchMemOpParams{};
    w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    w.writeValue.address = base + __builtin_offsetof(AliasCtl, slot) + 256ull * nxt + 4ull * j;
    std::memcpy(&w.writeValue.value, &table[4 * j], 4);
    w.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  }
  // Written last, after a memory barrier (WRITE_VALUE_DEFAULT): a poller that sees the new version sees its row.
  ops[64] = CUstreamBatchMemOpParams{};
  ops[64].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[64].writeValue.address = base + __builtin_offsetof(AliasCtl, ver);
  ops[64].writeValue.value = ver;
  ops[64].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  GPUOS_CU(driver().cuStreamBatchMemOp(ctl_, 65, ops, 0));
  sync_ctl("an alias-table switch");
  alias_ver_ = ver;
  alias_flip_seq_ = last_seq_;
}

}  // namespace gpuos
