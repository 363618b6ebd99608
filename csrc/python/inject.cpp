// csrc/python/inject.cpp -- the Python face of operator injection: register_elementwise, register_op, install,
// switch, rollback, user_ops, generation_info. The work is in inject/registry.cpp; every call that may wait
// (NVRTC, a generation compile, a worker drain) runs without the GIL.
#include <torch/extension.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <vector>

#include "inject/linked.h"
#include "inject/registry.h"
#include "inject/specialize.h"
#include "inject/whole.h"
#include "jit/jit.h"
#include "jit/link.h"
#include "python/bindings.h"
#include "tensor/devices.h"

namespace py = pybind11;

namespace gpuos {

namespace {

std::string opt_str(const py::object& o) { return o.is_none() ? std::string() : o.cast<std::string>(); }
}  // namespace

namespace {
// Test entry points' op specs: [{id, slot, arity, name, source, expr}].
std::vector<OpSpec> specs_of(py::list specs) {
  std::vector<OpSpec> v;
  for (auto item : specs) {
    py::dict d = item.cast<py::dict>();
    OpSpec s;
    s.id = d["id"].cast<uint32_t>();
    s.slot = d.contains("slot") ? d["slot"].cast<uint32_t>() : 0;
    s.arity = d["arity"].cast<uint32_t>();
    s.name = d["name"].cast<std::string>();
    s.source = d["source"].cast<std::string>();
    s.is_expr = d.contains("expr") ? d["expr"].cast<bool>() : true;
    v.push_back(s);
  }
  return v;
}
// (program id, Program bytes) of fused chains -> their tier-2 code.
std::map<uint32_t, std::string> fused_of(py::list fused) {
  std::map<uint32_t, std::string> fz;
  for (auto item : fused) {
    py::tuple t = item.cast<py::tuple>();
    const std::string blob = t[1].cast<std::string>();
    if (blob.size() != sizeof(Program)) throw py::value_error("fused program: bad Program size");
    Program p;
    std::memcpy((void*)&p, blob.data(), sizeof p);
    const uint32_t id = t[0].cast<uint32_t>();
    fz[id] = specialize_program(id, p);
  }
  return fz;
}
}  // namespace

py::dict link_info() {
  const LinkMode m = link_mode();
  const LinkedGenStats g = linked_gen_stats();
  const LinkStats l = link_stats();
  py::dict d;
  d["mode"] = m.linked ? "linked" : "whole";
  d["reason"] = m.reason;
  d["library"] = m.library;
  d["version"] = m.version;
  d["linked_generations"] = g.linked;
  d["whole_generations"] = g.whole;
  d["cached_whole_generations"] = g.cached_whole;
  d["last_fallback"] = g.last_fallback;
  d["links"] = l.links;
  d["link_s"] = l.link_s;
  return d;
}

void add_injection_bindings(py::module_& m) {
  m.def("link_info", &link_info,
        "How generations are built (issue #18): {'mode': 'linked' | 'whole', 'reason' (why not linked), 'library' "
        "(libnvJitLink), 'version', 'linked_generations', 'whole_generations', 'cached_whole_generations' (taken "
        "whole from the JIT cache, an earlier whole build's image), 'last_fallback', 'links', 'link_s'}.");
  m.def("whole_build_info", [] {
    const WholeBuildInfo i = whole_build_info();
    py::dict d;
    d["enabled"] = i.enabled;
    d["running"] = i.running;
    d["source"] = i.source;
    d["base"] = i.base;
    d["helper_pid"] = i.helper_pid;
    d["requested"] = i.requested;
    d["helpers"] = i.helpers;
    d["published"] = i.published;
    d["superseded"] = i.superseded;
    d["failed"] = i.failed;
    d["last_s"] = i.last_s;
    d["last_error"] = i.last_error;
    d["command"] = i.command;
    return d;
  }, "The background whole build of linked generations (a helper process compiles the newest one as one whole "
     "NVRTC program, which then becomes the next generation, and stays in the JIT cache for later processes): "
     "enabled, running, source (its generation), base (it is generation 0's base image), helper_pid (0: none "
     "running), "
     "requested, helpers (processes started), published, superseded, failed, last_s, last_error, command.");
  m.def("set_whole_build", &set_whole_build, py::arg("on"),
        "Background whole builds of linked generations on / off for later requests and generations "
        "(GPUOS_WHOLE_BUILD=0 starts with them off; off, a generation is never taken whole from the cache either).");
  m.def("wait_whole_builds", [](double timeout_s) { return wait_whole_builds(timeout_s); }, py::arg("timeout_s") = 300.0,
        py::call_guard<py::gil_scoped_release>(),
        "Wait until no whole build is queued or running, at most timeout_s; returns whether that happened "
        "(benchmarks settle with it; whole_build_info() says how it ended).");
  m.def(
      "jit_warm",
      [](const std::string& arch) {
        using clock = std::chrono::steady_clock;
        bool had = false, linked = false;
        double base_s = 0, object_s = 0;
        {
          py::gil_scoped_release nogil;
          const auto t0 = clock::now();
          had = !compile_whole_image(arch, "");  // (takes turns with a helper building it)
          const auto t1 = clock::now();
          if ((linked = link_for_arch(arch))) worker_object(arch);
          base_s = std::chrono::duration<double>(t1 - t0).count();
          object_s = std::chrono::duration<double>(clock::now() - t1).count();
        }
        py::dict d;
        d["arch"] = arch;
        d["base_was_cached"] = had;
        d["base_s"] = base_s;
        d["linked"] = linked;
        d["object_s"] = object_s;
        return d;
      },
      py::arg("arch"),
      "Fill the JIT cache for `arch` (`python -m gpuos --warm`): the base image (generation 0 compiled whole; with "
      "whole builds on, every later process's generation 0 is taken from the cache, whole) and, where generations "
      "link, the worker's relocatable object (injected ops and tier-2 code then link in seconds). Returns {arch, "
      "base_was_cached, base_s, linked, object_s}. CompileError if NVRTC fails.");
  m.def(
      "jit_base_cached", [](const std::string& arch) { return !jit_cached_sources(arch, whole_overrides("")).empty(); },
      py::arg("arch"), py::call_guard<py::gil_scoped_release>(),
      "Whether the JIT cache holds the base image for `arch` (generation 0 compiled whole; jit_warm fills it).");
  m.def("_set_whole_build_command", &set_whole_build_command, py::arg("argv"),
        "The helper's argv before '<arch> <header file> <parent pid>' (gpuos_ext sets it at import).");
  m.def(
      "_compile_whole_image",
      [](const std::string& arch, const std::string& header_file) {
        std::ifstream f(header_file, std::ios::binary);  // (read_file takes an empty file for a miss)
        if (!f) throw py::value_error("cannot read " + header_file);
        const std::string header((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        py::gil_scoped_release nogil;
        return compile_whole_image(arch, header);
      },
      py::arg("arch"), py::arg("header_file"),
      "The whole build helper's work: compile a generation header whole for `arch` into the JIT cache (an empty "
      "file: the base image, generation 0's embedded sources), taking turns with other processes' helpers for the "
      "same header; returns whether this call compiled (False: another had left the image in the cache).");
  m.def(
      "_request_tier2",
      [](py::list fused) {
        for (auto& kv : fused_of(fused)) request_fused_spec(kv.first, kv.second);
      },
      py::arg("fused"), "Queue tier-2 code for [(program id, Program bytes)] as the specializer does (tests).");
  m.def("_set_link_override", &set_link_override, py::arg("mode"),
        "-1: follow GPUOS_LINK; 0: whole NVRTC compiles; 1: link when nvJitLink is usable (generations built "
        "after the call; benchmarks compare the two layouts in one process).");
  m.def("_registry_add_arch", [](const std::string& arch) { registry_add_arch(arch); }, py::arg("arch"),
        "Compile every later generation for `arch` too (tests: the registry's linked path without a GPU).");
  m.def(
      "_generation_image_for",
      [](const std::string& arch, py::list specs, py::list fused) {
        const std::vector<OpSpec> v = specs_of(specs);
        const std::map<uint32_t, std::string> fz = fused_of(fused);
        // No ops: generation 0's image (its whole compile is the embedded sources as they are: jit_compile's key).
        const std::string header = v.empty() && fz.empty() ? std::string() : generation_header_for(v, 1, fz);
        std::string img;
        {
          py::gil_scoped_release nogil;
          img = build_generation_image(arch, v, fz, header);
        }
        return py::bytes(img);
      },
      py::arg("arch"), py::arg("specs"), py::arg("fused") = py::list(),
      "A generation's image for `arch` as the compile thread builds it (linked or whole, link_info() says which).");
  m.def(
      "_generation_image",
      [](uint32_t gen, const std::string& arch) {
        std::shared_ptr<const std::string> img;
        {
          py::gil_scoped_release nogil;
          img = generation_image(gen, arch);
        }
        return py::bytes(*img);
      },
      py::arg("gen"), py::arg("arch"), "The image of ready generation `gen` for `arch` (tests).");

  m.def(
      "register_elementwise",
      [](const std::string& name, const std::string& expr, int arity, py::object aten, bool block) {
        const std::string a = opt_str(aten);
        py::gil_scoped_release nogil;
        return register_user_op("gpuos.register_elementwise('" + name + "')", name, expr, true, arity, a, block);
      },
      py::arg("name"), py::arg("expr"), py::arg("arity") = 2, py::arg("aten") = py::none(), py::arg("block") = true,
      "register_elementwise(name, expr, arity=2, aten=None, block=True) -> op id\n\n"
      "A new elementwise op out = expr over fp32 inputs a, b, c (arity of them) and scalars s0, s1 (keywords of "
      "submit), e.g. 'a * b + 1.0f'. Any CUDA C++ expression; functors.h helpers (m_exp, sigmoid_f, ...) are in "
      "scope. The source is checked by NVRTC first (CompileError with the log); then a new generation (the "
      "worker and every op, one module) compiles on a background thread: block=True waits for it (CompileError "
      "leaves everything as it was), block=False returns at once (a failure is raised by the op's first submit). "
      "aten: an aten op name ('aten::foo') the scheduler may map to this op. Works with fp32/fp16/bf16, "
      "broadcasting and strided tensors through gpuos.submit(name or id, inputs, out, s0=.., s1=..).");
  m.def(
      "register_op",
      [](const std::string& name, const std::string& source, py::object arity, py::object aten, bool block) {
        const int ar = arity.is_none() ? -1 : arity.cast<int>();
        const std::string a = opt_str(aten);
        py::gil_scoped_release nogil;
        return register_user_op("gpuos.register_op('" + name + "')", name, source, false, ar, a, block);
      },
      py::arg("name"), py::arg("source"), py::arg("arity") = py::none(), py::arg("aten") = py::none(),
      py::arg("block") = true,
      "register_op(name, source, arity=None, aten=None, block=True) -> op id\n\n"
      "A new elementwise op from CUDA C++ source that defines `__device__ float <name>(float a[, float b[, float "
      "c]])` (helpers may be defined too; arity defaults to that signature's). Compiled as register_elementwise.");
  m.def(
      "install",
      [](const std::string& name, const std::string& source, uint32_t slot, bool block) {
        py::gil_scoped_release nogil;
        return install_user_op(name, source, slot, block);
      },
      py::arg("name"), py::arg("source"), py::arg("slot") = 1, py::arg("block") = true,
      "install(name, source, slot=1, block=True) -> op id\n\n"
      "Put new code (an expression, or a source with `__device__ float <name>(...)`) into slot 0 or 1 of a "
      "registered op, or into slot 1 of a built-in elementwise op. Installing into the active slot replaces the "
      "op in place: sub-ops published before the new generation takes over run the old code, later ones the new "
      "code. CompileError (old code kept) as register_elementwise.");
  m.def(
      "switch",
      [](const std::string& name, uint32_t slot) {
        py::gil_scoped_release nogil;
        return switch_user_op(name, slot, apply_alias_everywhere);
      },
      py::arg("name"), py::arg("slot"),
      "switch(name, slot) -> previous slot\n\nMake `name` run the code of `slot` (0 or 1): one write of the "
      "alias table in device memory that the running worker observes per batch, so every sub-op runs wholly the "
      "old or wholly the new code. Sub-ops published after switch() returns run the new slot.");
  m.def(
      "rollback",
      [](const std::string& name) {
        py::gil_scoped_release nogil;
        return rollback_user_op(name, apply_alias_everywhere);
      },
      py::arg("name"), "rollback(name) -> slot now active\n\nSwitch `name` back to the slot active before the "
                       "last switch.");
  m.def("user_ops", [] {
    py::list l;
    for (const UserOpInfo& u : list_user_ops()) {
      py::list slots;
      for (uint32_t s = 0; s < 2; ++s)
        if (u.installed[s]) slots.append(s);
      py::dict kinds;
      for (uint32_t s = 0; s < 2; ++s)
        if (u.installed[s]) kinds[py::int_(s)] = u.kind[s];
      py::dict d;
      d["name"] = u.name;
      d["id"] = u.id;
      d["arity"] = u.arity;
      d["aten"] = u.aten.empty() ? py::object(py::none()) : py::object(py::str(u.aten));
      d["builtin"] = u.builtin;
      d["slots"] = slots;
      d["kinds"] = kinds;
      d["slot_generations"] = py::make_tuple(u.slot_gen[0], u.slot_gen[1]);
      d["active_slot"] = u.active;
      d["generation"] = u.generation;
      d["state"] = u.state;
      if (!u.error.empty()) d["error"] = u.error;
      l.append(d);
    }
    return l;
  }, "Injected ops (and built-ins with an installed slot 1): name, id, arity, aten, builtin, slots, kinds, "
     "slot_generations, active_slot, generation (the one the active slot needs), state, error.");
  m.def("generation_info", [] {
    py::dict d;
    py::list gens;
    uint32_t ready = 0;
    bool compiling = false;
    for (const GenerationInfo& g : list_generations()) {
      py::dict e;
      e["id"] = g.id;
      e["state"] = g.state;
      e["archs"] = g.archs;
      e["ops"] = g.ops;
      if (g.whole_of >= 0) e["whole_of"] = g.whole_of;
      e["built"] = g.built;
      if (!g.error.empty()) e["error"] = g.error;
      gens.append(e);
      if (g.state == "ready") ready = g.id;
      compiling |= g.state == "compiling";
    }
    py::dict active;
    uint64_t handovers = 0;
    for (Runtime* rt : runtimes()) {
      active[py::int_(rt->device())] = rt->active_generation();
      handovers += rt->stats().handovers;
    }
    d["generations"] = gens;
    d["latest"] = gens.size() - 1;
    d["ready"] = ready;
    d["compiling"] = compiling;
    d["active"] = active;
    d["handovers"] = handovers;
    return d;
  }, "Generations: generations (id, state, archs, ops, built ('linked', 'whole', 'cached whole'), whole_of (a "
     "background whole build: the generation it compiles again), error), latest, ready (newest compiled), compiling, "
     "active {device: generation its worker runs}, handovers.");
  m.def(
      "wait_generations", [] { return wait_generations(); }, py::call_guard<py::gil_scoped_release>(),
      "Wait until queued generation compiles have finished; returns the newest ready generation. Raises the "
      "CompileError of a generation that failed since the last call.");
  m.def(
      "_hold_generations", [](bool hold) { hold_generations(hold); }, py::arg("hold"),
      "hold=True: queued changes wait (gpuos.batch_install() groups several ops into one generation).");
  m.def("_generation_header", [] { return current_generation_header(); },
        "The generated device_src/user_ops.h of the current registry.");
  m.def(
      "_generation_header_for",
      [](py::list specs, py::list fused) { return generation_header_for(specs_of(specs), 1, fused_of(fused)); },
      py::arg("specs"), py::arg("fused") = py::list(),
      "user_ops.h for explicit specs [{id, slot, arity, name, source, expr}] and fused programs [(id, bytes)] "
      "(tests).");
  m.def(
      "_jit_compile_generation",
      [](const std::string& arch, const std::string& header) {
        std::string img;
        {
          py::gil_scoped_release nogil;
          img = jit_compile_sources(arch, {{kUserOpsPath, header}});
        }
        return py::bytes(img);
      },
      py::arg("arch"), py::arg("header"), "Compile the worker with `header` as device_src/user_ops.h.");
  m.def(
      "_force_handover",
      [] {
        Runtime* rt = &runtime_for(current_device());
        Runtime::HandoverTimes t;
        {
          py::gil_scoped_release nogil;
          std::lock_guard<std::mutex> lk(rt->mu);
          t = rt->force_handover();
        }
        py::dict d;
        d["drain_us"] = t.drain_us;
        d["load_us"] = t.load_us;
        d["launch_us"] = t.launch_us;
        d["total_us"] = t.drain_us + t.load_us + t.launch_us;
        return d;
      },
      "Drain the worker, load the active generation again as a new module and relaunch (handover cost).");
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    py::gil_scoped_release nogil;
    shutdown_generations();
  }));
}

}  // namespace gpuos
