// tools/gemv_bw.cu -- how fast an M = 1 fp16 product streams its weight on the worker's shape (GPU machine: nvcc
// ~40 s, it includes worker.cu; ~5 s per shape).
//
//   nvcc -std=c++17 -arch=sm_90 -O3 -lineinfo -I . tools/gemv_bw.cu -o /tmp/gemv_bw && /tmp/gemv_bw [N K]
//
// The question (DEVELOPING *Next* 5, issue #16's goal of 70 % of a copy's bandwidth at M = 1): the worker runs one
// block of 256 threads per SM (every register of the SM, 255 per thread), and its mma items keep a few 16-byte loads
// in flight per lane -- 50-53 % of the copy at 4,096^2, and more loads in flight per lane (U = 4 / 8) did not help
// (thirty-fifth session). Is that shape's memory parallelism the bound, and does the Hopper bulk copy engine
// (cp.async.bulk into shared memory, completion on an mbarrier: no registers held per byte in flight) lift it?
// Answer (thirty-sixth session, H200; DEVELOPING *Next* 5, EXPERIMENTS 5): neither -- the worker's own item, run here
// without the worker around it, streams 4,096^2 in 4 K slices at 122-128 % of the per-launch copy's rate (~86-90 %
// of bench_matmul's steady copy); the claim around the items in the worker is what costs
// (benchmarks/results/gemv_bw_c5c7ae9.txt).
//
// y[n] = sum_k W[n, k] * x[k], W N x K fp16 K-contiguous (linear's weight), x fp16, y fp32. Every case reads the
// whole weight once per launch from HBM: the launches rotate over enough copies of W to overflow L2. Cases:
//   regs U=u   one warp per weight row at a time (rows round-robin over the grid's warps), each lane loading u
//              16-byte vectors of the row before using any (u = 4, 8, 16), on SMs x 256 threads (the worker's
//              shape) -- and on 4x as many blocks (occupancy the worker does not have);
//   rows R=r   the same with r rows per warp at once, one vector of each row in flight per lane (the worker's mma
//              item holds 16 rows of the weight);
//   bulk S=s C=c  each warp streams its rows in chunks of c bytes through s shared-memory stages: lane 0 issues
//              one cp.async.bulk per chunk onto the stage's mbarrier, the warp waits on the barrier's phase, reads
//              the chunk from shared memory and refills the stage with the chunk s ahead (s x c: 8-48 KB per warp);
//   item U=u/s  the worker's own mma item (matmul.h mm_mma, fp16, M = 1, u chunks of 64 k in flight) on every warp of
//              SMs x 256 threads, items (tile of 16 columns, K slice) round-robin over the warps, K in s slices (the
//              worker splits a 4,096^2 product in 4). (A variant whose items started their rounds of loads at
//              rotated offsets, so that items running at once read different offsets of their rows, ran in the
//              thirty-sixth session -- no gain, EXPERIMENTS 5 -- and was removed.)
//   copy       cudaMemcpyAsync of the same bytes device to device, timed per launch as the cases are; and the
//              steady rate of such copies back to back (bench_matmul.py's reference: one copy of 256 MB).
// Prints per case: us per product, GB/s of weight read, % of each copy; and the largest error against a CPU
// reference of one product (fp32 sums).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "device_src/worker.cu"  // the worker's mma item (matmul.h mm_mma), run here on every warp of the grid

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

constexpr int kThreads = 256, kWarps = kThreads / 32;

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __half2* a = reinterpret_cast<const __half2*>(&w);
  const __half2* b = reinterpret_cast<const __half2*>(&x);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __half22float2(a[i]), fb = __half22float2(b[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Register loads: a row of K fp16 is K / 8 vectors; lane l takes vectors l, l + 32, ...; U of them in flight.
template <int U>
__global__ void __launch_bounds__(kThreads) gemv_regs(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                      float* __restrict__ y, int N, int K) {
  const int lane = threadIdx.x & 31, nwarps = gridDim.x * kWarps;
  const int vpr = K / 8;  // vectors per row
  for (int n = blockIdx.x * kWarps + (threadIdx.x >> 5); n < N; n += nwarps) {
    const uint4* row = w + (size_t)n * vpr;
    float acc = 0.0f;
    for (int v0 = lane; v0 < vpr; v0 += 32 * U) {
      uint4 q[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        q[u] = v0 + 32 * u < vpr ? __ldg(row + v0 + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (v0 + 32 * u < vpr) acc += dot8(q[u], __ldg(x + v0 + 32 * u));
    }
    acc = warp_sum(acc);
    if (lane == 0) y[n] = acc;
  }
}

// Register loads over R rows at once (the worker's mma item: 16 rows of the weight per tile): lane l loads vector v
// of each of the R rows before using any (R loads in flight per lane), rows in groups of R round-robin over warps.
template <int R>
__global__ void __launch_bounds__(kThreads) gemv_rows(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                      float* __restrict__ y, int N, int K) {
  const int lane = threadIdx.x & 31, nwarps = gridDim.x * kWarps;
  const int vpr = K / 8;
  for (int n0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * R; n0 < N; n0 += nwarps * R) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int v = lane; v < vpr; v += 32) {
      uint4 q[R];
#pragma unroll
      for (int r = 0; r < R; ++r) q[r] = n0 + r < N ? __ldg(w + (size_t)(n0 + r) * vpr + v) : make_uint4(0, 0, 0, 0);
      const uint4 xv = __ldg(x + v);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += dot8(q[r], xv);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float t = warp_sum(acc[r]);
      if (lane == 0 && n0 + r < N) y[n0 + r] = t;
    }
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
// Lane 0: the stage's barrier expects `bytes` of transactions, then the bulk copy of them lands on it.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// Every lane: wait until the barrier's phase `parity` completed. A bounded spin: a probe must never hang (returns
// false after ~2^26 polls: the caller records an error).
__device__ __forceinline__ bool mbar_wait(uint64_t* bar, uint32_t parity) {
  for (uint32_t i = 0; i < (1u << 26); ++i) {
    uint32_t done;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    if (done) return true;
  }
  return false;
}

// Bulk copies: each warp walks its rows in chunks of C bytes (C divides the row) through S stages of C bytes in
// dynamic shared memory, one mbarrier each; lane 0 refills a stage with the chunk S ahead once the warp read it.
template <int S>
__global__ void __launch_bounds__(kThreads) gemv_bulk(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                      float* __restrict__ y, int N, int K, int C, int* err) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bars[kWarps][S];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nwarps = gridDim.x * kWarps;
  const int vpr = K / 8, vpc = C / 16, cpr = vpr / vpc;  // vectors per row, per chunk; chunks per row
  uint4* stage = reinterpret_cast<uint4*>(smem) + (size_t)wid * S * vpc;
  const int first = blockIdx.x * kWarps + wid;
  const int rows = first < N ? (N - first + nwarps - 1) / nwarps : 0, total = rows * cpr;
  auto chunk = [&](int j) { return w + (size_t)(first + (j / cpr) * nwarps) * vpr + (size_t)(j % cpr) * vpc; };
  if (lane == 0) {
    for (int s = 0; s < S; ++s) mbar_init(&bars[wid][s]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int j = 0; j < S && j < total; ++j) bulk_load(stage + j * vpc, chunk(j), (uint32_t)C, &bars[wid][j]);
  }
  __syncwarp();
  float acc = 0.0f;
  for (int j = 0; j < total; ++j) {
    const int s = j % S, c = j % cpr;
    if (!mbar_wait(&bars[wid][s], (uint32_t)(j / S) & 1u)) {
      if (lane == 0) atomicAdd(err, 1);
      return;
    }
    const uint4* st = stage + s * vpc;
    for (int v = lane; v < vpc; v += 32) acc += dot8(st[v], __ldg(x + c * vpc + v));
    if (c == cpr - 1) {
      acc = warp_sum(acc);
      if (lane == 0) y[first + (j / cpr) * nwarps] = acc;
      acc = 0.0f;
    }
    __syncwarp();  // every lane's reads of the stage before its refill (generic reads, then the async proxy's write)
    if (lane == 0 && j + S < total) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      bulk_load(stage + s * vpc, chunk(j + S), (uint32_t)C, &bars[wid][s]);
    }
  }
}

// The worker's mma item over every (tile, K slice): each writes its 16 partial sums to y[slice * N + n] (the host
// adds the slices when it checks).
template <gpuos::u32 U>
__global__ void __launch_bounds__(kThreads) gemv_item(const char* w, const char* x, float* y, int N, int K, int ks) {
  __shared__ float part[kWarps][gpuos::kMmMmaCols];
  const gpuos::u32 lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nwarps = gridDim.x * kWarps;
  gpuos::MmArgs g{};
  g.a = x, g.b = w, g.out = nullptr, g.bias = nullptr, g.b2 = nullptr, g.epi = nullptr;
  g.M = 1, g.K = K, g.N = N, g.dta = g.dtb = g.dto = g.dtc = gpuos::kF16, g.epi_dt = gpuos::kF32, g.alpha = 1.0f;
  g.as0 = K, g.as1 = 1, g.bs0 = 1, g.bs1 = K, g.os0 = N, g.os1 = 1;
  const int ntile = N / (int)gpuos::kMmMmaCols, items = ntile * ks, kspan = K / ks;
  for (int it = blockIdx.x * kWarps + wid; it < items; it += nwarps) {
    const int tile = it / ks, kp = it - tile * ks;
    const gpuos::i64 n0 = (gpuos::i64)tile * gpuos::kMmMmaCols;
    gpuos::mm_mma<false, false, U>(g, n0, (gpuos::i64)kp * kspan, (gpuos::i64)(kp + 1) * kspan, part[wid], true,
                                   lane);
    __syncwarp();
    if (lane < gpuos::kMmMmaCols) y[(size_t)kp * N + n0 + lane] = part[wid][lane];
    __syncwarp();
  }
}

int main(int argc, char** argv) {
  const int N = argc > 2 ? std::atoi(argv[1]) : 4096, K = argc > 2 ? std::atoi(argv[2]) : 4096;
  if (K % 256 != 0 || N <= 0) {
    std::printf("gemv_bw: K must be a multiple of 256 and N positive (got N %d, K %d)\n", N, K);
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const size_t wbytes = (size_t)N * K * 2;
  // Enough copies of W that a launch never finds its weight in L2 (each launch reads the next copy).
  const int copies = (int)std::max<size_t>(4, (3 * (size_t)prop.l2CacheSize) / wbytes + 2);
  std::printf("gemv_bw: %s, %d SMs, L2 %d MB; N %d K %d fp16 (%.1f MB of weight), %d copies rotated\n", prop.name,
              sms, prop.l2CacheSize >> 20, N, K, wbytes / 1e6, copies);
  std::vector<__half> hw((size_t)N * K), hx(K);
  uint32_t seed = 12345;
  auto rnd = [&] { seed = seed * 1664525u + 1013904223u; return ((seed >> 9) & 0xffff) / 65536.0f - 0.5f; };
  for (auto& v : hw) v = __float2half(rnd());
  for (auto& v : hx) v = __float2half(rnd());
  std::vector<double> ref(N, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) ref[n] += (double)__half2float(hw[(size_t)n * K + k]) * __half2float(hx[k]);
  std::vector<uint4*> W(copies);
  for (auto& p : W) {
    CK(cudaMalloc(&p, wbytes));
    CK(cudaMemcpy(p, hw.data(), wbytes, cudaMemcpyHostToDevice));
  }
  uint4 *x, *dst;
  float* y;
  int* err;
  CK(cudaMalloc(&x, K * 2));
  CK(cudaMalloc(&y, (size_t)8 * N * 4));  // up to 8 K slices' partials (gemv_item)
  CK(cudaMalloc(&dst, wbytes));
  CK(cudaMalloc(&err, 4));
  CK(cudaMemset(err, 0, 4));
  CK(cudaMemcpy(x, hx.data(), K * 2, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int reps = 60;
  // Median us per launch over `reps` launches, each on the next copy of W; checks y against the reference.
  auto time_case = [&](auto launch, double* us, double* maxerr, int slices = 1) -> cudaError_t {
    for (int r = 0; r < 4; ++r) launch(W[r % copies]);
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(e0);
      launch(W[r % copies]);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms * 1e3f);
    }
    if (cudaError_t e = cudaGetLastError()) return e;
    std::sort(t.begin(), t.end());
    *us = t[t.size() / 2];
    std::vector<float> hy((size_t)slices * N);
    cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost);
    *maxerr = 0.0;
    for (int n = 0; n < N; ++n) {
      double v = 0.0;
      for (int s = 0; s < slices; ++s) v += hy[(size_t)s * N + n];
      *maxerr = std::max(*maxerr, std::fabs(v - ref[n]));
    }
    return cudaGetLastError();
  };
  double copy_us, dummy;
  CK(time_case([&](uint4* w) { cudaMemcpyAsync(dst, w, wbytes, cudaMemcpyDeviceToDevice); }, &copy_us, &dummy));
  const double copy_gbps = wbytes / (copy_us * 1e-6) / 1e9;
  // The steady rate: every copy of W copied back to back between two events, the median over 9 rounds -- the
  // reference of bench_matmul.py (one copy of 256 MB), which the per-launch copy above falls short of by its
  // launch (H200, 33.6 MB: 1.42 against 2.0 TB/s; "% of copy" here read 1.4x bench_matmul's, thirty-seventh session).
  std::vector<float> rounds;
  for (int r = 0; r < 9; ++r) {
    cudaEventRecord(e0);
    for (int c = 0; c < copies; ++c) cudaMemcpyAsync(dst, W[c], wbytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    rounds.push_back(ms * 1e3f / copies);
  }
  std::sort(rounds.begin(), rounds.end());
  const double steady_gbps = wbytes / (rounds[rounds.size() / 2] * 1e-6) / 1e9;
  std::printf("copy            %8.2f us  %7.1f GB/s (one per launch); back to back %.2f us, %.1f GB/s\n", copy_us,
              copy_gbps, rounds[rounds.size() / 2], steady_gbps);
  auto report = [&](const char* name, double us, double e) {
    const double gbps = wbytes / (us * 1e-6) / 1e9;
    std::printf("%-15s %8.2f us  %7.1f GB/s  %5.1f %% of copy  %5.1f %% of steady  max err %.2e\n", name, us, gbps,
                100.0 * gbps / copy_gbps, 100.0 * gbps / steady_gbps, e);
  };
  double us, e;
  for (int mult : {1, 4}) {
    const int blocks = sms * mult;
    char name[32];
#define REGS(U)                                                                                     \
    CK(time_case([&](uint4* w) { gemv_regs<U><<<blocks, kThreads>>>(w, x, y, N, K); }, &us, &e)); \
    std::snprintf(name, sizeof name, "regs U=%d x%d", U, mult);                                 \
    report(name, us, e);
    REGS(4) REGS(8) REGS(16)
#undef REGS
#define ROWS(R)                                                                                     \
    CK(time_case([&](uint4* w) { gemv_rows<R><<<blocks, kThreads>>>(w, x, y, N, K); }, &us, &e)); \
    std::snprintf(name, sizeof name, "rows R=%d x%d", R, mult);                                 \
    report(name, us, e);
    ROWS(8) ROWS(16)
#undef ROWS
  }
  const int row = K * 2;
#define BULK(S, CB)                                                                                        \
  {                                                                                                        \
    const int C = std::min(row, CB);                                                                       \
    const size_t sm = (size_t)kWarps * S * C;                                                              \
    if (row % C != 0 || sm + 4096 > (size_t)prop.sharedMemPerBlockOptin) {                                 \
      std::printf("bulk S=%d C=%d   skipped (row %d B, %zu B of stages, %zu B of shared memory)\n", S, C, row, \
                  sm, (size_t)prop.sharedMemPerBlockOptin);                                                \
    } else {                                                                                               \
      CK(cudaFuncSetAttribute(gemv_bulk<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));        \
      CK(time_case([&](uint4* w) { gemv_bulk<S><<<sms, kThreads, sm>>>(w, x, y, N, K, C, err); }, &us, &e)); \
      char name[32];                                                                                       \
      std::snprintf(name, sizeof name, "bulk S=%d C=%d", S, C);                                            \
      report(name, us, e);                                                                                 \
    }                                                                                                      \
  }
  BULK(2, 4096) BULK(4, 4096) BULK(6, 4096) BULK(2, 8192) BULK(3, 8192) BULK(8, 2048) BULK(12, 1024)
#undef BULK
  if (N % (int)gpuos::kMmMmaCols == 0)
    for (int ks : {1, 2, 4, 8}) {
      if (K % (ks * 64) != 0) continue;
      char name[32];
#define ITEM(U)                                                                                                \
      CK(time_case([&](uint4* w) {                                                                             \
                     gemv_item<U><<<sms, kThreads>>>((const char*)w, (const char*)x, y, N, K, ks);             \
                   }, &us, &e, ks));                                                                           \
      std::snprintf(name, sizeof name, "item U=%d/%d", U, ks);                                                 \
      report(name, us, e);
      ITEM(2) ITEM(4)
#undef ITEM
    }
  int herr = 0;
  CK(cudaMemcpy(&herr, err, 4, cudaMemcpyDeviceToHost));
  if (herr) std::printf("gemv_bw: %d warps timed out on a stage's barrier\n", herr);
  return herr ? 1 : 0;
}
