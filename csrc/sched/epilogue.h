// csrc/sched/epilogue.h -- matmul epilogues at lowering: an elementwise group whose only input is a matmul's
// unread result runs as that matmul (sched/epilogue.cpp), and the group expression both it and the fused chains
// are built from (group_nodes, sched/lower.cpp).
#pragma once
#include <array>
#include <unordered_map>
#include <vector>

#include "core/runtime.h"
#include "sched/bytecode.h"
#include "sched/deferred.h"

namespace gpuos {

// The expression of op r and the producers fused into it: `nodes` (inputs numbered 0 .. leaves - 1, node k is
// value leaves + k), its tensor `leaves` (one per distinct view), the value it returns, and whether a row
// reduction is inside. False if it cannot be expressed (a reduction over another shape, too many inputs).
// (sched/lower.cpp)
bool group_nodes(const std::vector<DeferredOp>& ops, const std::vector<std::array<int, kDeferredMaxIn>>& child, int r,
                 std::vector<ExprNode>& nodes, std::vector<const at::Tensor*>& leaves, uint32_t& outv, bool& rows);

// The matmuls group j can run as the epilogue of: {i, -1} one product, {i0, i1} a dual item's two (in no set
// order: emit_epilogue matches them to the program's inputs), {-1, -1} none; `mm`: the latest matmul before j by output
// storage.
std::array<int, 2> epilogue_sources(const std::vector<DeferredOp>& ops,
                                    const std::vector<std::array<int, kDeferredMaxIn>>& child,
                                    const std::unordered_map<const void*, int>& mm, int j);
// Records matmul i (and i2 >= 0, the dual item's other product) at group j's place with the group as its
// epilogue; false if it cannot (then all go as before).
bool emit_epilogue(Runtime& rt, const std::vector<DeferredOp>& ops,
                   const std::vector<std::array<int, kDeferredMaxIn>>& child, int i, int i2, int j);

}  // namespace gpuos
