// tools/warp_bench.cu -- what one warp's memory-bound work costs outside the worker (GPU machine, ~10 s).
//
//   nvcc -std=c++17 -arch=sm_90 -O3 -lineinfo -I . tools/warp_bench.cu -o /tmp/warp_bench && /tmp/warp_bench
//   (WB_ONLY=<kind> runs one case: ncu --set full --import-source yes -k bench ... for its SASS hot spots)
//
// One warp of block 0 runs the worker's own device functions (device_src/: ew_builtin, reduce_op, fused_rows through
// the interpreter) on one descriptor, `reps` times in a row (each rep reads what the previous one wrote: L2-warm
// data, as a decode level reads its producer's output), timed by %clock64 and %globaltimer around each call.
// Next to them, hand-written loops over the same bytes set the floor: one 16-byte load per lane in flight, and
// four. Optional poller blocks (one per other SM, thread 0 spinning on one word with ld.acquire.gpu or volatile
// loads, as the worker's idle blocks do) show whether the walk's pollers slow the working warp.
// Prints one line per case: median ns per call and cycles per call. WB_COLD=1 adds a "COLDDATA" line per case: each
// call on data of its own, in L2 and not in L1 (its first call alone also runs cold code): cold code versus cold data.
// WB_BLOCKS=1 adds "mm level" lines: every warp of G blocks runs one mma item (16 columns x K 256, fp16, M = 1) at
// once, as a decode matmul level does on its home blocks (G = 4: Llama-small's q / k / v, 8 items per SM) or on the
// whole grid (G = SMs: an LM head), with the weights in L2 (read by a launch before) or evicted to HBM (a 256-MB
// memset between) or in L2 with every TLB level cold (one word of each 64-KB page of 8 GB read between): per-warp
// item time median / max, the item called directly (U 2, U 4) or through exec_subop. Thirty-first session (H200):
// direct 2.4-3.5 us on 4 blocks, 3.2-5.0 on every SM, exec_subop 4.2-6.7 -- the worker's dispatch and tile ~9 us
// (traced, one flush, weights in L2).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#include "device_src/worker.cu"  // the worker's device functions (and its kernel, unused here)

using namespace gpuos;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ u64 gtimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

enum Kind { kRaw1 = 0, kRaw4, kEwAdd, kEwCast, kEwStrided, kMean, kFusedCopy, kInterp16, kMmNcolItem, kMmMmaItem,
            kRowLn4, kRowLn8, kMmMmaDispatch, kKinds };
// The matmul items (n = 4096 only): one ncol1 item (64 columns x 64 rows of K, fp16, M = 1: a K slice of
// GPT-2-small's weights) and one mma item (16 columns x K = 256, fp16, M = 1: a tile of Llama-small's LM head),
// both writing their outputs directly (no K split). kMmMmaDispatch: the same mma item as the worker runs it,
// through exec_subop (fetch_refs on cached TensorRefs, the op switch, the noinline matmul_op, mm_args): its gap to
// kMmMmaItem is the dispatch (a traced worker's matmul levels start their first item >= 2 us after the level,
// other kinds 0.3: twenty-sixth session).
constexpr i64 kBenchMmK = 256, kBenchMmN = 1024;

// The floor: out[i] = a[i] + b[i] over n fp32 with 16-byte loads, `inflight` vectors per lane per iteration.
template <int U>
__device__ __noinline__ void raw_add(const float* a, const float* b, float* o, u32 n, u32 lane) {
  const u32 nv = n / 4;
  for (u32 v0 = lane; v0 < nv; v0 += 32 * U) {
    float4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (v0 + 32 * u < nv) x[u] = ((const float4*)a)[v0 + 32 * u], y[u] = ((const float4*)b)[v0 + 32 * u];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (v0 + 32 * u < nv)
        ((float4*)o)[v0 + 32 * u] = make_float4(x[u].x + y[u].x, x[u].y + y[u].y, x[u].z + y[u].z, x[u].w + y[u].w);
  }
}

// A LayerNorm row as tier 2 generates it (csrc/inject/specialize.cpp): inputs x, w, b; two row reductions (mean,
// mean of squares of x - mean); out = (x - mean) * rsqrt(var + eps) * w + b. Rows of 256 fp16 (n = 4096 only).
struct LnF {
  static constexpr u32 kInputs = 3, kRows = 2;
  static __device__ __forceinline__ void row_info(u32* ops, float* scales) {
    ops[0] = kOp_sum, ops[1] = kOp_sum, scales[0] = scales[1] = 1.0f / 256.0f;
  }
  static __device__ __forceinline__ float eval(const float* x, const float* red, u32 stop) {
    if (stop == 0u) return x[0];
    const float d = x[0] - red[0];
    if (stop == 1u) return d * d;
    return d * rsqrtf(red[1] + 1e-5f) * x[1] + x[2];
  }
};
template <u32 V>
__device__ __noinline__ void ln_row(const SubOp& d, const FusedArgs& fa, u32 lane) {
  u32 rop[kRowMaxRed];
  float rsc[kRowMaxRed];
  LnF::row_info(rop, rsc);
  fused_rows<V, 3>(d, fa, 3, 2, rop, rsc, lane, [](float (*r)[V], float* val, const float* red, u32 stop) {
#pragma unroll
    for (u32 v = 0; v < V; ++v) {
      const float x[3] = {r[0][v], r[1][v], r[2][v]};
      val[v] = LnF::eval(x, red, stop);
    }
  });
}

// cold != 0: rep r runs on data shifted by r x cold bytes (big: r x kBigStride), written by cudaMemset before the
// launch and never read by this SM: every rep's data is in L2, not L1; only rep 0 also runs its code (and stack)
// for the first time. The gap between rep 0 and the median of the rest is the cost of cold code and stack.
constexpr u64 kBigStride = (u64)kBenchMmK * kBenchMmN * 2;
__device__ __forceinline__ u64 shifted(u64 p, u64 big, u64 big_end, u64 off, u64 off_big) {
  return p == 0 ? 0 : (p >= big && p < big_end) ? p + off_big : p + off;
}
// The bench's matmul arguments: out (1 x N) = a (1 x K) @ b, K = kBenchMmK, fp16, no bias; b is the transposed
// weight (N x K row-major: the mma item's layout; the ncol item sets K x N strides over it).
__device__ __forceinline__ MmArgs bench_mm_args(const char* a, const char* b, char* out, i64 N) {
  MmArgs g{};
  g.a = a, g.b = b, g.out = out, g.bias = nullptr;
  g.M = 1, g.K = kBenchMmK, g.N = N, g.dta = g.dtb = g.dto = g.dtc = kF16, g.alpha = 1.0f;
  g.as0 = kBenchMmK, g.as1 = 1, g.bs0 = 1, g.bs1 = kBenchMmK, g.os0 = N, g.os1 = 1;
  return g;
}

__global__ void bench(int kind, SubOp dsrc, const TensorRef* grefs, const Program* gprog, int reps, u64* ns,
                      u64* cyc, u32* stop, int pollmode, u64 cold, u64 big, u64 big_end) {
  if (blockIdx.x != 0) {
    if (threadIdx.x == 0 && pollmode) {
      for (;;) {
        u32 v;
        if (pollmode == 1) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(stop) : "memory");
        else v = *(volatile u32*)stop;
        if (v) break;
      }
    }
    return;
  }
  if (threadIdx.x >= 32) return;
  const u32 lane = threadIdx.x;
  __shared__ SubOp sd;
  __shared__ __align__(16) TensorRef refs[4];
  __shared__ __align__(16) Program sp;
  __shared__ u64 cached[4];
  __shared__ FinishNote note;
  for (u32 w = lane; w < sizeof(SubOp) / 4; w += 32) ((u32*)&sd)[w] = ((const u32*)&dsrc)[w];
  for (u32 w = lane; w < sizeof(refs) / 4; w += 32) ((u32*)refs)[w] = ((const u32*)grefs)[w];
  for (u32 w = lane; w < sizeof(Program) / 4; w += 32) ((u32*)&sp)[w] = ((const u32*)gprog)[w];
  if (lane == 0) {  // the worker's per-warp state after prefetch_refs: the TensorRefs cached, an empty note
    for (int k = 0; k < 4; ++k) cached[k] = k == 0 ? dsrc.out : dsrc.in[k - 1];
    note = FinishNote{};
    note.ck = 1;
  }
  WorkerArgs wa{};
  wa.capacity = 1, wa.progs = (u64)gprog;
  __syncwarp();
  for (int r = 0; r < reps; ++r) {
    if (cold != 0 && lane == 0) {  // this rep's data (outside the timed region)
      const u64 off = (u64)r * cold, ob = (u64)r * kBigStride;
      if (kind != kMmMmaDispatch) {  // (the dispatch case's descriptor points at TensorRefs: only those move)
        sd.out = shifted(dsrc.out, big, big_end, off, ob);
        for (int k = 0; k < 3; ++k) sd.in[k] = shifted(dsrc.in[k], big, big_end, off, ob);
      }
      if (kind == kFusedCopy || kind == kInterp16 || kind == kRowLn4 || kind == kRowLn8) {
        FusedArgs& fa = *(FusedArgs*)&refs[0];
        const FusedArgs& g = *(const FusedArgs*)&grefs[0];
        for (u32 k = 0; k < kFusedMaxOperands; ++k) fa.opnd[k].ptr = shifted(g.opnd[k].ptr, big, big_end, off, ob);
      } else {
        for (int k = 0; k < 4; ++k) refs[k].ptr = shifted(grefs[k].ptr, big, big_end, off, ob);
      }
    }
    __syncwarp();
    const u64 t0 = gtimer();
    const long long c0 = clock64();
    switch (kind) {
      case kRaw1: raw_add<1>((const float*)sd.in[0], (const float*)sd.in[1], (float*)sd.out, sd.n, lane); break;
      case kRaw4: raw_add<4>((const float*)sd.in[0], (const float*)sd.in[1], (float*)sd.out, sd.n, lane); break;
      case kEwAdd: case kEwStrided: ew_builtin<AddF, 2>(sd, refs, lane); break;
      case kEwCast: ew_op<CopyF, 1>(sd, refs, lane); break;
      case kMean: reduce_op<MeanR>(sd, refs, lane); break;
      case kFusedCopy:
      case kInterp16: {  // a copy through fused_rows' loads and stores; the 16-add chain through the interpreter
        const FusedArgs& fa = *(const FusedArgs*)&refs[0];
        u32 rop[kRowMaxRed];
        float rsc[kRowMaxRed];
        const Program* pp = kind == kInterp16 ? &sp : nullptr;
        fused_rows<4, kProgMaxRegs>(sd, fa, sp.ninputs, 0, rop, rsc, lane,
                                    [pp](float (*rr)[4], float* val, const float* red, u32 stop) {
                                      if (pp) {
                                        run_program_v<4>(*pp, rr, val, red, stop);
                                        return;
                                      }
#pragma unroll
                                      for (u32 v = 0; v < 4; ++v) val[v] = rr[0][v];
                                    });
        break;
      }
      case kRowLn4: ln_row<4>(sd, *(const FusedArgs*)&refs[0], lane); break;
      case kRowLn8: ln_row<8>(sd, *(const FusedArgs*)&refs[0], lane); break;
      case kMmMmaDispatch: exec_subop(sd, refs, cached, lane, gprog, 0, 0, wa, &note); break;
      case kMmNcolItem: case kMmMmaItem: {
        MmArgs g = bench_mm_args((const char*)sd.in[0], (const char*)sd.in[1], (char*)sd.out, kBenchMmN);
        if (kind == kMmNcolItem) {  // b: K x N row-major
          g.bs0 = kBenchMmN, g.bs1 = 1;
          mm_ncol1<false>(g, 0, 0, 64, nullptr, false, lane, true);
        } else {  // b: the transposed weight (N x K row-major)
          mm_mma<false, false, 2>(g, 0, 0, kBenchMmK, nullptr, false, lane);
        }
        break;
      }
      default: break;
    }
    __syncwarp();
    __threadfence();
    const long long c1 = clock64();
    const u64 t1 = gtimer();
    if (lane == 0) ns[r] = t1 - t0, cyc[r] = (u64)(c1 - c0);
  }
  if (lane == 0) atomicExch(stop, 1u);
}

// WB_BLOCKS: warp w of block b computes out[16 t .. 16 t + 15] = a @ w_t for tile t = 8 b + w of an N x K weight
// (N = 16 x 8 x blocks, K = kBenchMmK, row-major: the transposed layout of a linear), timed around its item alone.
// U: 64-k chunks per round of loads -- the worker's 2 (two dependent rounds at K 256), or 4 (one round; it spilled
// in the worker at 128 registers).
template <u32 U>
__global__ void mm_level(const char* a, const char* w, char* out, i64 N, u64* ns) {
  const u32 lane = threadIdx.x & 31u, tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const MmArgs g = bench_mm_args(a, w, out, N);
  __syncthreads();
  const u64 t0 = gtimer();
  mm_mma<false, false, U>(g, (i64)tile * kMmMmaCols, 0, kBenchMmK, nullptr, false, lane);
  __syncwarp();
  const u64 t1 = gtimer();
  if (lane == 0) ns[tile] = t1 - t0;
}

// The same item as the worker runs it -- exec_subop -> matmul_op -> mm_args -> mm_mma, its TensorRefs cached in
// shared memory as after the worker's prefetch_refs -- on every warp at once (tile = the warp's place in the grid).
__global__ void mm_level_dispatch(SubOp dsrc, const TensorRef* grefs, const Program* gprog, u64* ns) {
  constexpr u32 kWarps = 8;
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x / 32, tile = blockIdx.x * kWarps + warp;
  __shared__ SubOp sd[kWarps];
  __shared__ __align__(16) TensorRef refs[kWarps][4];
  __shared__ u64 cached[kWarps][4];
  __shared__ FinishNote note[kWarps];
  if (lane == 0 && warp < kWarps) {
    sd[warp] = dsrc;
    sd[warp].base = tile;
    for (int k = 0; k < 4; ++k) refs[warp][k] = grefs[k], cached[warp][k] = k == 0 ? dsrc.out : dsrc.in[k - 1];
    note[warp] = FinishNote{};
    note[warp].ck = 1;
  }
  WorkerArgs wa{};
  wa.capacity = 1, wa.progs = (u64)gprog;
  __syncthreads();
  if (warp >= kWarps) return;
  const u64 t0 = gtimer();
  exec_subop(sd[warp], refs[warp], cached[warp], lane, gprog, 0, 0, wa, &note[warp]);
  __syncwarp();
  const u64 t1 = gtimer();
  if (lane == 0) ns[tile] = t1 - t0;
}

// Touches one word in each 64-KB page of `bytes` (every level of the GPU's TLBs then holds other pages than the
// weights' while the L2 cache keeps them: 4 MB of sectors against a 50-MB cache).
__global__ void touch_pages(const char* p, u64 bytes, u32* sink) {
  u32 acc = 0;
  for (u64 o = ((u64)blockIdx.x * blockDim.x + threadIdx.x) << 16; o < bytes; o += (u64)gridDim.x * blockDim.x << 16)
    acc += *(const volatile u32*)(p + o);
  if (acc == 0x12345678u) *sink = acc;
}

// The descriptor of one mma item as the worker receives it: out (1 x N) = a (1 x K) @ w (K x N view of its N x K
// rows), fp16, unsplit, one tile per item (d.base: the tile), no bias; its TensorRefs in refs, the descriptor pointing
// at grefs (where the caller copies them).
static void bench_mm_desc(SubOp& d, TensorRef (&refs)[4], const TensorRef* grefs, const void* out, const void* a,
                          const void* w, i64 N) {
  d.op = kOp_mm, d.flags = kFlagStrided | (kFlagConst0 << 2), d.n = 1, d.base = 0;
  d.scalar[0] = 1.0f, d.scalar[1] = 0.0f;  // alpha 1, no prologue
  d.dtype = kF16 | (kF16 << 8) | (kF16 << 16) | (kF16 << 24);
  d.reserved = kMmMma | (1u << 8);  // tensor cores, unsplit, one tile per item
  d.out = (u64)&grefs[0], d.in[0] = (u64)&grefs[1], d.in[1] = (u64)&grefs[2], d.in[2] = 0;
  for (int k = 0; k < 3; ++k) refs[k].ndim = 2, refs[k].dtype = kF16;
  refs[0].ptr = (u64)out, refs[0].sizes[0] = 1, refs[0].sizes[1] = N, refs[0].strides[0] = N, refs[0].strides[1] = 1;
  refs[1].ptr = (u64)a, refs[1].sizes[0] = 1, refs[1].sizes[1] = kBenchMmK, refs[1].strides[0] = kBenchMmK;
  refs[1].strides[1] = 1;
  refs[2].ptr = (u64)w, refs[2].sizes[0] = kBenchMmK, refs[2].sizes[1] = N, refs[2].strides[0] = 1;
  refs[2].strides[1] = kBenchMmK;
}

// One "mm level" line per grid size, weight residence and path (WB_BLOCKS=1): L2 (read by a launch before), HBM (a
// 256-MB memset between), or L2 with cold TLBs (touch_pages over an 8-GB buffer between); mm_mma called directly
// with U 2 (the worker's) or U 4, or the whole dispatch (mm_level_dispatch, U 2).
static int mm_levels(int sms) {
  const int warps = 8;
  const u64 evict_bytes = 256ull << 20;
  char *a, *w, *out, *evict;
  u64* ns;
  const i64 n_max = (i64)kMmMmaCols * warps * sms;
  CK(cudaMalloc(&a, kBenchMmK * 2));
  CK(cudaMalloc(&w, (u64)n_max * kBenchMmK * 2));
  CK(cudaMalloc(&out, (u64)n_max * 2));
  CK(cudaMalloc(&evict, evict_bytes));
  const u64 tlb_bytes = 8ull << 30;
  char* pages;
  CK(cudaMalloc(&pages, tlb_bytes));
  CK(cudaMemset(pages, 0, tlb_bytes));
  CK(cudaMalloc(&ns, (u64)warps * sms * 8));
  CK(cudaMemset(a, 0, kBenchMmK * 2));
  CK(cudaMemset(w, 0, (u64)n_max * kBenchMmK * 2));
  TensorRef* grefs;
  Program* gprog;
  CK(cudaMalloc(&grefs, 4 * sizeof(TensorRef)));
  CK(cudaMalloc(&gprog, sizeof(Program)));
  CK(cudaMemset(gprog, 0, sizeof(Program)));
  for (int blocks : {4, sms}) {
    const i64 N = (i64)kMmMmaCols * warps * blocks;
    SubOp d{};  // the dispatch's descriptor (mm_level_dispatch sets each warp's tile)
    TensorRef refs[4] = {};
    bench_mm_desc(d, refs, grefs, out, a, w, N);
    CK(cudaMemcpy(grefs, refs, sizeof(refs), cudaMemcpyHostToDevice));
    for (int hbm : {0, 1, 2})
      for (u32 u : {2u, 4u, 0u}) {  // 0: the dispatch
        auto launch = [&] {
          if (u == 0) mm_level_dispatch<<<blocks, 32 * warps>>>(d, grefs, gprog, ns);
          else (u == 2 ? mm_level<2> : mm_level<4>)<<<blocks, 32 * warps>>>(a, w, out, N, ns);
        };
        launch();  // code warm; weights, activations and outputs in L2
        if (hbm == 1) CK(cudaMemset(evict, 1, evict_bytes));   // ... or evicted (the activations too)
        if (hbm == 2) touch_pages<<<sms, 256>>>(pages, tlb_bytes, (u32*)ns);  // ... or their pages' TLB entries
        CK(cudaDeviceSynchronize());
        launch();
        CK(cudaDeviceSynchronize());
        std::vector<u64> hn((size_t)warps * blocks);
        CK(cudaMemcpy(hn.data(), ns, hn.size() * 8, cudaMemcpyDeviceToHost));
        std::sort(hn.begin(), hn.end());
        printf("mm level: %3d blocks x %d warps, one 16 x %lld mma item each (%s), weights in %-13s  item median "
               "%6.2f us, max %6.2f us\n", blocks, warps, (long long)kBenchMmK,
               u == 0 ? "exec_subop" : u == 2 ? "U 2" : "U 4", hbm == 1 ? "HBM" : hbm == 2 ? "L2, TLBs cold" : "L2",
               hn[hn.size() / 2] / 1e3, hn.back() / 1e3);
      }
  }
  cudaFree(a), cudaFree(w), cudaFree(out), cudaFree(evict), cudaFree(pages), cudaFree(ns), cudaFree(grefs);
  cudaFree(gprog);
  return 0;
}

static TensorRef ref1(const void* p, u32 dt, i64 n) {
  TensorRef r{};
  r.ptr = (u64)p, r.ndim = 1, r.dtype = dt, r.sizes[0] = n, r.strides[0] = 1;
  return r;
}

int main() {
  const int reps = getenv("WB_REPS") ? std::max(1, atoi(getenv("WB_REPS"))) : 21;  // WB_REPS: calls per case
  const u32 n_max = 4096;
  float *a, *b, *o, *big;
  u64 *ns, *cyc;
  u32* stop;
  TensorRef* grefs;
  Program* gprog;
  // Room for WB_COLD's shifted reps: each rep's a / b / o n_max floats further on, big kBigStride further.
  const u64 small_bytes = (u64)n_max * 4 * reps, big_bytes = kBigStride * reps;
  CK(cudaMalloc(&a, small_bytes));
  CK(cudaMalloc(&b, small_bytes));
  CK(cudaMalloc(&o, small_bytes));
  CK(cudaMalloc(&big, big_bytes));
  CK(cudaMemset(big, 0, big_bytes));
  CK(cudaMalloc(&ns, reps * 8));
  CK(cudaMalloc(&cyc, reps * 8));
  CK(cudaMalloc(&stop, 4));
  CK(cudaMalloc(&grefs, 4 * sizeof(TensorRef)));
  CK(cudaMalloc(&gprog, sizeof(Program)));
  CK(cudaMemset(a, 0, small_bytes));
  CK(cudaMemset(b, 0, small_bytes));
  CK(cudaMemset(o, 0, small_bytes));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs\n", prop.name, sms);

  Program prog{};
  prog.ninputs = 2, prog.ninstr = 16, prog.out_reg = 0;
  for (u32 i = 0; i < 16; ++i) {
    Instr& I = prog.code[i];
    I.op = kOp_add, I.dst = 0, I.src[0] = 0, I.src[1] = 1, I.src[2] = 0, I.nsrc = 2, I.s0 = 1.0f, I.s1 = 0.0f;
  }
  CK(cudaMemcpy(gprog, &prog, sizeof(Program), cudaMemcpyHostToDevice));

  const char* names[] = {"raw add, 1 vector/lane in flight", "raw add, 4 vectors/lane in flight",
                         "ew_op add (vector path)",
                         "ew_op cast fp16->fp32 (element loop)", "ew_op add, transposed (strided)",
                         "reduce mean of one row", "fused_rows loads + stores (a copy, no interpreter)",
                         "interpreted chain of 16 adds (fused_rows)", "mm ncol1 item 64 cols x 64 K (fp16, M=1)",
                         "mm mma item 16 cols x 256 K (fp16, M=1)", "LayerNorm row of 256 fp16 (tier-2 form, V=4)",
                         "LayerNorm row of 256 fp16 (tier-2 form, V=8)",
                         "mm mma item as kMmMmaItem, through exec_subop"};
  // WB_ONLY=<kind index>: that kind alone, n = 4,096, no pollers (one kernel launch: for ncu -k bench).
  const int only = getenv("WB_ONLY") ? atoi(getenv("WB_ONLY")) : -1;
  // WB_COLD=1: each case also once with cold data (pollmode 3 in the loop below: no pollers, data shifted per rep).
  const bool with_cold = getenv("WB_COLD") && atoi(getenv("WB_COLD")) != 0;
  for (u32 n : {1024u, 4096u}) {
    for (int kind = 0; kind < kKinds; ++kind) {
      if ((kind == kMmNcolItem || kind == kMmMmaItem || kind == kRowLn4 || kind == kRowLn8 || kind == kMmMmaDispatch) &&
          n != 4096)
        continue;
      if (only >= 0 && (kind != only || n != 4096)) continue;
      for (int pollmode : {0, 1, 2, 3}) {
        if (only >= 0 && pollmode != 0) continue;
        if (pollmode == 3 && !with_cold) continue;
        const u64 cold = pollmode == 3 ? (u64)n_max * 4 : 0;
        SubOp d{};
        TensorRef refs[4] = {};
        d.n = n, d.base = 0, d.scalar[0] = 1.0f, d.dtype = kF32 | (kF32 << 8) | (kF32 << 16);
        d.out = (u64)o, d.in[0] = (u64)a, d.in[1] = (u64)b;
        if (kind == kEwAdd || kind == kRaw1 || kind == kRaw4) {
          d.op = kOp_add, d.flags = kFlagVec;
        } else if (kind == kEwCast) {
          d.op = kOp_copy, d.flags = 0, d.dtype = kF32 | (kF16 << 8);
        } else if (kind == kEwStrided) {
          const i64 m = n == 1024 ? 32 : 64;
          d.op = kOp_add, d.flags = kFlagStrided;
          for (int k = 0; k < 3; ++k) {
            refs[k].ptr = (u64)(k == 0 ? o : k == 1 ? a : b), refs[k].ndim = 2, refs[k].dtype = kF32;
            refs[k].sizes[0] = m, refs[k].sizes[1] = m, refs[k].strides[0] = 1, refs[k].strides[1] = m;  // transposed
          }
          refs[0].strides[0] = m, refs[0].strides[1] = 1;
          // The device reads TensorRefs through d.out / d.in pointers only in the worker (fetch_refs); here the
          // harness hands ew_op the shared copies directly.
        } else if (kind == kRowLn4 || kind == kRowLn8) {
          d.op = kOpFused, d.flags = kFlagFused, d.n = 256, d.reserved = 256, d.dtype = kF16;  // one row
          FusedArgs fa{};
          fa.opnd[0] = {(u64)o, 1, 1, 0};
          fa.opnd[1] = {(u64)a, 1, 1, 0};
          fa.opnd[2] = {(u64)b, 1, 1, 0};
          fa.opnd[3] = {(u64)big, 1, 1, 0};
          fa.dtype[0] = fa.dtype[1] = fa.dtype[2] = fa.dtype[3] = kF16;
          fa.ninputs = 3;
          memcpy((void*)refs, (const void*)&fa, sizeof(FusedArgs));
        } else if (kind == kMmNcolItem || kind == kMmMmaItem) {
          d.in[0] = (u64)a, d.in[1] = (u64)big, d.out = (u64)o;  // a: K fp16; big: K x N fp16 (512 KB)
        } else if (kind == kMmMmaDispatch) {  // tile 0 of big's N x K rows
          bench_mm_desc(d, refs, grefs, o, a, big, kBenchMmN);
        } else if (kind == kMean) {
          d.op = kOp_mean, d.flags = kFlagStrided, d.n = 1, d.dtype = kF32 | (kF32 << 8);
          refs[0] = ref1(o, kF32, 1);
          refs[1] = ref1(a, kF32, n);
          refs[1].ndim = 2, refs[1].sizes[0] = 1, refs[1].sizes[1] = n, refs[1].strides[0] = n, refs[1].strides[1] = 1;
          refs[0].ndim = 1;
        } else if (kind == kFusedCopy || kind == kInterp16) {
          d.op = kOpFused, d.flags = kFlagFused, d.reserved = n;  // one row of n, no reduction: a chain
          FusedArgs fa{};
          fa.opnd[0] = {(u64)o, 1, 1, 0};
          fa.opnd[1] = {(u64)a, 1, 1, 0};
          fa.opnd[2] = {(u64)b, 1, 1, 0};
          fa.dtype[0] = fa.dtype[1] = fa.dtype[2] = kF32;
          fa.ninputs = 2;
          memcpy((void*)refs, (const void*)&fa, sizeof(FusedArgs));
        }
        CK(cudaMemcpy(grefs, refs, sizeof(refs), cudaMemcpyHostToDevice));
        CK(cudaMemset(stop, 0, 4));
        // Every case starts with its data in L2 only (a kernel launch does not clear L1: rewrite it from the host).
        CK(cudaMemset(o, 0, small_bytes));
        bench<<<pollmode == 1 || pollmode == 2 ? sms : 1, 256>>>(kind, d, grefs, gprog, reps, ns, cyc, stop,
                                                                 pollmode == 3 ? 0 : pollmode, cold, (u64)big,
                                                                 (u64)big + big_bytes);
        CK(cudaDeviceSynchronize());
        std::vector<u64> hn(reps), hc(reps);
        CK(cudaMemcpy(hn.data(), ns, reps * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hc.data(), cyc, reps * 8, cudaMemcpyDeviceToHost));
        const u64 first = hn[0];
        std::sort(hn.begin() + 1, hn.end());
        std::sort(hc.begin() + 1, hc.end());
        printf("n %5u  %-44s pollers %-8s  median %8.2f us  (%7llu cycles; first call %7.2f us)\n", n, names[kind],
               pollmode == 0 ? "none" : pollmode == 1 ? "acquire" : pollmode == 2 ? "volatile" : "COLDDATA", hn[reps / 2] / 1e3,
               (unsigned long long)hc[reps / 2], first / 1e3);
      }
    }
  }
  if (getenv("WB_BLOCKS") && atoi(getenv("WB_BLOCKS")) != 0) return mm_levels(sms);
  return 0;
}
