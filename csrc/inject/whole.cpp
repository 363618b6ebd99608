// csrc/inject/whole.cpp -- see whole.h.
#include "inject/whole.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "config/config.h"
#include "inject/codegen.h"
#include "inject/registry_state.h"
#include "jit/jit.h"

extern char** environ;

namespace gpuos {
namespace {

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> command;
  bool stop = false, pending = false;
  bool base_pending = false;  // generation 0's base image was asked for: built before `want`, never dropped
  uint32_t want = 0;  // the newest requested generation
  pid_t pid = 0;      // the running helper (0: none)
  std::thread thread;
  WholeBuildInfo info;
};

State& S() {
  static State* s = [] {  // never destroyed: shutdown_whole_builds() stops the thread at exit
    auto* st = new State();
    st->info.enabled = env_config().whole_build;
    return st;
  }();
  return *s;
}

// The helper's environment: this one, with no GPU (it only runs NVRTC).
std::vector<std::string> helper_env() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0) env.emplace_back(*e);
  env.emplace_back("CUDA_VISIBLE_DEVICES=");
  return env;
}

// The helper's compile of generation `gen` for `arch`: "" when it exited 0, else why not ("superseded" when a newer
// request or shutdown killed it or came before it started). Its job files (header, log) are removed.
std::string run_helper(State& s, uint32_t gen, const std::string& arch, const std::string& header) {
  const std::string dir = jit_cache_dir();
  const std::string base = dir + "/whole-" + std::to_string(::getpid()) + "-" + std::to_string(gen) + "-" + arch;
  const std::string hfile = base + ".h", log = base + ".log";
  if (!write_file_atomic(hfile, header)) return "could not write " + hfile + " (is the JIT cache dir writable?)";
  std::vector<std::string> args;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    args = s.command;
  }
  args.push_back(arch);
  args.push_back(hfile);
  args.push_back(std::to_string(::getpid()));  // the helper exits at once when its parent is no longer this one
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  std::vector<std::string> env = helper_env();
  for (auto& e : env) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  int rc = 0;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.stop || (!s.info.base && s.want != gen)) rc = -1;
    else if ((rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data())) == 0) {
      s.pid = pid;
      s.info.helpers++;
    }
  }
  posix_spawn_file_actions_destroy(&fa);
  std::string err;
  if (rc == -1) {
    err = "superseded";
  } else if (rc != 0) {
    err = "could not start the helper " + args[0] + ": " + std::strerror(rc);
  } else {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    {
      std::lock_guard<std::mutex> lk(s.mu);
      s.pid = 0;
    }
    if (WIFSIGNALED(status)) {
      err = WTERMSIG(status) == SIGKILL ? "superseded" : "the helper died of signal " + std::to_string(WTERMSIG(status));
    } else if (WEXITSTATUS(status) != 0) {
      std::string out;
      read_file(log, out);
      if (out.size() > 2000) out = "..." + out.substr(out.size() - 2000);
      err = "the helper exited with status " + std::to_string(WEXITSTATUS(status)) + ": " + out;
    }
  }
  std::remove(hfile.c_str());
  std::remove(log.c_str());
  return err;
}

void build_loop() {
  State& s = S();
  std::unique_lock<std::mutex> lk(s.mu);
  for (;;) {
    s.cv.wait(lk, [&] { return s.stop || s.pending || s.base_pending; });
    if (s.stop) break;
    const bool base = s.base_pending;
    const uint32_t gen = base ? 0 : s.want;
    (base ? s.base_pending : s.pending) = false;
    s.info.running = true;
    s.info.base = base;
    s.info.source = gen;
    lk.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    std::string err;
    std::map<std::string, std::shared_ptr<const std::string>> images;
    try {
      std::string header;
      std::set<std::string> archs;
      if (!inject_detail::whole_source(gen, base, &header, &archs)) err = "stale";
      else if (jit_cache_dir().empty())
        err = "no JIT cache dir (GPUOS_DISABLE_CACHE=1, or no GPUOS_CACHE_DIR / HOME): the helper's image has "
              "nowhere to go. Fix: set GPUOS_CACHE_DIR to a writable directory";
      for (const auto& arch : archs) {
        if (!err.empty()) break;
        const SourceOverrides src = whole_overrides(header);
        std::string img = jit_cached_sources(arch, src);
        if (img.empty() && (err = run_helper(s, gen, arch, header)).empty()) {
          img = jit_cached_sources(arch, src);
          if (img.empty()) err = "the helper finished but the JIT cache holds no image (is the cache dir writable?)";
        }
        if (err.empty()) images[arch] = std::make_shared<const std::string>(std::move(img));
      }
      if (err.empty() && !inject_detail::publish_whole(gen, images)) err = "stale";
    } catch (const std::exception& e) {
      err = e.what();
    }
    lk.lock();
    s.info.running = false;
    s.info.last_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (err.empty()) s.info.published++;
    else if (err == "stale") s.info.superseded++;  // a newer generation that asked for no build (an op change)
    else if (err != "superseded") {               // (counted by the request that superseded it, or at exit)
      s.info.failed++;
      s.info.last_error = "whole build of generation " + std::to_string(gen) + ": " + err;
      // Once: a slower steady state, nothing wrong with any result. No cache dir is the user's choice (every
      // process's generation 0 would warn): whole_build_info() says it.
      if (s.info.failed == 1 && err.rfind("no JIT cache dir", 0) != 0)
        std::fprintf(stderr, "[gpuos] warning: the background whole build failed; generations stay linked (a few "
                             "percent slower; gpuos_ext.whole_build_info()['last_error'] has why; GPUOS_WHOLE_BUILD=0 "
                             "turns it off): %.300s\n", s.info.last_error.c_str());
    }
    s.cv.notify_all();
  }
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (auto& a : v) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace

void set_whole_build_command(const std::vector<std::string>& argv) {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  s.command = argv;
}

void set_whole_build(bool on) {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  s.info.enabled = on;
}

bool whole_build_enabled() {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.info.enabled;
}

void request_whole_build(uint32_t gen) {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.stop || !s.info.enabled || s.command.empty()) return;
  s.info.requested++;
  if (gen == 0) {  // the base image: built to the end whatever comes after (its image serves later processes)
    s.base_pending = true;
    if (!s.thread.joinable()) s.thread = std::thread(build_loop);
    s.cv.notify_all();
    return;
  }
  // The queued one never starts; the running one is dropped (its generation is no longer the newest: its image
  // would not be published) -- unless it builds the base image, which finishes into the cache for later
  // processes while this request waits (counted superseded when its publish then finds a newer generation).
  const bool keep = s.info.running && s.info.base;
  if (s.pending || (s.info.running && !keep)) s.info.superseded++;
  s.want = gen;
  s.pending = true;
  if (s.pid > 0 && !keep) ::kill(s.pid, SIGKILL);
  if (!s.thread.joinable()) s.thread = std::thread(build_loop);
  s.cv.notify_all();
}

bool wait_whole_builds(double timeout_s) {
  State& s = S();
  std::unique_lock<std::mutex> lk(s.mu);
  return s.cv.wait_for(lk, std::chrono::duration<double>(timeout_s),
                       [&] { return s.stop || (!s.pending && !s.base_pending && !s.info.running); });
}

WholeBuildInfo whole_build_info() {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  WholeBuildInfo i = s.info;
  i.helper_pid = s.pid;
  i.command = joined(s.command);
  return i;
}

bool compile_whole_image(const std::string& arch, const std::string& header) {
  const SourceOverrides src = whole_overrides(header);
  const std::string dir = jit_cache_dir();
  int fd = -1;
  if (!dir.empty()) {  // (jit.cpp trim_cache may remove an old lock file: at worst two helpers compile at once)
    char key[17];
    std::snprintf(key, sizeof key, "%016llx", (unsigned long long)fnv1a64(header.data(), header.size()));
    const std::string lock = dir + "/whole-lock-" + arch + "-" + key;
    fd = ::open(lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    while (fd >= 0 && ::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  const bool compiled = jit_cached_sources(arch, src).empty();
  if (compiled) jit_compile_sources(arch, src);
  if (fd >= 0) ::close(fd);  // (releases the lock)
  return compiled;
}

void shutdown_whole_builds() {
  State& s = S();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.stop = true;
    if (s.pid > 0) ::kill(s.pid, SIGKILL);
    s.cv.notify_all();
  }
  if (s.thread.joinable()) s.thread.join();
}

}  // namespace gpuos
