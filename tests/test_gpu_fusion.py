"""Flush-time fusion of the scheduler's elementwise chains (issue #5) on the GPU.

Under gpuos.scheduler_context(), chains of table ops whose intermediates nothing else can read are lowered
into one interpreter sub-op (device_src/interp.h) and those intermediates are never written. Random chains
of 2-12 ops over random shapes, dtypes and broadcasts must equal eager; intermediates the program still holds
(or views of them) must be materialised; writes between a producer and its consumer must be respected.
"""

import random
import time
import zlib

import pytest
import torch
from torch.testing import assert_close

import gpuos
import gpuos_ext
from _helpers import hand_over_to_tier2

pytestmark = pytest.mark.gpu

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu, "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "hardsigmoid": torch.nn.functional.hardsigmoid, "hardswish": torch.nn.functional.hardswish,
    "leaky_relu": lambda x: torch.nn.functional.leaky_relu(x, 0.1), "hardtanh": torch.nn.functional.hardtanh,
    "elu": torch.nn.functional.elu, "softplus": torch.nn.functional.softplus,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.75),
}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
          "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5)}
SHAPES = [(257,), (4, 33), (3, 5, 7), (2048,), (8, 1024), (2, 3, 4, 5)]


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _stats():
    return gpuos.stats()


def _make_inputs(rng, shape, n):
    """First input has the full shape; the others are full, a trailing-dims row, a leading column, or 0-d."""
    xs = []
    for i in range(n):
        dt = rng.choice(DTYPES)
        kind = "full" if i == 0 else rng.choice(["full", "full", "row", "col", "scalar"])
        if kind == "row":
            sh = shape[1:] if len(shape) > 1 else shape
        elif kind == "col":
            sh = (shape[0],) + (1,) * (len(shape) - 1)
        elif kind == "scalar":
            sh = ()
        else:
            sh = shape
        xs.append(torch.randn(sh, device=DEV).to(dt))
    return xs


def _make_spec(rng, ninputs, nops):
    """A chain: each step applies a unary op, or a binary op with an input / a constant / a side chain."""
    spec = []
    for _ in range(nops):
        r = rng.random()
        if r < 0.45:
            spec.append(("u", rng.choice(sorted(UNARY))))
        elif r < 0.75:
            spec.append(("b", rng.choice(sorted(BINARY)), ("in", rng.randrange(ninputs))))
        elif r < 0.9:
            spec.append(("b", rng.choice(sorted(BINARY)), ("const", round(rng.uniform(-2, 2), 3))))
        else:  # a side chain of one unary op over an input, combined (a tree, not a list)
            spec.append(("b", rng.choice(["add", "mul", "maximum"]),
                         ("side", rng.randrange(ninputs), rng.choice(sorted(UNARY)))))
    return spec


def _run(spec, xs):
    v = xs[0]
    for step in spec:  # rebinding v drops the previous intermediate: only the ops hold it
        if step[0] == "u":
            v = UNARY[step[1]](v)
            continue
        _, name, arg = step
        if arg[0] == "in":
            other = xs[arg[1]]
        elif arg[0] == "const":
            other = arg[1]
        else:
            other = UNARY[arg[2]](xs[arg[1]])
        if isinstance(other, float) and name in ("maximum", "minimum"):
            other = torch.tensor(other, device=DEV)
        v = BINARY[name](v, other)
    return v


def _lowest(dtypes):
    return max(dtypes, key=lambda d: TOL[d][0])


@pytest.mark.parametrize("seed", range(40))
def test_random_chain_matches_eager(rt, seed):
    rng = random.Random(seed)
    shape = rng.choice(SHAPES)
    ninputs = rng.randint(1, 4)
    xs = _make_inputs(rng, shape, ninputs)
    spec = _make_spec(rng, ninputs, rng.randint(2, 12))
    exp = _run(spec, xs)
    before = _stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        got = _run(spec, xs)
    after = _stats()
    assert got.dtype == exp.dtype and got.shape == exp.shape
    rtol, atol = TOL[_lowest([x.dtype for x in xs])]
    assert_close(got, exp, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"chain {spec}: {m}")
    assert after["ops_intercepted"] > before["ops_intercepted"]


def test_chains_are_fused_and_intermediates_elided(rt):
    """A 5-op chain per iteration (W2): all but the last iteration's intermediates are dead at flush."""
    a, b, c, d = (torch.randn(2048, device=DEV) for _ in range(4))
    before = _stats()
    outs = []
    with gpuos.scheduler_context(auto_flush_ms=0):
        for _ in range(20):
            x = a + b
            y = x * c
            z = torch.relu(y)
            w = torch.sigmoid(z)
            outs.append(w / d)
    after = _stats()
    exp = torch.sigmoid(torch.relu((a + b) * c)) / d
    for o in outs:
        assert_close(o, exp, rtol=1e-5, atol=1e-6)
    groups = after["fused_groups"] - before["fused_groups"]
    fused = after["fused_ops"] - before["fused_ops"]
    assert groups >= 19 and fused >= 19 * 5, (groups, fused)
    assert after["fused_subops"] > before["fused_subops"]
    h0, h1 = before["flush_host_us"], after["flush_host_us"]
    assert all(h1[k] > h0[k] for k in ("analyse_us", "emit_us", "publish_us")), (h0, h1)


def test_live_intermediates_are_materialised(rt):
    a, b = torch.randn(1000, device=DEV), torch.randn(1000, device=DEV)
    before = _stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        x = a * b           # still referenced below: must be written
        y = torch.tanh(x)
        z = y + 1
    after = _stats()
    assert_close(x, a * b, rtol=0, atol=0)
    assert_close(y, torch.tanh(a * b), rtol=1e-6, atol=1e-6)
    assert_close(z, torch.tanh(a * b) + 1, rtol=1e-6, atol=1e-6)
    assert after["fused_ops"] == before["fused_ops"]


def test_view_of_intermediate_keeps_it(rt):
    a = torch.randn(4, 64, device=DEV)
    with gpuos.scheduler_context(auto_flush_ms=0):
        x = a * 3
        row = x[1]          # a view: the storage has another reader
        y = x + 1
        del x
    assert_close(row, a[1] * 3, rtol=0, atol=0)
    assert_close(y, a * 3 + 1, rtol=0, atol=0)


def test_write_between_producer_and_consumer(rt):
    """x = a*2; a += 1; y = x + 1: evaluating a*2 at y's position would read the updated a."""
    a = torch.randn(512, device=DEV)
    a0 = a.clone()
    with gpuos.scheduler_context(auto_flush_ms=0):
        x = a * 2
        a.add_(1)
        y = x + 1
        del x
    assert_close(y, a0 * 2 + 1, rtol=0, atol=0)
    assert_close(a, a0 + 1, rtol=0, atol=0)


def _chain_with_write_between(x0, written):
    """z = (x0 * 2 + 1) * 3 recorded with `written += 1` between y = x + 1 and z = y * 3."""
    with gpuos.scheduler_context(auto_flush_ms=0):
        x = x0 * 2
        y = x + 1
        del x
        written.add_(1)
        z = y * 3
        del y
    return z


def test_write_between_hits_a_grandchild_leaf(rt):
    """The hazard check covers the whole subtree: a written between y = f(x(a)) and z = g(y) blocks fusing y into
    z; a write to unrelated memory in the same place does not block fusion."""
    a, c = torch.randn(512, device=DEV), torch.randn(512, device=DEV)
    a0, c0 = a.clone(), c.clone()
    z = _chain_with_write_between(a, a)
    assert_close(z, (a0 * 2 + 1) * 3, rtol=1e-6, atol=1e-6)
    assert_close(a, a0 + 1, rtol=0, atol=0)
    before = _stats()
    z = _chain_with_write_between(a0, c)
    after = _stats()
    assert_close(z, (a0 * 2 + 1) * 3, rtol=1e-6, atol=1e-6)
    assert_close(c, c0 + 1, rtol=0, atol=0)
    assert after["fused_ops"] - before["fused_ops"] == 3, (before["fused_ops"], after["fused_ops"])


def test_fused_away_intermediates_are_recycled(rt):
    """Storages of fused-away intermediates serve later outputs of the same size on the same stream; live tensors
    (results, materialised intermediates) are never handed out again, and another stream gets none of them."""
    a, b = torch.randn(4096, device=DEV), torch.randn(4096, device=DEV)
    with gpuos.scheduler_context(auto_flush_ms=0):
        for _ in range(8):
            torch.sigmoid(a * b) + 1  # a * b and sigmoid are fused away: their storages go to the pool
        live = a * 3                   # materialised (still referenced): never pooled
        t = torch.tanh(live) - 1
    live_before = live.clone()
    before = _stats()
    keep = []
    with gpuos.scheduler_context(auto_flush_ms=0):
        for i in range(8):
            keep.append(torch.sigmoid(a * (b + i)) * 2)
    after = _stats()
    assert after["recycled_outputs"] > before["recycled_outputs"], (before, after)
    for i, k in enumerate(keep):
        assert_close(k, torch.sigmoid(a * (b + i)) * 2, rtol=1e-5, atol=1e-6)
    ptrs = [k.data_ptr() for k in keep] + [live.data_ptr(), t.data_ptr()]
    assert len(set(ptrs)) == len(ptrs), "a live tensor's memory was handed out again"
    assert_close(live, live_before, rtol=0, atol=0)
    assert_close(t, torch.tanh(a * 3) - 1, rtol=1e-5, atol=1e-6)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    mid = _stats()
    with torch.cuda.stream(side):
        with gpuos.scheduler_context(auto_flush_ms=0):
            y = torch.sigmoid(a * b) + 1
    torch.cuda.current_stream().wait_stream(side)
    assert _stats()["recycled_outputs"] == mid["recycled_outputs"], "a storage crossed streams"
    assert_close(y, torch.sigmoid(a * b) + 1, rtol=1e-5, atol=1e-6)


def test_inplace_root_reads_its_own_output(rt):
    a, b = torch.randn(300, device=DEV), torch.randn(300, device=DEV)
    a0 = a.clone()
    with gpuos.scheduler_context(auto_flush_ms=0):
        a.add_(torch.sigmoid(b) * a)   # the fused child reads a, the root writes a: same index
    assert_close(a, a0 + torch.sigmoid(b) * a0, rtol=1e-6, atol=1e-6)


def test_fp16_intermediates_round_like_eager(rt):
    """Intermediates are rounded to their dtype as eager stores them: fp16 chains agree to 1 ulp."""
    x = (torch.randn(4096, device=DEV) * 3).half()
    y = torch.randn(4096, device=DEV).half()

    def f(x, y):
        t = x * y
        t = t + 0.1
        t = t * t
        return t - y

    exp = f(x, y)
    with gpuos.scheduler_context(auto_flush_ms=0):
        got = f(x, y)
    assert_close(got, exp, rtol=1e-3, atol=1e-3)


def test_same_chain_reuses_its_program(rt):
    a = torch.randn(100, device=DEV)

    def f(a):
        t = a * 2
        return torch.sigmoid(t) + 1

    with gpuos.scheduler_context(auto_flush_ms=0):
        warm = f(a)  # kept: a result nobody holds is never computed (csrc/sched/rewrite.h)
    mid = _stats()
    for _ in range(3):
        with gpuos.scheduler_context(auto_flush_ms=0):
            out = f(a)
    after = _stats()
    assert after["programs"] == mid["programs"]
    assert after["fused_groups"] > mid["fused_groups"]
    assert_close(out, torch.sigmoid(a * 2) + 1, rtol=1e-6, atol=1e-6)
    assert_close(warm, out, rtol=0, atol=0)


def test_fusion_switch(rt):
    a = torch.randn(100, device=DEV)
    gpuos_ext.set_fusion(False)
    try:
        before = _stats()
        with gpuos.scheduler_context(auto_flush_ms=0):
            out = torch.relu(a * 2) + 1
        after = _stats()
        assert after["fused_ops"] == before["fused_ops"]
    finally:
        gpuos_ext.set_fusion(True)
    assert_close(out, torch.relu(a * 2) + 1, rtol=0, atol=0)


def test_eager_ops_flush_only_when_they_touch_deferred_memory(rt):
    """An eager op on unrelated tensors runs ahead of the deferred batch; one that reads a deferred result,
    or writes a deferred op's input, publishes the batch first."""
    a = torch.randn(256, device=DEV)
    a0 = a.clone()
    m = torch.randn(64, 64, device=DEV)
    before = _stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        y = torch.sigmoid(a) * 2
        mm = m @ m                    # independent: no flush
        mid = _stats()
        z = y.sum().item()            # reads a deferred result: flush first
        s = torch.relu(a)
        a.copy_(torch.zeros_like(a))  # writes what the deferred relu reads: flush first
    after = _stats()
    assert _delta_cause(before, mid, "dependency") == 0
    assert mid["independent_eager"] > before["independent_eager"]
    assert _delta_cause(mid, after, "dependency") >= 2
    assert_close(mm, m @ m)
    assert abs(z - (torch.sigmoid(a0) * 2).sum().item()) < 1e-3
    assert_close(s, torch.relu(a0), rtol=0, atol=0)  # relu of the original a, not of the zeros written after
    assert torch.equal(a, torch.zeros_like(a))


def _delta_cause(before, after, cause):
    return after["flushes_by_cause"].get(cause, 0) - before["flushes_by_cause"].get(cause, 0)


def test_hot_chain_gets_specialized_code_in_a_later_generation(rt):
    """Tier 2: after `specialize_after` runs, a program gets straight-line NVRTC code in a new generation,
    compiled in the background (recording never waits); once the worker idles out, the next flush hands over
    to that generation and the chain keeps matching eager through the specialized path."""
    a = torch.randn(3000, device=DEV)
    b = torch.randn(3000, device=DEV, dtype=torch.float16)

    def f(a, b):
        t = a * b                # fp32 (promoted)
        t = torch.tanh(t) * 0.375
        return torch.clamp(t + b, -0.9, 0.8)

    exp = f(a, b)
    gpuos_ext.set_specialize_after(3)
    try:
        req0 = _stats()["specializations_requested"]
        for _ in range(4):
            t0 = time.perf_counter()
            with gpuos.scheduler_context(auto_flush_ms=0):
                got = f(a, b)
            assert time.perf_counter() - t0 < 5.0, "recording waited for NVRTC"
            assert_close(got, exp, rtol=1e-5, atol=1e-5)
        assert _stats()["specializations_requested"] == req0 + 1
    finally:
        gpuos_ext.set_specialize_after(64)
    spec = hand_over_to_tier2()
    with gpuos.scheduler_context(auto_flush_ms=0):
        got = f(a, b)
    assert gpuos.generation_info()["active"][torch.cuda.current_device()] >= spec
    assert_close(got, exp, rtol=1e-5, atol=1e-5)
    with gpuos.scheduler_context(auto_flush_ms=0):
        got2 = f(a, b)
    assert_close(got2, exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fusion", [True, False])
def test_independent_chains_share_levels(rt, fusion):
    """Interleaved independent chains (W2) are emitted level by level: as many batch levels as a chain is long
    (fused: one), not one per op in recording order; results equal eager."""
    a, b, c = (torch.randn(2048, device=DEV) for _ in range(3))
    d = torch.rand(2048, device=DEV) + 0.5
    gpuos_ext.set_fusion(fusion)
    try:
        before, f0 = gpuos_ext.stats()["levels_split"], gpuos_ext.sched_stats()["sched_flushes"]
        outs = []
        with gpuos.scheduler_context(auto_flush_ms=0):
            for _ in range(100):
                outs.append(torch.sigmoid(torch.relu((a + b) * c)) / d)
        split = gpuos_ext.stats()["levels_split"] - before
        batches = gpuos_ext.sched_stats()["sched_flushes"] - f0  # several if an earlier test made a small ring
    finally:
        gpuos_ext.set_fusion(True)
    exp = torch.sigmoid(torch.relu((a + b) * c)) / d
    for o in outs:
        assert_close(o, exp, rtol=1e-5, atol=1e-6)
    # In recording order it was 4 splits per chain (400); by level, at most 4 per batch (none when fused).
    assert split <= (0 if fusion else 4) * batches, f"{split} level splits in {batches} batches"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fusion", [True, False])
def test_reordering_keeps_every_dependency(rt, seed, fusion):
    """Random programs of functional, in-place and out= ops over shared buffers and their slices (read-after-write,
    write-after-read, write-after-write on overlapping and disjoint ranges) equal eager under the scheduler,
    which emits them by dependency level instead of in recording order."""
    rng = random.Random(seed)
    n = 1024
    base = [torch.randn(n, device=DEV) for _ in range(4)]

    def views(bufs, i, j):
        return bufs[i] if j == 0 else bufs[i][(j - 1) * 256:j * 256]

    def program(bufs):
        temps = []
        for step in range(60):
            kind = rng.randrange(4)
            i, k = rng.randrange(4), rng.randrange(4)
            j = rng.randrange(5)  # 0: the whole buffer, 1-4: a quarter
            x, y = views(bufs, i, j), views(bufs, k, j)
            if kind == 0:
                temps.append(torch.sigmoid(x * 0.5) + y)
            elif kind == 1:
                x.add_(y, alpha=0.25)
            elif kind == 2:
                x.mul_(0.9)
                if temps and temps[-1].shape == x.shape:
                    x.sub_(temps[-1] * 0.1)
            else:
                torch.add(y, x, out=x)
        return temps

    state = rng.getstate()
    exp_bufs = [t.clone() for t in base]
    exp_temps = program(exp_bufs)
    rng.setstate(state)
    got_bufs = [t.clone() for t in base]
    gpuos_ext.set_fusion(fusion)
    try:
        before = gpuos.stats()["ops_intercepted"]
        with gpuos.scheduler_context(auto_flush_ms=0):
            got_temps = program(got_bufs)
        assert gpuos.stats()["ops_intercepted"] - before > 30
    finally:
        gpuos_ext.set_fusion(True)
    for g, e in zip(got_bufs + got_temps, exp_bufs + exp_temps):
        assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_full_program_table_leaves_chains_unfused_and_counts_them():
    """The process's fused-program table holds 1,024 programs (device_src/interp.h kMaxPrograms) and evicts none:
    past it, new chains run unfused -- still right -- and stats()["fusion_table_full"] counts them. In a child
    process: a full table would leave every later test's chains unfused."""
    from _helpers import describe, run_python
    proc = run_python("""
        import torch, gpuos
        x = torch.randn(4096, device="cuda")
        cs = [1.0 + k / 4096 for k in range(1100)]  # distinct constants: a new program per chain
        with gpuos.scheduler_context(size_threshold=1 << 20):
            ys = [torch.sigmoid(x * c + 0.5) - x for c in cs]
        bad = sum(not torch.allclose(y, torch.sigmoid(x * c + 0.5) - x, atol=1e-5) for y, c in zip(ys, cs))
        s = gpuos.stats()
        print("RESULT", bad, s["fusion_table_full"], s["programs"])
    """, timeout=240)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and line, describe(proc)
    bad, full, programs = (int(v) for v in line[0].split()[1:])
    assert bad == 0 and full > 0 and programs <= 1024, line[0]
