// tools/tpc_probe.cu -- does a block's memory-bound work slow down when the other SM of its TPC works too?
// (GPU machine, ~5 s; DEVELOPING *Next* 0).
//
//   nvcc -std=c++17 -arch=sm_90 -O3 tools/tpc_probe.cu -o /tmp/tpc_probe && /tmp/tpc_probe
//
// The worker's home blocks are consecutive block indices, and a 132-block grid puts blocks 2k and 2k + 1 on the
// two SMs of one TPC (EXPERIMENTS 0, twenty-fifth session: blocks 8+ on SMs 0, 1, 16, 17, ...) while a 33-block
// grid puts them on different TPCs (0, 16, 32, ...). In a traced decode step the same items ran 1.3-1.9x faster on
// the 33-block grid (twenty-eighth / twenty-ninth sessions). Here every warp of each "active" block runs an
// item-like loop -- `rounds` dependent rounds of four 16-byte loads per lane from an L2-resident buffer (as a decode
// level reads weights and activations that an earlier step left in L2), then an FMA chain -- timed with
// %globaltimer; the other blocks either exit at once or spin on one word with ld.acquire.gpu until the active ones
// are done (as the worker's idle blocks poll). Prints, per case, the active blocks' SMs and the median / max warp
// time in us over `reps` launches. First run (H200, twenty-ninth session): 14.98-15.17 us per warp in every case
// (alone, one TPC, two TPCs, eight SMs on four or eight TPCs, the 33-block grid; idle blocks exiting or spinning),
// 24.54 / 24.64 with the FMA chain on one TPC / two: neither the pairing nor the pollers slow such work.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <string>

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                      \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                             \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// active: bitmask over block indices (up to kMaxBlocks); out[b * 8 + warp] = ns; sm[b] = %smid. zero: 0 at run time
// (the next round's address depends on the loads' values through it, so rounds are dependent).
__global__ void probe(const uint4* buf, unsigned words, const unsigned* active, unsigned rounds, unsigned fmas,
                      unsigned spin, unsigned* left, unsigned zero, unsigned* out, unsigned* sm, float* sink) {
  const unsigned b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool act = (active[b / 32] >> (b % 32)) & 1u;
  if (threadIdx.x == 0) sm[b] = smid();
  if (!act) {
    if (spin && threadIdx.x == 0)
      for (;;) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(left) : "memory");
        if (v == 0) break;
      }
    return;
  }
  __syncthreads();
  const unsigned long long t0 = gtimer();
  unsigned idx = (b * 8 + warp) * 4096u + lane;
  float acc = 0.0f;
  for (unsigned r = 0; r < rounds; ++r) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = buf[(idx + k * 32) % words];
    unsigned x = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) x ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w, acc += __uint_as_float(v[k].x & 0x3f800000u);
    idx += 128 + (x & zero);
  }
  float y = acc;
  for (unsigned f = 0; f < fmas; ++f) y = fmaf(y, 0.999f, 0.5f);
  const unsigned long long t1 = gtimer();
  if (lane == 0) out[b * 8 + warp] = (unsigned)(t1 - t0);
  if (y == 12345.0f) sink[0] = y;
  __syncthreads();
  if (threadIdx.x == 0) atomicSub(left, 1u);
}

// The worker's shared memory (~43 KB static): the block placement of EXPERIMENTS 0 was measured with it.
constexpr size_t kSmem = 43 * 1024;
constexpr unsigned kMaxBlocks = 160;  // grids up to this many blocks (a multiple of 32: the mask's words)

int main(int argc, char** argv) {
  const unsigned reps = argc > 1 ? atoi(argv[1]) : 20, rounds = argc > 2 ? atoi(argv[2]) : 64;
  const unsigned words = (4u << 20) / 16;  // 4 MB: L2-resident
  uint4* buf;
  unsigned *active_d, *left, *out, *sm;
  float* sink;
  CK(cudaMalloc(&buf, words * 16));
  CK(cudaMemset(buf, 1, words * 16));
  CK(cudaMalloc(&active_d, kMaxBlocks / 32 * 4));
  CK(cudaMalloc(&left, 4));
  CK(cudaMalloc(&out, kMaxBlocks * 8 * 4));
  CK(cudaMalloc(&sm, kMaxBlocks * 4));
  CK(cudaMalloc(&sink, 4));
  int nsm = 0;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  if (nsm > (int)kMaxBlocks) {  // the active mask, the per-warp times and the SM ids are sized for kMaxBlocks
    printf("tpc_probe: %d SMs, more than the %u blocks it is sized for\n", nsm, kMaxBlocks);
    return 1;
  }
  struct Case { const char* name; unsigned grid; std::vector<unsigned> blocks; unsigned fmas; };
  auto range = [](unsigned a, unsigned n, unsigned step) {
    std::vector<unsigned> v;
    for (unsigned i = 0; i < n; ++i) v.push_back(a + i * step);
    return v;
  };
  const unsigned big = (unsigned)nsm, small = (unsigned)nsm / 4;
  std::vector<Case> cases = {
      {"alone (block 8)", big, {8}, 0},
      {"pair 8,9 (one TPC on the big grid)", big, {8, 9}, 0},
      {"pair 8,10", big, {8, 10}, 0},
      {"8 blocks 8..15", big, range(8, 8, 1), 0},
      {"8 blocks 8,10,..,22", big, range(8, 8, 2), 0},
      {"pair 8,9 on the small grid", small, {8, 9}, 0},
      {"8 blocks 8..15 on the small grid", small, range(8, 8, 1), 0},
      {"pair 8,9 + fma chain", big, {8, 9}, 4096},
      {"pair 8,10 + fma chain", big, {8, 10}, 4096},
  };
  printf("tpc_probe: %d SMs, %u rounds of 4 x 16 B loads per lane (L2-resident), %u launches per case\n", nsm,
         rounds, reps);
  for (unsigned spin = 0; spin < 2; ++spin)
    for (const Case& c : cases) {
      unsigned mask[kMaxBlocks / 32] = {};
      for (unsigned b : c.blocks) mask[b / 32] |= 1u << (b % 32);
      CK(cudaMemcpy(active_d, mask, sizeof mask, cudaMemcpyHostToDevice));
      std::vector<unsigned> ns;
      std::vector<unsigned> sms(kMaxBlocks);
      for (unsigned r = 0; r < reps + 1; ++r) {
        const unsigned n = (unsigned)c.blocks.size();
        CK(cudaMemcpy(left, &n, 4, cudaMemcpyHostToDevice));
        probe<<<c.grid, 256, kSmem>>>(buf, words, active_d, rounds, c.fmas, spin, left, 0u, out, sm, sink);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<unsigned> o(kMaxBlocks * 8);
        CK(cudaMemcpy(o.data(), out, o.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(sms.data(), sm, kMaxBlocks * 4, cudaMemcpyDeviceToHost));
        if (r == 0) continue;  // the first launch: cold code and data
        for (unsigned b : c.blocks)
          for (unsigned w = 0; w < 8; ++w) ns.push_back(o[b * 8 + w]);
      }
      std::sort(ns.begin(), ns.end());
      std::string where;
      for (unsigned b : c.blocks) where += (where.empty() ? "" : ",") + std::to_string(sms[b]);
      printf("%-36s grid %3u idle %-5s SMs %-30s warp us median %7.2f max %7.2f\n", c.name, c.grid,
             spin ? "spin" : "exit", where.c_str(), ns[ns.size() / 2] / 1e3, ns.back() / 1e3);
    }
  return 0;
}
