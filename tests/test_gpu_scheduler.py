"""Transparent scheduler on the GPU: inference-like snippets run eagerly and under gpuos.scheduler_context()
from identical fresh random CUDA inputs must agree (torch.testing.assert_close; fp16/bf16 tolerances where
the snippet computes in half precision). Most snippets must also have been batched (ops_intercepted grows).

Also: torch.cuda.synchronize() inside the context returns; the auto-flush timer fires while the host spins
without touching tensors; four threads, each in its own context on the same device, stay correct; the
scheduler's counters (ops_intercepted, fallbacks['size'], flushes_by_cause).

Comparisons happen after the context exited (exit flushes, stream-ordered), or inside it through ops that
fall back to eager (which flush first).
"""

import gc
import math
import threading
import time
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import gpuos
import gpuos_ext

pytestmark = pytest.mark.gpu

DEV = "cuda"
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOL = {  # (rtol, atol)
    "f32": (1e-4, 1e-5),      # ulps of CUDA math functions (see _opref.ew_tol: COMPOSED)
    "f32_mm": (1e-4, 1e-4),   # a batched op feeding a matmul: ulp differences are summed
    "f16": (1e-2, 1e-2),
    "bf16": (2e-2, 2e-2),
}


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def randn(*shape, dtype=F32, scale=1.0):
    return torch.randn(*shape, device=DEV, dtype=dtype) * scale


def _tuple(r):
    return r if isinstance(r, tuple) else (r,)


def _compare(got, exp, tol, what="output"):
    got, exp = _tuple(got), _tuple(exp)
    assert len(got) == len(exp)
    rtol, atol = TOL[tol]
    for i, (g, e) in enumerate(zip(got, exp)):
        assert g.shape == e.shape and g.dtype == e.dtype, \
            f"{what} {i}: {g.dtype}{tuple(g.shape)} vs eager {e.dtype}{tuple(e.shape)}"
        if g.dtype in (torch.bool, torch.int64, torch.int32):
            assert torch.equal(g, e), f"{what} {i} differs"
        else:
            assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what} {i}: {m}")


def _delta(before, after, key, sub=None):
    if sub is None:
        return after[key] - before[key]
    return after[key].get(sub, 0) - before[key].get(sub, 0)


# ============================================================================ snippet corpus
# name -> (make() -> dict of CUDA inputs, run(dict) -> tensor(s), tolerance key, must_batch)

def mlp_gelu_make():
    return dict(x=randn(8, 64), w1=randn(64, 128, scale=64 ** -0.5), b1=randn(128),
                w2=randn(128, 32, scale=128 ** -0.5), b2=randn(32))


def mlp_gelu(d):
    h = F.gelu(d["x"] @ d["w1"] + d["b1"])              # mm falls back; add + gelu batched
    return F.gelu(h @ d["w2"] + d["b2"], approximate="tanh"), h


def mlp_silu_make():
    return dict(x=randn(16, 256, dtype=F16), w1=randn(256, 512, dtype=F16, scale=256 ** -0.5),
                w3=randn(256, 512, dtype=F16, scale=256 ** -0.5), w2=randn(512, 256, dtype=F16, scale=512 ** -0.5))


def mlp_silu(d):
    u = F.silu(d["x"] @ d["w1"]) * (d["x"] @ d["w3"])
    return u @ d["w2"] + d["x"], u


def layernorm_make():
    return dict(x=randn(12, 384, scale=3.0) + 1.5, g=randn(384), b=randn(384))


def layernorm(d):
    x = d["x"]
    xc = x - x.mean(-1, keepdim=True)
    var = (xc * xc).mean(-1, keepdim=True)
    y = xc / torch.sqrt(var + 1e-5)
    return y * d["g"] + d["b"]


def rmsnorm_make():
    return dict(x=randn(4, 512, dtype=BF16), w=randn(512, dtype=BF16))


def rmsnorm(d):
    x = d["x"]
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * d["w"]


def attention_make(dtype):
    def make():
        H, T, D = 8, 256, 64
        return dict(q=randn(H, 1, D, dtype=dtype), k=randn(H, T, D, dtype=dtype), v=randn(H, T, D, dtype=dtype))
    return make


def attention(d):
    q, k, v = d["q"], d["k"], d["v"]
    scale = q.shape[-1] ** -0.5
    p = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)   # bmm falls back; mul + softmax batched
    return p @ v, p


def residual_make():
    return dict(h=randn(16, 256), r=randn(16, 256), bias=randn(256), colb=randn(16), s=randn(1, 256))


def residual(d):
    h, r = d["h"], d["r"]
    out = r + (h + d["bias"])
    out2 = (h + d["bias"][None, :]) * 0.5 + r
    out3 = h * d["colb"][:, None] - d["s"]
    return out, out2, out3


def inplace_make():
    return dict(x=randn(32, 64), y=randn(32, 64), z=randn(64))


def inplace(d):
    x, y = d["x"], d["y"]
    assert x.add_(y) is x
    assert x.mul_(2) is x
    assert x.relu_() is x
    torch.relu_(y)
    y.sub_(d["z"], alpha=0.5)      # broadcast in place
    y.clamp_(-1.0, 1.0)
    d["z"].mul_(d["z"]).add_(1)
    torch.sigmoid_(d["z"])
    return x, y, d["z"]


def mixed_make():
    return dict(a=randn(8, 100), b=randn(8, 100), c=randn(100, dtype=BF16))


def mixed(d):
    a, b = d["a"], d["b"]
    r1 = a.half() + b.float()
    r2 = torch.sigmoid(a.half() * 2) + b          # f16 * number -> f16; f16 + f32 -> f32
    r3 = a.half() * d["c"]                        # f16 x bf16 -> f32
    r4 = torch.maximum(a.half(), d["c"].half())
    return r1, r2, r3, r4


def control_make():
    return dict(x=randn(512))


def control(d):
    x = d["x"]
    decisions = []
    for _ in range(10):
        npos = int((x > 0).sum().item())          # a host read inside the loop: pending work is flushed
        up = npos > x.numel() // 2
        decisions.append(up)
        x = torch.tanh((x - 0.3 if up else x + 0.2) * 1.3)
        if x.abs().amax(-1).item() > 0.999:        # amax batched, .item() flushes
            x = x * 0.5
    return x, torch.tensor(decisions)


def clamp_chain_make():
    return dict(x=randn(64, 64, scale=3.0), lo=randn(64) * 0.1 - 0.5, hi=randn(64) * 0.1 + 0.5)


def clamp_chain(d):
    x = d["x"]
    y = F.leaky_relu(F.hardtanh(x.clamp(-2.0, 2.0) * 1.5, -1.2, 1.2), 0.05)
    return (y, torch.clamp(x, d["lo"], d["hi"]), x.clamp(min=0.25), x.clamp(max=-0.25),
            torch.clamp_min(x, -0.1), torch.clamp_max(x, 0.1), F.relu6(x), F.elu(x), F.softplus(x))


def log_softmax_make():
    return dict(x=randn(32, 1000, scale=4.0), h=randn(16, 300, dtype=F16, scale=4.0))


def log_softmax(d):
    return F.log_softmax(d["x"], dim=-1), torch.log_softmax(d["h"], -1), F.softmax(d["h"], dim=-1)


def stable_softmax_make():
    return dict(x=randn(64, 200, scale=10.0))


def stable_softmax(d):
    x = d["x"]
    m = x.amax(-1, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(-1, keepdim=True), x.amin(-1)


def views_make():
    return dict(x=randn(16, 24))


def views(d):
    y = d["x"] + 1
    z = y[1:]                 # a view of a pending tensor (falls back: flushes first)
    z.mul_(3)                 # in place on the view, batched
    t = y.t() * 2             # non-contiguous input
    s = y[:, ::2].sum(-1)     # strided reduction
    w = y.view(8, 48) + 1
    return y, z, t, s, w


def freed_make():
    return dict(a=randn(1000), b=randn(1000), c=randn(40, 25))


def freed(d):
    a, b, c = d.pop("a"), d.pop("b"), d.pop("c")   # the dict no longer holds them
    t = a * 3
    u = t + b
    del t, a                   # freed while still pending
    v = torch.softmax(c * 2, -1)
    w = torch.sigmoid(u) - 1
    del b, c, u
    return w, v


def reductions_make():
    return dict(x=randn(48, 96), h=randn(96, 40, dtype=F16))


def reductions(d):
    x, h = d["x"], d["h"]
    return (x.sum(-1), x.mean(-1, keepdim=True), x.t().amax(-1), x.t().amin(-1, keepdim=True),
            x[:, 1::3].mean(-1), h.sum(-1), h.t().mean(-1))


def unary_zoo_make():
    return dict(x=randn(64, 33), y=randn(64, 33).abs() + 0.5, b=randn(128, dtype=BF16))


def unary_zoo(d):
    x, y = d["x"], d["y"]
    return (torch.exp(x), torch.log(y), torch.sqrt(y), torch.rsqrt(y), torch.sin(x), torch.cos(x), torch.erf(x),
            torch.tanh(x), -x, torch.reciprocal(y), F.hardswish(x), F.hardsigmoid(x), x.pow(2), y.pow(x),
            torch.minimum(x, y), x / y, torch.sub(x, y, alpha=0.25), torch.abs(x), F.gelu(x, approximate="tanh"))


def bf16_zoo(d):
    b = d["b"]
    return F.gelu(b), F.silu(b) * 2 + 1, torch.sigmoid(b) - b, F.hardswish(b)


CORPUS = {
    "mlp_gelu": (mlp_gelu_make, mlp_gelu, "f32_mm", True),
    "mlp_silu_f16": (mlp_silu_make, mlp_silu, "f16", True),
    "layernorm_meanvar": (layernorm_make, layernorm, "f32", True),
    "rmsnorm_bf16": (rmsnorm_make, rmsnorm, "bf16", True),
    "attention_decode_f32": (attention_make(F32), attention, "f32_mm", True),
    "attention_decode_f16": (attention_make(F16), attention, "f16", True),
    "residual_bias_broadcast": (residual_make, residual, "f32", True),
    "inplace_updates": (inplace_make, inplace, "f32", True),
    "mixed_f16_f32": (mixed_make, mixed, "f16", True),
    "item_control_flow": (control_make, control, "f32", True),
    "clamp_hardtanh_leaky_chain": (clamp_chain_make, clamp_chain, "f32", True),
    "log_softmax": (log_softmax_make, log_softmax, "f16", True),
    "amax_stable_softmax": (stable_softmax_make, stable_softmax, "f32", True),
    "views_of_pending": (views_make, views, "f32", True),
    "freed_while_pending": (freed_make, freed, "f32", True),
    "last_dim_reductions": (reductions_make, reductions, "f16", True),
    "unary_zoo": (unary_zoo_make, unary_zoo, "f32", True),
    "bf16_activations": (unary_zoo_make, bf16_zoo, "bf16", True),
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_snippet_matches_eager(rt, name):
    make, run, tol, must_batch = CORPUS[name]
    inputs = make()
    eager_in = {k: v.clone() for k, v in inputs.items()}
    sched_in = {k: v.clone() for k, v in inputs.items()}
    del inputs
    expected = run(eager_in)
    torch.cuda.synchronize()

    before = gpuos.stats()
    with gpuos.scheduler_context():
        got = run(sched_in)
        if name == "freed_while_pending":
            gc.collect()  # nothing but the runtime holds the inputs and temporaries now
    after = gpuos.stats()
    if name == "freed_while_pending":
        # reuse the freed blocks on the same stream: must not disturb the published batch
        junk = [torch.full((1000,), float("nan"), device=DEV) for _ in range(8)]
        del junk

    _compare(got, expected, tol)
    for k in sched_in:  # in-place snippets mutate their inputs identically
        _compare(sched_in[k], eager_in[k], tol, what=f"input {k!r}")
    if must_batch:
        assert _delta(before, after, "ops_intercepted") > 0, f"nothing was batched; stats {after}"


def test_host_reads_inside_context(rt):
    x = randn(300)
    with gpuos.scheduler_context(auto_flush_ms=0):  # no timer: only the reads may flush
        y = torch.sigmoid(x * 2 + 1)
        host = y.cpu()
        first = y[0].item()
        total = y.sum().item()
        text = repr(y)
    exp = torch.sigmoid(x * 2 + 1)
    assert_close(host, exp.cpu(), rtol=1e-4, atol=1e-5)
    assert math.isclose(first, exp[0].item(), rel_tol=1e-4, abs_tol=1e-5)
    assert math.isclose(total, exp.sum().item(), rel_tol=1e-4, abs_tol=1e-4)
    assert "tensor" in text


# ============================================================================ synchronisation and timer

@pytest.mark.watchdog(60)
def test_cuda_synchronize_inside_context_returns(rt):
    x = randn(4096)
    with gpuos.scheduler_context() as ctx:
        y = x + 1                       # pending, unpublished
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        dt1 = time.perf_counter() - t0
        z = torch.exp(y) * 2
        ctx.flush()                     # published: the worker may be resident now
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        dt2 = time.perf_counter() - t0
        w = z - y
    assert dt1 < 10.0 and dt2 < 10.0, f"torch.cuda.synchronize took {dt1:.2f} s / {dt2:.2f} s"
    assert_close(w, torch.exp(x + 1) * 2 - (x + 1), rtol=1e-4, atol=1e-5)


def test_timer_flushes_idle_pending_work(rt):
    x = randn(2048)
    with gpuos.scheduler_context(auto_flush_ms=2.0):
        before = gpuos.stats()["flushes_by_cause"].get("timer", 0)
        y = x + 1
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.05:   # touch no tensor: only the timer can flush
            pass
        after = gpuos.stats()["flushes_by_cause"].get("timer", 0)
    assert after > before, f"no timer flush within 50 ms (stats {gpuos.stats()})"
    assert_close(y, x + 1, rtol=0, atol=0)


def test_timer_disabled_with_zero(rt):
    x = randn(2048)
    with gpuos.scheduler_context(auto_flush_ms=0):
        before = gpuos.stats()["flushes_by_cause"].get("timer", 0)
        y = x * 3
        time.sleep(0.02)
        after = gpuos.stats()["flushes_by_cause"].get("timer", 0)
    assert after == before
    assert_close(y, x * 3, rtol=0, atol=0)


# ============================================================================ threads

def _in_threads(nthreads, body, name, join_s):
    """body(i) in thread i (the test's device, started together), then its stream synchronized; the results in
    thread order. A hung thread or an exception in any fails the test."""
    results, errors = [None] * nthreads, []
    barrier = threading.Barrier(nthreads)
    device = torch.cuda.current_device()

    def worker(i):
        try:
            torch.cuda.set_device(device)
            barrier.wait(timeout=30)
            r = body(i)
            torch.cuda.current_stream().synchronize()
            results[i] = r
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=worker, args=(i,), name=f"{name}-{i}") for i in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=join_s)
    assert not any(t.is_alive() for t in threads), f"a {name} thread hung"
    assert not errors, errors
    return results


@pytest.mark.watchdog(90)
def test_four_threads_independent_chains(rt):
    nthreads, steps = 4, 40
    xs = [randn(64, 128) for _ in range(nthreads)]
    bs = [randn(128) * 0.1 for _ in range(nthreads)]

    def chain(x, b, k0):
        for k in range(steps):
            x = torch.tanh(x * 0.9 + b) + 0.01 * (k + k0)
            if k % 10 == 9:
                x = x - x.mean(-1, keepdim=True)
        return torch.softmax(x, -1), x.sum(-1)

    expected = [chain(xs[i], bs[i], i) for i in range(nthreads)]
    torch.cuda.synchronize()

    def body(i):
        with gpuos.scheduler_context():
            r = chain(xs[i], bs[i], i)
            probe = r[1][0].item()   # a host read from this thread inside its context
        return r, probe

    before = gpuos.stats()["ops_intercepted"]
    results = _in_threads(nthreads, body, "sched", join_s=60)
    for i in range(nthreads):
        (got, probe) = results[i]
        _compare(got, expected[i], "f32_mm", what=f"thread {i}")
        assert math.isclose(probe, expected[i][1][0].item(), rel_tol=1e-4, abs_tol=1e-4)
    assert gpuos.stats()["ops_intercepted"] - before >= nthreads * steps * 3


# ============================================================================ the timer without the GIL

def _timer_race_run(x0, w, g, steps=240):
    """A decoder-like loop: a row program, a small matmul and a chain, an in-place write of every step's state
    (indexed by a tensor made from the host), eager cuBLAS reads of the deferred results every 5th step and host
    reads every 7th (dependency flushes): what the timer's publications interleave with. Every 3rd step an eager
    cuBLAS product of the inputs alone (no storage shared with deferred work: it may run ahead of a publication in
    flight) feeds the next step. The update is contractive (a rounding difference does not grow: an earlier form
    amplified 1e-6 to 1e-2 in 240 steps on some seeds) and each step moves x by ~0.2, so a stale read shows in that
    step's snapshot."""
    x, snaps, reads = x0.clone(), x0.new_zeros(steps, *x0.shape), []
    side = torch.zeros_like(x0)
    for k in range(steps):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g
        x = 0.5 * (x + x0) + 0.05 * torch.tanh(h @ w) + 0.2 * (k % 5) + 0.01 * side
        if k % 3 == 1:  # M = 8 * 16 rows of the inputs only: eager, independent of everything deferred
            side = (x0.repeat(16, 1) * (1 + 0.01 * (k % 11)) @ w)[: x0.shape[0]]
        snaps.index_copy_(0, torch.tensor([k], device=x.device), x.unsqueeze(0))
        if k % 5 == 4:  # M = 8 * 16 rows: eager cuBLAS, after the batch it reads was published
            x = x + (x.repeat(16, 1) @ w)[: x.shape[0]] * 0.01
        if k % 7 == 0:
            reads.append(float(x.sum()))
    return x, snaps, reads


def _timer_race_inputs():
    return randn(8, 256), randn(256, 256, scale=0.05), randn(256)


def _timer_race_check(got, exp, what):
    d = (got[1] - exp[1]).abs().flatten(1).amax(1)
    bad = (d > 1e-4 + 1e-4 * exp[1].abs().flatten(1).amax(1)).nonzero().flatten().tolist()
    assert not bad, f"{what}: state of step {bad[0]} differs from eager by {d[bad[0]]:.3g} ({len(bad)} steps differ)"
    assert_close(got[0], exp[0], rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: the final x differs from eager: {m}")
    assert len(got[2]) == len(exp[2])
    for i, (a, b) in enumerate(zip(got[2], exp[2])):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-3), f"{what}: host read {i}: {a} vs eager {b}"


@pytest.fixture
def timer_gil_mode():
    was = gpuos_ext.sched_timer_off_gil()
    yield gpuos_ext.sched_set_timer_off_gil
    gpuos_ext.sched_set_timer_off_gil(was)


@pytest.mark.watchdog(120)
@pytest.mark.parametrize("off_gil", [True, False], ids=["off_gil", "gil"])
def test_timer_publications_race_the_recording_thread(rt, worker_matmul, timer_gil_mode, off_gil):
    """The timer publishes every 0.2 ms while this thread records: without the GIL (the default) its emission and
    publication overlap the recording; every step's state and the host reads equal eager's either way. (The worker's
    matmul keeps the queue long between dependency flushes: the timer publishes most of it.)"""
    timer_gil_mode(off_gil)
    assert gpuos_ext.sched_timer_off_gil() == off_gil
    inputs = _timer_race_inputs()
    exp = _timer_race_run(*inputs)
    torch.cuda.synchronize()
    before = gpuos.stats()
    with gpuos.scheduler_context(auto_flush_ms=0.2):
        got = _timer_race_run(*inputs)
    after = gpuos.stats()
    timer = after["flushes_by_cause"].get("timer", 0) - before["flushes_by_cause"].get("timer", 0)
    assert timer > 0, f"the timer never published ({after['flushes_by_cause']})"
    assert after["ops_intercepted"] - before["ops_intercepted"] >= 240 * 5
    _timer_race_check(got, exp, f"off_gil={off_gil}")


@pytest.mark.watchdog(120)
def test_timer_publications_race_two_recording_threads(rt, worker_matmul, timer_gil_mode):
    """Two threads record on one device, each in its own context with its own timer publishing without the GIL:
    a timer may publish the other thread's ops; every thread's results equal eager's."""
    timer_gil_mode(True)
    nthreads = 2
    inputs = [_timer_race_inputs() for _ in range(nthreads)]
    expected = [_timer_race_run(*inp) for inp in inputs]
    torch.cuda.synchronize()
    def body(i):
        with gpuos.scheduler_context(auto_flush_ms=0.2):
            return _timer_race_run(*inputs[i])

    results = _in_threads(nthreads, body, "timer-race", join_s=90)
    for i in range(nthreads):
        _timer_race_check(results[i], expected[i], f"thread {i}")


@pytest.mark.watchdog(60)
def test_dependency_checks_while_the_timer_publishes(rt, timer_gil_mode):
    """The timer's publication held in flight (mu held, no GIL; a test hook): a dependency check of a tensor that
    shares no storage with it returns at once, a large op reading the cache it writes is recorded behind it (no
    size fallback, no wait), and a check of a tensor it writes waits until it is published. Results equal eager."""
    timer_gil_mode(True)
    a, z, rows = randn(32, 32), randn(64, 64), randn(1, 64)
    idx = torch.tensor([5], device=a.device)
    exp_cache = torch.zeros(64, 64, device=a.device).index_copy_(0, idx, rows)
    exp = (exp_cache * 2, a * 2 + 1, z @ z)
    torch.cuda.synchronize()
    hold = gpuos_ext._testing.hold_timer_publication
    with gpuos.scheduler_context(auto_flush_ms=0, size_threshold=1024):
        cache = torch.zeros(64, 64, device=a.device)   # 4,096 elements: over the threshold
        cache.index_copy_(0, idx, rows)                # deferred (64 elements of work)
        h = a * 2 + 1
        assert gpuos_ext.sched_stats()["deferred"] >= 2
        hold(True)
        timer = threading.Thread(target=gpuos_ext.sched_flush_due, args=(0.0,), name="timer-held")
        timer.start()
        dependent = None
        try:
            assert gpuos_ext._testing.timer_publication_held(10), "the timer's publication never reached the hold"
            assert gpuos_ext.sched_stats()["deferred"] == 0      # taken out of the queue: in flight
            before = gpuos_ext.sched_stats()
            assert gpuos_ext.sched_flush_for((z,), {}, "dependency") == []   # shares nothing: no wait
            mid = gpuos_ext.sched_stats()
            assert mid["inflight_skips"] == before["inflight_skips"] + 1
            m = z @ z                                        # an eager op beside the publication in flight
            c2 = cache * 2                                   # over the threshold, reads the cache in flight
            after = gpuos_ext.sched_stats()
            assert after["deferred"] == 1, "the large read of the cache in flight was not recorded"
            dependent = threading.Thread(target=gpuos_ext.sched_flush_for, args=((h,), {}, "dependency"),
                                         name="dependent")
            dependent.start()
            dependent.join(0.2)
            assert dependent.is_alive(), "a dependency check of a tensor in flight returned before its publication"
        finally:
            hold(False)
            timer.join(15)
            if dependent is not None:
                dependent.join(15)
        assert not timer.is_alive() and not (dependent and dependent.is_alive()), "a thread hung after the hold"
    for got, want, what in zip((c2, h, m), exp, ("cache * 2", "a * 2 + 1", "z @ z")):
        assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda msg: f"{what}: {msg}")
    assert_close(cache, exp_cache, rtol=0, atol=0)


def test_work_staged_after_the_timers_publication_is_waited_for(rt, timer_gil_mode):
    """Once the timer's publication has let mu go -- before it has the GIL back -- another thread may lower the
    queue into the runtime without publishing it (the explicit API's before-record hook): a dependency check must
    then take mu and publish that work, not answer from the hazards of the ops the timer published (the
    fifty-third session's stress mismatches: `y = x * 2 + 1; torch.cumsum(y, 0)` read y before it was written, 3
    of 6 runs). Held at that point, the eager op after such staging equals eager."""
    timer_gil_mode(True)
    w, x, a, b = randn(1000), randn(1000), randn(256), randn(256)   # (y shares no storage with the timer's op)
    hold = gpuos_ext._testing.hold_timer_publication
    torch.cuda.synchronize()
    with gpuos.scheduler_context(auto_flush_ms=0):
        h = w * 3.0                                    # the timer's op
        hold(2)
        timer = threading.Thread(target=gpuos_ext.sched_flush_due, args=(0.0,), name="timer-held")
        timer.start()
        try:
            assert gpuos_ext._testing.timer_publication_held(10), "the timer never reached the hold"
            y = x * 2.0 + 1.0                          # deferred after the timer's take
            out = torch.empty_like(a)
            gpuos_ext.submit_add(a, b, out)            # lowers y into the runtime's staging: no storage tracks it
            c = torch.cumsum(y, 0)                     # eager: must publish y first
        finally:
            hold(0)
            timer.join(15)
        assert not timer.is_alive(), "the timer hung after the hold"
        gpuos_ext.flush(sync=True)
    assert_close(c, torch.cumsum(x * 2.0 + 1.0, 0), rtol=1e-5, atol=1e-4)
    assert_close(h, w * 3.0)
    assert_close(out, a + b)


def test_a_timer_back_from_its_publication_keeps_the_next_timers_flight(rt, timer_gil_mode):
    """Two timers publishing without the GIL: the first, published and waiting for the GIL, must leave the in-flight
    storages of a second one that took the queue meanwhile (the fifty-fifth session's stress mismatches, 1 run in
    7: the first's regain cleared the set, and eager ops on the second's outputs ran ahead of its publication).
    Held: the first after its publication, the second before its own; the first let go and joined; a dependency
    check must still see the second's op, and the eager op after it equals eager."""
    timer_gil_mode(True)
    w, x = randn(1000), randn(1000)
    hold, held = gpuos_ext._testing.hold_timer_publication, gpuos_ext._testing.timer_publication_held
    may_touch = gpuos_ext._testing.deferred_may_touch
    torch.cuda.synchronize()
    timers = []

    def timer(name):
        timers.append(threading.Thread(target=gpuos_ext.sched_flush_due, args=(0.0,), name=name))
        timers[-1].start()
        return timers[-1]

    with gpuos.scheduler_context(auto_flush_ms=0):
        h = w * 3.0                                    # the first timer's op
        try:
            hold(2)
            first = timer("timer-first")
            assert held(10, 2), "the first timer never reached its hold after publishing"
            y = x * 2.0 + 1.0                          # the second timer's op
            assert may_touch(y) and not may_touch(w)   # (queued; the first's op is published)
            hold(3)
            timer("timer-second")
            assert held(10, 1), "the second timer never reached its hold before publishing"
            assert may_touch(y), "the second timer's op is not in flight"
            hold(1)                                    # the first goes on: it retakes the GIL, which join lets go
            first.join(15)
            assert not first.is_alive(), "the first timer hung"
            assert may_touch(y), "the first timer cleared the in-flight storages of the second"
            assert not may_touch(w)
        finally:
            hold(0)
        c = torch.cumsum(y, 0)                         # eager: ordered after the second timer's publication
        for t in timers:
            t.join(15)
        assert not any(t.is_alive() for t in timers), "a timer hung after the holds"
        gpuos_ext.flush(sync=True)
    assert_close(c, torch.cumsum(x * 2.0 + 1.0, 0), rtol=1e-5, atol=1e-4)
    assert_close(h, w * 3.0)


_ANALYSIS_KEYS = ("flushed_ops", "fused_groups", "fused_ops", "row_groups", "epilogues", "act_epilogues",
                  "dual_epilogues", "prologues", "dead_ops", "copies_folded")


def _analysis_block(x, w1, w2, w3, g):
    """A Llama-like MLP block with an intermediate Python keeps (t1: it must be written, not fused away)."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g   # a row program, the matmuls' prologue
    t1 = torch.tanh(x) * 3                                               # kept by the caller
    y = F.silu(h @ w1) * (h @ w3)
    return x + y @ w2 + (t1 + 1) * 0.5, t1                               # a residual epilogue; t1 read again


@pytest.mark.watchdog(60)
def test_timer_analysis_without_the_gil_decides_as_with_it(rt, worker_matmul, timer_gil_mode):
    """The timer analyses the taken ops without the GIL, reading Python's side of liveness from a snapshot taken
    under it: the same block flushed by the timer and by an explicit flush (with the GIL) fuses, folds and drops
    exactly the same, and what Python still holds is written."""
    timer_gil_mode(True)
    x, g = randn(4, 256), randn(256)
    w1, w3, w2 = randn(256, 512, scale=0.05), randn(256, 512, scale=0.05), randn(512, 256, scale=0.05)
    exp = _analysis_block(x, w1, w2, w3, g)
    torch.cuda.synchronize()
    full = gpuos.stats()["fusion_table_full"]   # (a process's fused-program table never evicts: past it, unfused)
    deltas = {}
    for how in ("explicit", "timer"):
        with gpuos.scheduler_context(auto_flush_ms=0):
            before = gpuos_ext.sched_stats()
            got = _analysis_block(x, w1, w2, w3, g)
            assert gpuos_ext.sched_stats()["deferred"] > 0
            if how == "timer":
                assert gpuos_ext.sched_flush_due(0.0) == 1
            else:
                gpuos.flush()
            after = gpuos_ext.sched_stats()
            assert after["deferred"] == 0
        deltas[how] = {k: after[k] - before[k] for k in _ANALYSIS_KEYS}
        cause = "timer" if how == "timer" else "explicit"
        assert after["flushes_by_cause"].get(cause, 0) > before["flushes_by_cause"].get(cause, 0)
        _compare(got, exp, "f32_mm", what=f"{how} flush")
    assert deltas["timer"] == deltas["explicit"], deltas
    if gpuos.stats()["fusion_table_full"] == full:
        assert deltas["timer"]["fused_groups"] > 0 and deltas["timer"]["row_groups"] > 0, deltas


# ============================================================================ counters

def test_ops_intercepted_and_size_fallback(rt):
    small = randn(1000)
    before = gpuos.stats()
    with gpuos.scheduler_context():
        y = small + 1
    mid = gpuos.stats()
    assert mid["ops_intercepted"] - before["ops_intercepted"] >= 1
    assert_close(y, small + 1, rtol=0, atol=0)

    big = randn((1 << 15) + 1)  # one element over the default size_threshold
    with gpuos.scheduler_context():
        z = big * 2
    after = gpuos.stats()
    assert _delta(mid, after, "fallbacks", "size") >= 1, after["fallbacks"]
    assert after["ops_intercepted"] == mid["ops_intercepted"]
    assert_close(z, big * 2, rtol=0, atol=0)

    with gpuos.scheduler_context(size_threshold=100):
        w = small - 1
    last = gpuos.stats()
    assert _delta(after, last, "fallbacks", "size") >= 1
    assert_close(w, small - 1, rtol=0, atol=0)


def test_over_threshold_op_reading_deferred_work_is_recorded(rt):
    """An op over size_threshold whose operand deferred work touches is recorded (up to 2^22 elements:
    csrc/sched/record.h kPendingSizeCap) -- eager, it would flush that work first (HF repeat_kv's clone of a static
    cache written by index_copy_). One that reads no deferred work stays eager (reason size)."""
    big, fresh = randn(1 << 16), randn(1 << 16)
    ref = big.clone()
    ref[:16] += 1
    s0 = gpuos.stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        big[:16].add_(1)        # deferred: big's storage is pending
        y = big * 2             # 65,536 elements, reads it: recorded
        c = big.clone()         # the copy handler: recorded too
        s1 = gpuos.stats()
        z = fresh * 3           # reads nothing deferred: eager
        s2 = gpuos.stats()
    assert _delta(s0, s1, "fallbacks", "size") == 0, s1["fallbacks"]
    assert _delta(s0, s1, "flushes_by_cause", "dependency") == 0, s1["flushes_by_cause"]
    assert _delta(s0, s1, "ops_intercepted") >= 3
    assert _delta(s1, s2, "fallbacks", "size") == 1, s2["fallbacks"]
    assert_close(big, ref, rtol=0, atol=0)
    assert_close(y, ref * 2, rtol=0, atol=0)
    assert_close(c, ref, rtol=0, atol=0)
    assert_close(z, fresh * 3, rtol=0, atol=0)


def test_flush_causes_and_batch_size(rt):
    x = randn(256)
    before = gpuos.stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        ys = [x * i + 1 for i in range(50)]          # 100 batched ops, one batch
    mid = gpuos.stats()
    assert _delta(before, mid, "flushes_by_cause", "exit") == 1
    assert mid["mean_batch_size"] > 1.0
    with gpuos.scheduler_context(auto_flush_ms=0):
        y = torch.relu(x)
        _ = y.sum().item()                             # host read: a dependency flush
    after = gpuos.stats()
    assert _delta(mid, after, "flushes_by_cause", "dependency") >= 1
    for i, yi in enumerate(ys):
        assert_close(yi, x * i + 1, rtol=1e-6, atol=1e-6)


def test_fallbacks_by_op_and_batches_launches_by_cause(rt):
    """gpuos.stats() names the aten ops that ran eagerly (fallback_ops) and, per flush cause, the batches and
    worker launches those flushes caused; the per-cause launches add up to the runtime's worker_launches."""
    a = randn(64, 64)
    x = randn(4096)
    rt.flush(sync=True)
    before = gpuos.stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        y = torch.sigmoid(x) * 2 + 1                   # recorded (one fused chain)
        m = a @ a                                      # mm: eager (heavy, the worker yields)
        m2 = a @ a
        z = y * 3                                      # recorded
    torch.cuda.synchronize()
    after = gpuos.stats()
    assert after["fallback_ops"].get("aten.mm.default", 0) - before["fallback_ops"].get("aten.mm.default", 0) == 2, (
        after["fallback_ops"])
    assert list(after["fallback_ops"].values()) == sorted(after["fallback_ops"].values(), reverse=True)
    assert _delta(before, after, "flushes_by_cause", "exit") == 1
    assert _delta(before, after, "batches_by_cause", "exit") >= 1
    launches = sum(after["launches_by_cause"].values()) - sum(before["launches_by_cause"].values())
    assert launches == after["worker_launches"] - before["worker_launches"], (before, after)
    assert_close(z, (torch.sigmoid(x) * 2 + 1) * 3, rtol=1e-5, atol=1e-5)
    assert_close(m, a @ a)
    assert_close(m2, a @ a)


def _flushes_apart(x, live_idle_us, n=12):
    """n flushes of a small chain, each completed on the stream and followed by 1 ms without work (over the runtime's
    200 us idle time, under a 3 ms window), inside a context with a 1 ms timer; the worker launches
    they cost."""
    gpuos_ext.flush(sync=True)
    before = gpuos.stats()["worker_launches"]
    with gpuos.scheduler_context(auto_flush_ms=1.0, live_idle_us=live_idle_us) as sched:
        y = x
        for _ in range(n):
            y = y * 0.5 + 1.0                      # recorded
            sched.flush()
            torch.cuda.current_stream().synchronize()   # the stream waits for the batch; the worker may stay
            time.sleep(0.001)                      # the workload's gap between flushes, not a synchronization
    torch.cuda.synchronize()
    return gpuos.stats()["worker_launches"] - before, y


def test_the_live_window_keeps_one_worker_across_flushes(rt):
    """While a scheduler context's timer runs, the worker a flush launches stays resident for the live window
    (here 3 ms) instead of the runtime's 200 us: flushes 1 ms apart launch it about once, not once per flush
    (live_idle_us=0: the runtime's idle time, the A/B)."""
    x = randn(4096)
    ref = x
    for _ in range(12):
        ref = ref * 0.5 + 1.0
    kept, y = _flushes_apart(x, 3000.0)
    assert_close(y, ref)
    each, y = _flushes_apart(x, 0.0)
    assert_close(y, ref)
    assert each >= 10, each                        # without the window: one launch per flush (12)
    assert kept <= 2, (kept, each)
    assert gpuos.stats()["live_idle_us"] == 0.0    # no context open: no window


def _synchronize_s():
    t = time.perf_counter()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def test_the_context_exit_and_eager_kernels_send_the_resident_worker_away(rt):
    """A worker the live window keeps (here 2 s) must not hold up what follows: the context's exit asks it to
    leave, so a device synchronize after it returns at once (it waits for every resident kernel: DESIGN F3); an
    eager op's kernel inside the context asks it to leave first (beside it the kernel would get one SM); a host
    read (.item()) needs no SMs and keeps it."""
    x = randn(4096)
    with gpuos.scheduler_context(live_idle_us=2e6) as sched:
        assert gpuos.stats()["live_idle_us"] == 2e6
        y = x * 2.0 + 1.0
        sched.flush()
        torch.cuda.current_stream().synchronize()
        yields = gpuos.stats()["live_yields"]
        first = y[0].item()                        # a host read (a view's copy): no yield
        assert gpuos.stats()["live_yields"] == yields
        assert first == float(x[0]) * 2.0 + 1.0 or math.isclose(first, float(x[0]) * 2.0 + 1.0, rel_tol=1e-6)
        z = torch.cumsum(y, 0)                     # eager (no worker task): its kernel wants the SMs
        assert gpuos.stats()["live_yields"] == yields + 1
        assert _synchronize_s() < 1.0              # the worker left (the window is 2 s)
        w = z * 0.5                                # recorded: a worker again, resident for the window
        sched.flush()
    assert _synchronize_s() < 1.0                  # the exit sent it away
    assert gpuos.stats()["live_idle_us"] == 0.0
    assert_close(w, torch.cumsum(x * 2.0 + 1.0, 0) * 0.5)


def test_profiler_trace_shows_gpuos_flushes(rt):
    """While torch.profiler records, GPUOS flushes are ranges in its trace: gpuos.flush[<cause>] (context exit,
    dependency of an eager op, explicit gpuos.flush)."""
    from torch.profiler import ProfilerActivity, profile
    x = randn(4096)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with gpuos.scheduler_context(auto_flush_ms=0):
            y = torch.sigmoid(x) * 2
            z = torch.cumsum(y, -1)                     # eager (foreign) on deferred y: a dependency flush
            w = z * 3
        gpuos.flush()
    names = {e.name for e in prof.events()}
    assert {"gpuos.flush[dependency]", "gpuos.flush[exit]", "gpuos.flush[explicit]"} <= names, sorted(
        n for n in names if "gpuos" in n)
    assert_close(w, torch.cumsum(torch.sigmoid(x) * 2, -1) * 3, rtol=1e-5, atol=1e-4)


def test_int_ops_run_in_the_worker_float64_and_autograd_fall_back(rt):
    """int64 arithmetic is a worker task (the data ops' add_int / mul_int); float64 and autograd stay eager."""
    a = torch.randint(-9, 9, (100,), device=DEV)
    d = torch.randn(100, device=DEV, dtype=torch.float64)
    w = randn(100).requires_grad_(True)
    before = gpuos.stats()
    with gpuos.scheduler_context():
        b = a * 2 + 1
        e = d * 2
        loss = (torch.sigmoid(w) * 3).sum()
        loss.backward()
    after = gpuos.stats()
    assert torch.equal(b, a * 2 + 1) and b.dtype == torch.int64
    assert torch.equal(e, d * 2)
    assert after["ops_intercepted"] - before["ops_intercepted"] >= 2
    assert _delta(before, after, "fallbacks", "dtype") >= 1
    assert _delta(before, after, "fallbacks", "autograd") >= 1
    s = torch.sigmoid(w.detach())
    assert_close(w.grad, 3 * s * (1 - s), rtol=1e-5, atol=1e-6)


# ============================================================================ dtype promotion

def test_zero_dim_tensor_promotion(rt):
    """torch.result_type: dimensioned tensors decide; 0-d tensors only when all inputs are 0-d."""
    x = randn(64, dtype=F16)
    s32 = torch.tensor(0.5, device=DEV)                       # float32, 0-d
    h0 = torch.tensor(1.5, device=DEV, dtype=F16)             # float16, 0-d
    exp = (x * s32, s32 + x, h0 * s32, x.add(s32, alpha=2))
    with gpuos.scheduler_context():
        got = (x * s32, s32 + x, h0 * s32, x.add(s32, alpha=2))
    assert [g.dtype for g in got] == [e.dtype for e in exp] == [F16, F16, F32, F16]
    _compare(got, exp, "f16")


# ============================================================================ the __torch_function__ front

def _w2(a, b, c, d):
    return torch.sigmoid(torch.relu((a + b) * c)) / d


def test_front_records_the_w2_chain_and_matches_eager(rt):
    a, b, c = randn(2048), randn(2048), randn(2048)
    d = randn(2048).abs() + 0.5
    for front in (True, False):
        before = gpuos.stats()
        with gpuos.scheduler_context(auto_flush_ms=0, front=front):
            outs = [_w2(a, b, c, d) for _ in range(20)]
        after = gpuos.stats()
        assert after["ops_intercepted"] - before["ops_intercepted"] == 100
        assert after["front_ops"] - before["front_ops"] == (100 if front else 0)
        for o in outs:
            assert_close(o, _w2(a, b, c, d), rtol=1e-5, atol=1e-6)


def test_front_reads_alpha_numbers_and_rounding_mode(rt):
    x, y = randn(3, 300), randn(300)
    cases = {
        "alpha": lambda: torch.add(x, y, alpha=-2.5), "sub_alpha_method": lambda: x.sub(y, alpha=3),
        "number": lambda: x * 0.5 - 2, "div_none": lambda: torch.div(x, y.abs() + 1, rounding_mode=None),
        "pow_int": lambda: torch.pow(x, 2), "maximum": lambda: torch.maximum(x, y),
        "f16_times_f32_0d": lambda: x.half() * torch.tensor(3.0, device=DEV),
    }
    for name, fn in cases.items():
        expected = fn()
        before = gpuos.stats()
        with gpuos.scheduler_context(auto_flush_ms=0, front=True):
            got = fn()
        assert gpuos.stats()["front_ops"] > before["front_ops"], name
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=name)


class _Sub(torch.Tensor):
    pass


def test_front_hands_on_what_others_must_see(rt):
    """Another dispatch mode on top, autocast, a tensor subclass, the op's out= / floor rounding, a size over the
    threshold: the front records nothing and the result is eager's (a Parameter is recorded: a plain tensor)."""
    from _helpers import seen_ops_mode

    x, y = randn(1000), randn(1000).abs() + 1
    p = torch.nn.Parameter(randn(1000), requires_grad=False)
    xh = x.half()
    o = torch.empty(1000, device=DEV)

    def none_by_front(what, fn):
        f0 = gpuos.stats()["front_ops"]
        r = fn()
        assert gpuos.stats()["front_ops"] == f0, what
        return r

    with gpuos.scheduler_context(auto_flush_ms=0, front=True):
        seen = seen_ops_mode()
        with seen:
            z = none_by_front("inner dispatch mode", lambda: x + y)
        assert "aten.add.Tensor" in seen.funcs  # the inner mode saw the op
        with torch.autocast("cuda", dtype=torch.float16):
            e = none_by_front("autocast", lambda: torch.exp(xh))  # autocast runs exp in fp32
        sub = x.as_subclass(_Sub)
        q = none_by_front("a tensor subclass", lambda: sub * 2)
        f0 = gpuos.stats()["front_ops"]
        pp = p * 2  # a Parameter is a plain tensor to PyTorch (THPVariable_CheckExact): recorded
        assert gpuos.stats()["front_ops"] == f0 + 1
        fl = none_by_front("rounding_mode=floor", lambda: torch.div(x, y, rounding_mode="floor"))
        none_by_front("out=", lambda: torch.add(x, y, out=o))
    with gpuos.scheduler_context(auto_flush_ms=0, front=True, size_threshold=100):
        f1 = gpuos.stats()["front_ops"]
        big = x * 3
        assert gpuos.stats()["front_ops"] == f1
    assert_close(z, x + y, rtol=0, atol=0)
    with torch.autocast("cuda", dtype=torch.float16):
        assert e.dtype == torch.exp(xh).dtype
    assert_close(e, torch.exp(xh.float()), rtol=1e-5, atol=1e-5)
    assert_close(q.as_subclass(torch.Tensor), x * 2, rtol=0, atol=0)
    assert_close(pp, p.detach() * 2, rtol=0, atol=0)
    assert_close(fl, torch.div(x, y, rounding_mode="floor"), rtol=0, atol=0)
    assert_close(o, x + y, rtol=0, atol=0)
    assert_close(big, x * 3, rtol=0, atol=0)


def test_front_runs_views_of_plain_cuda_tensors_below_the_modes(rt):
    """Views of a plain CUDA tensor (Tensor.view, t, transpose, unsqueeze, permute, expand, select, split, chunk,
    unbind, unflatten, swapaxes, squeeze) under the scheduler run below the dispatch modes (csrc/sched/dispatch.cpp
    view_of_plain_cuda): a mode entered before the scheduler does not see them, nothing flushes, and views of a
    deferred result read its values. A view given as an aten overload still goes through the modes (the
    dispatch path's no-data set runs it without a flush)."""
    from _helpers import seen_ops_mode

    x = randn(4, 6)
    seen = seen_ops_mode(lambda func: func.overloadpacket.__name__)
    with seen, gpuos.scheduler_context(auto_flush_ms=0, front=True):
        y = x * 2  # deferred
        f0 = gpuos.stats()["flushes"]
        views = [y.view(6, 4), y.t(), y.transpose(0, 1), torch.transpose(y, 0, 1), y.unsqueeze(0),
                 torch.unsqueeze(y, 1), y.permute(1, 0), y.expand(2, 4, 6), y.select(0, 1), *y.split(2),
                 *torch.chunk(y, 2, dim=1), *y.unbind(0), y.unflatten(1, (2, 3)), y.swapaxes(0, 1),
                 y.unsqueeze(0).squeeze(0)]
        assert gpuos.stats()["flushes"] == f0, "a view flushed"
        below = list(seen.funcs)
        v2 = torch.ops.aten.view.default(y, [6, 4])  # the dispatch path
        assert gpuos.stats()["flushes"] == f0, "aten.view flushed"
        w = views[0] + 1  # recorded on a view of a deferred result
    assert not below, f"the outer mode saw {below}"
    assert "view" in seen.funcs
    ref = x * 2
    expect = [ref.view(6, 4), ref.t(), ref.t(), ref.t(), ref.unsqueeze(0), ref.unsqueeze(1), ref.t(),
              ref.expand(2, 4, 6), ref[1], *ref.split(2), *ref.chunk(2, dim=1), *ref.unbind(0),
              ref.unflatten(1, (2, 3)), ref.t(), ref]
    assert len(views) == len(expect)
    for got, want in zip(views, expect):
        assert_close(got, want, rtol=0, atol=0)
    assert_close(v2, ref.view(6, 4), rtol=0, atol=0)
    assert_close(w, ref.view(6, 4) + 1, rtol=0, atol=0)


def test_front_under_inference_mode_and_with_grad_inputs(rt):
    w = randn(500).requires_grad_(True)
    x = randn(500)
    with torch.inference_mode():
        xi = randn(500)
        before = gpuos.stats()["front_ops"]
        with gpuos.scheduler_context(auto_flush_ms=0, front=True):
            yi = torch.sigmoid(xi * 2)
        assert gpuos.stats()["front_ops"] - before == 2  # inference tensors are plain CUDA tensors
    assert_close(yi, torch.sigmoid(xi * 2), rtol=1e-6, atol=1e-6)
    before = gpuos.stats()["front_ops"]
    with gpuos.scheduler_context(auto_flush_ms=0, front=True):
        loss = (torch.sigmoid(w) * x).sum()  # grad-tracked: the dispatch mode's autograd fallback, not the front
        loss.backward()
    assert gpuos.stats()["front_ops"] == before
    s = torch.sigmoid(w.detach())
    assert_close(w.grad, s * (1 - s) * x, rtol=1e-5, atol=1e-6)
