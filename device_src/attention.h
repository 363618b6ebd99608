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
// its ring slot and leaves its tile's counter (a word in the first item's slot) in a FinishNote; run_claim counts
// the block's items after its barrier, and the block that completes a tile combines it with all its warps
// (attn_finish), writes the output and resets the counter (a ring slot is reused only after its batch is done).
#pragma once

namespace gpuos {

constexpr u32 R = kAttnRowsPerItem;  // query rows an item holds in registers
// Steps of the kv loop whose loads are in flight together (attn_item's T): each lane issues T 16-byte loads of K
// and T of V before the first use (a warp: T * 32 / (D / 8) kv rows of each). 2 (the first version) kept few
// bytes in flight per warp (~120 GB/s on an H100 at KV 4096). The masked variant keeps 2: with 3 it spilled.
constexpr u32 kAttnStepsInFlight = 3, kAttnStepsInFlightMasked = 2;
// Splits whose partials (every row of the tile) one warp of attn_finish loads at once, per lane.
constexpr u32 kAttnFinishBatch = 8;
constexpr float kAttnLog2e = 1.4426950408889634f, kAttnLn2 = 0.6931471805599453f;

// Per-slot partial layout (floats): [0, 4) head (counter), [4, 8) row maxima, [8, 12) row sums, [12, ...) rows x D.
constexpr u32 kAttnPartM = kAttnScratchHead, kAttnPartL = kAttnScratchHead + 4, kAttnPartAcc = kAttnScratchHead + 8;
static_assert(R <= 4 && kAttnPartAcc + R * kAttnMaxHeadDim <= kAttnScratchPerSlot,
              "attention partials fit one ring slot's scratch");
static_assert(kAttnPartAcc + R * 128 == kLocalSlot, "a shared-memory partial has the scratch slot's layout");

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

// An item's place (attention_op's numbering): item = ((b * Hkv + kh) * nsplit + s) * nrg + rg -- the row groups of
// one KV slice are neighbours (claimed together, they read the same K / V rows, mostly from cache) -- or, with
// kAttnTileMajor, item = ((b * Hkv + kh) * nrg + rg) * nsplit + s (a tile's splits are neighbours). A tile's items
// are `stride` ring slots apart (nrg, or 1), its first (split 0) at ring index `first`, whose scratch holds the
// counter.
struct AttnTile {
  u32 G, nrg, s, b, kh, r0, nr, first, stride;
};
__device__ __forceinline__ AttnTile attn_tile(const AttnArgs& a, u32 base, u32 ri, u32 capacity) {
  AttnTile t;
  t.G = a.Hq / a.Hkv;
  const u32 nrows = t.G * a.Lq;
  t.nrg = (nrows + R - 1) / R;
  u32 rg, bk;
  if (a.mode & kAttnTileMajor) {
    t.s = base % a.nsplit, rg = (base / a.nsplit) % t.nrg, bk = base / a.nsplit / t.nrg, t.stride = 1;
  } else {
    rg = base % t.nrg, t.s = (base / t.nrg) % a.nsplit, bk = base / t.nrg / a.nsplit, t.stride = t.nrg;
  }
  t.kh = bk % a.Hkv, t.b = bk / a.Hkv;
  t.r0 = rg * R, t.nr = nrows - t.r0 < R ? nrows - t.r0 : R;
  const u32 back = t.s * t.stride;  // < capacity: the tile's items are in the ring together
  t.first = ri >= back ? ri - back : ri + capacity - back;
  return t;
}

__device__ __forceinline__ float* attn_scratch(float* scratch, u32 capacity) {
  return scratch + (u64)(capacity + kMmMaxSplit) * kMmScratchPerSlot;  // after the matmul scratch
}

// The combine of a split tile, by a group of gs warps of the block that counted its last item (run_claim's finish
// phase: the counter is already complete and acquired; the group is the whole block when it completed one tile,
// a share of it when it completed several, so that those combine side by side). Every warp loads the splits'
// maxima and sums (lane s % 32 holds split s) and derives the weights; the group's warp gw sums the accumulators
// of splits gw, gw + gs, ... (kAttnFinishBatch splits' loads in flight per lane for every row); the warps' sums
// meet in `red` (shared memory, kMaxWarps x R x 128 floats, a slice per warp) and the group's threads store one
// output each. bar: the group's named barrier (gs warps). About 4 dependent round trips, where one warp alone
// needed ~10 (maxima, then 2 rows x 4 batches of 16 splits at 64 splits: 30-62 us on an H200).
__device__ __noinline__ void attn_finish(const SubOp& d, TensorRef* refs, u64* cached, u32 lane, u32 warp, u32 gw,
                                         u32 gs, u32 bar, i64 rd, u32 ri, float* scratch, u32 capacity, float* red) {
  fetch_refs(d, refs, cached, lane, rd);  // the sub-op's TensorRefs into this warp's own slots
  const AttnArgs& a = *(const AttnArgs*)&refs[0];
  const AttnTile t = attn_tile(a, d.base, ri, capacity);
  float* attn = attn_scratch(scratch, capacity);
  const u32 dto = d.dtype & 0xffu, ns = a.nsplit;
  const float ninf = attn_ninf();
  static_assert(kAttnMaxSplit <= 64, "two splits per lane");
  float w[R][2], mx[R], sum[R], inv[R];
  {
    float ms[R][2], ls[R][2];
#pragma unroll
    for (u32 r = 0; r < R; ++r)
#pragma unroll
      for (u32 h = 0; h < 2; ++h) {
        const u32 sp = lane + 32 * h;
        const float* p = attn + (u64)((t.first + sp * t.stride) % capacity) * kAttnScratchPerSlot;
        const bool ok = sp < ns && r < t.nr;
        ms[r][h] = ok ? __ldcg(p + kAttnPartM + r) : ninf;
        ls[r][h] = ok ? __ldcg(p + kAttnPartL + r) : 0.0f;
      }
#pragma unroll
    for (u32 r = 0; r < R; ++r) {
      float m = fmaxf(ms[r][0], ms[r][1]);
      for (u32 o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      float l = 0.0f;
#pragma unroll
      for (u32 h = 0; h < 2; ++h) {
        w[r][h] = ms[r][h] == ninf ? 0.0f : exp2f(ms[r][h] - m);  // -inf - -inf would be NaN: an empty split weighs 0
        l = fmaf(w[r][h], ls[r][h], l);
      }
      for (u32 o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
      mx[r] = m, sum[r] = l;
      inv[r] = l > 0.0f ? 1.0f / l : 0.0f;  // a row that sees nothing: 0 (torch's safe softmax)
    }
  }
  for (u32 e0 = 0; e0 < a.D; e0 += 128) {  // group-uniform: the barriers below need every thread of the group
    const u32 e = e0 + lane * 4;
    const bool mine = e < a.D;
    float v[R][4];
#pragma unroll
    for (u32 r = 0; r < R; ++r) v[r][0] = v[r][1] = v[r][2] = v[r][3] = 0.0f;
    for (u32 s0 = gw; s0 < ns; s0 += gs * kAttnFinishBatch) {  // warp-uniform
      float4 pv[kAttnFinishBatch][R];
#pragma unroll
      for (u32 u = 0; u < kAttnFinishBatch; ++u) {
        const u32 sp = s0 + u * gs;
        const float* p = attn + (u64)((t.first + sp * t.stride) % capacity) * kAttnScratchPerSlot + kAttnPartAcc + e;
#pragma unroll
        for (u32 r = 0; r < R; ++r)  // every item wrote its partial (an empty split: zeros, weight 0)
          pv[u][r] = mine && sp < ns && r < t.nr ? __ldcg((const float4*)(p + r * a.D))
                                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (u32 u = 0; u < kAttnFinishBatch; ++u) {
        const u32 sp = s0 + u * gs;  // split sp's weight: lane sp % 32, w[.][sp / 32] (0 past the last split)
#pragma unroll
        for (u32 r = 0; r < R; ++r) {
          const float ws = __shfl_sync(0xffffffffu, sp < 32 ? w[r][0] : w[r][1], sp & 31u);
          v[r][0] = fmaf(ws, pv[u][r].x, v[r][0]), v[r][1] = fmaf(ws, pv[u][r].y, v[r][1]);
          v[r][2] = fmaf(ws, pv[u][r].z, v[r][2]), v[r][3] = fmaf(ws, pv[u][r].w, v[r][3]);
        }
      }
    }
#pragma unroll
    for (u32 r = 0; r < R; ++r)
      *(float4*)&red[(warp * R + r) * 128 + lane * 4] = make_float4(v[r][0], v[r][1], v[r][2], v[r][3]);
    bar_sync(bar, gs * 32);
    const u32 w0 = warp - gw;  // the group's first warp
    for (u32 x = gw * 32 + lane; x < t.nr * 128; x += gs * 32) {
      const u32 r = x / 128, ee = e0 + x % 128;
      if (ee >= a.D) continue;
      float o = 0.0f;
      for (u32 k = w0; k < w0 + gs; ++k) o += red[(k * R + r) * 128 + x % 128];
      o *= inv[r];
      float m = mx[0], l = sum[0];
#pragma unroll
      for (u32 q = 1; q < R; ++q)
        if (r == q) m = mx[q], l = sum[q];
      const u32 row = t.r0 + r, g = row / a.Lq, i = row - g * a.Lq;
      attn_store(a, dto, t.b, t.kh * t.G + g, i, ee, &o, 1, m, l, ee == 0);
    }
    bar_sync(bar, gs * 32);  // red is rewritten by the next pass
  }
  if (gw == 0 && lane == 0) atomicExch((unsigned*)(attn + (u64)t.first * kAttnScratchPerSlot), 0u);  // counter reset
}

// The local path's combine (run_claim's finish phase): one warp -- the one that ran the tile's split 0, its
// TensorRefs still in its slots -- merges the tile's nsplit partials, which the claim's consecutive descriptors
// left in shared memory (`part`: split 0's slot, split s at part + s * kLocalSlot), and writes the output.
// Lane l holds dims 4l .. 4l + 3 (head dim <= 128).
__device__ __noinline__ void attn_local_combine(const SubOp& d, const TensorRef* refs, u32 lane, u32 ri, u32 capacity,
                                                const float* part) {
  const AttnArgs& a = *(const AttnArgs*)&refs[0];
  const AttnTile t = attn_tile(a, d.base, ri, capacity);
  const u32 dto = d.dtype & 0xffu, ns = a.nsplit, e = lane * 4;
  const float ninf = attn_ninf();
  for (u32 r = 0; r < t.nr; ++r) {  // warp-uniform
    float m = ninf;
    for (u32 s = 0; s < ns; ++s) m = fmaxf(m, part[s * kLocalSlot + kAttnPartM + r]);
    float l = 0.0f, v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 s = 0; s < ns; ++s) {
      const float* p = part + s * kLocalSlot;
      const float ms = p[kAttnPartM + r];
      const float w = ms == ninf ? 0.0f : exp2f(ms - m);  // an empty split weighs 0 (-inf - -inf would be NaN)
      l = fmaf(w, p[kAttnPartL + r], l);
      if (e < a.D) {
        const float4 x = *(const float4*)(p + kAttnPartAcc + r * a.D + e);
        v[0] = fmaf(w, x.x, v[0]), v[1] = fmaf(w, x.y, v[1]), v[2] = fmaf(w, x.z, v[2]), v[3] = fmaf(w, x.w, v[3]);
      }
    }
    if (e >= a.D) continue;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a row that sees nothing: 0 (torch's safe softmax)
#pragma unroll
    for (u32 j = 0; j < 4; ++j) v[j] *= inv;
    const u32 row = t.r0 + r, g = row / a.Lq, i = row - g * a.Lq;
    attn_store(a, dto, t.b, t.kh * t.G + g, i, e, v, 4, m, l, e == 0);
  }
}

// refs: [0] the AttnArgs, [1] q, [2] k, [3] v (B x H x L x D TensorRefs). ri: the sub-op's ring index; scratch,
// capacity: WorkerArgs::scratch / capacity (the attention scratch follows the matmul scratch); note: where a
// split item leaves its tile's counter for run_claim's finish phase (which counts the block's items after its
// barrier and runs attn_finish for the tiles it completes); tb: the trace (nullptr: off), the item's duration.
__device__ __noinline__ void attention_op(const SubOp& d, const TensorRef* refs, u32 lane, u32 ri, float* scratch,
                                          u32 capacity, FinishNote* note, TraceBuf* tb) {
  const u64 t_entry = kTraceSubops && tb ? globaltimer() : 0;
  const AttnArgs& a = *(const AttnArgs*)&refs[0];
  const AttnTile t = attn_tile(a, d.base, ri, capacity);
  const u32 ns = a.nsplit;
  // 32-bit divisions only (a 64-bit one is a ~70-instruction call ahead of the item's first load).
  const u32 span = a.Lk == 0 ? 0u : (a.Lk - 1) / ns + 1;
  const i64 j0 = (i64)t.s * span, j1 = j0 + span < (i64)a.Lk ? j0 + span : (i64)a.Lk;
  float* attn = attn_scratch(scratch, capacity);
  // The local path: the claim holds the whole tile (tile-major order, its split 0 at claim place o) and has one
  // descriptor per warp (note->local set): the partial goes to shared memory, the finish phase combines it.
  const u32 o = t.first >= note->c0 ? t.first - note->c0 : t.first + capacity - note->c0;  // both < capacity
  const bool local = ns > 1 && (a.mode & kAttnTileMajor) && note->local != nullptr && a.D <= 128 && o + ns <= note->ck;
  float* part = ns <= 1 ? nullptr : local ? note->local : attn + (u64)ri * kAttnScratchPerSlot;
  const u32 dto = d.dtype & 0xffu, dt = (d.dtype >> 8) & 0xffu;
  const float qscale = d.scalar[0] * kAttnLog2e;
  const u64 t0 = tb ? globaltimer() : 0;
  if (a.mode & (kAttnMaskFloat | kAttnMaskBool))
    attn_item<true, kAttnStepsInFlightMasked>(a, refs, dt, dto, qscale, t.b, t.kh, t.r0, t.nr, j0, j1, part, lane);
  else
    attn_item<false, kAttnStepsInFlight>(a, refs, dt, dto, qscale, t.b, t.kh, t.r0, t.nr, j0, j1, part, lane);
  if (local && lane == 0) note->head = t.s == 0;
  else if (part && lane == 0) note->counter = (u64)(attn + (u64)t.first * kAttnScratchPerSlot), note->expected = ns;
  if (tb && lane == 0) {
    const u64 t1 = globaltimer();
    trace_item(tb, note->tslot, ri, t0, t1, t1, lead_bits(note->t1, t_entry, t_entry, t0));
  }
}

}  // namespace gpuos
