// csrc/core/matmul_plan.h -- how a worker matmul is cut into items (device_src/matmul.h runs them): its path,
// its K slices, its column tiles per item -- chosen per product when it is recorded (Runtime::record_matmul), and
// again per dependency level once the level is whole (spread_level: the products of one level share the grid).
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

// What the level pass needs of the runtime (Runtime::mm_spread). items == 0: the pass is off (GPUOS_MM_SPREAD=0).
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
// Whether spread_level may re-cut a product whose descriptors look like `d`: a strided worker matmul on a
// tile path (mma / ncol / ncol1), neither dual nor with a prologue (those are never split).
bool level_splittable(const SubOp& d);
// The products of one dependency level share the grid: each aims at its share of about `s.items` items (by
// weight size, N x K) instead of `s.items` alone, so that eight independent 4,096^2 products are 2,048
// unsplit items rather than 8,192 K slices (H200, bench_matmul at M = 1: 81-90 % of copy against 51 %, the
// thirty-eighth session with GPUOS_MM_ITEMS=256) while a product alone in its level keeps its slices. Only a
// level whose products hold more than 1.5 x `s.items` items as recorded is re-cut, and a product only ever gets
// fewer slices than it was recorded with (the scratch and ring bounds it met hold). Rewrites `reserved` /
// `items` of the products it re-cuts; returns how many.
uint32_t spread_level(std::vector<LevelProduct>& ps, const MmSpread& s);

}  // namespace gpuos
