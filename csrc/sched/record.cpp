// csrc/sched/record.cpp -- see record.h.
#include "sched/record.h"

#include <torch/csrc/Dtype.h>

#include "inject/registry.h"
#include "ops/op_table.h"
#include "sched/deferred.h"
#include "sched/outpool.h"
#include "sched/rewrite.h"
#include "tensor/attention.h"
#include "tensor/errors.h"
#include "tensor/tensor.h"

namespace gpuos {

// Defer one op on `dev` (its current stream): `fill` sets the DeferredOp; its out and defined inputs are noted as
// the op's write and reads (the hazard model of the deferred work). The GIL alone guards the queue (deferred.h):
// no runtime lock unless the op publishes, so recording goes on while the flush timer emits without the GIL.
namespace {
template <class Fill>
void defer_op(int dev, Fill&& fill) {
  if (!PyGILState_Check())
    throw std::logic_error("gpuos internal error: an op was recorded without the GIL (the deferred queue's lock)");
  Runtime& rt = runtime_for(dev);
  CUstream s = current_stream(dev);
  // As under RtLock: what `fill` allocates must not reach the dispatch mode (it would record again, here).
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  Deferred& D = deferred_of(dev);
  DeferredOp& d = defer(dev, rt, s);
  fill(d);
  Access reads[kDeferredMaxIn];
  uint32_t nr = 0;
  for (uint32_t k = 0; k < d.nin; ++k)
    if (d.in[k].defined()) reads[nr++] = {(uintptr_t)storage_of(d.in[k]), 0, 0};
  D.touched.note({(uintptr_t)storage_of(d.out), 0, 0}, reads, nr, 1);
  note_deferred(dev, rt);
}
}  // namespace

// A tensor subclass with its own __torch_dispatch__ (Python key in its key set: the functional collectives'
// AsyncCollectiveTensor, whose data NCCL may still be writing until its wait; wrapper subclasses in general) is
// never recorded: run eagerly, the subclass's dispatch runs first (it waits). nn.Parameter has no such key.
int foreign_reason(const at::Tensor& t) {
  const c10::DispatchKeySet ks = t.unsafeGetTensorImpl()->key_set();
  if (ks.has(c10::DispatchKey::Python)) return kR_subclass;
  if (ks.has(c10::DispatchKey::Negative) || ks.has(c10::DispatchKey::Conjugate) || ks.has(c10::DispatchKey::ZeroTensor))
    return kR_math_bits;
  return -1;
}

void defer_filled(int dev, DeferredOp&& op) {
  defer_op(dev, [&](DeferredOp& d) { d = std::move(op); });
}

// Whether deferred work on t's device -- queued, or in flight from the timer -- reads or writes t's storage: an
// eager op reading t would flush it first (or wait for the timer's publication). GIL held; no runtime lock: an
// op recorded now is published after the one in flight.
bool touches_pending(const at::Tensor& t) {
  if (!runtime_if(t.get_device())) return false;
  const Deferred& D = deferred_of(t.get_device());
  return D.may_touch((uintptr_t)storage_of(t));
}

EwRecorded ew_record(uint32_t op, uint32_t nin, int mode, const EwIn* ins, const at::Tensor* pout, float s0, float s1,
                      int64_t thr, int cast_to) {
  const bool grad = at::GradMode::is_enabled();
  calibrate_liveness();
  const at::Tensor* ts[3] = {nullptr, nullptr, nullptr};
  float cv[3] = {0.f, 0.f, 0.f};
  int first = -1;
  bool same_shape = true, any_dim = false;
  for (uint32_t k = 0; k < nin; ++k) {
    if (ins[k].t) {
      const at::Tensor& t = *ins[k].t;
      if (!t.is_cuda()) return ew_reason(kR_not_cuda);
      if (const int r = foreign_reason(t); r >= 0) return ew_reason(r);
      if (t.layout() != at::kStrided) return ew_reason(kR_layout);
      if (dtype_code(t.scalar_type()) < 0) return ew_reason(kR_dtype);
      if (t.numel() > thr) {  // see kPendingSizeCap
        if (t.numel() > kPendingSizeCap || !touches_pending(t)) return ew_reason(kR_size);
        thr = kPendingSizeCap;
      }
      if (grad && t.requires_grad()) return ew_reason(kR_autograd);
      if (first < 0) first = (int)k;
      else same_shape &= t.sizes() == ts[first]->sizes();
      any_dim |= t.dim() > 0;
      ts[k] = &t;
    } else if (ins[k].number) {
      cv[k] = (float)ins[k].v;
    } else {
      return ew_reason(kR_unsupported_args);
    }
  }
  if (first < 0) return ew_reason(kR_unsupported_args);
  const at::Tensor& t0 = *ts[first];
  at::ScalarType dt = t0.scalar_type();
  bool have = false;
  for (uint32_t k = 0; k < nin; ++k) {
    if (!ts[k]) continue;
    if (ts[k]->get_device() != t0.get_device()) return ew_reason(kR_device);
    if (any_dim && ts[k]->dim() == 0) continue;  // 0-d tensors promote only without dimensioned ones
    dt = have ? c10::promoteTypes(dt, ts[k]->scalar_type()) : ts[k]->scalar_type();
    have = true;
  }
  std::vector<int64_t> shape_v;
  at::IntArrayRef shape = t0.sizes();
  if (!same_shape) {
    shape_v = t0.sizes().vec();
    try {
      for (uint32_t k = 0; k < nin; ++k)
        if (ts[k]) shape_v = at::infer_size(shape_v, ts[k]->sizes());
    } catch (const c10::Error&) {
      return ew_reason(kR_unsupported_args);
    }
    shape = shape_v;
  }
  // More dims than a TensorRef holds can only be lowered when they merge into few; the one case known here
  // without the strides of the output is every operand contiguous with the same shape (one dim). Anything
  // else stays eager: refusing it at lowering would fail the whole flush.
  if (shape.size() > kMaxDims) {
    bool flat = same_shape;
    for (uint32_t k = 0; k < nin && flat; ++k) flat = !ts[k] || ts[k]->is_contiguous();
    if (!flat || mode != kModeFunctional) return ew_reason(kR_layout);
  }
  at::Tensor out;
  bool given = false;  // the output is the given tensor (in place: the first operand; out=)
  if (mode == kModeFunctional) {
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    if (numel > thr) return ew_reason(kR_size);
    if (cast_to >= 0) dt = (at::ScalarType)cast_to;
    out = empty_like_device(t0, shape, dt);
  } else {
    const at::Tensor* o = mode == kModeInplace ? ins[0].t : pout;
    if (!o) return ew_reason(kR_unsupported_args);
    const at::Tensor& ot = *o;
    if (!ot.is_cuda() || ot.get_device() != t0.get_device()) return ew_reason(kR_device);
    if (const int r = foreign_reason(ot); r >= 0) return ew_reason(r);
    if ((ot.scalar_type() != dt && cast_to < 0) || ot.sizes() != shape) return ew_reason(kR_unsupported_args);
    if (dtype_code(ot.scalar_type()) < 0) return ew_reason(kR_dtype);
    if (!ot.is_contiguous() && has_internal_overlap(ot)) return ew_reason(kR_unsupported_args);
    for (uint32_t k = 0; k < nin; ++k)
      if (ts[k] && partially_overlaps(ot, *ts[k])) return ew_reason(kR_unsupported_args);
    out = ot;
    given = true;
  }
  defer_op(out.get_device(), [&](DeferredOp& d) {
    d.op = op;
    d.nin = nin;
    d.fresh = mode == kModeFunctional;
    d.s0 = s0;
    d.s1 = s1;
    d.out = out;
    for (uint32_t k = 0; k < nin; ++k) {
      if (ts[k]) d.in[k] = *ts[k];
      d.cv[k] = cv[k];
    }
  });
  return EwRecorded{std::move(out), -1, given};
}

PyObject* sched_ew_record(uint32_t op, uint32_t nin, int mode, PyObject* const* ins, PyObject* pout, float s0,
                          float s1, int64_t thr, int cast_to) {
  try {
    EwIn in[3];
    for (uint32_t k = 0; k < nin; ++k) {
      PyObject* o = ins[k];
      if (THPVariable_Check(o)) in[k].t = &THPVariable_Unpack(o);
      else if (is_number(o)) in[k].number = true, in[k].v = PyFloat_AsDouble(o);
      else return reason(kR_unsupported_args);
    }
    if (pout && !THPVariable_Check(pout)) return reason(kR_unsupported_args);
    const EwRecorded r = ew_record(op, nin, mode, in, pout ? &THPVariable_Unpack(pout) : nullptr, s0, s1, thr, cast_to);
    if (r.reason >= 0) return reason(r.reason);
    if (r.given) {
      PyObject* ret = mode == kModeInplace ? ins[0] : pout;
      Py_INCREF(ret);
      return ret;
    }
    return THPVariable_Wrap(r.out);
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// sched_ew(op, mode, inputs: tuple, out: Tensor | None, s0, s1, size_threshold) -> Tensor | int (reason); op: a
// table op or an injected op id
PyObject* sched_ew(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "sched_ew takes 7 arguments");
    return nullptr;
  }
  const uint32_t op = (uint32_t)PyLong_AsUnsignedLong(args[0]);
  const int mode = (int)PyLong_AsLong(args[1]);
  PyObject* tup = args[2];
  const float s0 = (float)PyFloat_AsDouble(args[4]), s1 = (float)PyFloat_AsDouble(args[5]);
  const int64_t thr = PyLong_AsLongLong(args[6]);
  if (PyErr_Occurred()) return nullptr;
  uint32_t nin = 0;
  if (op < kNumOps) {
    if (kOps[op].kind != kKindEw) return reason(kR_unsupported_args);
    nin = kOps[op].arity;
  } else {
    // An injected op (the scheduler maps registered ops with an aten name to it): its arity from the
    // registry, which waits while the op's first generation compiles.
    try {
      SubmitOp so;
      {
        pybind11::gil_scoped_release nogil;
        so = user_op_for_submit("", (int64_t)op);
      }
      nin = so.arity;
    } catch (...) {
      set_python_error();
      return nullptr;
    }
  }
  if (!PyTuple_Check(tup) || (uint32_t)PyTuple_GET_SIZE(tup) != nin) return reason(kR_unsupported_args);
  return sched_ew_record(op, nin, mode, &PyTuple_GET_ITEM(tup, 0), args[3] == Py_None ? nullptr : args[3], s0, s1,
                         thr);
}

// sched_reduce(op, x, keepdim, size_threshold) -> Tensor | int (reason); last dim only (the handler checks dim).
EwRecorded reduce_record(uint32_t op, const at::Tensor& x, bool keepdim, int64_t thr) {
  if (op >= kNumOps || kOps[op].kind != kKindReduce) return ew_reason(kR_unsupported_args);
  if (!x.is_cuda()) return ew_reason(kR_not_cuda);
  if (const int r = foreign_reason(x); r >= 0) return ew_reason(r);
  if (x.layout() != at::kStrided) return ew_reason(kR_layout);
  if (dtype_code(x.scalar_type()) < 0) return ew_reason(kR_dtype);
  if (x.numel() > thr) return ew_reason(kR_size);
  if (at::GradMode::is_enabled() && x.requires_grad()) return ew_reason(kR_autograd);
  if (x.dim() < 1 || x.dim() > (int64_t)kMaxDims) return ew_reason(kR_unsupported_args);
  const bool row_out = row_output(op);
  if ((op == kOp_amax || op == kOp_amin) && x.size(-1) == 0) return ew_reason(kR_unsupported_args);
  at::Tensor out;
  if (row_out) {
    out = empty_like_device(x, x.sizes(), x.scalar_type());
  } else {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.pop_back();
    if (keepdim) shape.push_back(1);
    out = empty_like_device(x, shape, x.scalar_type());
  }
  defer_op(x.get_device(), [&](DeferredOp& d) {
    d.op = op;
    d.nin = 1;
    d.reduce = true;
    d.keepdim = keepdim;
    d.fresh = true;
    d.out = out;
    d.in[0] = x;
  });
  return EwRecorded{std::move(out), -1, false};
}

PyObject* sched_reduce(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 4) throw py::type_error("sched_reduce takes 4 arguments");
    const uint32_t op = (uint32_t)PyLong_AsUnsignedLong(args[0]);
    PyObject* px = args[1];
    const bool keepdim = PyObject_IsTrue(args[2]) == 1;
    const int64_t thr = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return nullptr;
    if (!THPVariable_Check(px)) return reason(kR_unsupported_args);
    const EwRecorded r = reduce_record(op, THPVariable_Unpack(px), keepdim, thr);
    if (r.reason >= 0) return reason(r.reason);
    return THPVariable_Wrap(r.out);
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyObject* sched_cast(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return python_call([&]() -> PyObject* {
    if (nargs != 4) throw py::type_error("sched_cast takes 4 arguments");
    if (!THPDtype_Check(args[1])) return reason(kR_unsupported_args);
    const at::ScalarType st = ((THPDtype*)args[1])->scalar_type;
    if (dtype_code(st) < 0) return reason(kR_dtype);
    const int64_t thr = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return nullptr;
    const bool out = args[2] != Py_None;
    return sched_ew_record(kOp_copy, 1, out ? kModeOut : kModeFunctional, &args[0], out ? args[2] : nullptr, 0.f,
                           0.f, thr, (int)st);
  });
}

EwRecorded mm_record(const at::Tensor& a, const at::Tensor& b, const at::Tensor* pbias, double alpha, double beta) {
  if (!worker_matmul_enabled()) return ew_reason(kR_matmul_off);
  const at::Tensor bias = pbias ? *pbias : at::Tensor();
  for (const at::Tensor* t : {&a, &b, &bias}) {
    if (!t->defined()) continue;
    if (!t->is_cuda()) return ew_reason(kR_not_cuda);
    if (const int r = foreign_reason(*t); r >= 0) return ew_reason(r);
    if (t->layout() != at::kStrided) return ew_reason(kR_layout);
    if (t->scalar_type() != a.scalar_type() || dtype_code(t->scalar_type()) < 0) return ew_reason(kR_dtype);
    if (t->get_device() != a.get_device()) return ew_reason(kR_device);
    if (at::GradMode::is_enabled() && t->requires_grad()) return ew_reason(kR_autograd);
  }
  // mm / addmm: 2-D; bmm / baddbmm: 3-D with one batch size (each batch a product of its own at lowering).
  const int64_t nd = a.dim();
  if ((nd != 2 && nd != 3) || b.dim() != nd || a.size(nd - 1) != b.size(nd - 2) ||
      (nd == 3 && a.size(0) != b.size(0)))
    return ew_reason(kR_unsupported_args);
  const int64_t M = a.size(nd - 2), N = b.size(nd - 1);
  if (M > kWorkerMatmulMaxRows) return ew_reason(kR_matmul_rows);
  std::vector<int64_t> shape = {M, N};
  if (nd == 3) shape.insert(shape.begin(), a.size(0));
  if (bias.defined() && !bias_broadcasts(bias, shape)) return ew_reason(kR_unsupported_args);
  at::Tensor out = empty_like_device(a, shape, a.scalar_type());
  defer_op(a.get_device(), [&](DeferredOp& d) {
    d.op = kOp_mm;
    d.nin = 3;
    d.matmul = true;
    d.fresh = true;
    d.s0 = (float)alpha;
    d.s1 = (float)beta;
    d.out = out;
    d.in[0] = a;
    d.in[1] = b;
    if (bias.defined()) d.in[2] = bias;
  });
  return EwRecorded{std::move(out), -1, false};
}

// sched_matmul(a, b, bias, alpha, beta) -> Tensor | int (reason): out = alpha * a @ b + beta * bias (bias None:
// aten::mm), a 2-D with at most kWorkerMatmulMaxRows rows. Larger products stay with cuBLAS.
PyObject* sched_matmul(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return python_call([&]() -> PyObject* {
    if (nargs != 5) throw py::type_error("sched_matmul takes 5 arguments");
    PyObject *pa = args[0], *pb = args[1], *pc = args[2];
    const double alpha = PyFloat_AsDouble(args[3]), beta = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return nullptr;
    const bool has_bias = pc != Py_None;
    if (!THPVariable_Check(pa) || !THPVariable_Check(pb) || (has_bias && !THPVariable_Check(pc)))
      return reason(kR_unsupported_args);
    const EwRecorded r = mm_record(THPVariable_Unpack(pa), THPVariable_Unpack(pb),
                                   has_bias ? &THPVariable_Unpack(pc) : nullptr, alpha, beta);
    if (r.reason >= 0) return reason(r.reason);
    return THPVariable_Wrap(r.out);
  });
}

// sched_attention(q, k, v, attn_mask, is_causal, scale, want_lse) -> (out, lse | None) | int (reason): decode
// attention as a worker task (tensor/attention.h check_attention). out is allocated as the flash kernel does
// (B x Lq x Hq x D memory, viewed B x Hq x Lq x D: a query of one row is then also HF's transposed layout); lse
// (B x Hq x Lq fp32) lives in the same buffer, so the op's write footprint covers both.
EwRecorded attention_record(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            bool causal, const double* pscale, bool want_lse, at::Tensor* plse) {
  if (!worker_attention_enabled()) return ew_reason(kR_attention_off);
  if (at::GradMode::is_enabled())
    for (const at::Tensor* t : {&q, &k, &v, &mask})
      if (t->defined() && t->requires_grad()) return ew_reason(kR_autograd);
  const AttnCheck c = check_attention(q, k, v, mask, causal);
  switch (c.code) {
    case kAttnOk: break;
    case kAttnBadDtype: return ew_reason(kR_dtype);
    case kAttnBadLayout: return ew_reason(kR_attention_layout);
    case kAttnBadDevice: return ew_reason(q.is_cuda() ? kR_device : kR_not_cuda);
    default: return ew_reason(kR_attention_shape);
  }
  const double scale = pscale ? *pscale : 1.0 / std::sqrt((double)q.size(3));
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), D = q.size(3);
  const int64_t out_n = B * Hq * Lq * D, lse_n = want_lse ? B * Hq * Lq : 0;
  const int64_t off = (out_n + 7) / 8 * 8;  // lse at a 16-byte boundary
  at::Tensor buf = empty_like_device(q, {want_lse ? off + 2 * lse_n : out_n}, q.scalar_type());
  at::Tensor out = buf.narrow(0, 0, out_n).view({B, Lq, Hq, D}).transpose(1, 2);
  at::Tensor lse;
  if (want_lse) lse = buf.narrow(0, off, 2 * lse_n).view(at::kFloat).view({B, Hq, Lq});
  defer_op(q.get_device(), [&](DeferredOp& d) {
    d.op = kOp_sdpa;
    d.nin = mask.defined() ? 4 : 3;
    d.attention = true;
    d.attn_causal = causal;
    d.fresh = true;
    d.s0 = (float)scale;
    d.out = out;
    d.lse = lse;
    d.written = buf;
    d.in[0] = q;
    d.in[1] = k;
    d.in[2] = v;
    if (mask.defined()) d.in[3] = mask;
    if (g_fusion) {  // read repeat_kv's source instead of its copies (the copies are then dropped)
      const std::vector<DeferredOp>& ops = deferred_of(q.get_device()).ops;
      at::Tensor ks = gqa_source(ops, ops.size() - 1, k), vs = gqa_source(ops, ops.size() - 1, v);
      if ((!ks.is_same(k) || !vs.is_same(v)) && check_attention(q, ks, vs, mask, causal).code == kAttnOk) {
        g_sched.gqa_reads += (!ks.is_same(k)) + (!vs.is_same(v));
        d.in[1] = std::move(ks);
        d.in[2] = std::move(vs);
      }
    }
  });
  if (plse) *plse = std::move(lse);
  return EwRecorded{std::move(out), -1, false};
}

PyObject* sched_attention(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return python_call([&]() -> PyObject* {
    if (nargs != 7) throw py::type_error("sched_attention takes 7 arguments");
    if (!worker_attention_enabled()) return reason(kR_attention_off);
    PyObject *pq = args[0], *pk = args[1], *pv = args[2], *pm = args[3];
    if (!THPVariable_Check(pq) || !THPVariable_Check(pk) || !THPVariable_Check(pv) ||
        (pm != Py_None && !THPVariable_Check(pm)))
      return reason(kR_unsupported_args);
    const bool causal = PyObject_IsTrue(args[4]) == 1, want_lse = PyObject_IsTrue(args[6]) == 1;
    at::Tensor mask;
    if (pm != Py_None) mask = THPVariable_Unpack(pm);
    double scale = 0.0;
    if (args[5] != Py_None) {
      scale = PyFloat_AsDouble(args[5]);
      if (PyErr_Occurred()) return nullptr;
    }
    at::Tensor lse;
    EwRecorded r = attention_record(THPVariable_Unpack(pq), THPVariable_Unpack(pk), THPVariable_Unpack(pv), mask,
                                    causal, args[5] != Py_None ? &scale : nullptr, want_lse, &lse);
    if (r.reason >= 0) return reason(r.reason);
    PyObject* po = THPVariable_Wrap(std::move(r.out));
    PyObject* pl = want_lse ? THPVariable_Wrap(std::move(lse)) : (Py_INCREF(Py_None), Py_None);
    if (!po || !pl) {
      Py_XDECREF(po);
      Py_XDECREF(pl);
      return nullptr;
    }
    PyObject* t = PyTuple_Pack(2, po, pl);
    Py_DECREF(po);
    Py_DECREF(pl);
    return t;
  });
}

}  // namespace gpuos
