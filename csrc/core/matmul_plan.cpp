// csrc/core/matmul_plan.cpp -- how a worker matmul is cut into items (core/matmul_plan.h).
#include "core/matmul_plan.h"

#include <algorithm>
#include <cmath>

#include "device_src/functors.h"  // kOp_* (ops.def)

namespace gpuos {

// K slices of a product of ntile column tiles (device_src/matmul.h): enough items to cover the grid (about
// `items`), each slice at least what one pass of a warp's loads covers (mma: U = 2 chunks of 64; ncol: one step of
// 8 rows) -- a decode product is latency-bound: an item is a few round trips, and the level waits for its
// slowest -- and the tile's partials (tw x M) must fit the scratch of its ksplit ring slots; no split when they
// cannot. The items of a split product must also stay in one piece of append_tiles (capacity / 2): consecutive
// in the ring.
uint32_t matmul_split(int64_t ntile, int64_t K, int64_t M, uint32_t variant, uint32_t capacity, uint32_t items,
                      uint32_t warps) {
  const int64_t tw = mm_cols(variant), unit = mm_unit(variant);
  const int64_t units = (K + unit - 1) / unit;
  const int64_t min_units = variant == kMmMma ? 2 : 1;
  // A tensor-core item keeps at least kMmMmaItemBytes of weight (twelfth session, H200, bench_matmul --quick: a
  // chain of 1,024^2 fp16 products at M = 1 took 18.7 us per product as 1,024 items, 14.3 as 256, cuBLAS 14.7;
  // 128 independent ones in one level 18.3 / 10.6 against 14.3). The ncol items of GPT-2's steps did best at
  // 1,024 (the same session: 701 us per step, 729 at 256, 732 at 128).
  constexpr int64_t kMmMmaItemBytes = 8192;
  const int64_t target = variant == kMmMma
      ? std::min<int64_t>(items, std::max<int64_t>(1, ntile * tw * K * 2 / kMmMmaItemBytes)) : (int64_t)items;
  int64_t ks = std::min<int64_t>({target / std::max<int64_t>(ntile, 1), units / min_units, (int64_t)kMmMaxSplit});
  // An ncol1 tile's slices stay within one claim's warps (summed in shared memory: kMmLocal) while that keeps a
  // slice within two of the item's 64-row steps (two round trips); past that, more slices meet in the scratch.
  if (variant == kMmNcol1 && ks > (int64_t)warps && warps > 1 &&
      mm_kspan(K, warps, (uint32_t)unit) <= 2 * 8 * (int64_t)kMmNcolRows)
    ks = warps;
  if (ks <= 1) return 1;
  const int64_t need = (kMmScratchHead + tw * M + kMmScratchPerSlot - 1) / kMmScratchPerSlot;
  if (ks < need) ks = need <= std::min<int64_t>(units, kMmMaxSplit) ? need : 1;
  if (ks > 1 && ntile * ks > (int64_t)capacity / 2) ks = 1;
  // mm_kspan rounds slices up to whole units: the last slices may be empty (harmless: their items add nothing);
  // drop them while the scratch still fits.
  while (ks > 1 && ks - 1 >= need && (ks - 1) * mm_kspan(K, (uint32_t)ks, (uint32_t)unit) >= K) --ks;
  return ks > 1 && ks * kMmScratchPerSlot >= kMmScratchHead + tw * M ? (uint32_t)ks : 1u;
}

// Whether a split product takes the local path (kMmLocal: the K slices of a tile that one claim holds are summed
// in shared memory): its partial (M x tile columns) fits a slot and a block of `warps` warps holds every slice.
bool matmul_local(uint32_t ksplit, int64_t M, uint32_t variant, uint32_t warps) {
  const int64_t tw = mm_cols(variant);
  return variant != kMmWarp && ksplit > 1 && ksplit <= warps && M * tw <= (int64_t)kLocalSlot;
}

// Column tiles per item of an unsplit tensor-core product: about `items` items (more tiles than that: an LM
// head), at most kMmMaxGroup tiles each -- or, where the worker's grid has more warps than `items`, one item per
// warp of the grid (`grid_warps`): GPT-2's 3,142 tiles at 1,024 items were 786 items of 4 tiles, 99 claims of 8
// for 132 blocks; at the H200's 1,056 warps they are 1,048 of 3.
uint32_t matmul_group(int64_t ntile, uint32_t items, uint32_t grid_warps) {
  if (items <= 1 || ntile <= (int64_t)items) return 1;
  const int64_t cover = std::max<int64_t>(items, grid_warps);
  return (uint32_t)std::min<int64_t>(kMmMaxGroup, (ntile + cover - 1) / cover);
}

// The matmul path (device_src/matmul.h) of a product of dtype pdt: tensor cores for 16-bit K-contiguous operands,
// the ncol items for a 16-bit N-contiguous weight, per-warp column tiles otherwise.
uint32_t matmul_variant(uint32_t adt, const TensorRef& a_ref, uint32_t bdt, const TensorRef& b_ref, uint32_t pdt,
                        int64_t M, int64_t N, int64_t K) {
  const bool h16 = (adt == kF16 || adt == kBF16) && bdt == adt && pdt == adt;
  const bool a16 = (a_ref.ptr & 15) == 0 && (b_ref.ptr & 15) == 0 && K % 8 == 0;
  if (h16 && a16 && a_ref.strides[1] == 1 && b_ref.strides[0] == 1 && a_ref.strides[0] % 8 == 0 &&
      b_ref.strides[1] % 8 == 0)
    return kMmMma;
  if (h16 && (b_ref.ptr & 15) == 0 && b_ref.strides[1] == 1 && N % 8 == 0 && b_ref.strides[0] % 8 == 0)
    return M == 1 ? kMmNcol1 : kMmNcol;
  return kMmWarp;
}

MmCut matmul_cut(int64_t ntile, int64_t K, int64_t M, uint32_t variant, uint32_t capacity, uint32_t items,
                 uint32_t warps, uint32_t grid_warps, bool local) {
  const uint32_t ksplit = matmul_split(ntile, K, M, variant, capacity, items, warps);
  const uint32_t group = ksplit == 1 && variant == kMmMma ? matmul_group(ntile, items, grid_warps) : 1u;
  const bool loc = local && matmul_local(ksplit, M, variant, warps);
  const uint64_t n = (uint64_t)((ntile + group - 1) / group) * ksplit;
  return {variant | ksplit << 8 | group << 16 | (loc ? kMmLocal : 0u), n};
}

bool level_splittable(const SubOp& d) {
  const uint32_t variant = d.reserved & 0xffu;
  return d.op == kOp_mm && (d.flags & kFlagStrided) && !(d.flags & (kFlagMmDual | kFlagMmPrologue)) &&
         (variant == kMmMma || variant == kMmNcol || variant == kMmNcol1);
}

namespace {
double weight(const LevelProduct& p) { return (double)std::max<int64_t>(p.N, 1) * (double)std::max<int64_t>(p.K, 1); }
// The cut of p as its share (weight w of the level's `total`) of s.items, if that is fewer items than p has.
bool share_cut(LevelProduct& p, double total, const MmSpread& s) {
  const uint32_t variant = p.reserved & 0xffu;
  const int64_t tw = mm_cols(variant), ntile = (p.N + tw - 1) / tw;
  const uint32_t share = (uint32_t)std::max<double>(1.0, std::floor((double)s.items * weight(p) / total + 0.5));
  const MmCut c = matmul_cut(ntile, p.K, p.M, variant, s.capacity, share, s.warps, s.grid_warps, s.local);
  if (c.items >= p.items) return false;
  p.reserved = c.reserved, p.items = c.items;
  return true;
}
bool crowded(uint64_t items, const MmSpread& s) { return s.items > 1 && items * 2 > (uint64_t)s.items * 3; }
}  // namespace

uint32_t spread_level(std::vector<LevelProduct>& ps, const MmSpread& s) {
  uint64_t recorded = 0;
  double total = 0;
  for (const LevelProduct& p : ps) recorded += p.items, total += weight(p);
  if (ps.size() < 2 || !crowded(recorded, s)) return 0;
  uint32_t changed = 0;
  for (LevelProduct& p : ps) changed += share_cut(p, total, s) ? 1 : 0;
  return changed;
}

MmCut level_cut(LevelProduct p, LevelLoad& load, const MmSpread& s) {
  load.items += p.items, load.weight += weight(p);
  if (crowded(load.items, s)) share_cut(p, load.weight, s);
  return {p.reserved, p.items};
}

}  // namespace gpuos
