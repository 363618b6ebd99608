// csrc/python/module.cpp -- the Python module `gpuos_ext`: registration only; the logic lives in the layers
// below (tensor/: explicit API, sched/: scheduler and module-level API, inject/: operator injection).
// The hot submit_* and scheduler entry points are METH_FASTCALL CPython functions (pybind11's dispatcher costs
// more than the whole record path); everything else is bound with pybind11.
#include <torch/csrc/Dtype.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>

#include "config/config.h"
#include "device_src/dataops.h"
#include "device_src/interp.h"
#include "driver/cuda_api.h"
#include "inject/registry.h"
#include "inject/specialize.h"
#include "jit/jit.h"
#include "ops/op_table.h"
#include "python/bindings.h"
#include "sched/api.h"
#include "sched/bytecode.h"
#include "sched/cfront.h"
#include "sched/deferred.h"
#include "sched/dispatch.h"
#include "sched/record.h"
#include "tensor/devices.h"
#include "tensor/errors.h"
#include "tensor/attention.h"
#include "tensor/submit.h"

#ifndef GPUOS_BUILD_TORCH
#define GPUOS_BUILD_TORCH "unknown"
#endif
#ifndef GPUOS_VERSION
#define GPUOS_VERSION "dev"
#endif

namespace py = pybind11;
using namespace gpuos;

namespace {

template <uint32_t OP>
PyObject* submit_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 3)
      throw py::type_error(std::string(kOps[OP].submit_name) + "(a, b, out) takes 3 positional arguments, got " +
                           std::to_string(nargs));
    submit_binary(OP, args[0], args[1], args[2]);
    Py_RETURN_NONE;
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyObject* submit_reduce_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  try {
    static const char* const kNames[4] = {"op", "x", "out", "keepdim"};
    PyObject* a[4] = {nullptr, nullptr, nullptr, nullptr};
    if (nargs > 4)
      throw py::type_error("gpuos.submit_reduce(op, x, out, keepdim=False) takes at most 4 arguments, got " +
                           std::to_string(nargs));
    for (Py_ssize_t i = 0; i < nargs; ++i) a[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      const char* kw = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
      int slot = -1;
      for (int i = 0; i < 4 && kw; ++i)
        if (std::strcmp(kw, kNames[i]) == 0) slot = i;
      if (slot < 0)
        throw py::type_error(std::string("gpuos.submit_reduce() got an unexpected keyword argument '") +
                             (kw ? kw : "?") + "'");
      if (a[slot]) throw py::type_error(std::string("gpuos.submit_reduce() got multiple values for '") + kw + "'");
      a[slot] = args[nargs + k];
    }
    for (int i = 0; i < 3; ++i)
      if (!a[i]) throw py::type_error(std::string("gpuos.submit_reduce() missing required argument '") + kNames[i] + "'");
    int keepdim = 0;
    if (a[3] && (keepdim = PyObject_IsTrue(a[3])) < 0) throw py::error_already_set();
    submit_reduce(a[0], a[1], a[2], keepdim != 0);
    Py_RETURN_NONE;
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyMethodDef kFastMethods[] = {
#define GPUOS_SEED_OP(name, id)                                                                   \
  {"submit_" #name, (PyCFunction)(void (*)(void))submit_fast<id>, METH_FASTCALL,                   \
   "submit_" #name "(a, b, out)\n\nRecord out = " #name "(a, b) for CUDA tensors of one dtype (float32, "  \
   "float16, bfloat16) and equal shape, any strides. Runs at the next flush()."},
    GPUOS_SEED_OP(add, kOp_add) GPUOS_SEED_OP(sub, kOp_sub) GPUOS_SEED_OP(mul, kOp_mul) GPUOS_SEED_OP(div, kOp_div)
#undef GPUOS_SEED_OP
    {"sched_ew", (PyCFunction)(void (*)(void))sched_ew, METH_FASTCALL,
     "sched_ew(op_id, mode, inputs, out, s0, s1, size_threshold) -> Tensor | int\n\nThe scheduler's record path "
     "(gpuos/scheduler.py): validates, allocates the output and defers the op; an int is the fallback reason."},
    {"submit_reduce", (PyCFunction)(void (*)(void))submit_reduce_fast, METH_FASTCALL | METH_KEYWORDS,
     "submit_reduce(op, x, out, keepdim=False)\n\nRecord a last-dim reduction of x into out: op in ('sum', "
     "'mean', 'amax', 'amin') (out: x's shape without the last dim, or with it as 1 when keepdim), or 'softmax' / "
     "'log_softmax' (out: x's shape; may be x itself). float32 / float16 / bfloat16, any strides. Runs at the next "
     "flush()."},
    {"sched_dispatch", (PyCFunction)(void (*)(void))sched_dispatch, METH_FASTCALL,
     "sched_dispatch(mode, func, types, args=(), kwargs=None)\n\nThe scheduler's __torch_dispatch__ (bound to the "
     "mode): records ops with a fast spec (sched_set_fast), hands the rest to mode._dispatch_py, runs rejected ops "
     "through mode._eager(func, args, kwargs, reason)."},
    {"sched_function", (PyCFunction)(void (*)(void))sched_function, METH_FASTCALL,
     "sched_function(front, func, types, args=(), kwargs=None)\n\nThe scheduler's __torch_function__ front (bound "
     "to its TorchFunctionMode): records plain functional elementwise calls (sched_set_front) when a GpuosScheduler "
     "is the innermost dispatch mode and nothing else could see the op first; calls func(*args, **kwargs) otherwise."},
    {"sched_cast", (PyCFunction)(void (*)(void))sched_cast, METH_FASTCALL,
     "sched_cast(x, dtype, out, size_threshold) -> Tensor | int: a deferred copy / cast (aten::_to_copy, copy_)."},
    {"sched_matmul", (PyCFunction)(void (*)(void))sched_matmul, METH_FASTCALL,
     "sched_matmul(a, b, bias, alpha, beta) -> Tensor | int: a deferred skinny matmul (aten::mm / addmm)."},
    {"sched_attention", (PyCFunction)(void (*)(void))sched_attention, METH_FASTCALL,
     "sched_attention(q, k, v, attn_mask, is_causal, scale, want_lse) -> (out, lse | None) | int: deferred decode "
     "attention (the SDPA backend ops)."},
    {"sched_data", (PyCFunction)(void (*)(void))sched_data, METH_FASTCALL,
     "sched_data(op_id, out, ins, bits, dim, ival, keepdim, fresh, size_threshold) -> out | int: a deferred "
     "data-movement op (gather, scatter, argmax, where, add_int, mul_int, arange, fill; gpuos/_data_handlers.py)."},
    {"sched_reduce", (PyCFunction)(void (*)(void))sched_reduce, METH_FASTCALL,
     "sched_reduce(op_id, x, keepdim, size_threshold) -> Tensor | int: a deferred last-dim reduction."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PYBIND11_MODULE(_gpuos_C, m) {  // imported through gpuos_ext.py (torch first, build check)
  m.doc() = "GPUOS core: work queue, elastic persistent worker, NVRTC JIT (see README.md)";
  init_exceptions(m);
  PyModule_AddFunctions(m.ptr(), kFastMethods);
  set_generation_ready_hook([](uint32_t) { adopt_generation_everywhere(); });
  init_deferred();
  add_injection_bindings(m);
  add_host_sampler_bindings(m);
  // NVRTC (and nvJitLink) may come from the nvidia-cuda-nvrtc / nvidia-nvjitlink wheels (CUDA builds of torch install it): find its lib dirs.
  try {
    py::object spec = py::module_::import("importlib.util").attr("find_spec")("nvidia");
    std::vector<std::string> dirs;
    if (!spec.is_none() && !spec.attr("submodule_search_locations").is_none()) {
      py::object glob = py::module_::import("glob").attr("glob");
      for (auto base : spec.attr("submodule_search_locations"))
        for (const char* pat : {"/*/lib/libnvrtc.so*", "/*/lib/libnvJitLink.so*"})  // NVRTC and nvJitLink wheels
          for (auto lib : glob(py::str(base) + py::str(pat))) {
            std::string dir = py::str(py::module_::import("os.path").attr("dirname")(lib));
            if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(std::move(dir));
          }
    }
    set_nvrtc_search_dirs(std::move(dirs));
  } catch (py::error_already_set& e) {
    // No nvidia namespace package: CUDA_HOME / GPUOS_NVRTC_PATH / the loader path still apply.
  }

  m.def("init", &init, py::arg("capacity") = 0, py::arg("threads_per_block") = 0,
        py::arg("worker_blocks") = 0, py::arg("idle_us") = 200.0,
        "Start the runtime on the current CUDA device (idempotent). capacity: descriptor ring slots "
        "(one per 4096-element tile; 0 = 4096); threads_per_block (0 = 256); worker_blocks: persistent grid size "
        "(0 = about 1/4 of the SMs); idle_us: the worker exits after this long with nothing to do. On a device "
        "whose runtime runs already, a capacity or threads_per_block other than 0 and its own raises ValueError.");
  m.def("submit_many", &submit_many, py::arg("op"), py::arg("a_list"), py::arg("b_list"), py::arg("out_list"),
        "Record out_list[i] = op(a_list[i], b_list[i]) for every i; op in ('add', 'sub', 'mul', 'div').");
  m.def("pending", &pending_devices, "Number of devices with recorded work that no flush() has yet ordered a stream after (unpublished, or published early).");
  m.def(
      "yield_worker",
      [](py::object device) {
        if (device.is_none()) {
          for (Runtime* r : runtimes()) r->request_yield();
        } else if (Runtime* r = runtime_if(device.cast<int>())) {
          r->request_yield();
        }
      },
      py::arg("device") = py::none(),
      "Ask the resident worker of `device` (None: of every device) to exit as soon as nothing published is "
      "pending (before foreign heavy kernels: cuBLAS, cuDNN, NCCL collectives).");
  m.def(
      "submit_matmul",
      [](py::handle a, py::handle b, py::handle out, py::handle bias, float alpha, float beta) {
        submit_matmul(a.ptr(), b.ptr(), out.ptr(), bias.ptr(), alpha, beta);
      },
      py::arg("a"), py::arg("b"), py::arg("out"), py::arg("bias") = py::none(), py::arg("alpha") = 1.0f,
      py::arg("beta") = 1.0f,
      "Record out = alpha * a @ b + beta * bias on the worker (a: M x K, b: K x N, out: M x N, bias None or "
      "broadcast to out; float32 / float16 / bfloat16, one dtype, any strides; fp32 accumulation). Built for "
      "skinny products (M <= 64: decode activations against a weight); b = w.t() of a Linear is the fast layout. "
      "Runs at the next flush().");
  m.def(
      "flush",
      [](bool sync, py::object stream, py::object device) {
        return flush(sync, stream, device.is_none() ? -1 : device.cast<int>());
      },
      py::arg("sync") = false, py::arg("stream") = py::none(), py::arg("device") = py::none(),
      "Publish pending work (stream-ordered, no host sync) of one device -- `device`, or the current device when "
      "`stream` (a raw cudaStream_t of that device) is given -- or, with neither, of every device, each on the "
      "calling thread's current stream of that device; sync=True also waits for those devices. Returns [(device, "
      "stream)]: streams the scheduler's deferred ops went out on that are not the target (gpuos.flush makes the "
      "target wait for them).");
  m.def("shutdown", &shutdown, "Complete pending work, stop the worker and free the queue. init() may follow.");
  m.def("stats", &stats, "Counters: submitted, batches, flushes, worker_launches, handovers, jit_compiles, ...");
  m.def("clear_index_faults", [] {
    for (Runtime* rt : runtimes()) {
      RtLock lk(*rt);
      rt->clear_index_fault();
    }
  }, "Reset stats()['index_faults'] (the worker's flag: a data-movement op met an index out of range).");
  m.def("is_initialized", [] { return !runtimes().empty(); });
  m.def("worker_trace", [] {
    py::dict d;
    for (int dev = 0; dev < kMaxDevices; ++dev) {
      Runtime* rt = runtime_if(dev);
      if (!rt) continue;
      uint64_t dropped = 0;
      std::vector<TraceRec> recs;
      {
        std::lock_guard<std::mutex> lk(rt->mu);
        recs = rt->take_trace(&dropped);
      }
      py::list l;
      for (const TraceRec& r : recs) {
        const int64_t b = r.block == kTraceOpen     ? -1
                          : r.block == kTraceItem   ? -2
                          : r.block == kTraceLaunch ? -3
                                                    : (int64_t)r.block;
        l.append(py::make_tuple(b, r.seq, r.idx, r.k, r.t0, r.load_ns, r.exec_ns));
      }
      d[py::int_(dev)] = py::dict(py::arg("records") = l, py::arg("dropped") = dropped);
    }
    return d;
  }, "Claim trace since the last call, per device: {'records': [(block, seq, idx, k, t0_ns, load_ns, exec_ns)], "
     "'dropped': n}; block -1 = the poller filling batch seq's slot (idx = ring start, k = count); load_ns includes the wait for the previous batch; block -2 = one sub-op (seq = its SM, idx = its ring index; a decode-attention or split-matmul item: k = 1 if it also combined / finished its tile, load_ns = the item, exec_ns = the combine / finish; a fused chain: k = 2 tier 2 / 3 interpreter, any other: k = 4 + its kind; load_ns = its arguments fetched, exec_ns = the rest); block -3 = a worker launch (seq = its gen; k = 0 its start: idx = the first batch it looks for, load_ns = its standby flags; k = 1 its exit, 3 if it ran work: idx = the first batch it did not fill). Needs GPUOS_TRACE=<records "
     "per block> before init; call after flush(sync=True). See tools/worker_trace.py.");
  m.def("runtime_info", [] {
    py::dict d;
    for (int dev = 0; dev < kMaxDevices; ++dev)
      if (Runtime* rt = runtime_if(dev)) d[py::int_(dev)] = rt->describe();
    return d;
  }, "Per initialised device: GPU, grid, worker resources.");
  m.def("config", [] {
    py::dict d;
    for (const std::string& line : split(describe_env_config(), '\n')) {
      const size_t eq = line.find('=');
      d[py::str(line.substr(0, eq))] = line.substr(eq + 1);
    }
    return d;
  }, "The settings read from the environment (GPUOS_* variables), as read at the last init() or first use.");
  m.def("jit_compile", [](const std::string& arch) { return py::bytes(jit_compile_arch(arch)); }, py::arg("arch"),
        "Compile the embedded device sources with NVRTC for `arch` ('sm_90', 'compute_90'); returns the image.");
  m.def("nvrtc_version", [] {
    int a = 0, b = 0;
    nvrtc().nvrtcVersion(&a, &b);
    return py::make_tuple(a, b);
  });
  m.def("nvrtc_path", [] { return nvrtc().path; });
  m.def("jit_arch_for", &jit_arch_for, py::arg("cc_major"), py::arg("cc_minor"),
        "The arch the runtime compiles for a GPU of compute capability (major, minor): 'sm_XY', or PTX for the "
        "newest arch this NVRTC knows below it ('compute_XY'). CudaError if NVRTC knows none.");
  m.def("jit_newest_arch", &jit_newest_virtual_arch,
        "'compute_<newest arch this NVRTC knows>': the target of device-code checks when no GPU names one.");
  m.def("driver_version", [] {
    int v = 0;
    GPUOS_CU(driver().cuDriverGetVersion(&v));
    return py::make_tuple(v / 1000, (v % 1000) / 10);
  }, "The CUDA driver's API version (major, minor); CudaError without a driver.");
  m.def("device_sources", [] {
    py::dict d;
    for (auto& kv : embedded_sources()) d[py::str(kv.first)] = kv.second;
    return d;
  });
  m.def("jit_cache_dir", &jit_cache_dir);
  m.def("op_table", [] {
    py::list l;
    for (uint32_t i = 0; i < kNumOps; ++i) {
      const OpInfo& o = kOps[i];
      py::list defaults;
      if (o.nscalars > 0) defaults.append(o.d0);
      if (o.nscalars > 1) defaults.append(o.d1);
      py::list sn, aten;
      for (auto& x : split(o.scalar_names, ',')) sn.append(x);
      for (auto& x : split(o.aten, '|')) aten.append(x);
      l.append(py::dict(py::arg("id") = i, py::arg("name") = o.name, py::arg("arity") = o.arity,
                        py::arg("kind") = o.kind == kKindEw ? "ew" : o.kind == kKindReduce ? "reduce" : o.kind == kKindMatmul ? "matmul" : o.kind == kKindData ? "data" : "attention", py::arg("functor") = o.functor,
                        py::arg("scalars") = sn, py::arg("defaults") = defaults, py::arg("aten") = aten));
    }
    return l;
  });
  m.def("submit", &submit_generic, py::arg("op"), py::arg("inputs"), py::arg("out"),
        "submit(op, inputs, out, **scalars): record out = op(*inputs) for any elementwise op of the table; "
        "inputs are CUDA tensors (broadcast to out.shape, mixed float dtypes) or Python numbers.");
  m.def("sched_flush", &sched_flush, py::arg("cause") = "explicit", py::arg("this_thread") = false,
        "Publish the scheduler's deferred ops (lowered, fused) on the streams they were recorded on; returns "
        "[(device, stream)]. this_thread: only the devices this thread deferred ops on since its last such flush.");
  m.def("sched_flush_for", &sched_flush_for, py::arg("args"), py::arg("kwargs"), py::arg("cause") = "dependency",
        py::arg("yield_worker") = 0,
        "Before an eager op: publish deferred ops that share storage with the op's tensors (and explicit-API work "
        "pending on the devices of its tensors); returns [(device, stream)]. yield_worker: then ask the workers of "
        "those devices to yield their SMs: 1 always (before a heavy or collective kernel), 2 only while a live "
        "window keeps a worker resident (before any other kernel).");
  m.def("sched_live_window_open", &sched_live_window_open, py::arg("us"),
        "A scheduler context's flush timer starts: worker launches idle at least `us` (GPUOS_LIVE_IDLE_US, when "
        "set, instead) until the matching close, so one worker stays resident across the timer's flushes; "
        "returns the window applied (0: none).");
  m.def("sched_live_window_close", &sched_live_window_close, py::arg("us"),
        "Close a window sched_live_window_open returned; the last close asks the resident workers to leave.");
  m.def("sched_flush_due", &sched_flush_due, py::arg("age_s"), "Timer flush: publish deferred ops older than age_s.");
  m.def("sched_set_timer_off_gil", &set_timer_off_gil, py::arg("on"),
        "The flush timer analyses, emits and publishes without the GIL (GPUOS_TIMER_OFF_GIL=1; off by default: "
        "docs/design/limitations.md).");
  m.def("sched_timer_off_gil", &timer_off_gil);
  m.def("sched_stats", &sched_stats);
  m.def("sched_fast_ops", &sched_fast_ops,
        "The overloads sched_dispatch records without calling Python (sorted names).");
  m.def("sched_front_ops", &sched_front_ops, "The callables sched_function records (sorted).");
  m.def("sched_set_front", &sched_set_front, py::arg("table"), py::arg("sched_type"),
        "Replace sched_function's table {callable: (op_id, mode, nin, d0, d1, scalars, number_ok)}; sched_type: the "
        "scheduler class that must be the innermost dispatch mode.");
  m.def("sched_set_fast", &sched_set_fast, py::arg("table"),
        "Replace sched_dispatch's table {OpOverload: (op_id, mode, nin, d0, d1, scalars, number_ok)}; scalars: 0 "
        "none, 1 alpha, 2 rounding_mode must be None.");
  m.def("sched_set_nodata", &sched_set_nodata, py::arg("overloads"), py::arg("front_views"),
        "Replace the calls that read no tensor data: overloads sched_dispatch runs at once (views, metadata, "
        "allocation), and torch callables sched_function runs below the dispatch modes (views of plain CUDA "
        "tensors).");
  m.def("sched_set_cfront_native", [](py::list overloads, py::dict reductions) {
          std::vector<PyObject*> ovs;
          for (py::handle h : overloads) ovs.push_back(h.ptr());
          std::vector<std::pair<PyObject*, uint32_t>> red;
          for (auto [ov, id] : reductions) red.emplace_back(ov.ptr(), id.cast<uint32_t>());
          cfront_set_native(ovs, red);
        }, py::arg("overloads"), py::arg("reductions"),
        "The overloads the dispatcher front records itself (sched/cfront.h CfrontNative: matmuls, casts, clone, "
        "cat, layer norm, fills, where, arange, comparisons, embedding, efficient SDPA, index_copy_; others in the "
        "list are ignored) and the last-dim reductions {overload: op id} -- those no registered op took.");
  m.def("sched_bits_of", [](py::handle v, py::handle dtype) {
        if (!THPDtype_Check(dtype.ptr())) throw py::type_error("sched_bits_of: dtype must be a torch.dtype");
        const at::ScalarType st = ((THPDtype*)dtype.ptr())->scalar_type;
        const bool floating = st == at::kFloat || st == at::kHalf || st == at::kBFloat16;
        PyObject* o = v.ptr();
        if (PyBool_Check(o)) return bits_of(c10::Scalar(o == Py_True), st);
        if (PyFloat_Check(o)) return bits_of(c10::Scalar(PyFloat_AsDouble(o)), st);
        py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(o));  // ints (numpy's too)
        if (!i) {
          PyErr_Clear();
          py::object f = py::reinterpret_steal<py::object>(PyNumber_Float(o));
          if (!f) throw py::error_already_set();
          return bits_of(c10::Scalar(PyFloat_AsDouble(f.ptr())), st);
        }
        int over = 0;
        const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &over);
        if (!over) return bits_of(c10::Scalar((int64_t)x), st);
        if (!floating) throw std::overflow_error(py::str(o).cast<std::string>() + " does not fit " + c10::toString(st));
        const double d = PyLong_AsDouble(i.ptr());
        if (PyErr_Occurred()) throw py::error_already_set();
        return bits_of(c10::Scalar(d), st);
      }, py::arg("value"), py::arg("dtype"),
      "The bits of Python number `value` stored as `dtype` (sched/record.h bits_of): OverflowError where it does not "
      "fit, ValueError for a non-integer value of an integer dtype.");
  m.def("sched_cfront_enter", [](py::object mode, int64_t threshold) { return cfront_enter(mode.ptr(), threshold); },
        py::arg("mode"), py::arg("size_threshold"),
        "Turn the dispatcher front (sched/cfront.h) on for this thread while `mode` (a GpuosScheduler, entered) is "
        "the innermost dispatch mode; nested calls stack. Returns whether it is on (cfront_info()['reason']: why "
        "not).");
  m.def("sched_cfront_exit", &cfront_exit, "Undo this thread's last sched_cfront_enter that returned True.");
  m.def("cfront_set_direct", &cfront_set_direct, py::arg("on"),
        "Whether the dispatcher front calls the scheduler's dispatch itself for the functional ops it does not record "
        "(default on; GPUOS_CFRONT_DIRECT=0 starts it off). For A/B measurements in one process.");
  m.def("cfront_set_timing", &cfront_set_timing, py::arg("on"),
        "Time each pass of the dispatcher front by what it did with the op (on: counters restart); read with "
        "cfront_times(). Costs two clock reads per pass while on.");
  m.def("cfront_times", &cfront_times,
        "{'timing', 'by_category': {cat: (passes, own ns)}, 'by_op': {operator: {cat: (passes, own ns)}}}: cats "
        "pass, composite, record, nodata, direct, native, handed (sched/cfront.h cfront_set_timing).");
  m.def("cfront_info", &cfront_info,
        "The dispatcher front: {available, reason, key, enabled_here, depth, seen, recorded, nodata, direct, native, "
        "fast_ops}.");
  m.def("set_fusion", [](bool on) { g_fusion = on; }, py::arg("enabled"),
        "Enable / disable flush-time fusion of the scheduler's elementwise chains (default on).");
  m.def("fusion_enabled", [] { return g_fusion; });
  m.def("set_row_fusion", [](bool on) { g_row_fusion = on; }, py::arg("enabled"),
        "Enable / disable row programs (a last-dim reduction inside a fused chain: RMSNorm, LayerNorm) and producers "
        "shared by several members of one group (default on; fusion itself must be on).");
  m.def("row_fusion_enabled", [] { return g_row_fusion; });
  m.def("set_worker_matmul", &set_worker_matmul, py::arg("enabled"),
        "Record aten::mm / addmm with <= 64 activation rows as worker tasks under scheduler_context (default: "
        "off, or GPUOS_WORKER_MATMUL=1). Off, they run with cuBLAS (fallback reason 'matmul_off').");
  m.def("worker_matmul_enabled", &worker_matmul_enabled);
  m.def("set_worker_attention", &set_worker_attention, py::arg("enabled"),
        "Record the CUDA scaled_dot_product_attention backend ops (flash / efficient / cuDNN) with a query of <= 16 "
        "rows as worker tasks under scheduler_context (default: off, or GPUOS_WORKER_ATTENTION=1). Off, they run "
        "with torch (fallback reason 'attention_off').");
  m.def("worker_attention_enabled", &worker_attention_enabled);
  m.def(
      "submit_attention",
      [](py::handle q, py::handle k, py::handle v, py::handle out, py::handle attn_mask, bool is_causal,
         py::handle scale) { submit_attention(q.ptr(), k.ptr(), v.ptr(), out.ptr(), attn_mask.ptr(), is_causal, scale.ptr()); },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("attn_mask") = py::none(),
      py::arg("is_causal") = false, py::arg("scale") = py::none(),
      "Record out = softmax(scale * q @ k^T + attn_mask) @ v on the worker (decode attention: q B x Hq x Lq x D with "
      "Lq <= 16, k / v B x Hkv x Lk x D with Hq % Hkv == 0, float16 / bfloat16, head_dim 8..256 a power of two; "
      "attn_mask bool or float broadcast to B x Hq x Lq x Lk; is_causal as torch: query i sees keys j <= i; scale "
      "None: 1 / sqrt(head_dim)). Same semantics as torch.nn.functional.scaled_dot_product_attention.");
  m.def("set_specialize_after", &set_specialize_after, py::arg("uses"),
        "Tier 2: a fused-chain program run this many times gets straight-line code in a later generation "
        "(compiled in the background; 0 = never). Default 64, or GPUOS_SPECIALIZE_AFTER.");
  m.def("specialize_after", &specialize_after);
  m.def("_build_program", [](uint32_t ninputs, py::list nodes, uint32_t out) {
    std::vector<ExprNode> v;
    for (auto item : nodes) {
      py::tuple t = item.cast<py::tuple>();
      ExprNode n{};
      n.op = t[0].cast<uint32_t>();
      py::list srcs = t[1].cast<py::list>();
      if (srcs.size() > 3) throw py::value_error("_build_program: at most 3 operands per node");
      n.nsrc = (uint32_t)srcs.size();
      for (size_t k = 0; k < srcs.size(); ++k) n.src[k] = srcs[k].cast<uint32_t>();
      n.s0 = t[2].cast<float>();
      n.s1 = t[3].cast<float>();
      n.round = t.size() > 4 ? t[4].cast<uint32_t>() : (uint32_t)kF32;
      v.push_back(n);
    }
    const Program p = build_program(ninputs, v, out);
    return py::bytes((const char*)&p, sizeof p);
  }, py::arg("ninputs"), py::arg("nodes"), py::arg("out"),
        "Bytecode (device_src/interp.h Program) for nodes [(op, [srcs], s0, s1[, round_dtype])].");
  m.attr("__version__") = GPUOS_VERSION;
  m.attr("__build_torch__") = GPUOS_BUILD_TORCH;  // torch.__version__ of the build (gpuos_ext.py checks it)
  m.def("limits", [] {
    return py::dict(py::arg("prog_max_inputs") = kProgMaxInputs, py::arg("prog_max_regs") = kProgMaxRegs,
                    py::arg("prog_max_instr") = kProgMaxInstr, py::arg("op_const") = kOpConst,
                    py::arg("op_row_red") = kOpRowRed, py::arg("row_max_red") = kRowMaxRed,
                    py::arg("program_bytes") = sizeof(Program), py::arg("max_programs") = kMaxPrograms,
                    py::arg("max_dims") = kMaxDims, py::arg("first_user_op") = kFirstUserOp,
                    py::arg("tile_elems") = kTileElems);
  }, "Limits of the interpreter, the op id space and tensors (device_src/config.h, interp.h).");
  m.def("launch_flags", [] {
    return py::dict(py::arg("gated") = kStandbyGated, py::arg("first_look") = kStandbyFirstLook,
                    py::arg("kick") = kStandbyKick, py::arg("kicks") = kStandbyKicks,
                    py::arg("kick_wait") = kStandbyKickWait, py::arg("epoch_shift") = kStandbyEpochShift,
                    py::arg("kick_block") = kTraceKicks);
  }, "WorkerArgs::standby's flags (device_src/types.h): what a launch record of the claim trace carries; kick_block: "
     "the block number of a kick's claim records (kTraceKicks).");
  m.def("sched_reasons", [] {
    py::dict d;
#define GPUOS_REASON(n, name) d[py::int_(n)] = #name;
    GPUOS_SCHED_REASONS(GPUOS_REASON)
#undef GPUOS_REASON
    return d;
  }, "The scheduler's fallback reasons: {code: name} (sched_ew / sched_reduce return the code).");
  m.def("cmp_rules", [] {
    return py::dict(py::arg("lt") = (int)kCmpLt, py::arg("le") = (int)kCmpLe, py::arg("gt") = (int)kCmpGt,
                    py::arg("ge") = (int)kCmpGe, py::arg("eq") = (int)kCmpEq, py::arg("ne") = (int)kCmpNe,
                    py::arg("float") = (int)kCmpFloat);
  }, "The data op cmp's rules (device_src/dataops.h CmpOp): {name: code}; 'float' is the fp32-compare flag.");
  m.def("sched_modes", [] {
    return py::dict(py::arg("functional") = (int)kModeFunctional, py::arg("inplace") = (int)kModeInplace,
                    py::arg("out") = (int)kModeOut);
  }, "Where sched_ew puts a result: {name: code}.");
  add_program_bindings(m);
  add_testing_module(m);
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    try {
      shutdown();
    } catch (...) {
      // At exit there is no one to report to; the process is ending either way.
    }
  }));
}

