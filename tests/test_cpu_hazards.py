"""The hazard model's footprints on the CPU (csrc/core/hazards.h through gpuos_ext._testing.hazard_levels): byte
ranges, and the periodic windows that let the pieces of a torch.cat along the last dim share a level."""

import math

import pytest
import torch

gpuos_ext = pytest.importorskip("gpuos_ext")
levels = gpuos_ext._testing.hazard_levels


def aligned(*shape, dtype=torch.float32):
    """A tensor starting at a 1 KiB boundary (windows are taken modulo byte periods)."""
    n, es = math.prod(shape), torch.empty((), dtype=dtype).element_size()
    base = torch.empty(n + 1024 // es, dtype=dtype)
    off = (-base.data_ptr() % 1024) // es
    return base[off:off + n].view(*shape)


def test_cat_halves_share_a_level_and_a_full_read_follows():
    out = aligned(4, 1, 64, dtype=torch.float16)
    a, b = torch.randn(4, 1, 32).half(), torch.randn(4, 1, 32).half()
    assert levels([(out[..., :32], [a]), (out[..., 32:], [b]), (torch.empty(4, 1, 64).half(), [out])]) == [1, 1, 2]


def test_windows_that_meet_are_ordered():
    out, x = aligned(8, 64), torch.empty(8, 40)
    assert levels([(out[:, :40], [x]), (out[:, 32:], [x[:, :32]])]) == [1, 2]   # elements 32..39 of each row
    assert levels([(out[:, :32], [x]), (out[:, 31:63], [x])]) == [1, 2]          # one element in common
    assert levels([(out[:, :32], [x]), (out[:, 32:], [x]), (out[:, 16:48], [x])]) == [1, 1, 2]  # the union's hull


def test_reads_and_writes_of_disjoint_windows():
    buf, y1, y2, z = aligned(16, 128), torch.empty(16, 64), torch.empty(16, 64), torch.empty(16, 64)
    # write the left half; read the right half (no dependency); write the right half (after that read)
    assert levels([(buf[:, :64], [y1]), (z, [buf[:, 64:]]), (buf[:, 64:], [y2])]) == [1, 1, 2]


def test_other_periods_stay_conservative():
    out, x = aligned(8, 64), torch.empty(8, 32)
    # the same bytes seen with another period: the ranges decide
    assert levels([(out[:, :32], [x]), (out.view(16, 32)[:, :16], [torch.empty(16, 16)])]) == [1, 2]
    # every other row: a period of two rows; windows in different rows are disjoint, the same row's are not
    assert levels([(out[0::2, :32], [x[:4]]), (out[1::2, :32], [x[:4]]), (out[0::2, 16:48], [x[:4]])]) == [1, 1, 2]


def test_a_window_that_wraps_has_no_pattern():
    flat = aligned(1024)
    wrap = flat[48:].as_strided((3, 32), (64, 1))   # each run crosses a 64-element period boundary
    other = flat[16:].as_strided((4, 16), (64, 1))  # elements 16..31 of each period: inside wrap's byte range
    assert levels([(wrap, []), (other, [])]) == [1, 2]
