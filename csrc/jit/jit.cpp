// csrc/jit/jit.cpp -- NVRTC compile of the worker module; memory + disk cache; the "forbid compile" switch.
#include "jit/jit.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "config/config.h"
#include "device_src/config.h"
#include "driver/cuda_api.h"
#include "generated/embedded_sources.h"  // kEmbeddedSources[], kEmbeddedCount (setup.py)

#ifndef GPUOS_VERSION
#define GPUOS_VERSION "dev"
#endif

namespace gpuos {
namespace {

constexpr const char* kMainSource = "device_src/worker.cu";

std::shared_mutex g_mem_mu;
std::unordered_map<std::string, std::string> g_mem_cache;  // key -> image
std::mutex g_stats_mu;
JitStats g_stats;

// File helpers use stdio, not iostreams (see shape_str in tensor/describe.cpp for why).
void mkdirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos)
    if (pos == path.size() || path[pos] == '/') ::mkdir(path.substr(0, pos).c_str(), 0755);
}

void warn_once(const std::string& msg) {
  static bool warned = false;
  if (!warned) {
    warned = true;
    std::fprintf(stderr, "[gpuos] warning: %s\n", msg.c_str());
  }
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

std::vector<std::string> compile_options(const std::string& arch, bool relocatable) {
  std::vector<std::string> o{"--gpu-architecture=" + arch, "-std=c++17", "--device-as-default-execution-space",
                             "-Xptxas", "-O" + std::to_string(env_config().ptxas_opt)};
  // GPUOS_TRACE: the worker also records every sub-op (device_src/worker.cu kTraceSubops); a build of its own, so
  // that the untraced worker carries none of it (the records' timestamps cost spills in the dispatch).
  if (env_config().trace_records) o.push_back("-DGPUOS_TRACE_SUBOPS=1");
  // GPUOS_FAST_COMPILE: the fast-compile mode for the whole images, ptxas's alone by default (ptxas-min), or NVRTC's
  // (NVVM and ptxas). sm_90, 2 cores: the base image 39.8 s without it, 13.1 s with ptxas's min, 5.9 s with NVRTC's
  // min (NVVM then unrolls less: 245 global loads in the SASS against 340). On an H200 (thirty-sixth session, one
  // call) W7's steps were as fast with ptxas-min as without (Llama-small 447 / 458 us, GPT-2-small 382 / 381) and
  // tier 2 settled 3x sooner (31 / 103 s, 21 / 65 s); DEVELOPING *The background whole build*. Relocatable
  // objects keep the full ptxas: NVVM is most of their time.
  const std::string& fast = env_config().fast_compile;
  if (!fast.empty() && !relocatable) {
    const bool ptxas = fast.rfind("ptxas-", 0) == 0;
    const std::string level = ptxas ? fast.substr(6) : fast;
    if (level != "min" && level != "mid")
      throw std::invalid_argument("gpuos: GPUOS_FAST_COMPILE='" + fast + "' is not a fast-compile level: set it to "
                                  "min or mid (NVRTC's), ptxas-min or ptxas-mid (ptxas's alone), or 0 (off)");
    if (ptxas) o.push_back("-Xptxas");
    o.push_back("--Ofast-compile=" + level);
  }
  if (relocatable) {
    // Separately compiled device functions do not inherit the worker's __launch_bounds__ register cap, and
    // nvJitLink refuses callees above the kernel's cap (tools/link_probe.py): give every object that cap.
    o.push_back("-rdc=true");
    // (255 is ptxas's most: one block per SM would allow 256.)
    const uint32_t cap = std::min<uint32_t>(255u, 65536u / (kMaxThreads * kWorkerBlocksPerSm));
    o.push_back("--maxrregcount=" + std::to_string(cap));
  }
  return o;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// NVRTC run of `main` over the source set `srcs` (path -> text). Returns the image; throws CompileError with
// log, arch, options and a dumped source path.
std::string nvrtc_compile(const std::string& arch, const std::vector<std::string>& opts, uint64_t key,
                          const std::map<std::string, std::string>& srcs, const std::string& main) {
  if (env_config().forbid_compile)
    throw CompileError("gpuos: an NVRTC compile of " + main + " for " + arch +
                           " was requested but GPUOS_FORBID_COMPILE=1 forbids compiling (cache miss; key " +
                           hex64(key) + ", cache dir '" + jit_cache_dir() +
                           "'). Unset GPUOS_FORBID_COMPILE or warm the cache first.",
                       "", arch, join(opts), "");
  const Nvrtc& nv = nvrtc();
  std::vector<const char*> hdr_names, hdr_texts;
  for (auto& kv : srcs) {
    if (kv.first == main) continue;
    hdr_names.push_back(kv.first.c_str());
    hdr_texts.push_back(kv.second.c_str());
  }
  const std::string& main_src = srcs.at(main);
  nvrtcProgram prog = nullptr;
  int r = nv.nvrtcCreateProgram(&prog, main_src.c_str(), main.c_str(), (int)hdr_names.size(), hdr_texts.data(),
                                hdr_names.data());
  if (r != 0) throw CudaError(std::string("nvrtcCreateProgram failed: ") + nv.nvrtcGetErrorString(r));
  struct ProgGuard {  // destroy the program on every path (the jiterator leak is the counter-example)
    const Nvrtc& nv;
    nvrtcProgram& p;
    ~ProgGuard() { if (p) nv.nvrtcDestroyProgram(&p); }
  } guard{nv, prog};
  std::vector<const char*> copts;
  for (auto& o : opts) copts.push_back(o.c_str());
  r = nv.nvrtcCompileProgram(prog, (int)copts.size(), copts.data());
  size_t log_size = 0;
  nv.nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 1) nv.nvrtcGetProgramLog(prog, &log[0]);
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  if (r != 0) {
    std::string dir = jit_cache_dir();
    if (dir.empty()) dir = "/tmp";
    std::string dump_dir = dir + "/failed";
    mkdirs(dump_dir);
    std::string stem = main.substr(main.rfind('/') + 1);
    stem = stem.substr(0, stem.rfind('.'));
    std::string dump = dump_dir + "/" + stem + "-" + arch + "-" + hex64(key) + ".cu";
    std::string bundle;
    for (auto& kv : srcs) bundle += "// ==== " + kv.first + "\n" + kv.second + "\n";
    if (!write_file_atomic(dump, bundle)) dump = "(could not write " + dump + ")";
    throw CompileError("NVRTC failed to compile " + main + " for " + arch + ": " +
                           nv.nvrtcGetErrorString(r) + "\noptions: " + join(opts) + "\nsource: " + dump +
                           "\nlog:\n" + log,
                       log, arch, join(opts), dump);
  }
  std::string image;
  size_t n = 0;
  if (arch.rfind("sm_", 0) == 0) {
    nv.nvrtcGetCUBINSize(prog, &n);
    image.resize(n);
    nv.nvrtcGetCUBIN(prog, &image[0]);
  } else {
    nv.nvrtcGetPTXSize(prog, &n);
    image.resize(n);
    nv.nvrtcGetPTX(prog, &image[0]);
  }
  std::lock_guard<std::mutex> lk(g_stats_mu);
  g_stats.compiles++;
  return image;
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

const std::map<std::string, std::string>& embedded_sources() {
  static const std::map<std::string, std::string> m = [] {
    std::map<std::string, std::string> r;
    for (size_t i = 0; i < kEmbeddedCount; ++i) r[kEmbeddedSources[i].path] = kEmbeddedSources[i].text;
    return r;
  }();
  return m;
}

bool read_file(const std::string& path, std::string& out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  out.clear();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return !out.empty();
}

bool write_file_atomic(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

std::string jit_cache_dir() {
  return env_config().cache_dir;
}

std::string jit_compile_arch(const std::string& arch) { return jit_compile_sources(arch, {}, kMainSource); }

namespace {
// The disk cache's bound (GPUOS_CACHE_MAX_MB; 0: none). After a write that takes `dir` over it, the least recently
// used files go -- oldest modification time first; a disk hit refreshes its file's -- until the directory holds at
// most 90 % of the bound. Never `keep` (the file just written), a whole build's job file (whole-<pid>-*: a helper
// may be reading it; lock files whole-lock-* may go) or another process's temporary file (*.tmp.<pid>, being
// written). A file another process still reads stays readable until it closes it; a file removed here is a miss
// later (a compile), never a wrong image.
void trim_cache(const std::string& dir, const std::string& keep) {
  const uint64_t max = (uint64_t)env_config().cache_max_mb << 20;
  DIR* d = max ? ::opendir(dir.c_str()) : nullptr;
  if (!d) return;
  struct Entry {
    std::string path;
    uint64_t size;
    struct timespec mtime;
  };
  auto evictable = [&](const std::string& name, const std::string& path) {
    const bool job = name.rfind("whole-", 0) == 0 && name.rfind("whole-lock-", 0) != 0;
    return path != keep && !job && name.find(".tmp.") == std::string::npos;
  };
  std::vector<Entry> files;
  uint64_t total = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name, path = dir + "/" + name;
    struct stat st;
    if (name == "." || name == ".." || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    total += (uint64_t)st.st_size;
    if (evictable(name, path)) files.push_back({path, (uint64_t)st.st_size, st.st_mtim});
  }
  ::closedir(d);
  if (total <= max) return;
  std::sort(files.begin(), files.end(), [](const Entry& a, const Entry& b) {
    return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec : a.mtime.tv_nsec < b.mtime.tv_nsec;
  });
  uint64_t removed = 0;
  for (const Entry& f : files) {
    if (total <= max / 10 * 9) break;
    if (std::remove(f.path.c_str()) == 0) {
      total -= f.size;
      ++removed;
    }
  }
  std::lock_guard<std::mutex> sl(g_stats_mu);
  g_stats.evictions += removed;
}

// jit_compile_sources, or with compile=false jit_cached_sources ("" on a miss).
std::string compile_or_lookup(const std::string& arch, const SourceOverrides& overrides, const std::string& main,
                              bool relocatable, bool compile) {
  const Nvrtc& nv = nvrtc();
  int vmaj = 0, vmin = 0;
  nv.nvrtcVersion(&vmaj, &vmin);
  const auto opts = compile_options(arch, relocatable);
  std::map<std::string, std::string> owned;  // the effective source set when files are overridden
  if (!overrides.empty()) {
    owned = embedded_sources();
    for (auto& kv : overrides) owned[kv.first] = kv.second;
  }
  const std::map<std::string, std::string>& srcs = overrides.empty() ? embedded_sources() : owned;
  if (!srcs.count(main)) throw std::invalid_argument("gpuos jit: no device source named '" + main + "'");
  // Key: every source of the compile (path + text, overrides applied), main file, options, arch, NVRTC
  // version, package version.
  uint64_t h = fnv1a64("gpuos-jit-v1", 12);
  for (auto& kv : srcs) {
    h = fnv1a64(kv.first.data(), kv.first.size() + 1, h);
    h = fnv1a64(kv.second.data(), kv.second.size() + 1, h);
  }
  std::string meta = join(opts) + "|" + arch + "|nvrtc" + std::to_string(vmaj) + "." + std::to_string(vmin) +
                     "|" + GPUOS_VERSION;
  if (main != kMainSource) meta += "|main=" + main;
  h = fnv1a64(meta.data(), meta.size(), h);
  const std::string key = hex64(h);
  {
    std::shared_lock<std::shared_mutex> lk(g_mem_mu);
    auto it = g_mem_cache.find(key);
    if (it != g_mem_cache.end()) {
      std::lock_guard<std::mutex> sl(g_stats_mu);
      g_stats.cache_hits++;
      return it->second;
    }
  }
  std::unique_lock<std::shared_mutex> lk(g_mem_mu);
  auto it = g_mem_cache.find(key);  // re-check: another thread may have compiled it meanwhile
  if (it != g_mem_cache.end()) {
    std::lock_guard<std::mutex> sl(g_stats_mu);
    g_stats.cache_hits++;
    return it->second;
  }
  const std::string dir = jit_cache_dir();
  std::string stem = main.substr(main.rfind('/') + 1);
  stem = stem.substr(0, stem.rfind('.'));
  const std::string file =
      dir.empty() ? "" : dir + "/" + stem + "-" + arch + "-" + key + (relocatable ? ".o" : "") + (arch[0] == 's' ? ".cubin" : ".ptx");
  std::string image;
  if (!file.empty() && read_file(file, image)) {
    ::utimensat(AT_FDCWD, file.c_str(), nullptr, 0);  // recently used: the last to go when the cache is trimmed
    std::lock_guard<std::mutex> sl(g_stats_mu);
    g_stats.cache_hits++;
    g_stats.disk_hits++;
  } else if (!compile) {
    return std::string();
  } else {
    image = nvrtc_compile(arch, opts, h, srcs, main);
    if (relocatable) {
      std::lock_guard<std::mutex> sl(g_stats_mu);
      g_stats.object_compiles++;
    }
    if (!file.empty()) {
      mkdirs(dir);
      if (!write_file_atomic(file, image))
        warn_once("JIT cache dir '" + dir + "' is not writable; compiled kernels will not be cached on disk "
                  "(set GPUOS_CACHE_DIR to a writable directory or GPUOS_DISABLE_CACHE=1)");
      else
        trim_cache(dir, file);
    }
  }
  g_mem_cache[key] = image;
  return image;
}
}  // namespace

std::string jit_compile_sources(const std::string& arch, const SourceOverrides& overrides, const std::string& main,
                                bool relocatable) {
  return compile_or_lookup(arch, overrides, main, relocatable, true);
}

std::string jit_cached_sources(const std::string& arch, const SourceOverrides& overrides, const std::string& main) {
  return compile_or_lookup(arch, overrides, main, false, false);
}

std::string jit_worker_image(int cc_major, int cc_minor) { return jit_compile_arch(jit_arch_for(cc_major, cc_minor)); }

// The real archs this NVRTC can compile for (52, 60, ..., 90, ...).
static std::vector<int> nvrtc_archs() {
  const Nvrtc& nv = nvrtc();
  int n = 0;
  nv.nvrtcGetNumSupportedArchs(&n);
  std::vector<int> archs(std::max(n, 0));
  if (n > 0) nv.nvrtcGetSupportedArchs(archs.data());
  return archs;
}

std::string jit_arch_for(int cc_major, int cc_minor) {
  const Nvrtc& nv = nvrtc();
  const std::vector<int> archs = nvrtc_archs();
  const int want = cc_major * 10 + cc_minor;
  if (std::find(archs.begin(), archs.end(), want) != archs.end()) return "sm_" + std::to_string(want);
  // Newer than this NVRTC knows: PTX for the newest arch it supports; the driver JIT-compiles it.
  int best = 0;
  for (int a : archs)
    if (a <= want) best = std::max(best, a);
  if (best == 0)
    throw CudaError("NVRTC at " + nv.path + " supports no arch <= sm_" + std::to_string(want) +
                    "; install an NVRTC that matches this GPU (pip install nvidia-cuda-nvrtc)");
  return "compute_" + std::to_string(best);
}

std::string jit_newest_virtual_arch() {
  const std::vector<int> archs = nvrtc_archs();
  if (archs.empty()) throw CudaError("NVRTC at " + nvrtc().path + " reports no supported GPU architecture");
  return "compute_" + std::to_string(*std::max_element(archs.begin(), archs.end()));
}

JitStats jit_stats() {
  std::lock_guard<std::mutex> lk(g_stats_mu);
  return g_stats;
}

}  // namespace gpuos
