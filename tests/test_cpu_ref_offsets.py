"""The address walk of strided operands (device_src/types.h ref_offsets<U>), on the CPU: the worker's strided
element loop walks a lane's 4 indices at once (ref_offset4, their divisions interleaved); every other caller walks
one (ref_offset). Both are the same rule: checked against each other and against a Python walk."""
import math
import random

import pytest

gpuos_ext = pytest.importorskip("gpuos_ext")


def walk(sizes, strides, e):
    """Offset of linear index e: dims from the last, the first dim takes what is left (indices past the end too)."""
    if not sizes:
        return 0
    off = 0
    for s, st in zip(reversed(sizes[1:]), reversed(strides[1:])):
        q = e // s
        off += (e - q * s) * st
        e = q
    return off + e * strides[0]


@pytest.mark.parametrize("seed", range(60))
def test_ref_offset4_is_four_single_walks(seed):
    rng = random.Random(seed)
    nd = rng.randint(0, 8)
    sizes = [rng.randint(1, 9) for _ in range(nd)]
    strides = [rng.choice([0, 1, -1, rng.randint(-40, 300)]) for _ in range(nd)]
    e0 = rng.randrange(0, max(1, math.prod(sizes)))
    four, single = gpuos_ext._testing.ref_offsets(sizes, strides, e0)
    assert four == single == [walk(sizes, strides, e0 + 32 * u) for u in range(4)]


@pytest.mark.parametrize("sizes,strides,e0", [
    ([1 << 20, 1 << 13], [1 << 13, 1], (1 << 32) - 40),    # the four indices cross 2^32: the 64-bit walk
    ([1 << 21, 3, 1 << 11], [1, 1 << 21, 3 << 21], (1 << 32) + 7),  # all past 2^32, transposed strides
    ([3, 1 << 33], [1 << 33, 1], 5),                       # a dim of 2^32 or more
    ([4, 64, 1, 64], [0, 64, 0, 1], 1000),                 # an expanded (stride 0) cache, as HF's repeat_kv
])
def test_ref_offset4_at_the_32_bit_edges(sizes, strides, e0):
    four, single = gpuos_ext._testing.ref_offsets(sizes, strides, e0)
    assert four == single == [walk(sizes, strides, e0 + 32 * u) for u in range(4)]


def test_ref_offsets_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="sizes and strides"):
        gpuos_ext._testing.ref_offsets([2, 3], [1], 0)
    with pytest.raises(ValueError, match="kMaxDims"):
        gpuos_ext._testing.ref_offsets([1] * 9, [1] * 9, 0)
