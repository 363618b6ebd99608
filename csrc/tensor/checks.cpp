// csrc/tensor/checks.cpp -- the explicit API's argument checks and their messages (see tensor.h).
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {

std::string shape_str(const at::Tensor& t) {
  // No iostreams: torch wheels and this extension may carry different libstdc++ locale facets, and
  // numeric ostream insertion crashed on torch 2.11 (seen on the H200 machine).
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  if (t.dim() == 1) s += ",";
  return s + ")";
}
std::string shape_vec_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() == 1) s += ",";
  return s + ")";
}
std::string dtype_name(at::ScalarType st) {
  std::string s = c10::toString(st);
  // c10 names: Float, Half, BFloat16, Long ... -> torch names
  if (s == "Float") return "float32";
  if (s == "Half") return "float16";
  if (s == "BFloat16") return "bfloat16";
  if (s == "Double") return "float64";
  if (s == "Long") return "int64";
  if (s == "Int") return "int32";
  if (s == "Bool") return "bool";
  return s;
}
std::string dtype_str(const at::Tensor& t) { return dtype_name(t.scalar_type()); }
std::string describe(const char* name, const at::Tensor& t) {
  return std::string(name) + ": " + t.device().str() + " " + dtype_str(t) + " " + shape_str(t);
}

bool partially_overlaps(const at::Tensor& out, const at::Tensor& in, bool allow_identical) {
  if (in.numel() == 0 || out.numel() == 0) return false;
  if (in.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl() !=
      out.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl())
    return false;  // the common case, without touching sizes or strides
  uint64_t lo, hi, olo, ohi;
  extent((uint64_t)(uintptr_t)in.data_ptr(), (int)in.dim(), in.sizes().data(), in.strides().data(),
         (int64_t)in.element_size(), lo, hi);
  extent((uint64_t)(uintptr_t)out.data_ptr(), (int)out.dim(), out.sizes().data(), out.strides().data(),
         (int64_t)out.element_size(), olo, ohi);
  if (!(lo < ohi && olo < hi)) return false;
  const bool identical =
      in.data_ptr() == out.data_ptr() && in.sizes() == out.sizes() && in.strides() == out.strides();
  return !(allow_identical && identical);
}

bool has_internal_overlap(const at::Tensor& t) {
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.stride(i) == 0 && t.size(i) > 1) return true;
  return false;
}

bool bias_broadcasts(const at::Tensor& bias, at::IntArrayRef shape) {
  const int64_t bd = bias.dim(), nd = (int64_t)shape.size();
  if (bd < 1 || bd > nd) return false;
  for (int64_t i = 0; i < bd; ++i)
    if (bias.size(i) != shape[(size_t)(nd - bd + i)] && bias.size(i) != 1) return false;
  return true;
}

// Checks for out = op(a, b); throws TypeError / ValueError naming op, shapes, dtypes and the fix.
void check_binary(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const at::Tensor* ts[3] = {&a, &b, &out};
  const char* names[3] = {"a", "b", "out"};
  auto all = [&] {
    return describe(names[0], a) + "; " + describe(names[1], b) + "; " + describe(names[2], out);
  };
  for (int i = 0; i < 3; ++i)
    if (!ts[i]->is_cuda())
      throw py::type_error(std::string(op) + ": every tensor must be a CUDA tensor, but '" + names[i] +
                           "' is on " + ts[i]->device().str() + " (" + all() +
                           "). Fix: move inputs and output to the GPU with .cuda() / .to('cuda').");
  if (dtype_code(a.scalar_type()) < 0 || a.scalar_type() != b.scalar_type() ||
      a.scalar_type() != out.scalar_type())
    throw py::type_error(std::string(op) + ": dtypes must be equal and one of float32, float16, bfloat16; got " +
                         all() + ". Fix: cast with .to(torch.float32) (or float16 / bfloat16).");
  if (a.get_device() != b.get_device() || a.get_device() != out.get_device())
    throw py::value_error(std::string(op) + ": tensors are on different devices (" + all() +
                          "). Fix: put all three on one GPU.");
  if (a.sizes() != b.sizes() || a.sizes() != out.sizes())
    throw py::value_error(std::string(op) + ": shapes must be equal, got a " + shape_str(a) + ", b " +
                          shape_str(b) + ", out " + shape_str(out) + " (" + all() +
                          "). Fix: expand inputs to the output shape (a.expand(out.shape)) or allocate out "
                          "with the inputs' shape; submit_* does not broadcast.");
  if (!out.is_contiguous() && has_internal_overlap(out))
    throw py::value_error(std::string(op) + ": out " + shape_str(out) + " has stride-0 (expanded) dims, so "
                          "several elements would write one location. Fix: pass a freshly allocated out.");
  for (int i = 0; i < 2; ++i)
    if (partially_overlaps(out, *ts[i]))
      throw py::value_error(std::string(op) + ": out partially overlaps input '" + names[i] + "' (" + all() +
                            "); only exact in-place (out is the same view as the input) is allowed. Fix: "
                            "write to a separate tensor, or clone the input first.");
}

void check_overlap(const char* who, const at::Tensor& out, const at::Tensor& in, const std::string& inname) {
  if (partially_overlaps(out, in))
    throw py::value_error(std::string(who) + ": out " + shape_str(out) + " partially overlaps " + inname + " " +
                          shape_str(in) + "; only exact in-place is allowed. Fix: write to a separate tensor.");
}

void check_cuda_float(const char* who, const at::Tensor& t, const std::string& name) {
  if (!t.is_cuda())
    throw py::type_error(std::string(who) + ": " + name + " must be a CUDA tensor, got " + describe(name.c_str(), t) +
                         ". Fix: move it to the GPU with .cuda().");
  if (dtype_code(t.scalar_type()) < 0)
    throw py::type_error(std::string(who) + ": " + name + " has dtype " + dtype_str(t) +
                         "; supported: float32, float16, bfloat16. Fix: cast with .float() / .half() / .bfloat16().");
}

}  // namespace gpuos
