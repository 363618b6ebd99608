// csrc/fusion.cpp -- see fusion.h.
#include "fusion.h"

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

// ------------------------------------------------------------------ program ids and tier 2
namespace gpuos {

void request_fused_spec(uint32_t id, const std::string& code);  // generations.cpp

namespace {
std::mutex g_prog_mu;
std::unordered_map<std::string, int32_t> g_prog_ids;
std::vector<Program> g_progs;
std::vector<std::atomic<uint32_t>> g_prog_uses(kMaxPrograms);
std::atomic<uint64_t> g_spec_requests{0};

uint32_t env_specialize_after() {
  const char* v = std::getenv("GPUOS_SPECIALIZE_AFTER");
  return v && *v ? (uint32_t)std::strtoul(v, nullptr, 10) : 64u;
}
std::atomic<uint32_t> g_spec_after{env_specialize_after()};

const char* const kFunctor[] = {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) #functor,
#include "device_src/ops.def"
#undef GPUOS_OP
};
constexpr uint32_t kNumFunctors = sizeof(kFunctor) / sizeof(kFunctor[0]);

std::string fbits(float f) {
  char b[48];
  std::snprintf(b, sizeof b, "bits_f32(0x%08xu)", f32_bits(f));
  return b;
}
}  // namespace

int32_t intern_program(const Program& p) {
  std::string key((const char*)&p, sizeof(Program));
  std::lock_guard<std::mutex> lk(g_prog_mu);
  auto it = g_prog_ids.find(key);
  if (it != g_prog_ids.end()) return it->second;
  if (g_progs.size() >= kMaxPrograms) return -1;
  const int32_t id = (int32_t)g_progs.size();
  g_progs.push_back(p);
  g_prog_ids.emplace(std::move(key), id);
  return id;
}

Program program_by_id(int32_t id) {
  std::lock_guard<std::mutex> lk(g_prog_mu);
  return g_progs.at((size_t)id);
}

void set_specialize_after(uint32_t n) { g_spec_after.store(n); }
uint32_t specialize_after() { return g_spec_after.load(); }
uint64_t specializations_requested() { return g_spec_requests.load(); }

void note_program_use(int32_t id) {
  if (id < 0 || id >= (int32_t)kMaxPrograms) return;
  const uint32_t after = g_spec_after.load(std::memory_order_relaxed);
  if (after == 0) return;
  const uint32_t n = g_prog_uses[(size_t)id].fetch_add(1, std::memory_order_relaxed) + 1;
  if (n != after) return;  // exactly once per program
  g_spec_requests++;
  request_fused_spec((uint32_t)id, specialize_program((uint32_t)id, program_by_id(id)));
}

std::string specialize_program(uint32_t id, const Program& p) {
  const std::string ns = "gpuos_fused_" + std::to_string(id);
  std::string s = "namespace " + ns + " {\nstruct F {\n  static constexpr ::gpuos::u32 kInputs = " +
                  std::to_string(p.ninputs) + ";\n  static __device__ __forceinline__ float eval(const float* x) {\n"
                  "    using namespace ::gpuos;\n";
  for (uint32_t r = 0; r < kProgMaxRegs; ++r)
    s += "    float r" + std::to_string(r) + " = " + (r < p.ninputs ? "x[" + std::to_string(r) + "]" : "0.0f") + ";\n";
  auto reg = [](uint32_t r) { return "r" + std::to_string(r); };
  for (uint32_t i = 0; i < p.ninstr && i < kProgMaxInstr; ++i) {
    const Instr& I = p.code[i];
    const std::string dst = "    " + reg(I.dst) + " = ";
    if (I.op == kOpConst) {
      s += dst + fbits(I.s0) + ";\n";
    } else if (I.op == kOpRoundF16) {
      s += dst + "f16_to_f32(f32_to_f16(" + reg(I.src[0]) + "));\n";
    } else if (I.op == kOpRoundBF16) {
      s += dst + "bf16_to_f32(f32_to_bf16(" + reg(I.src[0]) + "));\n";
    } else if (I.op < kNumFunctors) {
      s += dst + kFunctor[I.op] + "::apply(" + reg(I.src[0]) + ", " + (I.nsrc > 1 ? reg(I.src[1]) : "0.0f") + ", " +
           (I.nsrc > 2 ? reg(I.src[2]) : "0.0f") + ", " + fbits(I.s0) + ", " + fbits(I.s1) + ");\n";
    } else {
      throw std::invalid_argument("gpuos: program " + std::to_string(id) + " has an unknown op " + std::to_string(I.op));
    }
  }
  s += "    return " + reg(p.out_reg) + ";\n  }\n};\n}  // namespace " + ns + "\n";
  return s;
}

}  // namespace gpuos
