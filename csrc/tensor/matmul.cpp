// csrc/tensor/matmul.cpp -- gpuos.submit_matmul: the explicit API of the worker's skinny matmul (issue #16).
#include "ops/op_table.h"
#include "tensor/devices.h"
#include "tensor/record.h"
#include "tensor/submit.h"

namespace py = pybind11;

namespace gpuos {

void submit_matmul(PyObject* pa, PyObject* pb, PyObject* pout, PyObject* pbias, float alpha, float beta) {
  const char* who = "gpuos.submit_matmul";
  const at::Tensor& a = as_tensor(pa, who, "a");
  const at::Tensor& b = as_tensor(pb, who, "b");
  const at::Tensor& out = as_tensor(pout, who, "out");
  const bool has_bias = pbias != nullptr && pbias != Py_None;
  at::Tensor bias;
  if (has_bias) bias = as_tensor(pbias, who, "bias");
  check_cuda_float(who, a, "a");
  check_cuda_float(who, b, "b");
  check_cuda_float(who, out, "out");
  if (has_bias) check_cuda_float(who, bias, "bias");
  auto w = [&] { return std::string(who) + "(a " + shape_str(a) + ", b " + shape_str(b) + ", out " + shape_str(out) +
                        (has_bias ? ", bias " + shape_str(bias) : std::string()) + ")"; };
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2)
    throw py::value_error(w() + ": a, b and out must be 2-D (a: M x K, b: K x N, out: M x N). Fix: reshape "
                          "batched activations to 2-D first, as torch.nn.functional.linear does.");
  if (a.size(1) != b.size(0) || out.size(0) != a.size(0) || out.size(1) != b.size(1))
    throw py::value_error(w() + ": shapes do not chain: a is M x K, b must be K x N and out M x N");
  if (a.scalar_type() != b.scalar_type() || a.scalar_type() != out.scalar_type() ||
      (has_bias && bias.scalar_type() != a.scalar_type()))
    throw py::type_error(w() + ": a, b, out" + std::string(has_bias ? " and bias" : "") + " must have one dtype; got " +
                         dtype_str(a) + ", " + dtype_str(b) + ", " + dtype_str(out) +
                         (has_bias ? ", " + dtype_str(bias) : std::string()) + ". Fix: cast with .to(dtype) first.");
  const int dev = out.get_device();
  if (a.get_device() != dev || b.get_device() != dev || (has_bias && bias.get_device() != dev))
    throw py::value_error(w() + ": every tensor must be on out's device (cuda:" + std::to_string(dev) + ")");
  if (has_bias && !bias_broadcasts(bias, out.sizes()))
    throw py::value_error(w() + ": bias must broadcast to out " + shape_str(out) + " (N, 1 x N, M x 1 or M x N)");
  if (has_internal_overlap(out))
    throw py::value_error(w() + ": out has stride-0 (expanded) dims. Fix: write to a separate tensor.");
  for (const at::Tensor* in : {&a, &b, (const at::Tensor*)&bias}) {
    if (!in->defined()) continue;
    if (partially_overlaps(out, *in, /*allow_identical=*/false))
      throw py::value_error(w() + ": out overlaps an input (the product reads whole rows and columns while it "
                            "writes). Fix: write to a separate tensor.");
  }
  Runtime& rt = runtime_for(dev);
  RtLock lk(rt);
  before_record(dev, rt);
  record_keeping(dev, {pa, pb, pout, has_bias ? pbias : nullptr},
                 [&] { record_matmul_tensors(rt, a, b, bias, out, alpha, beta); });
}

}  // namespace gpuos
