// csrc/jit/link.cpp -- see link.h.
#include "jit/link.h"

#include <atomic>
#include <chrono>
#include <mutex>

#include "config/config.h"
#include "driver/cuda_api.h"

namespace gpuos {
namespace {
std::atomic<int> g_override{-1};
std::mutex g_stats_mu;
LinkStats g_stats;

// Library state, decided once (the library is loaded once).
const LinkMode& library_mode() {
  static const LinkMode m = [] {
    LinkMode r;
    const NvJitLinkLib& l = nvjitlink();
    if (!l.error.empty()) {
      r.reason = l.error;
      return r;
    }
    r.library = l.path;
    r.version = std::to_string(l.major) + "." + std::to_string(l.minor);
    int vmaj = 0, vmin = 0;
    try {
      nvrtc().nvrtcVersion(&vmaj, &vmin);
    } catch (const std::exception& e) {
      r.reason = std::string("NVRTC is unavailable: ") + e.what();
      return r;
    }
    // NVRTC's relocatable cubins carry its ELF ABI; an older nvJitLink may not read them.
    if ((int)l.major < vmaj || ((int)l.major == vmaj && (int)l.minor < vmin)) {
      r.reason = "nvJitLink " + r.version + " at " + l.path + " is older than NVRTC " + std::to_string(vmaj) + "." +
                 std::to_string(vmin) + ". Fix: pip install nvidia-nvjitlink==<the nvidia-cuda-nvrtc version>";
      return r;
    }
    r.linked = true;
    return r;
  }();
  return m;
}
}  // namespace

LinkMode link_mode() {
  const int o = g_override.load();
  const bool want = o < 0 ? env_config().link : o != 0;
  if (!want) {
    LinkMode r;
    r.reason = o < 0 ? "GPUOS_LINK=0: whole NVRTC compiles" : "linking switched off (set_link_override(0))";
    return r;
  }
  return library_mode();
}

bool link_for_arch(const std::string& arch) { return arch.rfind("sm_", 0) == 0 && link_mode().linked; }

void set_link_override(int v) { g_override.store(v < 0 ? -1 : v != 0); }

std::string jit_link(const std::string& arch, const std::vector<std::shared_ptr<const std::string>>& objects) {
  const NvJitLinkLib& l = nvjitlink();
  if (!l.error.empty()) throw CudaError("gpuos: cannot link a generation: " + l.error);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string arch_opt = "-arch=" + arch;
  const char* opts[] = {arch_opt.c_str()};
  nvJitLinkHandle h = nullptr;
  int r = l.Create(&h, 1, opts);
  if (r != 0) throw CudaError("nvJitLinkCreate(-arch=" + arch + ") failed: error " + std::to_string(r));
  struct Guard {  // destroy the handle on every path
    const NvJitLinkLib& l;
    nvJitLinkHandle& h;
    ~Guard() { if (h) l.Destroy(&h); }
  } guard{l, h};
  auto log_of = [&] {
    size_t n = 0;
    l.GetErrorLogSize(h, &n);
    std::string s(n, '\0');
    if (n > 1) l.GetErrorLog(h, &s[0]);
    while (!s.empty() && (s.back() == '\0' || s.back() == '\n')) s.pop_back();
    return s;
  };
  auto fail = [&](const std::string& what) {
    const std::string log = log_of();
    throw CompileError("nvJitLink failed to " + what + " for " + arch + " (" + l.path + "):\n" + log, log, arch,
                       arch_opt, "");
  };
  for (size_t i = 0; i < objects.size(); ++i) {
    const std::string name = "gpuos_object_" + std::to_string(i);
    if (l.AddData(h, NVJITLINK_INPUT_CUBIN, objects[i]->data(), objects[i]->size(), name.c_str()) != 0)
      fail("add object " + std::to_string(i));
  }
  if (l.Complete(h) != 0) fail("link a generation");
  size_t n = 0;
  if (l.GetLinkedCubinSize(h, &n) != 0 || n == 0) fail("return the linked cubin");
  std::string image(n, '\0');
  if (l.GetLinkedCubin(h, &image[0]) != 0) fail("return the linked cubin");
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lk(g_stats_mu);
  g_stats.links++;
  g_stats.link_s += dt;
  return image;
}

LinkStats link_stats() {
  std::lock_guard<std::mutex> lk(g_stats_mu);
  return g_stats;
}

}  // namespace gpuos
