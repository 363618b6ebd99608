// csrc/config/config.cpp -- see config.h.
#include "config/config.h"

#include <cstdlib>
#include <mutex>

namespace gpuos {
namespace {

std::mutex g_mu;
EnvConfig g_cfg;
bool g_read = false;

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
void read_u32(const char* name, uint32_t& dst) {
  if (const char* v = get(name)) dst = (uint32_t)std::strtoul(v, nullptr, 10);
}
void read_f64(const char* name, double& dst) {
  if (const char* v = get(name)) dst = std::strtod(v, nullptr);
}
bool flag(const char* name) {
  const char* v = get(name);
  return v && std::string(v) != "0";
}

EnvConfig read_env() {
  EnvConfig c;
  read_u32("GPUOS_WORKER_BLOCKS", c.worker_blocks);
  read_f64("GPUOS_IDLE_US", c.idle_us);
  read_f64("GPUOS_PROGRAM_IDLE_US", c.program_idle_us);
  read_f64("GPUOS_LIVE_IDLE_US", c.live_idle_us);
  read_u32("GPUOS_BURST_MIN", c.burst_min);
  read_u32("GPUOS_BURST_BLOCKS", c.burst_blocks);
  read_u32("GPUOS_PUBLISH_MIN", c.publish_min);
  read_f64("GPUOS_TIMEOUT_S", c.timeout_s);
  read_u32("GPUOS_TRACE", c.trace_records);
  read_u32("GPUOS_DMA_MIN", c.dma_min);
  read_u32("GPUOS_DMA_LEVELS", c.dma_levels);
  read_u32("GPUOS_MM_ITEMS", c.mm_items);
  read_u32("GPUOS_MM_ITEMS_LIVE", c.mm_items_live);
  read_u32("GPUOS_HOME_LEVELS", c.home_levels);
  read_u32("GPUOS_ATTN_MIN_ROWS", c.attn_min_rows);
  read_u32("GPUOS_HANDOVER_QUEUE", c.handover_queue);
  read_u32("GPUOS_KICK_ALONE", c.kick_alone);
  c.kick_wait = flag("GPUOS_KICK_WAIT");
  if (c.attn_min_rows == 0) c.attn_min_rows = 1;
  if (c.dma_min == 0) c.dma_min = 1;
  read_u32("GPUOS_SPECIALIZE_AFTER", c.specialize_after);
  read_u32("GPUOS_PTXAS_OPT", c.ptxas_opt);
  read_u32("GPUOS_CACHE_MAX_MB", c.cache_max_mb);
  if (const char* f = get("GPUOS_FAST_COMPILE")) c.fast_compile = std::string(f) == "0" ? "" : f;
  if (c.ptxas_opt > 3) c.ptxas_opt = 3;
  // The trace's record indices are 32-bit (device_src/worker.cu item_slot): at most 2^20 records per block (258
  // regions of 32-byte records: 8.6 GB of pinned memory already).
  if (c.trace_records > (1u << 20)) c.trace_records = 1u << 20;
  c.forbid_compile = flag("GPUOS_FORBID_COMPILE");
  if (const char* v = get("GPUOS_KICKS")) c.kicks = std::string(v) != "0";  // default on
  c.worker_matmul = flag("GPUOS_WORKER_MATMUL");
  c.worker_attention = flag("GPUOS_WORKER_ATTENTION");
  if (!flag("GPUOS_DISABLE_CACHE")) {
    if (const char* d = get("GPUOS_CACHE_DIR")) c.cache_dir = d;
    else if (const char* x = get("XDG_CACHE_HOME")) c.cache_dir = std::string(x) + "/gpuos";
    else if (const char* h = get("HOME")) c.cache_dir = std::string(h) + "/.cache/gpuos";
  }
  if (const char* p = get("GPUOS_NVRTC_PATH")) c.nvrtc_path = p;
  if (const char* p = get("GPUOS_NVJITLINK_PATH")) c.nvjitlink_path = p;
  if (const char* l = get("GPUOS_LINK")) c.link = std::string(l) != "0";
  if (const char* w = get("GPUOS_WHOLE_BUILD")) c.whole_build = std::string(w) != "0";
  if (const char* j = get("GPUOS_JOIN_LEVELS")) c.join_levels = std::string(j) != "0";
  if (const char* a = get("GPUOS_LOCAL_COMBINE")) c.local_combine = std::string(a) != "0";
  if (const char* m = get("GPUOS_MM_SPREAD")) c.mm_spread = std::string(m) != "0";
  if (const char* m = get("GPUOS_MM_EPILOGUE")) c.mm_epilogue = std::string(m) != "0";
  if (const char* m = get("GPUOS_MM_PROLOGUE")) c.mm_prologue = std::string(m) != "0";
  if (const char* m = get("GPUOS_TIMER_OFF_GIL")) c.timer_off_gil = std::string(m) != "0";
  if (const char* h = get("CUDA_HOME")) c.cuda_home = h;
  else if (const char* h2 = get("CUDA_PATH")) c.cuda_home = h2;
  return c;
}

}  // namespace

const EnvConfig& env_config() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_read) {
    g_cfg = read_env();
    g_read = true;
  }
  return g_cfg;
}

void reload_env_config() {
  EnvConfig c = read_env();
  std::lock_guard<std::mutex> lk(g_mu);
  g_cfg = std::move(c);
  g_read = true;
}

std::string describe_env_config() {
  const EnvConfig& c = env_config();
  auto num = [](double v) {
    std::string s = std::to_string(v);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  return "GPUOS_WORKER_BLOCKS=" + std::to_string(c.worker_blocks) + "\nGPUOS_IDLE_US=" +
         (c.idle_us < 0 ? std::string("(init argument)") : num(c.idle_us)) +
         "\nGPUOS_PROGRAM_IDLE_US=" + (c.program_idle_us < 0 ? std::string("(idle_us)") : num(c.program_idle_us)) +
         "\nGPUOS_LIVE_IDLE_US=" + (c.live_idle_us < 0 ? std::string("(the context's)") : num(c.live_idle_us)) +
         "\nGPUOS_BURST_MIN=" + std::to_string(c.burst_min) + "\nGPUOS_BURST_BLOCKS=" +
         std::to_string(c.burst_blocks) + "\nGPUOS_PUBLISH_MIN=" + std::to_string(c.publish_min) +
         "\nGPUOS_JOIN_LEVELS=" + (c.join_levels ? "1" : "0") +
         "\nGPUOS_TIMEOUT_S=" + num(c.timeout_s) + "\nGPUOS_TRACE=" + std::to_string(c.trace_records) +
         "\nGPUOS_DMA_MIN=" + std::to_string(c.dma_min) +
         "\nGPUOS_DMA_LEVELS=" + std::to_string(c.dma_levels) + "\nGPUOS_MM_ITEMS=" + std::to_string(c.mm_items) +
         "\nGPUOS_MM_ITEMS_LIVE=" + std::to_string(c.mm_items_live) +
         "\nGPUOS_MM_SPREAD=" + (c.mm_spread ? "1" : "0") +
         "\nGPUOS_ATTN_MIN_ROWS=" + std::to_string(c.attn_min_rows) +
         "\nGPUOS_LOCAL_COMBINE=" + (c.local_combine ? "1" : "0") +
         "\nGPUOS_MM_EPILOGUE=" + (c.mm_epilogue ? "1" : "0") +
         "\nGPUOS_MM_PROLOGUE=" + (c.mm_prologue ? "1" : "0") +
         "\nGPUOS_TIMER_OFF_GIL=" + (c.timer_off_gil ? "1" : "0") +
         "\nGPUOS_HOME_LEVELS=" + std::to_string(c.home_levels) +
         "\nGPUOS_KICKS=" + (c.kicks ? "1" : "0") + "\nGPUOS_KICK_ALONE=" + std::to_string(c.kick_alone) +
         "\nGPUOS_KICK_WAIT=" + (c.kick_wait ? "1" : "0") +
         "\nGPUOS_HANDOVER_QUEUE=" + std::to_string(c.handover_queue) +
         "\nGPUOS_SPECIALIZE_AFTER=" +
         std::to_string(c.specialize_after) + "\nGPUOS_PTXAS_OPT=" + std::to_string(c.ptxas_opt) +
         "\nGPUOS_FAST_COMPILE=" + (c.fast_compile.empty() ? std::string("0") : c.fast_compile) +
         "\nGPUOS_FORBID_COMPILE=" + (c.forbid_compile ? "1" : "0") +
         "\nGPUOS_WORKER_MATMUL=" + (c.worker_matmul ? "1" : "0") +
         "\nGPUOS_WORKER_ATTENTION=" + (c.worker_attention ? "1" : "0") +
         "\nGPUOS_CACHE_DIR=" + c.cache_dir + "\nGPUOS_CACHE_MAX_MB=" + std::to_string(c.cache_max_mb) +
         "\nGPUOS_NVRTC_PATH=" + c.nvrtc_path +
         "\nGPUOS_NVJITLINK_PATH=" + c.nvjitlink_path + "\nGPUOS_LINK=" + (c.link ? "1" : "0") +
         "\nGPUOS_WHOLE_BUILD=" + (c.whole_build ? "1" : "0") + "\nCUDA_HOME=" + c.cuda_home;
}

}  // namespace gpuos
