// csrc/inject/whole.h -- the background whole build. A generation is linked (issue #18: seconds, from cached
// relocatable objects), but code in a relocatable object runs slower: ptxas never inlines the item functions into
// the worker's dispatch there, which it does in a whole-program compile (W7 on an H200, thirty-third session: a
// replayed decode step 8-9 % faster whole). So once a linked generation is ready (generation 0, an op change, tier-2
// code), the same generation (same header: ops, slots, tier-2 code) is compiled whole by a helper process, and when
// the helper is done and that generation is still the newest, the whole image becomes the next generation, adopted
// like any other. The image stays in the JIT disk cache: a later generation with the same header (the next
// process's generation 0 above all) is built from it at once, whole, with no link and no helper
// (inject/linked.cpp build_generation_image).
//
// A helper process, not a thread: NVRTC holds the JIT's lock for a whole compile (tens of seconds), and a compile
// cannot be interrupted; a helper is killed when a newer generation supersedes its source or at exit -- except the
// base image's (generation 0's: the embedded sources as they are, every later process's generation 0 on this
// machine), which finishes into the cache while the newer request waits its turn. The
// helper writes its image into the JIT's disk cache (the same key as jit_compile_sources), which this process
// then reads; without a cache dir there is no whole build (whole_build_info() says why). The helper is
// `python -c ...` (gpuos_ext sets the command at import): it imports the extension and calls
// _compile_whole_image(arch, header file).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gpuos {

struct WholeBuildInfo {
  bool enabled = true;       // GPUOS_WHOLE_BUILD (default 1) or set_whole_build
  bool running = false;      // a build is in progress (a helper compiling, or its image being published)
  uint32_t source = 0;       // the generation of the running or last build
  int64_t helper_pid = 0;    // the running helper process (0: none)
  bool base = false;         // the running or last build is the base image (generation 0's sources)
  uint64_t requested = 0;    // linked generations that asked for one
  uint64_t helpers = 0;      // helper processes started (a build whose image the cache held needs none)
  uint64_t published = 0;    // whole generations made
  uint64_t superseded = 0;   // builds dropped: a newer generation came first (a running helper is killed)
  uint64_t failed = 0;       // builds that failed (last_error says why; the linked generation stays)
  double last_s = 0.0;       // seconds of the last finished build
  std::string last_error;
  std::string command;       // the helper's argv joined ("" until gpuos_ext sets it)
};

// The helper's argv before "<arch> <header file> <parent pid>" (set once at import).
void set_whole_build_command(const std::vector<std::string>& argv);
void set_whole_build(bool on);  // later requests only; a running build finishes (or is superseded)
bool whole_build_enabled();     // also decides whether a generation is taken whole from the cache (linked.cpp)
// Called when linked generation `gen` is ready (the compile thread; generation_image for generation 0): build it
// whole (a newer request replaces an older one; the older helper is killed unless it builds the base image).
void request_whole_build(uint32_t gen);
// Wait until no build is queued or running, at most timeout_s seconds. Returns whether that happened.
bool wait_whole_builds(double timeout_s);
WholeBuildInfo whole_build_info();
// At exit (shutdown_generations): kill a running helper and stop the thread.
void shutdown_whole_builds();
// The helper's work (gpuos_ext._compile_whole_image): `header` compiled whole for `arch` into the JIT cache. Helpers
// of every process on the machine that build the same header take turns (a lock file in the cache dir), and a
// later one finds the image cached and compiles nothing: processes started together on a machine without the
// base image run one compile, not one each. Returns whether this call ran NVRTC.
bool compile_whole_image(const std::string& arch, const std::string& header);

}  // namespace gpuos
