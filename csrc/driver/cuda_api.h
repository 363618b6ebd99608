// csrc/driver/cuda_api.h -- the CUDA driver API and NVRTC, loaded at run time (dlopen).
// The extension builds with g++ alone (no CUDA toolkit) and imports on machines without a GPU; calls that
// need the driver or NVRTC raise a typed error saying why they cannot run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpuos {

// ---- the subset of cuda.h we use (ABI-stable driver types) ----
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st; struct CUmod_st; struct CUfunc_st; struct CUstream_st; struct CUevent_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
// Errors after which the context is unusable (a kernel faulted): cuda.h's values.
constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700, CUDA_ERROR_LAUNCH_TIMEOUT = 702, CUDA_ERROR_ASSERT = 710,
                   CUDA_ERROR_HARDWARE_STACK_ERROR = 714, CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
                   CUDA_ERROR_MISALIGNED_ADDRESS = 716, CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
                   CUDA_ERROR_INVALID_PC = 718, CUDA_ERROR_LAUNCH_FAILED = 719;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122;
constexpr int CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3;
constexpr int CU_LIMIT_STACK_SIZE = 0;
constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x01;
constexpr unsigned CU_MEMHOSTALLOC_DEVICEMAP = 0x02;
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1;
constexpr unsigned CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2;
constexpr unsigned CU_STREAM_MEM_OP_WRITE_VALUE_64 = 5;
constexpr unsigned CU_STREAM_WAIT_VALUE_GEQ = 0x0;
constexpr unsigned CU_STREAM_WRITE_VALUE_DEFAULT = 0x0;

union CUstreamBatchMemOpParams {
  unsigned operation;
  struct {
    unsigned operation;
    CUdeviceptr address;
    union { uint32_t value; uint64_t value64; };
    unsigned flags;
    CUdeviceptr alias;
  } waitValue, writeValue;
  uint64_t pad[6];
};
static_assert(sizeof(CUstreamBatchMemOpParams) == 48, "CUstreamBatchMemOpParams ABI");
// A stream memop writing v to addr (default flags: a fence orders the stream's earlier writes before it).
inline CUstreamBatchMemOpParams memop_write64(CUdeviceptr addr, uint64_t v) {
  CUstreamBatchMemOpParams w{};
  w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  w.writeValue.address = addr;
  w.writeValue.value64 = v;
  w.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return w;
}
// A stream memop that waits until the 32-bit word at addr is >= v (wrap-aware).
inline CUstreamBatchMemOpParams wait_geq(CUdeviceptr addr, uint32_t v) {
  CUstreamBatchMemOpParams wt{};
  wt.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  wt.waitValue.address = addr;
  wt.waitValue.value = v;
  wt.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  return wt;
}

// ---- errors (mapped to gpuos.CudaError / gpuos.CompileError in tensor/errors.cpp) ----
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct CompileError : std::runtime_error {
  CompileError(const std::string& msg, std::string log_, std::string arch_, std::string options_,
               std::string source_path_)
      : std::runtime_error(msg), log(std::move(log_)), arch(std::move(arch_)), options(std::move(options_)),
        source_path(std::move(source_path_)) {}
  std::string log, arch, options, source_path;
};

// ---- driver entry points ----
template <class T>
using FnPtr = T;
struct Driver {
#define GPUOS_DRIVER_FNS(X)                                                                              \
  X(cuInit, "cuInit", CUresult (*)(unsigned))                                                           \
  X(cuDriverGetVersion, "cuDriverGetVersion", CUresult (*)(int*))                                       \
  X(cuDeviceGetCount, "cuDeviceGetCount", CUresult (*)(int*))                                           \
  X(cuDeviceGet, "cuDeviceGet", CUresult (*)(CUdevice*, int))                                           \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult (*)(int*, int, CUdevice))                    \
  X(cuDeviceGetName, "cuDeviceGetName", CUresult (*)(char*, int, CUdevice))                             \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult (*)(CUcontext*, CUdevice))           \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult (*)(CUdevice))                  \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult (*)(CUcontext))                                        \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", CUresult (*)(CUcontext*))                                       \
  X(cuModuleLoadData, "cuModuleLoadData", CUresult (*)(CUmodule*, const void*))                         \
  X(cuModuleUnload, "cuModuleUnload", CUresult (*)(CUmodule))                                           \
  X(cuModuleGetFunction, "cuModuleGetFunction", CUresult (*)(CUfunction*, CUmodule, const char*))       \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", CUresult (*)(int*, int, CUfunction))                      \
  X(cuCtxGetLimit, "cuCtxGetLimit", CUresult (*)(size_t*, int))                                         \
  X(cuCtxSetLimit, "cuCtxSetLimit", CUresult (*)(int, size_t))                                          \
  X(cuLaunchKernel, "cuLaunchKernel",                                                                   \
    CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,       \
                 CUstream, void**, void**))                                                             \
  X(cuMemAlloc, "cuMemAlloc_v2", CUresult (*)(CUdeviceptr*, size_t))                                    \
  X(cuMemFree, "cuMemFree_v2", CUresult (*)(CUdeviceptr))                                               \
  X(cuMemHostAlloc, "cuMemHostAlloc", CUresult (*)(void**, size_t, unsigned))                           \
  X(cuMemFreeHost, "cuMemFreeHost", CUresult (*)(void*))                                                \
  X(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", CUresult (*)(CUdeviceptr*, void*, unsigned)) \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult (*)(CUdeviceptr, const void*, size_t, CUstream))  \
  X(cuMemsetD8Async, "cuMemsetD8Async", CUresult (*)(CUdeviceptr, unsigned char, size_t, CUstream))     \
  X(cuStreamCreate, "cuStreamCreate", CUresult (*)(CUstream*, unsigned))                                \
  X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult (*)(CUstream))                                      \
  X(cuStreamQuery, "cuStreamQuery", CUresult (*)(CUstream))                                             \
  X(cuModuleGetLoadingMode, "cuModuleGetLoadingMode", CUresult (*)(int*))                               \
  X(cuStreamBatchMemOp, "cuStreamBatchMemOp_v2",                                                        \
    CUresult (*)(CUstream, unsigned, CUstreamBatchMemOpParams*, unsigned))                              \
  X(cuGetErrorName, "cuGetErrorName", CUresult (*)(CUresult, const char**))                             \
  X(cuGetErrorString, "cuGetErrorString", CUresult (*)(CUresult, const char**))
#define GPUOS_DECL(name, sym, type) FnPtr<type> name = nullptr;
  GPUOS_DRIVER_FNS(GPUOS_DECL)
#undef GPUOS_DECL
};

// The driver, loaded and cuInit-ed once; throws CudaError naming what is missing.
const Driver& driver();
// "cuFoo(...) failed: CUDA_ERROR_X: text" -> CudaError.
// Throws CudaError naming the call and the error; a sticky error (is_sticky) also says the context is lost.
[[noreturn]] void throw_cuda(CUresult r, const char* call, const char* file, int line);
bool is_sticky(CUresult r);

#define GPUOS_CU(call)                                                        \
  do {                                                                        \
    ::gpuos::CUresult gpuos_r_ = (call);                                      \
    if (gpuos_r_ != ::gpuos::CUDA_SUCCESS) ::gpuos::throw_cuda(gpuos_r_, #call, __FILE__, __LINE__); \
  } while (0)

// ---- NVRTC ----
using nvrtcResult = int;
struct _nvrtcProgram;
using nvrtcProgram = _nvrtcProgram*;
struct Nvrtc {
#define GPUOS_NVRTC_FNS(X)                                                                               \
  X(nvrtcVersion, "nvrtcVersion", nvrtcResult (*)(int*, int*))                                          \
  X(nvrtcGetErrorString, "nvrtcGetErrorString", const char* (*)(nvrtcResult))                           \
  X(nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs", nvrtcResult (*)(int*))                      \
  X(nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs", nvrtcResult (*)(int*))                            \
  X(nvrtcCreateProgram, "nvrtcCreateProgram",                                                           \
    nvrtcResult (*)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*)) \
  X(nvrtcDestroyProgram, "nvrtcDestroyProgram", nvrtcResult (*)(nvrtcProgram*))                         \
  X(nvrtcCompileProgram, "nvrtcCompileProgram", nvrtcResult (*)(nvrtcProgram, int, const char* const*)) \
  X(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", nvrtcResult (*)(nvrtcProgram, size_t*))           \
  X(nvrtcGetProgramLog, "nvrtcGetProgramLog", nvrtcResult (*)(nvrtcProgram, char*))                     \
  X(nvrtcGetCUBINSize, "nvrtcGetCUBINSize", nvrtcResult (*)(nvrtcProgram, size_t*))                     \
  X(nvrtcGetCUBIN, "nvrtcGetCUBIN", nvrtcResult (*)(nvrtcProgram, char*))                               \
  X(nvrtcGetPTXSize, "nvrtcGetPTXSize", nvrtcResult (*)(nvrtcProgram, size_t*))                         \
  X(nvrtcGetPTX, "nvrtcGetPTX", nvrtcResult (*)(nvrtcProgram, char*))
#define GPUOS_DECL(name, sym, type) FnPtr<type> name = nullptr;
  GPUOS_NVRTC_FNS(GPUOS_DECL)
#undef GPUOS_DECL
  std::string path;  // the library that was loaded
};

// NVRTC, loaded once from GPUOS_NVRTC_PATH, CUDA_HOME, the nvidia-cuda-nvrtc wheel, or the loader path.
// `search_dirs` are extra directories (from Python: the nvidia wheels' lib dirs, also searched for
// libnvJitLink). Throws CudaError.
const Nvrtc& nvrtc();
void set_nvrtc_search_dirs(std::vector<std::string> dirs);

// ---- nvJitLink (linked generations, issue #18) ----
// The entry points are versioned in the library (`__nvJitLinkCreate_13_0`, what nvJitLink.h's macros name);
// they are looked up for the library's own version (nvJitLinkVersion), then unversioned.
struct nvJitLink;
using nvJitLinkHandle = nvJitLink*;
constexpr int NVJITLINK_INPUT_CUBIN = 1;  // nvJitLink.h nvJitLinkInputType
struct NvJitLinkLib {
#define GPUOS_NVJITLINK_FNS(X)                                                                 \
  X(Create, int (*)(nvJitLinkHandle*, uint32_t, const char**))                                 \
  X(Destroy, int (*)(nvJitLinkHandle*))                                                        \
  X(AddData, int (*)(nvJitLinkHandle, int, const void*, size_t, const char*))                  \
  X(Complete, int (*)(nvJitLinkHandle))                                                        \
  X(GetLinkedCubinSize, int (*)(nvJitLinkHandle, size_t*))                                     \
  X(GetLinkedCubin, int (*)(nvJitLinkHandle, void*))                                           \
  X(GetErrorLogSize, int (*)(nvJitLinkHandle, size_t*))                                        \
  X(GetErrorLog, int (*)(nvJitLinkHandle, char*))
#define GPUOS_DECL(name, type) FnPtr<type> name = nullptr;
  GPUOS_NVJITLINK_FNS(GPUOS_DECL)
#undef GPUOS_DECL
  std::string path;       // the library that was loaded
  unsigned major = 0, minor = 0;
  std::string error;      // why it cannot be used ("" = usable): not found, no entry points
};
// nvJitLink, loaded once from GPUOS_NVJITLINK_PATH (only that file when set), CUDA_HOME, the nvidia-nvjitlink
// wheel (the search dirs above), or the loader path. Never throws: `error` says why it is unusable.
const NvJitLinkLib& nvjitlink();

}  // namespace gpuos
