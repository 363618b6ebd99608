// csrc/tensor/record.cpp -- see record.h.
#include "tensor/record.h"

#include "ops/op_table.h"

namespace gpuos {

void record_ew_tensors(Runtime& rt, uint32_t op, uint32_t arity, const at::Tensor& out, const at::Tensor* ins,
                       const float* cv, float s0, float s1) {
  const int64_t numel = out.numel();
  if (numel == 0) return;
  at::Tensor expanded[3];
  Operand opnd[3];
  for (uint32_t k = 0; k < arity; ++k) {
    if (!ins[k].defined()) {
      opnd[k].is_const = true;
      opnd[k].value = cv[k];
      continue;
    }
    expanded[k] = ins[k].sizes() == out.sizes() ? ins[k] : ins[k].expand(out.sizes());
    opnd[k] = operand(expanded[k]);
  }
  rt.record_ew(op, arity, operand(out), opnd, s0, s1, numel);
}

void record_reduce_tensors(Runtime& rt, uint32_t op, const at::Tensor& x, const at::Tensor& out, bool keepdim) {
  const bool row_out = row_output(op);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? out.numel() : x.numel() / cols;
  if (rows == 0 || out.numel() == 0) return;
  const TensorRef xr = make_ref(x, (int)x.dim());
  TensorRef orf = make_ref(out, row_out ? (int)out.dim() : (int)x.dim() - 1);
  if (!row_out && keepdim) orf = make_ref(out.squeeze(-1), (int)x.dim() - 1);
  rt.record_reduce(op, operand(out), orf, operand(x), xr, rows, cols);
}

void record_matmul_tensors(Runtime& rt, const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                           const at::Tensor& out, float alpha, float beta, int32_t epilogue,
                           uint32_t product_dtype) {
  const int64_t M = out.size(0), N = out.size(1), K = a.size(1);
  if (M == 0 || N == 0) return;
  const TensorRef orf = make_ref(out, 2), arf = make_ref(a, 2), brf = make_ref(b, 2);
  if (!bias.defined()) {
    rt.record_matmul(operand(out), orf, operand(a), arf, operand(b), brf, nullptr, nullptr, M, N, K, alpha, beta,
                     epilogue, product_dtype);
    return;
  }
  const at::Tensor c = bias.expand({M, N});
  const Operand co = operand(c);
  const TensorRef crf = make_ref(c, 2);
  rt.record_matmul(operand(out), orf, operand(a), arf, operand(b), brf, &co, &crf, M, N, K, alpha, beta, epilogue,
                   product_dtype);
}

bool record_matmul_prologue_tensors(Runtime& rt, const FusedArgs& fa, uint32_t prog, const Operand* reads,
                                    uint32_t nread, uint32_t a_dtype, const at::Tensor& b, const at::Tensor& out,
                                    float alpha) {
  const int64_t M = out.size(0), N = out.size(1), K = b.size(0);
  if (M == 0 || N == 0) return false;
  return rt.record_matmul_prologue(operand(out), make_ref(out, 2), a_dtype, fa, prog, reads, nread, operand(b),
                                   make_ref(b, 2), M, N, K, alpha);
}

bool record_matmul_dual_tensors(Runtime& rt, const at::Tensor& a, const at::Tensor& b, const at::Tensor& b2,
                                const at::Tensor& out, float alpha, int32_t epilogue, uint32_t product_dtype) {
  const int64_t M = out.size(0), N = out.size(1), K = a.size(1);
  if (M == 0 || N == 0 || b2.sizes() != b.sizes()) return false;
  return rt.record_matmul_dual(operand(out), make_ref(out, 2), operand(a), make_ref(a, 2), operand(b), make_ref(b, 2),
                               operand(b2), make_ref(b2, 2), M, N, K, alpha, epilogue, product_dtype);
}

}  // namespace gpuos
