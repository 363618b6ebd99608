// csrc/python/programs.cpp -- gpuos_ext's program bindings (sched/program.h; used by gpuos/programs.py).
#include <pybind11/stl.h>

#include "ops/op_table.h"
#include "python/bindings.h"
#include "sched/program.h"
#include "tensor/errors.h"

namespace py = pybind11;

namespace gpuos {

void add_program_bindings(py::module_& m) {
  py::class_<CapturedTape, std::shared_ptr<CapturedTape>>(m, "Tape",
      "A captured program's sub-ops (gpuos.capture): replayed by gpuos.Program.")
      .def_property_readonly("device", [](const CapturedTape& c) { return c.dev; })
      .def_property_readonly("entries", [](const CapturedTape& c) { return c.tape.entries.size(); },
                             "Recorded sub-ops (a fused chain is one; a product's tiles are one).")
      .def("tiles", [](const CapturedTape& c, size_t b, size_t e) {
        uint64_t n = 0;
        for (size_t i = b; i < e && i < c.tape.entries.size(); ++i) {
          const TapeEntry& t = c.tape.entries[i];
          n += (t.total + t.per_tile - 1) / t.per_tile;
        }
        return n;
      }, py::arg("begin"), py::arg("end"), "Descriptors (work items) of entries [begin, end).")
      .def("levels", [](const CapturedTape& c, size_t b, size_t e) { return c.tape.levels(b, e); },
           py::arg("begin"), py::arg("end"), "Dependency levels of entries [begin, end) staged alone.")
      .def("level_map", [](const CapturedTape& c, size_t b, size_t e) {
        const std::vector<uint32_t> lv = c.tape.entry_levels(b, e);
        py::list l;
        for (size_t i = 0; i < lv.size(); ++i) {
          const TapeEntry& t = c.tape.entries[b + i];
          const SubOp& p = t.proto;
          const bool fused = p.flags & kFlagFused;
          const char* name = fused ? (p.reserved ? "fused_rows" : "fused")
                             : p.op < (uint32_t)kNumOps ? kOps[p.op].name : "injected";
          l.append(py::dict(py::arg("level") = lv[i], py::arg("op") = name,
                            py::arg("program") = fused ? (int64_t)p.in[0] : (int64_t)-1,
                            py::arg("elems") = t.total, py::arg("per_tile") = t.per_tile,
                            py::arg("tiles") = (t.total + t.per_tile - 1) / t.per_tile,
                            py::arg("row") = fused ? p.reserved : 0u, py::arg("dtype") = p.dtype & 0xffu,
                            py::arg("strided") = (p.flags & kFlagStrided) != 0, py::arg("vec") = (p.flags & kFlagVec) != 0));
        }
        return l;
      }, py::arg("begin"), py::arg("end"),
         "Per entry of [begin, end): {'level' (1-based, as levels() counts), 'op', 'program', 'elems', 'per_tile', "
         "'tiles', 'row', 'dtype', 'strided', 'vec'} (tools/worker_trace.py hf).")
      .def_property_readonly("image_bytes", [](const CapturedTape& c) {
        uint64_t n = 0;
        for (const auto& kv : c.images) n += kv.second.im.resident_bytes();
        return n;
      }, "Device bytes of the segments' resident images (descriptors and TensorRefs), made by their first replay.")
      .def_property_readonly("homes", [](const CapturedTape& c) {
        py::list l;
        for (const auto& kv : c.images) {
          py::list seg;
          for (const ProgLevel& pl : kv.second.im.table)
            seg.append(py::make_tuple(pl.count, pl.home & ((1u << kHomeSpanShift) - 1), pl.home >> kHomeSpanShift));
          l.append(seg);
        }
        return l;
      }, "Per replayed segment, per level piece: (descriptors, first home block, home blocks); (n, 0, 0): no home, "
         "every block claims it (device_src/types.h ProgLevel::home).")
      .def_property_readonly("held_bytes", &CapturedTape::held_bytes,
                             "Bytes of the distinct storages the program keeps alive (its arena, inputs, weights).")
      .def_property_readonly("fresh", [](const CapturedTape& c) { return c.fresh; },
                             "[(lo, hi)]: storages the scheduler allocated during the capture.")
      .def("replay", [](CapturedTape& c, size_t b, size_t e,
                        const std::vector<std::tuple<uint64_t, uint64_t, int64_t>>& rel) { tape_replay(c, b, e, rel); },
           py::arg("begin"), py::arg("end"), py::arg("reloc"),
           "Stage entries [begin, end) with pointers in [lo, hi) moved by delta ([(lo, hi, delta)]), publish them on "
           "the current stream.");
  py::class_<ProgramCall, std::shared_ptr<ProgramCall>>(m, "ProgramCall",
      "A program's call in C++ (gpuos/programs.py builds it from the capture's plan): guards, output buffers, the "
      "replay of its one segment; returns None when a guard differs.")
      .def(py::init([](std::shared_ptr<CapturedTape> tape, size_t b, size_t e, const py::list& ins,
                       const py::list& fresh, const py::list& outs, bool single) {
             auto dtype = [](const py::handle& o) {
               if (!THPDtype_Check(o.ptr())) throw std::invalid_argument("ProgramCall: expected a torch.dtype");
               return reinterpret_cast<THPDtype*>(o.ptr())->scalar_type;
             };
             auto pc = std::make_shared<ProgramCall>();
             pc->tape = std::move(tape), pc->b = b, pc->e = e, pc->single = single;
             for (const py::handle& h : ins) {  // (sizes, strides, dtype, mod16, lo, hi)
               const py::tuple t = h.cast<py::tuple>();
               pc->ins.push_back({t[0].cast<std::vector<int64_t>>(), t[1].cast<std::vector<int64_t>>(), dtype(t[2]),
                                  t[3].cast<uint64_t>(), t[4].cast<uint64_t>(), t[5].cast<uint64_t>()});
             }
             for (const py::handle& h : fresh) {  // (lo, hi, None | (sizes, strides, dtype))
               const py::tuple t = h.cast<py::tuple>();
               ProgramCall::Fresh f;
               f.lo = t[0].cast<uint64_t>(), f.hi = t[1].cast<uint64_t>(), f.direct = !t[2].is_none();
               if (f.direct) {
                 const py::tuple d = t[2].cast<py::tuple>();
                 f.sizes = d[0].cast<std::vector<int64_t>>(), f.strides = d[1].cast<std::vector<int64_t>>();
                 f.dtype = dtype(d[2]);
               }
               pc->fresh.push_back(std::move(f));
             }
             for (const py::handle& h : outs) {  // (kind, idx, value, ptr, sizes, strides, dtype)
               const py::tuple t = h.cast<py::tuple>();
               ProgramCall::Out o;
               o.kind = t[0].cast<int>(), o.idx = t[1].cast<int>(), o.value = py::reinterpret_borrow<py::object>(t[2]);
               o.ptr = t[3].cast<uint64_t>(), o.sizes = t[4].cast<std::vector<int64_t>>();
               o.strides = t[5].cast<std::vector<int64_t>>(), o.dtype = dtype(t[6]);
               pc->outs.push_back(std::move(o));
             }
             return pc;
           }),
           py::arg("tape"), py::arg("begin"), py::arg("end"), py::arg("ins"), py::arg("fresh"), py::arg("outs"),
           py::arg("single"))
      .def("__call__", &ProgramCall::call);
  m.def("_capture_begin", &capture_begin, py::arg("device"));
  m.def("_capture_mark", &capture_mark, py::arg("device"));
  m.def("_capture_end", &capture_end, py::arg("device"));
  m.def("_capturing", &capturing, py::arg("device"));
  m.def("_capture_fresh", &capture_fresh, py::arg("device"));
}

}  // namespace gpuos
