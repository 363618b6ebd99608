// csrc/sched/deferred.cpp -- see deferred.h.
#include "sched/deferred.h"

#include <condition_variable>
#include <mutex>

#include "config/config.h"

namespace gpuos {
namespace {
Deferred g_def[kMaxDevices];
thread_local uint64_t t_devices = 0;  // take_thread_devices
int g_worker_matmul = -1;  // -1: not chosen yet (the environment's setting applies)
int g_worker_attention = -1;
int g_timer_off_gil = -1;
}  // namespace

SchedStats g_sched;
bool g_fusion = true;
bool g_row_fusion = true;
bool g_mm_epilogue = true;
bool g_mm_prologue = true;

bool worker_matmul_enabled() {
  if (g_worker_matmul < 0) g_worker_matmul = env_config().worker_matmul ? 1 : 0;
  return g_worker_matmul != 0;
}
void set_worker_matmul(bool on) { g_worker_matmul = on ? 1 : 0; }
bool worker_attention_enabled() {
  if (g_worker_attention < 0) g_worker_attention = env_config().worker_attention ? 1 : 0;
  return g_worker_attention != 0;
}
void set_worker_attention(bool on) { g_worker_attention = on ? 1 : 0; }
bool timer_off_gil() {
  if (g_timer_off_gil < 0) g_timer_off_gil = env_config().timer_off_gil ? 1 : 0;
  return g_timer_off_gil != 0;
}
void set_timer_off_gil(bool on) { g_timer_off_gil = on ? 1 : 0; }

Deferred& deferred_of(int dev) { return g_def[dev]; }

void note_thread_devices(uint64_t mask) { t_devices |= mask; }
void forget_thread_devices(uint64_t mask) { t_devices &= ~mask; }

uint64_t take_thread_devices() {
  const uint64_t m = t_devices;
  t_devices = 0;
  return m;
}

size_t deferred_count() {
  size_t n = 0;
  for (auto& D : g_def) n += D.ops.size();
  return n;
}

void init_deferred() {
  set_before_record_hook([](int dev, Runtime& rt) {
    t_devices |= 1ull << dev;
    lower_deferred(dev, rt);
  });
}

namespace {
// Tests: hold timers' off-GIL publications at chosen points (a dependency check can then be made while one is
// in flight, deterministically; two timers at two points). Bounded: a hold not released in 10 s lets it go on.
struct TimerHold {
  std::mutex mu;
  std::condition_variable cv;
  int armed = 0;    // the points held (kTimerHold* bits), 0: none
  int reached = 0;  // the armed points a timer has reached since they were armed
} g_hold;
}  // namespace

void timer_hold_point(int here) {
  std::unique_lock<std::mutex> g(g_hold.mu);
  if (!(g_hold.armed & here)) return;
  g_hold.reached |= here;
  g_hold.cv.notify_all();
  g_hold.cv.wait_for(g, std::chrono::seconds(10), [here] { return !(g_hold.armed & here); });
}

void hold_timer_publication(int where) {
  std::lock_guard<std::mutex> g(g_hold.mu);
  g_hold.armed = where;
  g_hold.reached &= where;
  g_hold.cv.notify_all();
}

bool timer_publication_held(double timeout_s, int point) {
  std::unique_lock<std::mutex> g(g_hold.mu);
  return g_hold.cv.wait_for(g, std::chrono::duration<double>(timeout_s), [point] { return (g_hold.reached & point) != 0; });
}

void sched_publish(int dev, Runtime& rt, const char* cause, RtLock* off_gil) {
  Deferred& D = deferred_of(dev);
  if (D.ops.empty()) return;
  FlushCount fc;
  const auto publish = [&](CUstream s) {
    const auto t0 = std::chrono::steady_clock::now();
    fc = flush_measured(rt, s);
    g_sched.publish_ns += (uint64_t)std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count();
  };
  if (off_gil) {
    const OffGilPublish off{off_gil, [&](CUstream s) {
                              timer_hold_point(kTimerHoldPublish);
                              publish(s);
                            }};
    lower_deferred(dev, rt, &off);
  } else {
    const CUstream s = D.stream;
    lower_deferred(dev, rt);
    publish(s);
  }
  count_flush(cause, fc);
}

FlushCount flush_measured(Runtime& rt, CUstream s) {
  const RuntimeStats before = rt.stats();
  rt.flush(s);
  const RuntimeStats after = rt.stats();
  return FlushCount{after.batches - before.batches, after.worker_launches - before.worker_launches};
}

void count_flush(const char* cause, const FlushCount& fc) {
  SchedStats::Cause& c = g_sched.by_cause[cause];
  g_sched.flushes++;
  c.flushes++;
  c.batches += fc.batches;
  c.launches += fc.launches;
}

void flush_counted(Runtime& rt, CUstream s, const char* cause) { count_flush(cause, flush_measured(rt, s)); }

DeferredOp& defer(int dev, Runtime& rt, CUstream s) {
  Deferred& D = deferred_of(dev);
  t_devices |= 1ull << dev;
  if (!D.ops.empty() && D.stream != s) {
    RtLock lk(rt);  // (waits without the GIL: another thread may record meanwhile; it publishes those too)
    sched_publish(dev, rt, "stream_change");
  }
  if (D.ops.empty()) {
    D.stream = s;
    D.oldest = std::chrono::steady_clock::now();
  }
  D.ops.emplace_back();
  return D.ops.back();
}

// Count the op; publish when the deferred ops could fill the ring (ops up to size_threshold use up to 8 tiles).
void note_deferred(int dev, Runtime& rt) {
  g_sched.intercepted++;
  if (deferred_of(dev).ops.size() * 8 < rt.config().capacity) return;
  RtLock lk(rt);
  sched_publish(dev, rt, "size");
}

}  // namespace gpuos
