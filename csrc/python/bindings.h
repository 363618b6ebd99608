// csrc/python/bindings.h -- the registration functions of gpuos_ext's parts (called by module.cpp).
#pragma once
#include <torch/extension.h>

namespace gpuos {

// register_elementwise, register_op, install, switch, rollback, user_ops, generation_info, ... (inject.cpp)
void add_injection_bindings(pybind11::module_& m);
// Tape, _capture_begin / _capture_mark / _capture_end (programs.cpp; gpuos/programs.py)
void add_program_bindings(pybind11::module_& m);
// _host_sampler_start / _host_sampler_stop: a sampling profiler of one host thread (host_sampler.cpp)
void add_host_sampler_bindings(pybind11::module_& m);
// gpuos_ext._testing: CPU evaluators, liveness and front probes, host-memory probe (testing.cpp)
void add_testing_module(pybind11::module_& m);

}  // namespace gpuos
