"""The worker's skinny matmul (issue #16): gpuos.submit_matmul against torch, on the GPU.

Every dtype (f32 / f16 / bf16) x layout of b (the transposed weight of a Linear -- the vector path --, row-major,
strided) x activation rows M in {1, 4, 16, 64} x sizes with remainders, with and without a bias (1-D, a row,
a full M x N tensor) and alpha / beta; ordering with elementwise work of the same flush; argument errors.
The reference is fp32 torch on the same (rounded) inputs, cast to the output dtype; the tolerance grows with
sqrt(K) (fp32 accumulation in a different order) plus one rounding of the output dtype.
"""

import math

import pytest
import torch

import gpuos
import gpuos_ext
from _helpers import captured_levels, hot_then_tier2, within_one_rounding

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
EPS = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _b(layout, K, N, dtype, g):
    """b (K x N) in the given layout: 'linear' is w.t() of an N x K weight (K-contiguous), 'rowmajor' a K x N
    tensor, 'strided' a stepped slice of a wider tensor (neither dim contiguous)."""
    if layout == "linear":
        return torch.randn(N, K, generator=g, device=DEV).to(dtype).t()
    if layout == "rowmajor":
        return torch.randn(K, N, generator=g, device=DEV).to(dtype)
    return torch.randn(2 * K, 2 * N, generator=g, device=DEV).to(dtype)[::2, ::2]


def _live_items():
    """The K-slice budget of a product recorded outside a capture, as the runtime read it (GPUOS_MM_ITEMS_LIVE;
    0: GPUOS_MM_ITEMS): the cut submit_matmul's products get (a program's image cuts with GPUOS_MM_ITEMS)."""
    c = gpuos_ext.config()
    return int(c["GPUOS_MM_ITEMS_LIVE"]) or int(c["GPUOS_MM_ITEMS"])


def _check(out, a, b, bias=None, alpha=1.0, beta=1.0):
    ref = alpha * (a.float() @ b.float())
    if bias is not None:
        ref = ref + beta * bias.float()
    K = a.shape[1]
    scale = (a.float().abs() @ b.float().abs()).max().item() + (0 if bias is None else bias.float().abs().max().item())
    tol = 8 * math.sqrt(max(K, 1)) * 2.0 ** -23 * scale + 2 * EPS[out.dtype] * scale + 1e-6
    err = (out.float() - ref.to(out.dtype).float()).abs().max().item()
    assert err <= tol, f"max error {err:.3g} > {tol:.3g} (out {tuple(out.shape)} {out.dtype}, K {K})"


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("layout", ["linear", "rowmajor", "strided"])
@pytest.mark.parametrize("M", [1, 4, 12, 16, 64])
@pytest.mark.parametrize("NK", [(256, 256), (1000, 1032), (33, 7)], ids=lambda v: f"N{v[0]}K{v[1]}")
def test_matmul_matches_torch(rt, dtype, layout, M, NK):
    N, K = NK
    g = torch.Generator(device=DEV).manual_seed(M * 1000 + N + K)
    dt = DTYPES[dtype]
    a = torch.randn(M, K, generator=g, device=DEV).to(dt)
    b = _b(layout, K, N, dt, g)
    out = torch.full((M, N), float("nan"), device=DEV, dtype=dt)
    gpuos.submit_matmul(a, b, out)
    gpuos.flush()
    _check(out, a, b)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("M", [1, 12])
@pytest.mark.parametrize("N", [32000, 50257, 16 * 1024 * 16 + 24])
def test_lm_head_products_group_column_tiles_per_item(rt, dtype, M, N):
    # More 16-column tiles than items: several tiles per item (matmul_group), the last item partial; every
    # column written (the output starts as NaN).
    K = 256
    g = torch.Generator(device=DEV).manual_seed(N + M)
    dt = DTYPES[dtype]
    a = torch.randn(M, K, generator=g, device=DEV).to(dt)
    w = torch.randn(N, K, generator=g, device=DEV).to(dt)
    assert gpuos_ext._testing.matmul_group(-(-N // 16)) > 1
    out = torch.full((M, N), float("nan"), device=DEV, dtype=dt)
    gpuos.submit_matmul(a, w.t(), out)
    gpuos.flush()
    _check(out, a, w.t())


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("layout", ["linear", "rowmajor"])
@pytest.mark.parametrize("M", [1, 12, 16])
def test_split_k_products_share_a_level_and_leave_the_scratch_clean(rt, dtype, layout, M):
    """K = 4,096: the products are split over K (more items than column tiles; the partials meet in the scratch of
    the ring slots). Two products of one level (distinct scratch), the same product again in later flushes and
    at other ring positions (the scratch was zeroed by each tile's last item), a bias added once."""
    N, K = 2048, 4096
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(M + len(layout))
    a1 = torch.randn(M, K, generator=g, device=DEV).to(dt)
    a2 = torch.randn(M, K, generator=g, device=DEV).to(dt)
    b = _b(layout, K, N, dt, g) / 8
    bias = torch.randn(N, generator=g, device=DEV).to(dt)
    tiles = N // (16 if layout == "linear" else 64 if M == 1 else 256)   # mma / ncol1 / ncol column tiles
    for rep in range(3):
        o1 = torch.full((M, N), float("nan"), device=DEV, dtype=dt)
        o2 = torch.full((M, N), float("nan"), device=DEV, dtype=dt)
        if rep == 2:  # another ring position for the same product
            gpuos.submit_add(a1[:, :7], a1[:, :7], torch.empty(M, 7, device=DEV, dtype=dt))
        before = gpuos.stats()["subops"]
        gpuos.submit_matmul(a1, b, o1, bias=bias)
        gpuos.submit_matmul(a2, b, o2)
        items = (gpuos.stats()["subops"] - before) // 2
        gpuos.flush()
        _check(o1, a1, b, bias)
        _check(o2, a2, b)
        assert items > tiles, f"{items} items for {tiles} column tiles: the product was not split over K"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case", ["mma_m1", "mma_m16", "ncol_m1"])
def test_split_k_tiles_one_claim_holds_are_summed_in_shared_memory(rt, dtype, case):
    """K slices <= a block's warps and a partial that fits a shared-memory slot (kMmLocal): a tile whose slices one
    claim holds whole is summed by the slice that finishes last (mm_finish_local), with the bias; a product placed
    after an odd number of sub-ops has tiles across two claims, which meet in the scratch as before. Both, with
    the same weight, equal torch; every output column is written (NaN start)."""
    layout, M = {"mma_m1": ("linear", 1), "mma_m16": ("linear", 16), "ncol_m1": ("rowmajor", 1)}[case]
    N, K = (2048, 4096) if layout == "linear" else (512, 64)
    tw = 16 if layout == "linear" else 64          # the ncol1 item's 64-column tiles at M = 1
    variant = 1 if layout == "linear" else 3
    ks = gpuos_ext._testing.matmul_split(-(-N // tw), K, M, variant, 4096, items=_live_items())
    assert ks > 1 and gpuos_ext._testing.matmul_local(ks, M, variant), ks
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(M + K)
    a = torch.randn(M, K, generator=g, device=DEV).to(dt)
    b = _b(layout, K, N, dt, g) / 8
    bias = torch.randn(N, generator=g, device=DEV).to(dt)
    for shift in (0, 1, 3):
        if shift:  # shift the product's items off the claims' 8-descriptor grid
            x = torch.randn(shift, 4096, generator=g, device=DEV)
            gpuos.submit_many("add", list(x), list(x), [torch.empty_like(r) for r in x])
        out = torch.full((M, N), float("nan"), device=DEV, dtype=dt)
        gpuos.submit_matmul(a, b, out, bias=bias)
        gpuos.flush()
        _check(out, a, b, bias)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("M", [1, 16])
def test_independent_products_of_a_level_share_the_grid(rt, dtype, M):
    """Eight independent split-K products in one flush (one level): the later ones get fewer K slices
    (core/matmul_plan.h level_cut: the level's items are shared, not 1,024 per product); every output, with
    and without bias, at two ring positions, equals torch, and the scratch stays clean for the next flush."""
    N, K = 512, 4096  # 8 x 512 items alone: one flush of the 4,096-slot ring
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(40 + M)
    ks_alone = gpuos_ext._testing.matmul_split(N // 16, K, M, 1, 8192, items=_live_items())
    assert ks_alone > 2, ks_alone
    layouts = ["linear"] * 6 + ["rowmajor"] * 2
    a = [torch.randn(M, K, generator=g, device=DEV).to(dt) for _ in layouts]
    b = [_b(lay, K, N, dt, g) / 8 for lay in layouts]
    bias = torch.randn(N, generator=g, device=DEV).to(dt)
    for rep in range(2):
        if rep:  # another ring position
            gpuos.submit_add(a[0][:, :5], a[0][:, :5], torch.empty(M, 5, device=DEV, dtype=dt))
        outs = [torch.full((M, N), float("nan"), device=DEV, dtype=dt) for _ in layouts]
        before = gpuos.stats()["mm_respread"]
        for i in range(len(layouts)):
            gpuos.submit_matmul(a[i], b[i], outs[i], bias=bias if i % 3 == 0 else None)
        gpuos.flush()
        # 512 items each alone: from the fourth on (> 1.5 x 1,024 items in the level) each gets its share
        assert gpuos.stats()["mm_respread"] - before >= 3, "the level's products kept the cut each got alone"
        for i in range(len(layouts)):
            _check(outs[i], a[i], b[i], bias if i % 3 == 0 else None)


def test_captured_independent_products_replay_with_the_level_cut(rt, worker_matmul):
    """A captured step of six independent projections of one input (a level of split-K products): its image
    re-cuts them as the live flush does; replays with new inputs equal eager."""
    g = torch.Generator(device=DEV).manual_seed(77)
    ws = [(torch.randn(1024, 4096, generator=g, device=DEV) / 64).half() for _ in range(6)]

    def proj(x):
        return [torch.nn.functional.linear(x, w) for w in ws]

    prog = gpuos.capture(proj, torch.randn(1, 4096, generator=g, device=DEV).half())
    for _ in range(3):
        x = torch.randn(1, 4096, generator=g, device=DEV).half()
        for got, ref in zip(prog(x), proj(x)):
            torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("bias_shape", ["n", "1n", "mn", "m1"])
def test_matmul_bias_alpha_beta(rt, dtype, bias_shape):
    M, N, K = 5, 96, 128
    g = torch.Generator(device=DEV).manual_seed(7)
    dt = DTYPES[dtype]
    a = torch.randn(M, K, generator=g, device=DEV).to(dt)
    w = torch.randn(N, K, generator=g, device=DEV).to(dt)
    shape = {"n": (N,), "1n": (1, N), "mn": (M, N), "m1": (M, 1)}[bias_shape]
    bias = torch.randn(*shape, generator=g, device=DEV).to(dt)
    out = torch.empty(M, N, device=DEV, dtype=dt)
    gpuos.submit_matmul(a, w.t(), out, bias=bias, alpha=0.5, beta=-2.0)
    gpuos.flush()
    _check(out, a, w.t(), bias, alpha=0.5, beta=-2.0)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("a_layout", ["aligned", "offset", "stepped"])
@pytest.mark.parametrize("K", [100, 256, 1032, 3072])
def test_ncol1_row_major_weight_at_one_row(rt, dtype, a_layout, K):
    """The M = 1 path of a K x N row-major weight (ncol1, 64-column tiles, 4 row groups of lanes over K): a's row
    read as 16-byte vectors when aligned, else one value at a time (offset by one element, or stepped); K slices
    summed in shared memory (K <= 1,032) or in the scratch (3,072); a slice's ragged last rows (K = 100); a bias;
    N = 200 leaves the last tile 8 live columns of 64 (every column written: NaN start)."""
    N = 200
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(K + len(a_layout))
    base = torch.randn(1, 2 * K + 8, generator=g, device=DEV).to(dt)
    a = {"aligned": base[:, :K], "offset": base[:, 1:K + 1], "stepped": base[:, ::2][:, :K]}[a_layout]
    b = torch.randn(K, N, generator=g, device=DEV).to(dt) / 8
    bias = torch.randn(N, generator=g, device=DEV).to(dt)
    out = torch.full((1, N), float("nan"), device=DEV, dtype=dt)
    gpuos.submit_matmul(a, b, out, bias=bias)
    gpuos.flush()
    _check(out, a, b, bias)


def test_matmul_non_contiguous_activations_and_output(rt):
    g = torch.Generator(device=DEV).manual_seed(3)
    a = torch.randn(64, 16, generator=g, device=DEV).t()          # 16 x 64, column-major
    w = torch.randn(40, 64, generator=g, device=DEV)
    big = torch.full((16, 80), 7.0, device=DEV)
    out = big[:, ::2]                                               # 16 x 40, stepped
    gpuos.submit_matmul(a, w.t(), out)
    gpuos.flush()
    _check(out, a, w.t())
    assert torch.all(big[:, 1::2] == 7.0), "the gaps of a strided output were written"


def test_matmul_ordered_with_elementwise_work_of_the_same_flush(rt):
    """x = a + 1 (worker), y = x @ w.t() (worker, reads x), z = y * 2 (worker, reads y): one flush, levels."""
    g = torch.Generator(device=DEV).manual_seed(11)
    a = torch.randn(4, 512, generator=g, device=DEV, dtype=torch.float16)
    w = torch.randn(384, 512, generator=g, device=DEV, dtype=torch.float16)
    one = torch.ones_like(a)
    x, y = torch.empty_like(a), torch.empty(4, 384, device=DEV, dtype=torch.float16)
    z = torch.empty_like(y)
    gpuos.submit_add(a, one, x)
    gpuos.submit_matmul(x, w.t(), y)
    gpuos.submit_mul(y, torch.full_like(y, 2.0), z)
    gpuos.flush()
    _check(y, a + 1, w.t())
    torch.testing.assert_close(z, y * 2, rtol=0, atol=0)


def test_matmul_empty_and_k0(rt):
    a = torch.randn(3, 0, device=DEV)
    b = torch.randn(0, 5, device=DEV)
    out = torch.full((3, 5), float("nan"), device=DEV)
    bias = torch.randn(5, device=DEV)
    gpuos.submit_matmul(a, b, out, bias=bias, beta=2.0)   # an empty sum: out = beta * bias
    gpuos.submit_matmul(torch.randn(0, 4, device=DEV), torch.randn(4, 5, device=DEV), torch.empty(0, 5, device=DEV))
    gpuos.flush()
    torch.testing.assert_close(out, (2.0 * bias).expand(3, 5))


@pytest.mark.parametrize("case", ["dims", "chain", "dtype", "overlap", "bias", "expanded_out"])
def test_matmul_argument_errors_name_the_problem(rt, case):
    a = torch.randn(4, 8, device=DEV)
    b = torch.randn(8, 6, device=DEV)
    out = torch.empty(4, 6, device=DEV)
    before = gpuos.stats()["submitted"]
    if case == "dims":
        exc, args, kw, words = ValueError, (a[None], b, out), {}, "2-D"
    elif case == "chain":
        exc, args, kw, words = ValueError, (a, torch.randn(7, 6, device=DEV), out), {}, "do not chain"
    elif case == "dtype":
        exc, args, kw, words = TypeError, (a.half(), b, out), {}, "one dtype"
    elif case == "overlap":
        sq = torch.randn(8, 8, device=DEV)
        exc, args, kw, words = ValueError, (sq, sq, sq), {}, "overlaps"
    elif case == "bias":
        exc, args, kw, words = ValueError, (a, b, out), {"bias": torch.randn(5, device=DEV)}, "broadcast"
    else:
        exc, args, kw, words = ValueError, (a, b, torch.empty(1, 6, device=DEV).expand(4, 6)), {}, "stride-0"
    with pytest.raises(exc, match=words) as ei:
        gpuos.submit_matmul(*args, **kw)
    assert "submit_matmul" in str(ei.value)
    assert gpuos.stats()["submitted"] == before, "a rejected call recorded work"


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("rows", [(1,), (4,), (1, 1), (2, 3)], ids=lambda r: "x".join(map(str, r)))
def test_linear_chain_under_the_scheduler_runs_in_the_worker(rt, worker_matmul, dtype, rows):
    """linear -> gelu -> linear (+ residual) of a decode-sized batch under scheduler_context: aten::mm / addmm are
    recorded (no matmul fallback), the result matches eager."""
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(5)
    x = torch.randn(*rows, 256, generator=g, device=DEV).to(dt)
    w1, b1 = torch.randn(512, 256, generator=g, device=DEV).to(dt) / 16, torch.randn(512, generator=g, device=DEV).to(dt)
    w2 = torch.randn(256, 512, generator=g, device=DEV).to(dt) / 22

    def f(x):
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
        return x + torch.nn.functional.linear(h, w2)

    ref = f(x)
    fb0 = dict(gpuos.stats()["fallback_ops"])
    with torch.no_grad(), gpuos.scheduler_context():
        y = f(x)
    fb = {k: v - fb0.get(k, 0) for k, v in gpuos.stats()["fallback_ops"].items() if v - fb0.get(k, 0)}
    assert not any("mm" in k for k in fb), fb
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dt]
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=tol)


def _new_gelu(x):  # GPT-2's NewGELUActivation, op by op as HF writes it
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _conv1d(x, w, b):  # GPT-2's Conv1D: addmm of the bias, a row-major K x N weight, read back through a view
    return torch.addmm(b, x.view(-1, x.size(-1)), w).view(*x.shape[:-1], w.size(1))


def _epilogue_on_off(fn, *args):
    """fn(*args) under the scheduler with matmul epilogues on and off: {on: (result, act_epilogues added,
    dual_epilogues added)}."""
    got = {}
    for on in (True, False):
        gpuos_ext._testing.set_mm_epilogue(on)
        try:
            s0 = gpuos.stats()
            with torch.no_grad(), gpuos.scheduler_context():
                y = fn(*args)
            s1 = gpuos.stats()
            got[on] = (y, s1["act_epilogues"] - s0["act_epilogues"], s1["dual_epilogues"] - s0["dual_epilogues"])
        finally:
            gpuos_ext._testing.set_mm_epilogue(True)
    return got


def _check_on_off(got, ref, dt):
    """Every result of _epilogue_on_off has eager's dtype and shape and its values (to dt's tolerance)."""
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dt]
    for on, (y, _, _) in got.items():
        assert y.dtype == ref.dtype and y.shape == ref.shape, (on, y.dtype, y.shape)
        torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=tol, msg=lambda m: f"epilogue {on}: {m}")


ACTS = {
    "new_gelu_conv1d": (lambda x, w, b: _new_gelu(_conv1d(x, w.t().contiguous(), b))),
    "gelu_tanh_linear": (lambda x, w, b: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b),
                                                                  approximate="tanh")),
    "relu_linear": (lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w))),
    "silu_scale_linear": (lambda x, w, b: torch.nn.functional.silu(torch.nn.functional.linear(x, w, b)) * 0.5 + 1.0),
    # a chain whose output dtype is not the product's (16-bit: the product rounded, then fp32 from the cast on)
    "cast_scale_linear": (lambda x, w, b: torch.nn.functional.linear(x, w, b).float() * 0.5),
    # a lone cast of the whole product: an LM head's logits .float() (fp32: no cast, so no epilogue either)
    "cast_conv1d": (lambda x, w, b: _conv1d(x, w.t().contiguous(), b).float()),
    # an LM head: the last position's logits, cast (F.linear's _unsafe_view of its mm, then a select of it; at
    # 4 rows the select is part of the product: no epilogue)
    "logits_cast": (lambda x, w, b: torch.nn.functional.linear(x, w)[:, -1].float()),
}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("rows", [1, 4])
def test_activation_chains_run_as_matmul_epilogues(rt, worker_matmul, dtype, act, rows):
    """An elementwise chain whose only tensor input is a matmul's result (nothing else reads the product) runs as
    the matmul's epilogue program (sched/epilogue.cpp, kFlagMmEpilogue): counted in act_epilogues, same values as
    eager and as the two-level lowering (set_mm_epilogue(False)), every path -- mma (linear), ncol1 / ncol
    (GPT-2's Conv1D weight at M = 1 / 4), per-warp tiles (fp32) -- and with a cast to fp32 (the product's own
    dtype keeps its path and its rounding)."""
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(rows + len(act))
    x = torch.randn(1, rows, 256, generator=g, device=DEV).to(dt)
    w = (torch.randn(768, 256, generator=g, device=DEV) / 16).to(dt)
    b = torch.randn(768, generator=g, device=DEV).to(dt)
    fn = ACTS[act]
    ref = fn(x, w, b)
    got = _epilogue_on_off(fn, x, w, b)
    _check_on_off(got, ref, dt)
    casts = act in ("cast_conv1d", "logits_cast")
    folds = 0 if (casts and dt == torch.float32) or (act == "logits_cast" and rows > 1) else 1
    assert got[True][1] == folds and got[False][1] == 0, {k: v[1] for k, v in got.items()}
    # the chain's own rounding is kept: within one rounding of the two-level lowering (same product, same program;
    # only the compiler's contraction of a functor may differ between the two copies of the interpreter)
    within_one_rounding(got[True][0], got[False][0], EPS[dt])


def test_a_product_read_elsewhere_keeps_its_own_level(rt, worker_matmul):
    """The product is also returned (Python sees it): no epilogue; both values as eager."""
    g = torch.Generator(device=DEV).manual_seed(11)
    x = torch.randn(1, 256, generator=g, device=DEV).half()
    w = (torch.randn(512, 256, generator=g, device=DEV) / 16).half()

    def fn(x):
        h = torch.nn.functional.linear(x, w)
        return h, torch.relu(h) * 2.0

    ref = fn(x)
    before = gpuos.stats()["act_epilogues"]
    with torch.no_grad(), gpuos.scheduler_context():
        got = fn(x)
    assert gpuos.stats()["act_epilogues"] == before
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_captured_mlp_has_one_level_less_with_the_epilogue(rt, worker_matmul):
    """A captured GPT-2 MLP (Conv1D, NewGELU, Conv1D): the activation is not a level of its own; replays equal
    eager, with new inputs."""
    g = torch.Generator(device=DEV).manual_seed(12)
    w1 = (torch.randn(256, 1024, generator=g, device=DEV) / 16).half()
    b1 = torch.randn(1024, generator=g, device=DEV).half()
    w2 = (torch.randn(1024, 256, generator=g, device=DEV) / 32).half()
    b2 = torch.randn(256, generator=g, device=DEV).half()

    def mlp(x):
        return _conv1d(_new_gelu(_conv1d(x, w1, b1)), w2, b2)

    levels = captured_levels(mlp, lambda: torch.randn(1, 1, 256, generator=g, device=DEV).half(),
                             gpuos_ext._testing.set_mm_epilogue,
                             lambda y, r: torch.testing.assert_close(y, r, rtol=2e-2, atol=2e-2))
    assert levels[True] == levels[False] - 1, levels


def test_hot_epilogue_gets_tier2_code(rt, worker_matmul):
    """An activation epilogue's program counts toward tier 2 like a fused chain's (live runs and replays): once
    hot, a generation carries its straight-line code (worker.cu epi_spec; linked: gpuos_linked_epi_eval), the
    worker hands over to it, and the products through it keep eager's values -- within one rounding of the
    interpreted epilogue's (the compiler may contract the two copies of a functor differently)."""
    g = torch.Generator(device=DEV).manual_seed(21)
    x = torch.randn(1, 1, 256, generator=g, device=DEV).half()
    w = (torch.randn(256, 640, generator=g, device=DEV) / 16).half()
    b = torch.randn(640, generator=g, device=DEV).half()

    def f(x):  # a program of its own: this test's scalar (0.8125) is in no other test's chain
        return _new_gelu(_conv1d(x, w, b)) * 0.8125

    ref = f(x)
    interp, got = hot_then_tier2(f, x, "act_epilogues")
    for y in interp + [got]:
        torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)
    within_one_rounding(got, interp[0], EPS[torch.float16])


def _llama_mlp_act(x, wg, wu):  # LlamaMLP's act_fn(gate_proj(x)) * up_proj(x), as HF writes it
    return torch.nn.functional.silu(torch.nn.functional.linear(x, wg)) * torch.nn.functional.linear(x, wu)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("rows", [1, 3, 8, 12])
@pytest.mark.parametrize("N", [688, 1000])
def test_gate_up_products_run_as_one_dual_item(rt, worker_matmul, dtype, rows, N):
    """Llama's silu(gate) * up: two products of the same activations, no bias, whose only reader is one chain,
    run as one dual item per column tile (kFlagMmDual: both weights' passes, each product rounded to its dtype, the
    pair through the chain's two-input program) -- for 16-bit tensor-core products of <= 8 rows. Otherwise
    (fp32: the per-warp path; 12 rows) both products and the chain go as before. Same values as eager, and within
    one rounding of the three-level lowering (epilogues off); N = 1000 leaves a partial column tile."""
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(rows * 7 + N)
    x = torch.randn(1, rows, 256, generator=g, device=DEV).to(dt)
    wg = (torch.randn(N, 256, generator=g, device=DEV) / 16).to(dt)
    wu = (torch.randn(N, 256, generator=g, device=DEV) / 16).to(dt)
    ref = _llama_mlp_act(x, wg, wu)
    got = _epilogue_on_off(_llama_mlp_act, x, wg, wu)
    _check_on_off(got, ref, dt)
    dual = dt != torch.float32 and rows <= 8
    assert got[True][1:] == ((1, 1) if dual else (0, 0)) and got[False][1:] == (0, 0), \
        {k: v[1:] for k, v in got.items()}
    within_one_rounding(got[True][0], got[False][0], EPS[dt])


@pytest.mark.parametrize("case", ["gate_returned", "other_activations", "bias"])
def test_products_that_are_not_a_pair_stay_two_items(rt, worker_matmul, case):
    """No dual item where the pair is not one: a product Python also sees, two different activations, a bias
    (an addmm) -- the products keep their own level (or the single-product epilogue where one qualifies); values
    as eager."""
    g = torch.Generator(device=DEV).manual_seed(31)
    x = torch.randn(1, 256, generator=g, device=DEV).half()
    x2 = torch.randn(1, 256, generator=g, device=DEV).half()
    wg = (torch.randn(512, 256, generator=g, device=DEV) / 16).half()
    wu = (torch.randn(512, 256, generator=g, device=DEV) / 16).half()
    bu = torch.randn(512, generator=g, device=DEV).half()
    lin = torch.nn.functional.linear

    def fn(x, x2):
        if case == "gate_returned":
            h = lin(x, wg)
            return h, torch.nn.functional.silu(h) * lin(x, wu)
        if case == "other_activations":
            return (torch.nn.functional.silu(lin(x, wg)) * lin(x2, wu),)
        return (torch.nn.functional.silu(lin(x, wg)) * lin(x, wu, bu),)

    ref = fn(x, x2)
    got = _epilogue_on_off(fn, x, x2)
    assert got[True][2] == 0, got[True][1:]
    for y, r in zip(got[True][0], ref):
        torch.testing.assert_close(y, r, rtol=2e-2, atol=2e-2)


def test_captured_llama_mlp_has_one_level_less_with_the_dual_item(rt, worker_matmul):
    """A captured LlamaMLP (gate / up, silu * up, down): gate, up and the chain are one level; replays equal eager,
    with new inputs."""
    g = torch.Generator(device=DEV).manual_seed(13)
    wg = (torch.randn(688, 256, generator=g, device=DEV) / 16).half()
    wu = (torch.randn(688, 256, generator=g, device=DEV) / 16).half()
    wd = (torch.randn(256, 688, generator=g, device=DEV) / 32).half()

    def mlp(x):
        return torch.nn.functional.linear(_llama_mlp_act(x, wg, wu), wd)

    levels = captured_levels(mlp, lambda: torch.randn(1, 1, 256, generator=g, device=DEV).half(),
                             gpuos_ext._testing.set_mm_epilogue,
                             lambda y, r: torch.testing.assert_close(y, r, rtol=2e-2, atol=2e-2))
    assert levels[True] == levels[False] - 1, levels


def test_hot_dual_item_gets_tier2_code(rt, worker_matmul):
    """A dual item's two-input program counts toward tier 2 like any epilogue's: once hot, the worker runs its
    straight-line code (worker.cu epi_spec with both products); values as eager, within one rounding of the
    interpreted item's."""
    g = torch.Generator(device=DEV).manual_seed(22)
    x = torch.randn(1, 1, 256, generator=g, device=DEV).half()
    wg = (torch.randn(640, 256, generator=g, device=DEV) / 16).half()
    wu = (torch.randn(640, 256, generator=g, device=DEV) / 16).half()

    def f(x):  # a program of its own: this test's scalar (0.6875) is in no other test's chain
        return _llama_mlp_act(x, wg, wu) * 0.6875

    ref = f(x)
    interp, got = hot_then_tier2(f, x, "dual_epilogues")
    for y in interp + [got]:
        torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)
    within_one_rounding(got, interp[0], EPS[torch.float16])


def test_more_rows_than_the_worker_takes_stay_with_cublas(rt, worker_matmul):
    a, w = torch.randn(65, 128, device=DEV), torch.randn(64, 128, device=DEV)
    before = gpuos.stats()["fallbacks"].get("matmul_rows", 0)
    with torch.no_grad(), gpuos.scheduler_context():
        y = a @ w.t()
    assert gpuos.stats()["fallbacks"].get("matmul_rows", 0) == before + 1
    torch.testing.assert_close(y, a @ w.t())


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("q_len", [1, 4])
def test_eager_attention_pattern_bmm_under_the_scheduler(rt, worker_matmul, dtype, q_len):
    """GPT-2's eager attention at decode: softmax(q @ k^T * scale + mask) @ v over 12 heads -> aten::bmm twice
    (q @ k^T: the K-contiguous path; probs @ v: the row-major path), baddbmm with a mask; same as eager."""
    dt = DTYPES[dtype]
    g = torch.Generator(device=DEV).manual_seed(q_len)
    B, H, L, D = 1, 12, 37, 64
    q = torch.randn(B, H, q_len, D, generator=g, device=DEV).to(dt)
    k = torch.randn(B, H, L, D, generator=g, device=DEV).to(dt)
    v = torch.randn(B, H, L, D, generator=g, device=DEV).to(dt)
    mask = torch.randn(B * H, q_len, L, generator=g, device=DEV).to(dt)

    def attn(q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) / D ** 0.5
        p = torch.softmax(s.float(), -1).to(dt)
        o1 = torch.matmul(p, v)
        s2 = torch.baddbmm(mask, q.reshape(B * H, q_len, D), k.reshape(B * H, L, D).transpose(1, 2), alpha=0.125)
        return o1, s2

    ref = attn(q, k, v)
    fb0 = dict(gpuos.stats()["fallback_ops"])
    with torch.no_grad(), gpuos.scheduler_context():
        got = attn(q, k, v)
    fb = {k_: n - fb0.get(k_, 0) for k_, n in gpuos.stats()["fallback_ops"].items() if n - fb0.get(k_, 0)}
    assert not any("bmm" in k_ for k_ in fb), fb
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dt]
    for g_, r in zip(got, ref):
        torch.testing.assert_close(g_.float(), r.float(), rtol=tol, atol=tol)
