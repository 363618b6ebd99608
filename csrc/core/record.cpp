// csrc/core/record.cpp -- recording: a sub-op's tiles, TensorRefs and dependency level (staged until flush).
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/runtime.h"
#include "device_src/dataops.h"  // dtype_size
#include "device_src/numeric.h"
#include "inject/registry.h"
#include "inject/specialize.h"

namespace gpuos {

// Merge dims (drop size-1, fuse dims contiguous across all operands) and fill TensorRefs. Returns the merged
// ndim; ndim == 1 with every stride 1 means every operand is contiguous.
uint32_t Runtime::merge_refs(const Operand* ops, int nops, TensorRef* out_refs) {
  const int nd = ops[0].ndim;
  int64_t sizes[64];
  int64_t strides[4][64];
  int m = 0;
  for (int i = 0; i < nd; ++i) {
    const int64_t sz = ops[0].sizes[i];
    if (sz == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < nops && merge; ++k) merge = strides[k][m - 1] == ops[k].strides[i] * sz;
    if (merge) {
      sizes[m - 1] *= sz;
      for (int k = 0; k < nops; ++k) strides[k][m - 1] = ops[k].strides[i];
    } else {
      sizes[m] = sz;
      for (int k = 0; k < nops; ++k) strides[k][m] = ops[k].strides[i];
      ++m;
    }
  }
  if (m == 0) {  // 0-d or all-ones shape: one element
    sizes[0] = 1;
    for (int k = 0; k < nops; ++k) strides[k][0] = 1;
    m = 1;
  }
  if (m > (int)kMaxDims)
    throw std::invalid_argument("gpuos: tensors with more than " + std::to_string(kMaxDims) +
                                " non-mergeable dims are not supported; call .contiguous() first");
  for (int k = 0; k < nops; ++k) {
    TensorRef& r = out_refs[k];
    r.ptr = ops[k].ptr;
    r.ndim = (uint32_t)m;
    r.dtype = ops[k].dtype;
    for (int i = 0; i < (int)kMaxDims; ++i) {
      r.sizes[i] = i < m ? sizes[i] : 1;
      r.strides[i] = i < m ? strides[k][i] : 0;
    }
  }
  return (uint32_t)m;
}

void Runtime::note_op_gen(uint32_t op) {
  const uint32_t g = op_need_gen(op);
  if (g > pending_need_gen_) pending_need_gen_ = g;
}

MmSpread Runtime::mm_spread() const {
  const uint32_t warps = cfg_.threads_per_block / 32;
  return {cfg_.mm_spread ? cfg_.mm_items : 0u, cfg_.capacity, warps, burst_grid_ * warps, cfg_.local_combine};
}

uint32_t Runtime::staged_level(const Operand& out, const Operand* ins, uint32_t nin) const {
  Access reads[kProgMaxInputs];
  uint32_t nr = 0;
  for (uint32_t k = 0; k < nin && k < kProgMaxInputs; ++k)
    if (!ins[k].is_const) reads[nr++] = ins[k].access();
  const uint32_t level = hazards_.level_of(out.access(), reads, nr);
  return level <= join_base_ ? join_base_ : level;  // as append_tiles joins it
}

void Runtime::append_tiles(SubOp proto, uint64_t total, uint64_t per_tile, const TensorRef* refs, uint32_t nref,
                           const Operand& out, const Operand* ins, uint32_t nin) {
  // nin: up to 3 elementwise operands, or up to kProgMaxInputs leaves of a fused chain.
  static_assert(kProgMaxInputs >= 3, "read slots");
  if (nin > kProgMaxInputs) throw std::logic_error("gpuos internal error: more inputs than a fused chain holds");
  if (tape_) {  // a program is being captured: the sub-op as staged (core/tape.h)
    TapeEntry& t = tape_->entries.emplace_back();
    t.proto = proto, t.total = total, t.per_tile = per_tile, t.nref = nref, t.nin = nin, t.out = out.access();
    for (uint32_t k = 0; k < nref && k < 4; ++k) t.refs[k] = refs[k];
    for (uint32_t k = 0; k < nin; ++k) t.ins[k] = ins[k].access(), t.in_const[k] = ins[k].is_const;
  }
  Access reads[kProgMaxInputs];
  uint32_t nr = 0;
  for (uint32_t k = 0; k < nin; ++k)
    if (!ins[k].is_const) reads[nr++] = ins[k].access();
  const Access w = out.access();
  // A fused sub-op's FusedArgs spans two arena slots that must be adjacent: at the arena's end, skip a slot.
  const bool span = (proto.flags & kFlagFused) != 0;
  const uint64_t tiles_total = (total + per_tile - 1) / per_tile;
  const uint64_t stage_limit = cfg_.capacity;  // staged work must fit the ring once older batches are done
  uint32_t level = 1;
  uint64_t tile = 0;
  while (tile < tiles_total) {
    const uint32_t piece = (uint32_t)std::min<uint64_t>(tiles_total - tile, cfg_.capacity / 2);
    if (staged_ + piece > stage_limit) {
      st_.full_queue_flushes++;
      flush(record_stream());
    }
    ensure_ref_room(nref + (span ? 1 : 0));  // may publish everything staged
    if (span && ref_head_ % ref_capacity_ == ref_capacity_ - 1) ++ref_head_;
    if (nref) {
      uint64_t dev[4] = {0, 0, 0, 0};
      for (uint32_t k = 0; k < nref; ++k) {
        const uint32_t slot = (uint32_t)(ref_head_ % ref_capacity_);
        refs_[slot] = refs[k];
        dev[k] = refs_d_ + (uint64_t)slot * sizeof(TensorRef);
        ++ref_head_;
      }
      point_at_refs(proto, nref, dev);
    }
    // The level after any publication above (published work runs before everything recorded later, except what
    // joins the last published level: see join_base_).
    level = hazards_.level_of(w, reads, nr);
    if (level > hazards_.max_level() && hazards_.max_level() > 0) st_.levels_split++;
    const bool join = level <= join_base_;
    if (join) level = join_base_;
    const uint32_t sl = join ? 0 : level - join_base_;  // stage level (0: join_stage_)
    if (sl > stage_levels_) {
      stage_levels_ = sl;
      if (stage_.size() < sl) stage_.resize(sl);
    }
    std::vector<SubOp>& v = join ? join_stage_ : stage_[sl - 1];
    for (uint32_t t = 0; t < piece; ++t, ++tile) v.push_back(tile_of(proto, tile, per_tile, total));
    staged_ += piece;
    pending_subops_ += piece;
    st_.subops += piece;
  }
  hazards_.note(w, reads, nr, level);
}

// While a program is captured (latency-bound decode steps) a small op is spread over up to kCaptureWarps warps:
// one warp's memory-bound work waits a round trip per iteration of its loop (ninth session, claim trace on an
// H200: a 1,024-element fp32 add 3.7 us, a 4,096-element cast 36.5 us in one warp's tile; a 1,024-element chain
// of 32 instructions 140 us). Units are elements (min_units 128: whole 16-byte vectors, multiples of 32) or rows
// (min_units 1). Element tiles of a larger op hold at most kCaptureWarpElems elements, in at most
// kCaptureMaxTiles tiles (eleventh session: HF's repeat_kv clones, 65,536 strided elements, took ~150 us per
// level in 16 tiles). Live flushes keep whole tiles: thousands of independent ops fill the grid and each
// descriptor costs host time.
constexpr uint64_t kCaptureWarps = 16, kCaptureWarpElems = 512, kCaptureMaxTiles = 256;
uint64_t capture_tile(uint64_t per_tile, uint64_t total, uint64_t min_units) {
  uint64_t split = (total + kCaptureWarps - 1) / kCaptureWarps;
  if (min_units > 1) {
    split = std::max(std::min(split, kCaptureWarpElems), (total + kCaptureMaxTiles - 1) / kCaptureMaxTiles);
    split = (split + 31) / 32 * 32;
  }
  return std::min<uint64_t>(per_tile, std::max<uint64_t>(min_units, split));
}

void Runtime::record_ew(uint32_t op, uint32_t arity, const Operand& out, const Operand* ins, float s0, float s1,
                        int64_t numel) {
  if (numel <= 0) return;
  note_op_gen(op);
  SubOp proto{};
  proto.op = op;
  proto.scalar[0] = s0;
  proto.scalar[1] = s1;
  proto.dtype = out.dtype;
  // Tensor operands (out first) for dim merging; constants travel in the descriptor.
  Operand tens[4] = {out};
  int nt = 1;
  bool contiguous = out.contiguous, one_dtype = true;
  uint64_t ptr_bits = out.ptr;
  for (uint32_t k = 0; k < arity; ++k) {
    proto.dtype |= (ins[k].is_const ? 0u : ins[k].dtype) << (8 * (k + 1));
    if (ins[k].is_const) {
      proto.flags |= kFlagConst0 << k;
      proto.in[k] = f32_bits(ins[k].value);
      continue;
    }
    tens[nt++] = ins[k];
    contiguous &= ins[k].contiguous;
    one_dtype &= ins[k].dtype == out.dtype;
    ptr_bits |= ins[k].ptr;
  }
  TensorRef refs[4];
  bool strided = !contiguous;
  uint32_t m = 1;
  if (strided) {
    m = merge_refs(tens, nt, refs);
    strided = m != 1;
    for (int k = 0; k < nt && !strided; ++k) strided = refs[k].strides[0] != 1;
  }
  if (strided && record_ew_runs(proto, arity, out, ins, refs, nt, m, numel)) {
    st_.submitted++;
    maybe_publish_early();
    return;
  }
  if (strided) {
    proto.flags |= kFlagStrided;
    // Refs in operand order: out, then each input slot (constants keep a zero ref that is never read).
    TensorRef slots[4] = {refs[0]};
    for (uint32_t k = 0, t = 1; k < arity; ++k) slots[k + 1] = ins[k].is_const ? TensorRef{} : refs[t++];
    append_tiles(proto, (uint64_t)numel, tile_units(kTileElems, (uint64_t)numel, 128), slots, arity + 1, out, ins,
                 arity);
  } else {
    if (one_dtype && (ptr_bits & 15) == 0) proto.flags |= kFlagVec;
    proto.out = out.ptr;
    for (uint32_t k = 0; k < arity; ++k)
      if (!ins[k].is_const) proto.in[k] = ins[k].ptr;
    append_tiles(proto, (uint64_t)numel, tile_units(kTileElems, (uint64_t)numel, 128), nullptr, 0, out, ins, arity);
  }
  st_.submitted++;
  maybe_publish_early();
}

// A strided elementwise op whose tensor operands are all contiguous along the innermost merged dim, in runs of
// >= kRunMinElems elements (HF's repeat_kv clone: (B, Hkv, n_rep [stride 0], L, D) -> (B, H, L, D), runs of
// L x D elements), at most kRunMaxRows runs: one contiguous sub-op per run, so the worker takes the vector loop
// (16-byte loads, kEwLoads per lane in flight) instead of the strided element walk (an address walk and one
// 2-byte load per element: a 2 MiB clone took 108 us per level on an H200, twelfth session). The runs' footprints
// are their own byte ranges (disjoint writes: one level). Tiles: what the whole op would get, per run. Returns
// false (nothing recorded) when the op does not qualify.
bool Runtime::record_ew_runs(const SubOp& proto0, uint32_t arity, const Operand& out, const Operand* ins,
                             const TensorRef* refs, int nt, uint32_t m, int64_t numel) {
  constexpr int64_t kRunMinElems = 512, kRunMaxRows = 64;
  if (m < 2) return false;
  const int64_t run = refs[0].sizes[m - 1], rows = numel / std::max<int64_t>(run, 1);
  if (run < kRunMinElems || rows > kRunMaxRows) return false;
  for (int k = 0; k < nt; ++k)
    if (refs[k].strides[m - 1] != 1) return false;
  const uint64_t per = tile_units(kTileElems, (uint64_t)numel, 128);
  const int64_t one = 1;
  int64_t idx[kMaxDims] = {};
  for (int64_t r = 0; r < rows; ++r) {
    Operand ro = out, ri[3];
    Operand* row_ops[4] = {&ro};
    for (uint32_t k = 0, t = 1; k < arity; ++k) {
      ri[k] = ins[k];
      if (!ins[k].is_const) row_ops[t++] = &ri[k];
    }
    uint64_t ptr_bits = 0;
    bool one_dtype = true;
    for (int k = 0; k < nt; ++k) {
      int64_t off = 0;
      for (uint32_t j = 0; j + 1 < m; ++j) off += idx[j] * refs[k].strides[j];
      Operand& o = *row_ops[k];
      const uint64_t es = dtype_size(o.dtype);
      o.ptr = refs[k].ptr + (uint64_t)(off * (int64_t)es);
      o.ndim = 1, o.sizes = &run, o.strides = &one, o.contiguous = true;
      o.fp.lo = o.ptr, o.fp.hi = o.ptr + (uint64_t)run * es, o.fp.win = {};
      ptr_bits |= o.ptr;
      one_dtype &= o.dtype == out.dtype;
    }
    SubOp proto = proto0;
    if (one_dtype && (ptr_bits & 15) == 0) proto.flags |= kFlagVec;
    proto.out = ro.ptr;
    for (uint32_t k = 0; k < arity; ++k)
      if (!ri[k].is_const) proto.in[k] = ri[k].ptr;
    append_tiles(proto, (uint64_t)run, per, nullptr, 0, ro, ri, arity);
    for (int j = (int)m - 2; j >= 0 && ++idx[j] == refs[0].sizes[j]; --j) idx[j] = 0;  // next run (outer-first)
  }
  return true;
}

void Runtime::record_reduce(uint32_t op, const Operand& out, const TensorRef& out_ref, const Operand& x,
                            const TensorRef& x_ref, int64_t rows, int64_t cols) {
  if (rows <= 0) return;
  if (cols >= (int64_t(1) << 32))  // the worker indexes a row's 16-byte vectors with 32 bits
    throw std::invalid_argument("gpuos.submit_reduce: rows of " + std::to_string(cols) + " elements (2^32 or more) "
                                "are not supported; reduce such a tensor with torch directly.");
  SubOp proto{};
  proto.op = op;
  proto.flags = kFlagStrided;
  proto.dtype = out.dtype | (x.dtype << 8);
  const TensorRef refs[2] = {out_ref, x_ref};
  // One warp per row, rows of a tile processed in turn: about kTileElems elements per descriptor, 4x that for
  // reductions of 32 x kTileElems elements or more (still >= 8 descriptors each): recording 32 descriptors per
  // 128 x 1,024 reduction cost more host time than the GPU spent on them.
  const int64_t elems = rows * std::max<int64_t>(cols, 1);
  const int64_t tile_elems = elems >= 32 * (int64_t)kTileElems ? 4 * (int64_t)kTileElems : (int64_t)kTileElems;
  const uint64_t per_tile = (uint64_t)std::max<int64_t>(1, std::min<int64_t>(32, tile_elems / std::max<int64_t>(cols, 1)));
  append_tiles(proto, (uint64_t)rows, tile_units(per_tile, (uint64_t)rows, 1), refs, 2, out, &x, 1);
  st_.submitted++;
  maybe_publish_early();
}

void Runtime::record_matmul(const Operand& out, const TensorRef& out_ref, const Operand& a, const TensorRef& a_ref,
                            const Operand& b, const TensorRef& b_ref, const Operand* bias, const TensorRef* bias_ref,
                            int64_t M, int64_t N, int64_t K, float alpha, float beta, int32_t epilogue,
                            uint32_t product_dtype) {
  if (M <= 0 || N <= 0) return;
  if (N >= (int64_t(1) << 32))
    throw std::invalid_argument("gpuos.submit_matmul: " + std::to_string(N) + " output columns (2^32 or more) are "
                                "not supported; use torch.matmul for such a product.");
  SubOp proto{};
  proto.op = kOp_mm;
  proto.flags = kFlagStrided | (bias ? 0u : (kFlagConst0 << 2));
  const bool folded = epilogue >= 0 || epilogue == kMmCastOnly;
  if (folded) {  // sched/epilogue.cpp: an activation chain's program, or a cast
    if (epilogue > (int32_t)kMmEpiMask || product_dtype > kBF16)
      throw std::logic_error("gpuos internal error: matmul epilogue " + std::to_string(epilogue) + " / product dtype " +
                             std::to_string(product_dtype) + " out of range");
    proto.flags |= product_dtype << kMmEpiDtShift |
                   (epilogue >= 0 ? kFlagMmEpilogue | (uint32_t)epilogue << kMmEpiShift : kFlagMmCast);
  }
  proto.dtype = out.dtype | (a.dtype << 8) | (b.dtype << 16) | ((bias ? bias->dtype : out.dtype) << 24);
  proto.scalar[0] = alpha;
  proto.scalar[1] = beta;
  const TensorRef refs[4] = {out_ref, a_ref, b_ref, bias ? *bias_ref : TensorRef{}};
  Operand ins[3] = {a, b, Operand{}};
  if (bias) ins[2] = *bias;
  else ins[2].is_const = true;
  // (The product's dtype decides the path: a cast epilogue's out may be fp32 behind an fp16 product.)
  const uint32_t variant = matmul_variant(a.dtype, a_ref, b.dtype, b_ref, folded ? product_dtype : out.dtype, M, N, K);
  if (variant == kMmWarp) {
    // One warp per tile of columns: about 16K multiply-adds per row of a, in multiples of 4 columns (the vector
    // path's pass), so a K = 4,096 weight streams 4 columns (32 KB of fp16) per warp.
    const int64_t cols = std::min<int64_t>(256, std::max<int64_t>(4, (16384 / std::max<int64_t>(K, 1) + 3) / 4 * 4));
    append_tiles(proto, (uint64_t)N, (uint64_t)cols, refs, bias ? 4 : 3, out, ins, 3);
  } else {
    const int64_t tw = mm_cols(variant);
    const int64_t ntile = (N + tw - 1) / tw;
    const uint32_t warps = cfg_.threads_per_block / 32;
    MmCut cut = matmul_cut(ntile, K, M, variant, cfg_.capacity, tape_ ? cfg_.mm_items : cfg_.mm_items_live, warps,
                           burst_grid_ * warps, cfg_.local_combine);
    // The level's products so far share the grid with it (core/matmul_plan.h). Should append_tiles find the ring
    // full and flush first, the product was cut for the level it leaves: fewer slices, never more.
    if (cfg_.mm_spread) {
      const uint32_t level = staged_level(out, ins, 3);
      if (level_mm_.size() <= level) level_mm_.resize(level + 1);
      const uint64_t alone = cut.items;
      cut = level_cut(LevelProduct{cut.reserved, cut.items, M, N, K}, level_mm_[level], mm_spread());
      if (cut.items != alone) st_.mm_respread++;
    }
    proto.reserved = cut.reserved;
    append_tiles(proto, cut.items, 1, refs, bias ? 4 : 3, out, ins, 3);
  }
  st_.submitted++;
  maybe_publish_early();
}

bool Runtime::unsplit_mma(int64_t M, int64_t N, int64_t K, MmCut& cut) const {
  const uint32_t warps = cfg_.threads_per_block / 32;
  cut = matmul_cut((N + kMmMmaCols - 1) / kMmMmaCols, K, M, kMmMma, cfg_.capacity, cfg_.mm_items, warps,
                   burst_grid_ * warps, /*local=*/false);
  return ((cut.reserved >> 8) & 0xffu) == 1;
}

bool Runtime::record_matmul_dual(const Operand& out, const TensorRef& out_ref, const Operand& a, const TensorRef& a_ref,
                                 const Operand& b, const TensorRef& b_ref, const Operand& b2, const TensorRef& b2_ref,
                                 int64_t M, int64_t N, int64_t K, float alpha, int32_t epilogue,
                                 uint32_t product_dtype) {
  if (M <= 0 || N <= 0 || M > (int64_t)kMmDualMaxRows || epilogue < 0 || epilogue > (int32_t)kMmEpiMask ||
      b2.dtype != b.dtype || b2_ref.strides[0] != b_ref.strides[0])
    return false;
  // Both weights must take the tensor-core path, and the product must stay unsplit (the item holds a tile's
  // whole K: no partials of two products to meet in the scratch).
  MmCut cut;
  if (matmul_variant(a.dtype, a_ref, b.dtype, b_ref, product_dtype, M, N, K) != kMmMma ||
      matmul_variant(a.dtype, a_ref, b2.dtype, b2_ref, product_dtype, M, N, K) != kMmMma ||
      !unsplit_mma(M, N, K, cut))
    return false;
  SubOp proto{};
  proto.op = kOp_mm;
  proto.flags = kFlagStrided | kFlagMmEpilogue | kFlagMmDual | (uint32_t)epilogue << kMmEpiShift |
                product_dtype << kMmEpiDtShift;
  proto.dtype = out.dtype | (a.dtype << 8) | (b.dtype << 16) | (b2.dtype << 24);
  proto.scalar[0] = alpha;
  proto.scalar[1] = 0.0f;
  proto.reserved = cut.reserved;
  const TensorRef refs[4] = {out_ref, a_ref, b_ref, b2_ref};
  const Operand ins[3] = {a, b, b2};
  append_tiles(proto, cut.items, 1, refs, 4, out, ins, 3);
  st_.submitted++;
  maybe_publish_early();
  return true;
}

bool Runtime::record_matmul_prologue(const Operand& out, const TensorRef& out_ref, uint32_t a_dtype,
                                     const FusedArgs& fa, uint32_t prog, const Operand* reads, uint32_t nread,
                                     const Operand& b, const TensorRef& b_ref, int64_t M, int64_t N, int64_t K,
                                     float alpha) {
  if (M <= 0 || N <= 0 || K <= 0 || M * K > (int64_t)kMmPrologueElems || nread + 1 > kProgMaxInputs ||
      (a_dtype != kF16 && a_dtype != kBF16) || fa.opnd[0].stride != 1 || fa.opnd[0].div != 1 || fa.opnd[0].mod != 0)
    return false;
  // a as the worker holds it: M x K contiguous in a 16-byte aligned shared buffer.
  TensorRef a_ref{};
  a_ref.ndim = 2, a_ref.dtype = a_dtype, a_ref.sizes[0] = M, a_ref.sizes[1] = K, a_ref.strides[0] = K;
  a_ref.strides[1] = 1;
  MmCut cut;
  if (matmul_variant(a_dtype, a_ref, b.dtype, b_ref, out.dtype, M, N, K) != kMmMma ||
      !unsplit_mma(M, N, K, cut))
    return false;
  SubOp proto{};
  proto.op = kOp_mm;
  proto.flags = kFlagStrided | kFlagMmPrologue;
  proto.dtype = out.dtype | (a_dtype << 8) | (b.dtype << 16) | (out.dtype << 24);
  proto.scalar[0] = alpha;
  std::memcpy(&proto.scalar[1], &prog, sizeof(float));
  proto.reserved = cut.reserved;
  TensorRef refs[4];
  static_assert(sizeof(FusedArgs) == 2 * sizeof(TensorRef), "a FusedArgs spans two slots");
  refs[0] = out_ref;
  std::memcpy((void*)&refs[1], (const void*)&fa, sizeof(FusedArgs));
  refs[3] = b_ref;
  Operand ins[kProgMaxInputs];
  for (uint32_t k = 0; k < nread; ++k) ins[k] = reads[k];
  ins[nread] = b;
  append_tiles(proto, cut.items, 1, refs, 4, out, ins, nread + 1);
  st_.submitted++;
  maybe_publish_early();
  return true;
}

// KV splits of decode attention (device_src/attention.h): enough items to cover the grid (about kAttnItems over
// the tiles), each split at least min_rows kv positions (Config::attn_min_rows: below that the combine costs more
// than it saves), at most kAttnMaxSplit; the items of a split tile stay in one piece of append_tiles (consecutive
// in the ring).
uint32_t attention_split(int64_t tiles, int64_t Lk, uint32_t capacity, uint32_t min_rows, uint32_t max_split) {
  constexpr int64_t kAttnItems = 1024;
  int64_t ns = std::min<int64_t>({(kAttnItems + tiles - 1) / std::max<int64_t>(tiles, 1),
                                  Lk / std::max<int64_t>(min_rows, 1),
                                  (int64_t)std::min<uint32_t>(max_split, kAttnMaxSplit)});
  if (ns <= 1 || tiles * ns > (int64_t)capacity / 2) return 1;
  const int64_t span = (Lk + ns - 1) / ns;
  return (uint32_t)((Lk + span - 1) / span);  // no empty slice
}

// While a program is captured, KV splits are at most this many kv positions long (fewer when GPUOS_ATTN_MIN_ROWS
// says so): a replayed decode step runs one attention per level, latency-bound -- a warp walks its split one
// round trip per step of a few kv rows -- and the host's cost per item is paid once, at the capture. H200,
// bench_attention gpuos_program_chain (Llama shape, KV 128): 30.5 us per attention with 64-row splits, 18.6 with
// 16 (nineteenth session). A live flush keeps Config::attn_min_rows: there each item costs host time (~30 ns) and
// many attentions of one flush fill the grid anyway (64 of them: 3.2 us per attention at 64 rows, 5.0 at 16).
constexpr uint32_t kCaptureAttnMinRows = 16;
// ... and a captured attention whose kv range a block's warps cover in splits of at most this many positions
// takes one split per warp at most, in tile-major order (Config::local_combine): a claim of one descriptor per warp
// then holds whole tiles, combined in the block's shared memory (attention.h attn_local_combine) instead of
// through global partials, a counter and fences. Longer ranges keep more, shorter splits (global combine).
constexpr uint32_t kCaptureLocalRows = 32;

void Runtime::record_attention(const Operand& out, AttnArgs args, const Operand& q, const TensorRef& q_ref,
                               const Operand& k, const TensorRef& k_ref, const Operand& v, const TensorRef& v_ref,
                               const Operand* mask, float scale) {
  const int64_t rows = kAttnRowsPerItem, nrows = (int64_t)(args.Hq / args.Hkv) * args.Lq;
  const int64_t tiles = (int64_t)args.B * args.Hkv * ((nrows + rows - 1) / rows);
  if (tiles == 0 || args.D == 0) return;
  if (args.Lk == 0 || args.Lq > kAttnMaxQuery || args.Hkv == 0 || args.Hq % args.Hkv != 0)
    throw std::logic_error("gpuos internal error: record_attention got a shape the checks refuse");
  const uint32_t min_rows = tape_ ? std::min(cfg_.attn_min_rows, kCaptureAttnMinRows) : cfg_.attn_min_rows;
  const uint32_t nwarps = cfg_.threads_per_block / 32;
  const bool local = tape_ && cfg_.local_combine && (int64_t)nwarps * kCaptureLocalRows >= (int64_t)args.Lk;
  args.nsplit = attention_split(tiles, args.Lk, cfg_.capacity, min_rows, local ? nwarps : kAttnMaxSplit);
  if (local && args.nsplit > 1) args.mode |= kAttnTileMajor;
  SubOp proto{};
  proto.op = kOp_sdpa;
  proto.flags = kFlagStrided;
  proto.dtype = out.dtype | (q.dtype << 8) | (k.dtype << 16) | (v.dtype << 24);
  proto.scalar[0] = scale;
  TensorRef refs[4];
  static_assert(sizeof(AttnArgs) == sizeof(TensorRef), "one arena slot");
  std::memcpy((void*)&refs[0], (const void*)&args, sizeof(AttnArgs));
  refs[1] = q_ref, refs[2] = k_ref, refs[3] = v_ref;
  const Operand ins[4] = {q, k, v, mask ? *mask : Operand{}};
  append_tiles(proto, (uint64_t)(tiles * args.nsplit), 1, refs, 4, out, ins, mask ? 4 : 3);
  st_.submitted++;
  maybe_publish_early();
}

void Runtime::record_data(SubOp proto, const TensorRef* refs, uint32_t nref, const Operand& out, const Operand* reads,
                          uint32_t nread, uint64_t total, uint64_t per_tile) {
  if (total == 0) return;
  proto.flags |= kFlagStrided;
  // Element-tiled data ops spread like elementwise ones while capturing (argmax's tiles are rows).
  append_tiles(proto, total, tile_units(per_tile, total, per_tile == kTileElems ? 128 : 1),
               refs, nref, out, reads, nread);
  st_.submitted++;
  maybe_publish_early();
}

int32_t Runtime::program_id(const Program& p) {
  const int32_t id = intern_program(p);  // process-wide ids: a generation's tier-2 code names them
  if (id < 0) {  // the table is full (nothing is evicted: ids are named by generated code): the chain runs unfused
    st_.fusion_table_full++;
    return -1;
  }
  if (prog_uploaded_.size() <= (size_t)id) prog_uploaded_.resize((size_t)id + 1, 0);
  if (prog_uploaded_[(size_t)id]) return id;
  // Uploaded by the next publication, on its stream before its first ready word (publish.cpp): the worker opens
  // batches in sequence order, so every batch that can name this program opens after the copy is complete.
  // (A synchronous upload on a stream of its own waited here, with the runtime lock held, for a copy that the
  // GPU may queue behind the resident worker: it timed out on an H100 in the soak.)
  progs_h_[id] = p;
  prog_uploaded_[(size_t)id] = 1;
  prog_unsent_.push_back(id);
  st_.programs++;
  return id;
}

void Runtime::record_fused(uint32_t prog, const FusedArgs& fa, const Operand& out, const Operand* ins, uint32_t nin,
                           int64_t numel, int64_t cols) {
  if (numel <= 0) return;
  if (cols < 0 || cols >= (int64_t(1) << 32) || (cols > 0 && numel % cols != 0))
    throw std::logic_error("gpuos internal error: a row program's row length does not divide its elements");
  SubOp proto{};
  proto.op = kOpFused;
  proto.flags = kFlagFused;
  proto.in[0] = prog;
  proto.dtype = out.dtype;
  proto.reserved = (uint32_t)cols;
  TensorRef slots[2];
  std::memcpy((void*)slots, (const void*)&fa, sizeof(FusedArgs));
  // One warp interprets a tile: kTileElems elements, a row program's tile whole rows (about kTileElems elements);
  // spread while capturing (tile_units: a 1,024-element chain of 32 instructions took 140 us in one warp).
  uint64_t per_tile = tile_units(kTileElems, (uint64_t)numel, 128);
  if (cols > 0) {
    const uint64_t rows = (uint64_t)(numel / cols);
    per_tile = tile_units(std::max<uint64_t>(1, kTileElems / (uint64_t)cols), rows, 1) * (uint64_t)cols;
  }
  append_tiles(proto, (uint64_t)numel, per_tile, slots, 2, out, ins, nin);
  st_.submitted++;
  st_.fused_subops++;
  maybe_publish_early();
}

}  // namespace gpuos
