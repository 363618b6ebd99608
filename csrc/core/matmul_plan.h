// csrc/core/matmul_plan.h -- how a worker matmul is cut into items (device_src/matmul.h runs them): its path,
// its K slices, its column tiles per item -- chosen per product (matmul_cut) and shared with the other products
// of its dependency level (level_cut as a live flush records them, spread_level over a program image's level).
#pragma once
#include <cstdint>
#include <vector>

#include "device_src/types.h"

namespace gpuos {

// K slices of a worker matmul of `ntile` column tiles of path `variant` (kMmMma / kMmNcol / kMmNcol1) with M
// rows, aiming at about `items` items, for a ring of `capacity` slots and blocks of `warps` warps
// (gpuos_ext._testing.matmul_split).
uint32_t matmul_split(int64_t ntile, int64_t K, int64_t M, uint32_t variant, uint32_t capacity, uint32_t items,
                      uint32_t warps);
// Whether such a product's tiles may be summed in shared memory (kMmLocal) by a block of `warps` warps
// (gpuos_ext._testing.matmul_local).
bool matmul_local(uint32_t ksplit, int64_t M, uint32_t variant, uint32_t warps);
// Column tiles per item of an unsplit tensor-core product of `ntile` tiles, for a worker grid of `grid_warps` warps
// (gpuos_ext._testing.matmul_group).
uint32_t matmul_group(int64_t ntile, uint32_t items, uint32_t grid_warps);
// The path (kMmMma / kMmNcol / kMmNcol1 / kMmWarp, device_src/matmul.h) of an M x K by K x N product of dtype pdt
// with operand dtypes adt / bdt and 2-D refs a_ref / b_ref.
uint32_t matmul_variant(uint32_t adt, const TensorRef& a_ref, uint32_t bdt, const TensorRef& b_ref, uint32_t pdt,
                        int64_t M, int64_t N, int64_t K);
// SubOp::reserved of a product of `ntile` tiles on path `variant` cut into `ksplit` slices, and its item count.
struct MmCut {
  uint32_t reserved = 0;
  uint64_t items = 0;
};
// What record_matmul gives a product alone (local: Config::local_combine).
MmCut matmul_cut(int64_t ntile, int64_t K, int64_t M, uint32_t variant, uint32_t capacity, uint32_t items,
                 uint32_t warps, uint32_t grid_warps, bool local);

// What the level rule needs of the runtime (Runtime::mm_spread). items == 0: off (GPUOS_MM_SPREAD=0).
struct MmSpread {
  uint32_t items = 0, capacity = 0, warps = 0, grid_warps = 0;
  bool local = false;
};
// One product of a level: its descriptor's `reserved` and item count as recorded, and its shape.
struct LevelProduct {
  uint32_t reserved = 0;
  uint64_t items = 0;
  int64_t M = 0, N = 0, K = 0;
};
// Whether spread_level may re-cut a product whose descriptors look like `d`: a strided worker matmul on a tile
// path (mma / ncol / ncol1), neither dual nor with a prologue (those are never split).
bool level_splittable(const SubOp& d);
// The products of a level share the grid: `s.items` items (about one per warp of the grid) is what a level
// needs, not what each of its products needs. Eight independent 4,096^2 products cut alone are 8 x 1,024 K
// slices, ~8 claims per block in turn, each paying its lead-in and tail; unsplit, 2,048 items (H200,
// bench_matmul's flush of 8 products at M = 1 with GPUOS_MM_ITEMS=256: 81-90 % of copy against 51 %, thirty-
// eighth session). So once a level's products hold more than 1.5 x `s.items` items as cut alone, each gets its
// share of `s.items` (by weight, N x K) -- never more slices than alone, so the scratch and ring bounds its own
// cut met still hold; below that, fewer slices would leave warps idle for nothing.
//
// spread_level: a whole level known at once (a program's image, core/tape.cpp stage_image). Rewrites
// `reserved` / `items` of the products it re-cuts; returns how many.
uint32_t spread_level(std::vector<LevelProduct>& ps, const MmSpread& s);
// level_cut: a live flush, whose products are cut as they are recorded (a flush publishes its first 1,024 items
// while it records the rest: Config::publish_min) -- the share of product `p` (its cut alone) with the level's
// products so far (`load`, updated with it). Returns its cut: p's own if the rule leaves it.
struct LevelLoad {
  uint64_t items = 0;  // items of the level's splittable products, as cut alone
  double weight = 0;   // their weight elements
};
MmCut level_cut(LevelProduct p, LevelLoad& load, const MmSpread& s);

}  // namespace gpuos
