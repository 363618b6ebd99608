// device_src/walk.h -- no host-only code, no system #includes. Included by worker.cu after trace_claim.
// The level walk: the poller filling batch slots behind their ready words, a block claiming its next chunk, and
// the wait for the batches a claim depends on (run_claim in worker.cu executes the chunk).
#pragma once

namespace gpuos {

// ---------------------------------------------------------------- the level walk
// Batches are dependency levels: batch `seq` runs after batch seq - 1 has completed. There is no grid-wide
// "open" step. The poller (block 0, thread 0, between its own claims) fills a batch's slot as soon as its
// ready word has landed -- fields, a fresh claim word, then bseq[slot] = seq -- as far ahead as ready words
// have landed. Every block walks the batches itself: it claims a chunk of the next filled batch, loads the
// chunk's descriptors and its warps' first TensorRefs, and only then waits for the previous batch's `remaining`
// word to reach zero; so between two levels the critical path is the last block's fence + atomicSub -> the
// other blocks' next poll of that word, and the claim and the loads of the next level are off it. (Before, the
// poller saw `remaining` reach zero, then announced the next batch through a claim word and an epoch that every
// block re-read: four more dependent round trips through L2 per level.) A block may skip batches (a slow block
// finds their claims exhausted); seq comparisons are modular.
__device__ __forceinline__ u32 ld_acq(const u32* p) {  // later loads (the level's data) are ordered after it
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ bool seq_reached(u32 v, u32 seq) { return (int)(v - seq) >= 0; }

struct Walk {       // thread 0's state of one block
  u32 cur = 0;      // the batch this block works on next
  u32 f_seq = 0;    // the batch whose fields f[] holds (0: none)
  u32 f[6] = {0, 0, 0, 0, 0, 0};  // count, start, source, alias version, bdep, home
  u64 fd = 0;               // bdesc (source 2)
};
struct Poller {     // block 0 thread 0's additional state
  u32 next = 0;     // the next batch to fill
  u32 prog_left = 0;  // batches of a program run (kReadyProgram) still to fill from its table, the next at prog
  u64 prog = 0;
  u32 early_for = 0;  // the batch block 0 last filled ahead for while claiming it (claim_next)
  bool filled_any = false, idle = false;
  bool holder = true;  // kicks: this launch holds the poller token (DevCtl::owner); always true without kicks
  u32 spins = 0;
  u64 t_idle = 0;
};

// Fill batch `seq`'s slot (its ready word has landed): the fields the claiming blocks read and its claim word.
// Its bseq word goes after a fence (poll_step): a block that sees bseq == seq sees the rest.
// `hi`: the ready word's high half; `desc`: a program run's piece (its descriptors; bdesc is written here).
__device__ __forceinline__ void fill_batch(const WorkerArgs& args, DevCtl* dc, u32 seq, u32 hi, u64 desc = 0,
                                           u32 home = 0) {
  const u32 slot = seq & (kMaxBatches - 1);
  const u32 count = hi & ~kReadyFlags;
  const bool resident = (hi & kReadyResident) != 0;  // descriptors at bdesc[slot]: no ring slots
  if (desc) dc->bdesc[slot] = desc;
  // Volatile: with kicks the poller role moves between launches running at once (another SM's L1 may hold an
  // old copy of what the previous holder wrote).
  const u32 start = resident ? 0u : ld_vol(&dc->ring_pos);
  if (!resident) dc->ring_pos = (u32)(((u64)start + count) % args.capacity);
  dc->bstart[slot] = start;
  dc->bcount[slot] = count;
  dc->bsrc[slot] = resident ? 2u : (hi & kReadyDevRing) ? 1u : 0u;
  dc->remaining[slot] = count;
  dc->bhome[slot] = home;
  dc->bdep[slot] = (hi & kReadyJoin) ? ld_vol(&dc->bdep[(seq - 1) & (kMaxBatches - 1)]) : seq - 1;  // filled before
  dc->alias.bver[slot] = ld_vol(&dc->alias.ver);  // the batch runs wholly on this alias version
  // A plain store: a block still adding to the slot's previous claim word (a batch that completed long ago)
  // either lands before it (and finds that batch exhausted) or after (and holds a real claim on this one).
  *(volatile u64*)&dc->claim[slot] = (u64)seq << 32;
  // Nothing to run (Runtime::commit_level publishes no empty level; kept so that one could never wedge the walk:
  // no claim would ever count it off).
  if (count == 0) dc->done[slot] = seq, st_vol(&((HostCtl*)args.host_ctl)->done[slot], seq);
  if (args.trace) {
    const u64 t = globaltimer();
    trace_put((TraceBuf*)args.trace, poller_region(args), kTraceOpen, t, 0, 0, seq, start, count);
  }
}

// A filled slot's bseq word (after the fence that orders its fields before it), and its seq / home word: a block
// that is not one of a level's home blocks passes it on that word alone (claim_next), several levels per round trip.
__device__ __forceinline__ void mark_filled(DevCtl* dc, u32 seq) {
  const u32 slot = seq & (kMaxBatches - 1);
  st_vol(&dc->bseq[slot], seq);
  *(volatile u64*)&dc->bsh[slot] = (u64)seq << 32 | dc->bhome[slot];
}

// How far ahead of the batch block 0 claims it fills while claiming (claim_next), for a level without a home
// (every block claims it): 2 (until the twenty-eighth session) left a program's chain of one-tile levels on the
// 132-block grid at 17.1 us per level, 16 at 3.5 (H200, `program_probe.py walk`, homes off; 3.5 also on 33 blocks
// with either). A homed level keeps 2: with one home per claim the same chain took 5.1 us per level with 2 and
// 17.05 with 16 (not yet explained: DEVELOPING *Next* 0).
constexpr u32 kEarlyFillLead = 16, kEarlyFillLeadHomed = 2;
// How far ahead of the oldest unfinished batch the poller fills (slots are reused every kMaxBatches), and the
// most batches one poll step fills (their ready words are read at once: one round trip, two fences).
constexpr u32 kFillAhead = kMaxBatches / 2, kFillBurst = 8;

// Batches next .. next + n - 1 may be filled: not more than kFillAhead ahead of the oldest unfinished one.
__device__ __forceinline__ bool may_fill(const DevCtl* dc, u32 next, u32 n) {
  const u32 back = next + n - 1 - kFillAhead;
  return (int)back <= 0 || seq_reached(ld_vol(&dc->done[back & (kMaxBatches - 1)]), back);
}

// The next pieces of a program run (kReadyProgram): their ProgLevel entries (one round trip), then their slots.
__device__ __noinline__ void fill_program(const WorkerArgs& args, DevCtl* dc, Poller& p) {
  const u32 next = p.next, n = p.prog_left < kFillBurst ? p.prog_left : kFillBurst;
  if (!may_fill(dc, next, n)) return;  // far ahead of the walk: wait for it
  const ProgLevel* t = (const ProgLevel*)p.prog;
  u64 d[kFillBurst];
  u32 c[kFillBurst], h[kFillBurst];
#pragma unroll
  for (u32 i = 0; i < kFillBurst; ++i)
    if (i < n) d[i] = ld_vol64(&t[i].desc), c[i] = ld_vol(&t[i].count), h[i] = ld_vol(&t[i].home);
#pragma unroll
  for (u32 i = 0; i < kFillBurst; ++i)
    if (i < n) fill_batch(args, dc, next + i, c[i] | kReadyDevRing | kReadyResident, d[i], h[i]);
  __threadfence();
#pragma unroll
  for (u32 i = 0; i < kFillBurst; ++i)
    if (i < n) mark_filled(dc, next + i);
  p.next = next + n;
  p.prog += (u64)n * sizeof(ProgLevel);
  p.prog_left -= n;
  p.filled_any = true;
  p.idle = false;
}

// ---------------------------------------------------------------- kicks (docs/design/programs.md *Kicks*)
// The poller token: take it (the fill position the last holder left in next_seq comes with it) ...
__device__ __forceinline__ bool take_token(const WorkerArgs& args, DevCtl* dc, Poller& p) {
  if (atomicCAS(&dc->owner, 0u, args.gen) != 0u) return false;
  __threadfence();
  p.next = ld_vol(&dc->next_seq);
  p.holder = true;
  p.idle = false;
  return true;
}
// ... and give it back, then look at the next ready word again: a kick that found the token held before the
// release exited, and its ready word landed before it ran, so this look sees it. Returns whether this launch holds
// the token again (a batch landed: it polls on).
__device__ __noinline__ bool give_token(const WorkerArgs& args, DevCtl* dc, Poller& p) {
  st_vol(&dc->next_seq, p.next);
  __threadfence();
  atomicExch(&dc->owner, 0u);
  p.holder = false;
  __threadfence();
  const u64 r = ld_vol64(&dc->ready[p.next & (kMaxBatches - 1)]);
  return (u32)r == p.next && take_token(args, dc, p);
}

// This launch is over (the poller's decision; the caller has set worker_state where it should). `next`: the first
// batch not filled, kept for the next launch unless the token's hand-over already did.
__device__ u32 leave(const WorkerArgs& args, DevCtl* dc, HostCtl* hc, const Poller& p, u32 next) {
  if (args.standby & kStandbyKick) {  // one block: its threads see kCmdExit; no exit word, no worker state
    trace_launch(args, p.filled_any ? 3u : 1u, next);
    if (args.trace) __threadfence_system();  // its last record before the count shutdown() waits for (then frees)
    atomicAdd(&dc->kicks_done, 1u);
    return kCmdExit;
  }
  if (!(args.standby & kStandbyKicks)) dc->next_seq = next;
  st_vol(&dc->exit_flag, args.gen);
  st_vol(&hc->worker_exited, args.gen);
  if (p.filled_any) st_vol(&hc->working_launches, ld_vol(&hc->working_launches) + 1u);
  __threadfence();
  trace_launch(args, p.filled_any ? 3u : 1u, next);
  return kCmdExit;
}

// The idle poller with kicks: a kick leaves at once (giving the token back), the resident worker after idle_ns or
// a yield request -- whatever is published: every published batch has a kick behind its ready word. Not holding
// the token (a kick holds it; this worker's blocks claim what it fills), the worker takes it when it can.
__device__ __noinline__ u32 kicks_idle(const WorkerArgs& args, DevCtl* dc, HostCtl* hc, Poller& p) {
  const bool kick = (args.standby & kStandbyKick) != 0;
  if (kick && !p.holder && (args.standby & kStandbyKickWait)) {  // a waiting kick (types.h kStandbyKickWait)
    const u32 last = args.kick_last, sl = last & (kMaxBatches - 1);
    if (seq_reached(ld_vol(&dc->done[sl]), last)) return leave(args, dc, hc, p, p.next);
    if (take_token(args, dc, p)) return kCmdRun;  // free: poll (the holder waits for what it fills)
    if (!p.idle) {
      p.idle = true;
      p.t_idle = globaltimer();
    }
    if (ld_vol(&dc->bseq[sl]) != last && globaltimer() - p.t_idle > kKickFillWaitNs)
      return leave(args, dc, hc, p, p.next);  // not filled yet: maybe behind another stream's ready word
    return kCmdRun;
  }
  if (!kick) {
    if (!p.holder && take_token(args, dc, p)) return kCmdRun;
    if (!p.idle) {
      p.idle = true;
      p.spins = 0;
      p.t_idle = globaltimer();
    }
    if ((++p.spins & 31u) != 0) return kCmdRun;
    if (p.spins == 32) st_vol(&hc->polling_seq, p.next);
    if (ld_vol(&hc->yield_request) == 0 && globaltimer() - p.t_idle < args.idle_ns) return kCmdRun;
    st_vol(&hc->worker_state, kWorkerExiting);
    __threadfence_system();
  }
  if (p.holder && give_token(args, dc, p)) {
    if (!kick) {
      st_vol(&hc->worker_state, kWorkerRunning);
      __threadfence_system();
    }
    return kCmdRun;
  }
  return leave(args, dc, hc, p, p.next);
}

// One step of the poller: fill the next batches whose ready words have landed (or the rest of a program run);
// otherwise, once every filled batch has completed, the idle logic (yield, exit). Returns kCmdExit when this
// launch is over (never inside a program run: its batches are published, host_published covers them).
// `claim_held`: this block holds a claim (wait_prev, run_claim): a worker without the token only tries to take it
// (the holder's own exit waits for every filled batch to complete, its claims among them).
__device__ u32 poll_step(const WorkerArgs& args, DevCtl* dc, HostCtl* hc, Poller& p, bool claim_held = false) {
  if (!p.holder) return claim_held ? (take_token(args, dc, p), kCmdRun) : kicks_idle(args, dc, hc, p);
  if (p.prog_left) {
    fill_program(args, dc, p);
    return kCmdRun;
  }
  const u32 next = p.next;
  u64 ready[kFillBurst];
#pragma unroll
  for (u32 i = 0; i < kFillBurst; ++i) ready[i] = ld_vol64(&dc->ready[(next + i) & (kMaxBatches - 1)]);
  u32 n = 0;
  bool prog = false;  // ready[n - 1] opens a program run: the batches before it are filled here, the run below
  while (n < kFillBurst && (u32)ready[n] == next + n && !prog) prog = ((u32)(ready[n++] >> 32) & kReadyProgram) != 0;
  if (n > 0) {
    if (!may_fill(dc, next, n)) return kCmdRun;  // far ahead of the walk: wait for it
    __threadfence();  // the ready words before what they announce
    const u32 m = prog ? n - 1 : n;
    for (u32 i = 0; i < m; ++i) fill_batch(args, dc, next + i, (u32)(ready[i] >> 32));
    __threadfence();
    for (u32 i = 0; i < m; ++i) mark_filled(dc, next + i);
    p.next = next + m;
    p.filled_any = true;
    p.idle = false;
    if (prog) {  // its table's address was written before its ready word (ordered by the fence above)
      p.prog = ld_vol64(&dc->bdesc[(next + m) & (kMaxBatches - 1)]);
      p.prog_left = (u32)(ready[m] >> 32) & ~kReadyFlags;
      if (p.prog_left == 0) {  // an empty run (never published; kept so that one could never wedge the walk)
        fill_batch(args, dc, next + m, kReadyDevRing | kReadyResident);
        __threadfence();
        mark_filled(dc, next + m);
        p.next = next + m + 1;
      } else {
        fill_program(args, dc, p);
      }
    }
    return kCmdRun;
  }
  if (!seq_reached(ld_vol(&dc->done[(next - 1) & (kMaxBatches - 1)]), next - 1)) return kCmdRun;  // work left
  if (args.standby & kStandbyKicks) return kicks_idle(args, dc, hc, p);
  if (!p.idle) {
    p.idle = true;
    p.spins = 0;
    p.t_idle = globaltimer();
  }
  // Every 32 polls: the yield word (pinned, ~1 us to read) and the idle clock. Every 1024 polls kept the
  // worker resident up to ~0.4 ms after a yield request, while foreign GEMMs that need its SMs wait (F7).
  // A standby's first idle poll decides at once (kStandbyFirstLook).
  const bool first_look = (args.standby & kStandbyFirstLook) && !p.filled_any && p.spins == 0;
  if ((++p.spins & 31u) != 0 && !first_look) return kCmdRun;
  if (p.spins == 32) st_vol(&hc->polling_seq, next);
  // A standby that finds nothing published (a resident worker ran its batch) leaves at once: it does not read the
  // yield word (a pinned round trip on every standby's way out).
  u64 idle = args.standby && !p.filled_any ? 0 : args.idle_ns;
  const bool want_yield = idle != 0 && ld_vol(&hc->yield_request) != 0;
  if (!want_yield && idle != 0 && args.handover != 0) {
    // Every publication behind busy stream work (each call of a program loop: the previous call's stream wait)
    // queues a standby launch behind this resident worker, gated on its last ready word; they cannot start while
    // it runs. With args.handover (Config::handover_queue) of them queued, leave once idle instead of after
    // idle_ns: the exit path below still stays while a published batch is neither run nor covered by a later
    // standby. Requiring the newest standby to cover the batch this worker waits for (before the forty-second
    // session) never held in a loop that runs ahead of the GPU: the host blocked in cuLaunchKernel after ~7
    // queued launches, before publishing that batch, and every ~7 calls waited out the idle time (a one-level
    // program: 57-61 us per call back to back at GPUOS_IDLE_US=200 and any handover queue, 31 us at 20; H200).
    const u64 sb = ld_vol64(&hc->standby);
    if ((int)((u32)(sb >> 32) - args.gen) >= (int)args.handover) idle = 0;
  }
  if (!want_yield && globaltimer() - p.t_idle < idle) return kCmdRun;
  // Dekker handshake: announce exit, then re-read what the host has published. The host stores
  // host_published, fences, then reads worker_state: at least one side sees the other's store, so a
  // published batch is either seen here (stay) or seen as "worker exiting" by the host (it relaunches).
  st_vol(&hc->worker_state, kWorkerExiting);
  __threadfence_system();
  // Published but not ready, for idle_ns: leave if a later launch is gated on this batch or a later one
  // (HostCtl::standby): it starts once the ready word lands, and the stream work holding it back may need
  // the device free of resident kernels (a device-wide blocking call, a module load).
  const u64 sb = ld_vol64(&hc->standby);
  const bool covered = (u32)(sb >> 32) > args.gen && (int)((u32)sb - next) >= 0;
  // (host_published may lag: a publication stores it after checking its stream, and a resident worker can
  // run the batch first -- not ahead of what ran is "nothing published".)
  if ((int)(ld_vol(&hc->host_published) - (next - 1)) <= 0 || covered) return leave(args, dc, hc, p, next);
  // Published but not ready, and no later standby covers it: stream work before the flush is still running.
  // Stay; check again later. A burst grid gives back the SMs beyond the bounded grid: that stream work may be
  // a kernel that cannot fit beside a worker block, and the batch's ready write waits for it (a deadlock if
  // every SM held a block).
  st_vol(&hc->worker_state, kWorkerRunning);
  __threadfence_system();
  if (gridDim.x > args.keep_blocks) st_vol(&dc->shrink, args.gen);
  p.t_idle = globaltimer();
  return kCmdRun;
}

// Whether this block leaves batch `cur` to its home blocks (ProgLevel::home): homes count over the bounded grid's
// blocks only (those never leave before the launch ends), so a level is always claimed.
__device__ __forceinline__ bool home_skips(const WorkerArgs& args, u32 home) {
  return !home_has(home, gridDim.x < args.keep_blocks ? gridDim.x : args.keep_blocks, blockIdx.x);
}
// Homed levels from w.cur on that this block passes (their seq / home words, kHomeLook of them), and in *bs batch
// cur's bseq word, all in one round trip: how many to step over before the first that is not filled yet, not
// homed, or this block's. The acquire load goes last, so the relaxed loads before it are in flight with it and a
// batch this block runs costs this round trip and its fields' (as before homes: bseq, then fields). (Before,
// each homed level passed cost a bseq round trip and a fields round trip: a home block that had run a level some
// levels back reached its next one late; the twenty-fifth session's first pass put its loads before bseq's, a
// round trip more on every batch looked at.)
constexpr u32 kHomeLook = 8;
__device__ __forceinline__ u32 homes_passed(const WorkerArgs& args, const DevCtl* dc, u32 cur, u32* bs) {
  u64 v[kHomeLook];
#pragma unroll
  for (u32 j = 0; j < kHomeLook; ++j) v[j] = ld_vol64(&dc->bsh[(cur + j) & (kMaxBatches - 1)]);
  *bs = ld_acq(&dc->bseq[cur & (kMaxBatches - 1)]);
  u32 j = 0;
  while (j < kHomeLook && (u32)(v[j] >> 32) == cur + j && home_skips(args, (u32)v[j])) ++j;
  return j;
}

// Thread 0: claim the next chunk of work, walking forward from w.cur (past batches whose home leaves them to other
// blocks: home_skips). Returns kCmdRun with the claim in s_claim (seq << 32 | index) and the batch's fields in
// s_batch, or kCmdExit.
__device__ u32 claim_next(const WorkerArgs& args, DevCtl* dc, HostCtl* hc, Walk& w, Poller& p, u32 nwarps,
                          u64* s_claim, u32* s_batch) {
  auto fields = [&](u32 seq) {  // six independent loads: one round trip
    const u32 sl = seq & (kMaxBatches - 1);
    w.f[0] = ld_vol(&dc->bcount[sl]);
    w.f[1] = ld_vol(&dc->bstart[sl]);
    w.f[2] = ld_vol(&dc->bsrc[sl]);
    w.f[3] = ld_vol(&dc->alias.bver[sl]);
    w.f[4] = ld_vol(&dc->bdep[sl]);
    w.f[5] = ld_vol(&dc->bhome[sl]);
    w.fd = ld_vol64(&dc->bdesc[sl]);
    w.f_seq = seq;
  };
  for (;;) {
    if (w.f_seq != w.cur) {  // is batch cur filled?
      u32 bs;
      if (const u32 pass = homes_passed(args, dc, w.cur, &bs)) {  // filled, and left to other blocks
        w.cur += pass;
        continue;
      }
      if (bs != w.cur) {
        if ((int)(bs - w.cur) > 0) {  // the slot holds a later batch: this block fell behind; skip ahead
          w.cur = bs;
          continue;
        }
        if (blockIdx.x == 0) {
          if (poll_step(args, dc, hc, p) == kCmdExit) return kCmdExit;
        } else {
          if (ld_vol(&dc->exit_flag) == args.gen) return kCmdExit;
          if (blockIdx.x >= args.keep_blocks && ld_vol(&dc->shrink) == args.gen) return kCmdExit;
        }
        continue;
      }
      fields(w.cur);
    }
    // The poller fills the batches after this one while this one is still being claimed, so that blocks
    // finishing their share early find them filled (otherwise they wait until block 0 is between claims): once
    // per batch, while fewer than kEarlyFillLead(Homed) are filled ahead of it. An exit decision there (every filled
    // batch done, idle_us without a fill) ends the launch.
    if (blockIdx.x == 0 && p.early_for != w.cur &&
        (int)(p.next - w.cur) < (int)(w.f[5] ? kEarlyFillLeadHomed : kEarlyFillLead)) {
      p.early_for = w.cur;
      if (poll_step(args, dc, hc, p) == kCmdExit) return kCmdExit;
    }
    if (home_skips(args, w.f[5])) {  // not one of this level's home blocks: on to the next
      ++w.cur;
      continue;
    }
    const u32 per_claim = claim_size(w.f[0], gridDim.x, nwarps);
    const u64 c = atomicAdd((unsigned long long*)&dc->claim[w.cur & (kMaxBatches - 1)], (unsigned long long)per_claim);
    const u32 seq = (u32)(c >> 32), idx = (u32)c;
    if (seq != w.cur) {  // the slot was refilled with a later batch: this claim is on that one (it is filled)
      w.cur = seq;
      while (ld_acq(&dc->bseq[seq & (kMaxBatches - 1)]) != seq) {}  // its fields before they are read
      fields(seq);
    }
    if (idx >= w.f[0]) {  // batch exhausted: on to the next
      ++w.cur;
      continue;
    }
    *s_claim = c;
    s_batch[0] = w.f[0], s_batch[1] = w.f[1], s_batch[2] = w.f[2], s_batch[3] = w.f[3], s_batch[4] = per_claim;
    s_batch[5] = (u32)w.fd, s_batch[6] = (u32)(w.fd >> 32), s_batch[7] = w.f[4];
    return kCmdRun;
  }
}

// Thread 0: wait until every batch up to `dep` has completed (this block holds a claim on a batch whose bdep is
// dep: seq - 1, or further back for a kReadyJoin batch). It polls dep's `remaining` word, which reaches zero with
// the last block's atomicSub (one hop earlier than the done word that block then stores) -- enough only when dep
// is not itself a join batch: a plain batch's claims all waited for every batch before it, a join batch's did
// not -- and its done word (done words land in seq order; the slot may have been refilled since: then it
// completed long ago). Block 0 keeps filling meanwhile; no exit is possible while a claim is held (the poller
// leaves only when all is done).
__device__ __forceinline__ void wait_prev(const WorkerArgs& args, DevCtl* dc, HostCtl* hc, Poller& p, u32 dep) {
  const u32 ps = dep & (kMaxBatches - 1);
  // bseq before remaining: a remaining word read after seeing bseq == dep is dep's (or a later refill's).
  for (u32 b = ld_acq(&dc->bseq[ps]); b != dep; b = ld_acq(&dc->bseq[ps]))
    if ((int)(b - dep) > 0) return;  // refilled: dep completed long ago (the poller fills behind done words)
  const bool plain = ld_vol(&dc->bdep[ps]) == dep - 1;
  // Both words in one round trip per look (the short-circuit form loaded done only after remaining came back: two
  // round trips per look, and a level whose few home blocks poll for it saw its predecessor's end that much later).
  for (;;) {
    const u32 r = ld_vol(&dc->remaining[ps]), dn = ld_vol(&dc->done[ps]);
    if ((plain && r == 0) || seq_reached(dn, dep)) break;
    if (blockIdx.x == 0) poll_step(args, dc, hc, p, true);
  }
  fence_acq_rel();  // acquire: the previous level's writes before this level's loads
}

}  // namespace gpuos
