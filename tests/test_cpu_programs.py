"""Programs (issue #17) without a GPU: the relocation rule of a replay (csrc/core/tape.h Reloc), the merge of
moved ranges, and the errors a user meets on a machine without CUDA."""
import pytest
import torch

import gpuos
import gpuos_ext
from gpuos.programs import Program, _span


def test_reloc_moves_only_pointers_inside_ranges():
    ranges = [(1000, 1100, 5000), (2000, 2064, -1000), (500, 600, 0)]
    ptrs = [0, 999, 1000, 1050, 1099, 1100, 2000, 2063, 2064, 550]
    got = gpuos_ext._testing.reloc(ranges, ptrs)
    assert got == [0, 999, 6000, 6050, 6099, 1100, 1000, 1063, 2064, 550]


def test_reloc_unsorted_ranges():
    got = gpuos_ext._testing.reloc([(300, 400, 1), (100, 200, 2)], [150, 350, 250])
    assert got == [152, 351, 250]


def test_merge_of_moved_ranges():
    assert Program._merge([(10, 20, 5), (15, 30, 5), (40, 50, 1)]) == [(10, 30, 5), (40, 50, 1)]
    assert Program._merge([(5, 5, 3), (1, 2, 0)]) == [(1, 2, 0)]  # empty ranges dropped
    with pytest.raises(gpuos.GuardError, match="overlapped"):
        Program._merge([(10, 20, 5), (15, 30, 6)])


def test_span_of_views():
    x = torch.zeros(4, 6)
    lo, hi = _span(x)
    assert hi - lo == 24 * 4
    lo2, hi2 = _span(x[:, 1:3])
    assert lo2 == lo + 4 and hi2 == lo + (3 * 6 + 2 + 1) * 4
    assert _span(torch.zeros(0))[0] == _span(torch.zeros(0))[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_capture_without_gpu_is_a_clear_error():
    with pytest.raises(gpuos.CaptureError, match="CUDA GPU"):
        gpuos.capture(lambda x: x + 1, torch.ones(3))
    w = gpuos.wrap(lambda x: x + 1)
    with pytest.raises(gpuos.CaptureError, match="CUDA GPU"):
        w(torch.ones(3))
    assert issubclass(gpuos.CaptureError, gpuos.GpuosError) and issubclass(gpuos.GuardError, gpuos.GpuosError)


def test_wrap_as_decorator_keeps_the_function():
    @gpuos.wrap(cache_size=3)
    def f(x):
        """doc"""
        return x
    assert f.cache_size == 3 and f.__doc__ == "doc" and f.__wrapped__(5) == 5
    assert f.info() == {"captures": 0, "cached": 0, "programs": []}
