// csrc/inject/codegen.h -- CUDA C++ generated for injected operators: the per-(op, slot) functor blocks and the
// generation header device_src/user_ops.h that the worker includes. Text only (no NVRTC, no registry state).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gpuos {

// One installed op slot as the generator sees it.
struct OpSpec { uint32_t id, slot, arity; std::string name, source; bool is_expr; };
constexpr const char* kUserOpsPath = "device_src/user_ops.h";

size_t count_lines(const std::string& s);

// Appends text to `out` keeping `line` = the number of the next line of `out`.
struct Emitter {
  std::string out;
  size_t line = 1;
  void put(const std::string& s) {
    out += s;
    line += count_lines(s);
  }
  // `#line` back to the generated file after user text.
  void resync(const std::string& file) { put("#line " + std::to_string(line + 1) + " \"" + file + "\"\n"); }
};

// The per-(op, slot) block: namespace gpuos_user_<ns> { [source] struct UserF_<ns> { apply } }; user text is
// numbered from line 1 of "gpuos_user:<name>" so NVRTC errors point into the user's own lines.
void emit_op(Emitter& em, const std::string& ns, const std::string& name, uint32_t slot, uint32_t arity,
             const std::string& source, bool is_expr, const std::string& file);

// The generated device_src/user_ops.h for `specs` plus tier-2 code of fused-chain programs (`fused`: id ->
// code). Same op set -> same text (no generation number in it), so the same cache key in any process.
std::string header_of(const std::vector<OpSpec>& specs, uint32_t gen, const std::map<uint32_t, std::string>& fused);
// The source overrides (jit.h SourceOverrides) of a generation's whole compile: user_ops.h replaced by `header`;
// none for "" (generation 0: the base image, the embedded sources as they are -- jit_compile_arch's key).
inline std::map<std::string, std::string> whole_overrides(const std::string& header) {
  if (header.empty()) return {};
  return {{kUserOpsPath, header}};
}

// ---- linked generations (issue #18; device_src/linked.h, inject/linked.cpp) ----
// Entry point of one op slot's object: "gpuos_user_exec_<hash of name, slot, arity, kind and source>", so the
// object does not depend on the op id (the quick check at registration compiles the very object a generation
// links).
std::string op_object_symbol(const OpSpec& s);
// Source of that object: the op's block (numbered user lines, as emit_op) and its extern "C" entry point running
// ew_op<functor, arity> of device_src/elementwise.h. `file` is the object's main path.
std::string op_object_source(const OpSpec& s, const std::string& file);
// Source of tier-2 program `id`'s object: specialize_program's code and extern "C" gpuos_fused_exec_<id>.
std::string fused_object_source(uint32_t id, const std::string& code);
// The dispatch object: gpuos_linked_user_exec / gpuos_linked_fused_exec switching to the entry points above.
std::string dispatch_source(const std::vector<OpSpec>& specs, const std::vector<uint32_t>& fused_ids);

}  // namespace gpuos
