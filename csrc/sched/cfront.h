// csrc/sched/cfront.h -- the scheduler's dispatcher front: a C++ boxed fallback that sees every aten op under a
// GpuosScheduler before PyTorch boxes it into Python objects for the dispatch mode.
//
// A dispatch mode costs ~4.5-5 us per op on a CPU host even with a C++ __torch_dispatch__ (tools/dispatch_overhead.py,
// forty-seventh session: +4.6-5.3 us per op for a mode bound to C++, +0.3-0.7 for a boxed fallback), ~230 ops per
// step of a small HF decoder. While a GpuosScheduler is entered (gpuos/scheduler.py), this thread includes the
// front's dispatch key in its local key set, so the dispatcher calls the fallback first for every op. It
//   - records the functional fast-spec elementwise ops (the CallSpec table sched_dispatch uses, by operator name)
//     from the dispatcher's stack (sched/record.h ew_record), the GIL held, like sched_dispatch;
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

// cfront_call.cpp. Whether an op's schema aliases nothing (no view, in place or out= argument or return).
bool functional_schema(const c10::FunctionSchema& s);
// Call the scheduler `mode`'s dispatch (sched_dispatch) for `op`, its arguments on top of `stack`, as PyTorch's
// Python key would (boxed as it boxes them, the mode off the stack, below Autograd), and leave its results there.
void cfront_call_mode(const c10::OperatorHandle& op, PyObject* mode, torch::jit::Stack* stack);

}  // namespace gpuos
