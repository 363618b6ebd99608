// csrc/ops/op_table.cpp -- see op_table.h.
#include "ops/op_table.h"

#include <cstring>
#include <stdexcept>

namespace gpuos {

const OpInfo kOps[kNumOps] = {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  {#name, arity, kind, ns, snames, d0, d1, aten, #functor, "gpuos.submit_" #name},
#include "device_src/ops.def"
#undef GPUOS_OP
};

// ids are the table's positions
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  static_assert(kOp_##name == id, "ops.def: ids must be 0, 1, 2, ... in order");
#include "device_src/ops.def"
#undef GPUOS_OP

int find_op(const char* name, int kind) {
  for (uint32_t i = 0; i < kNumOps; ++i)
    if (std::strcmp(name, kOps[i].name) == 0 && (kind < 0 || kOps[i].kind == (uint32_t)kind)) return (int)i;
  return -1;
}

uint32_t op_id(const std::string& name, const char* who, int kind, uint32_t max_id) {
  for (uint32_t i = 0; i < max_id; ++i)
    if (name == kOps[i].name && (kind < 0 || kOps[i].kind == (uint32_t)kind)) return i;
  std::string valid;
  for (uint32_t i = 0; i < max_id; ++i)
    if (kind < 0 || kOps[i].kind == (uint32_t)kind)
      valid += std::string(valid.empty() ? "" : ", ") + "'" + kOps[i].name + "'";
  throw std::invalid_argument(std::string(who) + ": unknown op '" + name + "'; supported: " + valid);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t e = s.find(sep, start);
    if (e == std::string::npos) e = s.size();
    if (e > start) out.push_back(s.substr(start, e - start));
    start = e + 1;
  }
  return out;
}

}  // namespace gpuos
