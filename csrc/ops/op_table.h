// csrc/ops/op_table.h -- the one host view of device_src/ops.def (the only list of operators). Every host
// table -- names, arities, scalars, aten overloads, functor names -- is expanded from that file here; Python
// reads it through gpuos_ext.op_table(). No torch, no pybind11.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "device_src/functors.h"  // kOp_<name> ids, OpKind (kKindEw, kKindReduce)

namespace gpuos {

struct OpInfo {
  const char* name;
  uint32_t arity, kind, nscalars;
  const char* scalar_names;  // comma-separated
  float d0, d1;              // scalar defaults
  const char* aten;          // '|'-separated aten overloads, optionally with "[arg=value]" conditions
  const char* functor;       // device functor (device_src/functors.h)
  const char* submit_name;   // "gpuos.submit_<name>" (error messages of the explicit API)
};

// kNumOps (device_src/functors.h): the number of table ops.
extern const OpInfo kOps[kNumOps];

// Id of the op called `name` (of `kind`, or any when kind < 0) among ids [0, max_id); throws
// std::invalid_argument naming `who` and listing the valid names.
uint32_t op_id(const std::string& name, const char* who, int kind = -1, uint32_t max_id = (uint32_t)kNumOps);
// Id of a table op named `name`, or -1.
int find_op(const char* name, int kind = -1);
// Softmax-like reductions write a row per input row (out has x's shape).
inline bool row_output(uint32_t op) { return op == kOp_softmax || op == kOp_log_softmax; }

std::vector<std::string> split(const std::string& s, char sep);

}  // namespace gpuos
