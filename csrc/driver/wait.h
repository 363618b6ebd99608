// csrc/driver/wait.h -- the one bounded spin-wait: every wait of the host for the GPU goes through it, so
// every wait has a timeout that turns into a CudaError naming what was waited for.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "driver/cuda_api.h"

namespace gpuos {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spin until done() is true or timeout_s have passed; returns whether done() came true. done() may throw (a failed
// driver query). After a short spin the thread yields its core between polls.
template <class Done>
bool spin_until(double timeout_s, Done&& done) {
  if (done()) return true;
  const auto t0 = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s);
  for (uint32_t spin = 1;; ++spin) {
    if (done()) return true;
    cpu_relax();
    if ((spin & 255) == 0) {
      if (std::chrono::steady_clock::now() - t0 > limit) return false;
      if (spin > (1u << 16)) std::this_thread::yield();
    }
  }
}

// The same, for a wait that must end: throws CudaError(timeout_message()) once timeout_s have passed.
template <class Done, class Message>
void spin_wait(double timeout_s, Done&& done, Message&& timeout_message) {
  if (!spin_until(timeout_s, done)) throw CudaError(timeout_message());
}

// Wait (bounded) until everything queued on `stream` has run.
void wait_stream(CUstream stream, double timeout_s, const std::string& what);

}  // namespace gpuos
