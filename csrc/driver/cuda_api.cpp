// csrc/driver/cuda_api.cpp -- run-time loading of libcuda and libnvrtc.
#include "driver/cuda_api.h"
#include "driver/wait.h"

#include <dirent.h>
#include <dlfcn.h>

#include <mutex>

#include "config/config.h"

namespace gpuos {
namespace {

std::vector<std::string>& nvrtc_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
std::mutex g_load_mu;

// libnvrtc dlopens libnvrtc-builtins by soname; when NVRTC comes from a wheel its directory is not on the
// loader path, so load the builtins that sit beside it first (the soname then resolves to this copy).
void preload_builtins_beside(const std::string& lib_path) {
  const auto slash = lib_path.find_last_of('/');
  if (slash == std::string::npos) return;
  const std::string dir = lib_path.substr(0, slash);
  DIR* dp = opendir(dir.c_str());
  if (!dp) return;
  while (dirent* e = readdir(dp)) {
    const std::string n = e->d_name;
    if (n.rfind("libnvrtc-builtins.so.", 0) == 0 && n.find(".alt.") == std::string::npos)
      dlopen((dir + "/" + n).c_str(), RTLD_NOW | RTLD_GLOBAL);
  }
  closedir(dp);
}

}  // namespace

void throw_cuda(CUresult r, const char* call, const char* file, int line) {
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "";
  const Driver& d = driver();
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
  std::string where = std::string(file);
  auto slash = where.find_last_of('/');
  if (slash != std::string::npos) where = where.substr(slash + 1);
  std::string msg = std::string(call) + " failed: " + name + " (" + std::to_string(r) + "): " + text + " [" +
                    where + ":" + std::to_string(line) + "]";
  if (is_sticky(r))
    msg += ". The CUDA context is lost: a kernel faulted (when it was the GPUOS worker, one of the ops it ran -- "
           "an injected op's trap or out-of-bounds access -- caused it). Every later CUDA call in this process "
           "fails; restart the process.";
  throw CudaError(msg);
}

bool is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
      return true;
    default:
      return false;
  }
}

const Driver& driver() {
  static Driver d;
  static std::string error;
  static bool done = false;
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (!done) {
    done = true;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      error = std::string("the NVIDIA driver library libcuda.so.1 could not be loaded (") + dlerror() +
              "): this machine has no usable NVIDIA GPU driver, so GPUOS cannot run GPU work here";
    } else {
      std::string missing;
#define GPUOS_LOAD(name, sym, type)                  \
  d.name = reinterpret_cast<type>(dlsym(lib, sym)); \
  if (!d.name) missing += std::string(" ") + sym;
      GPUOS_DRIVER_FNS(GPUOS_LOAD)
#undef GPUOS_LOAD
      if (!missing.empty()) {
        error = "libcuda.so.1 lacks entry points:" + missing + " (driver too old for CUDA 12 APIs)";
      } else {
        CUresult r = d.cuInit(0);
        if (r != CUDA_SUCCESS) {
          const char* name = "?";
          d.cuGetErrorName(r, &name);
          error = std::string("cuInit(0) failed: ") + name + ": no usable CUDA device on this machine";
        }
      }
    }
  }
  if (!error.empty()) throw CudaError(error);
  return d;
}

void set_nvrtc_search_dirs(std::vector<std::string> dirs) {
  std::lock_guard<std::mutex> lock(g_load_mu);
  nvrtc_dirs() = std::move(dirs);
}

// Where a CUDA library may be, in order: an explicit path (GPUOS_*_PATH; with explicit_only, nothing else),
// CUDA_HOME/lib64, the nvidia wheels' directories, the loader's search path.
static std::vector<std::string> library_candidates(const std::string& explicit_path, bool explicit_only,
                                                   std::initializer_list<const char*> names) {
  std::vector<std::string> c;
  if (!explicit_path.empty()) c.push_back(explicit_path);
  if (!explicit_path.empty() && explicit_only) return c;
  const std::string& home = env_config().cuda_home;
  if (!home.empty())
    for (const char* nm : names) c.push_back(home + "/lib64/" + nm);
  for (const auto& dir : nvrtc_dirs())
    for (const char* nm : names) c.push_back(dir + "/" + nm);
  for (const char* nm : names) c.push_back(nm);
  return c;
}

// dlopen the first candidate that loads (`before` runs ahead of each try); its path in `path`, the others in `tried`.
static void* open_first(const std::vector<std::string>& candidates, std::string& path, std::string& tried,
                        void (*before)(const std::string&)) {
  for (const auto& c : candidates) {
    if (before) before(c);
    if (void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      path = c;
      return lib;
    }
    tried += "\n  " + c;
  }
  return nullptr;
}

const Nvrtc& nvrtc() {
  static Nvrtc n;
  static std::string error;
  static bool done = false;
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (!done) {
    done = true;
    const EnvConfig& env = env_config();
    std::string tried;
    void* lib = open_first(library_candidates(env.nvrtc_path, false, {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}),
                           n.path, tried, preload_builtins_beside);
    if (!lib) {
      error = "NVRTC (libnvrtc) could not be loaded; tried:" + tried +
              "\nFix: pip install nvidia-cuda-nvrtc, set CUDA_HOME to a CUDA toolkit, or set GPUOS_NVRTC_PATH "
              "to libnvrtc.so";
    } else {
      std::string missing;
#define GPUOS_LOAD(name, sym, type)                  \
  n.name = reinterpret_cast<type>(dlsym(lib, sym)); \
  if (!n.name) missing += std::string(" ") + sym;
      GPUOS_NVRTC_FNS(GPUOS_LOAD)
#undef GPUOS_LOAD
      if (!missing.empty()) error = n.path + " lacks entry points:" + missing;
    }
  }
  if (!error.empty()) throw CudaError(error);
  return n;
}

const NvJitLinkLib& nvjitlink() {
  static NvJitLinkLib n;
  static bool done = false;
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (done) return n;
  done = true;
  std::string tried;
  void* lib = open_first(library_candidates(env_config().nvjitlink_path, true,  // an explicit path: nothing else
                                            {"libnvJitLink.so.13", "libnvJitLink.so.12", "libnvJitLink.so"}),
                         n.path, tried, nullptr);
  if (!lib) {
    n.error = "nvJitLink (libnvJitLink) could not be loaded; tried:" + tried +
              "\nFix: pip install nvidia-nvjitlink (the version of nvidia-cuda-nvrtc), set CUDA_HOME to a CUDA "
              "toolkit, or set GPUOS_NVJITLINK_PATH to libnvJitLink.so";
    return n;
  }
  using VersionFn = int (*)(unsigned*, unsigned*);
  if (auto ver = reinterpret_cast<VersionFn>(dlsym(lib, "nvJitLinkVersion"))) ver(&n.major, &n.minor);
  std::string missing;
  auto sym = [&](const std::string& name) -> void* {
    const std::string base = "__nvJitLink" + name + "_";
    for (const std::string& v : {std::to_string(n.major) + "_" + std::to_string(n.minor), std::to_string(n.major) + "_0"})
      if (void* p = n.major ? dlsym(lib, (base + v).c_str()) : nullptr) return p;
    return dlsym(lib, ("nvJitLink" + name).c_str());
  };
#define GPUOS_LOAD(name, type)                 \
  n.name = reinterpret_cast<type>(sym(#name)); \
  if (!n.name) missing += " nvJitLink" #name;
  GPUOS_NVJITLINK_FNS(GPUOS_LOAD)
#undef GPUOS_LOAD
  if (n.major == 0) missing += " nvJitLinkVersion";
  if (!missing.empty()) n.error = n.path + " lacks entry points:" + missing + " (older than CUDA 12.3?)";
  return n;
}

void wait_stream(CUstream stream, double timeout_s, const std::string& what) {
  const Driver& d = driver();
  spin_wait(
      timeout_s,
      [&] {
        const CUresult r = d.cuStreamQuery(stream);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) GPUOS_CU(r);
        return r == CUDA_SUCCESS;
      },
      [&] { return "gpuos: timed out after " + std::to_string(timeout_s) + " s waiting for " + what; });
}

}  // namespace gpuos
