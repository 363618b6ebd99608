// csrc/python/host_sampler.cpp -- a wall-clock sampling profiler of one host thread (gpuos_ext._host_sampler_*,
// tools/host_profile.py): where the recording thread's time goes in C++ (the dispatcher front, lowering,
// publication, PyTorch, the interpreter), also while it waits (a lock, the GIL). The device machines have no perf.
//
// A POSIX timer (CLOCK_MONOTONIC) delivers SIGPROF to the starting thread only (SIGEV_THREAD_ID); the handler takes
// the thread's return addresses with backtrace() into a fixed buffer, nothing else (no allocation, no lock of ours).
// backtrace() is called once before the timer starts, so its first-call setup (loading libgcc_s) is not in a
// handler. stop() turns the timer off (the handler stays, disarmed, unless another was there before) and returns
// the stacks, aggregated, each address as (module path, offset): dladdr gives the module even for hidden symbols;
// the Python side names them from the module's symbol table.
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/extension.h>

#include "python/bindings.h"

namespace gpuos {
namespace {

constexpr int kMaxFrames = 64;
constexpr int kSkipFrames = 2;  // the handler and the signal trampoline

struct Sample {
  int n;
  void* pc[kMaxFrames];
};

struct Sampler {
  std::unique_ptr<Sample[]> buf;
  size_t cap = 0;
  std::atomic<size_t> next{0};     // the next free sample (>= cap: the buffer is full; counted as dropped)
  std::atomic<bool> armed{false};  // the handler records only while armed
  timer_t timer{};
  struct sigaction old {};
  bool running = false;
  pid_t tid = 0;  // the sampled thread: stop() must run on it (the handler interrupts only it)
};

Sampler g_s;

void on_sigprof(int, siginfo_t*, void*) {
  if (!g_s.armed.load(std::memory_order_acquire)) return;
  const int saved = errno;  // (backtrace may set it; the interrupted code must not see a change)
  const size_t i = g_s.next.fetch_add(1, std::memory_order_relaxed);
  if (i < g_s.cap) g_s.buf[i].n = backtrace(g_s.buf[i].pc, kMaxFrames);
  errno = saved;
}

void start(double hz, size_t max_samples) {
  if (g_s.running) throw std::runtime_error("host sampler: already running (call _host_sampler_stop first)");
  if (!(hz >= 1.0 && hz <= 20000.0))
    throw std::invalid_argument("host sampler: hz must be in [1, 20000], got " + std::to_string(hz));
  if (max_samples < 1 || max_samples > 10'000'000)
    throw std::invalid_argument("host sampler: max_samples must be in [1, 10000000], got " +
                                std::to_string(max_samples));
  void* warm[4];
  backtrace(warm, 4);  // libgcc_s loaded here, not in the handler
  g_s.buf.reset(new Sample[max_samples]);
  g_s.cap = max_samples;
  g_s.next.store(0);
  struct sigaction sa {};
  sa.sa_sigaction = on_sigprof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, &g_s.old) != 0) throw std::runtime_error("host sampler: sigaction(SIGPROF) failed");
  struct sigevent ev {};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGPROF;
  g_s.tid = (pid_t)syscall(SYS_gettid);
  ev._sigev_un._tid = g_s.tid;
  if (timer_create(CLOCK_MONOTONIC, &ev, &g_s.timer) != 0) {
    sigaction(SIGPROF, &g_s.old, nullptr);
    throw std::runtime_error("host sampler: timer_create failed");
  }
  g_s.armed.store(true, std::memory_order_release);
  const long ns = (long)(1e9 / hz);
  struct itimerspec its {};
  its.it_interval.tv_sec = ns / 1'000'000'000;
  its.it_interval.tv_nsec = ns % 1'000'000'000;
  its.it_value = its.it_interval;
  if (timer_settime(g_s.timer, 0, &its, nullptr) != 0) {
    g_s.armed.store(false);
    timer_delete(g_s.timer);
    sigaction(SIGPROF, &g_s.old, nullptr);
    throw std::runtime_error("host sampler: timer_settime failed");
  }
  g_s.running = true;
}

py::dict stop() {
  if (!g_s.running) throw std::runtime_error("host sampler: not running (call _host_sampler_start first)");
  // On the sampled thread, a handler never runs beside this code: one that began before the disarm below
  // finished before the thread came back here; from another thread, one might still be writing the buffer.
  if ((pid_t)syscall(SYS_gettid) != g_s.tid)
    throw std::runtime_error("host sampler: stop it on the thread that started it");
  timer_delete(g_s.timer);  // no new expirations; one already queued finds the handler disarmed
  g_s.armed.store(false, std::memory_order_release);
  // An expiration still pending finds the disarmed handler; under the default action (terminate) it would end
  // the process, so only another handler that was there before is put back.
  if (g_s.old.sa_handler != SIG_DFL && g_s.old.sa_handler != SIG_IGN) sigaction(SIGPROF, &g_s.old, nullptr);
  g_s.running = false;
  const size_t taken = g_s.next.load();
  const size_t n = std::min(taken, g_s.cap);
  std::map<std::string, int> modules;  // path -> index
  std::vector<std::string> paths;
  std::map<const void*, std::pair<int, uint64_t>> where;  // pc -> (module, offset)
  std::map<std::vector<std::pair<int, uint64_t>>, int64_t> stacks;
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::pair<int, uint64_t>> frames;
    for (int f = kSkipFrames; f < g_s.buf[i].n; ++f) {
      const void* pc = g_s.buf[i].pc[f];
      auto it = where.find(pc);
      if (it == where.end()) {
        Dl_info info{};
        std::pair<int, uint64_t> w{-1, (uint64_t)(uintptr_t)pc};
        if (dladdr(pc, &info) && info.dli_fname) {
          auto [m, fresh] = modules.try_emplace(info.dli_fname, (int)paths.size());
          if (fresh) paths.push_back(info.dli_fname);
          w = {m->second, (uint64_t)((uintptr_t)pc - (uintptr_t)info.dli_fbase)};
        }
        it = where.emplace(pc, w).first;
      }
      frames.push_back(it->second);
    }
    stacks[frames]++;
  }
  g_s.buf.reset();
  py::list out;
  for (const auto& [frames, count] : stacks) {
    py::list fr;
    for (const auto& [m, off] : frames) fr.append(py::make_tuple(m, off));
    out.append(py::make_tuple(count, fr));
  }
  py::dict d;
  d["modules"] = paths;
  d["stacks"] = out;  // [(count, [(module index or -1, offset or absolute pc), ...innermost first])]
  d["samples"] = (int64_t)n;
  d["dropped"] = (int64_t)(taken - n);
  return d;
}

}  // namespace

void add_host_sampler_bindings(py::module_& m) {
  m.def("_host_sampler_start", &start, py::arg("hz") = 4000.0, py::arg("max_samples") = 200'000,
        "Sample this thread's C++ stack hz times a second of wall-clock time (SIGPROF, its own POSIX timer) until "
        "_host_sampler_stop() on the same thread; one sampler at a time. Each sample takes 520 bytes of the buffer "
        "(200,000: 50 s at 4 kHz). tools/host_profile.py names the frames.");
  m.def("_host_sampler_stop", &stop,
        "Stop the sampler: {'modules': [path], 'stacks': [(count, [(module index, offset), ...innermost first])], "
        "'samples', 'dropped' (past max_samples)}.");
}

}  // namespace gpuos
