"""Import, error types and input validation. Needs no GPU (runs everywhere)."""

import re

import pytest
import torch

import gpuos
import gpuos_ext

HAS_GPU = torch.cuda.is_available()

OPS = ["add", "sub", "mul", "div"]
API_FUNCS = [
    "init", "submit_add", "submit_sub", "submit_mul", "submit_div", "submit_many", "flush",
    "shutdown", "stats", "jit_compile", "submit_matmul", "nvrtc_version", "device_sources", "is_initialized",
    "link_info", "whole_build_info", "wait_whole_builds", "set_whole_build",
]
STATS_KEYS = ["submitted", "batches", "flushes", "worker_launches", "handovers", "jit_compiles",
              "cache_hits", "idle_adoptions", "busy_adoptions", "burst_launches", "early_publishes", "publications", "gated_launches",
              "joined_batches", "working_launches", "kicks"]


def _cpu(shape=(4, 4), dtype=torch.float32):
    return torch.randn(shape).to(dtype)


# ----------------------------------------------------------------------------- import / API surface

@pytest.mark.parametrize("name", API_FUNCS)
def test_api_functions_exist_in_both_modules(name):
    assert callable(getattr(gpuos_ext, name)), f"gpuos_ext.{name} missing"
    assert callable(getattr(gpuos, name)), f"gpuos.{name} missing (gpuos must re-export gpuos_ext)"


def test_exception_hierarchy():
    assert issubclass(gpuos.GpuosError, RuntimeError)
    assert issubclass(gpuos.CudaError, gpuos.GpuosError)
    assert issubclass(gpuos.CompileError, gpuos.GpuosError)
    assert not issubclass(gpuos.CudaError, gpuos.CompileError)
    assert not issubclass(gpuos.CompileError, gpuos.CudaError)


@pytest.mark.parametrize("name", ["GpuosError", "CudaError", "CompileError"])
def test_exceptions_are_the_same_objects_in_gpuos_ext(name):
    # If the extension defines its own classes, gpuos must re-export those very classes, otherwise
    # `except gpuos.CudaError` would not catch what the C++ code raises.
    if hasattr(gpuos_ext, name):
        assert getattr(gpuos_ext, name) is getattr(gpuos, name)


_INIT_SCRIPT = r"""
import gpuos, gpuos_ext
print("FRESH", gpuos_ext.is_initialized())
try:
    gpuos.init()
    print("INIT ok", gpuos_ext.is_initialized())
except gpuos.GpuosError:
    print("INIT failed", gpuos_ext.is_initialized())
gpuos.shutdown()
print("SHUTDOWN", gpuos_ext.is_initialized())
"""


def test_is_initialized_tracks_init_and_shutdown():
    """False in a fresh process; after init() True if it succeeded, still False if it raised (no GPU: a typed
    gpuos error); False again after shutdown()."""
    from _helpers import describe, run_python
    r = run_python(_INIT_SCRIPT, timeout=120)
    assert r.returncode == 0, describe(r)
    assert "FRESH False" in r.stdout, describe(r)
    assert "INIT ok True" in r.stdout or "INIT failed False" in r.stdout, describe(r)
    assert "SHUTDOWN False" in r.stdout, describe(r)


def test_stats_is_dict_of_ints():
    s = gpuos_ext.stats()
    assert isinstance(s, dict)
    for k in STATS_KEYS:
        assert k in s, f"stats() lacks key {k!r}: {sorted(s)}"
        assert isinstance(s[k], int) and not isinstance(s[k], bool), (k, s[k])
        assert s[k] >= 0, (k, s[k])


# ----------------------------------------------------------------------------- no GPU

@pytest.mark.skipif(HAS_GPU, reason="a CUDA GPU is present; this checks the no-GPU error path")
def test_init_without_gpu_raises_cuda_error():
    with pytest.raises(gpuos.CudaError) as ei:
        gpuos_ext.init()
    msg = str(ei.value)
    assert re.search(r"(?i)libcuda|no cuda device|cuda driver|cuInit|CUDA_ERROR|no device|driver",
                     msg), f"CudaError does not say why: {msg!r}"
    assert gpuos_ext.is_initialized() is False


@pytest.mark.skipif(HAS_GPU, reason="a CUDA GPU is present; this checks the no-GPU error path")
def test_init_without_gpu_fails_every_time_without_crashing():
    for _ in range(3):
        with pytest.raises(gpuos.CudaError):
            gpuos.init()
    assert gpuos.is_initialized() is False


# ----------------------------------------------------------------------------- bad inputs (CPU)

@pytest.mark.parametrize("op", OPS)
def test_cpu_tensors_raise_type_error_mentioning_cuda(op):
    fn = getattr(gpuos_ext, f"submit_{op}")
    with pytest.raises(TypeError, match="CUDA") as ei:
        fn(_cpu(), _cpu(), _cpu())
    assert f"submit_{op}" in str(ei.value), str(ei.value)


@pytest.mark.parametrize("op", OPS)
def test_cpu_tensors_via_gpuos_package(op):
    fn = getattr(gpuos, f"submit_{op}")
    with pytest.raises(TypeError, match="CUDA"):
        fn(_cpu(), _cpu(), _cpu())


@pytest.mark.parametrize("which", [0, 1, 2])
def test_single_cpu_tensor_among_args_raises_type_error(which):
    # Only one of the three is on the CPU; on a GPU machine the others are CUDA tensors.
    dev = "cuda" if HAS_GPU else "cpu"
    args = [torch.randn(4, 4, device=dev) for _ in range(3)]
    args[which] = torch.randn(4, 4)
    with pytest.raises(TypeError, match=r"(?i)cuda|device"):
        gpuos_ext.submit_add(*args)


def test_int64_raises_type_error():
    a = torch.arange(16, dtype=torch.int64).reshape(4, 4)
    with pytest.raises(TypeError, match=r"(?i)int64|\bLong\b|CUDA"):
        gpuos_ext.submit_add(a, a.clone(), torch.empty_like(a))


@pytest.mark.parametrize("bad_pos", [0, 1, 2])
@pytest.mark.parametrize("bad", [1.0, None, "x", [1.0, 2.0]], ids=["float", "None", "str", "list"])
def test_non_tensor_argument_raises_type_error(bad_pos, bad):
    args = [_cpu(), _cpu(), _cpu()]
    args[bad_pos] = bad
    with pytest.raises(TypeError, match="submit_add"):
        gpuos_ext.submit_add(*args)


def test_submit_many_list_length_mismatch_is_value_error_before_tensor_checks():
    # CPU tensors would fail the CUDA check; the length check must come first.
    a = [_cpu() for _ in range(3)]
    b = [_cpu() for _ in range(5)]
    out = [_cpu() for _ in range(3)]
    with pytest.raises(ValueError, match=r"(?i)len") as ei:
        gpuos_ext.submit_many("add", a, b, out)
    msg = str(ei.value)
    assert "3" in msg and "5" in msg, f"message should give both lengths: {msg!r}"
    assert "submit_many" in msg, msg


def test_submit_many_out_length_mismatch():
    a = [_cpu() for _ in range(2)]
    with pytest.raises(ValueError, match=r"(?i)len"):
        gpuos_ext.submit_many("mul", a, [_cpu() for _ in range(2)], [_cpu() for _ in range(7)])


@pytest.mark.parametrize("bad_op", ["pow", "relu", ""])
def test_submit_many_unknown_op_lists_valid_ops(bad_op):
    with pytest.raises(ValueError) as ei:
        gpuos_ext.submit_many(bad_op, [_cpu()], [_cpu()], [_cpu()])
    msg = str(ei.value)
    for op in OPS:
        assert op in msg, f"message should list valid op {op!r}: {msg!r}"


def test_submit_many_non_tensor_element_raises_type_error():
    with pytest.raises(TypeError):
        gpuos_ext.submit_many("add", [_cpu(), 3.0], [_cpu(), _cpu()], [_cpu(), _cpu()])


def test_submit_many_cpu_tensors_raise_type_error():
    with pytest.raises(TypeError, match="CUDA"):
        gpuos_ext.submit_many("sub", [_cpu()], [_cpu()], [_cpu()])


def test_failed_validation_does_not_initialise_runtime():
    if HAS_GPU:
        pytest.skip("runtime may legitimately be initialised by other tests on a GPU machine")
    with pytest.raises(TypeError):
        gpuos_ext.submit_add(_cpu(), _cpu(), _cpu())
    assert gpuos_ext.is_initialized() is False


def test_worker_trace_without_a_runtime_is_empty():
    import gpuos
    if gpuos.is_initialized():
        pytest.skip("a runtime is running in this process")
    assert gpuos.worker_trace() == {}
    assert "GPUOS_TRACE" in gpuos.worker_trace.__doc__


def test_hang_report_lists_threads_without_locks():
    """The hang report (tests' watchdog) names every native thread with its kernel wait and works with no runtime."""
    import threading
    import gpuos_ext
    ev = threading.Event()
    th = threading.Thread(target=ev.wait, name="waiter")
    th.start()
    try:
        rep = gpuos_ext._testing.hang_report()
    finally:
        ev.set()
        th.join()
    lines = [ln for ln in rep.splitlines() if ln.strip().startswith("thread ")]
    assert rep.startswith("gpuos hang report") and len(lines) >= 2, rep
    assert any("syscall 202" in ln for ln in lines), rep   # the waiting thread sits in futex()


def test_submit_matmul_rejects_cpu_tensors_and_non_tensors_by_name():
    import gpuos
    with pytest.raises(TypeError, match=r"submit_matmul: a must be a CUDA tensor.*\.cuda\(\)"):
        gpuos.submit_matmul(torch.randn(2, 3), torch.randn(3, 4), torch.empty(2, 4))
    with pytest.raises(TypeError, match="submit_matmul: argument 'bias' must be a torch.Tensor"):
        gpuos.submit_matmul(torch.randn(2, 3), torch.randn(3, 4), torch.empty(2, 4), bias=3)
    with pytest.raises(ValueError, match=r"'mm' is a matmul; use gpuos.submit_matmul"):
        gpuos.submit("mm", [torch.randn(2, 3)], torch.empty(2, 4))
