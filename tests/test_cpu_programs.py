"""Programs (issue #17) without a GPU: the relocation rule of a replay (csrc/core/tape.h Reloc), the merge of
moved ranges, and the errors a user meets on a machine without CUDA."""
import pytest
import torch

import gpuos
import gpuos_ext
from gpuos.programs import Program, _span
from _helpers import describe, run_python


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


def _bare_program(flat_args, spec):
    """A Program's guard state for CPU tensors, without a capture (the guards are plain Python)."""
    from gpuos.programs import _guard_meta, _raw_meta
    p = Program.__new__(Program)
    p._spec = spec
    p._guards = [_guard_meta(x) if isinstance(x, torch.Tensor) else ("v", type(x), x) for x in flat_args]
    p._raw = [_raw_meta(x) if isinstance(x, torch.Tensor) else None for x in flat_args]
    p._ext = [None for _ in flat_args]  # CPU tensors: no spans to compare
    p._overlaps = frozenset()
    return p


def test_guards_on_cpu_tensors():
    from torch.utils import _pytree as pytree
    x, s = torch.zeros(4, 6), 2.0
    flat, spec = pytree.tree_flatten(((x, s), {}))
    p = _bare_program(flat, spec)
    ok, ok_spec = pytree.tree_flatten(((torch.ones(4, 6), 2.0), {}))
    p._check(ok, ok_spec)  # same metadata: passes
    col = torch.zeros(1, 6)
    p1 = _bare_program(*pytree.tree_flatten(((col, s), {})))
    strided = torch.zeros(1, 12)[:, ::2]  # a size-1 dim's stride differs, the other dim's too
    with pytest.raises(gpuos.GuardError, match="strides"):
        p1._check(*pytree.tree_flatten(((strided, s), {})))
    row_view = torch.zeros(3, 8)[2:3, :6]  # (1, 6), strides (8, 1), 64 bytes in: the size-1 dim's stride is ignored
    p1._check(*pytree.tree_flatten(((row_view, s), {})))
    with pytest.raises(gpuos.GuardError, match="mod 16 = 8"):  # 24 bytes in: another alignment
        p1._check(*pytree.tree_flatten(((torch.zeros(3, 6)[1:2], s), {})))
    for bad, what in [((torch.zeros(4, 7), s), "argument 0"), ((torch.zeros(4, 6, dtype=torch.float64), s), "float64"),
                      ((x, 3.0), "non-tensor"), ((x, torch.zeros(1)), "non-tensor")]:
        with pytest.raises(gpuos.GuardError, match=what):
            p._check(*pytree.tree_flatten((bad, {})))
    with pytest.raises(gpuos.GuardError, match="structure"):
        p._check(*pytree.tree_flatten(((x,), {})))


def test_overlap_pairs():
    assert Program._pairs([(0, 10, 0), (10, 20, 1)]) == frozenset()
    assert Program._pairs([(0, 10, 0), (5, 20, 1), (30, 40, 2)]) == frozenset({(0, 1)})
    assert Program._pairs([(30, 40, 2), (0, 100, 0), (50, 60, 1)]) == frozenset({(0, 1), (0, 2)})
    assert Program._pairs([(5, 5, 0), (0, 10, 1)]) == frozenset()  # an empty span overlaps nothing


def test_host_reads_are_refused_before_anything_runs():
    from gpuos.programs import _Capture
    cap = _Capture(0, [torch.zeros(3)])
    with pytest.raises(gpuos.CaptureError, match="_local_scalar_dense.*host"):
        cap.eager(torch.ops.aten._local_scalar_dense.default, (torch.zeros(1),), {})
    assert cap.steps == [] and cap.fallbacks == []  # refused before the op ran or was recorded


@pytest.mark.parametrize("per_tile,total,min_units,want", [
    (4096, 4096, 128, 256),    # a 4,096-element op: 16 tiles of 256
    (4096, 1024, 128, 128),    # small: tiles of >= 128 elements (8 tiles)
    (4096, 100, 128, 128),     # one tile
    (4096, 3000, 128, 192),    # ceil(3000 / 16) = 188, rounded up to whole 32s
    (4096, 65536, 128, 512),   # larger: tiles of at most 512 elements (128 warps)
    (4096, 200000, 128, 800),  # at most 256 tiles: ceil(200000 / 256) = 782, rounded up to whole 32s
    (4096, 1 << 20, 128, 4096),  # large: whole tiles, as live flushes
    (32, 64, 1, 4),            # rows: 64 rows over 16 warps
    (32, 3, 1, 1),             # fewer rows than warps: one per tile
    (2, 100, 1, 2),            # never more per tile than the op's own tile
])
def test_capture_tile_spreads_small_ops_over_warps(per_tile, total, min_units, want):
    got = gpuos_ext._testing.capture_tile(per_tile, total, min_units)
    assert got == want
    tiles = -(-total // got)
    assert tiles <= max(16, -(-total // per_tile)) or (min_units > 1 and got >= 512 and tiles <= 256)


@pytest.mark.parametrize("seed", range(24))
def test_tape_image_equals_entry_by_entry_staging(seed):
    """A replay from a staged image (csrc/core/tape.h TapeImage: descriptors in level order, TensorRefs as one run,
    only moved pointers patched) writes the same descriptors and TensorRefs as relocating and staging each entry."""
    descs, bad_descs, refs, bad_refs, moved = gpuos_ext._testing.tape_image_check(seed, 80)
    assert descs > 80 and refs > 0 and moved > 0  # the case moves pointers in descriptors and in refs
    assert (bad_descs, bad_refs) == (0, 0)


def _overlap(a, b, ring):
    """Two home ranges (first, span) on the ring of blocks 1 .. ring."""
    (fa, sa), (fb, sb) = a, b
    return (fb - fa) % ring < sa or (fa - fb) % ring < sb


def test_piece_homes_one_kind_one_place():
    """core/tape.h piece_homes: a level piece's home blocks are one per claim by default (GPUOS_HOME_LEVELS=1; 8
    sub-ops per claim here), on the bounded grid's blocks 1 .. 32 (never block 0, the poller), the first kind from
    block 8 (blocks 1 .. 7 change SMs between launches); every piece of one kind (op, flags, program) gets its kind's
    first block, so the same blocks run every level of that kind; a piece of the kind of the piece before it two per
    claim; 0 per claim: no homes."""
    homes = gpuos_ext._testing.piece_homes
    ring = 32
    layer = [(1, 0, 0, 1), (2, 4, 7, 1), (3, 0, 0, 16), (2, 4, 9, 2), (4, 0, 0, 40)]  # row, fused 7, mm, fused 9, mm
    got = homes(layer * 4, 33, 132, 8)
    assert got[:5] == [(8, 1), (9, 1), (10, 2), (12, 1), (13, 5)]  # fresh kinds side by side, spans = claims
    assert got[5:] == got[:5] * 3  # later layers: the same blocks
    for i, (first, span) in enumerate(got):
        assert 1 <= first <= ring and span >= 1
        if i:
            assert not _overlap(got[i - 1], (first, span), ring)
    assert homes(layer, 33, 132, 8, per_claim=0) == [(0, 0)] * 5
    # One kind back to back (a uniform chain): after the first, two blocks per claim -- the blocks of the level
    # before are still busy with it while the others claim this one -- and the kind's range is that wide.
    assert homes([(5, 0, 0, 8)] * 3 + [(6, 0, 0, 8)], 33, 132, 8) == [(8, 1), (8, 2), (8, 2), (10, 1)]
    big = homes([(5, 0, 0, 5000)], 33, 132, 8)  # a level of more claims than the ring spares (an LM head)
    assert big == [(0, 0)]


def test_piece_homes_two_blocks_per_claim():
    """GPUOS_HOME_LEVELS=2 (the twenty-fifth session's layout): spans of twice the claims; a piece whose kind's
    blocks overlap the piece before it (another kind's), or of more blocks than the ring spares, gets none (0, 0)."""
    homes = gpuos_ext._testing.piece_homes
    ring = 32
    layer = [(1, 0, 0, 1), (2, 4, 7, 1), (3, 0, 0, 16), (2, 4, 9, 2), (4, 0, 0, 40)]
    got = homes(layer * 4, 33, 132, 8, per_claim=2)
    assert got[:5] == [(8, 2), (10, 2), (12, 4), (16, 2), (18, 10)]
    assert got[5:] == got[:5] * 3
    for i, (first, span) in enumerate(got):
        assert 1 <= first <= ring and span >= 2
        if i:
            assert not _overlap(got[i - 1], (first, span), ring)
    # The cursor wraps past block 32 to block 1; a kind whose blocks overlap the piece before it (another kind's) waits.
    a, b, c, d = (10, 0, 0, 120), (11, 0, 0, 8), (12, 0, 0, 8), (13, 0, 0, 8)  # 15 claims (30 blocks), 1, 1, 1
    assert homes([a, b, c, d, a, b], 33, 132, 8, per_claim=2) == [(8, 30), (6, 2), (8, 2), (10, 2), (0, 0), (6, 2)]
    wide = homes([(10, 0, 0, 64), (11, 0, 0, 128)], 33, 132, 8, per_claim=2)  # 16 claims: 32 blocks, the ring's
    assert wide == [(8, 16), (0, 0)]
    same = homes([(5, 0, 0, 8)] * 3, 33, 132, 8, per_claim=2)  # one kind back to back: its own blocks
    assert same == [(8, 2)] * 3
    assert homes([(5, 0, 0, 8)], 3, 132, 8, per_claim=2) == [(0, 0)]  # a grid of 3 blocks: no homes
    assert homes([(5, 0, 0, 5000)], 33, 132, 8, per_claim=2) == [(0, 0)]


@pytest.mark.parametrize("value", [None, "0", "2"])
def test_home_levels_setting_is_a_count_of_blocks_per_claim(value):
    """GPUOS_HOME_LEVELS is read as home blocks per claim (default 1; 0: no homes), as the settings report shows."""
    p = run_python("import gpuos_ext; print(gpuos_ext.config()['GPUOS_HOME_LEVELS'])",
                   {} if value is None else {"GPUOS_HOME_LEVELS": value}, timeout=120)
    assert p.returncode == 0, describe(p)
    assert p.stdout.split() == [value or "1"], describe(p)


@pytest.mark.parametrize("value,shown", [(None, "20"), ("5", "5"), ("-1", "(idle_us)")])
def test_program_idle_setting_is_reported(value, shown):
    """GPUOS_PROGRAM_IDLE_US, the idle time of a worker a program call launches (default 20 us; negative: idle_us),
    is read and shown by the settings report, and the hand-over queue's default is one launch."""
    code = "import gpuos_ext; c = gpuos_ext.config(); print(c['GPUOS_PROGRAM_IDLE_US'], c['GPUOS_HANDOVER_QUEUE'])"
    p = run_python(code, {} if value is None else {"GPUOS_PROGRAM_IDLE_US": value}, timeout=120)
    assert p.returncode == 0, describe(p)
    assert p.stdout.split() == [shown, "1"], describe(p)


@pytest.mark.parametrize("name,value,shown", [("GPUOS_KICKS", None, "1"), ("GPUOS_KICKS", "1", "1"),
                                              ("GPUOS_KICKS", "0", "0"), ("GPUOS_KICK_ALONE", None, "0"),
                                              ("GPUOS_KICK_ALONE", "64", "64"), ("GPUOS_KICK_WAIT", None, "0"),
                                              ("GPUOS_KICK_WAIT", "1", "1")])
def test_kick_settings_are_reported(name, value, shown):
    """GPUOS_KICKS (a kick behind every publication's ready words instead of a gated standby; default on) and
    GPUOS_KICK_ALONE (publications of at most that many sub-ops run by their kick alone; default 0: off) and
    GPUOS_KICK_WAIT (a kick stays until its batches are done; default off) are read and shown by the settings
    report."""
    p = run_python(f"import gpuos_ext; print(gpuos_ext.config()[{name!r}])",
                   {name: "" if value is None else value}, timeout=120)  # "": unset
    assert p.returncode == 0, describe(p)
    assert p.stdout.split() == [shown], describe(p)


def test_claim_size_is_a_warp_multiple_between_one_and_four_per_warp():
    """device_src/types.h claim_size (walk.h claim_next's claim, piece_homes' home span): one sub-op per warp until a
    batch has four claims per block of the grid, then more per warp, at most kClaimPerWarp (4)."""
    size = gpuos_ext._testing.claim_size
    assert size(1, 132, 8) == 8  # a claim is never smaller than one sub-op per warp
    assert size(132 * 8 * 4 - 1, 132, 8) == 8
    assert size(132 * 8 * 4 * 3, 132, 8) == 24
    assert size(10**6, 132, 8) == 32  # at most four per warp
    assert size(10**6, 33, 4) == 16
    for count in (1, 100, 5000, 40000):
        for grid, warps in ((33, 8), (132, 8), (264, 4)):
            assert size(count, grid, warps) % warps == 0


def test_home_blocks_are_the_ring_ranges_piece_homes_lays_out():
    """device_src/types.h home_has (the worker's home_skips): a home (first, span) is claimed by exactly `span` blocks,
    first .. first + span - 1 on the ring of blocks 1 .. nb - 1, never block 0 nor a block of the burst grid beyond
    the bounded one; no home, or one the ring cannot hold, is every block's."""
    blocks = gpuos_ext._testing.home_blocks
    assert blocks(3, 2, 33) == [3, 4]
    assert blocks(31, 4, 33) == [1, 2, 31, 32]  # wraps past block 32 to block 1, not block 0
    assert blocks(0, 0, 33) == list(range(35))  # no home: every block, the burst grid's too
    assert blocks(1, 32, 33) == list(range(35))  # the whole ring: no home
    layer = [(1, 0, 0, 1), (2, 4, 7, 1), (3, 0, 0, 16), (2, 4, 9, 2), (4, 0, 0, 40), (5, 0, 0, 120)]
    for first, span in gpuos_ext._testing.piece_homes(layer * 3, 33, 132, 8):
        got = blocks(first, span, 33)
        if span:
            assert len(got) == span and 0 not in got and max(got) <= 32, (first, span, got)
            assert first in got


@pytest.mark.parametrize("name", ["program_runs", "tape_images", "standby_first_look"])
def test_replay_switches_round_trip_and_default_on(name):
    """The A/B switches of the replay and standby paths (gpuos_ext._testing) read back what was set; on by default."""
    get, put = getattr(gpuos_ext._testing, name), getattr(gpuos_ext._testing, "set_" + name)
    assert get() is True
    try:
        put(False)
        assert get() is False
    finally:
        put(True)
    assert get() is True
