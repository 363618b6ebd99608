// device_src/functors.h -- no host-only code, no system #includes.
// Elementwise math in fp32. Plain C++: the worker calls them on the GPU, CPU tests call them through g++.
#pragma once
#include "device_src/config.h"

namespace gpuos {

struct AddF { static GPUOS_HD float apply(float a, float b) { return a + b; } };
struct SubF { static GPUOS_HD float apply(float a, float b) { return a - b; } };
struct MulF { static GPUOS_HD float apply(float a, float b) { return a * b; } };
struct DivF { static GPUOS_HD float apply(float a, float b) { return a / b; } };

enum OpId : u32 {
#define GPUOS_OP(id, name, arity, functor) kOp_##name = id,
#include "device_src/ops.def"
#undef GPUOS_OP
  kNumOps
};

}  // namespace gpuos
