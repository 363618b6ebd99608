// csrc/core/tape.cpp -- see tape.h; Runtime::replay (the recording side is in core/record.cpp: append_tiles).
#include "core/tape.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "core/runtime.h"
#include "driver/cuda_api.h"
#include "ops/op_table.h"
#include "device_src/functors.h"
#include "inject/specialize.h"

namespace gpuos {

void Reloc::add(uint64_t lo, uint64_t hi, int64_t delta) {
  if (hi <= lo) return;  // (a range that did not move stays: image replays rewrite its resident pointers)
  r_.push_back({lo, hi, delta});
  sorted_ = r_.size() < 2 || (sorted_ && r_[r_.size() - 2].lo <= lo);
}

uint64_t Reloc::operator()(uint64_t p) const {
  if (r_.empty() || p == 0) return p;
  if (!sorted_) {
    std::sort(r_.begin(), r_.end(), [](const R& a, const R& b) { return a.lo < b.lo; });
    sorted_ = true;
  }
  // The last range starting at or below p.
  auto it = std::upper_bound(r_.begin(), r_.end(), p, [](uint64_t v, const R& r) { return v < r.lo; });
  if (it == r_.begin()) return p;
  --it;
  return p < it->hi ? (uint64_t)((int64_t)p + it->delta) : p;
}

namespace {

bool is_matmul(const SubOp& p) { return p.op < kNumOps && kOps[p.op].kind == kKindMatmul; }

// The programs a matmul entry runs (their tier-2 use counts): its activation epilogue's (kFlagMmEpilogue) and its
// prologue's (kFlagMmPrologue); -1 where it has none.
std::array<int32_t, 2> matmul_programs(const SubOp& p) {
  std::array<int32_t, 2> r = {-1, -1};
  if (!is_matmul(p)) return r;
  if (p.flags & kFlagMmEpilogue) r[0] = (int32_t)((p.flags >> kMmEpiShift) & kMmEpiMask);
  if (p.flags & kFlagMmPrologue) {
    uint32_t prog;
    std::memcpy(&prog, &p.scalar[1], sizeof prog);
    r[1] = (int32_t)prog;
  }
  return r;
}

// Where a data pointer of a tape entry lives: in its descriptor prototype (a sub-op without TensorRefs) or in its
// TensorRef slots (refs[]: TensorRef::ptr, a FusedArgs' operands, an AttnArgs' out / mask / lse), at byte `offset`.
struct PointerField {
  bool in_refs;
  size_t offset;
};

// Calls f(u64& value, PointerField) for every data pointer field of `e` -- the one list of them (relocate and
// stage_image use it); f may change the value.
template <class F>
void for_each_pointer(TapeEntry& e, F&& f) {
  if (e.nref == 0) {  // data pointers in the descriptor itself
    f(e.proto.out, PointerField{false, offsetof(SubOp, out)});
    for (uint32_t k = 0; k < 3; ++k)
      if (!(e.proto.flags & (kFlagConst0 << k))) f(e.proto.in[k], PointerField{false, offsetof(SubOp, in) + 8 * k});
    return;
  }
  if (e.proto.flags & kFlagFused) {  // refs[0..1] hold one FusedArgs
    FusedArgs fa;
    std::memcpy((void*)&fa, (const void*)e.refs, sizeof(FusedArgs));
    for (uint32_t k = 0; k < 1 + fa.ninputs && k < kFusedMaxOperands; ++k)
      f(fa.opnd[k].ptr, PointerField{true, offsetof(FusedArgs, opnd) + k * sizeof(FusedOperand) + offsetof(FusedOperand, ptr)});
    std::memcpy((void*)e.refs, (const void*)&fa, sizeof(FusedArgs));
    return;
  }
  uint32_t k = 0;
  if (is_matmul(e.proto) && (e.proto.flags & kFlagMmPrologue)) {  // refs[0] out, refs[1..2] a FusedArgs, refs[3] b
    f(e.refs[0].ptr, PointerField{true, offsetof(TensorRef, ptr)});
    FusedArgs fa;
    std::memcpy((void*)&fa, (const void*)&e.refs[1], sizeof(FusedArgs));
    for (uint32_t q = 0; q < 1 + fa.ninputs && q < kFusedMaxOperands; ++q)
      f(fa.opnd[q].ptr, PointerField{true, sizeof(TensorRef) + offsetof(FusedArgs, opnd) + q * sizeof(FusedOperand) +
                                               offsetof(FusedOperand, ptr)});
    std::memcpy((void*)&e.refs[1], (const void*)&fa, sizeof(FusedArgs));
    f(e.refs[3].ptr, PointerField{true, 3 * sizeof(TensorRef) + offsetof(TensorRef, ptr)});
    return;
  }
  if (e.proto.op == kOp_sdpa) {  // refs[0] holds the AttnArgs
    AttnArgs a;
    std::memcpy((void*)&a, (const void*)&e.refs[0], sizeof(AttnArgs));
    f(a.out, PointerField{true, offsetof(AttnArgs, out)});
    f(a.mask, PointerField{true, offsetof(AttnArgs, mask)});
    f(a.lse, PointerField{true, offsetof(AttnArgs, lse)});
    std::memcpy((void*)&e.refs[0], (const void*)&a, sizeof(AttnArgs));
    k = 1;
  }
  for (; k < e.nref; ++k) f(e.refs[k].ptr, PointerField{true, k * sizeof(TensorRef) + offsetof(TensorRef, ptr)});
}

std::atomic<bool> g_tape_images{true}, g_program_runs{true};

}  // namespace

void set_tape_images(bool on) { g_tape_images.store(on, std::memory_order_relaxed); }
bool tape_images() { return g_tape_images.load(std::memory_order_relaxed); }
void set_program_runs(bool on) { g_program_runs.store(on, std::memory_order_relaxed); }
bool program_runs() { return g_program_runs.load(std::memory_order_relaxed); }

void relocate(TapeEntry& e, const Reloc& rel) {
  if (rel.empty()) return;
  for_each_pointer(e, [&](u64& p, PointerField) { p = rel(p); });
}

std::vector<uint32_t> Tape::entry_levels(size_t b, size_t e) const {
  Hazards h;
  std::vector<uint32_t> lv;
  Access reads[kProgMaxInputs];
  for (size_t i = b; i < e && i < entries.size(); ++i) {
    const TapeEntry& t = entries[i];
    uint32_t nr = 0;
    for (uint32_t k = 0; k < t.nin; ++k)
      if (!t.in_const[k]) reads[nr++] = t.ins[k];
    const uint32_t l = h.level_of(t.out, reads, nr);
    h.note(t.out, reads, nr, l);
    lv.push_back(l);
  }
  return lv;
}

uint32_t Tape::levels(size_t b, size_t e) const {
  uint32_t top = 0;
  for (uint32_t l : entry_levels(b, e)) top = std::max(top, l);
  return top;
}

// Each level's products re-cut together (spread_level: the image knows its levels whole, a live flush cuts its
// products as they come, level_cut): entry i's descriptor `reserved` and units `total`.
static void spread_entries(const Tape& tape, size_t b, const std::vector<uint32_t>& lv, uint32_t nlev,
                           const MmSpread& s, std::vector<uint32_t>& reserved, std::vector<uint64_t>& total) {
  std::vector<std::vector<size_t>> by_level(nlev + 1);
  for (size_t i = 0; i < lv.size(); ++i) {
    const TapeEntry& t = tape.entries[b + i];
    if (level_splittable(t.proto) && t.per_tile == 1 && t.nref >= 3) by_level[lv[i]].push_back(i);
  }
  std::vector<LevelProduct> ps;
  for (const std::vector<size_t>& ix : by_level) {
    if (ix.size() < 2) continue;
    ps.clear();
    for (size_t i : ix) {
      const TapeEntry& t = tape.entries[b + i];
      ps.push_back({t.proto.reserved, t.total, t.refs[0].sizes[0], t.refs[0].sizes[1], t.refs[2].sizes[0]});
    }
    if (spread_level(ps, s) == 0) continue;
    for (size_t k = 0; k < ix.size(); ++k) reserved[ix[k]] = ps[k].reserved, total[ix[k]] = ps[k].items;
  }
}

TapeImage stage_image(const Tape& tape, size_t b, size_t e, uint32_t piece_max, const MmSpread* spread) {
  TapeImage im;
  const std::vector<uint32_t> lv = tape.entry_levels(b, e);
  uint32_t nlev = 0;
  for (uint32_t l : lv) nlev = std::max(nlev, l);
  std::vector<uint32_t> reserved(lv.size());
  std::vector<uint64_t> total(lv.size());
  for (size_t i = 0; i < lv.size(); ++i)
    reserved[i] = tape.entries[b + i].proto.reserved, total[i] = tape.entries[b + i].total;
  if (spread && spread->items > 1) spread_entries(tape, b, lv, nlev, *spread, reserved, total);
  auto tiles = [&](size_t i) {
    const uint64_t per = tape.entries[b + i].per_tile;
    return (total[i] + per - 1) / per;
  };
  std::vector<uint64_t> pos(nlev + 1, 0);  // pos[L]: next descriptor of level L + 1 (after the prefix sum)
  for (size_t i = 0; i < lv.size(); ++i) pos[lv[i]] += tiles(i);
  for (uint32_t L = 1; L <= nlev; ++L) pos[L] += pos[L - 1];
  im.descs.resize(pos[nlev]);
  im.refmask.resize(pos[nlev]);
  im.level_end.assign(pos.begin() + 1, pos.end());
  std::set<uint32_t> ops;
  for (size_t i = 0; i < lv.size(); ++i) {
    TapeEntry t = tape.entries[b + i];
    t.proto.reserved = reserved[i], t.total = total[i];
    const uint64_t r0 = im.refs.size(), n = tiles(i);
    uint64_t& p0 = pos[lv[i] - 1];
    uint64_t addr[4] = {0, 0, 0, 0};
    for (uint32_t k = 0; k < t.nref && k < 4; ++k) {
      addr[k] = (r0 + k) * sizeof(TensorRef);
      im.refs.push_back(t.refs[k]);
    }
    SubOp proto = t.proto;
    const uint8_t mask = point_at_refs(proto, t.nref, addr);
    for_each_pointer(t, [&](u64& v, PointerField f) {
      if (v == 0) return;  // no pointer (an AttnArgs without mask): never moved
      if (f.in_refs) im.sites.push_back({v, r0 * sizeof(TensorRef) + f.offset, true});
      else
        for (uint64_t j = 0; j < n; ++j) im.sites.push_back({v, (p0 + j) * sizeof(SubOp) + f.offset, false});
    });
    for (uint64_t j = 0; j < n; ++j) {
      im.descs[p0 + j] = tile_of(proto, j, t.per_tile, t.total);
      im.refmask[p0 + j] = mask;
    }
    p0 += n;
    if (t.proto.flags & kFlagFused) im.programs.push_back((int32_t)t.proto.in[0]);
    else ops.insert(t.proto.op);
    for (int32_t e : matmul_programs(t.proto))
      if (e >= 0) im.epilogues.push_back(e);
  }
  im.ops.assign(ops.begin(), ops.end());
  im.entries = lv.size();
  piece_max = std::max<uint32_t>(1, piece_max);
  for (uint32_t L = 0, d = 0; L < nlev; ++L)
    for (; d < im.level_end[L]; d += std::min(piece_max, im.level_end[L] - d)) {
      const uint32_t n = std::min(piece_max, im.level_end[L] - d);
      im.pieces.push_back({d, n, heavy_items(&im.descs[d], n)});
    }
  std::sort(im.sites.begin(), im.sites.end(),
            [](const TapeImage::Site& x, const TapeImage::Site& y) { return x.value < y.value; });
  im.reset_sites(/*known=*/true);  // prepare_image uploads the refs as captured
  return im;
}

uint64_t TapeImage::resident_bytes() const {
  return descs.size() * sizeof(SubOp) + refs.size() * sizeof(TensorRef) + pieces.size() * sizeof(ProgLevel);
}

void TapeImage::reset_sites(bool known) {
  site_now.resize(sites.size());
  site_mark.assign(sites.size(), 0);
  moved_sites.clear();
  for (size_t i = 0; i < sites.size(); ++i) {
    site_now[i] = known ? sites[i].value : ~0ull;  // ~0: no pointer value, so every site differs
    if (!known && sites[i].in_refs) moved_sites.push_back((uint32_t)i);
  }
}

void image_patches(TapeImage& im, const Reloc& rel, std::vector<std::pair<uint64_t, uint64_t>>& ref_patches,
                   std::vector<std::pair<uint64_t, uint64_t>>& desc_patches) {
  ref_patches.clear();
  desc_patches.clear();
  const uint32_t mark = ++im.replays;
  std::vector<uint32_t>& moved = im.moved_next;  // this replay's moved sites (reused storage)
  moved.clear();
  for (const Reloc::R& r : rel.ranges()) {
    auto it = std::lower_bound(im.sites.begin(), im.sites.end(), r.lo,
                               [](const TapeImage::Site& s, uint64_t v) { return s.value < v; });
    for (; it != im.sites.end() && it->value < r.hi; ++it) {
      const size_t i = (size_t)(it - im.sites.begin());
      const uint64_t v = (uint64_t)((int64_t)it->value + r.delta);
      if (!it->in_refs) {
        if (r.delta != 0) desc_patches.emplace_back(it->offset, v);
        continue;
      }
      im.site_mark[i] = mark;
      if (v != it->value) moved.push_back((uint32_t)i);
      if (im.site_now[i] != v) ref_patches.emplace_back(it->offset, v), im.site_now[i] = v;
    }
  }
  for (uint32_t i : im.moved_sites)  // moved by an earlier replay, in no range now: back to the captured value
    if (im.site_mark[i] != mark && im.site_now[i] != im.sites[i].value) {
      im.site_now[i] = im.sites[i].value;
      ref_patches.emplace_back(im.sites[i].offset, im.sites[i].value);
    }
  im.moved_sites.swap(moved);
  std::sort(ref_patches.begin(), ref_patches.end());
  std::sort(desc_patches.begin(), desc_patches.end());
}

void aim_ref_fields(SubOp& s, uint8_t refmask, uint64_t refaddr) {
  if (refmask & 1) s.out += refaddr;
  for (uint32_t k = 0; k < 3; ++k)
    if (refmask & (2u << k)) s.in[k] += refaddr;
}

// Home blocks (device_src/types.h ProgLevel::home). A piece's kind of work is its first descriptor's op, flags and
// (fused) program; the first piece of a kind gets the next free blocks of the bounded grid (block 0, the poller,
// excluded), every later piece of that kind the same first block. It spans `per_claim` blocks per claim (types.h
// claim_size at the burst grid; Config::home_levels), at least two after a piece of its own kind: the blocks of
// that level are still busy with it while the others claim this one ahead. One per claim: the same blocks run the
// kind's level every time, so each claim finds its code warm -- a level ends with its slowest claim, and with two
// per claim (the twenty-fifth session's layout) whichever half came first took the claims, so a level could hold
// a claim on a block that had not run that kind before (W7 traced, H200: ncol items ~11 us at a home, 3.2 warm in
// tools/warp_bench.cu, 8.9 cold; 1 against 2 not yet measured in one call). A piece whose kind's blocks overlap
// the piece before it (another kind's: those blocks may still be running it) gets no home, nor does a piece of
// more blocks than the ring spares: every block claims it, as before homes. (W7 Llama-small traced, H200: a level
// whose home blocks had run the level before started 2-4 us later.)
//
// The first kind's first block: blocks 8 .. 32 of the worker's grid took the same SM in every launch, blocks 1 .. 7
// one of two (H200, %smid of six back-to-back launches: docs/VERIFICATION_HISTORY.md, twenty-fifth session), and a
// home is worth its SM's warm code only while the SM stays. The ring wraps to blocks 1 .. 7 last.
constexpr uint32_t kHomeFirstBlock = 8;
std::vector<uint32_t> piece_homes(const std::vector<PieceKind>& pieces, uint32_t nb, uint32_t grid, uint32_t nwarps,
                                  uint32_t per_claim) {
  std::vector<uint32_t> homes(pieces.size(), 0);
  if (nb < 4 || nwarps == 0 || per_claim == 0) return homes;
  const uint32_t ring = nb - 1;  // blocks 1 .. nb - 1
  grid = std::max(grid, nb);
  using Kind = std::tuple<uint32_t, uint32_t, uint64_t>;
  std::map<Kind, uint32_t> first_of;
  auto overlap = [ring](uint32_t f0, uint32_t s0, uint32_t f1, uint32_t s1) {  // ranges on the ring of blocks
    const uint32_t d01 = (f1 + ring - f0) % ring, d10 = (f0 + ring - f1) % ring;
    return d01 < s0 || d10 < s1;
  };
  // Each piece's span; a piece of the kind of the piece before it gets at least two blocks per claim: the blocks
  // of the level before are still busy with it while the others claim this one ahead. A kind's range is as wide as
  // its widest piece that fits the ring.
  std::vector<Kind> kinds;
  kinds.reserve(pieces.size());
  std::vector<uint64_t> want(pieces.size());
  std::map<Kind, uint32_t> widest;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PieceKind& p = pieces[i];
    const Kind& kind = kinds.emplace_back(p.op, p.flags, p.program);
    const bool again = i > 0 && kind == kinds[i - 1];
    const uint32_t claim = claim_size(p.count, grid, nwarps);
    want[i] = (uint64_t)(again ? std::max<uint32_t>(per_claim, 2) : per_claim) * ((p.count + claim - 1) / claim);
    if (p.count != 0 && want[i] < ring) widest[kind] = std::max<uint32_t>(widest[kind], (uint32_t)want[i]);
  }
  uint32_t cursor = std::min<uint32_t>(kHomeFirstBlock, nb - 1) - 1;  // the next free block, counted from block 1
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PieceKind& p = pieces[i];
    const Kind& kind = kinds[i];
    uint32_t home = 0;
    if (p.count != 0 && want[i] < ring) {
      const uint32_t span = (uint32_t)want[i];
      auto [it, fresh] = first_of.emplace(kind, 1 + cursor % ring);
      if (fresh) cursor += widest[kind];
      const uint32_t prev_home = i > 0 ? homes[i - 1] : 0;
      const uint32_t pf = prev_home & ((1u << kHomeSpanShift) - 1), ps = prev_home >> kHomeSpanShift;
      if (prev_home == 0 || (i > 0 && kind == kinds[i - 1]) || !overlap(it->second - 1, span, pf - 1, ps))
        home = home_word(it->second, span);
    }
    homes[i] = home;
  }
  return homes;
}

void Runtime::prepare_image(TapeImage& im, uint64_t resident) {
  im.resident_descs = im.resident_refs = im.resident_table = 0;
  if (im.descs.empty()) return;
  if (!resident) throw std::logic_error("gpuos internal error: a tape image needs resident memory");
  if (im.pieces.empty() || im.pieces.back().begin + im.pieces.back().count != im.descs.size())
    throw std::logic_error("gpuos internal error: a tape image's pieces do not cover its descriptors");
  const uint64_t refs_at = resident + im.descs.size() * sizeof(SubOp);
  const uint64_t table_at = refs_at + im.refs.size() * sizeof(TensorRef);
  // A DMA-delivered batch's worker reads a ref field f at f + (refs_dev_ - refs_d_) (worker.cu run_claim).
  const uint64_t aim = refs_at - (refs_dev_ - refs_d_);
  std::vector<PieceKind> kinds;  // before the ref fields move (a fused in[0] is a program id, no ref)
  for (const TapeImage::Piece& p : im.pieces) {
    const SubOp& d = im.descs[p.begin];
    kinds.push_back({d.op, d.flags, d.op == kOpFused ? d.in[0] : 0, p.count});
  }
  const std::vector<uint32_t> homes =
      cfg_.home_levels ? piece_homes(kinds, grid_, burst_grid_, cfg_.threads_per_block / 32, cfg_.home_levels)
                       : std::vector<uint32_t>(kinds.size(), 0);
  for (size_t i = 0; i < im.descs.size(); ++i) aim_ref_fields(im.descs[i], im.refmask[i], aim);
  im.table.resize(im.pieces.size());
  for (size_t i = 0; i < im.pieces.size(); ++i)
    im.table[i] = ProgLevel{resident + (uint64_t)im.pieces[i].begin * sizeof(SubOp), im.pieces[i].count, homes[i]};
  make_current();
  const CUstream s = record_stream();
  GPUOS_CU(driver().cuMemcpyHtoDAsync((CUdeviceptr)resident, im.descs.data(), im.descs.size() * sizeof(SubOp), s));
  if (!im.refs.empty())
    GPUOS_CU(driver().cuMemcpyHtoDAsync((CUdeviceptr)refs_at, im.refs.data(), im.refs.size() * sizeof(TensorRef), s));
  GPUOS_CU(driver().cuMemcpyHtoDAsync((CUdeviceptr)table_at, im.table.data(), im.table.size() * sizeof(ProgLevel), s));
  im.resident_descs = resident;
  im.resident_refs = refs_at;
  im.resident_table = table_at;
}

// cuStreamBatchMemOp takes fewer than 256 operations per call.
constexpr size_t kMaxMemopsPerCall = 128;

void Runtime::replay_image(TapeImage& im, const Reloc& rel) {
  if (tape_) throw std::logic_error("gpuos: a program cannot be replayed while another one is being captured");
  if (!im.descs.empty() && !im.resident_descs) throw std::logic_error("gpuos internal error: tape image not prepared");
  ScopedNs timed(st_.replay_stage_ns);
  if (staged_ > 0 || !levels_.empty()) flush(record_stream());  // the image's levels are its own
  // Far ahead of the device (a loop of back-to-back calls), wait for the oldest batches so that this call's pieces
  // go out in one publication: can_commit_level cuts a publication at kMaxBatches / 2 batches in flight, and each
  // extra publication is a memop call and a gated standby launch the device runs (W5's loop: 1.29 launches per call).
  wait_batch_room(std::min<size_t>(im.pieces.size(), kMaxBatches / 4));
  st_.program_replays++;
  st_.image_replays++;
  for (uint32_t op : im.ops) note_op_gen(op);
  for (int32_t id : im.programs) note_program_use(id);  // replays count toward tier 2 like live runs
  for (int32_t id : im.epilogues) note_program_use(id);
  try {
    // The data pointers that move this call. TensorRef sites whose resident value changes: stream memory writes
    // into the resident refs, ordered after the previous replay (whose stream wait precedes them) and before this
    // one's ready words. A few go first in the publication's own memop call (pre_ops_), more in calls of their
    // own. (CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER was refused in a batch: CUDA_ERROR_INVALID_VALUE, H200.)
    image_patches(im, rel, ref_patches_, patches_);
    pre_ops_.clear();
    auto write = [&](size_t k) {
      return memop_write64((CUdeviceptr)(im.resident_refs + ref_patches_[k].first), ref_patches_[k].second);
    };
    if (ref_patches_.size() <= kMaxPreOps && !im.pieces.empty()) {
      for (size_t k = 0; k < ref_patches_.size(); ++k) pre_ops_.push_back(write(k));
    } else {
      for (size_t k = 0; k < ref_patches_.size();) {
        memops_.clear();
        for (; k < ref_patches_.size() && memops_.size() < kMaxMemopsPerCall; ++k) memops_.push_back(write(k));
        make_current();
        PhaseMark pm(phase_, "replay: cuStreamBatchMemOp(resident TensorRef patches)");
        GPUOS_CU(driver().cuStreamBatchMemOp(record_stream(), (unsigned)memops_.size(), memops_.data(), 0));
      }
    }
    st_.ref_site_writes += ref_patches_.size();
  } catch (...) {
    pre_ops_.clear();
    im.reset_sites(/*known=*/false);
    throw;
  }
  // Pieces in groups of publications as flush() does (the caller's flush publishes the last group): a piece
  // without descriptor sites to patch is resident; consecutive resident pieces of one publication are one run,
  // published with one doorbell (kReadyProgram: the poller fills their batches from the image's ProgLevel table);
  // a piece with them goes through the ring, its aimed copy patched, by DMA (its TensorRefs are resident).
  const std::vector<std::pair<uint64_t, uint64_t>>& dp = patches_;
  const bool runs = program_runs();
  size_t P = 0, pi = 0;
  while (P < im.pieces.size()) {
    size_t head = SIZE_MAX;  // levels_ index of the open run's first piece
    while (P < im.pieces.size() && can_commit_level(/*resident=*/true)) {
      const TapeImage::Piece& pc = im.pieces[P];
      const size_t end = (size_t)pc.begin + pc.count;
      if (pi >= dp.size() || dp[pi].first / sizeof(SubOp) >= end) {
        levels_.push_back({desc_head_, pc.count, pc.heavy, im.resident_descs + (uint64_t)pc.begin * sizeof(SubOp),
                           false, 0, im.resident_table + P * sizeof(ProgLevel)});
        if (runs && head != SIZE_MAX) {
          levels_.back().run = -1;
          levels_[head].run++;
        } else {
          levels_.back().run = 1;
          head = levels_.size() - 1;
        }
        ++P;
        continue;
      }
      if (!levels_.empty() && desc_head_ - levels_.front().start + pc.count > cfg_.capacity) break;
      const uint64_t start = desc_head_;
      commit_ring(&im.descs[pc.begin], pc.count, /*dma=*/true);
      for (; pi < dp.size() && dp[pi].first / sizeof(SubOp) < end; ++pi)
        std::memcpy((char*)&ring_[(start + dp[pi].first / sizeof(SubOp) - pc.begin) % cfg_.capacity] +
                        dp[pi].first % sizeof(SubOp), &dp[pi].second, 8);
      head = SIZE_MAX;
      ++P;
    }
    if (P < im.pieces.size()) publish(record_stream(), false, false);
  }
  st_.subops += im.descs.size();
  st_.submitted += im.entries;
  st_.fused_subops += im.programs.size();
  if (!im.level_end.empty()) st_.levels_split += im.level_end.size() - 1;
}

void Runtime::replay(const Tape& tape, size_t b, size_t e, const Reloc& rel) {
  if (b > e || e > tape.entries.size())
    throw std::logic_error("gpuos internal error: replay of entries outside the tape");
  if (tape_) throw std::logic_error("gpuos: a program cannot be replayed while another one is being captured");
  ScopedNs timed(st_.replay_stage_ns);
  st_.program_replays++;
  Operand out, ins[kProgMaxInputs];
  for (size_t i = b; i < e; ++i) {
    TapeEntry t = tape.entries[i];
    relocate(t, rel);
    if (!(t.proto.flags & kFlagFused)) note_op_gen(t.proto.op);
    else note_program_use((int32_t)t.proto.in[0]);  // replays count toward tier 2 like live runs
    for (int32_t e : matmul_programs(t.proto))
      if (e >= 0) note_program_use(e);
    out.fp = t.out;
    for (uint32_t k = 0; k < t.nin; ++k) {
      ins[k].fp = t.ins[k];
      ins[k].is_const = t.in_const[k];
    }
    append_tiles(t.proto, t.total, t.per_tile, t.nref ? t.refs : nullptr, t.nref, out, ins, t.nin);
    st_.submitted++;
    if (t.proto.flags & kFlagFused) st_.fused_subops++;
    // No early publication (Config::publish_min) inside a replay: staging a decode step takes ~100-200 us, and
    // each early piece relaunched the worker on the burst grid. Twelfth session, H200, HF decode replayed back to
    // back: 726 -> 661 us per step (Llama-small static), 824 -> 763 (GPT-2-small), worker launches 1,146 -> 382.
  }
}

}  // namespace gpuos
