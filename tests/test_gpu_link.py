"""Linked generations on the GPU (issue #18): a generation = the cached worker object + small objects of its
injected ops / installed slots / tier-2 programs, linked with nvJitLink. Results equal those of the whole-compile
(inlined) layout bit for bit, for every dtype and layout; switch / rollback and tier-2 code work on linked
generations. Timings are the benchmark's job (benchmarks/bench_injection.py), not these tests'.

Each test runs in a child process: a fresh registry (the linked and whole layouts are compared in one process,
with gpuos_ext._set_link_override). The rest of the GPU suite runs on linked generations too when nvJitLink is
usable (the default): tests/test_gpu_injection.py's switch / rollback / in-place install under load included.
"""

import os

import pytest
import torch

import gpuos_ext
from _helpers import describe, run_python

pytestmark = pytest.mark.gpu


def _linked_here():
    return gpuos_ext.link_info()["mode"] == "linked"


def _env(**extra):
    env = {"GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"]}
    env.update(extra)
    return env


_PARITY = r"""
import torch, gpuos, gpuos_ext
gpuos.init()
li = gpuos_ext.link_info()
assert li["mode"] == "linked", li
st = gpuos_ext.stats()
assert st["linked_generations"] >= 1 and st["whole_generations"] == 0, st   # generation 0 is linked too
EXPR = "a * s0 + b * b - c"
FN = "__device__ float h(float x) { return x > 0.0f ? x : 0.1f * x; }\n" \
     "__device__ float {name}(float a, float b) { return h(a) * b; }"
g = torch.Generator(device="cuda").manual_seed(3)
ins = {}
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    ins[dtype] = [torch.randn(10_001, device="cuda", generator=g).to(dtype) for _ in range(3)]
xt = torch.randn(64, 96, device="cuda", generator=g).t()        # strided
yb = torch.randn(1, 64, device="cuda", generator=g)             # broadcast

def run(op, args, like, **sc):
    out = torch.full_like(like, float("nan"))
    gpuos.submit(op, args, out, **sc)
    gpuos.flush(sync=True)
    return out

def results(e, f):  # every case of ops e (arity 3 expression) and f (function with a helper)
    r = []
    for dtype, (x, y, z) in ins.items():
        r.append(run(e, [x, y, z], x, s0=0.75))
        r.append(run(f, [x, y], x))
    r.append(run(f, [xt, yb], torch.empty(96, 64, device="cuda")))
    r.append(run(f, [xt, 2.0], torch.empty(96, 64, device="cuda")))  # a Python number operand
    return r

dev = torch.cuda.current_device()
gpuos.register_elementwise("lnk_e", EXPR, arity=3)
gpuos.register_op("lnk_f", FN.replace("{name}", "lnk_f"))
linked = results("lnk_e", "lnk_f")           # from a linked generation (no whole one exists yet)
assert gpuos_ext.link_info()["whole_generations"] == 0
gpuos_ext._set_link_override(0)              # the inlined layout: one whole NVRTC compile
with gpuos.batch_install():
    gpuos.register_elementwise("whl_e", EXPR, arity=3)
    gpuos.register_op("whl_f", FN.replace("{name}", "whl_f"))
gpuos_ext._set_link_override(-1)
assert gpuos_ext.link_info()["whole_generations"] == 1, gpuos_ext.link_info()
whole = results("whl_e", "whl_f")
inlined_same_op = results("lnk_e", "lnk_f")  # the linked ops' code, now inlined in the whole generation
for i, (a, b, c) in enumerate(zip(linked, whole, inlined_same_op)):
    assert torch.equal(a, b) and torch.equal(a, c), (i, (a.float() - b.float()).abs().max())
x, y, z = ins[torch.float32]
torch.testing.assert_close(linked[0], x * 0.75 + y * y - z)
torch.testing.assert_close(linked[-2], torch.where(xt > 0, xt, 0.1 * xt) * yb)
torch.testing.assert_close(linked[-1], torch.where(xt > 0, xt, 0.1 * xt) * 2.0)

# slot 1 of an injected op and of a built-in, switched and rolled back on a linked generation again
gpuos.install("lnk_f", "a - b", slot=1)
gpuos.install("mul", "__device__ float mul(float a, float b) { return a * b + 2.0f; }", slot=1)
assert gpuos_ext.link_info()["linked_generations"] >= 4 and gpuos_ext.link_info()["whole_generations"] == 1
x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
gpuos.switch("lnk_f", 1)
assert torch.equal(run("lnk_f", [x, y], x), x - y)
gpuos.rollback("lnk_f")
assert torch.equal(run("lnk_f", [x, y], x), torch.where(x > 0, x, 0.1 * x) * y)
gpuos.switch("mul", 1)
out = torch.empty_like(x); gpuos.submit_mul(x, y, out); gpuos.flush(sync=True)
torch.testing.assert_close(out, x * y + 2.0)
gpuos.switch("mul", 0)
out = torch.empty_like(x); gpuos.submit_mul(x, y, out); gpuos.flush(sync=True)
torch.testing.assert_close(out, x * y)
print("OK", gpuos_ext.link_info())
"""


@pytest.mark.watchdog(240)
def test_linked_results_equal_the_inlined_layout():
    """Every dtype, strided / broadcast / scalar operands, functions with helpers, slot 1 of an injected and of
    a built-in op: a linked generation's results are bitwise those of a whole-compiled one."""
    if not _linked_here():
        pytest.skip(f"generations do not link here: {gpuos_ext.link_info()['reason']}")
    p = run_python(_PARITY, env_extra=_env(), timeout=220)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)


_TIER2 = r"""
import time, torch, gpuos, gpuos_ext
gpuos.init()
assert gpuos_ext.link_info()["mode"] == "linked"
a = torch.randn(3000, device="cuda"); b = torch.randn(3000, device="cuda", dtype=torch.float16)
def f(a, b):
    t = torch.tanh(a * b) * 0.3125
    return torch.clamp(t + b, -0.7, 0.9)
exp = f(a, b)
gpuos_ext.set_specialize_after(3)
for _ in range(3):
    with gpuos.scheduler_context(auto_flush_ms=0):
        got = f(a, b)
    torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-5)
gpuos_ext.wait_generations()
info = gpuos.generation_info()
spec = [g["id"] for g in info["generations"] if g["state"] == "ready" and any(o.startswith("fused#") for o in g["ops"])]
assert spec, info
gpuos_ext.yield_worker(); torch.cuda.synchronize()
for _ in range(2):
    with gpuos.scheduler_context(auto_flush_ms=0):
        got = f(a, b)
    torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-5)
assert gpuos.generation_info()["active"][torch.cuda.current_device()] >= spec[-1]
st = gpuos_ext.stats()
assert st["whole_generations"] == 0 and st["linked_generations"] >= 2, st
print("OK")
"""


@pytest.mark.watchdog(180)
def test_tier2_code_in_a_linked_generation():
    if not _linked_here():
        pytest.skip(f"generations do not link here: {gpuos_ext.link_info()['reason']}")
    p = run_python(_TIER2, env_extra=_env(), timeout=160)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)


_WHOLE = r"""
import torch, gpuos, gpuos_ext
gpuos.init()  # whole builds off until now: generation 0 asks for no base image build (test_cpu_whole.py has that)
gpuos_ext.set_whole_build(True)
assert gpuos_ext.link_info()["mode"] == "linked" and gpuos_ext.whole_build_info()["enabled"]
a = torch.randn(3000, device="cuda"); b = torch.randn(3000, device="cuda", dtype=torch.float16)
def f(a, b):  # SCALE makes the tier-2 code, so the whole image, unique to this run: the helper really compiles
    return torch.clamp(torch.tanh(a * b) * SCALE + b, -0.7, 0.9)
exp = f(a, b)
gpuos_ext.set_specialize_after(3)
for _ in range(3):
    with gpuos.scheduler_context(auto_flush_ms=0):
        got = f(a, b)
linked = gpuos_ext.wait_generations()
gpuos_ext.yield_worker(); torch.cuda.synchronize()
with gpuos.scheduler_context(auto_flush_ms=0):
    on_linked = f(a, b)
assert gpuos.generation_info()["active"][torch.cuda.current_device()] == linked
assert gpuos_ext.wait_whole_builds(240), gpuos_ext.whole_build_info()
w = gpuos_ext.whole_build_info()
assert (w["requested"], w["helpers"], w["published"], w["failed"]) == (1, 1, 1, 0), w
info = gpuos.generation_info()
assert info["latest"] == linked + 1 and info["generations"][-1]["whole_of"] == linked, info
gpuos_ext.yield_worker(); torch.cuda.synchronize()
with gpuos.scheduler_context(auto_flush_ms=0):
    on_whole = f(a, b)
assert gpuos.generation_info()["active"][torch.cuda.current_device()] == linked + 1
torch.testing.assert_close(on_whole, exp, rtol=1e-5, atol=1e-5)
assert torch.equal(on_whole, on_linked)  # the same code, compiled whole instead of linked
print("OK", w["last_s"])
"""


@pytest.mark.watchdog(300)
def test_whole_build_of_a_tier2_generation():
    """A linked tier-2 generation is compiled whole by a helper process in the background; its image becomes the
    next generation, the worker takes it over at its next start, and results stay bit-identical."""
    if not _linked_here():
        pytest.skip(f"generations do not link here: {gpuos_ext.link_info()['reason']}")
    import random
    code = f"SCALE = {random.uniform(0.2, 0.4)!r}\n" + _WHOLE
    p = run_python(code, env_extra=_env(GPUOS_WHOLE_BUILD="0"), timeout=280)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)


_FALLBACK = r"""
import torch, gpuos, gpuos_ext
gpuos.init()
li = gpuos_ext.link_info()
assert li["mode"] == "whole" and "/nonexistent" in li["reason"], li
gpuos.register_elementwise("fb_axpb", "a * s0 + b")
x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
out = torch.empty_like(x); gpuos.submit("fb_axpb", [x, y], out, s0=3.0); gpuos.flush(sync=True)
torch.testing.assert_close(out, x * 3.0 + y)
assert gpuos_ext.stats()["linked_generations"] == 0
print("OK")
"""


@pytest.mark.watchdog(240)
def test_missing_nvjitlink_runs_whole_generations():
    """GPUOS_NVJITLINK_PATH naming a missing file: the runtime logs why and compiles generations whole; injected
    ops still run (one whole compile per generation: slow, correct)."""
    p = run_python(_FALLBACK, env_extra=_env(GPUOS_NVJITLINK_PATH="/nonexistent/libnvJitLink.so.13",
                                             GPUOS_LOG="INFO"), timeout=220)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)
    assert "whole NVRTC compile" in p.stderr, describe(p)
