"""K slices of the worker's matmul items (core/record.cpp matmul_split), on the CPU: the rule the host records
decode products with (device_src/matmul.h runs the items)."""
import pytest

gpuos_ext = pytest.importorskip("gpuos_ext")

MMA, NCOL, NCOL1 = 1, 2, 3
UNIT = {MMA: 64, NCOL: 8, NCOL1: 8}      # device_src/config.h mm_unit: a tensor-core chunk / one ncol step of 8 rows
COLS = {MMA: 16, NCOL: 256, NCOL1: 64}   # kMmMmaCols / kMmNcolCols / kMmNcol1Cols


def kspan(K, ks, unit):
    return -(-(-(-K // ks)) // unit) * unit


@pytest.mark.parametrize("ntile,K,M,variant,want", [
    (3, 256, 1, NCOL, 32),     # GPT-2-small's 256 x 768 (c_attn): one 8-row step per item, 96 items
    (1, 1024, 1, NCOL, 64),    # its MLP down-projection: at most kMmMaxSplit slices
    (16, 256, 1, MMA, 1),      # Llama-small's 256 x 256: 128 KiB of weight, 16 items of 8 KiB, no split
    (64, 1024, 1, MMA, 4),     # 1,024 x 1,024: 2 MiB, 256 items of 8 KiB
    (256, 4096, 1, MMA, 4),    # 4,096 x 4,096: about 1,024 items
    (3142, 256, 1, MMA, 1),    # an LM head: enough tiles already
    (3, 256, 64, NCOL, 1),     # 64 rows of partials (256 x 64 floats) do not fit 64 scratch slots: no split
    (12, 256, 1, NCOL1, 8),    # GPT-2-small's c_attn at M = 1 (64-column tiles): a block's 8 warps, 32-row slices
    (4, 1024, 1, NCOL1, 8),    # its MLP down-projection: 128-row slices (two 64-row steps), still local
    (12, 3072, 1, NCOL1, 64),  # GPT-2 (768)'s down-projection: 8 slices would be 384 rows -- the scratch instead
    (786, 256, 1, NCOL1, 1),   # enough tiles already
])
def test_matmul_split(ntile, K, M, variant, want):
    assert gpuos_ext._testing.matmul_split(ntile, K, M, variant, 8192) == want


def test_ncol1_slices_follow_the_block_warps():
    # 16 warps per block: 16 local slices of 16 rows; one warp: no cap (the scratch path's split)
    assert gpuos_ext._testing.matmul_split(12, 256, 1, NCOL1, 8192, warps=16) == 16
    assert gpuos_ext._testing.matmul_split(12, 256, 1, NCOL1, 8192, warps=1) == 32


@pytest.mark.parametrize("variant", [MMA, NCOL, NCOL1])
@pytest.mark.parametrize("K", [8, 64, 200, 256, 688, 768, 3072, 4096, 11008])
@pytest.mark.parametrize("ntile", [1, 3, 16, 43, 300])
@pytest.mark.parametrize("M", [1, 4, 16])
def test_matmul_split_slices_are_whole_and_nonempty(variant, K, ntile, M):
    ks = gpuos_ext._testing.matmul_split(ntile, K, M, variant, 8192)
    assert 1 <= ks <= 64
    if ks > 1:
        span = kspan(K, ks, UNIT[variant])
        need = -(-(16 + COLS[variant] * M) // 128)       # scratch slots the tile's partials take
        assert span % UNIT[variant] == 0 and K <= ks * span  # whole units, together all of K
        assert (ks - 1) * span < K or ks == need         # an empty last slice only where the scratch needs its slot
        assert ks >= need                                # the tile's partials fit its ks scratch slots
        assert ntile * ks <= 8192 // 2                   # one piece of the ring
        assert ntile * ks <= max(1024, ntile * need)     # about `items` items (more only where the scratch needs)


def test_matmul_split_items_and_ring_bound_the_split():
    assert gpuos_ext._testing.matmul_split(3, 256, 1, NCOL, 8192, items=1) == 1   # GPUOS_MM_ITEMS=1: no split
    assert gpuos_ext._testing.matmul_split(3, 256, 1, NCOL, 8192, items=48) == 16
    assert gpuos_ext._testing.matmul_split(300, 4096, 1, MMA, 64) == 1             # would not fit a small ring
    # an mma item keeps >= 8 KiB of weight: 16 tiles x K = 1,024 (512 KiB) -> 64 items, 4 slices, whatever `items`
    assert gpuos_ext._testing.matmul_split(16, 1024, 1, MMA, 8192, items=4096) == 4


@pytest.mark.parametrize("ntile,items,want", [
    (100, 1024, 1),       # fewer tiles than items: one tile per item
    (2000, 1024, 2),      # Llama-small's LM head (32,000 columns): 1,000 items of 2 tiles
    (3142, 1024, 4),      # GPT-2's (50,257 columns): 786 items of 4
    (100000, 1024, 16),   # at most kMmMaxGroup tiles per item
    (3142, 1, 1),         # GPUOS_MM_ITEMS=1: one tile per item
])
def test_matmul_group(ntile, items, want):
    assert gpuos_ext._testing.matmul_group(ntile, items) == want


@pytest.mark.parametrize("ntile,grid_warps,want", [
    (3142, 1056, 3),      # GPT-2's LM head on an H200's 132 blocks x 8 warps: 1,048 items, one per warp
    (2000, 1056, 2),      # Llama-small's: 1,000 items either way
    (3142, 864, 4),       # a grid of fewer warps than `items`: `items` rules
    (1040, 1056, 1),      # more tiles than items but not than warps: one tile per item
])
def test_matmul_group_covers_the_grid_warps(ntile, grid_warps, want):
    assert gpuos_ext._testing.matmul_group(ntile, 1024, grid_warps) == want


@pytest.mark.parametrize("ksplit,M,variant,warps,want", [
    (4, 1, MMA, 8, True),      # 4,096 x 4,096 at M = 1: 4 slices of a 16-column tile, 16 floats each
    (4, 16, MMA, 8, True),     # 16 rows: 256 floats, within a 268-float slot
    (4, 17, MMA, 8, False),    # 272 floats: the scratch as before
    (8, 1, MMA, 8, True),      # one slice per warp
    (16, 1, MMA, 8, False),    # more slices than a block's warps
    (16, 1, MMA, 16, True),    # ... of a 512-thread block
    (8, 1, NCOL, 8, True),     # a 256-column tile at one row
    (8, 2, NCOL, 8, False),    # 512 floats
    (8, 1, NCOL1, 8, True),    # a 64-column tile at one row
    (8, 5, NCOL1, 8, False),   # 320 floats (the host takes ncol1 at M = 1 only; the rule is the slot's)
    (1, 1, MMA, 8, False),     # not split
    (4, 1, 0, 8, False),       # the per-warp tiles never split
])
def test_matmul_local_path_rule(ksplit, M, variant, warps, want):
    """Which split products sum a tile's K slices in shared memory (kMmLocal; core/record.cpp matmul_local): the
    partial (M x tile columns) fits a kLocalSlot of 268 floats and a block's warps hold every slice."""
    assert gpuos_ext._testing.matmul_local(ksplit, M, variant, warps) is want


# --- a level's products share the grid (core/matmul_plan.h spread_level) ---

def _cut(N, K, M, variant=MMA, **kw):
    """(reserved, items, M, N, K) of a product as record_matmul cuts it alone."""
    r, n = gpuos_ext._testing.matmul_cut(-(-N // COLS[variant]), K, M, variant, 8192, grid_warps=1056, **kw)
    return (r, n, M, N, K)


def _ks(reserved):
    return max(1, (reserved >> 8) & 0xFF)


def test_eight_independent_4096_products_are_unsplit():
    # bench_matmul's flush of 8 products at M = 1: 4 slices each alone (1,024 items), 256 unsplit items together
    p = _cut(4096, 4096, 1)
    assert _ks(p[0]) == 4 and p[1] == 1024
    cut = gpuos_ext._testing.spread_level([p] * 8)
    assert [(_ks(r), n) for r, n in cut] == [(1, 256)] * 8, cut


def test_a_live_level_cuts_its_products_as_they_come():
    # a live flush publishes its first 1,024 items while it records the rest: the first product is cut alone,
    # each later one gets its share of the level's items so far
    p = _cut(4096, 4096, 1)
    cut = gpuos_ext._testing.level_cuts([p] * 8)
    assert [(_ks(r), n) for r, n in cut] == [(4, 1024), (2, 512)] + [(1, 256)] * 6, cut
    assert gpuos_ext._testing.level_cuts([p] * 8, items=0) == [p[:2]] * 8     # GPUOS_MM_SPREAD=0


def test_a_product_alone_keeps_its_cut():
    for p in (_cut(4096, 4096, 1), _cut(2048, 4096, 16), _cut(768, 256, 1, NCOL1)):
        assert gpuos_ext._testing.spread_level([p]) == [p[:2]]


def test_two_products_share_the_items():
    p = _cut(4096, 4096, 1)
    cut = gpuos_ext._testing.spread_level([p, p])
    assert [(_ks(r), n) for r, n in cut] == [(2, 512)] * 2, cut


def test_shares_follow_the_weight_size():
    # a 4,096^2 product beside a 256^2 one (unsplit, 16 items): the big one keeps nearly all the items
    big, small = _cut(4096, 4096, 1), _cut(256, 256, 1)
    assert _ks(small[0]) == 1
    cut = gpuos_ext._testing.spread_level([big, small])
    assert cut[1] == small[:2] and cut[0] == big[:2], cut


def test_spread_off_or_unsplittable_changes_nothing():
    p = _cut(4096, 4096, 1)
    assert gpuos_ext._testing.spread_level([p] * 8, items=0) == [p[:2]] * 8   # GPUOS_MM_SPREAD=0
    assert gpuos_ext._testing.spread_level([p] * 8, items=1) == [p[:2]] * 8   # GPUOS_MM_ITEMS=1


@pytest.mark.parametrize("seed", range(20))
def test_spread_only_ever_takes_slices_away(seed):
    import random
    rng = random.Random(seed)
    ps = []
    for _ in range(rng.randint(2, 12)):
        variant = rng.choice([MMA, NCOL, NCOL1])
        M = 1 if variant == NCOL1 else rng.choice([1, 4, 16])
        ps.append(_cut(rng.choice([64, 256, 1000, 2048, 4096]), rng.choice([64, 256, 768, 3072, 4096]), M, variant))
    for cut in (gpuos_ext._testing.spread_level(ps), gpuos_ext._testing.level_cuts(ps)):
        for (r0, n0, M, N, K), (r, n) in zip(ps, cut):
            variant = r & 0xFF
            assert variant == r0 & 0xFF and n <= n0 and _ks(r) <= _ks(r0)
            ntile = -(-N // COLS[variant])
            group = max(1, (r >> 16) & 0x7FFF)
            assert n == -(-ntile // group) * _ks(r)                  # the item count the device's cut implies
            if _ks(r) > 1:
                need = -(-(16 + COLS[variant] * M) // 128)
                assert _ks(r) >= need and K <= _ks(r) * kspan(K, _ks(r), UNIT[variant])
                assert bool(r & (1 << 31)) == gpuos_ext._testing.matmul_local(_ks(r), M, variant)
            elif n != n0:
                assert not r & (1 << 31)


def test_a_program_image_recuts_each_level_whole():
    # eight independent 4,096^2 products captured (cut alone: 4 slices, 1,024 items each) form one level of 8,192
    # descriptors; the image re-cuts them together: 256 unsplit items each, 2,048 in the level
    shapes = [(1, 4096, 4096)] * 8
    runs, level_end = gpuos_ext._testing.tape_image_cuts(shapes)
    assert [(_ks(r), n) for r, n in runs] == [(1, 256)] * 8 and level_end == [2048], (runs, level_end)
    runs, level_end = gpuos_ext._testing.tape_image_cuts(shapes, spread=False)
    assert [(_ks(r), n) for r, n in runs] == [(4, 1024)] * 8 and level_end == [8192]


def test_a_program_image_keeps_a_chain_cut_alone():
    # the same products each reading the one before: eight levels of one product, each keeps its 4 slices
    runs, level_end = gpuos_ext._testing.tape_image_cuts([(1, 4096, 4096)] * 8, chain=True)
    assert [(_ks(r), n) for r, n in runs] == [(4, 1024)] * 8
    assert level_end == [1024 * (i + 1) for i in range(8)]
