// csrc/sched/prologue.h -- matmul prologues at lowering: a row program (a norm) whose output only matmuls read, as
// their `a`, runs inside each of them (sched/prologue.cpp), from the fused unit the chains are built from
// (build_fused, sched/lower.cpp).
#pragma once
#include <array>
#include <vector>

#include "core/runtime.h"
#include "sched/deferred.h"

namespace gpuos {

// One fused sub-op's arguments: op r and the producers fused into it (build_fused). `expanded` holds the leaves
// broadcast to the output's shape, which `ins` describe; `leaves` the group's own tensors.
struct FusedUnit {
  FusedArgs fa;
  Operand ins[kProgMaxInputs];
  at::Tensor expanded[kProgMaxInputs];
  const at::Tensor* leaves[kProgMaxInputs] = {};
  uint32_t nin = 0;
  int32_t pid = -1;   // the program's id in the runtime's table
  bool rows = false;  // a row program (a last-dim reduction inside)
};
// Builds op r's fused unit; false if it cannot be expressed (too many inputs or instructions, a layout the fused
// rule cannot address, a full program table). (sched/lower.cpp)
bool build_fused(Runtime& rt, const std::vector<DeferredOp>& ops,
                 const std::vector<std::array<int, kDeferredMaxIn>>& child, int r, FusedUnit& u);

// For each op i, the group j whose output matmul i reads as `a` and can run as its prologue, or -1. skip[x]: op x is
// not emitted (dropped); moved[x]: matmul x runs elsewhere (an epilogue's source); fused_away[x]: op x is inside
// another group.
std::vector<int> prologue_sources(const std::vector<DeferredOp>& ops,
                                  const std::vector<std::array<int, kDeferredMaxIn>>& child,
                                  const std::vector<char>& dropped, const std::vector<char>& fused_away,
                                  const std::vector<char>& moved);
// Records matmul i with group j (its fused unit `u`, built on the first call: u.pid < 0) as its prologue; false if
// the runtime's prologue path does not take it (then the caller emits the group, once, before the product).
bool emit_prologue(Runtime& rt, const std::vector<DeferredOp>& ops,
                   const std::vector<std::array<int, kDeferredMaxIn>>& child, int j, int i, FusedUnit& u);

}  // namespace gpuos
