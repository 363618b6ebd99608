// csrc/inject/registry_state.h -- the registry's state, shared by inject/registry.cpp (ops, installs, switches)
// and inject/generations.cpp (the compile thread, generations and their images). Internal to inject/.
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "inject/registry.h"

namespace gpuos {
namespace inject_detail {

struct Slot {
  bool installed = false;
  bool is_expr = true;
  std::string source;
  uint32_t gen = 0;     // newest ready generation with this slot's code (the old code while new code
                        // compiles); 0: no ready generation has any code for the slot yet
  uint64_t change = 0;  // the change that put `source` here (pending until its generation is ready)
};

struct OpEntry {
  bool used = false, builtin = false;
  std::string name, aten;
  uint32_t arity = 0;
  Slot slot[2];
  uint8_t active = 0, prev = 0;
  std::shared_ptr<CompileError> failed;    // registration failed (block=False): every submit raises it
  std::shared_ptr<CompileError> deferred;  // an install failed (block=False): the next submit raises it once
};

struct Change {
  uint32_t op = 0, slot = 0;
  bool new_op = false, block = true;
  Slot before;  // the slot as it was (for a revert)
  enum State { kPending, kDone, kFailed } state = kPending;
  uint32_t gen = 0;
  std::shared_ptr<CompileError> error;
};

struct Gen {
  uint32_t id = 0;
  std::string header;  // the generated device_src/user_ops.h (a whole compile's)
  std::vector<OpSpec> specs;               // what it holds (a linked build's objects)
  std::map<uint32_t, std::string> fused;   // tier-2 program id -> code
  enum State { kCompiling, kReady, kFailed } state = kCompiling;
  std::map<std::string, std::shared_ptr<const std::string>> images;  // arch -> cubin / PTX (shared: no copies)
  std::shared_ptr<CompileError> error;
  std::string load_error;
  std::vector<uint64_t> changes;
  std::vector<std::string> ops;
  int64_t whole_of = -1;  // a whole build's generation (inject/whole.h): the linked generation it compiles again
  std::string built;      // gen_build_name of its images ("linked" if any arch's is; "" until one is built)
};

struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  OpEntry ops[256];
  std::map<std::string, uint32_t> by_name;
  std::vector<std::shared_ptr<Gen>> gens;
  std::map<uint64_t, Change> changes;
  std::vector<uint64_t> dirty;  // applied changes no generation holds yet
  uint64_t next_change = 1;
  int hold = 0;
  bool compiling = false, stop = false;
  std::set<std::string> archs;
  std::thread thread;
  std::vector<std::shared_ptr<CompileError>> unreported;  // failures for wait_generations()
  std::mutex switch_mu;  // one switch / rollback at a time
  // Tier 2 of fused chains: program id -> generated straight-line code (fusion.cpp specialize_program). New
  // entries mark spec_dirty, which starts a generation like an op change; a failed one is never retried.
  std::map<uint32_t, std::string> fused_specs;
  std::set<uint32_t> failed_specs;
  bool spec_dirty = false;
  Registry() {
    auto g = std::make_shared<Gen>();
    g->id = 0;
    g->state = Gen::kReady;
    gens.push_back(g);
    for (auto& a : g_op_need_gen) a.store(0);
    for (auto& a : g_op_active_slot) a.store(0);
  }
};

Registry& R();  // the process-wide registry (never destroyed: shutdown_generations() stops the thread at exit)
// Specs of every installed slot of the registry (caller holds R().mu).
std::vector<OpSpec> registry_specs(const Registry& r);
// Publish op `op`'s needed generation and active slot to the recording paths (caller holds r.mu).
void recompute_need(Registry& r, uint32_t op);
// Revert a change of a failed generation (caller holds r.mu).
void revert_change(Registry& r, uint64_t id, Change& c);
// Start the compile thread if it is not running (caller holds r.mu).
void ensure_thread(Registry& r);
// The background whole build (inject/whole.cpp; each takes r.mu). whole_source: ready generation `gen`'s header
// and archs, false unless it is still the newest (or stale_ok: the base image, cached for later processes).
// publish_whole: `images` (gen's header compiled whole) become the next generation and the ready hook runs, unless
// gen is no longer the newest or a generation is queued (false).
bool whole_source(uint32_t gen, bool stale_ok, std::string* header, std::set<std::string>* archs);
bool publish_whole(uint32_t gen, std::map<std::string, std::shared_ptr<const std::string>> images);

}  // namespace inject_detail
}  // namespace gpuos
