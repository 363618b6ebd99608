// csrc/sched/outpool.h -- scheduler outputs: allocated from the input storage's allocator without the
// dispatcher, or served by the storage of a fused-away intermediate (never touched by the GPU).
#pragma once
#include <torch/extension.h>

#include "driver/cuda_api.h"

namespace gpuos {

// A new contiguous CUDA tensor of `shape` and `dt` on like's device, from like's storage allocator.
at::Tensor empty_like_device(const at::Tensor& like, at::IntArrayRef shape, at::ScalarType dt);
// Offer the storage of an elided intermediate recorded under stream `s` for reuse.
void pool_put(int dev, CUstream s, const c10::Storage& st);
// Empty the device's pool (shutdown).
void pool_clear(int dev);

}  // namespace gpuos
