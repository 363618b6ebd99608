// csrc/core/hazards.h -- THE read/write hazard model. Every recording path places work with it: the runtime
// gives each recorded sub-op its dependency level (explicit API and the scheduler's lowering alike), and the
// scheduler asks it whether an eager op touches deferred work.
//
// Per storage it keeps the union byte range read and the union byte range written so far, with the highest
// level of each. A unit that reads [lo, hi) must run after every earlier write overlapping it; a unit that
// writes must also run after every earlier read overlapping it. Union ranges make it conservative (a unit may
// land a level later than needed, never earlier): exact for distinct tensors and for rows/slices of one buffer
// touched at one level. A strided view whose rows are runs of bytes at a fixed period also carries that pattern
// (Access::win): two views of one storage with the same period whose windows do not meet are disjoint -- the
// pieces of a torch.cat along the last dim (HF's rotate_half) share a level. Open addressing, cleared in O(1) by
// a generation tag.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpuos {

// Bytes whose address mod period lies in [lo, hi) (lo < hi <= period); period 0: no such pattern.
struct Window {
  uint64_t period = 0;
  uint32_t lo = 0, hi = 0;
};
// The memory one operand of a unit touches: its storage's identity and the byte range the view can reach, and
// within it, where the view has one, its periodic window.
struct Access {
  uintptr_t storage = 0;
  uint64_t lo = 0, hi = 0;
  Window win;
};
// The periodic window of a strided view at `ptr` (bytes; es: element size): its stride-1 dim is a run of bytes,
// and every other dim of size > 1 steps by a multiple of the smallest such step P; if the run is shorter than P
// and its window [ptr mod P, + run) does not wrap, period P and that window (else period 0: the range alone).
Window period_window(uint64_t ptr, int ndim, const int64_t* sizes, const int64_t* strides, int64_t es);

class Hazards {
 public:
  Hazards() { grow(256); }
  // Level (1-based) of a unit that writes `w` and reads `reads[0..n)`: 1 + the highest level it must follow.
  uint32_t level_of(const Access& w, const Access* reads, uint32_t n) const;
  // Record the unit at `level`.
  void note(const Access& w, const Access* reads, uint32_t n, uint32_t level);
  // Does any noted unit read or write `storage`?
  bool touches(uintptr_t storage) const { return find(storage) != nullptr; }
  uint32_t max_level() const { return max_level_; }
  bool empty() const { return count_ == 0; }
  void clear() {
    if (++gen_ == 0) {  // tags wrapped: really empty the table
      for (Entry& e : e_) e.tag = 0;
      gen_ = 1;
    }
    count_ = 0;
    max_level_ = 0;
  }

 private:
  struct Entry {
    uintptr_t key;
    uint32_t tag, rlev, wlev;
    uint64_t rlo, rhi, wlo, whi;
    Window rp, wp;  // the windows of the read / written unions (period 0: none, or the periods differ)
  };
  const Entry* find(uintptr_t k) const;
  Entry& slot(uintptr_t k);
  void grow(size_t n);
  std::vector<Entry> e_;  // size: a power of two
  uint32_t gen_ = 1;
  size_t count_ = 0;
  uint32_t max_level_ = 0;
};

}  // namespace gpuos
