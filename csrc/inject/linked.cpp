// csrc/inject/linked.cpp -- see linked.h.
#include "inject/linked.h"

#include <mutex>

#include "driver/cuda_api.h"
#include "inject/whole.h"
#include "jit/jit.h"
#include "jit/link.h"

namespace gpuos {
namespace {
std::mutex g_mu;
std::map<std::string, std::shared_ptr<const std::string>> g_workers;  // arch -> worker object (no copies)
LinkedGenStats g_stats;

const char* kWorkerUserOps = "// linked worker object (csrc/inject/linked.cpp)\n#include \"device_src/linked.h\"\n";

// One relocatable object compiled from `source` under the file name `file` (cached by the JIT like every image).
std::shared_ptr<const std::string> object_of(const std::string& arch, const std::string& file,
                                             const std::string& source) {
  return std::make_shared<const std::string>(jit_compile_sources(arch, {{file, source}}, file, true));
}

void note(bool linked, const std::string& why) {
  std::lock_guard<std::mutex> lk(g_mu);
  (linked ? g_stats.linked : g_stats.whole)++;
  if (!linked) g_stats.last_fallback = why;
}
}  // namespace

std::shared_ptr<const std::string> worker_object(const std::string& arch) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_workers.find(arch);
    if (it != g_workers.end()) return it->second;
  }
  auto obj = std::make_shared<const std::string>(
      jit_compile_sources(arch, {{kUserOpsPath, kWorkerUserOps}}, "device_src/worker.cu", true));
  std::lock_guard<std::mutex> lk(g_mu);
  return g_workers.emplace(arch, obj).first->second;
}

std::shared_ptr<const std::string> op_object(const std::string& arch, const OpSpec& s) {
  const std::string file = "device_src/" + op_object_symbol(s) + ".cu";
  return object_of(arch, file, op_object_source(s, file));
}

std::string build_generation_image(const std::string& arch, const std::vector<OpSpec>& specs,
                                   const std::map<uint32_t, std::string>& fused, const std::string& header,
                                   GenBuild* how) {
  std::string why;
  if (how) *how = GenBuild::kWhole;
  if (link_for_arch(arch) && whole_build_enabled()) {
    // An earlier whole build of this very generation (this process's or another's) left its image in the cache:
    // whole at once, no link and no helper (inject/whole.h).
    std::string image = jit_cached_sources(arch, whole_overrides(header));
    if (!image.empty()) {
      std::lock_guard<std::mutex> lk(g_mu);
      g_stats.cached_whole++;
      if (how) *how = GenBuild::kCachedWhole;
      return image;
    }
  }
  if (link_for_arch(arch)) {
    std::vector<std::shared_ptr<const std::string>> objs{worker_object(arch)};
    for (const OpSpec& s : specs) objs.push_back(op_object(arch, s));  // an op's CompileError propagates
    std::vector<uint32_t> ids;
    for (const auto& kv : fused) {
      ids.push_back(kv.first);
      const std::string file = "device_src/gpuos_fused_exec_" + std::to_string(kv.first) + ".cu";
      objs.push_back(object_of(arch, file, fused_object_source(kv.first, kv.second)));
    }
    objs.push_back(object_of(arch, "device_src/user_dispatch.cu", dispatch_source(specs, ids)));
    try {
      std::string image = jit_link(arch, objs);
      note(true, "");
      if (how) *how = GenBuild::kLinked;
      return image;
    } catch (const std::exception& e) {  // a link that fails is our defect, never the user's: compile whole
      why = std::string("the link failed, so this generation was compiled whole: ") + e.what();
    }
  } else {
    why = arch.rfind("sm_", 0) == 0 ? link_mode().reason : "arch " + arch + " is PTX-only: whole compile";
  }
  std::string image = jit_compile_sources(arch, whole_overrides(header));
  note(false, why);
  return image;
}

const char* gen_build_name(GenBuild b) {
  return b == GenBuild::kLinked ? "linked" : b == GenBuild::kCachedWhole ? "cached whole" : "whole";
}

LinkedGenStats linked_gen_stats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_stats;
}

}  // namespace gpuos
