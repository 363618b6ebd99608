// csrc/jit/link.h -- linked generations (issue #18): relocatable objects linked with nvJitLink into one image.
// A generation is still one module (DESIGN F2): the cached worker object plus the small objects of its injected
// ops and tier-2 programs, linked. When nvJitLink is missing, too old, switched off (GPUOS_LINK=0) or the arch
// is PTX-only, every generation is a whole NVRTC compile as before (link_mode() says which and why).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpuos {

struct LinkMode {
  bool linked = false;  // generations link objects (false: whole NVRTC compiles)
  std::string reason;   // why not (or "" when linked)
  std::string library;  // the libnvJitLink that is used ("" when none)
  std::string version;  // its version "13.0"
};
// The mode for new generations: the GPUOS_LINK setting (or set_link_override), then nvJitLink loaded and at least
// as new as NVRTC. Never throws.
LinkMode link_mode();
// Whether a generation for `arch` links: link_mode().linked and a real arch ("sm_XY"; "compute_XY" PTX images of
// GPUs newer than this NVRTC are whole compiles).
bool link_for_arch(const std::string& arch);
// -1: follow GPUOS_LINK (default); 0: whole compiles; 1: link when nvJitLink is usable. For benchmarks and tests
// that compare the two layouts in one process; applies to generations built after the call.
void set_link_override(int v);

// nvJitLink of relocatable objects (jit_compile_sources(..., relocatable=true)) into a loadable cubin for `arch`.
// Throws CompileError with nvJitLink's log when the link fails, CudaError when nvJitLink is unusable.
std::string jit_link(const std::string& arch, const std::vector<std::shared_ptr<const std::string>>& objects);

struct LinkStats {
  uint64_t links = 0;
  double link_s = 0.0;  // total seconds in nvJitLink
};
LinkStats link_stats();

}  // namespace gpuos
