// csrc/core/hazards.cpp -- see hazards.h.
#include "core/hazards.h"

#include <algorithm>

namespace gpuos {
namespace {
inline size_t hash_ptr(uintptr_t k) { return (size_t)((k >> 4) * 0x9E3779B97F4A7C15ull >> 20); }
inline bool overlaps(uint64_t lo, uint64_t hi, uint64_t a, uint64_t b) { return lo < b && a < hi; }
}  // namespace

Window period_window(uint64_t ptr, int ndim, const int64_t* sizes, const int64_t* strides, int64_t es) {
  int inner = -1;
  uint64_t p = 0;
  for (int i = 0; i < ndim; ++i) {
    if (sizes[i] <= 1) continue;
    if (strides[i] == 1 && inner < 0) {
      inner = i;
      continue;
    }
    const uint64_t st = (uint64_t)(strides[i] < 0 ? -strides[i] : strides[i]) * (uint64_t)es;
    if (st == 0) continue;  // broadcast: the same bytes again
    if (p == 0 || st < p) p = st;
  }
  if (p == 0 || p > 0xffffffffull) return {};
  for (int i = 0; i < ndim; ++i) {
    if (sizes[i] <= 1 || i == inner) continue;
    const uint64_t st = (uint64_t)(strides[i] < 0 ? -strides[i] : strides[i]) * (uint64_t)es;
    if (st % p != 0) return {};
  }
  const uint64_t run = (uint64_t)(inner >= 0 ? sizes[inner] : 1) * (uint64_t)es, w0 = ptr % p;
  if (run >= p || w0 + run > p) return {};
  return {p, (uint32_t)w0, (uint32_t)(w0 + run)};
}

namespace {
// Can an access and the union [lo, hi) with window u noted so far touch a common byte? (Ranges overlap, and the
// windows do not tell them apart.)
inline bool meets(const Access& a, uint64_t lo, uint64_t hi, const Window& u) {
  if (!overlaps(a.lo, a.hi, lo, hi)) return false;
  return !(a.win.period != 0 && a.win.period == u.period && (a.win.hi <= u.lo || u.hi <= a.win.lo));
}
// u = the window of u's union and a: a's if the union was empty, the hull of both at one period, else none.
inline void merge(Window& u, bool empty, const Window& a) {
  if (empty) {
    u = a;
  } else if (u.period != 0 && u.period == a.period) {
    u.lo = std::min(u.lo, a.lo);
    u.hi = std::max(u.hi, a.hi);
  } else {
    u.period = 0;
  }
}
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
      e = Entry{k, gen_, 0, 0, ~0ull, 0, ~0ull, 0, {0, 0, 0}, {0, 0, 0}};
      ++count_;
      return e;
    }
    if (e.key == k) return e;
  }
}

void Hazards::grow(size_t n) {
  std::vector<Entry> old(n, Entry{0, 0, 0, 0, 0, 0, 0, 0, {0, 0, 0}, {0, 0, 0}});
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
    if (e && meets(reads[k], e->wlo, e->whi, e->wp)) lev = std::max(lev, e->wlev + 1);
  }
  if (const Entry* e = find(w.storage)) {
    if (meets(w, e->wlo, e->whi, e->wp)) lev = std::max(lev, e->wlev + 1);
    if (meets(w, e->rlo, e->rhi, e->rp)) lev = std::max(lev, e->rlev + 1);
  }
  return lev;
}

void Hazards::note(const Access& w, const Access* reads, uint32_t n, uint32_t level) {
  for (uint32_t k = 0; k < n; ++k) {
    Entry& e = slot(reads[k].storage);
    merge(e.rp, e.rlo > e.rhi, reads[k].win);
    e.rlo = std::min(e.rlo, reads[k].lo);
    e.rhi = std::max(e.rhi, reads[k].hi);
    e.rlev = std::max(e.rlev, level);
  }
  Entry& e = slot(w.storage);
  merge(e.wp, e.wlo > e.whi, w.win);
  e.wlo = std::min(e.wlo, w.lo);
  e.whi = std::max(e.whi, w.hi);
  e.wlev = std::max(e.wlev, level);
  max_level_ = std::max(max_level_, level);
}

}  // namespace gpuos
