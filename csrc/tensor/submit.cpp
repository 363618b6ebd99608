// csrc/tensor/submit.cpp -- see submit.h.
#include "tensor/submit.h"

#include <cstring>
#include <memory>

#include "inject/registry.h"
#include "ops/op_table.h"
#include "tensor/devices.h"
#include "tensor/record.h"

namespace py = pybind11;

namespace gpuos {

void submit_binary(uint32_t op, PyObject* pa, PyObject* pb, PyObject* pout) {
  const char* nm = kOps[op].submit_name;
  const at::Tensor& a = as_tensor(pa, nm, "a");
  const at::Tensor& b = as_tensor(pb, nm, "b");
  const at::Tensor& out = as_tensor(pout, nm, "out");
  check_binary(nm, a, b, out);
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const int dev = out.get_device();
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  before_record(dev, rt);
  record_keeping(dev, {pa, pb, pout}, [&] { rt.record_binary(op, operand(out), operand(a), operand(b), numel); });
}

void submit_many(const std::string& opname, py::handle A, py::handle B, py::handle C) {
  const uint32_t op = op_id(opname, "gpuos.submit_many", -1, 4);  // the seed's binary ops: add, sub, mul, div
  for (auto* s : {&A, &B, &C})
    if (!PySequence_Check(s->ptr()))
      throw py::type_error("gpuos.submit_many: a_list, b_list and out_list must be lists or tuples of tensors");
  PyObject* fa = PySequence_Fast(A.ptr(), "a_list must be a sequence");
  PyObject* fb = PySequence_Fast(B.ptr(), "b_list must be a sequence");
  PyObject* fc = PySequence_Fast(C.ptr(), "out_list must be a sequence");
  py::object ga = py::reinterpret_steal<py::object>(fa), gb = py::reinterpret_steal<py::object>(fb),
             gc = py::reinterpret_steal<py::object>(fc);
  if (!fa || !fb || !fc) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fa);
  if (PySequence_Fast_GET_SIZE(fb) != n || PySequence_Fast_GET_SIZE(fc) != n)
    throw py::value_error("gpuos.submit_many('" + opname + "'): list lengths differ: a_list " + std::to_string(n) +
                          ", b_list " + std::to_string(PySequence_Fast_GET_SIZE(fb)) + ", out_list " +
                          std::to_string(PySequence_Fast_GET_SIZE(fc)) + ". Fix: pass three lists of equal length.");
  PyObject** ia = PySequence_Fast_ITEMS(fa);
  PyObject** ib = PySequence_Fast_ITEMS(fb);
  PyObject** ic = PySequence_Fast_ITEMS(fc);
  const char* nm = kOps[op].submit_name;
  // Pass 1 validates everything (a bad element leaves nothing recorded) and extracts the operands, so pass 2
  // never touches the tensor objects again. The objects are scattered in memory: prefetch ahead in stages
  // (PyObject, then its TensorImpl, then the StorageImpl that holds the data pointer).
  struct Rec { Operand out, a, b; int64_t numel; int dev; };
  // Reused across calls: a fresh multi-MB vector per call costs page faults (seen as 2x run-to-run spread).
  static std::vector<Rec> recs;
  recs.resize((size_t)n);
  PyObject** lists[3] = {ia, ib, ic};
  auto impl_of = [](PyObject* o) -> const c10::TensorImpl* {
    return THPVariable_Check(o) ? THPVariable_Unpack(o).unsafeGetTensorImpl() : nullptr;
  };
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (i + 16 < n)
      for (auto* l : lists) __builtin_prefetch(l[i + 16]);
    if (i + 8 < n)
      for (auto* l : lists)
        if (const c10::TensorImpl* t = impl_of(l[i + 8])) {
          __builtin_prefetch(t);
          __builtin_prefetch((const char*)t + 64);
          __builtin_prefetch((const char*)t + 128);
        }
    if (i + 4 < n)
      for (auto* l : lists)
        if (const c10::TensorImpl* t = impl_of(l[i + 4])) __builtin_prefetch(t->storage().unsafeGetStorageImpl());
    try {
      const at::Tensor& a = as_tensor(ia[i], nm, "a");
      const at::Tensor& b = as_tensor(ib[i], nm, "b");
      const at::Tensor& out = as_tensor(ic[i], nm, "out");
      check_binary(nm, a, b, out);
      recs[i] = {operand(out), operand(a), operand(b), out.numel(), out.get_device()};
    } catch (py::builtin_exception& e) {
      std::string msg = std::string("gpuos.submit_many element ") + std::to_string(i) + ": " + e.what();
      if (dynamic_cast<py::type_error*>(&e)) throw py::type_error(msg);
      throw py::value_error(msg);
    }
  }
  Runtime* rt = nullptr;
  std::unique_ptr<RtLock> lk;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Rec& r = recs[i];
    if (r.numel == 0) continue;
    if (!rt || rt->device() != r.dev) {
      lk.reset();
      rt = &runtime_for(r.dev);
      lk = std::make_unique<RtLock>(*rt);
      before_record(r.dev, *rt);
    }
    record_keeping(r.dev, {ia[i], ib[i], ic[i]}, [&] { rt->record_binary(op, r.out, r.a, r.b, r.numel); });
  }
}

// submit()'s op: a table op (name or id), or an injected op (name or id returned by register_*,
// inject/registry.h), whose description goes into `user` (scalars s0, s1).
static uint32_t submit_op(py::handle opobj, std::string& opname, OpInfo& user) {
  int64_t id = -1;
  if (PyUnicode_Check(opobj.ptr())) {
    opname = opobj.cast<std::string>();
    for (uint32_t i = 0; i < kNumOps; ++i)
      if (opname == kOps[i].name) return i;
    if (!is_user_op_name(opname)) return op_id(opname, "gpuos.submit");  // raises, listing the table ops
  } else if (PyLong_Check(opobj.ptr())) {
    id = opobj.cast<int64_t>();
    if (id >= 0 && id < (int64_t)kNumOps) {
      opname = kOps[id].name;
      return (uint32_t)id;
    }
  } else {
    throw py::type_error("gpuos.submit: op must be an op name (str) or id (int), got " +
                         std::string(Py_TYPE(opobj.ptr())->tp_name));
  }
  SubmitOp so;
  {
    py::gil_scoped_release nogil;  // may wait for the op's generation to finish compiling
    so = user_op_for_submit(opname, id);
  }
  opname = so.name;
  user = OpInfo{opname.c_str(), so.arity, 0, 2, "s0,s1", 0.0f, 0.0f, "", "", "gpuos.submit"};
  return so.id;
}

void submit_generic(py::handle opobj, py::handle inputs, py::handle pout, py::kwargs kwargs) {
  std::string opname;
  OpInfo user_info{};
  const uint32_t op = submit_op(opobj, opname, user_info);
  const OpInfo& info = op < kNumOps ? kOps[op] : user_info;
  const std::string who = "gpuos.submit('" + opname + "')";
  if (info.kind == kKindMatmul)
    throw py::value_error(who + ": '" + opname + "' is a matmul; use gpuos.submit_matmul(a, b, out, bias=None)");
  if (info.kind == kKindAttention)
    throw py::value_error(who + ": '" + opname + "' is decode attention; use gpuos_ext.submit_attention(q, k, v, out)");
  if (info.kind == kKindData)
    throw py::value_error(who + ": '" + opname + "' is a data-movement op (indices, masks); it is recorded by "
                          "gpuos.scheduler_context from the aten ops it serves (embedding, index_copy_, where, ...)");
  if (info.kind != kKindEw)
    throw py::value_error(who + ": '" + opname + "' is a reduction; use gpuos.submit_reduce(op, x, out)");
  if (!PySequence_Check(inputs.ptr()) || PyUnicode_Check(inputs.ptr()))
    throw py::type_error(who + ": inputs must be a list or tuple of tensors / numbers");
  py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(inputs.ptr(), "inputs must be a sequence"));
  if (!fast) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
  if ((uint32_t)n != info.arity)
    throw py::value_error(who + " takes " + std::to_string(info.arity) + " input(s), got " + std::to_string(n));
  // Scalars: table defaults, overridden by keyword (None -> unbounded for clamp's min/max).
  const std::vector<std::string> snames = split(info.scalar_names, ',');
  float sc[2] = {info.d0, info.d1};
  for (auto item : kwargs) {
    const std::string key = py::str(item.first);
    size_t idx = 0;
    while (idx < snames.size() && snames[idx] != key) ++idx;
    if (idx == snames.size()) {
      std::string valid;
      for (auto& nm : snames) valid += (valid.empty() ? "" : ", ") + nm;
      throw py::type_error(who + ": unexpected scalar '" + key + "'; this op takes: " + (valid.empty() ? "none" : valid));
    }
    if (item.second.is_none()) sc[idx] = idx == 0 ? -__builtin_huge_valf() : __builtin_huge_valf();
    else sc[idx] = item.second.cast<float>();
  }
  PyObject* out_obj = pout.ptr();
  const at::Tensor& out = as_tensor(out_obj, who.c_str(), "out");
  check_cuda_float(who.c_str(), out, "out");
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<at::Tensor> tens;
  std::vector<int> tidx;
  c10::optional<at::ScalarType> promoted;
  std::vector<at::IntArrayRef> shapes;
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (is_number(items[k])) continue;
    const std::string nm = "input " + std::to_string(k);
    const at::Tensor& t = as_tensor(items[k], who.c_str(), nm.c_str());
    check_cuda_float(who.c_str(), t, nm);
    if (t.get_device() != out.get_device())
      throw py::value_error(who + ": " + nm + " is on " + t.device().str() + " but out is on " + out.device().str());
    tens.push_back(t);
    tidx.push_back((int)k);
  }
  // PyTorch's rule (all our dtypes are floats, one category): 0-d tensors take part in promotion only when
  // no dimensioned tensor is present.
  bool any_dimensioned = false;
  for (auto& t : tens) any_dimensioned |= t.dim() > 0;
  for (auto& t : tens)
    if (!any_dimensioned || t.dim() > 0)
      promoted = promoted ? c10::promoteTypes(*promoted, t.scalar_type()) : t.scalar_type();
  if (promoted && *promoted != out.scalar_type() && op != kOp_copy) {  // copy casts to out's dtype
    std::string got;
    for (auto& t : tens) got += (got.empty() ? "" : ", ") + dtype_str(t);
    throw py::type_error(who + ": out dtype " + dtype_str(out) + " is not the promoted dtype of the inputs (" + got +
                         " -> " + dtype_name(*promoted) + "). Fix: allocate out with that dtype.");
  }
  std::vector<int64_t> bshape;
  if (!tens.empty()) {
    bshape = tens[0].sizes().vec();
    for (size_t i = 1; i < tens.size(); ++i) {
      try {
        bshape = at::infer_size(bshape, tens[i].sizes());
      } catch (const c10::Error&) {
        std::string shapes_s;
        for (auto& t : tens) shapes_s += (shapes_s.empty() ? "" : ", ") + shape_str(t);
        throw py::value_error(who + ": input shapes " + shapes_s + " do not broadcast together");
      }
    }
    if (at::IntArrayRef(bshape) != out.sizes()) {
      std::string shapes_s;
      for (auto& t : tens) shapes_s += (shapes_s.empty() ? "" : ", ") + shape_str(t);
      throw py::value_error(who + ": out shape " + shape_str(out) + " must equal the broadcast shape of the inputs (" +
                            shapes_s + "). Fix: allocate out with the broadcast shape.");
    }
  }
  if (!out.is_contiguous() && has_internal_overlap(out))
    throw py::value_error(who + ": out " + shape_str(out) + " has stride-0 (expanded) dims. Fix: pass a fresh out.");
  for (size_t i = 0; i < tens.size(); ++i) check_overlap(who.c_str(), out, tens[i], "input " + std::to_string(tidx[i]));
  if (out.numel() == 0) return;
  at::Tensor ins[3];
  float cv[3] = {0.f, 0.f, 0.f};
  for (Py_ssize_t k = 0, t = 0; k < n; ++k) {
    if (is_number(items[k])) cv[k] = (float)PyFloat_AsDouble(items[k]);
    else ins[k] = tens[t++];
  }
  const int dev = out.get_device();
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  before_record(dev, rt);
  PyObject* objs[4] = {out_obj, nullptr, nullptr, nullptr};
  for (Py_ssize_t k = 0; k < n; ++k)
    if (!is_number(items[k])) objs[1 + k] = items[k];
  record_keeping(dev, {objs[0], objs[1], objs[2], objs[3]},
                 [&] { record_ew_tensors(rt, op, info.arity, out, ins, cv, sc[0], sc[1]); });
}

void submit_reduce(PyObject* pop, PyObject* px, PyObject* pout, bool keepdim) {
  if (!PyUnicode_Check(pop))
    throw py::type_error(std::string("gpuos.submit_reduce: op must be a reduction name (str), e.g. 'sum'; got ") +
                         Py_TYPE(pop)->tp_name + ". gpuos.supported_ops() lists them.");
  const char* opname = PyUnicode_AsUTF8(pop);
  if (!opname) throw py::error_already_set();
  const int found = find_op(opname, kKindReduce);
  if (found < 0) op_id(opname, "gpuos.submit_reduce", kKindReduce);  // raises, listing the reductions
  const uint32_t op = (uint32_t)found;
  auto who = [&] { return std::string("gpuos.submit_reduce('") + opname + "')"; };
  const at::Tensor& x = as_tensor(px, "gpuos.submit_reduce", "x");
  const at::Tensor& out = as_tensor(pout, "gpuos.submit_reduce", "out");
  check_cuda_float("gpuos.submit_reduce", x, "x");
  check_cuda_float("gpuos.submit_reduce", out, "out");
  if (x.scalar_type() != out.scalar_type())
    throw py::type_error(who() + ": out dtype " + dtype_str(out) + " must equal x dtype " + dtype_str(x));
  if (x.get_device() != out.get_device()) throw py::value_error(who() + ": x and out are on different devices");
  const int64_t xd = x.dim();
  if (xd < 1 || xd > (int64_t)kMaxDims)
    throw py::value_error(who() + ": x must have 1.." + std::to_string(kMaxDims) + " dims, got " + shape_str(x));
  const bool row_out = row_output(op);
  // out's shape: x's (softmax / log_softmax), else x's without the last dim (keepdim: with it as 1)
  const at::IntArrayRef xs = x.sizes(), os = out.sizes();
  const int64_t want_dim = row_out || keepdim ? xd : xd - 1;
  bool shape_ok = (int64_t)os.size() == want_dim;
  for (int64_t i = 0; shape_ok && i < want_dim; ++i)
    shape_ok = os[i] == (i < xd - 1 || row_out ? xs[i] : 1);
  if (!shape_ok) {
    std::vector<int64_t> want = xs.vec();
    if (!row_out) {
      want.pop_back();
      if (keepdim) want.push_back(1);
    }
    throw py::value_error(who() + ": out shape " + shape_str(out) + " must be " + shape_vec_str(want) + " for x " +
                          shape_str(x) + (row_out ? "" : (keepdim ? " with keepdim=True" : " with keepdim=False")));
  }
  const int64_t cols = xs[xd - 1];
  if ((op == kOp_amax || op == kOp_amin) && cols == 0 && out.numel() > 0)
    throw py::value_error(who() + ": the last dim of x " + shape_str(x) + " is empty; amax/amin have no identity");
  if (!out.is_contiguous() && has_internal_overlap(out))
    throw py::value_error(who() + ": out " + shape_str(out) + " has stride-0 (expanded) dims");
  if (row_out) check_overlap(who().c_str(), out, x, "x");  // in-place softmax is allowed
  else if (partially_overlaps(out, x, /*allow_identical=*/false))
    throw py::value_error(who() + ": out overlaps x. Fix: write to a separate tensor.");
  const int dev = out.get_device();
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  before_record(dev, rt);
  record_keeping(dev, {px, pout}, [&] { record_reduce_tensors(rt, op, x, out, keepdim); });
}

}  // namespace gpuos
