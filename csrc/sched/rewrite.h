// csrc/sched/rewrite.h -- rewrites of the deferred queue that take levels out of a step. Each keeps what the
// program can observe: values it can read afterwards are those eager would give (up to the rounding of a fused
// epilogue, one rounding instead of two).
//   - A residual add of a matmul's result (out = x + mm(a, b), the product read by nothing else) becomes the
//     matmul with x as its bias, run where the add was: Llama's o_proj / down_proj adds (one level each).
//   - A copy of an elementwise op's fresh result that only the copy reads becomes that op writing the copy's
//     destination: torch.cat of computed pieces (HF's rotate_half: the neg writes its half; one level).
//   - An op whose output nobody can read any more (its storage held by the op alone, the tensor dead to
//     Python) is dropped: HF's repeat_kv copies once the attention reads their source (gqa_source).
#pragma once
#include <vector>

#include "sched/deferred.h"

namespace gpuos {

// Does an op of ops[from, to) write the storage of `t`?
bool written_between(const std::vector<DeferredOp>& ops, size_t from, size_t to, const at::Tensor& t);
// `t` is exactly the output of matmul op p seen through a view (same storage, start and element count; both
// contiguous): the aten::mm that F.linear lowers to, read back through its _unsafe_view.
bool is_matmul_result(const DeferredOp& p, const at::Tensor& t);

// Applies the rewrites in place (called by lower_deferred with fusion on, Runtime::mu held). Returns, per op,
// 1 if it is not to be emitted (its tensors stay in the op until the queue is released). Counts into st.
std::vector<char> rewrite_deferred(std::vector<DeferredOp>& ops, SchedStats& st);

// The attention task does GQA itself. If `kv` (an attention's k or v) is HF's repeat_kv of x -- the output of
// the deferred copy ops[i < n] of x[:, :, None].expand(B, Hkv, R, L, D), reshaped to (B, Hkv * R, L, D) --
// and nothing after that copy writes x or the copy, returns x (B, Hkv, L, D): the attention reads it, and the
// copy, then read by nobody, is dropped at lowering. Otherwise returns kv.
at::Tensor gqa_source(const std::vector<DeferredOp>& ops, size_t n, const at::Tensor& kv);

}  // namespace gpuos
