// csrc/tensor/record.h -- THE tensor-to-runtime recording: validated tensors -> Operands / TensorRefs -> one
// Runtime::record_* call. The explicit API and the scheduler's lowering both record through these.
#pragma once
#include "tensor/tensor.h"

namespace gpuos {

// out = op(ins; s0, s1) (undefined ins[k]: the constant cv[k]); inputs are broadcast to out's shape as stride-0
// views. Caller holds the runtime's lock and keeps the tensors alive until publication.
void record_ew_tensors(Runtime& rt, uint32_t op, uint32_t arity, const at::Tensor& out, const at::Tensor* ins,
                       const float* cv, float s0, float s1);
// out = alpha * a @ b + beta * bias (bias undefined: none; else broadcastable to out), a, b, out 2-D.
void record_matmul_tensors(Runtime& rt, const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                           const at::Tensor& out, float alpha, float beta);
// A last-dim reduction of x into out (softmax / log_softmax: out has x's shape).
void record_reduce_tensors(Runtime& rt, uint32_t op, const at::Tensor& x, const at::Tensor& out, bool keepdim);

}  // namespace gpuos
