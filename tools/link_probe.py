#!/usr/bin/env python
"""What linking would cost an injection (issue #18), measured without a GPU: NVRTC and nvJitLink only.

    python tools/link_probe.py [--arch sm_90] [--reps 3]

Today a generation recompiles the whole worker (device_src/worker.cu and every op) with NVRTC. Issue #18 asks for
the worker compiled once as a relocatable object and each injected op compiled alone, a generation being a link
of the two. This probe times, for the real worker sources:
    full      the whole worker as today (NVRTC to a cubin, the options of csrc/jit/jit.cpp)
    worker    the same sources with -rdc=true plus a kernel that calls an extern op (done once per arch, cached)
    op        one injected op alone (-rdc=true): `a * s0 + b`, the README's register_elementwise example
    link      nvJitLink of the two relocatable cubins (the step each injection would pay)
and prints one JSON line (seconds, median of --reps; image sizes in bytes). Libraries: libnvrtc.so.13 and
libnvJitLink.so.13 from the nvidia wheels (pip install nvidia-cuda-nvrtc nvidia-nvjitlink) or CUDA_HOME.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONS = ["-std=c++17", "--device-as-default-execution-space", "-Xptxas", "-O1"]  # csrc/jit/jit.cpp
PROBE_KERNEL = r'''
extern "C" __device__ float gpuos_link_op(float a, float b, float c, float s0, float s1);
extern "C" __global__ void gpuos_link_probe(float* p) { p[0] = gpuos_link_op(p[1], p[2], p[3], p[4], p[5]); }
'''
OP_SOURCE = r'''
extern "C" __device__ float gpuos_link_op(float a, float b, float c, float s0, float s1) { return a * s0 + b; }
'''
NVJITLINK_INPUT_CUBIN = 1


def _find(lib: str) -> str:
    dirs = [os.path.join(p, "nvidia", "cu13", "lib") for p in sys.path if os.path.isdir(os.path.join(p, "nvidia"))]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        dirs += [os.path.join(home, "lib64"), os.path.join(home, "lib")]
    for d in dirs:
        hits = sorted(glob.glob(os.path.join(d, lib + "*")))
        if hits:
            return hits[0]
    raise SystemExit(f"link_probe: {lib} not found (pip install nvidia-cuda-nvrtc nvidia-nvjitlink, or set CUDA_HOME)")


class Nvrtc:
    def __init__(self):
        path = _find("libnvrtc.so.13")
        for b in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):  # NVRTC dlopens it
            ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(path)

    def compile(self, src: str, name: str, headers: dict, opts: list) -> bytes:
        lib, prog = self.lib, ctypes.c_void_p()
        names = (ctypes.c_char_p * len(headers))(*[k.encode() for k in headers])
        texts = (ctypes.c_char_p * len(headers))(*[v.encode() for v in headers.values()])
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), len(headers), texts, names) == 0
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), copts)
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise SystemExit(f"link_probe: NVRTC failed for {name}:\n{log.value.decode()[-3000:]}")
        size = ctypes.c_size_t()
        assert lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) == 0
        buf = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetCUBIN(prog, buf) == 0
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return buf.raw


class NvJitLink:
    def __init__(self):
        self.lib = ctypes.CDLL(_find("libnvJitLink.so.13"))
        f = {n: getattr(self.lib, f"__nvJitLink{n}_13_0") for n in
             ("Create", "AddData", "Complete", "GetLinkedCubinSize", "GetLinkedCubin", "GetErrorLogSize",
              "GetErrorLog", "Destroy")}
        self.f = f

    def link(self, arch: str, images: list) -> bytes:
        f, h = self.f, ctypes.c_void_p()
        opts = (ctypes.c_char_p * 1)(f"-arch={arch}".encode())
        assert f["Create"](ctypes.byref(h), 1, opts) == 0
        try:
            for i, img in enumerate(images):
                rc = f["AddData"](h, NVJITLINK_INPUT_CUBIN, img, ctypes.c_size_t(len(img)), f"in{i}".encode())
                assert rc == 0, f"nvJitLinkAddData: {rc}"
            if f["Complete"](h) != 0:
                size = ctypes.c_size_t()
                f["GetErrorLogSize"](h, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value + 1)
                f["GetErrorLog"](h, log)
                raise SystemExit(f"link_probe: nvJitLink failed:\n{log.value.decode()}")
            size = ctypes.c_size_t()
            f["GetLinkedCubinSize"](h, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            f["GetLinkedCubin"](h, buf)
            return buf.raw
        finally:
            f["Destroy"](ctypes.byref(h))


def device_sources() -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(REPO, "device_src", "*"))):
        with open(path) as fh:
            out["device_src/" + os.path.basename(path)] = fh.read()
    return out


def timed(fn, reps: int):
    times, res = [], None
    for _ in range(reps):
        t = time.perf_counter()
        res = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    nv, jl = Nvrtc(), NvJitLink()
    srcs = device_sources()
    main_name = "device_src/worker.cu"
    headers = {k: v for k, v in srcs.items() if k != main_name}
    arch_opt = [f"--gpu-architecture={a.arch}"] + OPTIONS
    full_s, full = timed(lambda: nv.compile(srcs[main_name], main_name, headers, arch_opt), a.reps)
    # Separately compiled device functions do not inherit the kernel's __launch_bounds__ register cap (ptxas
    # then refuses the link: callees at 131-222 registers under a 128-register entry): cap them all.
    rdc = ["-rdc=true", "--maxrregcount=128"]
    worker_s, worker = timed(lambda: nv.compile(srcs[main_name] + PROBE_KERNEL, main_name, headers, arch_opt + rdc), 1)
    op_s, op = timed(lambda: nv.compile(OP_SOURCE, "user_op.cu", {}, arch_opt + rdc), a.reps)
    link_s, linked = timed(lambda: jl.link(a.arch, [worker, op]), a.reps)
    if b"gpuos_link_probe" not in linked or b"gpuos_worker" not in linked:
        raise SystemExit("link_probe: the linked image lacks the worker or the probe kernel")
    print(json.dumps({"arch": a.arch, "full_s": round(full_s, 3), "worker_rdc_s": round(worker_s, 3),
                      "op_s": round(op_s, 4), "link_s": round(link_s, 4),
                      "injection_s": round(op_s + link_s, 4), "full_bytes": len(full),
                      "worker_rdc_bytes": len(worker), "op_bytes": len(op), "linked_bytes": len(linked)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
