// csrc/inject/linked.h -- a generation's image: linked (issue #18: the worker object compiled once, plus one small
// object per op slot and tier-2 program, each cached by its own key, plus the dispatch object), the image of an
// earlier whole build of the same generation found in the JIT cache (whole builds on: inject/whole.h), or a whole
// NVRTC compile (no usable nvJitLink, GPUOS_LINK=0, PTX-only arch, or a failed link: the reason is kept).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "inject/codegen.h"

namespace gpuos {

// How a generation's image was built (generation_info()'s "built").
enum class GenBuild { kLinked, kWhole, kCachedWhole };
const char* gen_build_name(GenBuild b);  // "linked", "whole", "cached whole"

// Image of the generation {specs, fused} for `arch`. `header` is its generated user_ops.h (the whole compile; ""
// for generation 0). Throws CompileError (an op's source, or a whole compile) / CudaError. *how (if given): how
// it was built.
std::string build_generation_image(const std::string& arch, const std::vector<OpSpec>& specs,
                                   const std::map<uint32_t, std::string>& fused, const std::string& header,
                                   GenBuild* how = nullptr);
// The relocatable object of one op slot for `arch` (memory + disk cache). Throws CompileError with NVRTC's log
// (user lines numbered from 1 of "gpuos_user:<name>").
std::shared_ptr<const std::string> op_object(const std::string& arch, const OpSpec& s);
// The worker object for `arch`: device_src/worker.cu with device_src/linked.h as its user_ops.h.
std::shared_ptr<const std::string> worker_object(const std::string& arch);

struct LinkedGenStats {
  uint64_t linked = 0;     // generations built by linking
  uint64_t whole = 0;      // generations built by a whole compile
  uint64_t cached_whole = 0;  // generations whose whole image an earlier whole build left in the cache
  std::string last_fallback;  // why the last whole compile was not a link ("" if none)
};
LinkedGenStats linked_gen_stats();

}  // namespace gpuos
