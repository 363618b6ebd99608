"""The host sampler (csrc/python/host_sampler.cpp, tools/host_profile.py): samples this thread's stack on a
wall-clock timer and names the frames from the modules' symbol tables. No GPU needed."""
import shutil
import time

import pytest
import torch

import gpuos_ext
from _helpers import load_tool

sample = load_tool("host_profile").sample


def _busy(seconds: float) -> None:
    a = torch.randn(96, 96)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, a)


def test_samples_name_the_frames_of_the_work():
    prof = sample(lambda: _busy(0.4), hz=2000)
    # 0.4 s at 2 kHz: ~800 expirations; a loaded machine delays some, none are lost to the buffer.
    assert 200 <= prof.samples <= 1000 and prof.dropped == 0, (prof.samples, prof.dropped)
    assert sum(prof.self_counts.values()) == prof.samples
    if shutil.which("nm") is None:
        pytest.skip("no nm: frames are not named")
    # torch.mm's C++ is on most stacks: the dispatcher's call of aten::mm (named from libtorch's symbols).
    mm = sum(c for n, c in prof.incl_counts.items() if "mm" in n and ("at::" in n or "torch::" in n))
    top = prof.incl_counts.most_common(1)[0][1]
    assert mm >= 0.3 * prof.samples, prof.report(20)
    assert top <= prof.samples
    assert "us/step" in prof.report(top=5, per=1)


def test_samples_past_the_buffer_are_counted_as_dropped():
    prof = sample(lambda: _busy(0.2), hz=2000, max_samples=10)
    assert prof.samples == 10 and prof.dropped > 0, (prof.samples, prof.dropped)


def test_misuse_raises_typed_errors_and_leaves_no_sampler_running():
    with pytest.raises(RuntimeError, match="not running"):
        gpuos_ext._host_sampler_stop()
    with pytest.raises(ValueError, match="hz must be in"):
        gpuos_ext._host_sampler_start(0.0)
    with pytest.raises(ValueError, match="max_samples"):
        gpuos_ext._host_sampler_start(100.0, 0)
    gpuos_ext._host_sampler_start(100.0)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            gpuos_ext._host_sampler_start(100.0)
    finally:
        gpuos_ext._host_sampler_stop()
    with pytest.raises(RuntimeError, match="not running"):
        gpuos_ext._host_sampler_stop()


def test_stop_from_another_thread_is_refused():
    import threading
    gpuos_ext._host_sampler_start(100.0)
    err = []
    t = threading.Thread(target=lambda: err.append(_stop_error()))
    t.start()
    t.join()
    gpuos_ext._host_sampler_stop()  # the starting thread may
    assert err and "thread that started it" in err[0], err


def _stop_error():
    try:
        gpuos_ext._host_sampler_stop()
    except RuntimeError as e:
        return str(e)
    return ""
