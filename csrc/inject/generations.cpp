// csrc/inject/generations.cpp -- the generations of the registry: the background compile thread that turns the
// queued changes into a generation (one module: worker + every op slot + tier-2 chain code, linked from cached
// objects or compiled whole, inject/linked.h), and the queries the runtime and Python make of them. The op side of the registry is inject/registry.cpp.
#include <atomic>
#include <functional>

#include "inject/codegen.h"
#include "inject/linked.h"
#include "inject/registry_state.h"
#include "inject/whole.h"
#include "jit/jit.h"

namespace gpuos {
namespace {
std::function<void(uint32_t)> g_ready_hook;  // set at import, before the compile thread exists

// Generation g (its images in place) becomes ready and the newest: published before any op needs it
// (Runtime::ensure_generation reads g_latest_ready_gen), then the hook -- idle runtimes load the new module now,
// before anyone waiting sees a change done -- runs with r.mu (held by lk) released, and lk is retaken.
void set_ready(std::unique_lock<std::mutex>& lk, inject_detail::Gen& g) {
  g.state = inject_detail::Gen::kReady;
  g_latest_ready_gen.store(g.id);
  if (g_ready_hook) {
    lk.unlock();
    g_ready_hook(g.id);
    lk.lock();
  }
}
}  // namespace

namespace inject_detail {

void compile_loop() {
  Registry& r = R();
  std::unique_lock<std::mutex> lk(r.mu);
  for (;;) {
    r.cv.wait(lk, [&] { return r.stop || ((!r.dirty.empty() || r.spec_dirty) && r.hold == 0); });
    if (r.stop) break;
    auto g = std::make_shared<Gen>();
    g->id = (uint32_t)r.gens.size();
    const std::vector<OpSpec> specs = registry_specs(r);
    const std::map<uint32_t, std::string> fused = r.fused_specs;
    r.spec_dirty = false;
    g->header = header_of(specs, g->id, fused);
    g->specs = specs;
    g->fused = fused;
    for (const OpSpec& s : specs) g->ops.push_back(s.name + "[" + std::to_string(s.slot) + "]");
    for (const auto& kv : fused) g->ops.push_back("fused#" + std::to_string(kv.first));
    g->changes.swap(r.dirty);
    for (uint64_t c : g->changes) r.changes[c].gen = g->id;
    r.gens.push_back(g);
    r.compiling = true;
    const std::set<std::string> archs = r.archs;
    lk.unlock();
    std::map<std::string, std::shared_ptr<const std::string>> images;
    std::shared_ptr<CompileError> err;
    bool linked = false;  // some arch's image was linked
    GenBuild how = GenBuild::kWhole;
    try {
      for (const auto& arch : archs) {
        images[arch] = std::make_shared<const std::string>(build_generation_image(arch, specs, fused, g->header, &how));
        linked = linked || how == GenBuild::kLinked;
      }
    } catch (const CompileError& e) {
      err = std::make_shared<CompileError>("gpuos: generation " + std::to_string(g->id) + " (ops " +
                                               std::to_string(specs.size()) + ") failed to compile; the running "
                                               "generation stays. " + e.what(),
                                           e.log, e.arch, e.options, e.source_path);
    } catch (const std::exception& e) {
      err = std::make_shared<CompileError>(std::string("gpuos: generation ") + std::to_string(g->id) +
                                               " could not be compiled: " + e.what(),
                                           "", "", "", "");
    }
    lk.lock();
    if (!err) {
      g->images = std::move(images);
      g->built = gen_build_name(linked ? GenBuild::kLinked : how);
      set_ready(lk, *g);
      if (linked) request_whole_build(g->id);  // compiled whole in the background (inject/whole.h)
      for (uint64_t id : g->changes) {
        Change& c = r.changes[id];
        c.state = Change::kDone;
        Slot& s = r.ops[c.op].slot[c.slot];
        if (s.change == id) s.gen = g->id;
        recompute_need(r, c.op);
      }
    } else {
      g->state = Gen::kFailed;
      g->error = err;
      if (g->changes.empty())  // a generation only for fused-chain code: drop that code, never retry it
        for (const auto& kv : fused) {
          r.fused_specs.erase(kv.first);
          r.failed_specs.insert(kv.first);
        }
      for (auto it = g->changes.rbegin(); it != g->changes.rend(); ++it) {
        Change& c = r.changes[*it];
        c.state = Change::kFailed;
        c.error = err;
        revert_change(r, *it, c);
      }
      r.unreported.push_back(err);
    }
    r.compiling = false;
    r.cv.notify_all();
  }
}

bool whole_source(uint32_t gen, bool stale_ok, std::string* header, std::set<std::string>* archs) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.stop || gen >= r.gens.size() || r.gens[gen]->state != Gen::kReady) return false;
  if (!stale_ok && gen + 1 != r.gens.size()) return false;
  *header = r.gens[gen]->header;
  for (auto& kv : r.gens[gen]->images) archs->insert(kv.first);
  return true;
}

bool publish_whole(uint32_t gen, std::map<std::string, std::shared_ptr<const std::string>> images) {
  Registry& r = R();
  std::unique_lock<std::mutex> lk(r.mu);
  // Still the newest, and nothing queued or compiling that would follow it.
  if (r.stop || gen + 1 != r.gens.size() || !r.dirty.empty() || r.spec_dirty || r.compiling) return false;
  const Gen& src = *r.gens[gen];
  auto g = std::make_shared<Gen>();
  g->id = (uint32_t)r.gens.size();
  g->header = src.header;
  g->specs = src.specs;
  g->fused = src.fused;
  g->ops = src.ops;
  g->whole_of = gen;
  g->built = gen_build_name(GenBuild::kWhole);
  g->images = std::move(images);
  r.gens.push_back(g);
  set_ready(lk, *g);
  return true;
}

void ensure_thread(Registry& r) {
  if (!r.thread.joinable() && !r.stop) r.thread = std::thread(compile_loop);
}

}  // namespace inject_detail

using namespace inject_detail;

void set_generation_ready_hook(std::function<void(uint32_t)> hook) { g_ready_hook = std::move(hook); }

std::vector<GenerationInfo> list_generations() {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  std::vector<GenerationInfo> v;
  for (auto& g : r.gens) {
    GenerationInfo i;
    i.id = g->id;
    i.state = g->state == Gen::kReady ? "ready" : g->state == Gen::kFailed ? "failed" : "compiling";
    for (auto& kv : g->images) i.archs.push_back(kv.first);
    if (g->error) i.error = g->error->what();
    if (!g->load_error.empty()) i.error += (i.error.empty() ? "" : "\n") + g->load_error;
    i.ops = g->ops;
    i.whole_of = g->whole_of;
    i.built = g->built;
    v.push_back(i);
  }
  return v;
}

uint32_t wait_generations() {
  Registry& r = R();
  std::unique_lock<std::mutex> lk(r.mu);
  // A tier-2 request (spec_dirty) not yet taken by the compile thread is waited for too: without it a wait right
  // after the request that made it returned before its generation existed.
  r.cv.wait(lk, [&] { return r.stop || (((r.dirty.empty() && !r.spec_dirty) || r.hold > 0) && !r.compiling); });
  if (!r.unreported.empty()) {
    auto e = r.unreported.front();
    r.unreported.clear();
    throw CompileError(*e);
  }
  return g_latest_ready_gen.load();
}

void hold_generations(bool hold) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  r.hold += hold ? 1 : -1;
  if (r.hold < 0) r.hold = 0;
  r.cv.notify_all();
}

std::string current_generation_header() {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  return header_of(registry_specs(r), (uint32_t)r.gens.size(), r.fused_specs);
}

std::string generation_header_for(const std::vector<OpSpec>& specs, uint32_t gen,
                                  const std::map<uint32_t, std::string>& fused) {
  return header_of(specs, gen, fused);
}

void shutdown_generations() {
  shutdown_whole_builds();  // first: kills a running helper
  Registry& r = R();
  {
    std::lock_guard<std::mutex> lk(r.mu);
    r.stop = true;
    r.cv.notify_all();
  }
  if (r.thread.joinable()) r.thread.join();
}

void registry_add_arch(const std::string& arch) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  r.archs.insert(arch);
}

std::shared_ptr<const std::string> generation_image(uint32_t gen, const std::string& arch) {
  Registry& r = R();
  std::shared_ptr<Gen> g;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (gen >= r.gens.size() || r.gens[gen]->state != Gen::kReady)
      throw std::logic_error("gpuos internal error: generation " + std::to_string(gen) + " is not ready");
    auto it = r.gens[gen]->images.find(arch);
    if (it != r.gens[gen]->images.end()) return it->second;
    g = r.gens[gen];  // specs, fused and header never change once the generation exists
  }
  // An arch the generation was not compiled for (or generation 0: no ops; its whole compile is the embedded
  // sources as they are, the base image).
  GenBuild how = GenBuild::kWhole;
  auto image = std::make_shared<const std::string>(
      build_generation_image(arch, g->specs, g->fused, gen == 0 ? std::string() : g->header, &how));
  {
    std::lock_guard<std::mutex> lk(r.mu);
    r.gens[gen]->images[arch] = image;
    if (r.gens[gen]->built != "linked") r.gens[gen]->built = gen_build_name(how);
  }
  // Linked here (generation 0: a runtime's first image; or an arch new to the generation): its whole build
  // (whole.h: the base image's always runs; any other is stale unless its generation is still the newest).
  if (how == GenBuild::kLinked) request_whole_build(gen);
  return image;
}

void note_generation_load_error(uint32_t gen, const std::string& msg) {
  Registry& r = R();
  std::lock_guard<std::mutex> lk(r.mu);
  if (gen < r.gens.size()) r.gens[gen]->load_error = msg;
}

}  // namespace gpuos
