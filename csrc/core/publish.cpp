// csrc/core/publish.cpp -- publication: staged levels -> ring -> batches in stream order; when the worker and the
// kicks are launched (core/launch.cpp launches them); every wait of the host for a batch.
//
// flush() issues one cuStreamBatchMemOp on the user's stream that (a) writes each level's ready word in device
// memory -- so the worker opens a level only after the stream work queued before the flush -- and (b) makes
// the stream wait for the last level's done word -- so later stream work sees the outputs. No host sync. Between
// them, a kick on the same stream (or, with GPUOS_KICKS=0, a worker launch on a side stream when the Dekker
// handshake says none is running); the resident worker exits by itself after idle_us.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <stdexcept>

#include "core/runtime.h"
#include "driver/wait.h"
#include "inject/registry.h"
#include "ops/op_table.h"

namespace gpuos {

// cuStreamBatchMemOp takes fewer than 256 operations: one ready write per level plus the final wait.
constexpr size_t kMaxLevelsPerFlush = 200;
// A level with this many matmul items launches the worker on the burst grid (streaming a weight wants every SM).
constexpr uint32_t kHeavyBurst = 64;

uint32_t heavy_items(const SubOp* descs, size_t n) {
  uint32_t heavy = 0;
  for (size_t i = 0; i < n; ++i) heavy += descs[i].op == kOp_mm || descs[i].op == kOp_sdpa;
  return heavy;
}

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

// The oldest unfinished batch and the ops of its sub-ops, for a timeout's message: the one that does not end
// (an injected op that loops) or that waits for its stream.
std::string Runtime::describe_unfinished() const {
  uint64_t start = desc_tail_;
  for (const InFlight& f : inflight_) {
    if (!seq_done(f.seq)) {
      if (f.desc_end == start)  // its descriptors are a program's resident image (replay_image), not in the ring
        return "oldest unfinished batch " + std::to_string(f.seq) + " (a level of a replayed program)";
      std::map<uint32_t, uint64_t> count;
      for (uint64_t i = start; i < f.desc_end; ++i) count[ring_[i % cfg_.capacity].op]++;
      std::string ops;
      for (auto& [op, n] : count) {
        if (!ops.empty()) ops += ", ";
        ops += op < (uint32_t)kNumOps ? kOps[op].name
               : op == kOpFused       ? "fused chain"
                                      : "injected op '" + user_op_name(op) + "' (id " + std::to_string(op) + ")";
        ops += " x" + std::to_string(n);
      }
      return "oldest unfinished batch " + std::to_string(f.seq) + " (" + std::to_string(f.desc_end - start) +
             " sub-ops: " + ops + ")";
    }
    start = f.desc_end;
  }
  return "no unfinished batch in flight";
}

void Runtime::wait_seq(uint32_t seq, const char* what) {
  PhaseMark pm(phase_, what);
  uint32_t polls = 0;
  spin_wait(
      cfg_.timeout_s,
      [&] {
        if (seq_done(seq)) return true;
        // Now and then, whether the worker died: a faulted kernel never writes its done word, and the wait
        // should say so at once rather than time out.
        if ((++polls & 4095) == 0) {
          const CUresult q = driver().cuStreamQuery(side_);
          if (is_sticky(q)) throw_cuda(q, "the GPUOS worker kernel", __FILE__, __LINE__);
        }
        return false;
      },
      [&] {
        return std::string("gpuos: timed out after ") + std::to_string(cfg_.timeout_s) + " s waiting for batch " +
               std::to_string(seq) + " (" + what + ") on " + name_ + "; " + describe_unfinished() +
               "; done word=" + std::to_string(hc_->done[seq & (kMaxBatches - 1)]) + ", host published=" +
               std::to_string(hc_->host_published) + ", worker state=" +
               (hc_->worker_state == kWorkerRunning ? "running" : "exited") +
               ". An injected op that never returns keeps its batch open; otherwise the stream it was flushed on "
               "may be blocked by other work (raise GPUOS_TIMEOUT_S if that work is legitimately long).";
      });
}

template <class Full>
void Runtime::wait_oldest_while(Full full, const char* what, const char* broken) {
  while (full()) {
    if (inflight_.empty()) {
      if (broken) throw std::logic_error(std::string("gpuos internal error: ") + broken);
      return;
    }
    st_.room_waits++;
    wait_seq(inflight_.front().seq, what);
    retire();
  }
}

void Runtime::ensure_ref_room(uint32_t nref) {
  retire();
  auto fits = [&] { return ref_head_ + nref - ref_tail_ <= ref_capacity_; };
  if (fits()) return;
  // Full: publish what is pending (it may be what fills the arena), then wait for the oldest batches.
  if (has_pending()) {
    st_.full_queue_flushes++;
    flush(record_stream());
  }
  wait_oldest_while([&] { return !fits(); }, "room in the TensorRef arena",
                    "TensorRef arena accounting broken (nothing in flight, no room)");
}

bool Runtime::ring_room(uint32_t ndesc) {
  retire();
  return desc_head_ + ndesc - desc_tail_ <= cfg_.capacity;
}

void Runtime::wait_ring_room(uint32_t ndesc) {
  wait_oldest_while([&] { return !ring_room(ndesc); }, "room in the descriptor ring",
                    "ring accounting broken (nothing in flight, no room)");
}

void Runtime::wait_batch_room(size_t n) {
  retire();
  wait_oldest_while([&] { return levels_.size() + inflight_.size() + n >= kMaxBatches / 2; },
                    "room for a whole publication (batches in flight)", nullptr);
}

// How a level's descriptors reach the worker (in stream order, before the level's ready word):
//   >= Config::dma_min descriptors: one async copy-engine transfer into the device ring (PCIe at full rate);
//   fewer: the worker reads them from the pinned ring with coalesced 16-byte loads (one PCIe round trip).
// Measured on H200 (tools/roundtrip_probe.py): delivering a 1-descriptor level by 64-bit memop writes instead made the
// round trip slower (15.5 us vs 11.3 us), so small levels are read from pinned memory.
uint32_t Runtime::flush(CUstream stream, bool early) {
  if (staged_ == 0 && levels_.empty()) {
    if (early || unwaited_seq_ == 0) return 0;
    // Everything was published early: only the stream wait is missing.
    make_current();
    CUstreamBatchMemOpParams wt =
        wait_geq(dc_d_ + __builtin_offsetof(DevCtl, done) + 4ull * (unwaited_seq_ & (kMaxBatches - 1)), unwaited_seq_);
    PhaseMark pm(phase_, "flush: cuStreamBatchMemOp(stream wait for an early publication)");
    GPUOS_CU(driver().cuStreamBatchMemOp(stream, 1, &wt, 0));
    unwaited_seq_ = 0;
    hazards_.clear();  // the flush is whole: nothing recorded later joins its levels
    level_mm_.clear();
    join_base_ = 0;
    st_.flushes++;
    if (on_publish_) on_publish_();
    return last_seq_;
  }
  // Staged levels go into the ring in level order and out in publications of at most kMaxLevelsPerFlush
  // levels (one memop call each; batch slots are finite too).
  uint32_t seq = 0;
  size_t li = 0;
  if (!join_stage_.empty()) {
    // What joins the last published level goes first, so that its batch follows that level's (otherwise,
    // with committed levels already ahead of it, it waits for them like any level: later, never wrong).
    const bool beside = levels_.empty();
    commit_level(join_stage_);
    levels_.back().join = beside;
  }
  do {
    while (li < stage_levels_ && can_commit_level()) {
      // A level that has to wait for room in the ring goes in a publication after those committed before it, so
      // that the worker runs them while the host waits: committing every level first left the worker idle from
      // the first wait to the flush's end (test_flush_publishes_before_waiting_for_ring_room; not timed).
      if (!levels_.empty() && !ring_room((uint32_t)stage_[li].size())) {
        st_.room_publishes++;
        break;
      }
      commit_level(stage_[li++]);
    }
    seq = publish(stream, early, li == stage_levels_);
  } while (li < stage_levels_);
  stage_levels_ = 0;
  staged_ = 0;
  // An early publication keeps the flush's hazard state: what the rest of the flush records with no hazard
  // against the last published level joins it (append_tiles). A whole flush forgets it.
  if (early && cfg_.join_levels) {
    join_base_ = hazards_.max_level();
  } else {
    hazards_.clear();
    level_mm_.clear();
    join_base_ = 0;
  }
  return seq;
}

bool Runtime::can_commit_level(bool resident) const {
  // A resident level takes up to two memory writes of the publication's one cuStreamBatchMemOp call (< 256
  // operations, Runtime::kMaxPreOps of them maybe replay_image's TensorRef writes).
  static_assert(kMaxLevelsPerFlush + Runtime::kMaxPreOps < 256, "one publication's memory writes in one call");
  const size_t most = resident ? kMaxLevelsPerFlush / 2 : kMaxLevelsPerFlush;
  return levels_.size() < most && (levels_.empty() || levels_.size() + inflight_.size() < kMaxBatches / 2);
}

void Runtime::commit_level(std::vector<SubOp>& descs) {
  if (descs.empty()) return;
  commit_ring(descs.data(), (uint32_t)descs.size());
  descs.clear();
}

void Runtime::commit_ring(const SubOp* descs, uint32_t n, bool dma) {
  wait_ring_room(n);
  const uint64_t start = desc_head_;
  const uint32_t a = (uint32_t)(start % cfg_.capacity);
  const uint32_t first = std::min(n, cfg_.capacity - a);
  std::memcpy((void*)&ring_[a], descs, (size_t)first * sizeof(SubOp));
  if (first < n) std::memcpy((void*)&ring_[0], descs + first, (size_t)(n - first) * sizeof(SubOp));
  desc_head_ += n;
  levels_.push_back({start, n, heavy_items(descs, n), 0, dma});
}

// Publish the committed levels as batches, one per level, in one cuStreamBatchMemOp call. `last`: no further
// publication follows in this flush (only then may the TensorRefs recorded for the flush be reclaimed once
// its batches are done, and the keep-alive references go).
uint32_t Runtime::publish(CUstream stream, bool early, bool last) {
  ScopedNs timed(st_.publish_ns);
  make_current();
  // Generations, before anything is published (a module load must not wait behind a stream that
  // waits for work no worker would run): a pending sub-op that needs a newer generation drains the worker and
  // loads it; otherwise a newer ready generation takes over (maybe_adopt_generation: at once if the worker has left,
  // with kicks also after the published batches complete when it has not).
  // (pending_need_gen_ is never reset: an op whose tiles straddle a ring-full flush keeps its need.)
  {
    ScopedNs gen(st_.publish_gen_ns);
    if (pending_need_gen_ > active_gen_) ensure_generation(pending_need_gen_);
    else maybe_adopt_generation(true);
  }
  const Driver& d = driver();
  // An early publication is bulk work: if a worker on the bounded grid is resident and idle (everything
  // published has run), let it leave so that this publication launches one on the burst grid. (A busy one keeps
  // the work: waiting for it here would block the recording thread.)
  retire();
  if (early && launched_grid_ < burst_grid_ && inflight_.empty() &&
      __atomic_load_n(&hc_->worker_state, __ATOMIC_SEQ_CST) == kWorkerRunning) {
    ScopedNs waiting(st_.publish_wait_ns);
    drain_worker("an early publication moving to the burst grid");
  }
  // Lazy module loading: the first launch of a kernel waits until no kernel is resident. If such a launch is
  // queued on this stream, a resident worker waiting for the ready word behind it never leaves: a deadlock (the
  // soak wedged an H100 within 50 chains this way; none with eager loading). The runtime cannot see what the
  // stream holds, so with lazy loading a publication behind unfinished stream work lets the worker leave first.
  if (lazy_loading_ && __atomic_load_n(&hc_->worker_state, __ATOMIC_SEQ_CST) == kWorkerRunning &&
      d.cuStreamQuery(stream) != CUDA_SUCCESS) {
    st_.lazy_drains++;
    drain_worker("a publication behind unfinished stream work under lazy module loading");
  }
  std::vector<CUstreamBatchMemOpParams>& ops = memops_;
  ops.assign(pre_ops_.begin(), pre_ops_.end());  // replay_image's TensorRef writes, before any ready word
  retire();
  {
    ScopedNs waiting(st_.publish_wait_ns);
    wait_oldest_while([&] { return inflight_.size() + levels_.size() >= kMaxBatches - 1; },  // slot reuse: old done
                      "a free batch slot", "batch slot accounting broken (nothing in flight, no free slot)");
  }
  std::vector<Level> publishing;
  publishing.swap(levels_);
  // TensorRefs are reclaimed batch by batch (retire): only the flush's last batch may release the refs recorded
  // for the flush, which earlier levels and later publications of it still read.
  const uint64_t held_refs = inflight_.empty() ? ref_tail_ : inflight_.back().ref_end;
  const uint32_t first_seq = last_seq_ + 1;  // this publication's first batch
  uint64_t publishing_subops = 0;
  bool heavy = false;
  for (const Level& lv : publishing) {
    publishing_subops += lv.count;
    heavy = heavy || lv.heavy >= kHeavyBurst;
  }
  bool refs_sent = false;
  // Many levels: one copy of the flush's descriptors (contiguous in the ring) instead of one per level; not when
  // resident levels (replay_image) are among them (those copy nothing; their ring levels go one by one).
  bool any_res = false;
  for (const Level& lv : publishing) any_res = any_res || lv.res;
  const bool one_copy = cfg_.dma_levels && publishing.size() >= cfg_.dma_levels && !any_res;
  // If anything below fails, nothing was published: undo the bookkeeping so the levels stay pending (a later
  // flush publishes them) and no seq is left "published but never ready" for a waiter to time out on.
  size_t pushed = 0;
  uint32_t bell = 0;  // the last seq given a ready word of its own (a gated launch waits for that word)
  auto undo = [&] {
    for (; pushed > 0; --pushed) {
      inflight_.pop_back();
      --last_seq_;
      st_.batches--;
    }
    levels_ = std::move(publishing);
  };
  try {
    ScopedNs copies(st_.publish_copy_ns);
    // Programs first recorded since the last publication: copied in stream order before any ready word.
    for (const int32_t id : prog_unsent_)
      GPUOS_CU(d.cuMemcpyHtoDAsync(progs_d_ + (uint64_t)id * sizeof(Program), &progs_h_[id], sizeof(Program), stream));
    for (const Level& lv : publishing) {
      const uint32_t seq = ++last_seq_;
      const uint32_t slot = seq & (kMaxBatches - 1);
      const uint32_t start = (uint32_t)(lv.start % cfg_.capacity);
      uint32_t src = 0, word_count = lv.count;
      if (lv.run < 0) {  // a later piece of a run: the poller fills its batch from the run's table
      } else if (lv.run > 1) {  // a run of resident pieces: its table entry, then one ready word for all of them
        ops.push_back(memop_write64(dc_d_ + __builtin_offsetof(DevCtl, bdesc) + 8ull * slot, lv.table));
        src = kReadyDevRing | kReadyResident | kReadyProgram;
        word_count = (uint32_t)lv.run;
        st_.program_bells++;
      } else if (lv.res) {  // resident descriptors and TensorRefs: their address, then the ready word (its fence orders)
        ops.push_back(memop_write64(dc_d_ + __builtin_offsetof(DevCtl, bdesc) + 8ull * slot, lv.res));
        src = kReadyDevRing | kReadyResident;
      } else if (one_copy || lv.count >= cfg_.dma_min || lv.heavy || lv.dma) {
        // The live TensorRefs not yet in the device mirror go there first, once per publication, before any
        // DMA-delivered level's ready write. Not just those recorded since the last publication: a flush of many
        // levels publishes in pieces, and its refs were all recorded before the first piece; when that piece
        // went without a DMA level, a later DMA piece (a matmul level) read a stale mirror -- garbage pointers
        // (CUDA_ERROR_ILLEGAL_ADDRESS in W5's program setup; silently wrong results where old refs were valid).
        const uint64_t lo = std::max(ref_mirrored_, ref_tail_);
        if (!refs_sent && ref_head_ > lo) {
          const uint64_t a = lo % ref_capacity_, n = ref_head_ - lo;
          const uint64_t n1 = std::min<uint64_t>(n, ref_capacity_ - a);
          GPUOS_CU(d.cuMemcpyHtoDAsync(refs_dev_ + a * sizeof(TensorRef), &refs_[a], n1 * sizeof(TensorRef), stream));
          if (n1 < n) GPUOS_CU(d.cuMemcpyHtoDAsync(refs_dev_, &refs_[0], (n - n1) * sizeof(TensorRef), stream));
          refs_sent = true;
        }
        // One level's descriptors, or (one_copy, at the first level) every level's: they are contiguous.
        const uint32_t count = !one_copy ? lv.count
            : &lv == &publishing.front() ? (uint32_t)(publishing.back().start + publishing.back().count - lv.start) : 0;
        const uint32_t first = std::min(count, cfg_.capacity - start);
        if (first)
          GPUOS_CU(d.cuMemcpyHtoDAsync(ring_dev_ + (uint64_t)start * sizeof(SubOp), &ring_[start],
                                       (size_t)first * sizeof(SubOp), stream));
        if (first < count)
          GPUOS_CU(d.cuMemcpyHtoDAsync(ring_dev_, &ring_[0], (size_t)(count - first) * sizeof(SubOp), stream));
        src = kReadyDevRing;
        st_.dma_batches++;
      }
      if (lv.join) {
        src |= kReadyJoin;
        st_.joined_batches++;
      }
      if (lv.run >= 0) {
        ops.push_back(memop_write64(dc_d_ + __builtin_offsetof(DevCtl, ready) + 8ull * slot,
                                    ((uint64_t)(word_count | src) << 32) | seq));
        bell = seq;
      }
      const bool final_batch = last && &lv == &publishing.back();
      inflight_.push_back({seq, lv.res ? lv.start : lv.start + lv.count, final_batch ? ref_head_ : held_refs});
      ++pushed;
      st_.batches++;
    }
  } catch (...) {
    undo();
    throw;
  }
  // Three steps, in this order, so that the device never depends on a driver call this thread has yet to make.
  // Another thread may at any moment enter a device-wide blocking call (cudaFree through empty_cache, a cuBLAS
  // handle's creation, cuModuleLoadData: F3) that waits for every stream and kernel while holding the context
  // lock our next driver call needs. Whatever the device runs or waits for at that moment must finish without us:
  //   1. the ready words (one cuStreamBatchMemOp): nothing on the device waits for them; a resident worker runs
  //      the batches as the words land, or leaves when idle (host_published is not yet ahead of it);
  //   2. Dekker, host side: store host_published, full fence, read worker_state; launch a worker if none runs
  //      (a resident worker now waits for the ready words, which are already in the stream);
  //   3. the stream's wait for the last batch (a second memop call): the worker it waits for is on the device.
  // With the wait in step 1 (one call), a blocking call between 1 and 2 waited for our stream, which waited
  // for a worker whose launch waited for that call's lock: the stress test wedged with the GPU idle. With
  // host_published stored before step 1, a resident worker waited for ready words a blocked thread had yet to
  // write (the regression test wedged in seconds).
  CUresult r;
  {
    ScopedNs memop(st_.publish_memop_ns);
    PhaseMark pm(phase_, "publish step 1: cuStreamBatchMemOp(ready words)");
    r = d.cuStreamBatchMemOp(stream, (unsigned)ops.size(), ops.data(), 0);
  }
  if (r != CUDA_SUCCESS) {
    undo();
    throw_cuda(r, "cuStreamBatchMemOp(stream, n, ops, 0)", __FILE__, __LINE__);
  }
  st_.publications++;
  prog_unsent_.clear();
  pre_ops_.clear();
  pending_subops_ = 0;
  if (refs_sent) ref_mirrored_ = ref_head_;
  // Until the stream waits for these batches, a later flush() must add the wait (also if a step below throws:
  // the batches stay published; the next publication launches a worker for them).
  unwaited_seq_ = last_seq_;
  const uint32_t grid =
      cfg_.burst_min && (early || heavy || publishing_subops >= cfg_.burst_min) ? burst_grid_ : grid_;
  // 1b. Kicks (Config::kicks, the default): the cover of these batches is the kick behind their ready words on
  //     this stream; a worker launch, when none runs, is ungated (it may leave after its idle time whatever is
  //     published). A small publication may go without one (Config::kick_alone): its kick runs it alone.
  if (cfg_.kicks) {
    ScopedNs launching(st_.publish_launch_ns);
    launch_kick(stream, cfg_.kick_wait && !early, first_seq);
    __atomic_store_n(&hc_->host_published, last_seq_, __ATOMIC_SEQ_CST);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (cfg_.kick_alone == 0 || early || heavy || publishing_subops > cfg_.kick_alone) maybe_launch_worker(grid);
  } else {
    // 1b. Standbys (GPUOS_KICKS=0): stream work still ahead of the ready words (the stream is not idle): the
    //     worker that runs them is a launch gated on the last word (a wait on the side stream, then the launch),
    //     so no kernel of ours sits resident while that work runs -- it may need the device free of resident
    //     kernels (the regression test wedged with a worker waiting for a ready word that never landed while a
    //     fresh thread's first cuBLAS call waited for the device). A resident worker leaves after idle_us once
    //     such a standby covers its batch (HostCtl::standby). host_published is not stored yet: a resident
    //     worker may still idle out.
    ScopedNs launching(st_.publish_launch_ns);
    bool covered = false;
    {
      PhaseMark pm(phase_, "publish step 1b: cuStreamQuery(stream)");
      const CUresult q = d.cuStreamQuery(stream);
      if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) throw_cuda(q, "cuStreamQuery(stream)", __FILE__, __LINE__);
      if (q == CUDA_ERROR_NOT_READY && bell) {
        launch_worker(grid, bell);
        covered = true;
      }
    }
    __atomic_store_n(&hc_->host_published, last_seq_, __ATOMIC_SEQ_CST);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!covered) maybe_launch_worker(grid);
  }
  // The stream waits for the last batch (batches complete in order: for all of them), except after an early
  // publication: the host is still recording, and the flush() that follows adds the wait.
  if (!early) {
    CUstreamBatchMemOpParams wt =
        wait_geq(dc_d_ + __builtin_offsetof(DevCtl, done) + 4ull * (last_seq_ & (kMaxBatches - 1)), last_seq_);
    ScopedNs memop(st_.publish_memop_ns);
    PhaseMark pm(phase_, "publish step 3: cuStreamBatchMemOp(stream wait)");
    GPUOS_CU(d.cuStreamBatchMemOp(stream, 1, &wt, 0));
    unwaited_seq_ = 0;
  }
  if (!early && last) st_.flushes++;
  // Keep-alive references may go once the stream waits for the work (a later allocation on that stream cannot
  // reuse the memory before the worker is done with it): not after an early publication.
  if (!early && last && on_publish_) {
    ScopedNs hook(st_.publish_hook_ns);
    on_publish_();
  }
  return last_seq_;
}

std::string Runtime::snapshot() const {
  const uint32_t last = __atomic_load_n(&last_seq_, __ATOMIC_RELAXED);
  const uint32_t hp = __atomic_load_n(&hc_->host_published, __ATOMIC_ACQUIRE);
  const uint32_t ws = __atomic_load_n(&hc_->worker_state, __ATOMIC_ACQUIRE);
  std::string s = name_ + ": last published batch " + std::to_string(last) + ", host_published " +
                  std::to_string(hp) + ", worker " + (ws == kWorkerRunning ? "running" : "exited") +
                  ", yield_request " + std::to_string(__atomic_load_n(&hc_->yield_request, __ATOMIC_RELAXED)) +
                  ", unwaited " + std::to_string(__atomic_load_n(&unwaited_seq_, __ATOMIC_RELAXED)) + ", done words";
  for (uint32_t q = last > 3 ? last - 3 : 1; q <= last; ++q)
    s += " [" + std::to_string(q) + "]=" +
         std::to_string(__atomic_load_n(&hc_->done[q & (kMaxBatches - 1)], __ATOMIC_RELAXED));
  s += ", worker launches " + std::to_string(__atomic_load_n(&launches_, __ATOMIC_RELAXED)) + " (last started " +
       std::to_string(__atomic_load_n(&hc_->worker_started, __ATOMIC_RELAXED)) + ", last exited " +
       std::to_string(__atomic_load_n(&hc_->worker_exited, __ATOMIC_RELAXED)) + ", last waited for batch " +
       std::to_string(__atomic_load_n(&hc_->polling_seq, __ATOMIC_RELAXED)) + ")";
  const char* ph = phase_.load(std::memory_order_relaxed);
  s += std::string(", in: ") + (ph && *ph ? ph : "no driver call or wait");
  return s;
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
  wait_kicks("shutdown");  // a kick still queued reads DevCtl, freed below
  inflight_.clear();
  // Ask the worker to leave now that nothing is published, and wait for the side stream to drain (F3:
  // freeing memory while it is resident would block).
  __atomic_store_n(&hc_->yield_request, 1u, __ATOMIC_SEQ_CST);
  wait_stream(side_, cfg_.timeout_s, "the worker to exit (shutdown) on " + name_);
  alive_ = false;
  d.cuStreamDestroy(side_);
  d.cuMemFree(dc_d_);
  d.cuMemFree(ring_dev_);
  d.cuMemFree(refs_dev_);
  d.cuMemFree(progs_d_);
  d.cuMemFree(scratch_d_);
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
