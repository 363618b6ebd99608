// csrc/tensor/cpu_eval.cpp -- see cpu_eval.h.
#include "tensor/cpu_eval.h"

#include "device_src/dataops.h"
#include "tensor/record.h"

#include <cstring>

#include "device_src/interp.h"
#include "device_src/numeric.h"
#include "ops/op_table.h"
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {

template <class F>
void cpu_ew(const std::vector<const at::Tensor*>& ins, const std::vector<float>& consts, at::Tensor& out, float s0, float s1) {
  const int64_t n = out.numel();
  const uint32_t dto = (uint32_t)dtype_code(out.scalar_type());
  void* op = out.data_ptr();
  for (int64_t i = 0; i < n; ++i) {
    float v[3] = {0.f, 0.f, 0.f};
    for (size_t k = 0; k < ins.size(); ++k)
      v[k] = ins[k] ? load_f32(ins[k]->data_ptr(), (uint32_t)dtype_code(ins[k]->scalar_type()), i) : consts[k];
    store_f32(op, dto, i, F::apply(v[0], v[1], v[2], s0, s1));
  }
}

void cpu_apply(const std::string& opname, py::sequence inputs, at::Tensor out, float s0, float s1) {
  const uint32_t op = op_id(opname, "gpuos_ext._testing.cpu_apply", kKindEw);
  const OpInfo& info = kOps[op];
  if ((uint32_t)inputs.size() != info.arity) throw py::value_error("cpu_apply: wrong arity");
  if (out.is_cuda() || !out.is_contiguous() || dtype_code(out.scalar_type()) < 0)
    throw py::type_error("cpu_apply: out must be a contiguous CPU float32/float16/bfloat16 tensor");
  std::vector<at::Tensor> hold;
  std::vector<const at::Tensor*> ins;
  std::vector<float> consts;
  hold.reserve(3);
  for (auto item : inputs) {
    if (is_number(item.ptr())) {
      ins.push_back(nullptr);
      consts.push_back(item.cast<float>());
      continue;
    }
    at::Tensor t = item.cast<at::Tensor>();
    if (t.is_cuda() || t.sizes() != out.sizes() || !t.is_contiguous() || dtype_code(t.scalar_type()) < 0)
      throw py::type_error("cpu_apply: inputs must be contiguous CPU float tensors with out's shape");
    hold.push_back(t);
    ins.push_back(&hold.back());
    consts.push_back(0.f);
  }
  switch (op) {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  case id: if constexpr (kind == 0) cpu_ew<functor>(ins, consts, out, s0, s1); break;
#include "device_src/ops.def"
#undef GPUOS_OP
    default: break;
  }
}

template <class R>
void cpu_reduce_rows(uint32_t op, const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const uint32_t dt = (uint32_t)dtype_code(x.scalar_type());
  const void* xp = x.data_ptr();
  void* op_ = out.data_ptr();
  for (int64_t r = 0; r < rows; ++r) {
    float acc = R::init();
    for (int64_t j = 0; j < cols; ++j) acc = R::combine(acc, load_f32(xp, dt, r * cols + j));
    if (op == kOp_softmax || op == kOp_log_softmax) {
      float sum = 0.f;
      for (int64_t j = 0; j < cols; ++j) sum += m_exp(load_f32(xp, dt, r * cols + j) - acc);
      const float lse = m_log(sum);
      for (int64_t j = 0; j < cols; ++j) {
        const float v = load_f32(xp, dt, r * cols + j) - acc;
        store_f32(op_, dt, r * cols + j, op == kOp_softmax ? m_exp(v) / sum : v - lse);
      }
    } else {
      store_f32(op_, dt, r, op == kOp_mean ? acc / (float)cols : acc);
    }
  }
}

void cpu_reduce(const std::string& opname, at::Tensor x, at::Tensor out) {
  const uint32_t op = op_id(opname, "gpuos_ext._testing.cpu_reduce", kKindReduce);
  if (x.is_cuda() || x.dim() != 2 || !x.is_contiguous() || !out.is_contiguous() || x.scalar_type() != out.scalar_type() ||
      dtype_code(x.scalar_type()) < 0)
    throw py::type_error("cpu_reduce: x must be a contiguous 2-D CPU float tensor and out contiguous of x's dtype");
  switch (op) {
#define GPUOS_OP(id, name, arity, kind, functor, ns, snames, d0, d1, aten) \
  case id: if constexpr (kind == 1) cpu_reduce_rows<functor>(op, x, out); break;
#include "device_src/ops.def"
#undef GPUOS_OP
    default: break;
  }
}

// Evaluate interpreter bytecode (device_src/interp.h, built by gpuos.fusion) on CPU tensors.
void cpu_run_program(py::bytes program, py::sequence inputs, at::Tensor out) {
  const std::string blob = program;
  if (blob.size() != sizeof(Program))
    throw py::value_error("cpu_run_program: program must be " + std::to_string(sizeof(Program)) + " bytes, got " +
                          std::to_string(blob.size()));
  Program p;
  std::memcpy(&p, blob.data(), sizeof p);
  if (p.ninputs != (uint32_t)inputs.size() || p.ninputs > kProgMaxInputs || p.ninstr > kProgMaxInstr ||
      p.out_reg >= kProgMaxRegs)
    throw py::value_error("cpu_run_program: malformed program or wrong number of inputs");
  for (uint32_t i = 0; i < p.ninstr; ++i) {
    const Instr& I = p.code[i];
    const bool row_red = I.op == kOpRowRed && I.nsrc == 1 &&
                         (I.s1 == (float)kOp_sum || I.s1 == (float)kOp_mean || I.s1 == (float)kOp_amax || I.s1 == (float)kOp_amin);
    bool ok = I.dst < kProgMaxRegs && I.nsrc <= 3 &&
              (row_red || I.op == kOpConst || I.op == kOpRoundF16 || I.op == kOpRoundBF16 || (I.op < kNumOps && kOps[I.op].kind == 0));
    for (uint32_t k = 0; k < I.nsrc; ++k) ok &= I.src[k] < kProgMaxRegs;
    if (!ok) throw py::value_error("cpu_run_program: malformed instruction " + std::to_string(i));
  }
  if (out.is_cuda() || !out.is_contiguous() || dtype_code(out.scalar_type()) < 0)
    throw py::type_error("cpu_run_program: out must be a contiguous CPU float32/float16/bfloat16 tensor");
  std::vector<at::Tensor> ins;
  for (auto item : inputs) {
    at::Tensor t = item.cast<at::Tensor>();
    if (t.is_cuda() || t.sizes() != out.sizes() || !t.is_contiguous() || dtype_code(t.scalar_type()) < 0)
      throw py::type_error("cpu_run_program: inputs must be contiguous CPU float tensors with out's shape");
    ins.push_back(t);
  }
  const int64_t n = out.numel();
  float v[kProgMaxInputs];
  const auto load = [&](int64_t e) {
    for (size_t k = 0; k < ins.size(); ++k) v[k] = load_f32(ins[k].data_ptr(), (uint32_t)dtype_code(ins[k].scalar_type()), e);
  };
  uint32_t rop[kRowMaxRed];
  float rscale[kRowMaxRed], red[kRowMaxRed];
  const uint32_t nred = row_reductions(p, rop, rscale);
  if (nred == 0) {
    for (int64_t e = 0; e < n; ++e) {
      load(e);
      store_f32(out.data_ptr(), (uint32_t)dtype_code(out.scalar_type()), e, run_program(p, v));
    }
    return;
  }
  // A row program (kOpRowRed inside): rows are out's last dim; one pass per reduction, then the output pass,
  // through the worker's vector interpreter (fused_prog_op: 4 elements per call), the row folded in order.
  const int64_t cols = out.dim() ? out.size(-1) : 0;
  if (cols == 0) throw py::value_error("cpu_run_program: a row program needs an output with a non-empty last dim");
  constexpr uint32_t V = 4;
  float r[kProgMaxRegs][V], val[V];
  for (int64_t row = 0; row < n; row += cols) {
    for (uint32_t q = 0; q <= nred; ++q) {
      float acc = q < nred ? row_init(rop[q]) : 0.0f;
      for (int64_t c0 = 0; c0 < cols; c0 += V) {
        for (uint32_t u = 0; u < V; ++u) {
          if (c0 + u < cols) load(row + c0 + u);
          for (size_t k = 0; k < ins.size(); ++k) r[k][u] = c0 + u < cols ? v[k] : 0.0f;
        }
        run_program_v<V>(p, r, val, red, q < nred ? q : ~0u);
        for (uint32_t u = 0; u < V && c0 + u < cols; ++u) {
          if (q < nred) acc = row_combine(rop[q], acc, val[u]);
          else store_f32(out.data_ptr(), (uint32_t)dtype_code(out.scalar_type()), row + c0 + u, val[u]);
        }
      }
      if (q < nred) red[q] = acc * rscale[q];
    }
  }
}

// A data-movement op (device_src/dataops.h) on CPU tensors, through the same plan (TensorRefs) the recording
// builds and the same per-element rule the worker runs; argmax's rows in the worker's order. Returns how many
// elements met an index out of range.
int64_t cpu_data(const std::string& opname, at::Tensor out, py::sequence inputs, py::sequence bits, int64_t dim,
                 int64_t ival, bool keepdim) {
  const uint32_t op = op_id(opname, "gpuos_ext._testing.cpu_data", kKindData);
  const uint32_t nin = (uint32_t)inputs.size();
  if (nin != kOps[op].arity || bits.size() != inputs.size())
    throw py::value_error("cpu_data: '" + opname + "' takes " + std::to_string(kOps[op].arity) + " inputs and bits");
  at::Tensor ins[3];
  uint64_t b[3] = {0, 0, 0};
  for (uint32_t k = 0; k < nin; ++k) {
    if (!inputs[k].is_none()) ins[k] = inputs[k].cast<at::Tensor>();
    b[k] = bits[k].cast<uint64_t>();
  }
  for (int k = -1; k < (int)nin; ++k) {
    const at::Tensor& t = k < 0 ? out : ins[k];
    if (t.defined() && (t.is_cuda() || dtype_code_any(t.scalar_type()) < 0 || t.dim() > (int64_t)kMaxDims))
      throw py::type_error("cpu_data: tensors must be CPU tensors of float32/float16/bfloat16/int64/int32/bool, "
                           "at most 8 dims");
  }
  const DataPlan p = plan_data(op, out, ins, nin, b, dim, ival, keepdim);
  int64_t faults = 0;
  if (op == kOp_argmax) {
    const TensorRef &ro = p.refs[0], &rx = p.refs[1];
    const int64_t cols = rx.ndim ? rx.sizes[rx.ndim - 1] : 1;
    for (uint64_t row = 0; row < p.total; ++row) {
      float bv = 0.f;
      int64_t bi = -1;
      for (int64_t j = 0; j < cols; ++j) {
        const float v = load_f32((const void*)rx.ptr, rx.dtype, ref_offset(rx, (int64_t)row * cols + j));
        if (bi < 0 || arg_before(v, j, bv, bi)) bv = v, bi = j;
      }
      *(int64_t*)data_addr(ro, (int64_t)row) = bi;
    }
    return 0;
  }
  for (uint64_t e = 0; e < p.total; ++e) faults += data_elem(p.proto, p.refs, (int64_t)e);
  return faults;
}

}  // namespace gpuos
