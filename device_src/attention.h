// device_src/attention.h -- no host-only code, no system #includes. Included by worker.cu after matmul.h.
// Decode attention (issue #16): out = softmax(scale * q @ k^T + mask) @ v per (batch, query head), fp16 / bf16
// q, k, v with fp32 math, query length <= kAttnMaxQuery, GQA / MQA (query head h reads KV head h / (Hq / Hkv)),
// top-left causal (torch's is_causal: query i sees kv positions j <= i) and an additive float or boolean mask
// broadcast through its strides. Flash-decoding: the host cuts the work into items (Runtime::record_attention):
//   item = ((b * Hkv + kv head) * nsplit + KV split) * row groups + row group
// A warp runs an item: up to kAttnRowsPerItem of the G x Lq query rows of one KV head (G = Hq / Hkv; row r is query
// head kh * G + r / Lq, position r % Lq) over one slice of the KV length. Lane layout: D / 8 lanes hold one kv row
// (16 bytes = 8 values each), so a warp loads 32 / (D / 8) kv rows of K and of V per 16-byte load, T such steps
// in flight (kAttnStepsInFlight); each group of lanes keeps its own online softmax (max and sum in the log2 domain: q is pre-scaled by
// scale * log2(e), mask values by log2(e), exp2f), and the groups are merged by shuffles at the end.
// nsplit > 1: each item writes its partial (max, sum, D accumulators per row, fp32) into the attention scratch of
// its ring slot; the last item of a tile (counter word in the first item's slot) combines them, writes the output
// and resets the counter (a ring slot is reused only after its batch is done).
#pragma once

namespace gpuos {

constexpr u32 R = kAttnRowsPerItem;  // query rows an item holds in registers
// Steps of the kv loop whose loads are in flight together (attn_item's T): each lane issues T 16-byte loads of K
// and T of V before the first use (a warp: T * 32 / (D / 8) kv rows of each). 2 (the first version) kept few
// bytes in flight per warp (~120 GB/s on an H100 at KV 4096). The masked variant keeps 2: with 3 it spilled.
constexpr u32 kAttnStepsInFlight = 3, kAttnStepsInFlightMasked = 2;
// Splits of a tile whose partials one combining lane loads at once (attn_combine).
constexpr u32 kAttnCombineBatch = 16;
static_assert(kAttnMaxSplit % kAttnCombineBatch == 0, "whole batches of splits");
constexpr float kAttnLog2e = 1.4426950408889634f, kAttnLn2 = 0.6931471805599453f;

// Per-slot partial layout (floats): [0, 4) head (counter), [4, 8) row maxima, [8, 12) row sums, [12, ...) rows x D.
constexpr u32 kAttnPartM = kAttnScratchHead, kAttnPartL = kAttnScratchHead + 4, kAttnPartAcc = kAttnScratchHead + 8;
static_assert(R <= 4 && kAttnPartAcc + R * kAttnMaxHeadDim <= kAttnScratchPerSlot,
              "attention partials fit one ring slot's scratch");

__device__ __forceinline__ float attn_ninf() { return -__int_as_float(0x7f800000); }

// Output row (b, hq, i): values v[0 .. n) for dims d0 .. d0 + n - 1, already divided by the sum; lse when asked.
__device__ __forceinline__ void attn_store(const AttnArgs& a, u32 dto, u32 b, u32 hq, u32 i, u32 d0, const float* v,
                                           u32 n, float m, float l, bool lse_lane) {
  const i64 base = (i64)b * a.os[0] + (i64)hq * a.os[1] + (i64)i * a.os[2];
  for (u32 e = 0; e < n; ++e) store_f32((void*)a.out, dto, base + (i64)(d0 + e) * a.os[3], v[e]);
  if (lse_lane && (a.mode & kAttnLse))
    ((float*)a.lse)[(i64)b * a.ls[0] + (i64)hq * a.ls[1] + (i64)i * a.ls[2]] =
        l > 0.0f ? (m + __log2f(l)) * kAttnLn2 : attn_ninf();
}

// One item's rows [r0, r0 + nr) over kv positions [j0, j1). part: this item's scratch (nullptr: write the output).
template <bool MASK, u32 T>
__device__ __noinline__ void attn_item(const AttnArgs& a, const TensorRef* refs, u32 dt, u32 dto, float qscale, u32 b,
                                       u32 kh, u32 r0, u32 nr, i64 j0, i64 j1, float* part, u32 lane) {
  const TensorRef &rq = refs[1], &rk = refs[2], &rv = refs[3];
  const u32 L = a.D >> 3, lsh = (u32)__ffs((int)L) - 1, sub = lane >> lsh, c = lane & (L - 1), RP = 32u >> lsh;
  const u32 G = a.Hq / a.Hkv;
  const bool causal = (a.mode & kAttnCausal) != 0;
  const bool mbool = (a.mode & kAttnMaskBool) != 0;
  const u32 mdt = a.mode >> kAttnMaskDtypeShift;
  float q[R][8], acc[R][8], m[R], l[R];
  i64 moff[MASK ? R : 1];
  int lim[R];  // last kv position row r sees (kv lengths are below 2^31)
  int jend = causal ? 0 : (int)j1;
#pragma unroll
  for (u32 r = 0; r < R; ++r) {
    m[r] = attn_ninf();
    l[r] = 0.0f;
    if (MASK) moff[MASK ? r : 0] = 0;
    lim[r] = -1;
#pragma unroll
    for (u32 e = 0; e < 8; ++e) q[r][e] = 0.0f, acc[r][e] = 0.0f;
    if (r < nr) {
      const u32 row = r0 + r, g = row / a.Lq, i = row - g * a.Lq, hq = kh * G + g;
      const i64 qo = (i64)b * rq.strides[0] + (i64)hq * rq.strides[1] + (i64)i * rq.strides[2] +
                     (i64)(c * 8) * rq.strides[3];
#pragma unroll
      for (u32 e = 0; e < 8; ++e) q[r][e] = load_f32((const void*)rq.ptr, dt, qo + (i64)e * rq.strides[3]) * qscale;
      lim[r] = causal ? (int)i : (int)j1 - 1;
      if (causal && (int)i + 1 > jend) jend = (int)i + 1 < (int)j1 ? (int)i + 1 : (int)j1;
      if (MASK) moff[MASK ? r : 0] = (i64)b * a.ms[0] + (i64)hq * a.ms[1] + (i64)i * a.ms[2];
    }
  }
  // The mask bounds the loop (issue #17): a kv position no row of the item sees (a float mask's -inf, a boolean
  // mask's false; causal limits included) weighs exactly 0, so the loop runs from the first position some row sees
  // to the last. A static cache of 4,096 slots at position 100 then reads 101 rows of K and V, not 4,096, and a
  // slice wholly past the position reads none. Scanned when the slice is longer than one step of the loop (the
  // scan is one round trip of mask loads, 4 positions per lane in flight).
  int jlo = (int)j0;
  if (MASK && jend - jlo > (int)(T * RP)) {
    int lo = jend, hi = jlo - 1;
    for (int jb = jlo + (int)lane; jb < jend; jb += 32 * 4) {
      float mv[4][R];
#pragma unroll
      for (u32 u = 0; u < 4; ++u)
#pragma unroll
        for (u32 r = 0; r < R; ++r) {
          const int j = jb + 32 * (int)u;
          const i64 mo = moff[MASK ? r : 0] + (i64)j * a.ms[3];
          mv[u][r] = r >= nr || j >= jend || j > lim[r] ? attn_ninf()
                     : mbool ? (((const u8*)a.mask)[mo] ? 0.0f : attn_ninf())
                             : load_f32((const void*)a.mask, mdt, mo);
        }
#pragma unroll
      for (u32 u = 0; u < 4; ++u) {
        bool see = false;
#pragma unroll
        for (u32 r = 0; r < R; ++r) see = see || mv[u][r] != attn_ninf();
        const int j = jb + 32 * (int)u;
        if (see) lo = j < lo ? j : lo, hi = j > hi ? j : hi;
      }
    }
    for (u32 o = 16; o > 0; o >>= 1) {
      const int lo2 = __shfl_xor_sync(0xffffffffu, lo, o), hi2 = __shfl_xor_sync(0xffffffffu, hi, o);
      lo = lo2 < lo ? lo2 : lo, hi = hi2 > hi ? hi2 : hi;
    }
    jlo = lo, jend = hi + 1;  // nothing seen: jend <= jlo, no step
  }
  const char* kp = (const char*)rk.ptr + ((i64)b * rk.strides[0] + (i64)kh * rk.strides[1] + c * 8) * 2;
  const char* vp = (const char*)rv.ptr + ((i64)b * rv.strides[0] + (i64)kh * rv.strides[1] + c * 8) * 2;
  const i64 ks = rk.strides[2] * 2, vs = rv.strides[2] * 2;  // bytes per kv row
  const float ninf = attn_ninf();
  const int step = (int)(T * RP);
  // Software pipeline: a step's K registers are refilled with the next step's rows as soon as its logits are
  // computed, its V registers as soon as they are accumulated, so the next step's loads are in flight while this
  // step's softmax and accumulation run (no registers beyond the T + T loads of one step).
  uint4 kq[T], vq[T];
#pragma unroll
  for (u32 t = 0; t < T; ++t) {
    const int j = jlo + (int)(t * RP + sub);
    kq[t] = j < jend ? *(const uint4*)(kp + j * ks) : make_uint4(0u, 0u, 0u, 0u);
    vq[t] = j < jend ? *(const uint4*)(vp + j * vs) : make_uint4(0u, 0u, 0u, 0u);
  }
  for (int jb = jlo; jb < jend; jb += step) {  // warp-uniform trip count: the shuffles need every lane
    float s[T][R];  // logits, then weights
#pragma unroll
    for (u32 t = 0; t < T; ++t) {
      float kf[8];
      Vec16::unpack(kq[t], kf, dt);
#pragma unroll
      for (u32 r = 0; r < R; ++r) {  // rows r >= nr hold q = 0: their logits are dropped below
        float x = 0.0f;
#pragma unroll
        for (u32 e = 0; e < 8; ++e) x = fmaf(q[r][e], kf[e], x);
        s[t][r] = x;
      }
    }
#pragma unroll
    for (u32 t = 0; t < T; ++t) {  // the next step's K rows
      const int j = jb + step + (int)(t * RP + sub);
      kq[t] = j < jend ? *(const uint4*)(kp + j * ks) : make_uint4(0u, 0u, 0u, 0u);
    }
    // The D / 8 lanes of a kv row sum their partial dot products: the T x R sums go through each shuffle round
    // together (independent shuffles in flight instead of one dependent chain per logit).
    for (u32 o = L >> 1; o > 0; o >>= 1) {
#pragma unroll
      for (u32 t = 0; t < T; ++t)
#pragma unroll
        for (u32 r = 0; r < R; ++r) s[t][r] += __shfl_xor_sync(0xffffffffu, s[t][r], o);
    }
#pragma unroll
    for (u32 t = 0; t < T; ++t) {
      const int j = jb + (int)(t * RP + sub);
#pragma unroll
      for (u32 r = 0; r < R; ++r) {
        const bool live = r < nr && j < jend && j <= lim[r];
        float x = s[t][r];
        if (MASK && live) {
          const i64 mo = moff[MASK ? r : 0] + (i64)j * a.ms[3];
          x += mbool ? (((const u8*)a.mask)[mo] ? 0.0f : ninf) : load_f32((const void*)a.mask, mdt, mo) * kAttnLog2e;
        }
        s[t][r] = live ? x : ninf;
      }
    }
    float corr[R];
#pragma unroll
    for (u32 r = 0; r < R; ++r) {
      corr[r] = 1.0f;
      if (r >= nr) continue;
      float mn = m[r], sum = 0.0f;
#pragma unroll
      for (u32 t = 0; t < T; ++t) mn = fmaxf(mn, s[t][r]);
      // -inf - -inf would be NaN: a term whose logit is -inf weighs 0 (and nothing is live yet when mn is -inf)
      corr[r] = m[r] == ninf ? 0.0f : exp2f(m[r] - mn);
#pragma unroll
      for (u32 t = 0; t < T; ++t) {
        s[t][r] = s[t][r] == ninf ? 0.0f : exp2f(s[t][r] - mn);
        sum += s[t][r];
      }
      l[r] = fmaf(l[r], corr[r], sum);
      m[r] = mn;
    }
#pragma unroll
    for (u32 t = 0; t < T; ++t) {
      float vf[8];
      Vec16::unpack(vq[t], vf, dt);
#pragma unroll
      for (u32 r = 0; r < R; ++r) {
        if (r >= nr) continue;
#pragma unroll
        for (u32 e = 0; e < 8; ++e) acc[r][e] = fmaf(s[t][r], vf[e], t == 0 ? acc[r][e] * corr[r] : acc[r][e]);
      }
      const int j = jb + step + (int)(t * RP + sub);  // the next step's V rows
      vq[t] = j < jend ? *(const uint4*)(vp + j * vs) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  // Merge the lane groups (each holds other kv rows): afterwards every group holds the item's totals.
  for (u32 o = L; o < 32; o <<= 1) {
#pragma unroll
    for (u32 r = 0; r < R; ++r) {
      if (r >= nr) continue;
      const float mo = __shfl_xor_sync(0xffffffffu, m[r], o), lo = __shfl_xor_sync(0xffffffffu, l[r], o);
      const float mn = fmaxf(m[r], mo);
      const float ca = m[r] == ninf ? 0.0f : exp2f(m[r] - mn), cb = mo == ninf ? 0.0f : exp2f(mo - mn);
      l[r] = l[r] * ca + lo * cb;
      m[r] = mn;
#pragma unroll
      for (u32 e = 0; e < 8; ++e) acc[r][e] = acc[r][e] * ca + __shfl_xor_sync(0xffffffffu, acc[r][e], o) * cb;
    }
  }
  if (sub != 0) return;
#pragma unroll
  for (u32 r = 0; r < R; ++r) {
    if (r >= nr) continue;
    if (part) {
      float* pa = part + kAttnPartAcc + r * a.D + c * 8;
      *(float4*)pa = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      *(float4*)(pa + 4) = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
      if (c == 0) part[kAttnPartM + r] = m[r], part[kAttnPartL + r] = l[r];
      continue;
    }
    const u32 row = r0 + r, g = row / a.Lq, i = row - g * a.Lq;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // a row that sees nothing: 0 (torch's safe softmax)
    float v[8];
#pragma unroll
    for (u32 e = 0; e < 8; ++e) v[e] = acc[r][e] * inv;
    attn_store(a, dto, b, kh * G + g, i, c * 8, v, 8, m[r], l[r], c == 0);
  }
}

// After this item's partial: the tile's last item (the counter in the first slot) combines the nsplit partials of
// slots first, first + step, ... (mod capacity), writes the rows and resets the counter.
// Returns whether this item combined.
__device__ __noinline__ bool attn_combine(const AttnArgs& a, float* attn, u32 first, u32 step, u32 capacity, u32 dto,
                                          u32 b, u32 kh, u32 r0, u32 nr, u32 lane) {
  float* head = attn + (u64)first * kAttnScratchPerSlot;
  fence_acq_rel();  // this item's partials before the counter (release)
  __syncwarp();
  u32 old = 0;
  if (lane == 0) old = atomicAdd((unsigned*)head, 1u);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != a.nsplit - 1) return false;
  fence_acq_rel();  // acquire: every item's partials before they are read
  const u32 G = a.Hq / a.Hkv;
  const float ninf = attn_ninf();
  // Split s's weight and sum are held by lane s % 32 (w[s / 32], nsplit <= kAttnMaxSplit = 64); the D accumulators
  // then go over the splits with several loads in flight (the slots advance by step, wrapping at capacity).
  static_assert(kAttnMaxSplit <= 64, "two splits per lane");
  for (u32 r = 0; r < nr; ++r) {
    float ms[2], ls[2], w[2];
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {
      const u32 s = lane + 32 * h;
      const float* p = attn + (u64)((first + s * step) % capacity) * kAttnScratchPerSlot;
      ms[h] = s < a.nsplit ? __ldcg(p + kAttnPartM + r) : ninf;
      ls[h] = s < a.nsplit ? __ldcg(p + kAttnPartL + r) : 0.0f;
    }
    float mx = fmaxf(ms[0], ms[1]);
    for (u32 o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {
      w[h] = ms[h] == ninf ? 0.0f : exp2f(ms[h] - mx);  // -inf - -inf would be NaN: an empty split weighs 0
      sum = fmaf(w[h], ls[h], sum);
    }
    for (u32 o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const u32 row = r0 + r, g = row / a.Lq, i = row - g * a.Lq;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that sees nothing: 0 (torch's safe softmax)
    for (u32 e0 = 0; e0 < a.D; e0 += 128) {  // warp-uniform: the shuffles below need every lane
      const u32 e = e0 + lane * 4;
      const bool mine = e < a.D;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      // kAttnCombineBatch splits' loads in flight per lane, issued unconditionally: every item of the tile wrote
      // its partial (an empty split: m = -inf, l = 0, zero accumulators; its weight is 0), so no load waits for
      // the shuffle of its weight. One warp still makes ~10 dependent round trips here (maxima, then 2 rows x 4
      // batches at 64 splits): 30-62 us on an H200 (worker_trace.py attn), the next thing to spread over warps.
      for (u32 s0 = 0; s0 < a.nsplit; s0 += kAttnCombineBatch) {
        float4 pv[kAttnCombineBatch];
#pragma unroll
        for (u32 u = 0; u < kAttnCombineBatch; ++u) {
          const u32 s = s0 + u;
          const u32 slot = (first + s * step) % capacity;
          pv[u] = mine && s < a.nsplit
                      ? __ldcg((const float4*)(attn + (u64)slot * kAttnScratchPerSlot + kAttnPartAcc + r * a.D + e))
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (u32 u = 0; u < kAttnCombineBatch; ++u) {
          const u32 s = s0 + u;  // < kAttnMaxSplit = 64: held by lane s % 32 in w[s / 32]
          const float ws = __shfl_sync(0xffffffffu, s < 32 ? w[0] : w[1], s & 31u);
          v[0] = fmaf(ws, pv[u].x, v[0]), v[1] = fmaf(ws, pv[u].y, v[1]), v[2] = fmaf(ws, pv[u].z, v[2]);
          v[3] = fmaf(ws, pv[u].w, v[3]);
        }
      }
#pragma unroll
      for (u32 k = 0; k < 4; ++k) v[k] *= inv;
      if (mine) attn_store(a, dto, b, kh * G + g, i, e, v, 4, mx, sum, e == 0);
    }
  }
  if (lane == 0) atomicExch((unsigned*)head, 0u);
  return true;
}

// refs: [0] the AttnArgs, [1] q, [2] k, [3] v (B x H x L x D TensorRefs). ri: the sub-op's ring index; scratch,
// capacity: WorkerArgs::scratch / capacity (the attention scratch follows the matmul scratch); tb: the trace
// (nullptr: off), where each item records its own and its combine's duration.
__device__ __noinline__ void attention_op(const SubOp& d, const TensorRef* refs, u32 lane, u32 ri, float* scratch,
                                          u32 capacity, TraceBuf* tb) {
  const AttnArgs& a = *(const AttnArgs*)&refs[0];
  const u32 rows = R, G = a.Hq / a.Hkv, nrows = G * a.Lq, nrg = (nrows + rows - 1) / rows;
  // item = ((b * Hkv + kh) * nsplit + s) * nrg + rg: the row groups of one KV slice are neighbours (claimed
  // together, they read the same K / V rows, mostly from cache); a tile's items are nrg ring slots apart.
  const u32 ns = a.nsplit, rg = d.base % nrg, s = (d.base / nrg) % ns, bk = d.base / nrg / ns;
  const u32 kh = bk % a.Hkv, b = bk / a.Hkv;
  const u32 r0 = rg * rows, nr = nrows - r0 < rows ? nrows - r0 : rows;
  const i64 span = ((i64)a.Lk + ns - 1) / ns, j0 = (i64)s * span, j1 = j0 + span < (i64)a.Lk ? j0 + span : (i64)a.Lk;
  float* attn = scratch + (u64)(capacity + kMmMaxSplit) * kMmScratchPerSlot;
  float* part = ns > 1 ? attn + (u64)ri * kAttnScratchPerSlot : nullptr;
  const u32 dto = d.dtype & 0xffu, dt = (d.dtype >> 8) & 0xffu;
  const float qscale = d.scalar[0] * kAttnLog2e;
  const u64 t0 = tb ? globaltimer() : 0;
  if (a.mode & (kAttnMaskFloat | kAttnMaskBool))
    attn_item<true, kAttnStepsInFlightMasked>(a, refs, dt, dto, qscale, b, kh, r0, nr, j0, j1, part, lane);
  else
    attn_item<false, kAttnStepsInFlight>(a, refs, dt, dto, qscale, b, kh, r0, nr, j0, j1, part, lane);
  const u64 t1 = tb ? globaltimer() : 0;
  const bool combined =
      part && attn_combine(a, attn, (ri + capacity - s * nrg) % capacity, nrg, capacity, dto, b, kh, r0, nr, lane);
  if (tb && lane == 0) trace_item(tb, ri, t0, t1, globaltimer(), combined ? 1u : 0u);
}

}  // namespace gpuos
