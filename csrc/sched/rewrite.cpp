// csrc/sched/rewrite.cpp -- rewrites of the deferred queue that remove levels from a step (see rewrite.h).
#include "sched/rewrite.h"

#include <unordered_map>

#include "inject/registry.h"
#include "ops/op_table.h"
#include "tensor/tensor.h"

namespace gpuos {
namespace {

// Nobody can read what `o` writes: its output's storage is referenced by this op alone, and Python no longer
// sees the tensor. (Attention writes two views of one buffer and is never dropped.)
bool unobservable(const DeferredOp& o) {
  return !o.attention && o.out.defined() && o.out.has_storage() && o.out.storage().use_count() == 1 &&
         dead_to_python(o.out, 1);
}

}  // namespace

bool written_between(const std::vector<DeferredOp>& ops, size_t from, size_t to, const at::Tensor& t) {
  if (!t.defined()) return false;
  const void* s = storage_of(t);
  for (size_t m = from; m < to; ++m) {
    const DeferredOp& o = ops[m];
    if ((o.out.defined() && storage_of(o.out) == s) || (o.written.defined() && storage_of(o.written) == s))
      return true;
  }
  return false;
}

bool is_matmul_result(const DeferredOp& p, const at::Tensor& t) {
  return p.matmul && p.out.dim() == 2 && t.defined() && storage_of(t) == storage_of(p.out) &&
         t.data_ptr() == p.out.data_ptr() && t.numel() == p.out.numel() && t.is_contiguous() &&
         p.out.is_contiguous() && t.scalar_type() == p.out.scalar_type();
}

namespace {

// out = x + s0 * y (aten::add) where one of x, y is the result of an earlier matmul that nothing else reads, and
// the other has the output's shape: the matmul takes it as its bias (out = alpha * a @ b + beta * bias) and writes
// the add's output, at the add's place in the queue. Llama's residual adds after o_proj and down_proj; GPT-2's
// after its Conv1D addmm, whose bias is first summed with the residual in the matmul's place. `mm`: the latest
// matmul before j by output storage. Returns the index the matmul had (now the bias sum, or to be dropped) and
// its output storage in *prod, or -1.
int fold_residual(std::vector<DeferredOp>& ops, size_t j, const std::unordered_map<const void*, size_t>& mm,
                  const void** prod) {
  DeferredOp& o = ops[j];
  if (!o.elementwise() || o.op != kOp_add || o.nin != 2 || op_switched(o.op) || !o.in[0].defined() ||
      !o.in[1].defined() || !o.out.is_contiguous())
    return -1;
  for (int k = 0; k < 2; ++k) {
    const at::Tensor &mm_view = o.in[k], &res = o.in[1 - k];
    const auto it = mm.find(storage_of(mm_view));
    if (it == mm.end()) continue;
    const size_t i = it->second;
    DeferredOp& p = ops[i];
    if (!is_matmul_result(p, mm_view) || p.in[0].dim() != 2 || !p.fresh) continue;
    const bool bias = p.in[2].defined() && p.s1 != 0.0f;  // beta == 0 ignores the bias (torch.addmm)
    // Only the add reads the product: its storage is held by the matmul's output and the add's view of it. (A view
    // made by x.view(...) -- GPT-2's Conv1D -- also holds the product as its _base: a reference Python cannot use.)
    const long base_ref =
        mm_view.is_view() && mm_view._base().unsafeGetTensorImpl() == p.out.unsafeGetTensorImpl() ? 1 : 0;
    if (p.out.storage().use_count() != 2 || !dead_to_python(p.out, 1 + base_ref) || !dead_to_python(mm_view, 1))
      continue;
    if (res.sizes() != o.out.sizes() || mm_view.sizes() != o.out.sizes() || !res.is_contiguous() ||
        res.scalar_type() != p.out.scalar_type() || o.out.scalar_type() != p.out.scalar_type())
      continue;
    // The product moves from i to j: nothing in between may write its operands (or its output: then the add
    // would read that op's values). The add's output must not alias them.
    if (written_between(ops, i + 1, j, p.in[0]) || written_between(ops, i + 1, j, p.in[1]) ||
        written_between(ops, i + 1, j, p.out))
      continue;
    // With a bias, bias and residual are summed first, in the matmul's place: that add reads x there.
    if (bias && (written_between(ops, i + 1, j, res) || written_between(ops, i + 1, j, p.in[2]) ||
                 p.in[2].scalar_type() != res.scalar_type()))
      continue;
    if (partially_overlaps(o.out, p.in[0]) || partially_overlaps(o.out, p.in[1]) || partially_overlaps(o.out, res))
      continue;
    const int64_t M = p.out.size(0), N = p.out.size(1);
    *prod = storage_of(p.out);
    DeferredOp f;
    f.op = p.op;
    f.nin = 3;
    f.matmul = true;
    f.fresh = o.fresh;
    // out = res + s0 * (alpha * a @ b + beta * bias)   (k == 1: the product is the add's y)
    //     = alpha * a @ b + beta * bias + s0 * res     (k == 0: the residual is y)
    f.s0 = k == 0 ? p.s0 : p.s0 * o.s0;
    f.s1 = k == 0 ? o.s0 : 1.0f;
    f.in[0] = p.in[0];
    f.in[1] = p.in[1];
    f.in[2] = res.view({M, N});
    f.out = o.out.view({M, N});
    if (bias) {  // the matmul's bias becomes c = x + t * y, computed where the matmul was (off the critical path)
      DeferredOp c;
      c.op = kOp_add;
      c.nin = 2;
      c.fresh = true;
      c.out = p.out;  // the product's own buffer (fresh, M x N, its dtype), which nothing reads now
      if (k == 0) {  // beta * (bias + (s0 / beta) * res)
        c.in[0] = p.in[2], c.in[1] = res.view({M, N}), c.s0 = o.s0 / p.s1;
        f.s1 = p.s1;
      } else {  // res + (s0 * beta) * bias
        c.in[0] = res.view({M, N}), c.in[1] = p.in[2], c.s0 = o.s0 * p.s1;
        f.s1 = 1.0f;
      }
      f.in[2] = c.out;
      ops[j] = std::move(f);
      ops[i] = std::move(c);  // the unread product's tensors go with it
      return (int)i;
    }
    ops[j] = std::move(f);  // the add's tensors are dropped; the matmul's stay in ops[i] until release
    return (int)i;
  }
  return -1;
}

// out_view = copy(t) (same dtype and shape) where t is the fresh result of an elementwise op p in the 64 ops
// before it that only the copy reads: p writes out_view itself, at the copy's place. torch.cat of computed pieces,
// e.g. HF's rotate_half cat((-x2, x1)): the neg writes its half of the output (one level less). Returns p's index,
// or -1.
int fold_into_copy(std::vector<DeferredOp>& ops, size_t j, const std::vector<char>& dropped) {
  DeferredOp& c = ops[j];
  if (!c.elementwise() || c.op != kOp_copy || c.nin != 1 || op_switched(c.op) || !c.in[0].defined()) return -1;
  const c10::TensorImpl* t = c.in[0].unsafeGetTensorImpl();
  for (size_t i = j; i-- > 0 && j - i <= 64;) {
    if (dropped[i] || ops[i].out.unsafeGetTensorImpl() != t) continue;
    DeferredOp& p = ops[i];
    if (!p.elementwise() || !p.fresh || p.op >= kNumOps || op_switched(p.op) || p.out.sizes() != c.out.sizes() ||
        p.out.scalar_type() != c.out.scalar_type() || p.out.storage().use_count() != 1 || !dead_to_python(p.out, 2))
      return -1;
    for (uint32_t k = 0; k < p.nin; ++k)
      if (p.in[k].defined() && (written_between(ops, i + 1, j, p.in[k]) || partially_overlaps(c.out, p.in[k])))
        return -1;
    DeferredOp f = p;  // p's op and operands, writing the copy's output
    f.out = c.out;
    f.fresh = c.fresh;
    ops[j] = std::move(f);
    return (int)i;
  }
  return -1;
}

}  // namespace

std::vector<char> rewrite_deferred(std::vector<DeferredOp>& ops, SchedStats& st) {
  const size_t n = ops.size();
  std::vector<char> dropped(n, 0);
  std::unordered_map<const void*, size_t> mm;  // output storage -> the latest matmul writing it
  for (size_t j = 0; j < n; ++j) {
    if (ops[j].matmul) {
      mm[storage_of(ops[j].out)] = j;
      continue;
    }
    int i = fold_into_copy(ops, j, dropped);
    if (i >= 0) {
      dropped[(size_t)i] = 1, st.copies_folded++;
      continue;
    }
    if (mm.empty()) continue;
    const void* prod = nullptr;
    i = fold_residual(ops, j, mm, &prod);
    if (i >= 0) {
      dropped[(size_t)i] = !ops[(size_t)i].elementwise(), st.epilogues++;  // (with a bias: the bias sum, kept)
      mm.erase(prod);
    }
  }
  for (size_t j = 0; j < n; ++j)
    if (!dropped[j] && unobservable(ops[j])) dropped[j] = 1, st.dead_ops++;
  return dropped;
}

at::Tensor gqa_source(const std::vector<DeferredOp>& ops, size_t n, const at::Tensor& kv) {
  if (kv.dim() != 4 || !kv.is_contiguous()) return kv;
  const void* s = storage_of(kv);
  size_t i = n;
  while (i-- > 0)
    if (ops[i].out.defined() && storage_of(ops[i].out) == s) break;
  if (i >= n) return kv;
  const DeferredOp& c = ops[i];
  if (!c.elementwise() || c.op != kOp_copy || c.nin != 1 || op_switched(c.op) || !c.in[0].defined()) return kv;
  const at::Tensor& x = c.in[0];  // (B, Hkv, R, L, D) with stride 0 over R: x[:, :, None].expand(...)
  if (x.dim() != 5 || x.stride(2) != 0 || x.scalar_type() != kv.scalar_type() || !c.out.is_contiguous() ||
      c.out.data_ptr() != kv.data_ptr() || c.out.numel() != kv.numel())
    return kv;
  if (kv.size(0) != x.size(0) || kv.size(1) != x.size(1) * x.size(2) || kv.size(2) != x.size(3) ||
      kv.size(3) != x.size(4))
    return kv;
  // The copy must still equal x when the attention reads: nothing after it writes x or the copy.
  if (written_between(ops, i + 1, n, x) || written_between(ops, i + 1, n, c.out)) return kv;
  return x.select(2, 0);
}

}  // namespace gpuos
