// csrc/core/tape.h -- a program's recorded sub-ops (issue #17): while a Tape is attached to a Runtime, every
// sub-op the runtime stages (Runtime::append_tiles: the one place every record_* ends) is also appended here,
// exactly as staged -- descriptor prototype, TensorRefs, iteration space, and the footprints the hazard model
// levels it with. Runtime::replay stages a range of entries again with their data pointers moved by a Reloc
// (new input / output / fallback-result buffers), with no lowering, fusion analysis or Python: the same
// sub-ops, levels and fusion as at capture.
//
// Pointer fields an entry can hold (and Reloc moves): the TensorRefs' ptr; for a fused sub-op the FusedArgs in
// its two ref slots; for attention the AttnArgs in ref slot 0 (out, mask, lse); for a sub-op without refs the
// descriptor's out / non-constant in[] fields. Footprints (Access: storage identity, byte range) stay as captured:
// they only order the tape's own entries, and the program keeps every captured storage alive.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/hazards.h"
#include "device_src/interp.h"
#include "device_src/types.h"

namespace gpuos {

struct TapeEntry {
  SubOp proto{};
  uint64_t total = 0, per_tile = 0;
  TensorRef refs[4] = {};
  uint32_t nref = 0;
  Access out{};
  Access ins[kProgMaxInputs] = {};
  bool in_const[kProgMaxInputs] = {};
  uint32_t nin = 0;
};

struct Tape {
  std::vector<TapeEntry> entries;
  // Dependency levels of entries [b, e) as the runtime gives them when they are staged alone (hazards.h).
  uint32_t levels(size_t b, size_t e) const;
  // The level (1-based) of each entry of [b, e) under the same rule (levels() is their maximum).
  std::vector<uint32_t> entry_levels(size_t b, size_t e) const;
};

// Byte ranges whose pointers move by `delta` at replay. Ranges must not overlap (the caller checks).
class Reloc {
 public:
  void add(uint64_t lo, uint64_t hi, int64_t delta);
  uint64_t operator()(uint64_t p) const;  // p moved if it lies in a range, else p
  bool empty() const { return r_.empty(); }
  void clear() { r_.clear(); sorted_ = true; }

 private:
  struct R { uint64_t lo, hi; int64_t delta; };
  mutable std::vector<R> r_;
  mutable bool sorted_ = true;
};

// The entry's pointer fields moved by `rel` (proto and refs; the footprints are left as captured).
void relocate(TapeEntry& e, const Reloc& rel);

}  // namespace gpuos
