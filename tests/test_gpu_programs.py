"""Programs (issue #17, gpuos/programs.py, csrc/core/tape.h): capture once, replay with new inputs by pointer.

Every test compares replays against eager on inputs the capture never saw, and checks what a user relies on:
outputs of one call are not overwritten by the next, state is updated in place, guards refuse other inputs,
host reads are refused at capture, eager fallbacks split the program into segments that still run in order."""
import contextlib
import random

import pytest
import torch

import gpuos
from _helpers import describe, run_python

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _chain(x, y):
    a = x * y + 1.0
    b = torch.sigmoid(a) * x
    return torch.tanh(b - y), b.sum(-1)


def test_replay_matches_eager_with_new_inputs(rt):
    x, y = torch.randn(64, 100, device=DEV), torch.randn(64, 100, device=DEV)
    prog = gpuos.capture(_chain, x, y)
    torch.testing.assert_close(prog.first_result[0], _chain(x, y)[0])
    info = prog.info()
    assert info["entries"] >= 1 and info["segments"] == 1 and info["fallbacks"] == []
    for _ in range(5):
        x2, y2 = torch.randn_like(x), torch.randn_like(y)
        r = prog(x2, y2)
        e = _chain(x2, y2)
        torch.testing.assert_close(r[0], e[0])
        torch.testing.assert_close(r[1], e[1], rtol=1e-4, atol=1e-4)
        assert r[0].data_ptr() != x2.data_ptr()
    assert prog.info()["calls"] == 5
    s = gpuos.stats()
    assert s["program_replays"] >= 5 and s["flushes_by_cause"].get("program", 0) >= 5


def test_outputs_of_a_call_survive_later_calls(rt):
    x = torch.randn(1000, device=DEV)
    prog = gpuos.capture(lambda t: t * 2.0 + 1.0, x)
    outs, ins = [], []
    for k in range(4):
        xi = torch.full_like(x, float(k))
        ins.append(xi)
        outs.append(prog(xi))
    torch.cuda.synchronize()
    for k, o in enumerate(outs):
        torch.testing.assert_close(o, torch.full_like(x, 2.0 * k + 1.0))
    assert len({o.data_ptr() for o in outs}) == 4
    torch.testing.assert_close(prog.first_result, x * 2.0 + 1.0)  # the capture's own result is kept too


def test_state_is_updated_in_place_every_call(rt):
    """A buffer the step writes (a KV cache written at a position held in a device tensor) is written by every
    replay, at the position read at run time."""
    cache = torch.zeros(16, 8, device=DEV)

    def step(row, pos):
        cache.index_copy_(0, pos, row)
        return cache.sum(0) * 1.0

    step(torch.zeros(1, 8, device=DEV), torch.tensor([0], device=DEV))  # warm-up, like a CUDA-graph capture
    prog = gpuos.capture(step, torch.ones(1, 8, device=DEV), torch.tensor([0], device=DEV))
    cache.zero_()
    ref = torch.zeros(16, 8, device=DEV)
    for p in range(16):
        row = torch.full((1, 8), float(p + 1), device=DEV)
        out = prog(row, torch.tensor([p], device=DEV))
        ref[p] = row[0]
        torch.testing.assert_close(out, ref.sum(0))
    torch.testing.assert_close(cache, ref)


def test_output_view_of_input_and_returned_state(rt):
    state = torch.arange(10.0, device=DEV)

    def f(x):
        state.mul_(2.0)
        return x[2:5], state, x + 1.0

    prog = gpuos.capture(f, torch.zeros(10, device=DEV))
    assert prog.info()["outputs_copied"] == 1  # `state` is returned as a copy the program owns
    x = torch.randn(10, device=DEV)
    before = state.clone()
    v, st, y = prog(x)
    torch.testing.assert_close(v, x[2:5])
    assert v.data_ptr() == x[2:].data_ptr()  # a view of the new input, not a copy
    torch.testing.assert_close(st, before * 2.0)
    torch.testing.assert_close(state, before * 2.0)
    v2, st2, _ = prog(x)
    torch.testing.assert_close(st, before * 2.0)  # the first call's copy is not overwritten
    torch.testing.assert_close(st2, before * 4.0)


def test_eager_fallbacks_split_segments(rt):
    def f(x, w):
        h = torch.relu(x * 0.5)
        c = torch.cumsum(h, dim=-1)  # no worker task: an eager step of the program
        return torch.sigmoid(c) + w, c

    x, w = torch.randn(32, 64, device=DEV), torch.randn(32, 64, device=DEV)
    prog = gpuos.capture(f, x, w)
    info = prog.info()
    assert any("cumsum" in n for n in info["fallbacks"]), info
    assert info["segments"] >= 2
    for _ in range(3):
        x2, w2 = torch.randn_like(x), torch.randn_like(w)
        r = prog(x2, w2)
        e = f(x2, w2)
        torch.testing.assert_close(r[0], e[0])
        torch.testing.assert_close(r[1], e[1])


def test_guards_refuse_other_inputs(rt):
    x = torch.randn(8, 16, device=DEV)
    prog = gpuos.capture(lambda t, s: t * s, x, 2.0)
    with pytest.raises(gpuos.GuardError, match="argument 0"):
        prog(torch.randn(8, 17, device=DEV), 2.0)
    with pytest.raises(gpuos.GuardError, match="float16"):
        prog(x.half(), 2.0)
    with pytest.raises(gpuos.GuardError, match="strides"):
        prog(torch.randn(16, 8, device=DEV).t(), 2.0)
    with pytest.raises(gpuos.GuardError, match="non-tensor"):
        prog(x, 3.0)
    with pytest.raises(gpuos.GuardError, match="structure"):
        prog(x)
    torch.testing.assert_close(prog(x, 2.0), x * 2.0)


def test_host_read_is_refused_at_capture_and_runtime_stays_usable(rt):
    def f(x):
        y = x + 1.0
        if y.sum().item() > 0:  # a host read: its value would be frozen
            return y
        return -y

    with pytest.raises(gpuos.CaptureError, match="_local_scalar_dense|item"):
        gpuos.capture(f, torch.randn(100, device=DEV))

    def g(x):
        return (x * 3.0).cpu()

    with pytest.raises(gpuos.CaptureError, match="host"):
        gpuos.capture(g, torch.randn(100, device=DEV))
    assert not rt._capturing(torch.cuda.current_device())
    x = torch.randn(100, device=DEV)
    prog = gpuos.capture(lambda t: t - 1.0, x)  # a later capture works
    torch.testing.assert_close(prog(x), x - 1.0)


def test_wrap_captures_per_signature_and_bounds_its_cache(rt):
    calls = []

    def f(x):
        calls.append(1)
        return torch.exp(x * 0.1) - 1.0

    w = gpuos.wrap(f, cache_size=2)
    for n in (10, 10, 10, 20, 20, 30, 10):
        x = torch.randn(n, device=DEV)
        torch.testing.assert_close(w(x), torch.exp(x * 0.1) - 1.0)
    # captures: 10, 20, 30, then 10 again (evicted by 30 with cache_size 2)
    assert w.captures == 4 and len(calls) == 4
    assert w.info()["cached"] == 2


def test_wrap_replays_a_signature_hit_through_the_cpp_call(rt, monkeypatch):
    """Sizes that alternate (W6's loop): a call whose signature is cached but is not the last call's program takes
    that program's C++ call (gpuos_ext.ProgramCall), not the Python replay path (``Program._run``); results equal
    eager and no capture repeats."""
    w = gpuos.wrap(lambda a, b: torch.sigmoid(torch.relu(a + b) * 2.0), cache_size=4)
    xs = {n: (torch.randn(n, device=DEV), torch.randn(n, device=DEV)) for n in (1024, 1280, 1536)}
    for n in xs:  # captures
        w(*xs[n])
    assert all(p.info()["fast_call"] for p in w.programs.values())
    runs = []
    real_run = gpuos.programs.Program._run
    monkeypatch.setattr(gpuos.programs.Program, "_run", lambda self, *a: runs.append(1) or real_run(self, *a))
    for i in range(12):
        n = (1024, 1280, 1536)[(2 * i) % 3]
        a, b = xs[n]
        torch.testing.assert_close(w(a, b), torch.sigmoid(torch.relu(a + b) * 2.0))
    assert w.captures == 3 and not runs, f"{len(runs)} of 12 calls took the Python replay path"


@contextlib.contextmanager
def worker_tasks_on():
    """The worker's matmul and attention tasks on (restored after)."""
    was_mm, was_at = gpuos.worker_matmul_enabled(), gpuos.worker_attention_enabled()
    gpuos.set_worker_matmul(True)
    gpuos.set_worker_attention(True)
    try:
        yield
    finally:
        gpuos.set_worker_matmul(was_mm)
        gpuos.set_worker_attention(was_at)


def decode_block():
    """A decode-like block: a worker matmul, decode attention over a 128-position cache (an optional additive
    mask), silu; h: (1, 64) fp16."""
    torch.manual_seed(0)
    W = torch.randn(256, 64, device=DEV, dtype=torch.float16) * 0.05
    K = torch.randn(1, 4, 128, 64, device=DEV, dtype=torch.float16)
    V = torch.randn(1, 4, 128, 64, device=DEV, dtype=torch.float16)

    def block(h, m=None):
        q = torch.nn.functional.linear(h, W).view(1, 1, 4, 64).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=m)
        return torch.nn.functional.silu(a.transpose(1, 2).reshape(1, 256)) + h.sum() * 0.0
    return block


def test_program_with_worker_matmul_and_attention(rt):
    """A decode-like block with the worker's matmul and attention tasks: one segment, same results as eager."""
    with worker_tasks_on():
        block = decode_block()
        h = torch.randn(1, 64, device=DEV, dtype=torch.float16)
        prog = gpuos.capture(block, h)
        for _ in range(3):
            h2 = torch.randn_like(h)
            torch.testing.assert_close(prog(h2), block(h2), rtol=2e-2, atol=2e-2)


_UNARY = [torch.sigmoid, torch.tanh, torch.relu, lambda t: t * 0.5, lambda t: t + 1.0, torch.neg,
          lambda t: torch.softmax(t, -1), lambda t: t.sum(-1, keepdim=True) * 0.01, torch.abs]
_BINARY = [torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum]


def _random_fn(rng: random.Random, nin: int):
    plan = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.5:
            plan.append(("u", rng.randrange(len(_UNARY)), rng.randrange(1 << 16)))
        else:
            plan.append(("b", rng.randrange(len(_BINARY)), rng.randrange(1 << 16), rng.randrange(1 << 16)))
    nout = rng.randint(1, 2)
    eager_at = rng.randrange(len(plan) + 1) if rng.random() < 0.15 else -1

    def fn(*xs):
        vals = list(xs)
        for i, p in enumerate(plan):
            if i == eager_at:
                vals.append(torch.cumsum(vals[-1], -1) * 0.01)  # an eager step
            if p[0] == "u":
                vals.append(_UNARY[p[1]](vals[p[2] % len(vals)]))
            else:
                vals.append(_BINARY[p[1]](vals[p[2] % len(vals)], vals[p[3] % len(vals)]))
        return tuple(vals[-1 - k] for k in range(nout))
    return fn


def random_case(rng: random.Random, widths=(1, 7, 64, 300)):
    """(fn, number of inputs, shape): a random program (_random_fn) over 1-3 inputs of a random 2-D shape."""
    nin = rng.randint(1, 3)
    shape = (rng.randint(1, 8), rng.choice(list(widths)))
    return _random_fn(rng, nin), nin, shape


def _layers(x, w):
    """Four identical layers: each the same kinds of work in the same order (a row program, a chain)."""
    for _ in range(4):
        r = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        x = torch.sigmoid(r * 0.5) * x + r
    return x


def test_levels_of_one_kind_share_their_home_blocks(rt):
    """Runtime::prepare_image / core/tape.cpp piece_homes: a level piece of a few claims gets home blocks (only they
    claim it: walk.h home_skips), the same first block for every piece of one kind of work, never block 0 (the
    poller). The replays stay exact."""
    x, w = torch.randn(2, 256, device=DEV), torch.randn(256, device=DEV)
    prog = gpuos.capture(_layers, x, w)
    for _ in range(3):
        x2, w2 = torch.randn_like(x), torch.randn_like(w)
        torch.testing.assert_close(prog(x2, w2), _layers(x2, w2), rtol=1e-4, atol=1e-4)
    info = prog.info()
    assert info["segments"] == 1, info
    (homes,) = info["homes"]
    seg = next(s for s in prog.steps if s[0] == "seg")
    kinds = {}  # level -> the (op, program) of its entries: a level's kind of work
    for e in prog.tape.level_map(seg[1], seg[2]):
        kinds.setdefault(e["level"], set()).add((e["op"], e["program"]))
    assert len(homes) == len(kinds) == sum(info["levels"]), (homes, kinds)
    first_of = {}
    for (count, first, span), lv in zip(homes, sorted(kinds)):
        assert count >= 1 and ((first, span) == (0, 0) or (first >= 1 and span >= 1)), homes
        if first:
            key = frozenset(kinds[lv])
            assert first_of.setdefault(key, first) == first, (homes, kinds)  # one kind, one place
    assert len(first_of) < sum(1 for h in homes if h[1]), (homes, kinds)  # kinds repeat (4 layers) with homes


@pytest.mark.watchdog(300)
def test_thousand_random_programs_replayed_with_new_inputs(rt):
    rng = random.Random(1234)
    for case in range(1000):
        fn, nin, shape = random_case(rng)
        xs = [torch.randn(shape, device=DEV) for _ in range(nin)]
        prog = gpuos.capture(fn, *xs)
        for _ in range(2):
            ys = [torch.randn(shape, device=DEV) for _ in range(nin)]
            got, want = prog(*ys), fn(*ys)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"case {case}: {m}")


@pytest.mark.watchdog(300)
@pytest.mark.parametrize("label", ["llama-small-fp16-sdpa-static", "gpt2-small-fp16-sdpa-static",
                                   "llama-small-bf16-eager-static"])
def test_hf_static_decode_program_equals_eager(rt, label):
    """W7's gpuos_program config: one captured step replayed per token gives eager's tokens and logits."""
    pytest.importorskip("transformers")
    from benchmarks import bench_models as B
    case = B.make_case(label, 16, "cuda")
    prep = B.setup_program(case)
    for _ in range(2):  # twice: the rewound cache is rewritten by the replays
        toks, logits = prep.fn()
        # eager's tokens, except where eager's own logits make two candidates a near-tie (B.token_mismatches)
        assert B.token_mismatches(toks, case.ref[0], case.ref[1], case.tol) == [], (toks, case.ref[0])
        torch.testing.assert_close(logits, case.ref[1], **case.tol)
    assert prep.extra["segments_per_step"] >= 1 and prep.extra["subops_per_step"] > 0


def test_a_program_calls_worker_idles_program_idle_us():
    """A worker a program call launches idles GPUOS_PROGRAM_IDLE_US (20 us), a live flush's idle_us: a device sync
    waits for the resident worker's exit (DESIGN F3), so with idle_us at 20 ms one call then a sync takes far less
    than 20 ms, and one live flush then a sync at least 20 ms. (Every call paid idle_us before: one small call then
    a sync took ~250 us at the default 200, ~67 us at 20; H200, forty-second session.)"""
    r = run_python('''
        import statistics, time, torch, gpuos, gpuos_ext
        gpuos.init()
        assert gpuos_ext.config()["GPUOS_PROGRAM_IDLE_US"] == "20", gpuos_ext.config()
        x = torch.randn(16, 256, device="cuda")
        prog = gpuos.capture(lambda t: t * 2.0 + 1.0, x)
        torch.cuda.synchronize()  # the capture's own worker (a live flush: idle_us) leaves
        lat = []
        for _ in range(9):
            t0 = time.perf_counter()
            y = prog(x)
            torch.cuda.synchronize()
            lat.append(time.perf_counter() - t0)
        torch.testing.assert_close(y, x * 2.0 + 1.0)
        a = torch.randn(1000, device="cuda")
        out = torch.empty_like(a)
        t0 = time.perf_counter()
        gpuos.submit_add(a, a, out)
        gpuos.flush()
        torch.cuda.synchronize()
        live = time.perf_counter() - t0
        torch.testing.assert_close(out, a + a)
        print("RESULT", statistics.median(lat), live)
    ''', env_extra={"GPUOS_IDLE_US": "20000"}, timeout=300)
    assert r.returncode == 0, describe(r)
    call, live = [float(v) for v in r.stdout.split("RESULT")[1].split()[:2]]
    assert call < 0.01, f"one program call then a sync took {call * 1e3:.1f} ms: its worker idled idle_us (20 ms)"
    assert live >= 0.019, f"a live flush then a sync took {live * 1e3:.1f} ms: its worker should idle idle_us (20 ms)"
