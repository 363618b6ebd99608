// csrc/inject/specialize.h -- fused-chain programs: process-wide ids, and tier 2 (hot programs get
// straight-line CUDA C++ in a later generation, compiled in the background).
#pragma once
#include <cstdint>
#include <string>

#include "device_src/interp.h"

namespace gpuos {

// Process-wide program ids (the same id on every device, so a generation's specialized code for id N is the
// code of program N everywhere). Returns -1 when kMaxPrograms are interned.
int32_t intern_program(const Program& p);
Program program_by_id(int32_t id);

// Tier 2: count one more run of program `id`; the use that reaches the threshold (GPUOS_SPECIALIZE_AFTER,
// default 64 sub-op groups; 0 = never) asks the registry for a generation with straight-line code for it
// (compiled on the background thread; the caller never waits for NVRTC).
void note_program_use(int32_t id);
void set_specialize_after(uint32_t n);
uint32_t specialize_after();
uint64_t specializations_requested();

// CUDA C++ for program `id`: namespace gpuos_fused_<id> { struct F { kInputs; eval(const float* x) } }.
std::string specialize_program(uint32_t id, const Program& p);

}  // namespace gpuos
