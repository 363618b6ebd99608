// device_src/user_ops.h -- no host-only code, no system #includes.
// The operators injected at run time (issue #5: register_elementwise / register_op / install). This embedded
// file is generation 0: no user ops. Each later generation's NVRTC compile replaces it with a generated one
// (csrc/generations.cpp, generation_header()) of the same shape:
//   namespace gpuos_user_<op>_<slot> { <user source>; struct UserF_<op>_<slot> { apply(a, b, c, s0, s1) }; }
//   #define GPUOS_USER_OPS(X) X(op, slot, arity, functor) ...
// The worker runs every entry through ew_op<F, arity> (elementwise.h: the built-in ops' vector and element loops --
// strides, broadcast, fp16/bf16 -- with the functor's own code), dispatched on (op id, slot) by user_exec() in
// worker.cu.
#pragma once
#include "device_src/config.h"
#include "device_src/functors.h"

#define GPUOS_USER_OPS_GENERATED 0
#define GPUOS_USER_OPS(X)
// Tier 2 of fused chains: programs the scheduler ran often get straight-line code in a later generation,
//   namespace gpuos_fused_<prog> { struct F { static constexpr u32 kInputs = n; eval(const float* x) } }
//   #define GPUOS_FUSED_SPECS(X) X(prog, ::gpuos_fused_<prog>::F) ...
// exec_fused() in worker.cu runs a listed program through it and every other one through the interpreter.
#define GPUOS_FUSED_SPECS(X)
