"""Linked generations without a GPU (issue #18): the worker compiled once as a relocatable object, each injected
op and tier-2 program compiled alone, a generation = nvJitLink of the cached objects.

Every registration runs in a child process (a valid registration would join every later generation of this
session). The children share the session's cache dir, so the worker object (~5-15 s of NVRTC on a small machine)
is compiled once per arch for the whole file."""

import os
import struct

import pytest

import gpuos_ext
from _helpers import describe, run_python, seeded_cache

EM_CUDA = 190


def _nvjitlink_usable():
    try:
        gpuos_ext.nvrtc_version()
    except Exception:
        return False
    return gpuos_ext.link_info()["mode"] == "linked"


requires_link = pytest.mark.skipif(not _nvjitlink_usable(),
                                   reason="generations do not link here: no usable nvJitLink (pip install "
                                          "nvidia-nvjitlink) or GPUOS_LINK=0")


def _env(cache=None, **extra):
    env = {"GPUOS_CACHE_DIR": str(cache or os.environ["GPUOS_CACHE_DIR"]), "CUDA_VISIBLE_DEVICES": ""}
    env.update(extra)
    return env


@pytest.fixture
def cold_cache(tmp_path):
    """A cache directory holding only the shared cache's worker objects: tests that count the small objects a
    generation compiles need them cold, whatever ran before with the shared cache (the GPU suite's injection and
    link tests compile the same op slots for sm_90); the worker object (seconds per arch) stays warm."""
    return seeded_cache(tmp_path / "cache", "worker-*")


def _is_cubin(b):
    return b[:4] == b"\x7fELF" and struct.unpack_from("<H", b, 18)[0] == EM_CUDA


def _op_id(name):
    return next(o["id"] for o in gpuos_ext.op_table() if o["name"] == name)


def _program(instrs, ninputs, out_reg):
    """Program bytes (device_src/interp.h): instrs = [(op id, dst, [srcs], s0, s1)]."""
    b = struct.pack("<IIII", len(instrs), ninputs, out_reg, 0)
    for op, dst, srcs, s0, s1 in instrs:
        s = list(srcs) + [0] * (3 - len(srcs))
        b += struct.pack("<BBBBBBBBff", op, dst, s[0], s[1], s[2], len(srcs), 0, 0, s0, s1)
    return b + b"\0" * (16 * 24 - 16 * len(instrs))


SPECS = [
    {"id": 64, "slot": 0, "arity": 2, "name": "lnk_axpb", "source": "a * s0 + b", "expr": True},
    {"id": 64, "slot": 1, "arity": 2, "name": "lnk_axpb", "source": "a * s0 - b", "expr": True},
    {"id": 65, "slot": 0, "arity": 3, "name": "lnk_fn", "expr": False,
     "source": "__device__ float h(float x) { return m_tanh(x); }\n"
               "__device__ float lnk_fn(float a, float b, float c) { return h(a) * b + c; }"},
    {"id": 2, "slot": 1, "arity": 2, "name": "mul", "expr": False,
     "source": "__device__ float mul(float a, float b) { return a * b + 1.0f; }"},
]


def test_link_info_and_settings():
    info = gpuos_ext.link_info()
    assert info["mode"] in ("linked", "whole")
    assert (info["reason"] == "") == (info["mode"] == "linked"), info
    cfg = gpuos_ext.config()
    assert "GPUOS_LINK" in cfg and "GPUOS_NVJITLINK_PATH" in cfg
    assert gpuos_ext.stats()["link_mode"] == info["mode"]


_IMAGE_SCRIPT = r"""
import struct, gpuos_ext
specs, fused = SPECS, [(7, PROG)]
def compiles():
    s = gpuos_ext.stats()
    return s["jit_compiles"], s["object_compiles"]
img = gpuos_ext._generation_image_for(arch, specs[:1])
c0 = compiles()
img2 = gpuos_ext._generation_image_for(arch, specs, fused)
c1 = compiles()
info = gpuos_ext.link_info()
assert info["mode"] == "linked" and info["linked_generations"] == 2 and info["whole_generations"] == 0, info
for im in (img, img2):
    assert im[:4] == b"\x7fELF" and struct.unpack_from("<H", im, 18)[0] == 190
    assert b"gpuos_worker" in im
assert b"gpuos_fused_exec_7" in img2 and b"gpuos_linked_user_exec" in img2
print("COMPILES", c0[0], c0[1], c1[0] - c0[0], c1[1] - c0[1])
"""


def _image_script(arch):
    prog = _program([(_op_id("add"), 2, [0, 1], 0.0, 0.0), (_op_id("mul"), 3, [2, 0], 0.0, 0.0)], 2, 3)
    return f"arch = {arch!r}\nSPECS = {SPECS!r}\nPROG = {prog!r}\n" + _IMAGE_SCRIPT


@requires_link
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_linked_generation_image(arch, cold_cache):
    """A generation links for sm_80 and sm_90 without a GPU; the second generation compiles only its new small
    objects (3 more op slots, 1 tier-2 program, its dispatch), never the worker; a warm process with
    GPUOS_FORBID_COMPILE=1 builds both generations from the cache (links only)."""
    p = run_python(_image_script(arch), env_extra=_env(cold_cache), timeout=600)
    assert p.returncode == 0, describe(p)
    first, first_obj, more, more_obj = map(int, p.stdout.split("COMPILES")[1].split()[:4])
    assert first == first_obj and first_obj in (2, 3), describe(p)  # [worker] + op + dispatch, all objects
    assert more == more_obj == 5, describe(p)                       # 3 op slots + 1 program + 1 dispatch
    warm = run_python(_image_script(arch), env_extra=_env(cold_cache, GPUOS_FORBID_COMPILE="1"), timeout=300)
    assert warm.returncode == 0, describe(warm)
    assert "COMPILES 0 0 0 0" in warm.stdout, describe(warm)


_REGISTRY_SCRIPT = r"""
import gpuos, gpuos_ext
gpuos_ext._registry_add_arch("sm_90")      # as a runtime on an H100 would: generations compile for sm_90
gpuos_ext.wait_generations()
img0 = gpuos_ext._generation_image(0, "sm_90")   # generation 0: the worker object + an empty dispatch
def objects():
    return gpuos_ext.stats()["object_compiles"]
n0 = objects()
gpuos.register_elementwise("lnk_reg_a", "a * s0 + b")
n1 = objects()
gpuos.register_op("lnk_reg_f", "__device__ float lnk_reg_f(float a) { return a > 0.0f ? a : 0.0f; }")
n2 = objects()
gpuos.install("lnk_reg_a", "a * s0 - b", slot=1)
n3 = objects()
try:
    gpuos.register_elementwise("lnk_reg_bad", "a +\n b * nope_q")
except gpuos.CompileError as e:
    assert e.arch == "sm_90", e.arch
    assert "gpuos_user:lnk_reg_bad(2)" in e.log and "nope_q" in e.log, e.log
    assert "lnk_reg_bad" in str(e)
    print("COMPILEERROR")
info = gpuos.generation_info()
gens = info["generations"]
assert [g["state"] for g in gens] == ["ready"] * 4, info
assert gens[-1]["ops"] == ["lnk_reg_a[0]", "lnk_reg_a[1]", "lnk_reg_f[0]"], gens[-1]
img = gpuos_ext._generation_image(3, "sm_90")
assert img[:4] == b"\x7fELF" and b"gpuos_worker" in img
li = gpuos_ext.link_info()
assert li["mode"] == "linked" and li["whole_generations"] == 0 and li["linked_generations"] == 4, li
print("OBJECTS", n1 - n0, n2 - n1, n3 - n2, "COMPILES", gpuos_ext.stats()["jit_compiles"])
"""


@requires_link
def test_registry_links_generations(cold_cache):
    """register / install with a known sm_90 arch: each change compiles only the op slot's object (at the quick
    check) and the generation's dispatch; a bad source raises CompileError with the user's lines numbered."""
    p = run_python(_REGISTRY_SCRIPT, env_extra=_env(cold_cache), timeout=600)
    assert p.returncode == 0, describe(p)
    assert "COMPILEERROR" in p.stdout, describe(p)
    assert "OBJECTS 2 2 2" in p.stdout, describe(p)


_WARM_SCRIPT = _REGISTRY_SCRIPT.split("try:")[0] + r"""
print("OBJECTS", n1 - n0, n2 - n1, n3 - n2, "COMPILES", gpuos_ext.stats()["jit_compiles"])
"""


@requires_link
def test_registry_warm_start_compiles_nothing():
    """The same registrations in a second process with GPUOS_FORBID_COMPILE=1: every object comes from the disk
    cache, generations only link."""
    p = run_python(_WARM_SCRIPT, env_extra=_env(), timeout=600)
    assert p.returncode == 0, describe(p)
    warm = run_python(_WARM_SCRIPT, env_extra=_env(GPUOS_FORBID_COMPILE="1"), timeout=300)
    assert warm.returncode == 0, describe(warm)
    assert "OBJECTS 0 0 0 COMPILES 0" in warm.stdout, describe(warm)


_FALLBACK_SCRIPT = r"""
import logging, sys, gpuos, gpuos_ext
from gpuos import _log
info = gpuos_ext.link_info()
assert info["mode"] == "whole", info
assert "/nonexistent/libnvJitLink.so" in info["reason"] and "nvidia-nvjitlink" in info["reason"], info
assert gpuos_ext.stats()["link_mode"] == "whole"
_log.note_link_mode(gpuos_ext)
img = gpuos_ext._generation_image_for("sm_90", [])   # generation 0's whole compile (the jit_compile key)
assert img[:4] == b"\x7fELF" and b"gpuos_worker" in img and b"gpuos_linked_user_exec" not in img
info = gpuos_ext.link_info()
assert info["whole_generations"] == 1 and info["linked_generations"] == 0, info
assert "/nonexistent/libnvJitLink.so" in info["last_fallback"], info
print("OK")
"""


def test_missing_nvjitlink_falls_back_to_whole_compiles(requires_nvrtc):
    """GPUOS_NVJITLINK_PATH naming a missing file: whole-compile mode, the reason logged and in link_info(),
    and the generation image is the whole worker (same cache key as gpuos_ext.jit_compile)."""
    p = run_python(_FALLBACK_SCRIPT,
                   env_extra=_env(GPUOS_NVJITLINK_PATH="/nonexistent/libnvJitLink.so", GPUOS_LOG="INFO"),
                   timeout=900)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)
    assert "whole NVRTC compile" in p.stderr and "/nonexistent/libnvJitLink.so" in p.stderr, describe(p)


def test_link_switched_off_by_setting(requires_nvrtc):
    script = ("import gpuos_ext\ni = gpuos_ext.link_info()\nassert i['mode'] == 'whole', i\n"
              "assert 'GPUOS_LINK=0' in i['reason'], i\n"
              "gpuos_ext._set_link_override(1)\nprint('MODE', gpuos_ext.link_info()['mode'])\n")
    p = run_python(script, env_extra=_env(GPUOS_LINK="0"), timeout=120)
    assert p.returncode == 0, describe(p)
    assert ("MODE linked" in p.stdout) == _nvjitlink_usable(), describe(p)


def test_a_library_without_the_entry_points_is_refused(requires_nvrtc):
    """GPUOS_NVJITLINK_PATH naming a library that is not nvJitLink (here libnvrtc itself): whole-compile mode, and
    the reason names the missing entry points."""
    script = ("import gpuos_ext\ni = gpuos_ext.link_info()\nassert i['mode'] == 'whole', i\n"
              "assert 'lacks entry points' in i['reason'] and 'nvJitLinkCreate' in i['reason'], i\nprint('OK')\n")
    p = run_python(script, env_extra=_env(GPUOS_NVJITLINK_PATH=gpuos_ext.nvrtc_path()), timeout=120)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)
