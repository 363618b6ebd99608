// csrc/sched/epilogue.cpp -- see epilogue.h.
#include "sched/epilogue.h"

#include <algorithm>

#include "inject/registry.h"
#include "inject/specialize.h"
#include "ops/op_table.h"
#include "sched/rewrite.h"
#include "tensor/record.h"
#include "tensor/tensor.h"

namespace gpuos {

namespace {

// Whether `leaf` -- read `refs` times by group j (its root ops[j]) and nothing else of it -- is the whole unread
// result of an earlier 2-D matmul (mm: the latest matmul before j by output storage) that can move to j. Returns
// the matmul's index, or -1. Only the group reads the product: its storage is held by the matmul's output and the
// group's view of it (and the view's _base, a reference Python cannot use), or the group reads the output itself.
// The view's _base may also be an alias of the output that only the view holds: F.linear's _unsafe_view of its mm,
// then the LM head's logits[:, -1].
int unread_product(const std::vector<DeferredOp>& ops, const std::unordered_map<const void*, int>& mm,
                   const at::Tensor& leaf, long refs, int j) {
  const DeferredOp& root = ops[j];
  const auto it = mm.find(storage_of(leaf));
  if (it == mm.end()) return -1;
  const int i = it->second;
  const DeferredOp& p = ops[i];
  if (!is_matmul_result(p, leaf) || p.in[0].dim() != 2 || !p.fresh || leaf.sizes() != root.out.sizes()) return -1;
  if (leaf.unsafeGetTensorImpl() == p.out.unsafeGetTensorImpl()) {
    if (p.out.storage().use_count() != 1 || !dead_to_python(p.out, 1 + refs)) return -1;
  } else {
    long base_ref = 0, holders = 2;
    if (leaf.is_view()) {
      const at::TensorBase& b = leaf._base();  // (the leaf's storage: the product's, checked above)
      if (b.unsafeGetTensorImpl() == p.out.unsafeGetTensorImpl()) base_ref = 1;
      else if (!b.is_view() && b.data_ptr() == p.out.data_ptr() && b.numel() == p.out.numel() &&
               b.scalar_type() == p.out.scalar_type() && b.is_contiguous() && dead_to_python(b, 1))
        holders = 3;
    }
    if ((long)p.out.storage().use_count() != holders || !dead_to_python(p.out, 1 + base_ref) ||
        !dead_to_python(leaf, refs))
      return -1;
  }
  // The product moves from i to j: nothing in between may write its operands or its output, and the group's
  // output (written while the items read the operands) must not overlap them.
  for (uint32_t k = 0; k < 3; ++k)
    if (p.in[k].defined() && (written_between(ops, (size_t)i + 1, (size_t)j, p.in[k]) ||
                              partially_overlaps(root.out, p.in[k], false)))
      return -1;
  if (written_between(ops, (size_t)i + 1, (size_t)j, p.out)) return -1;
  return i;
}

bool same_view(const at::Tensor& x, const at::Tensor& y) {
  return x.data_ptr() == y.data_ptr() && x.sizes() == y.sizes() && x.strides() == y.strides() &&
         x.scalar_type() == y.scalar_type();
}

}  // namespace

// Activation epilogues (g_mm_epilogue). Group j -- elementwise ops, no row reduction -- whose tensor inputs are
// the whole results of earlier 2-D matmuls (through their views: F.linear's mm read back through _unsafe_view,
// GPT-2's addmm through view) that nothing else reads, of the group's shape, with a contiguous float output that
// does not overlap the matmuls' operands, and nothing between them writing those (unread_product): the matmul can
// run at j, every output value (rounded to the product's dtype) through the group's program, writing the group's
// output in its dtype -- one level instead of two (GPT-2's NewGELU after c_fc, an MLP's activation, a lone cast:
// the LM head's logits .float()). Two such inputs -- Llama's silu(gate) * up -- qualify when both products have
// the same activations `a`, no bias, one alpha, one dtype (a dual item: Runtime::record_matmul_dual). Returns the
// matmuls' indices in the order of their first read, {-1, -1} if none, {i, -1} for one.
std::array<int, 2> epilogue_sources(const std::vector<DeferredOp>& ops,
                                    const std::vector<std::array<int, kDeferredMaxIn>>& child,
                                    const std::unordered_map<const void*, int>& mm, int j) {
  constexpr std::array<int, 2> kNone = {-1, -1};
  const DeferredOp& root = ops[j];
  if (!root.out.defined() || !root.out.is_contiguous()) return kNone;
  const auto odt = root.out.scalar_type();  // any float output: a cast epilogue (the LM head's logits .float())
  if (odt != at::kFloat && odt != at::kHalf && odt != at::kBFloat16) return kNone;
  const at::Tensor* leaf[2] = {nullptr, nullptr};
  long refs[2] = {0, 0};  // the group's references to each leaf's TensorImpl
  std::vector<int> stack(1, j), seen;  // (a producer several members read is one member)
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    if (std::find(seen.begin(), seen.end(), x) != seen.end()) continue;
    seen.push_back(x);
    const DeferredOp& o = ops[x];
    if (!o.elementwise() || o.op >= kNumOps || op_switched(o.op)) return kNone;
    for (uint32_t k = 0; k < o.nin; ++k) {
      if (child[x][k] >= 0) {
        stack.push_back(child[x][k]);
      } else if (o.in[k].defined()) {
        const auto* impl = o.in[k].unsafeGetTensorImpl();
        int l = 0;
        while (l < 2 && leaf[l] && leaf[l]->unsafeGetTensorImpl() != impl) ++l;
        if (l == 2) return kNone;  // a third input
        if (!leaf[l]) leaf[l] = &o.in[k];
        ++refs[l];
      }
    }
  }
  if (!leaf[0]) return kNone;
  const int i0 = unread_product(ops, mm, *leaf[0], refs[0], j);
  if (i0 < 0 || !leaf[1]) return {i0, -1};
  const int i1 = unread_product(ops, mm, *leaf[1], refs[1], j);
  if (i1 < 0 || i1 == i0) return kNone;
  const DeferredOp &p0 = ops[i0], &p1 = ops[i1];
  if (!same_view(p0.in[0], p1.in[0]) || p0.in[2].defined() || p1.in[2].defined() || p0.s0 != p1.s0 ||
      p0.out.scalar_type() != p1.out.scalar_type() || p0.in[1].sizes() != p1.in[1].sizes())
    return kNone;
  return {i0, i1};
}

// Matmul i (and i2 >= 0: a dual item's second product) at group j's place, every output value through the group's
// program (a lone cast: rounded only), writing the group's output (epilogue_sources found them); false if the group
// is not one program of its inputs, or the dual path does not take the pair (then all go as before).
bool emit_epilogue(Runtime& rt, const std::vector<DeferredOp>& ops,
                   const std::vector<std::array<int, kDeferredMaxIn>>& child, int i, int i2, int j) {
  std::vector<ExprNode> nodes;
  std::vector<const at::Tensor*> leaves;
  uint32_t outv = 0;
  bool rows = false;
  const uint32_t nin = i2 >= 0 ? 2u : 1u;
  if (!group_nodes(ops, child, j, nodes, leaves, outv, rows) || rows || leaves.size() != nin) return false;
  const DeferredOp& p = ops[i];
  const at::Tensor& out = ops[j].out;
  const at::Tensor out2 = out.view({p.out.size(0), p.out.size(1)});
  const uint32_t pdt = dtype_code(p.out.scalar_type());
  if (nin == 1 && nodes.size() == 1 && nodes[0].op == kOp_copy) {  // a lone cast: no program (kFlagMmCast)
    record_matmul_tensors(rt, p.in[0], p.in[1], p.in[2], out2, p.s0, p.s1, kMmCastOnly, pdt);
    return true;
  }
  Program prog;
  try {
    prog = build_program(nin, nodes, nin + outv);
  } catch (const std::invalid_argument&) {
    return false;
  }
  const int32_t pid = rt.program_id(prog);
  if (pid < 0) return false;
  if (nin == 2) {
    // Program input 0 is leaves[0]: the product whose storage it reads is the item's first weight.
    const bool first = storage_of(*leaves[0]) == storage_of(p.out);
    const DeferredOp &x0 = first ? p : ops[i2], &x1 = first ? ops[i2] : p;
    if (!record_matmul_dual_tensors(rt, p.in[0], x0.in[1], x1.in[1], out2, p.s0, pid, pdt)) return false;
  } else {
    record_matmul_tensors(rt, p.in[0], p.in[1], p.in[2], out2, p.s0, p.s1, pid, pdt);
  }
  note_program_use(pid);  // tier 2's code for it (worker.cu epi_spec) once it is hot
  return true;
}

}  // namespace gpuos
