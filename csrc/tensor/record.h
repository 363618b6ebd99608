// csrc/tensor/record.h -- THE tensor-to-runtime recording: validated tensors -> Operands / TensorRefs -> one
// Runtime::record_* call. The explicit API and the scheduler's lowering both record through these.
#pragma once
#include "tensor/tensor.h"

namespace gpuos {

// out = op(ins; s0, s1) (undefined ins[k]: the constant cv[k]); inputs are broadcast to out's shape as stride-0
// views. Caller holds the runtime's lock and keeps the tensors alive until publication.
void record_ew_tensors(Runtime& rt, uint32_t op, uint32_t arity, const at::Tensor& out, const at::Tensor* ins,
                       const float* cv, float s0, float s1);
// out = alpha * a @ b + beta * bias (bias undefined: none; else broadcastable to out), a, b, out 2-D; epilogue >= 0:
// each output value, rounded to product_dtype (a DType code), through that program (kFlagMmEpilogue); kMmCastOnly:
// rounded only (kFlagMmCast).
void record_matmul_tensors(Runtime& rt, const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                           const at::Tensor& out, float alpha, float beta, int32_t epilogue = -1,
                           uint32_t product_dtype = 0);
// out = prog(round(alpha * a @ b), round(alpha * a @ b2)) as one dual item per tile (Runtime::record_matmul_dual);
// false -- nothing recorded -- where that path does not take the products.
bool record_matmul_dual_tensors(Runtime& rt, const at::Tensor& a, const at::Tensor& b, const at::Tensor& b2,
                                const at::Tensor& out, float alpha, int32_t epilogue, uint32_t product_dtype);
// out = alpha * a @ b where a (a_dtype, M x K: b's K rows, out's M rows) is the output of the fused program `prog`
// with arguments `fa` (its inputs `reads`), evaluated by each item (Runtime::record_matmul_prologue); false --
// nothing recorded -- where that path does not take the product.
bool record_matmul_prologue_tensors(Runtime& rt, const FusedArgs& fa, uint32_t prog, const Operand* reads,
                                    uint32_t nread, uint32_t a_dtype, const at::Tensor& b, const at::Tensor& out,
                                    float alpha);
// A last-dim reduction of x into out (softmax / log_softmax: out has x's shape).
void record_reduce_tensors(Runtime& rt, uint32_t op, const at::Tensor& x, const at::Tensor& out, bool keepdim);

}  // namespace gpuos

namespace gpuos {

// A data-movement op (ops.def kind 4, device_src/dataops.h); the scheduler's checks (sched/record_data.cpp) hold:
//   gather:  out = ins[0] (w) indexed along `dim` by ins[1] (idx; out = w[:dim] + idx.shape + w[dim+1:])
//   scatter: out (self) along `dim` at ins[1] (1-D idx) = ins[0] (src of self's shape but idx's length at dim);
//            ival 1: negative indices count from the end
//   argmax:  out (int64) = argmax over ins[0]'s last dim (keepdim: out keeps it as 1)
//   where:   out = ins[0] ? ins[1] : ins[2]; add_int: out = ins[0] + ival * ins[1]; mul_int: out = ins[0] * ins[1]
//   arange:  out[e] = bits[0] + e * bits[1]; fill: out[e] = bits[0]
// Undefined ins[k]: the constant bits[k] (bits of out's dtype; an integer for the integer ops).
// The descriptor, TensorRefs and iteration space of a data-movement op (shared by the recording and the CPU
// evaluation of gpuos_ext._testing.cpu_data); `hold` keeps the views the refs describe alive.
struct DataPlan {
  SubOp proto{};
  TensorRef refs[4] = {};
  uint32_t nref = 0;
  uint64_t total = 0, per_tile = kTileElems;
  at::Tensor hold[3];
  std::vector<at::Tensor> reads;
};
DataPlan plan_data(uint32_t op, const at::Tensor& out, const at::Tensor* ins, uint32_t nin, const uint64_t* bits,
                   int64_t dim, int64_t ival, bool keepdim);
void record_data_tensors(Runtime& rt, uint32_t op, const at::Tensor& out, const at::Tensor* ins, uint32_t nin,
                         const uint64_t* bits, int64_t dim, int64_t ival, bool keepdim);

}  // namespace gpuos
