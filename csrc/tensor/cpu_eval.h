// csrc/tensor/cpu_eval.h -- the device functors and the fused-chain interpreter evaluated on the CPU with g++
// (gpuos_ext._testing): numerics tests of every op without a GPU.
#pragma once
#include <torch/extension.h>

namespace gpuos {

void cpu_apply(const std::string& opname, pybind11::sequence inputs, at::Tensor out, float s0, float s1);
void cpu_reduce(const std::string& opname, at::Tensor x, at::Tensor out);
int64_t cpu_data(const std::string& opname, at::Tensor out, pybind11::sequence inputs, pybind11::sequence bits,
                 int64_t dim, int64_t ival, bool keepdim);
void cpu_run_program(pybind11::bytes program, pybind11::sequence inputs, at::Tensor out);

}  // namespace gpuos
