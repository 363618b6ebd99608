// tools/hop_bench.cu -- what a program call's stream hops cost (GPU machine, ~5 s; forty-sixth session: its first
// run wedged -- kernels loaded lazily while the worker spun, F3 -- fixed with eager loading, not yet run again).
//
//   nvcc -std=c++17 -arch=native -O2 tools/hop_bench.cu -lcuda -o /tmp/hop_bench && /tmp/hop_bench
//
// A program call is the caller's stream in series: the ready-word memop, the kick (a kernel), the stream's wait for
// the done word. From one call's done word to the next call's batch filled takes ~12 us (H200, worker_trace.py calls),
// where the whole CUDA-graph call is 6.1. This bench rebuilds that round trip outside the runtime: a "worker" (one
// thread of a kernel on its own stream) waits for ready word i, stamps %globaltimer when it sees it, works 2 us, stamps
// and stores done = i; the "caller" stream carries each call's ops, enqueued ahead by the host. Per variant: median
// and p90 (us) of the round trip, from the worker's store of done i to its sight of ready i + 1:
//   memops       wait(done >= i), write(ready = i + 1)               -- the runtime's shape (the kick aside)
//   memops+kick  wait(done >= i), write(ready = i + 1), empty kernel -- with the kick behind the ready word
//   wait+kernel  wait(done >= i), kernel that stores ready = i + 1  -- the ready word written by a kick
//   kernel only  kernel that stores ready = i + 1 and spins until done >= i + 1 (exits then) -- no memop at all
//   kernel->kernel  (reference) two empty kernels back to back: the stamp of one's exit to the next one's start
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                   \
      return 1;                                                              \
    }                                                                        \
  } while (0)
#define CU(x)                                                                \
  do {                                                                       \
    CUresult r_ = (x);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                \
      std::printf("%s: CUresult %d\n", #x, (int)r_);                         \
      return 1;                                                              \
    }                                                                        \
  } while (0)

typedef unsigned long long u64;
constexpr int kCalls = 2000;
constexpr u64 kWorkNs = 2000, kSpinLimitNs = 2000000000ull;  // every device spin ends (2 s): no hang on a bad variant

__device__ __forceinline__ u64 gtime() {
  u64 t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The worker: for each call, wait for ready >= i + 1 (bounded), stamp, work, stamp, store done = i + 1.
__global__ void worker(volatile unsigned* ready, volatile unsigned* done, u64* seen, u64* stored, int n, int* failed) {
  for (int i = 0; i < n; ++i) {
    const u64 t0 = gtime();
    while (ready[0] < (unsigned)(i + 1))
      if (gtime() - t0 > kSpinLimitNs) {
        *failed = i + 1;
        return;
      }
    seen[i] = gtime();
    const u64 t1 = seen[i];
    while (gtime() - t1 < kWorkNs) {
    }
    stored[i] = gtime();
    __threadfence_system();
    done[0] = (unsigned)(i + 1);
    __threadfence_system();
  }
}
__global__ void empty_kernel() {}
__global__ void write_ready(volatile unsigned* ready, unsigned v) {
  __threadfence();
  ready[0] = v;
  __threadfence_system();
}
// A kick that writes its call's ready word and stays until that call's done word (bounded).
__global__ void kick_wait(volatile unsigned* ready, volatile unsigned* done, unsigned v) {
  ready[0] = v;
  __threadfence_system();
  const u64 t0 = gtime();
  while (done[0] < v && gtime() - t0 < kSpinLimitNs) {
  }
}
__global__ void stamp(u64* at, int i, int exit_too) {
  at[2 * i] = gtime();
  if (exit_too) at[2 * i + 1] = gtime();
}

// Bounded wait for a stream: on a timeout (a variant that wedged) both words are forced to their maximum from another
// stream, which ends every spin and stream wait, and the variant is reported as wedged.
static bool wait_bounded(cudaStream_t s, unsigned* flags, cudaStream_t side, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(s) == cudaErrorNotReady)
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
      static unsigned big[64];
      std::fill(big, big + 64, 0xffffffffu);  // ready (word 0) and done (word 32)
      cudaMemcpyAsync(flags, big, sizeof(big), cudaMemcpyHostToDevice, side);
      cudaStreamSynchronize(side);
      cudaDeviceSynchronize();
      return false;
    }
  return true;
}

static void report(const char* name, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("%-16s median %6.2f us  p10 %6.2f  p90 %6.2f  (n %zu)\n", name, v[v.size() / 2], v[v.size() / 10],
              v[v.size() * 9 / 10], v.size());
}

int main() {
  // Eager loading: a kernel loaded lazily on its first launch while the worker spins would wait for the worker to
  // exit (DESIGN F3), and the worker for that kernel's ready word.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  CU(cuInit(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("hop_bench on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  unsigned *flags, *ready, *done;
  u64 *seen, *stored, *stamps;
  int* failed;
  CK(cudaMalloc(&flags, 256));
  ready = flags;
  done = flags + 32;  // another 128-byte line
  CK(cudaMalloc(&seen, kCalls * sizeof(u64)));
  CK(cudaMalloc(&stored, kCalls * sizeof(u64)));
  CK(cudaMalloc(&stamps, 2 * kCalls * sizeof(u64)));
  CK(cudaMalloc(&failed, sizeof(int)));
  cudaStream_t ws, cs, side;
  CK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  // HOP_LEGACY=1: the caller's operations on the legacy default stream (torch's current stream unless the user
  // picks another), as a program loop that never sets a stream runs them.
  const bool legacy = std::getenv("HOP_LEGACY") && std::getenv("HOP_LEGACY")[0] == '1';
  if (legacy) cs = cudaStreamLegacy;
  std::printf("caller stream: %s\n", legacy ? "legacy default" : "non-blocking");
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  // Every kernel launched once before any worker is resident (with EAGER above, belt and braces).
  CK(cudaMemset(flags, 0, 256));
  empty_kernel<<<1, 32, 0, cs>>>();
  write_ready<<<1, 1, 0, cs>>>(ready, 1);
  kick_wait<<<1, 1, 0, cs>>>(ready, ready, 1);  // its "done" word is the ready word just written: returns at once
  stamp<<<1, 32, 0, cs>>>(stamps, 0, 1);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const char* names[] = {"memops", "memops+kick", "wait+kernel", "kernel only"};
  for (int variant = 0; variant < 4; ++variant) {
    CK(cudaMemset(flags, 0, 256));
    CK(cudaMemset(failed, 0, sizeof(int)));
    CK(cudaDeviceSynchronize());
    worker<<<1, 1, 0, ws>>>(ready, done, seen, stored, kCalls, failed);
    CK(cudaGetLastError());
    if (variant == 3) {  // no memop: call i is one kernel that writes ready = i + 1 and stays until done >= i + 1
      for (int i = 0; i < kCalls; ++i) kick_wait<<<1, 1, 0, cs>>>(ready, done, (unsigned)(i + 1));
    } else {  // call 0's ready word, then per call i: the wait for done >= i + 1 and call i + 1's ready word
      CU(cuStreamWriteValue32((CUstream)cs, (CUdeviceptr)ready, 1, 0));
    }
    for (int i = 0; i < kCalls - 1 && variant != 3; ++i) {
      const unsigned next = (unsigned)(i + 2);
      CU(cuStreamWaitValue32((CUstream)cs, (CUdeviceptr)done, (unsigned)(i + 1), CU_STREAM_WAIT_VALUE_GEQ));
      if (variant == 2) {
        write_ready<<<1, 1, 0, cs>>>(ready, next);
      } else {
        CU(cuStreamWriteValue32((CUstream)cs, (CUdeviceptr)ready, next, 0));
        if (variant == 1) empty_kernel<<<1, 32, 0, cs>>>();
      }
    }
    CK(cudaGetLastError());
    if (!wait_bounded(cs, flags, side, 10.0) || !wait_bounded(ws, flags, side, 1.0)) {
      std::printf("%-16s wedged (10 s): skipped\n", names[variant]);
      continue;
    }
    int f = 0;
    CK(cudaMemcpy(&f, failed, sizeof(int), cudaMemcpyDeviceToHost));
    if (f) {
      std::printf("%-16s the worker waited 2 s for call %d's ready word: skipped\n", names[variant], f - 1);
      continue;
    }
    std::vector<u64> s(kCalls), d(kCalls);
    CK(cudaMemcpy(s.data(), seen, kCalls * sizeof(u64), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(d.data(), stored, kCalls * sizeof(u64), cudaMemcpyDeviceToHost));
    std::vector<double> trip;
    for (int i = 100; i < kCalls - 1; ++i) trip.push_back((double)(s[i + 1] - d[i]) / 1e3);  // warm-up skipped
    report(names[variant], trip);
  }
  // Reference: kernel -> kernel on one stream (exit stamp of one to the start stamp of the next).
  for (int i = 0; i < kCalls; ++i) stamp<<<1, 32, 0, cs>>>(stamps, i, 1);
  CK(cudaGetLastError());
  if (!wait_bounded(cs, flags, side, 10.0)) return 1;
  std::vector<u64> st(2 * kCalls);
  CK(cudaMemcpy(st.data(), stamps, 2 * kCalls * sizeof(u64), cudaMemcpyDeviceToHost));
  std::vector<double> kk;
  for (int i = 100; i < kCalls - 1; ++i) kk.push_back((double)(st[2 * (i + 1)] - st[2 * i + 1]) / 1e3);
  report("kernel->kernel", kk);
  return 0;
}
