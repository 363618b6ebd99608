// csrc/sched/program.h -- capture and replay of programs (issue #17; the Python side is gpuos/programs.py).
//
// capture_begin attaches a Tape (core/tape.h) to the device's runtime: everything the scheduler lowers (and the
// explicit API records) from then on is also appended to it, and the keep-alive references of that work move to
// the capture instead of being released, so every storage the tape points at outlives the program. capture_end
// publishes what is still deferred, detaches the tape and hands it over with those references and the byte
// ranges of the outputs the scheduler allocated meanwhile (`fresh`: a program returns new buffers for those).
// replay stages a range of the tape again with moved pointers and publishes it: one flush, no Python per op.
#pragma once
#include <torch/extension.h>

#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tape.h"

namespace gpuos {

struct CapturedTape {
  int dev = 0;
  Tape tape;
  std::vector<PyObject*> hold;      // strong references (explicit-API work): dropped with the GIL held
  std::vector<at::Tensor> hold_t;   // tensors of the scheduler's lowered work
  std::vector<std::pair<uint64_t, uint64_t>> fresh;  // [lo, hi) of storages the scheduler allocated
  struct Image {
    TapeImage im;
    at::Tensor resident;  // device memory of im's descriptors and TensorRefs (core/tape.h), freed with the program
  };
  std::map<std::pair<size_t, size_t>, Image> images;  // per replayed range [b, e): built on its first replay
  CapturedTape() = default;
  CapturedTape(const CapturedTape&) = delete;
  CapturedTape& operator=(const CapturedTape&) = delete;
  ~CapturedTape();
  uint64_t held_bytes() const;  // bytes of the distinct storages held (inputs and parameters included)
};

// Start capturing on `dev` (the device's pending work is published first). Throws if a capture is active there.
void capture_begin(int dev);
// Tape entries so far (deferred work not yet lowered is not counted: it is lowered at its flush).
size_t capture_mark(int dev);
// Publish the device's deferred work into the tape and stop capturing. Also the way out of a failed capture.
std::shared_ptr<CapturedTape> capture_end(int dev);
bool capturing(int dev);
// The byte ranges of the storages the scheduler allocated for outputs so far in the device's capture.
std::vector<std::pair<uint64_t, uint64_t>> capture_fresh(int dev);
// Stage tape entries [b, e) with pointers in [lo, hi) moved by delta, then publish them on the current stream
// (the device's deferred work is published first: stream order). Counted under the flush cause "program".
void tape_replay(CapturedTape& c, size_t b, size_t e, const std::vector<std::tuple<uint64_t, uint64_t, int64_t>>& rel);

// A program's call without Python per tensor (Program.__call__'s fast path): positional tensor arguments only,
// one segment (no eager step), no aliasing between inputs. Guards (exact sizes, strides, dtype, device, address
// mod 16), one new buffer per fresh output range, the replay, and the outputs rebuilt. Built by
// gpuos/programs.py from the capture's plan; a call returns None (nothing done) when a guard differs, and the
// Python path then explains or takes the case (its guards also accept strides of size-1 dims).
struct ProgramCall {
  std::shared_ptr<CapturedTape> tape;
  size_t b = 0, e = 0;
  struct In {
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
    uint64_t mod16 = 0, lo = 0, hi = 0;  // [lo, hi): the captured input's byte span
  };
  std::vector<In> ins;
  struct Fresh {  // a storage the capture allocated: a new one per call (as a tensor like the output, or bytes)
    uint64_t lo = 0, hi = 0;
    bool direct = false;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype = at::kByte;
  };
  std::vector<Fresh> fresh;
  struct Out {  // kind 0: a value; 1: a view of input `idx`; 2: fresh `idx` itself; 3: a view of fresh `idx`
    int kind = 0, idx = 0;
    pybind11::object value;
    uint64_t ptr = 0;  // the captured view's data pointer
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype = at::kFloat;
  };
  std::vector<Out> outs;
  bool single = false;  // the result is outs[0] itself, else a tuple of outs
  // None when a guard differs (nothing was done); else the outputs.
  pybind11::object call(const pybind11::args& args);
};

}  // namespace gpuos
