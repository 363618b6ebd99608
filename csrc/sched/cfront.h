// csrc/sched/cfront.h -- the scheduler's dispatcher front: a C++ boxed fallback that sees every aten op under a
// GpuosScheduler before PyTorch boxes it into Python objects for the dispatch mode.
//
// A dispatch mode costs ~4.5-5 us per op on a CPU host even with a C++ __torch_dispatch__ (tools/dispatch_overhead.py,
// forty-seventh session: +4.6-5.3 us per op for a mode bound to C++, +0.3-0.7 for a boxed fallback), ~230 ops per
// step of a small HF decoder. While a GpuosScheduler is entered (gpuos/scheduler.py), this thread includes the
// front's dispatch key in its local key set, so the dispatcher calls the fallback first for every op. It
//   - records the fast-spec elementwise ops, functional and in place (the CallSpec table sched_dispatch uses, by
//     operator name), from the dispatcher's stack (sched/record.h ew_record), the GIL held, like sched_dispatch;
//     records what the Python handlers would record from their arguments alone (cfront_native.cpp), KV cache
//     writes (index_copy_) among them -- in place, with ADInplaceOrView's part (cfront_inplace_done);
//   - runs the no-data ops (views, metadata, allocation: sched_set_nodata) below the dispatch modes, as
//     sched_dispatch would run them, when the scheduler is the only mode and every tensor argument is plain;
//   - calls the dispatch mode's handler itself (cfront_call_mode: sched_dispatch, the Python handlers) for the
//     other functional ops with plain tensor arguments none of which needs grad, when the scheduler is the
//     innermost mode -- what PyTorch's Python key would do, without its cost;
//   - hands every other op on, unchanged, to the dispatch mode below, which counts and runs what it does not
//     record exactly as before. Ops with a CompositeImplicitAutograd kernel (linear, reshape, ...) are left to
//     decompose: the mode sees their parts, as it always did.
// The key: c10's DeferredInit (an out-of-tree key, torchdistx's): registered on first use only if no other library
// holds it; otherwise the front stays off and says why (cfront_info). GPUOS_CFRONT=0 turns it off.
#pragma once
#include <torch/extension.h>

namespace gpuos {

constexpr c10::DispatchKey kCfrontKey = c10::DispatchKey::DeferredInit;  // the front's key (see above)

// The table the front records from, by operator name (called with sched_set_fast / sched_set_nodata's tables).
struct CallSpec;
void cfront_set_fast(const std::vector<std::pair<PyObject*, CallSpec>>& table);
void cfront_set_nodata(const std::vector<PyObject*>& overloads);
// Enter / leave the front on this thread for `mode` (a GpuosScheduler, borrowed: it outlives its context) and its
// size threshold; nested entries stack. Enter returns whether the front is on.
bool cfront_enter(PyObject* mode, int64_t threshold);
void cfront_exit();
// {"available", "reason", "key", "enabled_here", "depth", "seen", "recorded", "nodata", "direct", "fast_ops"}.
pybind11::dict cfront_info();
void cfront_set_direct(bool on);
// A number argument on the dispatcher's stack (a double, int or bool IValue) as a double; false for anything else.
bool cfront_number(const c10::IValue& v, double* out);
// Time each front pass by what it did with the op (on: the counters restart). cfront_times(): {"timing",
// "by_category": {cat: (passes, own ns)}, "by_op": {operator: {cat: (passes, own ns)}}} -- cats pass (the scheduler
// not the innermost mode: its own handler's calls, ...), composite (left to decompose), record, nodata, direct,
// native, handed (to the dispatch mode: in place, refused, ...); by_op for composite, direct, native and handed.
// Own time: less the passes nested in it (a composite's parts are timed as themselves).
void cfront_set_timing(bool on);
pybind11::dict cfront_times();

// cfront_native.cpp (and cfront_data.cpp's data kinds). The ops the front records itself (the Python handler only
// reads arguments and calls the record path's C++ core); set with cfront_set_native (the overloads no registered op
// took).
enum class CfrontNative : uint8_t {
  none, mm, addmm, to_copy, clone, cat, scalar_tensor, where, arange, attention, reduce,
  compare, embedding, layer_norm, full, argmax,
  index_copy,  // in place (the rest are functional)
};
CfrontNative cfront_native_of(const c10::OperatorName& name);
// overloads: the matmuls, casts, clone, cat, scalar_tensor, where.self, arange, efficient SDPA, comparisons,
// embedding, argmax, native_layer_norm, zeros / ones / full and index_copy_; reductions: {overload: op id} of the
// last-dim reduction rows (sum, mean, amax, amin, _softmax, _log_softmax).
void cfront_set_native(const std::vector<PyObject*>& overloads,
                       const std::vector<std::pair<PyObject*, uint32_t>>& reductions);
// Record the op from the stack (its nargs arguments on top); true: its output replaced them. code: the reduction's
// op id (kind reduce), the compare rule (kind compare).
bool cfront_try_native(const c10::OperatorHandle& op, CfrontNative kind, uint32_t code, int64_t threshold,
                       size_t nargs, torch::jit::Stack* stack);
// cfront_data.cpp. The data-movement kinds (scalar_tensor, full, where, arange, compare, embedding, argmax,
// index_copy) and their records from the op's n arguments `a` (code: compare's rule): the output (index_copy: self),
// or the reason.
// cfront_compare_rule: the compare rule (device_src/dataops.h CmpOp) of lt / le / gt / ge / eq / ne .Tensor /
// .Scalar; -1 for any other overload.
struct EwRecorded;
int cfront_compare_rule(const c10::OperatorName& name);
bool cfront_data_kind(CfrontNative kind);
EwRecorded cfront_data_record(CfrontNative kind, const c10::OperatorName& name, uint32_t code, const c10::IValue* a,
                              size_t n, int64_t thr);
// An add / sub / mul (.Tensor / .Scalar; functional or in place) the fast record refused, on integer operands:
// recorded as the worker's integer arithmetic (the mode's integer retry, _int_handlers._int_arith, without Python);
// true: its output (in place: self) replaced the arguments.
bool cfront_try_int_arith(const c10::OperatorHandle& op, int64_t threshold, size_t nargs, torch::jit::Stack* stack);
// In place from the front, which sits above ADInplaceOrView: it must do that kernel's part. cfront_inplace_ok: self
// may be written here (an inference tensor only inside inference mode; outside it eager raises, so the mode's path
// decides). cfront_inplace_done, once the write is recorded: self's version counter bumped as ADInplaceOrView bumps
// it, and the nargs arguments on the stack replaced by self (the op's return).
bool cfront_inplace_ok(const at::Tensor& self);
void cfront_inplace_done(size_t nargs, torch::jit::Stack* stack);

// cfront_call.cpp. Whether an op's schema aliases nothing (no view, in place or out= argument or return).
bool functional_schema(const c10::FunctionSchema& s);
// Call the scheduler `mode`'s dispatch (sched_dispatch) for `op`, its arguments on top of `stack`, as PyTorch's
// Python key would (boxed as it boxes them, the mode off the stack, below Autograd), and leave its results there.
void cfront_call_mode(const c10::OperatorHandle& op, PyObject* mode, torch::jit::Stack* stack);

}  // namespace gpuos
