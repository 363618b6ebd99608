// csrc/sched/record.h -- the scheduler's record path: validate, allocate the output, defer (sched/deferred.h).
// Each returns the output tensor, an int SchedReason to run the op eagerly, or null with a Python error set.
#pragma once
#include <torch/extension.h>

namespace gpuos {

inline PyObject* reason(int r) { return PyLong_FromLong(r); }
// A tensor the worker cannot read as plain memory: a Python subclass (kR_subclass), or a view whose negative /
// conjugate / zero bit its kernel must resolve (kR_math_bits: such a view can reach the dispatch mode unresolved --
// copy_ and clone resolve the bits themselves, so PyTorch's Negative fallback hands them on as they are); -1: plain.
int foreign_reason(const at::Tensor& t);
// Elementwise op `op` (nin operands: tensors or numbers) in `mode` (SchedMode); pout: the out= tensor.
// cast_to >= 0 (op copy): the output's dtype (functional), or any float out dtype is accepted (out / in place).
PyObject* sched_ew_record(uint32_t op, uint32_t nin, int mode, PyObject* const* ins, PyObject* pout, float s0,
                          float s1, int64_t thr, int cast_to = -1);
// The same from C++ values (sched/cfront.cpp records from the dispatcher's stack): each operand a tensor or a
// number; pout: the out= tensor. reason >= 0: run eagerly for that SchedReason; else `out` is the output, the given
// tensor itself when `given` (in place: the first operand; out=). Throws what PyTorch throws (allocation).
struct EwIn {
  const at::Tensor* t = nullptr;
  bool number = false;
  double v = 0.0;
};
struct EwRecorded {
  at::Tensor out;
  int reason = -1;
  bool given = false;
};
inline EwRecorded ew_reason(int r) { return EwRecorded{at::Tensor(), r, false}; }
// thr: the scheduler's size threshold (more elements: eager, reason size) -- except for an operand that deferred work
// touches, which eager could only read after a flush: up to kPendingSizeCap elements it is recorded (HF repeat_kv's
// clone of a static cache, 65,536 elements for Llama-small: a flush per layer, and the attention's GQA read of the
// cache itself lost with it).
constexpr int64_t kPendingSizeCap = int64_t(1) << 22;  // as programs' capture (gpuos/programs.py DEFAULT_SIZE_THRESHOLD)
EwRecorded ew_record(uint32_t op, uint32_t nin, int mode, const EwIn* ins, const at::Tensor* pout, float s0, float s1,
                     int64_t thr, int cast_to = -1);
// sched_ew(op, mode, inputs, out, s0, s1, size_threshold) and sched_reduce(op, x, keepdim, size_threshold):
// METH_FASTCALL entry points of gpuos/scheduler.py's handlers.
PyObject* sched_ew(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* sched_reduce(PyObject*, PyObject* const* args, Py_ssize_t nargs);
// sched_reduce's core from C++ values: last-dim reduction `op` of x (kKindReduce), or the reason.
EwRecorded reduce_record(uint32_t op, const at::Tensor& x, bool keepdim, int64_t thr);
// sched_cast(x, dtype, out | None, size_threshold): aten::_to_copy (functional) / copy_ (out = self) as op copy.
PyObject* sched_cast(PyObject*, PyObject* const* args, Py_ssize_t nargs);
// sched_matmul(a, b, bias, alpha, beta): aten::mm / addmm as a worker task (sched/deferred.h worker_matmul_enabled).
PyObject* sched_matmul(PyObject*, PyObject* const* args, Py_ssize_t nargs);
// Its core from C++ values (bias: null for mm / bmm): out = alpha * a @ b + beta * bias, or the reason.
EwRecorded mm_record(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias, double alpha, double beta);
// sched_attention(q, k, v, attn_mask, is_causal, scale, want_lse): the SDPA backend ops as a decode-attention task.
PyObject* sched_attention(PyObject*, PyObject* const* args, Py_ssize_t nargs);
// Its core from C++ values (mask: undefined for none; pscale: null for 1/sqrt(D)): the output, and in *plse the
// log-sum-exp when want_lse; or the reason.
EwRecorded attention_record(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            bool causal, const double* pscale, bool want_lse, at::Tensor* plse);
// Defer an op whose fields are all set (its out / defined ins become its write / reads): the one recording path.
struct DeferredOp;
void defer_filled(int dev, DeferredOp&& op);
// sched_data(op, out, ins, bits, dim, ival, keepdim, fresh, size_threshold) -> out | int reason: a data-movement
// op (ops.def kind 4; sched/record_data.cpp checks it, gpuos/_data_handlers.py builds the calls).
PyObject* sched_data(PyObject*, PyObject* const* args, Py_ssize_t nargs);
// Its core from C++ values: 0 when recorded, else the reason.
int data_record(uint32_t op, const at::Tensor& out, const at::Tensor* ins, const uint64_t* bits, uint32_t nin,
                int64_t dim, int64_t ival, bool keepdim, bool fresh, int64_t thr);
// The bits of number v stored as dtype (the data ops' constants: fill values, where's values, arange's start and
// step), rounded as torch rounds it (through fp32 for fp16 / bf16); throws std::overflow_error where it does not fit
// the dtype (or the dtype takes no constants), std::domain_error for a non-integer value of an integer dtype. The one
// definition: gpuos/_data_handlers.py bits_of calls it (sched_bits_of).
uint64_t bits_of(const c10::Scalar& v, at::ScalarType dt);

}  // namespace gpuos
