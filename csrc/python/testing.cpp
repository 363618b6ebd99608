// csrc/python/testing.cpp -- gpuos_ext._testing: entry points for tests and diagnostics only.
#include <torch/extension.h>

#include "core/runtime.h"
#include "driver/cuda_api.h"
#include "python/bindings.h"
#include "sched/api.h"
#include "sched/deferred.h"
#include "sched/dispatch.h"
#include "tensor/cpu_eval.h"

namespace py = pybind11;

namespace gpuos {

void add_testing_module(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "Test-only entry points (CPU evaluators, probes); not a stable API.");
  t.def("probe_host_memory", &probe_host_memory, py::arg("n") = 1 << 20);
  t.def("set_nvrtc_search_dirs", &set_nvrtc_search_dirs);
  t.def("front_diag", &front_diag, py::arg("tensor"),
        "Why the __torch_function__ front would or would not record an op on `tensor` here.");
  t.def("liveness_probe", [](py::handle o) {  // tests: hold C++ references, then ask which Python dropped
    static std::vector<at::Tensor> held;
    calibrate_liveness();
    if (o.is_none()) {
      py::list r;
      for (auto& t : held) r.append(dead_to_python(t, 1));
      held.clear();
      return py::object(r);
    }
    held.push_back(THPVariable_Unpack(o.ptr()));
    return py::object(py::none());
  }, py::arg("tensor"), "Hold a C++ reference to `tensor`; with None: for each held tensor, whether the program "
     "dropped it (the scheduler's fusion liveness rule), then release them.");
  t.def("cpu_apply", &cpu_apply, py::arg("op"), py::arg("inputs"), py::arg("out"), py::arg("s0") = 0.0f,
        py::arg("s1") = 0.0f, "Evaluate an op's device functor on the CPU with g++ (numerics tests).");
  t.def("cpu_run_program", &cpu_run_program, py::arg("program"), py::arg("inputs"), py::arg("out"),
        "Evaluate fused-chain bytecode (gpuos.fusion) with the device functors on the CPU.");
  t.def("fail_next_module_loads", &fail_next_module_loads, py::arg("n"),
        "Fault injection: the next n generation module loads (handovers) fail as an invalid image would.");
  t.def("cpu_reduce", &cpu_reduce, py::arg("op"), py::arg("x"), py::arg("out"),
        "Evaluate a reduction's row rule on the CPU (x: contiguous 2-D).");
}

}  // namespace gpuos
