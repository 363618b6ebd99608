// csrc/python/testing.cpp -- gpuos_ext._testing: entry points for tests and diagnostics only.
#include <torch/extension.h>

#include <chrono>
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <thread>

#include "core/runtime.h"
#include "driver/cuda_api.h"
#include "ops/op_table.h"
#include "python/bindings.h"
#include "sched/api.h"
#include "sched/deferred.h"
#include "sched/dispatch.h"
#include "sched/rewrite.h"
#include "tensor/cpu_eval.h"
#include "tensor/tensor.h"

namespace py = pybind11;

namespace gpuos {

namespace {
std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string l;
  std::getline(f, l);
  return l;
}

// Every runtime's snapshot and every thread's kernel state (name, wait channel, syscall number: 202 futex,
// 16 ioctl = a driver call), without any lock the hang may hold and without the GIL.
std::string hang_report() {
  std::string r = "gpuos hang report\n";
  for (Runtime* rt : runtimes()) r += "  " + rt->snapshot() + "\n";
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string t = std::string("/proc/self/task/") + e->d_name;
      const std::string sc = read_line(t + "/syscall");
      r += "  thread " + std::string(e->d_name) + " (" + read_line(t + "/comm") + "): wchan " +
           read_line(t + "/wchan") + ", syscall " + sc.substr(0, sc.find(' ')) + "\n";
    }
    closedir(d);
  }
  return r;
}
}  // namespace

void add_testing_module(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "Test-only entry points (CPU evaluators, probes); not a stable API.");
  t.def("probe_host_memory", &probe_host_memory, py::arg("n") = 1 << 20);
  t.def("attention_split", &attention_split, py::arg("tiles"), py::arg("kv_len"), py::arg("capacity"),
        py::arg("min_rows") = Config{}.attn_min_rows,
        "KV splits Runtime::record_attention gives a decode attention of `tiles` row-group tiles.");
  t.def("matmul_split", &matmul_split, py::arg("ntile"), py::arg("K"), py::arg("M"), py::arg("variant"),
        py::arg("capacity"), py::arg("items") = Config{}.mm_items,
        "K slices Runtime::record_matmul gives a worker matmul (variant 1: mma, 2: ncol).");
  t.def("matmul_group", &matmul_group, py::arg("ntile"), py::arg("items") = Config{}.mm_items,
        "Column tiles per item of an unsplit tensor-core worker matmul.");
  t.def("ref_offsets", [](const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t e0) {
        if (sizes.size() != strides.size() || sizes.size() > kMaxDims)
          throw std::invalid_argument("ref_offsets: sizes and strides need one length, at most kMaxDims");
        TensorRef r{};
        r.ndim = (uint32_t)sizes.size();
        for (size_t d = 0; d < sizes.size(); ++d) r.sizes[d] = sizes[d], r.strides[d] = strides[d];
        const RefOffs<4> four = ref_offset4(r, e0);
        std::vector<int64_t> walked(four.v, four.v + 4), single;
        for (int64_t u = 0; u < 4; ++u) single.push_back(ref_offset(r, e0 + 32 * u));
        return std::make_pair(walked, single);
      }, py::arg("sizes"), py::arg("strides"), py::arg("e0"),
      "Element offsets of indices e0 + 32 u (u < 4) of a shape: (ref_offset4's, ref_offset's one by one).");
  t.def("capture_tile", &capture_tile, py::arg("per_tile"), py::arg("total"), py::arg("min_units"),
        "Units per descriptor while a program is captured (core/record.cpp).");
  t.def("set_nvrtc_search_dirs", &set_nvrtc_search_dirs);
  t.def("reloc", [](const std::vector<std::tuple<uint64_t, uint64_t, int64_t>>& ranges,
                    const std::vector<uint64_t>& ptrs) {
    Reloc r;
    for (const auto& x : ranges) r.add(std::get<0>(x), std::get<1>(x), std::get<2>(x));
    std::vector<uint64_t> out;
    for (uint64_t p : ptrs) out.push_back(r(p));
    return out;
  }, py::arg("ranges"), py::arg("ptrs"), "Pointers moved by a program's relocation (core/tape.h Reloc).");
  t.def("hazard_levels", [](const std::vector<std::pair<at::Tensor, std::vector<at::Tensor>>>& units) {
        Hazards h;  // the levels the runtime would give these units (out, reads) recorded in order
        std::vector<uint32_t> lv;
        for (const auto& u : units) {
          std::vector<Access> reads;
          for (const at::Tensor& t : u.second) reads.push_back(operand(t).access());
          const Access w = operand(u.first).access();
          lv.push_back(h.level_of(w, reads.data(), (uint32_t)reads.size()));
          h.note(w, reads.data(), (uint32_t)reads.size(), lv.back());
        }
        return lv;
      }, py::arg("units"), "Dependency levels of units [(out, [inputs])] by the hazard model (core/hazards.h).");
  t.def("rewrite_queue", [](py::list spec) {
        // A deferred queue from (kind, op name, out, [ins], fresh, s0, s1) -- kind "ew" (a table op) or "mm" (ins:
        // a, b, bias or None) -- through rewrite_deferred (CPU tensors do: the rewrites read metadata and liveness
        // only). The queue takes the spec's references and empties it, as a step's Python drops its temporaries:
        // a tensor the caller holds elsewhere stays live.
        calibrate_liveness();
        std::vector<DeferredOp> ops;
        for (const py::handle h : spec) {
          const py::tuple e = py::reinterpret_borrow<py::tuple>(h);
          DeferredOp d;
          const std::string kind = e[0].cast<std::string>();
          d.matmul = kind == "mm";
          d.op = d.matmul ? (uint32_t)kOp_mm : op_id(e[1].cast<std::string>(), "rewrite_queue");
          d.out = THPVariable_Unpack(e[2].ptr());
          const py::list ins = e[3].cast<py::list>();
          d.nin = d.matmul ? 3u : (uint32_t)ins.size();
          for (size_t k = 0; k < ins.size() && k < kDeferredMaxIn; ++k)
            if (!ins[k].is_none()) d.in[k] = THPVariable_Unpack(ins[k].ptr());
          d.fresh = e[4].cast<bool>();
          d.s0 = e[5].cast<float>();
          d.s1 = e[6].cast<float>();
          ops.push_back(std::move(d));
        }
        spec.attr("clear")();
        SchedStats st;
        const std::vector<char> dropped = rewrite_deferred(ops, st);
        py::list out;
        for (size_t j = 0; j < ops.size(); ++j) {
          const DeferredOp& d = ops[j];
          py::list ins;
          for (uint32_t k = 0; k < d.nin; ++k)
            ins.append(d.in[k].defined() ? py::object(py::int_((uintptr_t)d.in[k].data_ptr())) : py::object(py::none()));
          py::dict r;
          r["dropped"] = dropped[j] != 0;
          r["kind"] = d.matmul ? "mm" : "ew";
          r["op"] = d.matmul ? std::string("mm") : std::string(kOps[d.op].name);
          r["out"] = (uintptr_t)d.out.data_ptr();
          r["ins"] = ins;
          r["s0"] = d.s0;
          r["s1"] = d.s1;
          out.append(r);
        }
        py::dict counts;
        counts["epilogues"] = st.epilogues;
        counts["copies_folded"] = st.copies_folded;
        counts["dead_ops"] = st.dead_ops;
        return py::make_tuple(out, counts);
      }, py::arg("spec"), "The deferred-queue rewrites (sched/rewrite.h) on a queue of CPU tensors: per op, whether "
         "it is dropped and what it became; the counts.");
  t.def("gqa_source", [](const py::list& copies, const at::Tensor& kv) {
        std::vector<DeferredOp> ops;  // (out, x) copies, as the scheduler defers x's clone
        for (const py::handle h : copies) {
          const py::tuple e = py::reinterpret_borrow<py::tuple>(h);
          DeferredOp d;
          d.op = kOp_copy;
          d.nin = 1;
          d.out = THPVariable_Unpack(e[0].ptr());
          d.in[0] = THPVariable_Unpack(e[1].ptr());
          ops.push_back(std::move(d));
        }
        return gqa_source(ops, ops.size(), kv);
      }, py::arg("copies"), py::arg("kv"), "What decode attention reads for k / v given the deferred copies "
         "[(out, x)] (sched/rewrite.h gqa_source): repeat_kv's source, or kv itself.");
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
  t.def("cpu_data", &cpu_data, py::arg("op"), py::arg("out"), py::arg("inputs"), py::arg("bits"), py::arg("dim") = 0,
        py::arg("ival") = 0, py::arg("keepdim") = false,
        "Run a data-movement op (device_src/dataops.h) on CPU tensors; returns the elements whose index was out of "
        "range.");
  t.def("cpu_reduce", &cpu_reduce, py::arg("op"), py::arg("x"), py::arg("out"),
        "Evaluate a reduction's row rule on the CPU (x: contiguous 2-D).");
  t.def("hang_report", &hang_report, py::call_guard<py::gil_scoped_release>(),
        "Each runtime's control words and the driver call it is in, and each thread's kernel wait (no locks).");
  t.def("watchdog", [](double seconds) {
    // A one-shot report timer for tests that may wedge (a deadline, not a synchronization): faulthandler shows
    // where Python threads are; this shows where the native side is.
    std::thread([seconds] {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      const std::string r = hang_report();
      std::fwrite(r.data(), 1, r.size(), stderr);
      std::fflush(stderr);
    }).detach();
  }, py::arg("seconds"), "After `seconds`, write hang_report() to stderr (one shot, from a native thread).");
}

}  // namespace gpuos
