// csrc/python/testing.cpp -- gpuos_ext._testing: entry points for tests and diagnostics only.
#include <torch/extension.h>

#include <chrono>
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <random>
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
        py::arg("min_rows") = Config{}.attn_min_rows, py::arg("max_split") = kAttnMaxSplit,
        "KV splits Runtime::record_attention gives a decode attention of `tiles` row-group tiles.");
  t.def("matmul_split", &matmul_split, py::arg("ntile"), py::arg("K"), py::arg("M"), py::arg("variant"),
        py::arg("capacity"), py::arg("items") = Config{}.mm_items, py::arg("warps") = 8,
        "K slices Runtime::record_matmul gives a worker matmul (variant 1: mma, 2: ncol, 3: ncol1).");
  t.def("matmul_local", &matmul_local, py::arg("ksplit"), py::arg("M"), py::arg("variant"), py::arg("warps") = 8,
        "Whether Runtime::record_matmul lets a split worker matmul's tiles be summed in shared memory.");
  t.def("matmul_group", &matmul_group, py::arg("ntile"), py::arg("items") = Config{}.mm_items,
        py::arg("grid_warps") = 0,
        "Column tiles per item of an unsplit tensor-core worker matmul.");
  t.def("matmul_cut", [](int64_t ntile, int64_t K, int64_t M, uint32_t variant, uint32_t capacity, uint32_t items,
                         uint32_t warps, uint32_t grid_warps, bool local) {
        const MmCut c = matmul_cut(ntile, K, M, variant, capacity, items, warps, grid_warps, local);
        return std::make_pair(c.reserved, c.items);
      }, py::arg("ntile"), py::arg("K"), py::arg("M"), py::arg("variant"), py::arg("capacity"),
      py::arg("items") = Config{}.mm_items, py::arg("warps") = 8, py::arg("grid_warps") = 0, py::arg("local") = true,
      "(SubOp::reserved, items) Runtime::record_matmul gives a worker matmul alone.");
  t.def("spread_level", [](const std::vector<std::tuple<uint32_t, uint64_t, int64_t, int64_t, int64_t>>& products,
                           uint32_t items, uint32_t capacity, uint32_t warps, uint32_t grid_warps, bool local) {
        std::vector<LevelProduct> ps;
        for (const auto& [r, n, M, N, K] : products) ps.push_back({r, n, M, N, K});
        spread_level(ps, MmSpread{items, capacity, warps, grid_warps, local});
        std::vector<std::pair<uint32_t, uint64_t>> cut;
        for (const LevelProduct& p : ps) cut.emplace_back(p.reserved, p.items);
        return cut;
      }, py::arg("products"), py::arg("items") = Config{}.mm_items, py::arg("capacity") = 8192, py::arg("warps") = 8,
      py::arg("grid_warps") = 1056, py::arg("local") = true,
      "A level's products, (reserved, items, M, N, K) each as cut alone, re-cut as a program image re-cuts them:"
      " (reserved, items) each.");
  t.def("level_cuts", [](const std::vector<std::tuple<uint32_t, uint64_t, int64_t, int64_t, int64_t>>& products,
                         uint32_t items, uint32_t capacity, uint32_t warps, uint32_t grid_warps, bool local) {
        LevelLoad load;
        const MmSpread s{items, capacity, warps, grid_warps, local};
        std::vector<std::pair<uint32_t, uint64_t>> cut;
        for (const auto& [r, n, M, N, K] : products) {
          const MmCut c = level_cut(LevelProduct{r, n, M, N, K}, load, s);
          cut.emplace_back(c.reserved, c.items);
        }
        return cut;
      }, py::arg("products"), py::arg("items") = Config{}.mm_items, py::arg("capacity") = 8192, py::arg("warps") = 8,
      py::arg("grid_warps") = 1056, py::arg("local") = true,
      "Products (reserved, items, M, N, K as cut alone) recorded in turn into one level of a live flush: the cut"
      " record_matmul gives each, (reserved, items).");
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
  t.def("set_tape_images", &set_tape_images, py::arg("on"),
        "Program replays from staged images (default) or entry by entry (core/tape.h; A/B and tests).");
  t.def("tape_images", &tape_images);
  t.def("set_program_runs", &set_program_runs, py::arg("on"),
        "Image replays publish a run of resident pieces with one doorbell (default) or one ready word per piece "
        "(core/tape.h; A/B and tests).");
  t.def("program_runs", &program_runs);
  t.def("set_standby_first_look", &set_standby_first_look, py::arg("on"),
        "Gated standby launches leave at their first idle poll when nothing is left to run (default) or after the "
        "32 polls between an idle worker's exit checks (the behaviour before; A/B measurements).");
  t.def("standby_first_look", &standby_first_look);
  t.def("set_mm_epilogue", [](bool on) { g_mm_epilogue = on; }, py::arg("on"),
        "Elementwise chains whose only tensor input is a matmul's result run as its epilogue program (default) or "
        "as a level of their own (sched/lower.cpp; A/B and tests).");
  t.def("mm_epilogue", [] { return g_mm_epilogue; });
  t.def("set_mm_prologue", [](bool on) { g_mm_prologue = on; }, py::arg("on"),
        "A row program (a norm) whose output only matmuls read runs as their prologue (default) or as a level of "
        "its own (sched/prologue.cpp; A/B and tests).");
  t.def("mm_prologue", [] { return g_mm_prologue; });
  t.def("piece_homes", [](const std::vector<std::tuple<uint32_t, uint32_t, uint64_t, uint32_t>>& pieces, uint32_t nb,
                          uint32_t grid, uint32_t nwarps, uint32_t per_claim) {
        std::vector<PieceKind> kinds;
        for (const auto& [op, flags, program, count] : pieces) kinds.push_back({op, flags, program, count});
        py::list l;
        for (uint32_t h : piece_homes(kinds, nb, grid, nwarps, per_claim))
          l.append(py::make_tuple(h & ((1u << kHomeSpanShift) - 1), h >> kHomeSpanShift));
        return l;
      }, py::arg("pieces"), py::arg("blocks"), py::arg("grid"), py::arg("warps"), py::arg("per_claim") = 1,
      "core/tape.h piece_homes on [(op, flags, program, descriptors)] per level piece, for a bounded grid of `blocks`, "
      "launched grids up to `grid`, `warps` per block, `per_claim` home blocks per claim (GPUOS_HOME_LEVELS): "
      "[(first home block, home blocks)], (0, 0) without a home.");
  t.def("claim_size", &claim_size, py::arg("count"), py::arg("grid"), py::arg("warps"),
      "Sub-op descriptors one claim takes on a batch of `count` (device_src/types.h claim_size: what walk.h "
      "claim_next claims and core/tape.cpp piece_homes sizes a home with).");
  t.def("home_blocks", [](uint32_t first, uint32_t span, uint32_t nb) {
        std::vector<uint32_t> b;
        for (uint32_t i = 0; i < nb + 2; ++i)
          if (home_has(first || span ? home_word(first, span) : 0u, nb, i)) b.push_back(i);
        return b;
      }, py::arg("first"), py::arg("span"), py::arg("blocks"),
      "The blocks of 0 .. blocks + 1 that claim a level of home (first, span) in a bounded grid of `blocks` "
      "(device_src/types.h home_has, what walk.h home_skips asks).");
  t.def("tape_image_cuts", [](const std::vector<std::tuple<int64_t, int64_t, int64_t>>& shapes, bool chain,
                              bool spread) {
        // A tape of tensor-core products (M, N, K each, cut alone as record_matmul cuts them: 8 warps, 1,056 grid
        // warps), independent (one level) or each reading the one before (a chain); its image staged with or
        // without the level rule. Returns ((reserved, items) of each product's descriptors in image order,
        // level_end).
        const MmSpread s{Config{}.mm_items, 8192, 8, 1056, true};
        Tape tape;
        for (size_t i = 0; i < shapes.size(); ++i) {
          const auto [M, N, K] = shapes[i];
          TapeEntry& t = tape.entries.emplace_back();
          const MmCut c = matmul_cut((N + kMmMmaCols - 1) / kMmMmaCols, K, M, kMmMma, s.capacity, s.items, s.warps,
                                     s.grid_warps, s.local);
          t.proto.op = kOp_mm, t.proto.flags = kFlagStrided | (kFlagConst0 << 2), t.proto.reserved = c.reserved;
          t.total = c.items, t.per_tile = 1, t.nref = 3;
          for (uint32_t k = 0; k < 3; ++k) t.refs[k].ptr = (uint64_t)(i * 3 + k + 1) << 20, t.refs[k].ndim = 2;
          t.refs[0].sizes[0] = M, t.refs[0].sizes[1] = N, t.refs[2].sizes[0] = K, t.refs[2].sizes[1] = N;
          t.out = Access{(uintptr_t)(100 + i), 0, 64, {}};
          t.nin = 2;
          t.ins[0] = Access{(uintptr_t)(chain && i ? 99 + i : 1), 0, 64, {}};  // a: the input, or the product before
          t.ins[1] = Access{(uintptr_t)(1000 + i), 0, 64, {}};                 // b: its own weight
        }
        const TapeImage im = stage_image(tape, 0, tape.entries.size(), s.capacity / 2, spread ? &s : nullptr);
        std::vector<std::pair<uint32_t, uint64_t>> runs;
        for (size_t d = 0; d < im.descs.size(); ++d)
          if (d == 0 || im.descs[d].base == 0) runs.emplace_back(im.descs[d].reserved, 1);
          else runs.back().second++;
        return std::make_pair(runs, im.level_end);
      }, py::arg("shapes"), py::arg("chain") = false, py::arg("spread") = true,
      "A program image's cut of independent (or chained) tensor-core products: ((reserved, items) each, level_end).");
  t.def("tape_image_check", [](uint64_t seed, uint32_t n) {
        // A random tape of plain, TensorRef, fused, attention and matmul-prologue entries (a FusedArgs between two
        // TensorRefs) over 6 storages, some of which move: the
        // image path (stage_image, image_patches, aim_ref_fields) against entry-by-entry staging (relocate, then
        // append_tiles' rules) laid out the same way, over four calls. Returns (descriptors, mismatching
        // descriptors, refs, mismatching refs, pointer sites written).
        std::mt19937_64 g(seed);
        auto rp = [&g] { return (uint64_t)(1 + g() % 6) << 32 | ((g() % (1u << 20)) & ~15ull); };
        Tape tape;
        for (uint32_t i = 0; i < n; ++i) {
          TapeEntry& t = tape.entries.emplace_back();
          const uint32_t kind = (uint32_t)(g() % 5);
          t.proto.op = kind == 4 ? (uint32_t)kOp_mm : kind == 3 ? (uint32_t)kOp_sdpa : kind == 2 ? kOpFused
                                                                                            : (uint32_t)kOp_copy;
          for (uint32_t k = 0; k < 3; ++k)
            if (kind < 2 && g() % 4 == 0) t.proto.flags |= kFlagConst0 << k;
          if (kind == 0) {
            t.proto.out = rp();
            for (uint32_t k = 0; k < 3; ++k) t.proto.in[k] = (t.proto.flags & (kFlagConst0 << k)) ? 0x3f800000u : rp();
          } else if (kind == 1) {
            t.nref = 1 + (uint32_t)(g() % 4);
            for (uint32_t k = 0; k < t.nref; ++k) t.refs[k].ptr = rp(), t.refs[k].ndim = 1 + k, t.refs[k].sizes[0] = 7;
          } else if (kind == 2) {
            t.proto.flags = kFlagFused;
            t.proto.in[0] = g() % 5;
            t.nref = 2;
            FusedArgs fa{};
            fa.ninputs = (uint32_t)(g() % kProgMaxInputs);
            for (uint32_t k = 0; k <= fa.ninputs; ++k) fa.opnd[k].ptr = rp(), fa.opnd[k].stride = 1 + k;
            std::memcpy((void*)t.refs, (const void*)&fa, sizeof(FusedArgs));
          } else if (kind == 4) {
            t.proto.flags = kFlagStrided | kFlagMmPrologue;
            t.nref = 4;
            FusedArgs fa{};
            fa.ninputs = (uint32_t)(g() % kProgMaxInputs);
            for (uint32_t k = 0; k <= fa.ninputs; ++k) fa.opnd[k].ptr = rp(), fa.opnd[k].stride = 1 + k;
            t.refs[0].ptr = rp(), t.refs[3].ptr = rp();
            std::memcpy((void*)&t.refs[1], (const void*)&fa, sizeof(FusedArgs));
          } else {
            t.nref = 4;
            AttnArgs a{};
            a.out = rp(), a.mask = g() % 2 ? rp() : 0, a.lse = g() % 2 ? rp() : 0, a.Lk = 17;
            std::memcpy((void*)&t.refs[0], (const void*)&a, sizeof(AttnArgs));
            for (uint32_t k = 1; k < 4; ++k) t.refs[k].ptr = rp();
          }
          t.total = 1 + g() % 3000, t.per_tile = 1 + g() % 700;
          t.out = Access{(uintptr_t)(1 + g() % 5), 0, 64, {}};
          t.nin = 1 + (uint32_t)(g() % 2);
          for (uint32_t k = 0; k < t.nin; ++k) t.ins[k] = Access{(uintptr_t)(1 + g() % 5), 0, 64, {}};
        }
        // Four replays of one image, as calls of a program: the resident refs keep what earlier replays wrote
        // (only changed sites are written), each call's descriptors start from the captured image.
        const uint64_t refaddr = 0x7000000000ull;
        const std::vector<uint32_t> lv = tape.entry_levels(0, n);
        TapeImage im = stage_image(tape, 0, n, 1 + (uint32_t)(g() % 300));
        std::vector<TensorRef> refs = im.refs;  // the resident refs (prepare_image's upload)
        size_t bad_d = 0, bad_r = 0, moved = 0, ndesc = 0;
        for (uint32_t call = 0; call < 4; ++call) {
          Reloc rel;
          for (uint64_t s = 1; s <= 6; ++s) {  // a storage stays, moves, or is passed with delta 0
            const uint64_t how = g() % 3;
            if (how) rel.add(s << 32, (s << 32) + (1u << 20), how == 1 ? (int64_t)(g() % 4096) * 16 + (1 << 30) : 0);
          }
          // Expected: each entry relocated, its refs at the next slots (entry order), its tiles at its level.
          std::vector<TensorRef> want_refs;
          std::vector<std::vector<SubOp>> by_level;
          for (uint32_t i = 0; i < n; ++i) {
            TapeEntry t = tape.entries[i];
            relocate(t, rel);
            uint64_t addr[4];
            for (uint32_t k = 0; k < t.nref; ++k) addr[k] = refaddr + (want_refs.size()) * sizeof(TensorRef),
                                                   want_refs.push_back(t.refs[k]);
            point_at_refs(t.proto, t.nref, addr);
            if (by_level.size() < lv[i]) by_level.resize(lv[i]);
            for (uint64_t j = 0; j * t.per_tile < t.total; ++j)
              by_level[lv[i] - 1].push_back(tile_of(t.proto, j, t.per_tile, t.total));
          }
          std::vector<SubOp> want;
          for (auto& v : by_level) want.insert(want.end(), v.begin(), v.end());
          // The image path.
          std::vector<SubOp> descs = im.descs;
          std::vector<std::pair<uint64_t, uint64_t>> ref_p, desc_p;
          image_patches(im, rel, ref_p, desc_p);
          for (size_t i = 0; i < descs.size(); ++i) aim_ref_fields(descs[i], im.refmask[i], refaddr);  // prepare_image
          for (const auto& p : ref_p) std::memcpy((char*)refs.data() + p.first, &p.second, 8);  // the replay's writes
          for (const auto& p : desc_p) std::memcpy((char*)descs.data() + p.first, &p.second, 8);
          moved += ref_p.size() + desc_p.size();
          ndesc = descs.size();
          uint32_t covered = 0;  // the pieces tile the descriptors in order, none larger than asked, none across levels
          for (const TapeImage::Piece& pc : im.pieces) covered += pc.begin == covered && pc.count > 0 ? pc.count : 1u << 30;
          if (covered != descs.size()) return std::make_tuple(ndesc, (size_t)-1, refs.size(), (size_t)-1, moved);
          if (want.size() != descs.size() || want_refs.size() != refs.size())
            return std::make_tuple(ndesc, (size_t)-1, refs.size(), (size_t)-1, moved);
          for (size_t i = 0; i < descs.size(); ++i) bad_d += std::memcmp(&descs[i], &want[i], sizeof(SubOp)) != 0;
          for (size_t i = 0; i < refs.size(); ++i) bad_r += std::memcmp(&refs[i], &want_refs[i], sizeof(TensorRef)) != 0;
        }
        for (size_t L = 0, P = 0; L < im.level_end.size(); ++L)  // no piece spans two levels
          for (; P < im.pieces.size() && im.pieces[P].begin < im.level_end[L]; ++P)
            if (im.pieces[P].begin + im.pieces[P].count > im.level_end[L]) bad_d++;
        return std::make_tuple(ndesc, bad_d, refs.size(), bad_r, moved);
      }, py::arg("seed"), py::arg("entries"),
      "Random tape, four calls: image replays (core/tape.h TapeImage; resident refs kept between calls) against "
      "entry-by-entry staging; (descs, bad, refs, bad, written sites).");
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
  t.def("hold_timer_publication", &hold_timer_publication, py::arg("where"),
        "Hold flush timers' off-GIL publications at the points of a mask until a call without them: 1 (True) before "
        "one publishes (mu held, ops in flight), 2 once published and mu let go, before it retakes the GIL; 3 both "
        "(two timers, one at each). hold_timer_publication(0) releases every point.");
  t.def("timer_publication_held", &timer_publication_held, py::arg("timeout_s"), py::arg("point") = 3,
        py::call_guard<py::gil_scoped_release>(),
        "Wait until a timer publication is held at one of `point`'s points (a mask); False on timeout.");
  t.def("deferred_may_touch", [](const at::Tensor& t) {
          // The dependency check's answer without its wait (GIL held): does deferred work -- queued, or in flight
          // from a timer publishing without the GIL -- read or write t's storage?
          return t.is_cuda() && runtime_if(t.get_device()) &&
                 deferred_of(t.get_device()).may_touch((uintptr_t)storage_of(t));
        }, py::arg("t"), "Whether deferred work, queued or in the timer's flight, touches t's storage.");
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
