// csrc/fusion.h -- fused elementwise chains -> interpreter bytecode (device_src/interp.h Program).
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

namespace gpuos {

// Process-wide program ids (the same id on every device, so a generation's specialized code for id N is the
// code of program N everywhere). Returns -1 when kMaxPrograms are interned.
int32_t intern_program(const Program& p);
Program program_by_id(int32_t id);

// Tier 2: count one more run of program `id`; the use that reaches the threshold (GPUOS_SPECIALIZE_AFTER,
// default 64 sub-op groups; 0 = never) asks the registry for a generation with straight-line code for it
// (compiled on the background thread; the caller never waits for NVRTC).
void note_program_use(int32_t id);
void set_specialize_after(uint32_t n);
uint32_t specialize_after();
uint64_t specializations_requested();

// CUDA C++ for program `id`: namespace gpuos_fused_<id> { struct F { kInputs; eval(const float* x) } }.
std::string specialize_program(uint32_t id, const Program& p);

}  // namespace gpuos
