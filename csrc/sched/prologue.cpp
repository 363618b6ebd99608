// csrc/sched/prologue.cpp -- see prologue.h.
#include "sched/prologue.h"

#include <algorithm>
#include <unordered_map>

#include "inject/registry.h"
#include "inject/specialize.h"
#include "ops/op_table.h"
#include "sched/rewrite.h"
#include "tensor/record.h"
#include "tensor/tensor.h"

namespace gpuos {

// Matmul prologues (g_mm_prologue). Group j -- a fused group (a norm's row program; any chain) with a contiguous
// 16-bit output of M rows of K, M x K <= kMmPrologueElems -- whose output is read only by later 2-D matmuls, each
// as its whole `a` (a contiguous M x K view, no bias, a weight and product of a's dtype), that no one else holds
// (Python, other ops), and whose leaves nothing before the last of them writes: each matmul can evaluate the group
// itself (device_src/matmul.h mm_prologue), and the group's level goes -- Llama's RMSNorm before q / k / v.
std::vector<int> prologue_sources(const std::vector<DeferredOp>& ops,
                                  const std::vector<std::array<int, kDeferredMaxIn>>& child,
                                  const std::vector<char>& dropped, const std::vector<char>& fused_away,
                                  const std::vector<char>& moved) {
  const int n = (int)ops.size();
  std::vector<int> src(n, -1);
  // Candidates first (most flushes have none: no map is built for them), then the readers of their outputs.
  std::unordered_map<const void*, std::vector<std::pair<int, int>>> readers;  // storage -> (op, operand)
  std::vector<int> cand;
  for (int j = 0; j < n; ++j) {
    const DeferredOp& g = ops[j];
    if (dropped[j] || fused_away[j] || moved[j] || !g.elementwise() || !g.fresh || !g.out.defined() ||
        !g.out.is_contiguous() || g.out.dim() < 1 || g.out.size(-1) <= 0)
      continue;
    if (child[j][0] < 0 && child[j][1] < 0 && child[j][2] < 0 && child[j][3] < 0) continue;  // not a group
    const auto dt = g.out.scalar_type();
    if ((dt != at::kHalf && dt != at::kBFloat16) || g.out.numel() > (int64_t)kMmPrologueElems) continue;
    cand.push_back(j);
    readers[storage_of(g.out)];
  }
  if (cand.empty()) return src;
  for (int i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    for (uint32_t k = 0; k < kDeferredMaxIn; ++k)
      if (ops[i].in[k].defined() && ops[i].in[k].has_storage())
        if (const auto r = readers.find(storage_of(ops[i].in[k])); r != readers.end()) r->second.push_back({i, (int)k});
  }
  for (int j : cand) {
    const DeferredOp& g = ops[j];
    const auto dt = g.out.scalar_type();
    const int64_t K = g.out.size(-1);
    const std::vector<std::pair<int, int>>& rd = readers.at(storage_of(g.out));
    if (rd.empty()) continue;
    bool ok = !written_between(ops, (size_t)j + 1, (size_t)n, g.out);
    int last = j;
    for (const auto& [i, k] : rd) {
      const DeferredOp& p = ops[i];
      const at::Tensor& a = p.in[0];
      ok = ok && i > j && k == 0 && p.matmul && !moved[i] && a.dim() == 2 && !p.in[2].defined() &&
           a.data_ptr() == g.out.data_ptr() && a.numel() == g.out.numel() && a.is_contiguous() && a.size(1) == K &&
           a.scalar_type() == dt && p.in[1].scalar_type() == dt && p.out.scalar_type() == dt && p.out.dim() == 2;
      last = std::max(last, i);
    }
    if (!ok) continue;
    // No one else holds the output: its storage is held by it and the readers' views (each view once), Python sees
    // neither, and a view's _base is the output itself.
    std::vector<std::pair<const at::Tensor*, long>> views;
    long direct = 0, base_refs = 0;
    for (const auto& [i, k] : rd) {
      const at::Tensor& a = ops[i].in[0];
      if (a.unsafeGetTensorImpl() == g.out.unsafeGetTensorImpl()) {
        ++direct;
        continue;
      }
      auto v = std::find_if(views.begin(), views.end(),
                            [&](const auto& e) { return e.first->unsafeGetTensorImpl() == a.unsafeGetTensorImpl(); });
      if (v != views.end()) {
        ++v->second;
        continue;
      }
      if (!a.is_view() || a._base().unsafeGetTensorImpl() != g.out.unsafeGetTensorImpl()) ok = false;
      views.push_back({&a, 1});
      ++base_refs;
    }
    if (!ok || (long)g.out.storage().use_count() != 1 + (long)views.size() ||
        !dead_to_python(g.out, 1 + direct + base_refs))
      continue;
    for (const auto& [v, uses] : views) ok = ok && dead_to_python(*v, uses);
    // The group runs at each reader's place: nothing up to the last may write its leaves, nor may a reader's output
    // overlap them.
    std::vector<int> stack(1, j);
    while (ok && !stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      for (uint32_t k = 0; ok && k < ops[x].nin; ++k) {
        if (child[x][k] >= 0) {
          stack.push_back(child[x][k]);
          continue;
        }
        const at::Tensor& leaf = ops[x].in[k];
        if (!leaf.defined()) continue;
        ok = !written_between(ops, (size_t)j + 1, (size_t)last + 1, leaf);
        for (const auto& [i, q] : rd) ok = ok && !partially_overlaps(ops[i].out, leaf, false);
      }
    }
    if (!ok) continue;
    for (const auto& [i, k] : rd) src[i] = j;
  }
  return src;
}

bool emit_prologue(Runtime& rt, const std::vector<DeferredOp>& ops,
                   const std::vector<std::array<int, kDeferredMaxIn>>& child, int j, int i, FusedUnit& u) {
  if (u.pid < 0 && !build_fused(rt, ops, child, j, u)) return false;
  const DeferredOp& p = ops[i];
  if (!record_matmul_prologue_tensors(rt, u.fa, (uint32_t)u.pid, u.ins, u.nin,
                                      dtype_code(ops[j].out.scalar_type()), p.in[1], p.out, p.s0))
    return false;
  note_program_use(u.pid);  // tier 2's code for it once it is hot (mm_prologue runs it through exec_fused_spec)
  return true;
}

}  // namespace gpuos
