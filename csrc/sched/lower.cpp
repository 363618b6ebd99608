// csrc/sched/lower.cpp -- lowering of the deferred ops at a flush: fusion analysis (which producers fold into
// their single consumer), interpreter programs for fused chains, and the recording of every unit.
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>

#include "config/config.h"
#include "inject/registry.h"
#include "inject/specialize.h"
#include "ops/op_table.h"
#include "sched/bytecode.h"
#include "sched/deferred.h"
#include "sched/epilogue.h"
#include "sched/prologue.h"
#include "sched/outpool.h"
#include "sched/rewrite.h"
#include "tensor/attention.h"
#include "tensor/record.h"

namespace gpuos {

// Does Python still see the tensor? PyTorch's PyObject preservation differs between versions: either the
// Python object keeps a strong reference to the TensorImpl (and C++ references beyond it keep the Python
// object alive), or a Python object dropped while C++ holds the tensor is resurrected as a borrowed one.
// calibrate_liveness() finds out which, once; then a tensor whose only references are `ours` (plus the
// preserved Python object, whose own refcount is then 1) is dead to the program.
int g_pyobj_holds_impl = -1;  // -1: not calibrated

void calibrate_liveness() {
  if (g_pyobj_holds_impl >= 0) return;
  at::Tensor held = at::empty({1});
  PyObject* o = THPVariable_Wrap(held);  // a Python object as an op result would have
  if (!o) throw py::error_already_set();
  Py_DECREF(o);                          // the program drops it; C++ still holds `held`
  g_pyobj_holds_impl = held.use_count() >= 2 ? 1 : 0;
}

namespace {
// Python's side of a tensor's liveness: 0 no Python object, 1 only the preserved one (refcount 1), 2 Python holds it.
int8_t py_side(const c10::TensorImpl* impl) {
  PyObject* po = impl->pyobj_slot()->load_pyobj();
  return !po ? 0 : Py_REFCNT(po) == 1 ? 1 : 2;
}

// The timer's analysis runs without the GIL: Python's side of every tensor of the taken ops is read first, under
// the GIL (PySnapshot::take), and dead_to_python answers from it. Sound because dead stays dead: Python cannot
// regain a tensor it holds no object for (a view's base is counted in the tensor's use_count, which is read live).
// A tensor not in the snapshot counts as alive.
struct PySide {
  const c10::TensorImpl* impl;
  int8_t side;
  bool operator<(const PySide& o) const { return impl < o.impl; }
};
thread_local const std::vector<PySide>* t_py_snapshot = nullptr;

struct PySnapshot {
  std::vector<PySide> sides;
  void take(const std::vector<DeferredOp>& ops) {
    sides.reserve(ops.size() * 3);
    const auto add = [&](const at::Tensor& t) {
      if (t.defined()) sides.push_back({t.unsafeGetTensorImpl(), py_side(t.unsafeGetTensorImpl())});
    };
    for (const DeferredOp& o : ops) {
      add(o.out);
      for (const at::Tensor& t : o.in) add(t);
      add(o.written);
      add(o.lse);
    }
    std::sort(sides.begin(), sides.end());
  }
};
struct SnapshotScope {  // dead_to_python reads `s` on this thread while in scope (nullptr: live reads)
  explicit SnapshotScope(const std::vector<PySide>* s) { t_py_snapshot = s; }
  ~SnapshotScope() { t_py_snapshot = nullptr; }
};
}  // namespace

bool dead_to_python(const at::TensorBase& t, long ours) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  int8_t side;
  if (const std::vector<PySide>* snap = t_py_snapshot) {
    const auto it = std::lower_bound(snap->begin(), snap->end(), PySide{impl, 0});
    if (it == snap->end() || it->impl != impl) return false;
    side = it->side;
  } else {
    side = py_side(impl);
  }
  if (side == 2) return false;
  return (long)t.use_count() == ours + (side == 1 ? g_pyobj_holds_impl : 0);
}

namespace {

const c10::TensorImpl* impl_of(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// offset(e) = ((e / div) % mod) * stride of `t` read at linear index e of `shape` (t broadcast to it).
bool fused_rule(const at::Tensor& t, at::IntArrayRef shape, FusedOperand& r) {
  const int64_t nd = (int64_t)shape.size(), td = t.dim();
  r.ptr = (uint64_t)(uintptr_t)t.data_ptr();
  r.stride = 0;
  r.div = 1;
  r.mod = 0;
  int64_t inner = 1;      // product of sizes inside the current dim
  int64_t blk_lo = -1, blk_hi = -1, blk_stride = 0, expect = 0;
  bool outer_bcast = false;
  for (int64_t d = nd - 1; d >= 0; --d) {
    const int64_t sz = shape[d];
    const int64_t td_i = d - (nd - td);
    const int64_t st = (td_i >= 0 && t.size(td_i) != 1) ? t.stride(td_i) : 0;
    if (sz == 1) continue;
    if (st != 0) {
      if (blk_lo >= 0 && blk_lo != d + 1 && blk_hi >= 0) {
        // a second block of strided dims (a zero-stride dim sits between): not one block
        bool gap = false;
        for (int64_t g = d + 1; g < blk_lo; ++g) gap |= shape[g] != 1;
        if (gap) return false;
      }
      if (blk_lo < 0) {
        blk_hi = d;
        blk_stride = st;
        expect = st;
        r.div = (uint32_t)inner;
      }
      if (st != expect) return false;
      expect = st * sz;
      blk_lo = d;
    } else if (blk_lo >= 0) {
      outer_bcast = true;
    }
    inner *= sz;
  }
  if (blk_lo < 0) return true;  // every dim broadcast: one element
  int64_t blk = 1;
  for (int64_t d = blk_lo; d <= blk_hi; ++d) blk *= shape[d];
  r.stride = blk_stride;
  r.mod = outer_bcast ? (uint32_t)blk : 0u;
  if (inner > 0xffffffffll) return false;
  return true;
}

}  // namespace

// sched/epilogue.h.
bool group_nodes(const std::vector<DeferredOp>& ops, const std::vector<std::array<int, kDeferredMaxIn>>& child, int r,
                 std::vector<ExprNode>& nodes, std::vector<const at::Tensor*>& leaves, uint32_t& outv, bool& rows) {
  const DeferredOp& root = ops[r];
  nodes.clear();
  leaves.clear();
  nodes.reserve(2 * kProgMaxInstr);
  leaves.reserve(kProgMaxInputs + 1);
  std::function<uint32_t(int)> visit;  // returns the value index (inputs numbered later: fix-up below)
  // Values: leaves first get provisional ids (1 << 20) + leaf index; nodes get their node index. An op that
  // several members read (the merge pass of lower_deferred) is one node.
  std::unordered_map<int, uint32_t> seen;
  rows = false;
  visit = [&](int i) -> uint32_t {
    if (auto it = seen.find(i); it != seen.end()) return it->second;
    const DeferredOp& o = ops[i];
    ExprNode n{};
    n.op = o.op;
    n.nsrc = o.nin;
    n.s0 = o.s0;
    n.s1 = o.s1;
    if (o.reduce) {  // a row reduction inside the group (row_reduction): r = s0 * fold(src) over the root's rows
      if (o.in[0].sizes() != root.out.sizes()) throw std::invalid_argument("row of another shape");
      n.op = kOpRowRed;
      n.s0 = o.op == kOp_mean ? 1.0f / (float)o.in[0].size(-1) : 1.0f;
      n.s1 = (float)o.op;
      rows = true;
    }
    n.round = (i == r) ? (uint32_t)kF32 : (uint32_t)dtype_code(o.out.scalar_type());
    for (uint32_t k = 0; k < o.nin; ++k) {
      if (child[i][k] >= 0) {
        n.src[k] = visit(child[i][k]);
      } else if (!o.in[k].defined()) {
        ExprNode c{};
        c.op = kOpConst;
        c.s0 = o.cv[k];
        c.round = kF32;
        nodes.push_back(c);
        n.src[k] = (uint32_t)(nodes.size() - 1);
      } else {
        const at::Tensor& t = o.in[k];
        size_t li = 0;
        for (; li < leaves.size(); ++li)
          if (leaves[li]->data_ptr() == t.data_ptr() && leaves[li]->sizes() == t.sizes() &&
              leaves[li]->strides() == t.strides() && leaves[li]->scalar_type() == t.scalar_type())
            break;
        if (li == leaves.size()) leaves.push_back(&t);
        n.src[k] = (1u << 20) + (uint32_t)li;
      }
    }
    nodes.push_back(n);
    return seen[i] = (uint32_t)(nodes.size() - 1);
  };
  try {
    outv = visit(r);
  } catch (const std::invalid_argument&) {
    return false;  // emitted op by op
  }
  const uint32_t nin = (uint32_t)leaves.size();
  if (nin < 1 || nin > kProgMaxInputs) return false;
  for (auto& n : nodes)
    for (uint32_t k = 0; k < n.nsrc; ++k) n.src[k] = n.src[k] >= (1u << 20) ? n.src[k] - (1u << 20) : n.src[k] + nin;
  return true;
}

// sched/prologue.h.
bool build_fused(Runtime& rt, const std::vector<DeferredOp>& ops,
                 const std::vector<std::array<int, kDeferredMaxIn>>& child, int r, FusedUnit& u) {
  const DeferredOp& root = ops[r];
  std::vector<ExprNode> nodes;
  std::vector<const at::Tensor*> leaves;
  uint32_t outv = 0;
  if (!group_nodes(ops, child, r, nodes, leaves, outv, u.rows)) return false;
  const uint32_t nin = (uint32_t)leaves.size();
  FusedArgs& fa = u.fa;
  std::memset((void*)&fa, 0, sizeof fa);
  const at::IntArrayRef shape = root.out.sizes();
  if (!fused_rule(root.out, shape, fa.opnd[0]) || (fa.opnd[0].mod != 0 || fa.opnd[0].div != 1)) return false;
  fa.dtype[0] = (uint8_t)dtype_code(root.out.scalar_type());
  for (uint32_t k = 0; k < nin; ++k) {
    const at::Tensor& t = *leaves[k];
    if (!fused_rule(t, shape, fa.opnd[1 + k])) return false;
    // A leaf in the output's storage must be the output's exact view (read and write at the same index).
    if (storage_of(t) == storage_of(root.out) &&
        !(t.data_ptr() == root.out.data_ptr() && t.sizes() == shape && t.strides() == root.out.strides()))
      return false;
    fa.dtype[1 + k] = (uint8_t)dtype_code(t.scalar_type());
    u.expanded[k] = t.sizes() == shape ? t : t.expand(shape);
    u.ins[k] = operand(u.expanded[k]);
    u.leaves[k] = &t;
  }
  Program prog;
  try {
    prog = build_program(nin, nodes, nin + outv);
  } catch (const std::invalid_argument&) {
    return false;
  }
  u.pid = rt.program_id(prog);
  if (u.pid < 0) return false;
  fa.prog = (uint32_t)u.pid;
  fa.ninputs = nin;
  u.nin = nin;
  return true;
}

namespace {

// Emit op r and the producers fused into it as one interpreter sub-op; false if it cannot be expressed
// (too many inputs/instructions, a layout the fused rule cannot address, a full program table).
bool emit_fused(Runtime& rt, std::vector<DeferredOp>& ops, const std::vector<std::array<int, kDeferredMaxIn>>& child, int r) {
  FusedUnit u;
  if (!build_fused(rt, ops, child, r, u)) return false;
  note_program_use(u.pid);
  const at::Tensor& out = ops[r].out;
  rt.record_fused((uint32_t)u.pid, u.fa, operand(out), u.ins, u.nin, out.numel(), u.rows ? out.size(-1) : 0);
  return true;
}

// A deferred matmul: one product, or one per batch (bmm / baddbmm; a 3-D bias of batch 1 is shared).
void emit_matmul(Runtime& rt, const DeferredOp& o) {
  const at::Tensor &a = o.in[0], &b = o.in[1], &c = o.in[2];
  if (a.dim() == 2) {
    record_matmul_tensors(rt, a, b, c, o.out, o.s0, o.s1);
    return;
  }
  for (int64_t i = 0; i < a.size(0); ++i) {
    at::Tensor ci;
    if (c.defined()) ci = c.dim() == 3 ? c.select(0, c.size(0) == 1 ? 0 : i) : c;
    record_matmul_tensors(rt, a.select(0, i), b.select(0, i), ci, o.out.select(0, i), o.s0, o.s1);
  }
}

void emit_plain(Runtime& rt, const DeferredOp& o) {
  if (o.reduce) record_reduce_tensors(rt, o.op, o.in[0], o.out, o.keepdim);
  else if (o.matmul) emit_matmul(rt, o);
  else if (o.attention)
    record_attention_tensors(rt, o.in[0], o.in[1], o.in[2], o.in[3], o.attn_causal, o.s0, o.out, o.lse, o.written);
  else if (o.data) record_data_tensors(rt, o.op, o.out, o.in, o.nin, o.bits, o.dim, o.ival, o.keepdim);
  else record_ew_tensors(rt, o.op, o.nin, o.out, o.in, o.cv, o.s0, o.s1);
}

// Emit the group rooted at r op by op (its producers first, a producer several members read once),
// materialising every intermediate.
void emit_unfused(Runtime& rt, std::vector<DeferredOp>& ops, const std::vector<std::array<int, kDeferredMaxIn>>& child,
                  int r, std::vector<char>& done) {
  if (done[r]) return;
  done[r] = 1;
  for (uint32_t k = 0; k < ops[r].nin; ++k)
    if (child[r][k] >= 0) emit_unfused(rt, ops, child, child[r][k], done);
  emit_plain(rt, ops[r]);
}

// Longest row a row program takes. One warp runs a row (elementwise.h fused_rows), so its cost grows with the
// row; measured on an H200 (program_probe norm, 6ccd6be, tier 2, us per norm, row program vs the op-by-op
// lowering): RMSNorm 17.0 vs 22.3 at 256, 40.9 vs 30.3 at 768, 193 vs 68 at 4,096; LayerNorm 17.8 vs 39.4,
// 42.8 vs 53.8, 203 vs 154. Longer rows keep the op-by-op lowering.
constexpr int64_t kRowProgramMaxCols = 512;

// A last-dim reduction that can live inside a group (a row program): sum / mean / amax / amin with keepdim
// over a non-empty last dim of at most kRowProgramMaxCols, not switched to injected code.
bool row_reduction(const DeferredOp& red) {
  if (!red.reduce || !red.keepdim || red.nin != 1 || !red.in[0].defined() || red.op >= kNumOps || op_switched(red.op))
    return false;
  if (red.op != kOp_sum && red.op != kOp_mean && red.op != kOp_amax && red.op != kOp_amin) return false;
  const at::Tensor& x = red.in[0];
  return x.dim() >= 1 && x.size(-1) > 0 && x.size(-1) <= kRowProgramMaxCols && red.out.dim() == x.dim() &&
         red.out.size(-1) == 1;
}

// Is `row` the row shape of `full` (its dims, the last one 1)?
bool is_row_of(at::IntArrayRef row, at::IntArrayRef full) {
  if (row.size() != full.size() || row.empty() || row.back() != 1 || full.back() == 1) return false;
  for (size_t d = 0; d + 1 < row.size(); ++d)
    if (row[d] != full[d]) return false;
  return true;
}

// The order in which lower_deferred emits its units (a plain op, or a fused root with its subtree; fused-away
// ops are not units): by dependency level, recording order within a level. A unit's level is 1 + the highest
// level of an earlier unit it must follow (it reads memory that unit writes, or writes memory it reads or
// writes), judged per storage by the union byte range and the highest level of the reads and of the writes
// so far: conservative, so every conflicting pair keeps its recording order. The runtime starts a new batch
// level where a sub-op conflicts with the open level, so emitting level by level lets independent chains share
// levels: recorded in order, W2 without fusion (1,000 interleaved 5-op chains) was 5,000 one-sub-op levels.

}  // namespace

void lower_deferred(int dev, Runtime& rt, const OffGilPublish* off) {
  Deferred& D = deferred_of(dev);
  if (D.ops.empty()) return;
  // Taken out of the queue (GIL and mu held): the queue is empty for the ops recorded from here on.
  std::vector<DeferredOp> ops;
  ops.swap(D.ops);
  if (off) {  // their storages, in flight (D.inflight) once the GIL is let go, until it is back
    D.inflight_touched.clear();
    std::swap(D.inflight_touched, D.touched);
  } else {
    D.touched.clear();
  }
  const CUstream stream = D.stream;
  // Publications during lowering (ring full, early) go on the stream these ops were recorded under.
  rt.set_record_stream(true, stream);
  struct Reset {
    Runtime& rt;
    bool on = true;
    void now() {
      if (on) rt.set_record_stream(false), on = false;
    }
    ~Reset() { now(); }
  } reset{rt};
  using clk = std::chrono::steady_clock;
  const auto ns_since = [](clk::time_point t) { return (uint64_t)std::chrono::nanoseconds(clk::now() - t).count(); };
  auto t0 = clk::now();
  const int n = (int)ops.size();
  // Without the GIL from the analysis to the publication (`off`): recording goes on into the emptied queue. The
  // lock is let go before the GIL is retaken (a thread holding the GIL may be waiting for it, devices.h).
  std::optional<py::gil_scoped_release> nogil;
  const auto regain = [&] {
    if (!nogil) return;
    reset.now();
    // Before mu goes: from then on another thread may lower or stage work no storage tracks (published, or
    // staged for the next flush: a dependency check takes mu for it again).
    D.inflight.store(false, std::memory_order_release);
    off->lk->lk.unlock();
    timer_hold_point(kTimerHoldUnlocked);
    nogil.reset();
    // (GIL held: `inflight` is set only with the GIL. Set again, another timer took the queue while this one
    // waited for the GIL, and the set is its own.)
    if (!D.inflight.load(std::memory_order_acquire)) D.inflight_touched.clear();
  };
  PySnapshot snap;
  if (off) {
    snap.take(ops);  // (the analysis's only reads of Python state)
    D.inflight.store(true, std::memory_order_release);
    D.inflight_untracked = rt.has_pending();  // explicit-API work staged: a dependency check must wait for it
    nogil.emplace();
  }
  struct RegainOnThrow {  // an exception out of the analysis: the GIL back, mu let go first
    const std::function<void()> f;
    bool armed;
    ~RegainOnThrow() {
      if (armed) f();
    }
  } analysis_guard{regain, off != nullptr};
  SnapshotScope snapshot_scope(off ? &snap.sides : nullptr);
  std::vector<std::array<int, kDeferredMaxIn>> child(n, {-1, -1, -1, -1});
  // Folded into another op or unobservable (sched/rewrite.h): neither emitted nor fused.
  const std::vector<char> dropped = g_fusion ? rewrite_deferred(ops, g_sched) : std::vector<char>(n, 0);
  std::vector<char> fused_away(dropped);
  if (g_fusion && n > 1) {
    // Readers of each op's output (by TensorImpl, the producer being the latest writer before the reader).
    std::unordered_map<const c10::TensorImpl*, int> producer;
    producer.reserve((size_t)n * 2);
    std::vector<int> readers(n, 0);
    std::vector<std::array<int, kDeferredMaxIn>> prod_of(n, {-1, -1, -1, -1});
    for (int j = 0; j < n; ++j) {
      const DeferredOp& o = ops[j];
      if (dropped[j]) continue;
      for (uint32_t k = 0; k < o.nin; ++k) {
        if (!o.in[k].defined()) continue;
        auto it = producer.find(impl_of(o.in[k]));
        if (it != producer.end()) {
          readers[it->second]++;
          prod_of[j][k] = it->second;
        }
      }
      producer[impl_of(o.out)] = j;
    }
    // Instruction budget, first op of each subtree, and how many ops before each position write memory they
    // did not allocate (in-place / out= ops): only those can be a write hazard for a subtree.
    std::vector<int> size(n, 1), first(n), not_fresh(n + 1, 0);
    for (int m = 0; m < n; ++m) not_fresh[m + 1] = not_fresh[m] + (ops[m].fresh ? 0 : 1);
    std::vector<int> stack, parent(n, -1);
    // Nothing between position `from` + 1 and `at` may write memory the subtree of i reads (the group is
    // evaluated at `at`): checked against the subtree's leaves when such a writer exists.
    const auto leaves_unwritten = [&](int i, int from, int at) {
      if (not_fresh[at] == not_fresh[from + 1]) return true;
      for (int m = from + 1; m < at; ++m) {
        if (ops[m].fresh) continue;
        const void* w = storage_of(ops[m].out);
        stack.assign(1, i);
        while (!stack.empty()) {
          const int x = stack.back();
          stack.pop_back();
          for (uint32_t q = 0; q < ops[x].nin; ++q) {
            if (child[x][q] >= 0) stack.push_back(child[x][q]);
            else if (ops[x].in[q].defined() && storage_of(ops[x].in[q]) == w) return false;
          }
        }
      }
      return true;
    };
    // Shapes: a group is evaluated over its root's shape. Its members have that shape, or -- with a last-dim
    // reduction inside (a row program) -- the row shape (RMSNorm's mean, + eps and rsqrt: dims but the last,
    // then 1), whose values are recomputed for each element of the row. rows[j]: the shape the reductions of
    // j's subtree fold (their input's), empty if none; it must be the root's (checked again at emission).
    std::vector<std::vector<int64_t>> rows(n);
    // Fold producer i into consumer j (operand k): elementwise producers of the consumer's shape, or of its row
    // shape when the group has a reduction; a row reduction (row_reduction), after it takes its own producer
    // (undone if the reduction cannot join). Switched built-ins run their slot-1 code, which the interpreter
    // does not have, and injected ops (ids >= kNumOps) are not in it: never fused.
    std::function<bool(int, int, uint32_t)> try_fuse = [&](int i, int j, uint32_t k) -> bool {
      const DeferredOp& o = ops[j];
      const DeferredOp& p = ops[i];
      const at::IntArrayRef os = o.out.sizes(), ps = p.out.sizes();
      std::vector<int64_t> full = rows[i];  // the group's row shape after the fusion
      bool ok;
      if (o.reduce) {  // j is a row reduction taking the values it folds
        ok = k == 0 && p.elementwise();
        if (full.empty()) full = p.out.sizes().vec();
      } else if (p.reduce) {
        ok = g_row_fusion && row_reduction(p) && (os == p.in[0].sizes() || os == ps);
        full = p.in[0].sizes().vec();
      } else {
        ok = p.elementwise() && (ps == os || is_row_of(ps, os));
      }
      if (!rows[j].empty()) {
        if (!full.empty() && full != rows[j]) ok = false;
        full = rows[j];
      }
      if (!full.empty() && !(os == at::IntArrayRef(full) || is_row_of(os, full))) ok = false;
      if (full.empty() && ps != os) ok = false;  // no reduction: one shape, as before
      if (!ok || !p.fresh || fused_away[i] || readers[i] != 1 || j - i > 64 || p.op >= kNumOps || o.op >= kNumOps ||
          op_switched(p.op) || op_switched(o.op) || !dead_to_python(p.out, 2) || p.out.storage().use_count() != 1)
        return false;
      const int first_i = first[i], size_i = size[i], pi = p.reduce ? prod_of[i][0] : -1;
      const std::vector<int64_t> rows_i = rows[i];
      if (p.reduce && rows[i].empty()) rows[i] = full;
      const bool took = pi >= 0 && try_fuse(pi, i, 0);
      if (size[i] + size[j] > (int)kProgMaxInstr / 2 || !leaves_unwritten(i, first[i], j)) {
        if (took) child[i][0] = -1, fused_away[pi] = 0, parent[pi] = -1, first[i] = first_i, size[i] = size_i;
        rows[i] = rows_i;
        return false;
      }
      child[j][k] = i;
      fused_away[i] = 1;
      parent[i] = j;
      size[j] += size[i];
      first[j] = std::min(first[j], first[i]);
      rows[j] = full;
      return true;
    };
    for (int j = 0; j < n; ++j) {
      first[j] = j;
      if (!ops[j].elementwise()) continue;
      for (uint32_t k = 0; k < ops[j].nin; ++k)
        if (prod_of[j][k] >= 0) try_fuse(prod_of[j][k], j, k);
    }
    // A producer that several members of one group read (RMSNorm's x.float(), LayerNorm's x - mean) joins it
    // as one shared node; latest first, since a merge can bring an earlier producer's readers into one group.
    const auto root_of = [&](int i) {
      while (parent[i] >= 0) i = parent[i];
      return i;
    };
    for (int i = n - 1; g_row_fusion && i >= 0; --i) {
      const DeferredOp& p = ops[i];
      if (fused_away[i] || readers[i] < 2 || !p.elementwise() || !p.fresh || p.op >= kNumOps || op_switched(p.op))
        continue;
      int root = -1, count = 0;
      bool ok = true;
      for (int j = i + 1; ok && j < n && j - i <= 64; ++j)
        for (uint32_t k = 0; ok && k < ops[j].nin; ++k) {
          if (prod_of[j][k] != i) continue;
          ++count;
          const int r = root_of(j);
          ok = (root < 0 || root == r) &&
               (ops[j].elementwise() ? ops[j].in[k].sizes() == ops[j].out.sizes() : ops[j].reduce && fused_away[j]);
          root = r;
        }
      if (root >= 0 && !rows[i].empty() && rows[i] != rows[root] &&
          !(rows[root].empty() && ops[root].out.sizes() == at::IntArrayRef(rows[i])))
        ok = false;
      if (!ok || root < 0 || count != readers[i] || root - first[i] > 64 || size[root] + size[i] > (int)kProgMaxInstr / 2 ||
          !dead_to_python(p.out, 1 + readers[i]) || p.out.storage().use_count() != 1 || !leaves_unwritten(i, first[i], root))
        continue;
      for (int j = i + 1; j <= root; ++j)
        for (uint32_t k = 0; k < ops[j].nin; ++k)
          if (prod_of[j][k] == i) child[j][k] = i, parent[i] = j;
      fused_away[i] = 1;
      size[root] += size[i];
      first[root] = std::min(first[root], first[i]);
      if (rows[root].empty()) rows[root] = rows[i];
    }
  }
  // Units (a plain op, or a fused root with its subtree) in recording order: the runtime gives each sub-op its
  // dependency level (core/hazards.h), so independent chains share levels whatever the order.
  std::vector<char> elided(n, 0);  // fused away into an emitted interpreter sub-op: never written
  // Keep every tensor alive until publication (the publish hook moves them to the release list): moved, as
  // the ops are dropped (no reference-count traffic). Also done when lowering throws: the sub-ops staged
  // before the failing one still reference them (the failed ops have left the queue, or every later flush --
  // any thread's context exit, the timer, shutdown -- would raise the same error again). After a publication
  // without the GIL they are published already: straight to the release lists.
  DeviceState& ds = device_state(dev);
  bool published = false;
  const auto release = [&] {
    const auto keep = [&](at::Tensor&& t) {
      if (published) release_tensor(dev, std::move(t));
      else keep_tensor(dev, std::move(t));
    };
    for (int j = 0; j < n; ++j) {
      DeferredOp& o = ops[j];
      if (ds.capture && o.fresh && o.out.defined() && o.out.has_storage()) {  // a program's own buffer
        const uint64_t lo = (uint64_t)(uintptr_t)o.out.storage().data();
        ds.fresh.emplace_back(lo, lo + (uint64_t)o.out.storage().nbytes());
      }
      // (Not while capturing: the program keeps the storage, and a later op must not be handed it.)
      if ((elided[j] || dropped[j]) && o.fresh && !ds.capture) pool_put(dev, stream, o.out.storage());
      if (o.out.defined()) keep(std::move(o.out));
      for (auto& t : o.in) if (t.defined()) keep(std::move(t));
      if (o.written.defined()) keep(std::move(o.written));
      if (o.lse.defined()) keep(std::move(o.lse));
    }
    ops.clear();
  };
  std::vector<char> emitted(n, 0);  // emit_unfused: ops of a group already emitted one by one
  // Activation epilogues: epi_src[j] = i when group j runs as matmul i's epilogue (i is then emitted at j);
  // epi_src2[j] = i2 >= 0 when it is a dual item's (products i and i2, both emitted at j).
  std::vector<int> epi_src(n, -1), epi_src2(n, -1);
  std::vector<char> moved(n, 0);
  if (g_fusion && g_mm_epilogue && env_config().mm_epilogue) {
    std::unordered_map<const void*, int> mm;  // output storage -> the latest matmul writing it
    for (int q = 0; q < n; ++q) {
      if (dropped[q] || fused_away[q]) continue;
      if (ops[q].matmul) {
        if (ops[q].in[0].dim() == 2) mm[storage_of(ops[q].out)] = q;
        continue;
      }
      const auto src = epilogue_sources(ops, child, mm, q);
      for (int k = 0; k < 2; ++k)
        if (src[k] >= 0) moved[src[k]] = 1, mm.erase(storage_of(ops[src[k]].out));
      epi_src[q] = src[0], epi_src2[q] = src[1];
    }
  }
  // Prologues: pro_src[i] = g when matmul i evaluates group g itself (g is then not emitted at its place; if a
  // reader's prologue is refused, g is emitted once before that reader: `materialized`).
  std::vector<int> pro_src(n, -1);
  std::vector<char> held(n, 0), materialized(n, 0), pro_counted(n, 0);
  std::unordered_map<int, FusedUnit> units;
  if (g_fusion && g_mm_prologue && env_config().mm_prologue) {
    pro_src = prologue_sources(ops, child, dropped, fused_away, moved);
    for (int i = 0; i < n; ++i) {
      if (pro_src[i] >= 0 && epi_src[pro_src[i]] >= 0) pro_src[i] = -1;  // that group runs as an epilogue
      if (pro_src[i] >= 0) held[pro_src[i]] = 1;
    }
  }
  // Elide group j's members (not j itself, whose output is written) and count the group.
  const auto count_group = [&](int j) {
    int members = 0;
    bool row = false;
    std::function<void(int)> count = [&](int i) {
      if (i != j && elided[i]) return;  // a shared producer: counted once
      ++members;
      row |= ops[i].reduce;
      elided[i] = i != j;
      for (int c : child[i]) if (c >= 0) count(c);
    };
    count(j);
    g_sched.fused_groups++;
    g_sched.fused_ops += members;
    g_sched.row_groups += row ? 1 : 0;
  };
  // Everything above reads Python's view of the tensors (dead_to_python, from the snapshot without the GIL): the
  // analysis, counted as such.
  analysis_guard.armed = false;
  g_sched.analyse_ns += ns_since(t0);
  t0 = clk::now();
  int j = 0;
  try {
    for (; j < n; ++j) {
      if (fused_away[j] || moved[j] || held[j]) continue;
      if (const int g = pro_src[j]; g >= 0 && !materialized[g]) {
        if (emit_prologue(rt, ops, child, g, j, units[g])) {
          if (!pro_counted[g]) count_group(g), elided[g] = 1, pro_counted[g] = 1, g_sched.prologues++;
          continue;
        }
        // Refused (the runtime's path): the group here, once, then this product as usual. Its members stay
        // elided (fused: never written); a group emitted op by op writes them.
        materialized[g] = 1, elided[g] = 0;
        if (!emit_fused(rt, ops, child, g)) {
          emit_unfused(rt, ops, child, g, emitted);
          if (pro_counted[g]) {
            std::vector<int> st(1, g);
            while (!st.empty()) {
              const int x = st.back();
              st.pop_back();
              elided[x] = 0;
              for (int c : child[x]) if (c >= 0) st.push_back(c);
            }
          }
        } else if (!pro_counted[g]) {
          count_group(g);
        }
      }
      if (epi_src[j] >= 0) {
        const int i = epi_src[j], i2 = epi_src2[j];
        if (emit_epilogue(rt, ops, child, i, i2, j)) {
          if (child[j][0] >= 0 || child[j][1] >= 0 || child[j][2] >= 0 || child[j][3] >= 0) count_group(j);
          elided[i] = 1;  // the products' own buffers are never written
          if (i2 >= 0) elided[i2] = 1, g_sched.dual_epilogues++;
          g_sched.act_epilogues++;
          continue;
        }
        // Not one program after all: the products here (nothing between wrote their operands), then the group
        // as it would have gone.
        emit_matmul(rt, ops[std::min(i, i2 >= 0 ? i2 : i)]);
        if (i2 >= 0) emit_matmul(rt, ops[std::max(i, i2)]);
      }
      const bool has_child = child[j][0] >= 0 || child[j][1] >= 0 || child[j][2] >= 0 || child[j][3] >= 0;
      if (!has_child) {
        emit_plain(rt, ops[j]);
        continue;
      }
      if (emit_fused(rt, ops, child, j)) count_group(j);
      else emit_unfused(rt, ops, child, j, emitted);
    }
  } catch (...) {
    regain();
    release();  // the sub-ops staged before the failing unit are published by the next flush
    throw;
  }
  g_sched.emit_ns += ns_since(t0);
  if (off) {
    try {
      reset.now();  // (as sched_publish's own publication: after lowering)
      off->publish(stream);
    } catch (...) {
      regain();
      release();  // (staged, not published: kept for the next flush)
      throw;
    }
    published = true;
    regain();
  }
  t0 = clk::now();
  g_sched.flushed_ops += ops.size();
  release();
  g_sched.keep_ns += ns_since(t0);
}

}  // namespace gpuos
