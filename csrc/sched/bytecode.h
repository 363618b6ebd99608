// csrc/sched/bytecode.h -- fused elementwise chains -> interpreter bytecode (device_src/interp.h Program).
// The one program builder: the scheduler's flush-time fusion and gpuos.fusion.Chain both use it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "device_src/interp.h"

namespace gpuos {

// One node of an expression DAG in topological order. Operand values are numbered: 0 .. ninputs-1 are the
// program inputs, ninputs + i is node i. `round` (a DType: kF16 / kBF16, or kF32 for none) rounds the node's
// result as eager PyTorch does when it stores an fp16/bf16 intermediate.
struct ExprNode {
  uint32_t op;       // op table id, or kOpConst (value in s0)
  uint32_t nsrc;
  uint32_t src[3];
  float s0, s1;
  uint32_t round;
};

// Bytecode computing value `out` (only the nodes it depends on), registers reused after their last use.
// Throws std::invalid_argument when the chain exceeds kProgMaxInputs / kProgMaxRegs / kProgMaxInstr.
Program build_program(uint32_t ninputs, const std::vector<ExprNode>& nodes, uint32_t out);

}  // namespace gpuos
