// csrc/inject/registry.h -- injected operators: the process-wide registry of user ops and installed slots,
// the generations compiled from it (one NVRTC module each: the worker plus every op, because a device function
// pointer is only valid inside the module that holds it), and the generation a sub-op of each op id needs.
// The runtime's side (loading a generation, the alias table) is core/generation.cpp; this layer never calls
// a runtime: switch/rollback hand the new table to a callback.
//
// Lock order: Runtime::mu, then the registry's lock. The registry never takes a Runtime::mu while holding
// its own lock, never runs Python and never needs the GIL; callers that may wait (register with block=True,
// switch, submit of an op whose generation is compiling) release the GIL first.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "device_src/config.h"
#include "driver/cuda_api.h"
#include "inject/codegen.h"

namespace gpuos {

// The generation whose module a sub-op of op id `op` needs: the one that first held the code of the op's
// active slot (0: the built-in module has it). Read on every record, written by the registry (release, after
// g_latest_ready_gen: a reader that sees a need also sees a ready generation that satisfies it).
extern std::atomic<uint32_t> g_op_need_gen[256];
inline uint32_t op_need_gen(uint32_t op) { return g_op_need_gen[op & 255u].load(std::memory_order_acquire); }
// Newest generation compiled successfully (0: only the built-in one).
extern std::atomic<uint32_t> g_latest_ready_gen;
// Slot the alias table selects for op id `op` (0 unless switched). The fused-chain interpreter runs the ops.def
// functors: a chain must not contain a built-in op switched to slot 1 (the scheduler checks this).
extern std::atomic<uint8_t> g_op_active_slot[256];
inline bool op_switched(uint32_t op) { return g_op_active_slot[op & 255u].load(std::memory_order_relaxed) != 0; }

// One op of the registry as Python sees it (gpuos_ext.user_ops()).
struct UserOpInfo {
  uint32_t id = 0, arity = 0;
  std::string name, aten;
  bool builtin = false;         // a built-in op of ops.def with an installed slot 1
  bool installed[2] = {false, false};
  std::string kind[2];          // "expr" / "function" / "builtin" per installed slot
  uint32_t slot_gen[2] = {0, 0};  // generation holding each slot's code (0 while compiling / built-in)
  uint32_t active = 0;          // slot the alias table selects
  uint32_t generation = 0;      // generation the active slot needs
  std::string state;            // "ready", "compiling", "failed"
  std::string error;            // failed: the CompileError message
};

struct GenerationInfo {
  uint32_t id = 0;
  std::string state;  // "ready", "compiling", "failed"
  std::vector<std::string> archs;
  std::string error;
  std::vector<std::string> ops;  // "name[slot]" of every op slot the generation holds
  int64_t whole_of = -1;         // a background whole build of that generation (inject/whole.h); -1: none
  std::string built;             // "linked", "whole", "cached whole" (inject/linked.h GenBuild); "" none yet
};

// ---- registry API (call without the GIL and without any Runtime::mu) ----
// New op from a CUDA C++ expression over fp32 a, b, c and scalars s0, s1 (is_expr), or from a source that
// defines `__device__ float <name>(float a[, float b[, float c]])` (arity < 0: read from that signature).
// Validates the source with a quick NVRTC compile first (CompileError naming the op, with the NVRTC log),
// then queues a generation compile; block: wait for it (CompileError on failure: the registry and the running
// generation are unchanged). Returns the op id (kFirstUserOp ..).
uint32_t register_user_op(const std::string& who, const std::string& name, const std::string& source, bool is_expr,
                          int arity, const std::string& aten, bool block);
// Put new code into slot 0 or 1 of `name` (a registered op, or slot 1 of a built-in elementwise op).
// Expression or function source (a source containing "__device__" is a function). Returns the op id.
uint32_t install_user_op(const std::string& name, const std::string& source, uint32_t slot, bool block);
// Hands every runtime the new alias table once it holds generation >= need (core/devices.cpp gives one that
// drains and reloads where a runtime's active generation lacks the slot's code).
using ApplyAlias = std::function<void(uint32_t need, const uint8_t table[256])>;
// Make the alias table select `slot` for `name` (through `apply`). Returns the slot that was active before.
uint32_t switch_user_op(const std::string& name, uint32_t slot, const ApplyAlias& apply);
// Switch back to the slot that was active before the last switch. Returns the slot now active.
uint32_t rollback_user_op(const std::string& name, const ApplyAlias& apply);
// Op id for submit: waits while the op's code is still compiling (block=False registrations) and throws the
// recorded CompileError of a failed one. Throws std::invalid_argument for unknown names / ids.
struct SubmitOp { uint32_t id; uint32_t arity; std::string name; };
SubmitOp user_op_for_submit(const std::string& name, int64_t id);
bool is_user_op_name(const std::string& name);
// The registered name of op id `id` ("" if none). Takes only the registry's lock: callable under Runtime::mu.
std::string user_op_name(uint32_t id);

std::vector<UserOpInfo> list_user_ops();
std::vector<GenerationInfo> list_generations();
// Wait until every queued generation compile has finished; returns the newest ready generation. Throws the
// first CompileError of generations that failed since the last call.
uint32_t wait_generations();
// While held (> 0), queued changes do not start a generation compile: several registrations become one
// generation (one ~25 s NVRTC compile of the worker instead of several).
void hold_generations(bool hold);
// The generated device_src/user_ops.h of the current registry.
std::string current_generation_header();
// Stop the compile thread (waits for a compile in progress). At exit.
void shutdown_generations();

// Generated header for explicit op specs (tests: NVRTC checks the generator without touching the registry).
std::string generation_header_for(const std::vector<OpSpec>& specs, uint32_t gen,
                                  const std::map<uint32_t, std::string>& fused = {});

// Called on the compile thread, with no lock held, each time a generation has compiled and become the newest
// ready one (core/devices.cpp hands it to every runtime: Runtime::adopt_generation_if_idle). Set once, at import.
void set_generation_ready_hook(std::function<void(uint32_t gen)> hook);

// Queue a generation holding tier-2 code `code` for fused-chain program `id` (inject/specialize.cpp).
void request_fused_spec(uint32_t id, const std::string& code);

// ---- used by the runtime (core/generation.cpp) ----
void registry_add_arch(const std::string& arch);
// Image of generation `gen` for `arch` (compiles it now if the generation was compiled without that arch).
std::shared_ptr<const std::string> generation_image(uint32_t gen, const std::string& arch);
// The alias table every runtime must hold: table[op] = active slot.
void current_alias_table(uint8_t table[256]);
// A generation that compiled but failed to load on some device: recorded for generation_info().
void note_generation_load_error(uint32_t gen, const std::string& msg);

}  // namespace gpuos
