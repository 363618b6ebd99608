"""Operator injection without a GPU (issue #5): NVRTC checks every injected source, errors are typed and carry
the NVRTC log, the registry rejects bad names / arities / targets, and the generated worker source compiles.

Only sources NVRTC rejects are registered in this process: a valid registration would become part of every
later generation of the session (the GPU tests count their generations). Successful registrations run in child
processes."""

import os
import struct

import pytest

import gpuos
import gpuos_ext
from _helpers import describe, run_python

EM_CUDA = 190


def _cache_env(**extra):
    env = {"GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"]}
    env.update(extra)
    return env


def _names():
    return {o["name"] for o in gpuos.user_ops()}


def test_bad_expression_raises_compile_error_with_log(requires_nvrtc):
    with pytest.raises(gpuos.CompileError) as ei:
        gpuos.register_elementwise("inj_cpu_bad_expr", "a * undefined_q + 1.0f")
    e = ei.value
    assert isinstance(e, gpuos.GpuosError)
    assert "inj_cpu_bad_expr" in str(e)
    assert "undefined_q" in e.log and "error" in e.log, e.log
    # the error points into the user's text, not into generated code
    assert "gpuos_user:inj_cpu_bad_expr(1)" in e.log, e.log
    assert e.arch.startswith("compute_") and e.arch in e.options
    assert e.source_path and os.path.exists(e.source_path)
    assert "inj_cpu_bad_expr" not in _names()


def test_bad_expression_fails_fast_even_without_blocking(requires_nvrtc):
    with pytest.raises(gpuos.CompileError, match="inj_cpu_bad_nb"):
        gpuos.register_elementwise("inj_cpu_bad_nb", "a +* b", block=False)
    assert "inj_cpu_bad_nb" not in _names()


def test_bad_function_source_raises_compile_error_with_log(requires_nvrtc):
    src = "__device__ float inj_cpu_bad_fn(float a, float b) {\n  return a + zz_undefined;\n}"
    with pytest.raises(gpuos.CompileError) as ei:
        gpuos.register_op("inj_cpu_bad_fn", src)
    e = ei.value
    assert "inj_cpu_bad_fn" in str(e)
    assert "zz_undefined" in e.log and "gpuos_user:inj_cpu_bad_fn(2)" in e.log, e.log
    assert "inj_cpu_bad_fn" not in _names()


def test_install_bad_source_into_builtin_raises(requires_nvrtc):
    with pytest.raises(gpuos.CompileError) as ei:
        gpuos.install("mul", "a ** b", slot=1)
    assert "mul" in str(ei.value) and ei.value.log.strip()
    assert "mul" not in _names()  # nothing was installed


def test_function_source_must_define_the_op(requires_nvrtc):
    with pytest.raises(ValueError, match="does not define a function named 'inj_cpu_nofn'"):
        gpuos.register_op("inj_cpu_nofn", "__device__ float other(float a) { return a; }")


@pytest.mark.parametrize("arity", [0, 4, -2])
def test_bad_arity(arity):
    with pytest.raises(ValueError, match="arity"):
        gpuos.register_elementwise("inj_cpu_arity", "a", arity=arity)


def test_bad_arity_from_signature():
    src = "__device__ float inj_cpu_ar4(float a, float b, float c, float d) { return a + b + c + d; }"
    with pytest.raises(ValueError, match="arity 4"):
        gpuos.register_op("inj_cpu_ar4", src)


@pytest.mark.parametrize("name", ["", "1abc", "has space", "a-b", "x" * 65])
def test_bad_names(name):
    with pytest.raises(ValueError, match="C identifier"):
        gpuos.register_elementwise(name, "a + b")


@pytest.mark.parametrize("name", ["add", "gelu", "softmax"])
def test_builtin_names_are_taken(name):
    with pytest.raises(ValueError, match="built-in"):
        gpuos.register_elementwise(name, "a + b")


def test_empty_source():
    with pytest.raises(ValueError, match="empty"):
        gpuos.register_elementwise("inj_cpu_empty", "   ")


def test_install_targets():
    with pytest.raises(ValueError, match="reduction"):
        gpuos.install("sum", "a", slot=1)
    with pytest.raises(ValueError, match="slot 0 of the built-in"):
        gpuos.install("add", "a - b", slot=0)
    with pytest.raises(ValueError, match="slot must be 0 or 1"):
        gpuos.install("add", "a - b", slot=2)
    with pytest.raises(ValueError, match="no injected op named 'inj_cpu_none'"):
        gpuos.install("inj_cpu_none", "a", slot=1)
    with pytest.raises(ValueError, match="no injected op named 'inj_cpu_none'"):
        gpuos.switch("inj_cpu_none", 1)
    with pytest.raises(ValueError, match="no injected op named 'inj_cpu_none'"):
        gpuos.rollback("inj_cpu_none")


_REGISTRY_SCRIPT = r"""
import gpuos, gpuos_ext
ids = {}
ids["x"] = gpuos.register_elementwise("inj_child_x", "a * s0 + b", aten="aten::inj_child_x")
ids["f"] = gpuos.register_op("inj_child_f", "__device__ float inj_child_f(float a) { return a > 0.0f ? a : 0.0f; }")
assert ids == {"x": 64, "f": 65}, ids
for bad in (lambda: gpuos.register_elementwise("inj_child_x", "a"),   # duplicate name
            lambda: gpuos.register_op("inj_child_f", "__device__ float inj_child_f(float a) { return a; }"),
            lambda: gpuos.switch("inj_child_x", 1),                     # nothing in slot 1
            lambda: gpuos.rollback("inj_child_x")):                     # never switched
    try:
        bad()
    except ValueError as e:
        print("VALUEERROR", e)
    else:
        raise SystemExit("no ValueError")
gpuos.install("inj_child_x", "a * s0 - b", slot=1)
ops = {o["name"]: o for o in gpuos.user_ops()}
x, f = ops["inj_child_x"], ops["inj_child_f"]
assert x["id"] == 64 and x["arity"] == 2 and x["aten"] == "aten::inj_child_x" and x["slots"] == [0, 1], x
assert x["kinds"] == {0: "expr", 1: "expr"} and x["active_slot"] == 0 and x["state"] == "ready", x
assert f["arity"] == 1 and f["kinds"] == {0: "function"} and f["aten"] is None, f
info = gpuos.generation_info()
assert info["ready"] == info["latest"] >= 1 and not info["compiling"], info
assert all(g["state"] == "ready" for g in info["generations"]), info
assert "inj_child_x[1]" in info["generations"][-1]["ops"], info
hdr = gpuos_ext._generation_header()
assert "namespace gpuos_user_64_1" in hdr and "X(65, 0, 1," in hdr, hdr
print("COMPILES", gpuos_ext.stats()["jit_compiles"])
"""


def test_registry_in_child_and_warm_validation(requires_nvrtc):
    """Duplicate names, switch to an empty slot and rollback without a switch raise ValueError; user_ops()
    describes the ops; a second process with GPUOS_FORBID_COMPILE=1 registers the same ops (no GPU: only the
    quick source checks compile, and they come from the disk cache)."""
    env = _cache_env(CUDA_VISIBLE_DEVICES="")
    p = run_python(_REGISTRY_SCRIPT, env_extra=env, timeout=300)
    assert p.returncode == 0, describe(p)
    assert p.stdout.count("VALUEERROR") == 4, describe(p)
    p2 = run_python(_REGISTRY_SCRIPT, env_extra=dict(env, GPUOS_FORBID_COMPILE="1"), timeout=300)
    assert p2.returncode == 0, describe(p2)
    assert "COMPILES 0" in p2.stdout, describe(p2)


SPECS = [
    {"id": 64, "slot": 0, "arity": 2, "name": "inj_gen_axb", "source": "a * b + 1.0f", "expr": True},
    {"id": 64, "slot": 1, "arity": 2, "name": "inj_gen_axb", "source": "a * b - s0", "expr": True},
    {"id": 65, "slot": 0, "arity": 3, "name": "inj_gen_fn", "expr": False,
     "source": "__device__ float h(float x) { return m_tanh(x); }\n"
               "__device__ float inj_gen_fn(float a, float b, float c) { return h(a) * b + c; }"},
    {"id": 66, "slot": 0, "arity": 1, "name": "inj_gen_u", "source": "sigmoid_f(a) * s1", "expr": True},
    {"id": 2, "slot": 1, "arity": 2, "name": "mul", "expr": False,
     "source": "__device__ float mul(float a, float b) { return a * b + 1.0f; }"},
]


def test_generated_header_is_deterministic():
    a = gpuos_ext._generation_header_for(SPECS)
    b = gpuos_ext._generation_header_for(SPECS)
    assert a == b
    assert "X(2, 1, 2, ::gpuos_user_2_1::UserF_2_1)" in a
    assert '#line 1 "gpuos_user:inj_gen_axb/slot1"' in a


def test_generated_generation_compiles_for_sm90(requires_nvrtc):
    """The worker with a generated user_ops.h (expressions, functions with helpers, arity 1-3, a built-in's
    slot 1) compiles for sm_90: one full NVRTC compile (cached in the session's cache dir)."""
    cubin = gpuos_ext._jit_compile_generation("sm_90", gpuos_ext._generation_header_for(SPECS))
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == EM_CUDA
    assert b"gpuos_worker" in cubin


_BATCH_SCRIPT = r"""
import gpuos, gpuos_ext
with gpuos.batch_install():
    gpuos.register_elementwise("inj_b1", "a + 1.0f", arity=1)
    gpuos.register_elementwise("inj_b2", "a * b")
    gpuos.install("inj_b2", "a * b * 2.0f", slot=1)
    gpuos.install("gelu", "0.5f * a", slot=1)
info = gpuos.generation_info()
gens = info["generations"]
assert len(gens) == 2 and gens[1]["state"] == "ready", info             # one generation for all four changes
assert gens[1]["ops"] == ["gelu[1]", "inj_b1[0]", "inj_b2[0]", "inj_b2[1]"], gens[1]
gpuos.register_elementwise("inj_b3", "a - b", block=False)
assert gpuos.wait_generations() == 2
assert {o["name"]: o["state"] for o in gpuos.user_ops()}["inj_b3"] == "ready"
print("OK")
"""


def test_batch_install_makes_one_generation(requires_nvrtc):
    p = run_python(_BATCH_SCRIPT, env_extra=_cache_env(CUDA_VISIBLE_DEVICES=""), timeout=300)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)
