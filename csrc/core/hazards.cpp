// csrc/core/hazards.cpp -- see hazards.h.
#include "core/hazards.h"

#include <algorithm>

namespace gpuos {
namespace {
inline size_t hash_ptr(uintptr_t k) { return (size_t)((k >> 4) * 0x9E3779B97F4A7C15ull >> 20); }
inline bool overlaps(uint64_t lo, uint64_t hi, uint64_t a, uint64_t b) { return lo < b && a < hi; }
}  // namespace

const Hazards::Entry* Hazards::find(uintptr_t k) const {
  const size_t mask = e_.size() - 1;
  for (size_t i = hash_ptr(k) & mask;; i = (i + 1) & mask) {
    if (e_[i].tag != gen_) return nullptr;
    if (e_[i].key == k) return &e_[i];
  }
}

Hazards::Entry& Hazards::slot(uintptr_t k) {
  if ((count_ + 1) * 2 > e_.size()) grow(e_.size() * 2);
  const size_t mask = e_.size() - 1;
  for (size_t i = hash_ptr(k) & mask;; i = (i + 1) & mask) {
    Entry& e = e_[i];
    if (e.tag != gen_) {  // new entry: empty ranges are [max, 0)
      e = Entry{k, gen_, 0, 0, ~0ull, 0, ~0ull, 0};
      ++count_;
      return e;
    }
    if (e.key == k) return e;
  }
}

void Hazards::grow(size_t n) {
  std::vector<Entry> old(n, Entry{0, 0, 0, 0, 0, 0, 0, 0});
  old.swap(e_);
  const uint32_t live = gen_;
  gen_ = 1;
  count_ = 0;
  for (const Entry& o : old) {
    if (o.tag != live) continue;
    Entry& e = slot(o.key);
    const uintptr_t key = e.key;
    e = o;
    e.key = key;
    e.tag = gen_;
  }
}

uint32_t Hazards::level_of(const Access& w, const Access* reads, uint32_t n) const {
  uint32_t lev = 1;
  for (uint32_t k = 0; k < n; ++k) {
    const Entry* e = find(reads[k].storage);
    if (e && overlaps(reads[k].lo, reads[k].hi, e->wlo, e->whi)) lev = std::max(lev, e->wlev + 1);
  }
  if (const Entry* e = find(w.storage)) {
    if (overlaps(w.lo, w.hi, e->wlo, e->whi)) lev = std::max(lev, e->wlev + 1);
    if (overlaps(w.lo, w.hi, e->rlo, e->rhi)) lev = std::max(lev, e->rlev + 1);
  }
  return lev;
}

void Hazards::note(const Access& w, const Access* reads, uint32_t n, uint32_t level) {
  for (uint32_t k = 0; k < n; ++k) {
    Entry& e = slot(reads[k].storage);
    e.rlo = std::min(e.rlo, reads[k].lo);
    e.rhi = std::max(e.rhi, reads[k].hi);
    e.rlev = std::max(e.rlev, level);
  }
  Entry& e = slot(w.storage);
  e.wlo = std::min(e.wlo, w.lo);
  e.whi = std::max(e.whi, w.hi);
  e.wlev = std::max(e.wlev, level);
  max_level_ = std::max(max_level_, level);
}

}  // namespace gpuos
