// csrc/core/runtime.h -- the per-device runtime: dependency levels, descriptor ring, batch publication, the
// elastic worker, generation handover and the alias table. Torch-free: it records Operands.
//
// Files: core/runtime.cpp (setup, teardown), core/record.cpp (sub-ops and their levels), core/publish.cpp
// (ring, batches, worker launch, waits), core/generation.cpp (handover, alias table).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/hazards.h"
#include "core/matmul_plan.h"
#include "core/tape.h"
#include "device_src/interp.h"
#include "device_src/types.h"
#include "driver/cuda_api.h"

namespace gpuos {

// Fault injection for tests: the next n generation module loads fail as an invalid image would.
void fail_next_module_loads(int n);
// Gated standby launches decide at their first idle poll (device_src/types.h kStandbyFirstLook; default on).
// A/B measurements (gpuos_ext._testing.set_standby_first_look).
void set_standby_first_look(bool on);
bool standby_first_look();
// The live window (sched/flush.cpp sched_live_window: a scheduler context's flush timer runs): worker launches
// other than a program call's idle at least this long, so one worker stays resident across the timer's flushes
// instead of one launch per flush (the timer flushes every ~2-3 ms; Config::idle_us is 200 us). 0: off.
void set_live_idle_us(double us);
double live_idle_us();

struct Config {
  uint32_t capacity = 4096;        // descriptor ring slots
  uint32_t threads_per_block = 256;
  uint32_t worker_blocks = 0;      // 0: about a quarter of the SMs (a resident worker on every SM blocks cuBLAS GEMMs)
  // A worker launched by a flush of >= burst_min sub-ops gets burst_blocks (0: every SM) until it idles out or
  // yields: big batches are bandwidth work a quarter of the SMs cannot feed. 0 disables. (Env GPUOS_BURST_MIN,
  // GPUOS_BURST_BLOCKS.)
  uint32_t burst_min = 2048;
  uint32_t burst_blocks = 0;
  // Recording that has accumulated >= publish_min sub-ops since the last publication publishes them at once
  // (on the burst grid, without a stream wait): the GPU runs while the host records the rest, and the next
  // flush() orders the stream after everything. 0 disables. (Env GPUOS_PUBLISH_MIN.)
  uint32_t publish_min = 1024;
  // An early publication's hazard state is kept for the rest of the flush: what the next pieces record with no
  // hazard against its last level runs beside that level (kReadyJoin) instead of after it. (Env
  // GPUOS_JOIN_LEVELS=0: off.)
  bool join_levels = true;
  double idle_us = 200.0;          // worker exits after this long with nothing published
  // ... when a program call launched it (< 0: idle_us). A device sync waits for a resident worker's exit: one small
  // program call then torch.cuda.synchronize() took ~250 us at 200, ~67 us at 20, and calls back to back 57-61 /
  // 31 us (H200, forty-second session, tools/program_probe.py callcost); a live flush's worker keeps idle_us.
  double program_idle_us = 20.0;
  double timeout_s = 60.0;         // every GPU wait
  uint32_t trace_records = 0;      // > 0: claim trace, this many records per block (env GPUOS_TRACE)
  uint32_t dma_min = 128;          // levels of >= this many descriptors reach the device by one async copy
  // A flush of >= dma_levels levels reaches the device by one copy of its descriptors (and one of its
  // TensorRefs): small levels read from pinned host memory cost a PCIe round trip per load chain (a replayed
  // program is ~100 such levels per decode step). 0: never.
  uint32_t dma_levels = 4;
  uint32_t mm_items = 1024;  // K slices of worker matmuls: about this many items per product (env GPUOS_MM_ITEMS)
  // ... for a product recorded outside a capture (env GPUOS_MM_ITEMS_LIVE): a live flush copies its descriptors and
  // publishes each level as it is recorded, ~35 us of host per 4,096^2 product at 1,024 items, ~17-24 at 512 (GPU
  // 30.6-32.9 against 36.1-40.4 us), while a program's image pays no copy and runs 1,024 faster (24.8 against 27.6
  // us; tools/matmul_host.py MH_ITEMS, H200, forty-first session).
  uint32_t mm_items_live = 512;
  bool mm_spread = true;     // a level's products share those items (level_cut; env GPUOS_MM_SPREAD)
  uint32_t attn_min_rows = 64;  // fewest kv positions per KV split of decode attention (env GPUOS_ATTN_MIN_ROWS)
  // A split tile that one claim holds whole is combined in shared memory, without global partials, counter or
  // fences: a captured attention's items in tile-major order (kAttnTileMajor), a split-K matmul's small partials
  // (kMmLocal) (env GPUOS_LOCAL_COMBINE=0: off).
  bool local_combine = true;
  // A program's levels get home blocks (ProgLevel::home): every level of one kind of work on the same few SMs, whose
  // instruction caches keep its code; this many blocks per claim of the level (env GPUOS_HOME_LEVELS; 0: off).
  uint32_t home_levels = 1;
  uint32_t handover_queue = 1;  // queued standby launches at which an idle worker leaves (GPUOS_HANDOVER_QUEUE)
  // Every publication launches a kick on its stream behind its ready words (one block of the worker kernel: it runs
  // what has landed if no launch holds the poller token) instead of a gated standby on the side stream; a resident
  // worker then leaves after its idle time whatever is published (docs/design/programs.md *Kicks*; GPUOS_KICKS=0:
  // the gated standbys, as before the forty-fifth session).
  bool kicks = true;
  // With kicks: a publication of at most this many sub-ops and no heavy level launches no worker when none is
  // resident -- its kick runs it alone, one block on the caller's stream (GPUOS_KICK_ALONE; 0: off).
  uint32_t kick_alone = 0;
  // With kicks: a kick that finds the poller token held stays, running claims, until its publication's batches are
  // done, so that its stream passes the wait after it at once (device_src/types.h kStandbyKickWait; GPUOS_KICK_WAIT).
  bool kick_wait = false;
};
// KV splits of a decode attention of `tiles` tiles (row groups) over Lk kv positions for a ring of `capacity`
// slots, each split at least `min_rows` positions, at most `max_split` splits (core/record.cpp;
// gpuos_ext._testing.attention_split).
uint32_t attention_split(int64_t tiles, int64_t Lk, uint32_t capacity, uint32_t min_rows,
                         uint32_t max_split = kAttnMaxSplit);
// Units (elements or rows) per descriptor of an op of `total` units while a program is captured: per_tile, or
// less so that the op spreads over more warps (core/record.cpp; gpuos_ext._testing.capture_tile).
uint64_t capture_tile(uint64_t per_tile, uint64_t total, uint64_t min_units);
// Matmul and attention items among n descriptors (a level of them goes by DMA; many launch on the burst grid).
uint32_t heavy_items(const SubOp* descs, size_t n);
// Defaults with the environment's settings applied (config/config.h).
Config config_from_env();

// One operand as the recorder sees it (filled by the binding layer from a tensor).
struct Operand {
  uint64_t ptr = 0;       // data pointer (storage offset applied)
  uint32_t dtype = 0;     // DType
  int ndim = 0;
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;
  bool contiguous = true;
  Access fp;              // what the view touches, for dependency tracking (core/hazards.h)
  bool is_const = false;  // a scalar operand (Tensor-Scalar forms): `value`, no memory
  float value = 0.0f;
  const Access& access() const { return fp; }
};

// The runtime's counters, one list: the struct, the sum over devices and gpuos_ext.stats() are expanded from it.
#define GPUOS_RUNTIME_STATS(X)                                                                            \
  X(submitted)                                                                                            \
  X(subops)                                                                                               \
  X(batches)                                                                                              \
  X(flushes)                                                                                              \
  X(publications)       /* Runtime::publish calls that published (a flush of many levels may take several) */ \
  X(worker_launches)                                                                                      \
  X(handovers)                                                                                            \
  X(idle_adoptions)     /* handovers done by the compile thread while no worker was resident */           \
  X(busy_adoptions)     /* handovers a publication made with a worker resident (kicks: maybe_adopt_generation) */ \
  X(burst_launches)     /* worker launches on the burst grid (Config::burst_min) */                       \
  X(early_publishes)    /* publications made during recording (Config::publish_min) */                    \
  X(joined_batches)     /* batches that ran beside the one before them (kReadyJoin: Config::join_levels) */  \
  X(full_queue_flushes)                                                                                   \
  X(room_waits)                                                                                           \
  X(room_publishes)     /* flush publications cut short so a level waiting for ring room runs behind them */ \
  X(levels_split)       /* sub-ops that opened a new dependency level (levels beyond the first) */        \
  X(dma_batches)                                                                                          \
  X(lazy_drains)        /* publications that first let the worker leave (lazy loading, busy stream) */    \
  X(gated_launches)     /* launches behind a ready word (stream work was still ahead of the publication) */ \
  X(kicks)              /* kicks launched on publishing streams (Config::kicks) */                        \
  X(working_launches)   /* worker launches that ran a batch (the others: standbys that found nothing) */  \
  X(fused_subops)                                                                                         \
  X(mm_respread)        /* worker matmuls recorded with fewer K slices: their level's share (level_cut) */   \
  X(index_faults)       /* data-movement sub-ops seen (by stats()) to have met an index out of range */      \
  X(programs)                                                                                             \
  X(program_replays)    /* tape ranges staged again by Runtime::replay (programs, issue #17) */            \
  X(image_replays)      /* ... of them from a TapeImage (Runtime::replay_image) */                         \
  X(replay_stage_ns)    /* host ns staging replays (Runtime::replay / replay_image) */                     \
  X(fusion_table_full)  /* chains left unfused: the process's fused-program table (kMaxPrograms) was full */ \
  X(ref_site_writes)    /* resident TensorRef pointers written by image replays (the ones that changed) */  \
  X(program_bells)      /* ready words that each published a run of >= 2 resident pieces (kReadyProgram) */ \
  X(program_call_ns)    /* host ns in ProgramCall::call (the C++ call of a program, guards to outputs) */   \
  X(publish_ns)         /* host ns in publications (Runtime::publish), of which: */                       \
  X(publish_copy_ns)    /*   issuing the descriptor / TensorRef / program copies */                       \
  X(publish_memop_ns)   /*   the ready-word and stream-wait memop calls */                                \
  X(publish_launch_ns)  /*   the stream query and worker launches */                                      \
  X(publish_gen_ns)     /*   generation checks and adoptions (a busy adoption waits for the published work) */ \
  X(publish_wait_ns)    /*   waits for the device: a free batch slot, an idle worker to leave */          \
  X(publish_hook_ns)    /*   the publish hook (the scheduler's keep-alive references let go) */

// Adds the nanoseconds of its scope to a counter (the host-time stats above).
struct ScopedNs {
  uint64_t& acc;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  explicit ScopedNs(uint64_t& a) : acc(a) {}
  ~ScopedNs() { acc += (uint64_t)std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count(); }
};

struct RuntimeStats {
#define GPUOS_STAT_FIELD(name) uint64_t name = 0;
  GPUOS_RUNTIME_STATS(GPUOS_STAT_FIELD)
#undef GPUOS_STAT_FIELD
  RuntimeStats& operator+=(const RuntimeStats& o) {
#define GPUOS_STAT_ADD(name) name += o.name;
    GPUOS_RUNTIME_STATS(GPUOS_STAT_ADD)
#undef GPUOS_STAT_ADD
    return *this;
  }
};

// record_matmul's epilogue argument for a folded lone cast (no program).
constexpr int32_t kMmCastOnly = -2;

class Runtime {
 public:
  using StreamFn = std::function<CUstream()>;  // the current (PyTorch) stream of this device
  Runtime(int device, const Config& cfg, StreamFn stream_fn);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int device() const { return device_; }
  const Config& config() const { return cfg_; }
  // What level_cut / spread_level need to cut a level's products (core/matmul_plan.h; items 0: GPUOS_MM_SPREAD=0).
  MmSpread mm_spread() const;

  // Every record_* gives the sub-op its dependency level (the hazard model: 1 + the highest level of earlier
  // unpublished work it reads from or overwrites) and stages it there; flush() writes the levels into the ring
  // in order. So independent work recorded in any order shares levels.
  // Record out = op(ins...; s0, s1) over `numel` elements: every input already has out's shape (broadcast
  // inputs arrive as stride-0 views). Keeps nothing alive: the caller holds tensors until publication.
  void record_ew(uint32_t op, uint32_t arity, const Operand& out, const Operand* ins, float s0, float s1,
                 int64_t numel);
  void record_binary(uint32_t op, const Operand& out, const Operand& a, const Operand& b, int64_t numel) {
    const Operand ins[2] = {a, b};
    record_ew(op, 2, out, ins, 1.0f, 0.0f, numel);
  }
  // Record a last-dim reduction of x's `rows` rows; refs describe x (all dims) and out (see worker.cu).
  void record_reduce(uint32_t op, const Operand& out, const TensorRef& out_ref, const Operand& x,
                     const TensorRef& x_ref, int64_t rows, int64_t cols);
  // Record out = alpha * a @ b + beta * bias (bias: null, else its M x N view), a: M x K, b: K x N; refs are the
  // 2-D views the worker reads (device_src/matmul.h). Tiles split N. epilogue >= 0: the id of a one-input program
  // every output value goes through, rounded to product_dtype first (kFlagMmEpilogue); kMmCastOnly: no program,
  // the values rounded to product_dtype (kFlagMmCast). sched/epilogue.cpp folds activation chains and casts so; out
  // may then have another dtype.
  void record_matmul(const Operand& out, const TensorRef& out_ref, const Operand& a, const TensorRef& a_ref,
                     const Operand& b, const TensorRef& b_ref, const Operand* bias, const TensorRef* bias_ref,
                     int64_t M, int64_t N, int64_t K, float alpha, float beta, int32_t epilogue = -1,
                     uint32_t product_dtype = 0);
  // Record out = prog(round(alpha * a @ b), round(alpha * a @ b2)) as one dual item per column tile group
  // (kFlagMmDual: Llama's silu(gate) * up; `epilogue` a two-input program, each product rounded to product_dtype
  // first). False -- nothing recorded -- unless both products take the tensor-core path unsplit with M <=
  // kMmDualMaxRows; the caller then records them as two matmuls and the program.
  bool record_matmul_dual(const Operand& out, const TensorRef& out_ref, const Operand& a, const TensorRef& a_ref,
                          const Operand& b, const TensorRef& b_ref, const Operand& b2, const TensorRef& b2_ref,
                          int64_t M, int64_t N, int64_t K, float alpha, int32_t epilogue, uint32_t product_dtype);
  // Record out = alpha * a @ b where a (M x K, a_dtype) is the output of the row program `prog` with arguments `fa`
  // (its inputs `reads`; fa's output operand contiguous), which no one else reads: each item runs the program into
  // shared memory first (kFlagMmPrologue: a norm before its matmuls). False -- nothing recorded -- unless M x K <=
  // kMmPrologueElems and the product takes the tensor-core path unsplit; the caller then records the program and
  // the product as before.
  bool record_matmul_prologue(const Operand& out, const TensorRef& out_ref, uint32_t a_dtype, const FusedArgs& fa,
                              uint32_t prog, const Operand* reads, uint32_t nread, const Operand& b,
                              const TensorRef& b_ref, int64_t M, int64_t N, int64_t K, float alpha);
  // Record decode attention (device_src/attention.h): `args` filled by the caller except nsplit (chosen here from
  // the KV length); q, k, v: 4-D refs (B x H x L x D). `out` is the written footprint (the caller gives one that
  // also covers the lse when AttnArgs::lse is set); `mask` may be null.
  void record_attention(const Operand& out, AttnArgs args, const Operand& q, const TensorRef& q_ref, const Operand& k,
                        const TensorRef& k_ref, const Operand& v, const TensorRef& v_ref, const Operand* mask,
                        float scale);
  // Record a data-movement sub-op (ops.def kind 4, device_src/dataops.h) over `total` iteration units (elements;
  // argmax: rows), `per_tile` per descriptor: refs[0..nref) go to the arena (proto's constant slots keep their
  // bits), `out` is written and `reads[0..nread)` are read (the dependency level).
  void record_data(SubOp proto, const TensorRef* refs, uint32_t nref, const Operand& out, const Operand* reads,
                   uint32_t nread, uint64_t total, uint64_t per_tile);
  // Record a fused chain: out = program(ins...) over `numel` elements. `fa` holds every operand's pointer,
  // broadcast rule and dtype (out first); `out`/`ins` give the footprints for dependency levels. cols > 0: a
  // row program (kOpRowRed inside) over rows of `cols` elements, the output's last dim; tiles hold whole rows.
  void record_fused(uint32_t prog, const FusedArgs& fa, const Operand& out, const Operand* ins, uint32_t nin,
                    int64_t numel, int64_t cols = 0);
  // Programs (issue #17, core/tape.h). While a tape is attached, every staged sub-op is also appended to it
  // (null detaches). replay() stages tape entries [b, e) again with their pointers moved by `rel`; the caller
  // publishes them (flush). Call under mu.
  void set_tape(Tape* t) { tape_ = t; }
  bool taping() const { return tape_ != nullptr; }
  void replay(const Tape& tape, size_t b, size_t e, const Reloc& rel);
  // The same from a TapeImage of the range (stage_image), prepared once by prepare_image with `resident`: device
  // memory of im.resident_bytes() the caller owns for the image's life (the worker reads the descriptors and
  // TensorRefs there). replay_image writes the TensorRef pointers `rel` changes into it and commits the image's
  // pieces -- resident (runs of them behind one doorbell), or through the ring where their descriptors hold moved
  // pointers (core/tape.h); the caller publishes them (flush).
  void prepare_image(TapeImage& im, uint64_t resident);
  void replay_image(TapeImage& im, const Reloc& rel);
  void note_call_ns(uint64_t ns) { st_.program_call_ns += ns; }  // sched/program.cpp ProgramCall (under mu)
  // While one lives (a program call's replay and flush, under mu), worker launches idle Config::program_idle_us.
  struct ProgramLaunches {
    Runtime& rt;
    explicit ProgramLaunches(Runtime& r) : rt(r) { rt.program_launches_ = true; }
    ~ProgramLaunches() { rt.program_launches_ = false; }
  };
  // Id of `p` in the device program table, uploading it on first use; -1 when the table is full.
  int32_t program_id(const Program& p);
  // Publish everything pending on `stream` and make the stream wait for it (and for earlier early
  // publications); returns the last published seq (0 if nothing was pending). `early`: a publication during
  // recording (Config::publish_min): burst grid, no stream wait.
  uint32_t flush(CUstream stream, bool early = false);
  // Wait (GIL must be released by the caller) until batch `seq` is done, or all in flight if seq == 0.
  void wait_done(uint32_t seq);
  // Recorded work not yet published, or published early and not yet ordered before a stream by flush().
  bool has_pending() const { return staged_ > 0 || !levels_.empty() || unwaited_seq_ != 0; }
  // The worker exits at its next poll once nothing published is pending (reset by the next launch).
  void request_yield() { if (alive_) __atomic_store_n(&hc_->yield_request, 1u, __ATOMIC_SEQ_CST); }
  // Complete everything (pending work is published on `stream`; nullptr = legacy default stream), stop the
  // worker, free the queue. Idempotent.
  void shutdown(CUstream stream);

  RuntimeStats stats() const;
  // Reset HostCtl::index_fault (stats().index_faults): call when no batch is running.
  void clear_index_fault();
  // The claim trace recorded since the last call (Config::trace_records; empty when off), and a reset. Call
  // when no batch is running (after flush(sync=True)): the worker writes the buffer without locks. `dropped`:
  // records that did not fit.
  std::vector<TraceRec> take_trace(uint64_t* dropped);
  std::string describe() const;  // device name, SMs, grid, arch

  // Publications made while recording (ring full, too many levels, early) go on the current stream, or while
  // set, on `s` (the scheduler lowers ops that were recorded under another stream). Call under mu.
  void set_record_stream(bool on, CUstream s = nullptr) { rec_stream_on_ = on; rec_stream_ = s; }

  // Called (under mu) each time pending work is published: the binding layer drops its keep-alive refs.
  void set_publish_hook(std::function<void()> f) { on_publish_ = std::move(f); }

  // ---- generations and the dual-slot alias table (core/generation.cpp). Call under mu. ----
  struct HandoverTimes { double drain_us = 0, load_us = 0, launch_us = 0; };
  uint32_t active_generation() const { return active_gen_; }
  // Make generation >= gen active: drain the worker (it leaves once everything published has run), load the
  // newest ready generation's module, keep the old one loaded. No-op when already there.
  void ensure_generation(uint32_t gen);
  // Alias table row: table[op] = slot; written into the version not in use, then the version word is flipped
  // on the control stream (waited for). Batches opened later run on it; open ones finish on the old one.
  void set_alias_table(const uint8_t* table);
  // Called without mu (the compile thread, when a generation became ready): takes mu only if it is free and,
  // when no worker is resident or queued, loads the newest ready generation now, so that the module load is
  // off the path of the next flush. Returns whether it did.
  bool adopt_generation_if_idle();
  // Drain, reload the active generation as a new module, relaunch (benchmarks: handover cost).
  HandoverTimes force_handover();

  // Lock-free, racy by design (diagnostics of a hang, when mu may be held by a blocked thread): the host
  // control words, the last published batch, its done word and the driver call a thread is in (phase).
  std::string snapshot() const;

  std::mutex mu;  // guards everything below; never held while waiting for the GIL

 private:
  CUstream record_stream() { return rec_stream_on_ ? rec_stream_ : stream_fn_(); }
  // Room for nref TensorRefs in the arena (publishes pending work and waits for old batches if needed).
  void ensure_ref_room(uint32_t nref);
  // Room for ndesc descriptors in the ring, waiting for published batches only (never publishes).
  void wait_ring_room(uint32_t ndesc);
  bool ring_room(uint32_t ndesc);  // whether ndesc descriptors fit now (after retiring what is done; no wait)
  // Until n more levels can join one publication (can_commit_level's bound on batches in flight), waiting for the
  // oldest batches.
  void wait_batch_room(size_t n);
  // The one "wait for the oldest batch" loop of the room checks above and of flush's free batch slot: while
  // full(), wait for the oldest batch in flight (`what` names the wait in a timeout), retire it, count a room
  // wait. Nothing in flight while still full: `broken` (accounting that cannot recover) throws, nullptr returns.
  template <class Full>
  void wait_oldest_while(Full full, const char* what, const char* broken);
  void maybe_publish_early() {
    if (cfg_.publish_min && pending_subops_ >= cfg_.publish_min) {
      st_.early_publishes++;
      flush(record_stream(), /*early=*/true);
    }
  }
  void commit_level(std::vector<SubOp>& descs);     // staged level -> ring, as one unpublished level
  // n descriptors -> the ring (waiting for room), as one unpublished level (dma: delivered by DMA whatever its
  // size -- its TensorRefs are resident, read through the device translation).
  void commit_ring(const SubOp* descs, uint32_t n, bool dma = false);
  // Another level may join the committed ones before a publication (resident: replay_image's levels).
  bool can_commit_level(bool resident = false) const;
  uint32_t publish(CUstream stream, bool early, bool last);  // levels_ -> batches (one memop call)
  void retire();
  bool seq_done(uint32_t seq) const;
  std::string describe_unfinished() const;  // for timeout messages
  void wait_seq(uint32_t seq, const char* what);
  void maybe_launch_worker(uint32_t grid);  // launch_worker(grid, 0) if the Dekker handshake says none runs
  // Launch a worker on the side stream; gate != 0: after the side stream waits for batch `gate`'s ready word
  // (a standby: HostCtl::standby names it, so a resident worker stuck before it may leave).
  void launch_worker(uint32_t grid, uint32_t gate);
  // Config::kicks: one block of the worker kernel on `stream`, behind the ready words just enqueued there; `wait`:
  // it stays until batch last_seq_ is done, running claims from batch `first` on (Config::kick_wait; not for an
  // early publication).
  void launch_kick(CUstream stream, bool wait, uint32_t first);
  WorkerArgs worker_args(uint32_t gen, uint32_t standby) const;  // a launch's parameters
  void wait_kicks(const char* what);  // until every kick launched has exited (DevCtl::kicks_done), with timeout
  void sync_ctl(const char* what);  // wait (with timeout) for the control stream
  std::string gen_startup_image();   // image of the newest ready generation for this GPU (sets active_gen_)
  void gen_init();                   // alias table from the registry (constructor)
  void gen_shutdown();               // unload retired modules
  double drain_worker(const char* why);  // us waited until no worker is resident or queued
  HandoverTimes handover(uint32_t gen, const char* why);
  // Take over a newer ready generation if no worker is resident -- or, from a publication (`busy`) with kicks, also
  // when one is: after the published batches complete (a bounded wait, retried with a backoff).
  void maybe_adopt_generation(bool busy);
  void note_op_gen(uint32_t op);
  void make_current();
  // A tensor-core product of M x K by K x N as record_matmul would take it unsplit: its cut (column tiles per item,
  // items); false if record_matmul would split K (the dual and prologue items hold a tile's whole K).
  bool unsplit_mma(int64_t M, int64_t N, int64_t K, MmCut& cut) const;
  void fit_stack(CUfunction f);  // per-thread stack limit >= the worker's local memory (before any launch)
  uint32_t merge_refs(const Operand* ops, int nops, TensorRef* out_refs);
  bool record_ew_runs(const SubOp& proto, uint32_t arity, const Operand& out, const Operand* ins,
                      const TensorRef* refs, int nt, uint32_t m, int64_t numel);
  // capture_tile() while a tape is attached, else per_tile.
  uint64_t tile_units(uint64_t per_tile, uint64_t total, uint64_t min_units) const {
    return tape_ ? capture_tile(per_tile, total, min_units) : per_tile;
  }
  // Stage ceil(total / per_tile) tiles of `proto` at the level the hazard model gives (out written, the
  // non-constant ins read); with nref > 0, refs[0..nref) go to the TensorRef arena (again for every piece of an
  // op larger than half the ring) and proto's pointer fields point at them.
  void append_tiles(SubOp proto, uint64_t total, uint64_t per_tile, const TensorRef* refs, uint32_t nref,
                    const Operand& out, const Operand* ins, uint32_t nin);
  // The level append_tiles gives a sub-op writing `out` and reading `ins` if nothing is published before it.
  uint32_t staged_level(const Operand& out, const Operand* ins, uint32_t nin) const;

  int device_;
  bool lazy_loading_ = false;  // the context loads kernels on first launch (CUDA_MODULE_LOADING=LAZY)
  Config cfg_;
  StreamFn stream_fn_;
  CUdevice cu_dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction worker_fn_ = nullptr;
  CUstream side_ = nullptr;
  int sms_ = 0, cc_major_ = 0, cc_minor_ = 0;
  uint32_t grid_ = 0, burst_grid_ = 0;
  uint32_t launched_grid_ = 0;  // grid of the last worker launch (the resident one while worker_state says so)
  bool program_launches_ = false;  // ProgramLaunches: a program call publishes
  std::string name_;
  int worker_local_bytes_ = 0;  // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES of the active worker
  size_t stack_limit_ = 0;      // CU_LIMIT_STACK_SIZE after fit_stack

  TraceBuf* trace_ = nullptr;  // pinned, mapped (Config::trace_records > 0)
  CUdeviceptr trace_d_ = 0;
  HostCtl* hc_ = nullptr;  // pinned, mapped
  CUdeviceptr hc_d_ = 0;
  SubOp* ring_ = nullptr;  // pinned, mapped
  CUdeviceptr ring_d_ = 0;
  TensorRef* refs_ = nullptr;  // pinned, mapped
  CUdeviceptr refs_d_ = 0;
  CUdeviceptr refs_dev_ = 0;  // device mirror of the arena (DMA-delivered batches read their TensorRefs here)
  uint64_t ref_mirrored_ = 0;  // arena slots below this are in refs_dev_ (or dead); the next DMA level sends the rest
  uint32_t ref_capacity_ = 0;
  CUdeviceptr dc_d_ = 0;     // DevCtl
  CUdeviceptr scratch_d_ = 0;  // split-K matmul scratch (WorkerArgs::scratch)
  CUdeviceptr ring_dev_ = 0;  // device mirror of the ring (DMA / memop-delivered descriptors)
  CUdeviceptr progs_d_ = 0;   // device program table (kMaxPrograms Programs)
  Program* progs_h_ = nullptr;  // pinned host copy (source of the uploads; never rewritten once assigned)
  CUstream ctl_ = nullptr;      // non-blocking control stream: alias-table writes a running worker must see
  std::vector<char> prog_uploaded_;  // per process-wide program id (fusion.h intern_program): assigned here
  std::vector<int32_t> prog_unsent_;  // assigned programs the next publication copies to progs_d_ first

  uint64_t desc_head_ = 0, desc_tail_ = 0;  // monotonic descriptor indices
  uint64_t ref_head_ = 0, ref_tail_ = 0;
  Hazards hazards_;                      // levels of the staged (unpublished) work
  std::vector<std::vector<SubOp>> stage_;  // stage_[L-1]: descriptors of level L (vectors reused)
  size_t stage_levels_ = 0;              // levels in use in stage_
  // After an early publication (Config::join_levels): hazards_ keeps the flush's levels, join_base_ is the hazard
  // level of the last published batch, and join_stage_ holds what was recorded since with no hazard against it
  // (its hazard level <= join_base_): published first, as a batch beside that one (kReadyJoin). Stage level L then
  // holds hazard level join_base_ + L.
  uint32_t join_base_ = 0;
  std::vector<SubOp> join_stage_;
  // Per dependency level (index: the level append_tiles gives, join_base_ included), the splittable worker
  // matmuls recorded into it since the hazards were last cleared (record_matmul: level_cut).
  std::vector<LevelLoad> level_mm_;
  uint64_t staged_ = 0;                  // descriptors staged
  // heavy: matmul items in the level (they go by DMA: many warps reading the same pinned TensorRefs crawl; and
  // a level of >= kHeavyBurst of them launches on the burst grid).
  // res != 0: a resident level (replay_image): its descriptors at that device address, none in the ring (start:
  // the ring position when it was committed, so that retiring it frees nothing). dma: a ring level sent by DMA
  // whatever its size (commit_ring). run (resident levels): n >= 1: the first of a run of n resident pieces of
  // one image, published with one ready word (n >= 2: kReadyProgram, its ProgLevel entry at `table`); -1: a later
  // piece of a run (no memory writes: the poller fills it from the table).
  struct Level {
    uint64_t start;
    uint32_t count;
    uint32_t heavy;
    uint64_t res;
    bool dma;
    int32_t run = 0;
    uint64_t table = 0;
    bool join = false;  // published with kReadyJoin: beside the batch before it (Config::join_levels)
  };
  std::vector<Level> levels_;       // committed to the ring, not yet published
  bool rec_stream_on_ = false;   // set_record_stream
  CUstream rec_stream_ = nullptr;
  uint64_t pending_subops_ = 0;  // sub-ops recorded since the last publication
  uint32_t unwaited_seq_ = 0;    // last seq published early with no stream wait after it (0: none)
  struct InFlight { uint32_t seq; uint64_t desc_end, ref_end; };
  std::deque<InFlight> inflight_;
  uint32_t last_seq_ = 0;
  uint32_t launches_ = 0;
  uint32_t kicks_launched_ = 0;  // Config::kicks: kicks launched (against DevCtl::kicks_done)
  uint32_t module_epoch_ = 0;    // Config::kicks: handovers so far (HostCtl::module_epoch)
  // Which blocking driver call or wait a thread of this runtime is in ("" when none): read by snapshot().
  std::atomic<const char*> phase_{""};
  struct PhaseMark {
    std::atomic<const char*>& p;
    PhaseMark(std::atomic<const char*>& p_, const char* what) : p(p_) { p.store(what, std::memory_order_relaxed); }
    ~PhaseMark() { p.store("", std::memory_order_relaxed); }
  };
  std::function<void()> on_publish_;
  Tape* tape_ = nullptr;  // set_tape
  std::vector<std::pair<uint64_t, uint64_t>> patches_, ref_patches_;  // replay_image's pointer writes (reused)
  std::vector<CUstreamBatchMemOpParams> memops_;  // reused by flush()
  // Memory writes the next publication issues first, in its own memop call (replay_image's TensorRef writes: one
  // driver call fewer per replay); at most kMaxPreOps (with kMaxLevelsPerFlush's writes: < 256 per call).
  static constexpr size_t kMaxPreOps = 48;
  std::vector<CUstreamBatchMemOpParams> pre_ops_;
  RuntimeStats st_;
  bool alive_ = false;

  // generations and the alias table (core/generation.cpp)
  std::string arch_;                  // NVRTC arch of this GPU
  uint32_t active_gen_ = 0;           // generation whose module the worker is launched from
  uint32_t pending_need_gen_ = 0;     // newest generation any recorded sub-op needed (monotonic)
  uint32_t failed_load_gen_ = 0;      // generation whose module failed to load here (not retried at idle)
  std::chrono::steady_clock::time_point adopt_retry_{};  // a busy adoption whose wait timed out: not before this
  double adopt_backoff_s_ = 0.0;      // ... and the next backoff after it (doubles per timed-out wait)
  std::vector<CUmodule> old_modules_;  // retired generations, unloaded at shutdown
  uint8_t alias_host_[2][256] = {};   // host copy of both alias-table versions
  uint32_t alias_ver_ = 0;            // AliasCtl::ver as last written
  uint32_t alias_flip_seq_ = 0;       // last_seq_ when the version last flipped
};

}  // namespace gpuos
