// csrc/sched/cfront_call.cpp -- the dispatcher front's direct call of the scheduler's dispatch (cfront.h): for an
// op the front neither records nor runs, the scheduler's __torch_dispatch__ (sched_dispatch) called from the front
// with the arguments boxed as PyTorch's Python key would box them -- without the Python key's machinery (~4.6 us
// per op on an H200 host for a mode bound to C++, tools/dispatch_overhead.py).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/csrc/utils/torch_dispatch_mode.h>

#include "sched/cfront.h"
#include "sched/dispatch.h"

namespace py = pybind11;

namespace gpuos {
namespace {

// One argument as Python sees it: a dtype, layout or memory format is an int in an IValue, a torch object in Python.
py::object to_py(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) return py::none();
  auto is = [&](c10::TypeKind kind) {
    const c10::TypePtr& t = arg.real_type();
    if (t->kind() == kind) return true;
    auto opt = t->cast<c10::OptionalType>();
    return opt && opt->getElementType()->kind() == kind;
  };
  if (is(c10::ScalarTypeType::Kind))
    return py::reinterpret_borrow<py::object>((PyObject*)torch::getTHPDtype((c10::ScalarType)v.toInt()));
  if (is(c10::LayoutType::Kind))
    return py::reinterpret_borrow<py::object>((PyObject*)torch::getTHPLayout((c10::Layout)v.toInt()));
  if (is(c10::MemoryFormatType::Kind))
    return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat((c10::MemoryFormat)v.toInt()));
  return torch::jit::toPyObject(v);
}

// What PyTorch's Python key passes to __torch_dispatch__ (python_variable.cpp's parseIValuesToPyArgsKwargs, not
// exported): the positional arguments up to the last one not at its default, the keyword-only ones not at their
// default. The handlers read arguments by that rule (alpha: a kwarg or the 3rd positional, ...).
std::pair<py::tuple, py::dict> box_args(const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                                        size_t base) {
  const auto& a = schema.arguments();
  auto is_default = [&](size_t i) {
    const auto& d = a[i].default_value();
    return d.has_value() && !(*d != stack[base + i]);
  };
  size_t npos = 0;
  while (npos < a.size() && !a[npos].kwarg_only()) ++npos;
  size_t last = npos;
  while (last > 0 && is_default(last - 1)) --last;
  py::tuple args(last);
  for (size_t i = 0; i < last; ++i) args[i] = to_py(a[i], stack[base + i]);
  py::dict kwargs;
  for (size_t i = npos; i < a.size(); ++i)
    if (!is_default(i)) kwargs[py::str(a[i].name())] = to_py(a[i], stack[base + i]);
  return {std::move(args), std::move(kwargs)};
}

}  // namespace

bool functional_schema(const c10::FunctionSchema& s) {
  for (const auto& a : s.arguments())
    if (a.alias_info()) return false;
  for (const auto& r : s.returns())
    if (r.alias_info()) return false;
  return true;
}

void cfront_call_mode(const c10::OperatorHandle& op, PyObject* mode, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size(), base = stack->size() - n;
  py::gil_scoped_acquire gil;
  static PyObject* types = [] {  // __torch_dispatch__'s `types`: plain tensors only come here (cfront.cpp)
    py::tuple t(1);
    t[0] = py::module_::import("torch").attr("Tensor");
    return t.release().ptr();
  }();
  py::object out;
  {
    // As under PyTorch's Python key: the scheduler off the mode stack while it runs (its own eager calls reach the
    // kernels), below Autograd and ADInplaceOrView (only functional ops without a tensor that needs grad come here).
    // The handler's own calls skip the front too, as under the Python key (there they never reach it: measured).
    torch::torch_dispatch_mode::StashTorchDispatchModeGuard stash;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard no_front(kCfrontKey);
    auto [args, kwargs] = box_args(schema, *stack, base);
    py::handle func = torch::detail::getTorchApiFunction(op);
    PyObject* call[5] = {mode, func.ptr(), types, args.ptr(), kwargs.ptr()};
    PyObject* r = sched_dispatch(nullptr, call, 5);
    if (!r) throw py::error_already_set();
    out = py::reinterpret_steal<py::object>(r);
  }
  torch::jit::drop(*stack, n);
  const auto& rets = schema.returns();
  if (rets.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, rets[0].real_type()));
  } else if (rets.size() > 1) {
    TORCH_CHECK_TYPE(PyTuple_Check(out.ptr()) || PyList_Check(out.ptr()), "gpuos: the scheduler's dispatch of ",
                     schema.name(), " returned one value; the schema has ", rets.size());
    py::sequence seq = py::reinterpret_borrow<py::sequence>(out);
    TORCH_CHECK_TYPE(py::len(seq) == rets.size(), "gpuos: the scheduler's dispatch of ", schema.name(), " returned ",
                     py::len(seq), " values; the schema has ", rets.size());
    for (size_t i = 0; i < rets.size(); ++i) stack->push_back(torch::jit::toIValue(seq[i], rets[i].real_type()));
  }
}

}  // namespace gpuos
