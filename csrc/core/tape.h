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
#include <utility>
#include <vector>

#include "core/hazards.h"
#include "core/matmul_plan.h"
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
  struct R { uint64_t lo, hi; int64_t delta; };
  void add(uint64_t lo, uint64_t hi, int64_t delta);
  uint64_t operator()(uint64_t p) const;  // p moved if it lies in a range, else p
  bool empty() const { return r_.empty(); }
  void clear() { r_.clear(); sorted_ = true; }
  const std::vector<R>& ranges() const { return r_; }

 private:
  mutable std::vector<R> r_;
  mutable bool sorted_ = true;
};

// The entry's pointer fields moved by `rel` (proto and refs; the footprints are left as captured).
void relocate(TapeEntry& e, const Reloc& rel);

// The staging rules append_tiles applies to every sub-op, shared with the tape images below.
// With TensorRefs at device addresses addr[0..nref): proto.out points at the first; the others at the non-constant
// in[] fields, except for a fused sub-op (its FusedArgs spans two slots; in[0] is its program id). Returns which
// fields now point at refs (bit 0: out, bit 1 + k: in[k]).
inline uint8_t point_at_refs(SubOp& proto, uint32_t nref, const uint64_t* addr) {
  if (nref == 0) return 0;
  proto.out = addr[0];
  uint8_t mask = 1;
  if (!(proto.flags & kFlagFused))
    for (uint32_t k = 0; k + 1 < nref; ++k)
      if (!(proto.flags & (kFlagConst0 << k))) proto.in[k] = addr[k + 1], mask |= (uint8_t)(2u << k);
  return mask;
}
// Tile `tile` of a sub-op of `total` units, `per_tile` per descriptor.
inline SubOp tile_of(const SubOp& proto, uint64_t tile, uint64_t per_tile, uint64_t total) {
  SubOp d = proto;
  const uint64_t base = tile * per_tile;
  d.n = (uint32_t)(per_tile < total - base ? per_tile : total - base);
  d.base = (uint32_t)base;
  return d;
}

// A tape range staged once, as the runtime would stage it alone (Runtime::replay_image): every tile's descriptor
// in level order and the entries' TensorRefs as one contiguous image. Runtime::prepare_image uploads both to
// device memory the program owns, the descriptors' ref fields aimed at the resident refs, with a ProgLevel table
// of its pieces (device_src/types.h); the worker reads a resident level's descriptors there, not from the ring. A
// replay finds the data pointers its Reloc moves (sites sorted by captured value: a range finds its sites by
// binary search), writes the TensorRef ones whose resident value differs into the resident refs with stream
// memory writes, and publishes the pieces: a run of resident pieces with one doorbell (kReadyProgram), a piece
// whose descriptors hold moved pointers (an elementwise op's tiles reading a new input) as a patched copy through
// the ring. No hazard lookups, no per-entry staging: O(pieces + moved pointers + the descriptors of the patched
// pieces) host work per call.
struct TapeImage {
  std::vector<SubOp> descs;         // level-major; ref fields hold byte offsets into `refs` until prepare_image
                                    // aims them at the resident refs (then: the resident descriptors' host copy)
  std::vector<uint8_t> refmask;     // per descriptor: point_at_refs' mask
  std::vector<uint32_t> level_end;  // one past each level's last descriptor
  // Levels cut into pieces of at most `piece_max` descriptors (a batch's matmul / attention items index their
  // scratch by position mod the ring: at most half of it per batch): each piece is one batch.
  struct Piece { uint32_t begin, count, heavy; };  // heavy: matmul and attention items (heavy_items)
  std::vector<Piece> pieces;
  std::vector<TensorRef> refs;      // every entry's TensorRefs, in entry order (a FusedArgs' two slots adjacent)
  struct Site {
    uint64_t value;   // the pointer as captured
    uint64_t offset;  // byte offset into descs (in_refs false) or refs
    bool in_refs;
  };
  std::vector<Site> sites;          // sorted by value
  // What each TensorRef site holds in the resident refs once the writes already issued have landed (a replay
  // writes only the sites whose value changes; stream order makes this the value its batches read).
  std::vector<uint64_t> site_now;
  std::vector<uint32_t> moved_sites;  // ref sites whose site_now differs from the captured value
  std::vector<uint32_t> moved_next;   // image_patches' scratch (swapped with moved_sites)
  std::vector<uint32_t> site_mark;    // per site: the replay that last set it (image_patches' bookkeeping)
  uint32_t replays = 0;
  std::vector<uint32_t> ops;        // distinct op ids of the unfused entries (generation needs, note_op_gen)
  std::vector<int32_t> programs;    // program id of each fused entry (tier-2 use counts, note_program_use)
  std::vector<int32_t> epilogues;   // program ids of matmul entries' epilogues and prologues (the same counts)
  uint64_t entries = 0;
  // Set by Runtime::prepare_image: device addresses of the resident descriptors, TensorRefs and ProgLevel table
  // (0: not prepared).
  uint64_t resident_descs = 0, resident_refs = 0, resident_table = 0;
  std::vector<ProgLevel> table;  // the piece table as uploaded (host copy)
  // Bytes of device memory prepare_image needs (descriptors, TensorRefs, then the piece table).
  uint64_t resident_bytes() const;
  // What the resident refs hold: as captured (known, prepare_image's upload) or unknown (after a failed replay:
  // the next replay writes every TensorRef site).
  void reset_sites(bool known);
};
// `piece_max`: the most descriptors of one batch (Runtime: half the ring). `spread`: each level's products re-cut
// as a live flush cuts them (spread_level; nullptr: as captured).
TapeImage stage_image(const Tape& tape, size_t b, size_t e, uint32_t piece_max, const MmSpread* spread = nullptr);
// A replay's pointer moves, as (byte offset into refs or descs, new value), sorted: the TensorRef sites whose
// value differs from what the resident refs hold (site_now, updated here; a moved site outside every range goes
// back to its captured value), and the descriptor sites inside a range that moved (delta != 0: a patched copy
// starts from the captured image).
void image_patches(TapeImage& im, const Reloc& rel, std::vector<std::pair<uint64_t, uint64_t>>& ref_patches,
                   std::vector<std::pair<uint64_t, uint64_t>>& desc_patches);
// Descriptor fields that point at refs (point_at_refs' mask) aimed at refs placed at `refaddr`.
void aim_ref_fields(SubOp& s, uint8_t refmask, uint64_t refaddr);
// ProgLevel::home of each piece of an image (device_src/types.h; walk.h home_skips): `nb` the bounded grid's blocks
// (the homes' ring: blocks 1 .. nb - 1), `grid` the largest launched grid and `nwarps` warps per block (the claim
// size, types.h claim_size), `per_claim` home blocks per claim (Config::home_levels). 0 for a piece without a home.
struct PieceKind {
  uint32_t op, flags;
  uint64_t program;  // a fused piece's program id, else 0
  uint32_t count;    // descriptors
};
std::vector<uint32_t> piece_homes(const std::vector<PieceKind>& pieces, uint32_t nb, uint32_t grid, uint32_t nwarps,
                                  uint32_t per_claim);
// Replays take the image path (default) or stage entry by entry (Runtime::replay); for A/B measurements and
// tests (gpuos_ext._testing.set_tape_images).
void set_tape_images(bool on);
bool tape_images();
// An image replay publishes a run of resident pieces with one doorbell (default) or one ready word per piece; for
// A/B measurements and tests (gpuos_ext._testing.set_program_runs).
void set_program_runs(bool on);
bool program_runs();

}  // namespace gpuos
