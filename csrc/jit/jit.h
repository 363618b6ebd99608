// csrc/jit/jit.h -- NVRTC compilation of the embedded device sources, with a memory + disk cache.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gpuos {

struct JitStats {
  uint64_t compiles = 0;    // NVRTC runs (whole images and relocatable objects)
  uint64_t object_compiles = 0;  // of which relocatable objects (linked generations, jit/link.h)
  uint64_t cache_hits = 0;  // memory or disk hits
  uint64_t disk_hits = 0;
  uint64_t evictions = 0;   // disk cache files removed to keep it under GPUOS_CACHE_MAX_MB (least recently used)
};

// The device_src/ files embedded at build time: path -> text.
const std::map<std::string, std::string>& embedded_sources();

// Image (cubin, or PTX for archs newer than NVRTC knows) of the worker module for compute capability
// major.minor, or for an explicit arch string ("sm_90"). Cached by hash(sources, options, arch, NVRTC
// version, package version). Throws CompileError / CudaError.
std::string jit_worker_image(int cc_major, int cc_minor);
std::string jit_compile_arch(const std::string& arch);
// The NVRTC arch the worker is compiled for on a GPU of compute capability major.minor: "sm_XY", or
// "compute_XY" (PTX) when the GPU is newer than this NVRTC knows. Throws CudaError.
std::string jit_arch_for(int cc_major, int cc_minor);

// Device sources replacing or adding embedded files for one compile (path -> text), e.g. a generation's
// generated "device_src/user_ops.h" (inject/registry.cpp). The cache key covers them.
using SourceOverrides = std::map<std::string, std::string>;
// Compile `main` (an embedded path or one of `overrides`) with the embedded sources, `overrides` replacing or
// adding files. Same cache (memory + disk) and forbid-compile switch as jit_compile_arch.
// relocatable: a linkable object (-rdc=true and the worker's register cap, see relocatable_options) for
// jit/link.h instead of a loadable image; its own cache key and file name ("<stem>-<arch>-<key>.o.cubin").
std::string jit_compile_sources(const std::string& arch, const SourceOverrides& overrides,
                                const std::string& main = "device_src/worker.cu", bool relocatable = false);

// The image jit_compile_sources(arch, overrides, main) would return if the memory or disk cache holds it; "" when
// neither does (never compiles). The background whole build (inject/whole.h) reads a helper process's compile so.
std::string jit_cached_sources(const std::string& arch, const SourceOverrides& overrides,
                               const std::string& main = "device_src/worker.cu");

// "compute_<newest arch this NVRTC knows>": PTX-only checks of device code when no GPU names an arch.
std::string jit_newest_virtual_arch();

JitStats jit_stats();
// A whole file into `out` (false when it cannot be read or is empty); a file written through a temp file in the
// same dir and a rename, so a reader never sees a partial one (false on any failure).
bool read_file(const std::string& path, std::string& out);
bool write_file_atomic(const std::string& path, const std::string& data);
std::string jit_cache_dir();  // "" when disabled

// Stable 64-bit FNV-1a (never std::hash: not stable across builds).
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

}  // namespace gpuos
