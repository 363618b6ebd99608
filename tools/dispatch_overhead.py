#!/usr/bin/env python
"""What intercepting every aten op costs, per op, by the way it is intercepted (issue #16; forty-seventh session).

The live scheduler is a TorchDispatchMode: every op of a model step reaches Python (or, for its fast path, C++ bound
as the mode's __torch_dispatch__) with its arguments as Python objects. On Llama-small decode a do-nothing dispatch
mode alone ran at 0.50-0.55x of eager (H200, DEVELOPING *Verification state*), so no recording speed can bring the
live path to eager through a mode. This probe measures the alternatives side by side on the same loops:

  eager          no interception
  python_mode    a TorchDispatchMode whose __torch_dispatch__ returns func(*args, **kwargs)
  cpp_bound_mode the same mode with __torch_dispatch__ a C++ function bound to the instance (as the scheduler binds
                 sched_dispatch): the mode machinery (boxing, Python objects, the call) without a Python frame
  cpp_fallback   a C++ boxed fallback on a dispatch key included in thread-local state (no Python per op): it
                 redispatches below itself with the key excluded, so it sees each top-level op once
  cpp_inspect    the same fallback also walking the op's arguments (each tensor's device, dtype, numel, sizes and
                 strides: what a recorder must read to classify an op)
  gpuos_sched    gpuos.scheduler_context() (its exit flushes), and gpuos_sched_nocfront without its dispatcher front
                 (csrc/sched/cfront.h); on the CPU every op passes through both: the front's cost when it takes
                 nothing (DO_GPUOS=0: leave them out)

The key is c10's TESTING_ONLY_GenericMode (above autograd; no kernels of its own): fine for a measurement, not for
a product (DEVELOPING *Next* 8 says what a product would need). Loops: 1,000 small adds, and four Llama-like decoder
layers at hidden 256, batch 1 (hand-written RMSNorm, q / k / v / o, attention over 32 cached positions, SiLU MLP).
Reports us per step and the added us per intercepted op against eager. Runs on CUDA if present, else on the CPU
(the interception cost is host time either way).

    python tools/dispatch_overhead.py            # env DO_REPS (default 50)
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_CPP = r"""
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <atomic>

static std::atomic<long long> g_calls{0};
static std::atomic<long long> g_sink{0};
constexpr c10::DispatchKey kKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
static bool g_inspect = false;

static void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (g_inspect) {  // what a recorder reads first: every tensor argument's device, dtype, size and layout
    const auto n = op.schema().arguments().size();
    long long acc = 0;
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        acc += t.numel() + (long long)t.scalar_type() + (t.is_cuda() ? 1 : 0) + t.dim();
        for (int64_t d = 0; d < t.dim(); ++d) acc += t.sizes()[d] ^ t.strides()[d];
      } else if (v.isDouble()) {
        acc += (long long)v.toDouble();
      }
    }
    g_sink.fetch_add(acc, std::memory_order_relaxed);
  }
  c10::impl::ExcludeDispatchKeyGuard no_reentry(kKey);  // nested calls of a composite op are not seen again
  op.redispatchBoxed(ks.remove(kKey), stack);
}

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&intercept>());
}

void set_enabled(bool on, bool inspect) {
  g_inspect = inspect;
  c10::impl::tls_set_dispatch_key_included(kKey, on);
}
long long calls() { return g_calls.exchange(0); }

// A TorchDispatchMode's __torch_dispatch__ written in C++ (as gpuos binds sched_dispatch): (mode, func, types,
// args=(), kwargs=None) -> func(*args, **kwargs), no Python frame of its own.
static PyObject* bound_dispatch(PyObject*, PyObject* const* a, Py_ssize_t n) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  PyObject* args = n > 3 ? a[3] : nullptr;
  PyObject* kwargs = n > 4 && a[4] != Py_None ? a[4] : nullptr;
  if (!args) {
    PyObject* empty = PyTuple_New(0);
    PyObject* r = PyObject_Call(a[1], empty, kwargs);
    Py_DECREF(empty);
    return r;
  }
  return PyObject_Call(a[1], args, kwargs);
}
static PyMethodDef g_bound_def = {"bound_dispatch", (PyCFunction)(void (*)(void))bound_dispatch, METH_FASTCALL,
                                  "(mode, func, types, args=(), kwargs=None)"};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.add_object("bound_dispatch", py::reinterpret_steal<py::object>(PyCFunction_New(&g_bound_def, nullptr)));
  m.def("set_enabled", &set_enabled);
  m.def("calls", &calls);
}
"""


def _ext():
    from torch.utils.cpp_extension import load_inline
    return load_inline("gpuos_dispatch_overhead", _CPP, extra_cflags=["-O2"],
                       build_directory=_build_dir(), verbose=False)


def _build_dir():
    d = os.path.join(os.environ.get("GPUOS_CACHE_DIR", "/tmp/gpuos-cache"), "dispatch_overhead")
    os.makedirs(d, exist_ok=True)
    return d


class _NoopMode(TorchDispatchMode):
    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        _NoopMode.calls += 1
        return func(*args, **(kwargs or {}))


class _BoundMode(TorchDispatchMode):
    """The mode machinery without a Python frame per op: __torch_dispatch__ is a C++ function bound to the instance
    (types.MethodType), as gpuos.scheduler.GpuosScheduler binds gpuos_ext.sched_dispatch."""

    def __init__(self, fn):
        super().__init__()
        self.__torch_dispatch__ = types.MethodType(fn, self)


def _adds(dev):
    x = torch.randn(16, 256, device=dev)

    def step():
        y = x
        for _ in range(1000):
            y = y + 1.0
        return y
    return step


def _llama_layers(dev, hidden=256, heads=4, ctx=32, layers=4, inter=688):
    g = torch.Generator(device="cpu").manual_seed(0)
    w = lambda *s: (torch.randn(*s, generator=g) / s[-1] ** 0.5).to(dev)  # noqa: E731
    params = [dict(n1=torch.ones(hidden, device=dev), q=w(hidden, hidden), k=w(hidden, hidden), v=w(hidden, hidden),
                   o=w(hidden, hidden), n2=torch.ones(hidden, device=dev), gate=w(inter, hidden), up=w(inter, hidden),
                   down=w(hidden, inter), kc=torch.randn(1, heads, ctx, hidden // heads, generator=g).to(dev),
                   vc=torch.randn(1, heads, ctx, hidden // heads, generator=g).to(dev)) for _ in range(layers)]
    x0 = torch.randn(1, 1, hidden, generator=g).to(dev)
    hd = hidden // heads

    def rms(x, wt):
        v = x.pow(2).mean(-1, keepdim=True)
        return wt * (x * torch.rsqrt(v + 1e-6))

    def step():
        x = x0
        for p in params:
            h = rms(x, p["n1"])
            q = torch.nn.functional.linear(h, p["q"]).view(1, 1, heads, hd).transpose(1, 2)
            k = torch.nn.functional.linear(h, p["k"]).view(1, 1, heads, hd).transpose(1, 2)
            v = torch.nn.functional.linear(h, p["v"]).view(1, 1, heads, hd).transpose(1, 2)
            ks = torch.cat([p["kc"], k], dim=2)
            vs = torch.cat([p["vc"], v], dim=2)
            a = torch.softmax(q @ ks.transpose(-1, -2) * hd ** -0.5, dim=-1) @ vs
            x = x + torch.nn.functional.linear(a.transpose(1, 2).reshape(1, 1, hidden), p["o"])
            h = rms(x, p["n2"])
            m = torch.nn.functional.silu(torch.nn.functional.linear(h, p["gate"])) * torch.nn.functional.linear(h, p["up"])
            x = x + torch.nn.functional.linear(m, p["down"])
        return x
    return step


def _time_all(step, configs, reps, sync):
    """Median us per step of each config, the configs interleaved rep by rep (a host that drifts moves them all)."""
    ts = {name: [] for name in configs}
    for _ in range(3):
        for enter in configs.values():
            with enter():
                step()
    sync()
    for _ in range(reps):
        for name, enter in configs.items():
            with enter():
                t = time.perf_counter()
                step()
                sync()
                ts[name].append((time.perf_counter() - t) * 1e6)
    return {name: statistics.median(v) for name, v in ts.items()}


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    reps = int(os.environ.get("DO_REPS", "50"))
    t = time.perf_counter()
    ext = _ext()
    print(json.dumps({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
                      "build_s": round(time.perf_counter() - t, 1)}), flush=True)
    class _Cpp:
        def __init__(self, inspect):
            self.inspect = inspect

        def __enter__(self):
            ext.set_enabled(True, self.inspect)

        def __exit__(self, *exc):
            ext.set_enabled(False, False)

    configs = {"eager": contextlib.nullcontext, "python_mode": _NoopMode,
               "cpp_bound_mode": lambda: _BoundMode(ext.bound_dispatch), "cpp_fallback": lambda: _Cpp(False),
               "cpp_inspect": lambda: _Cpp(True)}
    if os.environ.get("DO_GPUOS", "1") != "0":  # the scheduler itself, with and without its dispatcher front (its
        import gpuos  # exit flushes: on CUDA a step's whole recorded and published work; on the CPU every op passes
        configs |= {"gpuos_sched": lambda: gpuos.scheduler_context(auto_flush_ms=0),  # through: the front's tax)
                    "gpuos_sched_nocfront": lambda: gpuos.scheduler_context(auto_flush_ms=0, cfront=False)}
    with torch.inference_mode():
        for name, make in (("adds", _adds), ("llama4x256", _llama_layers)):
            step = make(dev)
            ref = step()
            row = {"loop": name}
            _NoopMode.calls = 0
            with _NoopMode():
                out = step()
            row["ops"] = {"python_mode": _NoopMode.calls}  # each config's intercepted ops per step, and its result
            torch.testing.assert_close(out, ref)
            for cfg in ("cpp_bound_mode", "cpp_fallback", "cpp_inspect"):
                ext.calls()
                with configs[cfg]():
                    out = step()
                row["ops"][cfg] = ext.calls()
                torch.testing.assert_close(out, ref)
            for cfg in ("gpuos_sched", "gpuos_sched_nocfront"):
                if cfg in configs:
                    with configs[cfg]():
                        out = step()
                    torch.testing.assert_close(out, ref)
                    row["ops"][cfg] = row["ops"]["python_mode"]  # (the aten ops a mode sees per step)
            us = _time_all(step, configs, reps, sync)
            row["us_per_step"] = {k: round(v, 1) for k, v in us.items()}
            row["added_us_per_op"] = {k: round((us[k] - us["eager"]) / max(1, row["ops"][k]), 3) for k in row["ops"]}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
