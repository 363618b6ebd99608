// csrc/inject/registry.cpp -- see registry.h. The registry of injected ops: registration, installs, switches,
// submit lookups and tier-2 chain code requests. The compile thread and the generations are
// inject/generations.cpp; the runtime's side (handover, alias table) is core/generation.cpp.
#include "inject/registry.h"
#include "inject/registry_state.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "device_src/functors.h"
#include "device_src/types.h"
#include "inject/codegen.h"
#include "inject/linked.h"
#include "jit/jit.h"
#include "jit/link.h"
#include "ops/op_table.h"

namespace gpuos {

std::atomic<uint32_t> g_op_need_gen[256];
std::atomic<uint32_t> g_latest_ready_gen{0};
std::atomic<uint8_t> g_op_active_slot[256];

namespace inject_detail {

static_assert(kNumOps <= kFirstUserOp, "built-in op ids must stay below kFirstUserOp");

Registry& R() {
  static Registry* r = new Registry();  // never destroyed: shutdown_generations() stops the thread at exit
  return *r;
}

std::string op_label(const OpEntry& e, uint32_t slot) { return e.name + "[" + std::to_string(slot) + "]"; }

bool valid_identifier(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

int builtin_id(const std::string& name) {
  return find_op(name.c_str());
}

bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Parameters of the first `name(` in `src` (a declaration or definition): -1 if there is none.
int infer_arity(const std::string& src, const std::string& name) {
  size_t pos = 0;
  while ((pos = src.find(name, pos)) != std::string::npos) {
    const size_t end = pos + name.size();
    const bool left_ok = pos == 0 || !is_ident_char(src[pos - 1]);
    size_t p = end;
    while (p < src.size() && (src[p] == ' ' || src[p] == '\t' || src[p] == '\n' || src[p] == '\r')) ++p;
    if (!left_ok || p >= src.size() || src[p] != '(' || (end < src.size() && is_ident_char(src[end]))) {
      pos = end;
      continue;
    }
    int depth = 0, commas = 0;
    bool any = false;
    std::string inner;
    for (size_t i = p + 1; i < src.size(); ++i) {
      const char c = src[i];
      if (c == '(') ++depth;
      if (c == ')') {
        if (depth == 0) {
          size_t a = inner.find_first_not_of(" \t\r\n"), b = inner.find_last_not_of(" \t\r\n");
          const std::string t = a == std::string::npos ? "" : inner.substr(a, b - a + 1);
          if (!any || t == "void") return 0;
          return commas + 1;
        }
        --depth;
      }
      if (c == ',' && depth == 0) ++commas;
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') any = true;
      inner += c;
    }
    return -1;
  }
  return -1;
}

// Specs of every installed slot of the registry (caller holds R().mu).
std::vector<OpSpec> registry_specs(const Registry& r) {
  std::vector<OpSpec> v;
  for (uint32_t op = 0; op < 256; ++op) {
    const OpEntry& e = r.ops[op];
    if (!e.used || e.failed) continue;
    for (uint32_t s = 0; s < 2; ++s)
      if (e.slot[s].installed && !(e.builtin && s == 0))
        v.push_back({op, s, e.arity, e.name, e.slot[s].source, e.slot[s].is_expr});
  }
  return v;
}

void recompute_need(Registry& r, uint32_t op) {
  const OpEntry& e = r.ops[op];
  uint32_t g = 0;
  if (e.used && !e.failed) {
    const Slot& s = e.slot[e.active];
    g = (e.builtin && e.active == 0) ? 0 : s.gen;
  }
  g_op_need_gen[op].store(g, std::memory_order_release);
  g_op_active_slot[op].store(e.used && !e.failed ? e.active : 0, std::memory_order_relaxed);
}

std::string validation_arch(const Registry& r) {
  for (const auto& a : r.archs) {  // a device's "sm_NN" / "compute_NN" -> "compute_NN": PTX, no ptxas
    const size_t u = a.find('_');
    if (u != std::string::npos) return "compute_" + a.substr(u + 1);
  }
  return jit_newest_virtual_arch();  // no GPU known yet
}

// Quick NVRTC check of one op's code before any generation is queued: a bad source fails in about a second with
// a short log. For each device arch whose generations link (issue #18) it compiles the op's own object, the very
// object the generation links (cached: the generation then only compiles its dispatch and links); otherwise the
// op's block and a tiny kernel calling it, as PTX (`ptx_arch`). Cached like every compile.
void validate_source(const std::string& who, const std::string& name, uint32_t slot, uint32_t arity,
                     const std::string& source, bool is_expr, const std::string& ptx_arch,
                     const std::set<std::string>& archs) {
  std::string arch = ptx_arch;
  try {
    bool linked = false;
    for (const std::string& a : archs)
      if (link_for_arch(a)) {
        arch = a;
        op_object(a, OpSpec{0, slot, arity, name, source, is_expr});
        linked = true;
      }
    if (linked) return;
    arch = ptx_arch;
    const std::string file = "device_src/user_check.cu";
    Emitter em;
    em.put("// gpuos: validation compile of one injected op\n#include \"device_src/config.h\"\n"
           "#include \"device_src/functors.h\"\n");
    emit_op(em, "check", name, slot, arity, source, is_expr, file);
    em.put("extern \"C\" __global__ void gpuos_check_kernel(float* o, const float* x) {\n"
           "  o[threadIdx.x] = ::gpuos_user_check::UserF_check::apply(x[0], x[1], x[2], x[3], x[4]);\n}\n");
    jit_compile_sources(arch, {{file, em.out}}, file);
  } catch (const CompileError& e) {
    throw CompileError(who + ": the " + (is_expr ? "expression" : "source") + " of op '" + name + "' (slot " +
                           std::to_string(slot) + ") does not compile (NVRTC, " + arch + "):\n" + e.log +
                           "\nsource: " + e.source_path +
                           "\nFix: " + (is_expr ? "write one CUDA C++ expression over fp32 a, b, c, s0, s1."
                                                : "define __device__ float " + name + "(float a[, float b[, float c]])."),
                       e.log, e.arch, e.options, e.source_path);
  }
}

// Apply a change to the registry and queue it for the next generation (caller holds r.mu).
uint64_t queue_change(Registry& r, uint32_t op, uint32_t slot, bool new_op, bool block, const Slot& before) {
  const uint64_t id = r.next_change++;
  Change c;
  c.op = op;
  c.slot = slot;
  c.new_op = new_op;
  c.block = block;
  c.before = before;
  r.changes[id] = c;
  r.dirty.push_back(id);
  ensure_thread(r);
  r.cv.notify_all();
  return id;
}

// Revert a change of a failed generation (caller holds r.mu).
void revert_change(Registry& r, uint64_t id, Change& c) {
  OpEntry& e = r.ops[c.op];
  if (c.new_op) {
    if (c.block) {  // the caller gets the error now: forget the op (name and id free again)
      r.by_name.erase(e.name);
      e = OpEntry();
    } else {
      e.failed = c.error;
    }
  } else if (e.slot[c.slot].change == id) {
    e.slot[c.slot] = c.before;
    if (!c.block) e.deferred = c.error;
  }
  for (auto& kv : r.changes)  // a later change of the same slot must not restore this failed code
    if (kv.first > id && kv.second.op == c.op && kv.second.slot == c.slot && kv.second.before.change == id)
      kv.second.before = c.before;
  recompute_need(r, c.op);
}

// Wait until change `id` is no longer pending (caller holds lk on r.mu); throws its error.
void wait_change(Registry& r, std::unique_lock<std::mutex>& lk, uint64_t id) {
  r.cv.wait(lk, [&] { return r.changes[id].state != Change::kPending || r.stop; });
  const Change& c = r.changes[id];
  if (c.state == Change::kFailed) {
    auto e = c.error;
    for (auto it = r.unreported.begin(); it != r.unreported.end(); ++it)
      if (*it == e) { r.unreported.erase(it); break; }
    throw CompileError(*e);
  }
  if (c.state == Change::kPending) throw CudaError("gpuos: shutting down while a generation was compiling");
}

uint32_t find_op(const Registry& r, const std::string& name, const char* who) {
  auto it = r.by_name.find(name);
  if (it != r.by_name.end()) return it->second;
  std::string known;
  for (auto& kv : r.by_name) known += (known.empty() ? "" : ", ") + ("'" + kv.first + "'");
  throw std::invalid_argument(std::string(who) + ": no injected op named '" + name + "' (registered: " +
                              (known.empty() ? "none" : known) +
                              "). Fix: gpuos.register_elementwise / register_op first, or install slot 1 of a "
                              "built-in elementwise op.");
}

}  // namespace inject_detail

using namespace inject_detail;

// ------------------------------------------------------------------ registry API
void request_fused_spec(uint32_t id, const std::string& code) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.stop || r.fused_specs.count(id) || r.failed_specs.count(id)) return;
  r.fused_specs[id] = code;
  r.spec_dirty = true;
  ensure_thread(r);
  r.cv.notify_all();
}

uint32_t register_user_op(const std::string& who, const std::string& name, const std::string& source, bool is_expr,
                          int arity, const std::string& aten, bool block) {
  Registry& r = R();
  if (!valid_identifier(name))
    throw std::invalid_argument(who + ": op name '" + name + "' must be a C identifier (letters, digits, _; "
                                "at most 64 characters)");
  if (builtin_id(name) >= 0)
    throw std::invalid_argument(who + ": '" + name + "' is a built-in op. Fix: pick another name, or replace "
                                "the built-in with gpuos.install('" + name + "', source, slot=1) and switch().");
  if (source.find_first_not_of(" \t\r\n") == std::string::npos)
    throw std::invalid_argument(who + ": the source of op '" + name + "' is empty");
  if (!is_expr && arity < 0) {
    arity = infer_arity(source, name);
    if (arity < 0)
      throw std::invalid_argument(who + ": the source of op '" + name + "' does not define a function named '" +
                                  name + "'. Fix: define __device__ float " + name +
                                  "(float a[, float b[, float c]]), or pass arity=.");
  }
  if (arity < 1 || arity > 3)
    throw std::invalid_argument(who + ": op '" + name + "' has arity " + std::to_string(arity) +
                                "; injected elementwise ops take 1, 2 or 3 tensor inputs");
  std::string arch;
  std::set<std::string> archs;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.by_name.find(name);
    if (it != r.by_name.end() && !r.ops[it->second].failed)
      throw std::invalid_argument(who + ": an op named '" + name + "' is already registered (id " +
                                  std::to_string(it->second) + "). Fix: pick another name, or replace its code "
                                  "with gpuos.install('" + name + "', source, slot).");
    arch = validation_arch(r);
    archs = r.archs;
  }
  validate_source(who, name, 0, (uint32_t)arity, source, is_expr, arch, archs);
  std::unique_lock<std::mutex> lk(r.mu);
  if (r.hold > 0) block = false;  // inside batch_install(): the compile starts (and is waited for) at its end
  uint32_t id = 0;
  auto it = r.by_name.find(name);
  if (it != r.by_name.end()) {
    if (!r.ops[it->second].failed)
      throw std::invalid_argument(who + ": an op named '" + name + "' is already registered");
    id = it->second;  // re-registering a failed op reuses its id
  } else {
    for (id = kFirstUserOp; id < kMaxOps && r.ops[id].used; ++id) {
    }
    if (id >= kMaxOps)
      throw std::invalid_argument(who + ": no free op id (" + std::to_string(kMaxOps - kFirstUserOp) +
                                  " injected ops at most)");
  }
  OpEntry& e = r.ops[id];
  e = OpEntry();
  e.used = true;
  e.name = name;
  e.aten = aten;
  e.arity = (uint32_t)arity;
  e.slot[0].installed = true;
  e.slot[0].is_expr = is_expr;
  e.slot[0].source = source;
  r.by_name[name] = id;
  const uint64_t c = queue_change(r, id, 0, true, block, Slot());
  e.slot[0].change = c;
  recompute_need(r, id);
  if (block) wait_change(r, lk, c);
  return id;
}

uint32_t install_user_op(const std::string& name, const std::string& source, uint32_t slot, bool block) {
  Registry& r = R();
  const std::string who = "gpuos.install('" + name + "', slot=" + std::to_string(slot) + ")";
  if (slot > 1) throw std::invalid_argument(who + ": slot must be 0 or 1");
  if (source.find_first_not_of(" \t\r\n") == std::string::npos)
    throw std::invalid_argument(who + ": the source is empty");
  const bool is_expr = source.find("__device__") == std::string::npos;
  const int bid = builtin_id(name);
  uint32_t arity = 0;
  std::string arch;
  std::set<std::string> archs;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (bid >= 0) {
      if (kOps[bid].kind != kKindEw)
        throw std::invalid_argument(who + ": '" + name + "' is a reduction; only elementwise ops can be replaced");
      if (slot == 0)
        throw std::invalid_argument(who + ": slot 0 of the built-in op '" + name +
                                    "' is its ops.def functor. Fix: install into slot 1, then switch('" + name +
                                    "', 1).");
      arity = kOps[bid].arity;
    } else {
      const uint32_t id = find_op(r, name, who.c_str());
      if (r.ops[id].failed) throw CompileError(*r.ops[id].failed);
      arity = r.ops[id].arity;
    }
    arch = validation_arch(r);
    archs = r.archs;
  }
  if (!is_expr && infer_arity(source, name) < 0)
    throw std::invalid_argument(who + ": the source does not define a function named '" + name +
                                "'. Fix: define __device__ float " + name + "(...) with " + std::to_string(arity) +
                                " float parameter(s).");
  validate_source(who, name, slot, arity, source, is_expr, arch, archs);
  std::unique_lock<std::mutex> lk(r.mu);
  if (r.hold > 0) block = false;  // inside batch_install()
  uint32_t id;
  if (bid >= 0) {
    id = (uint32_t)bid;
    OpEntry& e = r.ops[id];
    if (!e.used) {
      e = OpEntry();
      e.used = true;
      e.builtin = true;
      e.name = name;
      e.arity = arity;
      e.slot[0].installed = true;  // the ops.def functor, in every generation
      r.by_name[name] = id;
    }
  } else {
    id = find_op(r, name, who.c_str());
  }
  OpEntry& e = r.ops[id];
  const Slot before = e.slot[slot];
  e.slot[slot].installed = true;
  e.slot[slot].is_expr = is_expr;
  e.slot[slot].source = source;
  const uint64_t c = queue_change(r, id, slot, false, block, before);
  e.slot[slot].change = c;
  // Until the new code's generation is ready, slot.gen still names the old code's generation: sub-ops of the op
  // keep running the old code (and switch() to the slot uses it).
  if (block) wait_change(r, lk, c);
  return id;
}

uint32_t switch_user_op(const std::string& name, uint32_t slot, const ApplyAlias& apply) {
  Registry& r = R();
  const std::string who = "gpuos.switch('" + name + "', " + std::to_string(slot) + ")";
  if (slot > 1) throw std::invalid_argument(who + ": slot must be 0 or 1");
  std::lock_guard<std::mutex> sw(r.switch_mu);
  uint8_t table[256];
  uint32_t id, need, before;
  {
    std::unique_lock<std::mutex> lk(r.mu);
    id = find_op(r, name, who.c_str());
    OpEntry& e = r.ops[id];
    if (e.failed) throw CompileError(*e.failed);
    if (!e.slot[slot].installed)
      throw std::invalid_argument(who + ": nothing is installed in slot " + std::to_string(slot) + " of '" + name +
                                  "'. Fix: gpuos.install('" + name + "', source, slot=" + std::to_string(slot) +
                                  ") first.");
    if (!(e.builtin && slot == 0) && e.slot[slot].gen == 0) wait_change(r, lk, e.slot[slot].change);
    OpEntry& e2 = r.ops[id];
    if (!e2.used || !e2.slot[slot].installed)
      throw std::invalid_argument(who + ": slot " + std::to_string(slot) + " of '" + name + "' was removed");
    need = (e2.builtin && slot == 0) ? 0 : e2.slot[slot].gen;
    before = e2.active;
    for (uint32_t op = 0; op < 256; ++op) table[op] = r.ops[op].used && !r.ops[op].failed ? r.ops[op].active : 0;
    table[id] = (uint8_t)slot;
  }
  // While the switch is in progress the op counts as switched (no fused chain may contain it).
  if (slot != 0 || before != 0) g_op_active_slot[id].store(1);
  // Every runtime holds the code of the slot before its alias table may select it.
  apply(need, table);
  {
    std::lock_guard<std::mutex> lk(r.mu);
    OpEntry& e = r.ops[id];
    if (e.active != slot) {
      e.prev = e.active;
      e.active = (uint8_t)slot;
    }
    recompute_need(r, id);
  }
  return before;
}

uint32_t rollback_user_op(const std::string& name, const ApplyAlias& apply) {
  uint32_t prev, active;
  {
    Registry& r = R();
    std::lock_guard<std::mutex> lk(r.mu);
    const uint32_t id = find_op(r, name, ("gpuos.rollback('" + name + "')").c_str());
    prev = r.ops[id].prev;
    active = r.ops[id].active;
  }
  if (prev == active)
    throw std::invalid_argument("gpuos.rollback('" + name + "'): '" + name + "' has not been switched (slot " +
                                std::to_string(active) + " is active); nothing to roll back to");
  switch_user_op(name, prev, apply);
  return prev;
}

bool is_user_op_name(const std::string& name) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_name.find(name);
  return it != r.by_name.end() && !r.ops[it->second].builtin;
}

std::string user_op_name(uint32_t id) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  return id < kMaxOps && r.ops[id].used ? r.ops[id].name : "";
}

SubmitOp user_op_for_submit(const std::string& name, int64_t id_in) {
  Registry& r = R();
  std::unique_lock<std::mutex> lk(r.mu);
  uint32_t id;
  if (id_in >= 0) {
    if (id_in >= 256 || !r.ops[id_in].used || r.ops[id_in].builtin)
      throw std::invalid_argument("gpuos.submit: op id " + std::to_string(id_in) +
                                  " is neither a built-in op nor a registered injected op");
    id = (uint32_t)id_in;
  } else {
    id = find_op(r, name, "gpuos.submit");
    if (r.ops[id].builtin) throw std::invalid_argument("gpuos.submit: internal: '" + name + "' is built-in");
  }
  for (;;) {
    OpEntry& e = r.ops[id];
    if (!e.used) throw std::invalid_argument("gpuos.submit: op id " + std::to_string(id) + " was removed");
    if (e.failed) throw CompileError(*e.failed);
    if (e.deferred) {
      auto err = e.deferred;
      e.deferred.reset();
      throw CompileError(*err);
    }
    const Slot& s = e.slot[e.active];
    if (s.gen != 0) return SubmitOp{id, e.arity, e.name};
    // The op's code is still compiling (block=False): wait for its generation.
    const uint64_t c = s.change;
    r.cv.wait(lk, [&] { return r.changes[c].state != Change::kPending || r.stop; });
    if (r.stop) throw CudaError("gpuos: shutting down while a generation was compiling");
  }
}

std::vector<UserOpInfo> list_user_ops() {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  std::vector<UserOpInfo> v;
  for (uint32_t op = 0; op < 256; ++op) {
    const OpEntry& e = r.ops[op];
    if (!e.used) continue;
    UserOpInfo u;
    u.id = op;
    u.arity = e.arity;
    u.name = e.name;
    u.aten = e.aten;
    u.builtin = e.builtin;
    for (uint32_t s = 0; s < 2; ++s) {
      u.installed[s] = e.slot[s].installed;
      u.kind[s] = !e.slot[s].installed ? "" : (e.builtin && s == 0) ? "builtin" : e.slot[s].is_expr ? "expr" : "function";
      u.slot_gen[s] = e.slot[s].gen;
    }
    u.active = e.active;
    u.generation = g_op_need_gen[op].load();
    auto ch = r.changes.find(e.slot[e.active].change);
    const bool pending = !(e.builtin && e.active == 0) && ch != r.changes.end() && ch->second.state == Change::kPending;
    u.state = e.failed ? "failed" : pending ? "compiling" : "ready";
    if (e.failed) u.error = e.failed->what();
    v.push_back(u);
  }
  return v;
}

void current_alias_table(uint8_t table[256]) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  for (uint32_t op = 0; op < 256; ++op) table[op] = r.ops[op].used && !r.ops[op].failed ? r.ops[op].active : 0;
}

}  // namespace gpuos
