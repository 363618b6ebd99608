// csrc/core/tape.cpp -- see tape.h; Runtime::replay (the recording side is in core/record.cpp: append_tiles).
#include "core/tape.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/runtime.h"
#include "device_src/functors.h"
#include "inject/specialize.h"

namespace gpuos {

void Reloc::add(uint64_t lo, uint64_t hi, int64_t delta) {
  if (hi <= lo || delta == 0) return;
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

void relocate(TapeEntry& e, const Reloc& rel) {
  if (rel.empty()) return;
  const bool fused = (e.proto.flags & kFlagFused) != 0;
  if (e.nref == 0) {  // data pointers in the descriptor itself
    e.proto.out = rel(e.proto.out);
    for (uint32_t k = 0; k < 3; ++k)
      if (!(e.proto.flags & (kFlagConst0 << k))) e.proto.in[k] = rel(e.proto.in[k]);
    return;
  }
  if (fused) {  // refs[0..1] hold one FusedArgs
    FusedArgs fa;
    std::memcpy((void*)&fa, (const void*)e.refs, sizeof(FusedArgs));
    for (uint32_t k = 0; k < 1 + fa.ninputs && k < kFusedMaxOperands; ++k) fa.opnd[k].ptr = rel(fa.opnd[k].ptr);
    std::memcpy((void*)e.refs, (const void*)&fa, sizeof(FusedArgs));
    return;
  }
  uint32_t k = 0;
  if (e.proto.op == kOp_sdpa) {  // refs[0] holds the AttnArgs
    AttnArgs a;
    std::memcpy((void*)&a, (const void*)&e.refs[0], sizeof(AttnArgs));
    a.out = rel(a.out);
    a.mask = rel(a.mask);
    a.lse = rel(a.lse);
    std::memcpy((void*)&e.refs[0], (const void*)&a, sizeof(AttnArgs));
    k = 1;
  }
  for (; k < e.nref; ++k) e.refs[k].ptr = rel(e.refs[k].ptr);
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

void Runtime::replay(const Tape& tape, size_t b, size_t e, const Reloc& rel) {
  if (b > e || e > tape.entries.size())
    throw std::logic_error("gpuos internal error: replay of entries outside the tape");
  if (tape_) throw std::logic_error("gpuos: a program cannot be replayed while another one is being captured");
  st_.program_replays++;
  Operand out, ins[kProgMaxInputs];
  for (size_t i = b; i < e; ++i) {
    TapeEntry t = tape.entries[i];
    relocate(t, rel);
    if (!(t.proto.flags & kFlagFused)) note_op_gen(t.proto.op);
    else note_program_use((int32_t)t.proto.in[0]);  // replays count toward tier 2 like live runs
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
