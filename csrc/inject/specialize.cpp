// csrc/inject/specialize.cpp -- see specialize.h.
#include "inject/specialize.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

#include "config/config.h"
#include "device_src/interp.h"
#include "device_src/numeric.h"
#include "device_src/types.h"
#include "inject/registry.h"
#include "ops/op_table.h"

namespace gpuos {

namespace {
std::mutex g_prog_mu;
std::unordered_map<std::string, int32_t> g_prog_ids;
std::vector<Program> g_progs;
std::vector<std::atomic<uint32_t>> g_prog_uses(kMaxPrograms);
std::atomic<uint64_t> g_spec_requests{0};

std::atomic<uint32_t> g_spec_after{env_config().specialize_after};

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
  // A row program (kOpRowRed inside) also gets kRows, row_info (its reductions) and eval's red / stop, with
  // run_program_v's meaning (elementwise.h fused_spec_op runs it through fused_rows).
  uint32_t rop[kRowMaxRed];
  float rscale[kRowMaxRed];
  const uint32_t nred = row_reductions(p, rop, rscale);
  std::string s = "namespace " + ns + " {\nstruct F {\n  static constexpr ::gpuos::u32 kInputs = " +
                  std::to_string(p.ninputs) + ";\n  static constexpr ::gpuos::u32 kRows = " + std::to_string(nred) +
                  ";\n  static __device__ __forceinline__ void row_info(::gpuos::u32* ops, float* scales) {\n"
                  "    using namespace ::gpuos;\n";
  for (uint32_t q = 0; q < nred; ++q)
    s += "    ops[" + std::to_string(q) + "] = " + std::to_string(rop[q]) + "u; scales[" + std::to_string(q) + "] = " +
         fbits(rscale[q]) + ";\n";
  s += "  }\n  static __device__ __forceinline__ float eval(const float* x, const float* red = nullptr, "
       "::gpuos::u32 stop = ~0u) {\n    using namespace ::gpuos;\n";
  for (uint32_t r = 0; r < kProgMaxRegs; ++r)
    s += "    float r" + std::to_string(r) + " = " + (r < p.ninputs ? "x[" + std::to_string(r) + "]" : "0.0f") + ";\n";
  auto reg = [](uint32_t r) { return "r" + std::to_string(r); };
  uint32_t q = 0;
  for (uint32_t i = 0; i < p.ninstr && i < kProgMaxInstr; ++i) {
    const Instr& I = p.code[i];
    const std::string dst = "    " + reg(I.dst) + " = ";
    if (I.op == kOpConst) {
      s += dst + fbits(I.s0) + ";\n";
    } else if (I.op == kOpRoundF16) {
      s += dst + "f16_to_f32(f32_to_f16(" + reg(I.src[0]) + "));\n";
    } else if (I.op == kOpRoundBF16) {
      s += dst + "bf16_to_f32(f32_to_bf16(" + reg(I.src[0]) + "));\n";
    } else if (I.op == kOpRowRed) {
      s += "    if (stop == " + std::to_string(q) + "u) return " + reg(I.src[0]) + ";\n" + dst + "red[" +
           std::to_string(q) + "];\n";
      ++q;
    } else if (I.op < kNumOps) {
      s += dst + kOps[I.op].functor + "::apply(" + reg(I.src[0]) + ", " + (I.nsrc > 1 ? reg(I.src[1]) : "0.0f") + ", " +
           (I.nsrc > 2 ? reg(I.src[2]) : "0.0f") + ", " + fbits(I.s0) + ", " + fbits(I.s1) + ");\n";
    } else {
      throw std::invalid_argument("gpuos: program " + std::to_string(id) + " has an unknown op " + std::to_string(I.op));
    }
  }
  s += "    return " + reg(p.out_reg) + ";\n  }\n};\n}  // namespace " + ns + "\n";
  return s;
}

}  // namespace gpuos
