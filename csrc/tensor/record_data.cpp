// csrc/tensor/record_data.cpp -- the data-movement ops' tensors -> TensorRefs -> Runtime::record_data (see record.h).
#include <algorithm>
#include <cstring>

#include "device_src/numeric.h"
#include "tensor/record.h"

namespace gpuos {

namespace {

// t's TensorRef without dim `dim` (the indexed dim of a gather / scatter: it is addressed through the index).
TensorRef ref_without(const at::Tensor& t, int64_t dim) {
  TensorRef r{};
  r.ptr = (uint64_t)(uintptr_t)t.data_ptr();
  r.dtype = (uint32_t)dtype_code_any(t.scalar_type());
  int m = 0;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i == dim) continue;
    r.sizes[m] = t.size(i);
    r.strides[m] = t.stride(i);
    ++m;
  }
  for (int i = m; i < (int)kMaxDims; ++i) r.sizes[i] = 1, r.strides[i] = 0;
  r.ndim = (uint32_t)m;
  return r;
}

// The indexed dim of t: sizes[0] its extent, strides[0] its stride, sizes[1] the elements per index.
TensorRef dim_ref(const at::Tensor& t, int64_t dim) {
  TensorRef r{};
  r.ndim = 2;
  r.sizes[0] = t.size(dim);
  r.strides[0] = t.stride(dim);
  int64_t inner = 1;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (i != dim) inner *= t.size(i);
  r.sizes[1] = inner;
  for (int i = 2; i < (int)kMaxDims; ++i) r.sizes[i] = 1;
  return r;
}

void set_scalar_bits(SubOp& p, int64_t v) {
  p.scalar[0] = bits_f32((uint32_t)((uint64_t)v & 0xffffffffu));
  p.scalar[1] = bits_f32((uint32_t)((uint64_t)v >> 32));
}

}  // namespace

DataPlan plan_data(uint32_t op, const at::Tensor& out, const at::Tensor* ins, uint32_t nin, const uint64_t* bits,
                   int64_t dim, int64_t ival, bool keepdim) {
  DataPlan p;
  SubOp& proto = p.proto;
  proto.op = op;
  proto.flags = kFlagStrided;
  proto.dtype = (uint32_t)dtype_code_any(out.scalar_type());
  TensorRef* refs = p.refs;
  switch (op) {
    case kOp_gather: {
      const at::Tensor &w = ins[0], &idx = ins[1];
      const int64_t ni = idx.dim();
      std::vector<int64_t> src(ni), dst(ni);
      for (int64_t k = 0; k < ni; ++k) src[k] = dim + k, dst[k] = k;
      p.hold[0] = ni ? out.movedim(src, dst) : out.unsqueeze(0);  // index dims first
      refs[0] = make_ref(p.hold[0], (int)p.hold[0].dim());
      refs[1] = ref_without(w, dim);
      refs[2] = make_ref(idx, (int)ni);
      refs[3] = dim_ref(w, dim);
      p.nref = 4;
      p.reads = {w, idx};
      p.total = (uint64_t)out.numel();
      return p;
    }
    case kOp_scatter: {
      const at::Tensor &src = ins[0], &idx = ins[1];
      p.hold[0] = src.movedim(dim, 0);
      refs[0] = ref_without(out, dim);
      refs[1] = make_ref(p.hold[0], (int)p.hold[0].dim());
      refs[2] = make_ref(idx, (int)idx.dim());
      refs[3] = dim_ref(out, dim);
      set_scalar_bits(proto, ival);
      p.nref = 4;
      p.reads = {src, idx};
      p.total = (uint64_t)src.numel();
      return p;
    }
    case kOp_argmax: {
      const at::Tensor& x = ins[0];
      const int64_t cols = x.size(-1);
      if (cols == 0 || out.numel() == 0) return p;  // total 0: nothing to record
      p.hold[0] = keepdim ? out.squeeze(-1) : out;
      refs[0] = make_ref(p.hold[0], (int)x.dim() - 1);
      refs[1] = make_ref(x, (int)x.dim());
      p.nref = 2;
      p.reads = {x};
      p.total = (uint64_t)(x.numel() / cols);
      p.per_tile = (uint64_t)std::max<int64_t>(1, std::min<int64_t>(32, (int64_t)kTileElems / cols));
      return p;
    }
    default: break;
  }
  // Elementwise data ops: every input broadcast to out's shape (stride-0 views), constants in the descriptor.
  refs[0] = make_ref(out, (int)out.dim());
  for (uint32_t k = 0; k < nin; ++k) {
    if (!ins[k].defined()) {
      proto.flags |= kFlagConst0 << k;
      proto.in[k] = bits[k];
      continue;
    }
    p.hold[k] = ins[k].sizes() == out.sizes() ? ins[k] : ins[k].expand(out.sizes());
    refs[k + 1] = make_ref(p.hold[k], (int)out.dim());
    p.reads.push_back(p.hold[k]);
  }
  if (op == kOp_add_int || op == kOp_cmp) set_scalar_bits(proto, ival);
  p.nref = nin + 1;
  p.total = (uint64_t)out.numel();
  return p;
}

void record_data_tensors(Runtime& rt, uint32_t op, const at::Tensor& out, const at::Tensor* ins, uint32_t nin,
                         const uint64_t* bits, int64_t dim, int64_t ival, bool keepdim) {
  const DataPlan p = plan_data(op, out, ins, nin, bits, dim, ival, keepdim);
  if (p.total == 0) return;
  Operand reads[3];
  for (size_t k = 0; k < p.reads.size(); ++k) reads[k] = operand(p.reads[k]);
  rt.record_data(p.proto, p.refs, p.nref, operand(out), reads, (uint32_t)p.reads.size(), p.total, p.per_tile);
}

}  // namespace gpuos
