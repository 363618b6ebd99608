// csrc/sched/bytecode.cpp -- see bytecode.h.
#include "sched/bytecode.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "device_src/numeric.h"
#include "device_src/types.h"

namespace gpuos {

Program build_program(uint32_t ninputs, const std::vector<ExprNode>& nodes, uint32_t out) {
  if (ninputs < 1 || ninputs > kProgMaxInputs)
    throw std::invalid_argument("gpuos.fusion: a chain takes 1.." + std::to_string(kProgMaxInputs) + " inputs, got " +
                                std::to_string(ninputs));
  const uint32_t nvals = ninputs + (uint32_t)nodes.size();
  if (out >= nvals) throw std::invalid_argument("gpuos.fusion: output value out of range");
  for (size_t i = 0; i < nodes.size(); ++i)
    for (uint32_t k = 0; k < nodes[i].nsrc; ++k)
      if (nodes[i].src[k] >= ninputs + i)
        throw std::invalid_argument("gpuos.fusion: node " + std::to_string(i) + " reads a value defined later");
  // Nodes `out` depends on.
  std::vector<char> needed(nvals, 0);
  std::vector<uint32_t> stack{out};
  while (!stack.empty()) {
    const uint32_t v = stack.back();
    stack.pop_back();
    if (v < ninputs || needed[v]) continue;
    needed[v] = 1;
    const ExprNode& n = nodes[v - ninputs];
    for (uint32_t k = 0; k < n.nsrc; ++k) stack.push_back(n.src[k]);
  }
  std::vector<int> last_use(nvals, -1);
  for (uint32_t v = ninputs; v < nvals; ++v)
    if (needed[v])
      for (uint32_t k = 0; k < nodes[v - ninputs].nsrc; ++k) last_use[nodes[v - ninputs].src[k]] = (int)v;
  last_use[out] = (int)nvals;  // the result stays live to the end
  std::vector<int> reg(nvals, -1);
  for (uint32_t i = 0; i < ninputs; ++i) reg[i] = (int)i;
  std::vector<uint32_t> free_regs;
  for (int r = (int)kProgMaxRegs - 1; r >= (int)ninputs; --r) free_regs.push_back((uint32_t)r);
  Program p;
  std::memset((void*)&p, 0, sizeof p);  // padding too: programs are deduplicated by their bytes
  auto emit = [&](uint32_t op, uint32_t dst, const uint32_t* srcs, uint32_t nsrc, float s0, float s1) {
    if (p.ninstr >= kProgMaxInstr)
      throw std::invalid_argument("gpuos.fusion: chain needs more than " + std::to_string(kProgMaxInstr) +
                                  " instructions");
    Instr& I = p.code[p.ninstr++];
    I.op = (uint8_t)op;
    I.dst = (uint8_t)dst;
    for (uint32_t k = 0; k < nsrc; ++k) I.src[k] = (uint8_t)srcs[k];
    I.nsrc = (uint8_t)nsrc;
    I.s0 = s0;
    I.s1 = s1;
  };
  for (uint32_t v = ninputs; v < nvals; ++v) {
    if (!needed[v]) continue;
    const ExprNode& n = nodes[v - ninputs];
    uint32_t srcs[3] = {0, 0, 0};
    for (uint32_t k = 0; k < n.nsrc; ++k) srcs[k] = (uint32_t)reg[n.src[k]];
    for (uint32_t k = 0; k < n.nsrc; ++k) {  // operands dead after this node give their register back
      const uint32_t s = n.src[k];
      if (s >= ninputs && last_use[s] == (int)v && reg[s] >= 0) {
        bool dup = false;
        for (uint32_t f : free_regs) dup |= f == (uint32_t)reg[s];
        if (!dup) free_regs.push_back((uint32_t)reg[s]);
      }
    }
    if (free_regs.empty())
      throw std::invalid_argument("gpuos.fusion: chain needs more than " + std::to_string(kProgMaxRegs) +
                                  " live registers");
    const uint32_t dst = free_regs.back();
    free_regs.pop_back();
    reg[v] = (int)dst;
    emit(n.op, dst, srcs, n.nsrc, n.s0, n.s1);
    if (n.round == kF16 || n.round == kBF16) emit(n.round == kF16 ? kOpRoundF16 : kOpRoundBF16, dst, &dst, 1, 0, 0);
  }
  p.ninputs = ninputs;
  p.out_reg = (uint32_t)reg[out];
  return p;
}

}  // namespace gpuos
