"""Transparent scheduler without a GPU: gpuos.scheduler_context() must be invisible to code whose tensors
the scheduler cannot batch (CPU tensors, int dtypes, autograd). Every snippet is run eagerly and under the
context from identical inputs; results must be bit-identical (torch.equal), since all of it falls back to
the same eager kernels. Also: context life cycle (re-entry, nesting, exceptions), the public signature of
gpuos.scheduler_context, the scheduler keys of gpuos.stats(), and the GpuosScheduler class.

Runs everywhere (also on a GPU machine, where entering the context starts the runtime).
"""

import inspect
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

import gpuos
from gpuos.scheduler import GpuosScheduler


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _no_mode_left():
    assert _get_current_dispatch_mode() is None, "a dispatch mode was left on the stack"


# ============================================================================ snippets
# Each snippet: make() -> dict of inputs (fresh random CPU tensors); run(inputs) -> tensor or tuple of tensors.

def _mlp_gelu_make():
    return dict(x=torch.randn(4, 16), w1=torch.randn(16, 32), b1=torch.randn(32), w2=torch.randn(32, 8),
                b2=torch.randn(8))


def _mlp_gelu(d):
    h = F.gelu(d["x"] @ d["w1"] + d["b1"])
    return h @ d["w2"] + d["b2"], F.gelu(h, approximate="tanh")


def _mlp_silu_make():
    return dict(x=torch.randn(3, 16), w1=torch.randn(16, 24), w3=torch.randn(16, 24), w2=torch.randn(24, 16))


def _mlp_silu(d):
    return (F.silu(d["x"] @ d["w1"]) * (d["x"] @ d["w3"])) @ d["w2"]


def _softmax_make():
    return dict(x=torch.randn(5, 33))


def _softmax(d):
    x = d["x"]
    m = x.amax(-1, keepdim=True)
    e = torch.exp(x - m)
    return torch.softmax(x, -1), F.log_softmax(x, dim=-1), e / e.sum(-1, keepdim=True), torch.softmax(x, 0)


def _layernorm_make():
    return dict(x=torch.randn(6, 40), g=torch.randn(40), b=torch.randn(40))


def _layernorm(d):
    x = d["x"]
    xc = x - x.mean(-1, keepdim=True)
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / torch.sqrt(var + 1e-5) * d["g"] + d["b"]


def _inplace_make():
    return dict(x=torch.randn(7, 9), y=torch.randn(7, 9))


def _inplace(d):
    x, y = d["x"], d["y"]
    r1 = x.add_(y)
    r2 = x.mul_(2)
    r3 = x.relu_()
    assert r1 is x and r2 is x and r3 is x, "in-place ops must return their self tensor"
    x.sub_(0.5, alpha=2).clamp_(-1.0, 3.0)
    return x


def _int_make():
    return dict(a=torch.randint(-50, 50, (5, 8)), b=torch.randint(1, 9, (5, 8)), c=torch.randint(-3, 3, (8,),
                                                                                                  dtype=torch.int32))


def _int(d):
    a, b, c = d["a"], d["b"], d["c"]
    s = a + b * 3 - c
    s.add_(1)
    return s, a // b, a.sum(-1), torch.maximum(a, b), (a > 0).sum(-1), torch.relu(a)


def _mixed_make():
    return dict(a=torch.randn(4, 10), b=torch.randn(4, 10, dtype=torch.float64))


def _mixed(d):
    return d["a"].half() + d["b"].float(), (d["a"].bfloat16() * 2).float() - d["b"], d["a"] + d["b"]


def _chain_make():
    return dict(x=torch.randn(8, 12) * 3, lo=torch.full((12,), -0.7), hi=torch.full((12,), 0.9))


def _chain(d):
    x = d["x"]
    y = F.leaky_relu(F.hardtanh(x.clamp(-2.0, 2.0) * 1.5, -1.2, 1.2), 0.05)
    return (y, torch.clamp(x, d["lo"], d["hi"]), x.clamp(min=0.25), x.clamp(max=-0.25), F.elu(x), F.softplus(x),
            F.hardswish(x), F.hardsigmoid(x), x.pow(2), torch.rsqrt(x.abs() + 1), torch.reciprocal(x + 10))


def _control_make():
    return dict(x=torch.randn(64))


def _control(d):
    x = d["x"].clone()
    decisions = []
    for _ in range(8):
        npos = int((x > 0).sum().item())
        up = npos > x.numel() // 2
        decisions.append(up)
        x = torch.tanh((x - 0.3 if up else x + 0.2) * 1.3)
    return x, torch.tensor(decisions)


def _views_make():
    return dict(x=torch.randn(6, 5))


def _views(d):
    y = d["x"] + 1
    z = y[1:]
    z.mul_(3)
    t = y.t() * 2
    return y, t, y[:, ::2].sum(-1)


SNIPPETS = {
    "mlp_gelu": (_mlp_gelu_make, _mlp_gelu),
    "mlp_silu": (_mlp_silu_make, _mlp_silu),
    "softmax": (_softmax_make, _softmax),
    "layernorm": (_layernorm_make, _layernorm),
    "inplace": (_inplace_make, _inplace),
    "int_tensors": (_int_make, _int),
    "mixed_dtypes": (_mixed_make, _mixed),
    "clamp_chain": (_chain_make, _chain),
    "item_control_flow": (_control_make, _control),
    "views": (_views_make, _views),
}


def _as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


def _clone(d):
    return {k: v.clone() for k, v in d.items()}


def _assert_identical(got, exp):
    got, exp = _as_tuple(got), _as_tuple(exp)
    assert len(got) == len(exp)
    for i, (g, e) in enumerate(zip(got, exp)):
        assert g.dtype == e.dtype and g.shape == e.shape and g.device == e.device, \
            f"output {i}: {g.dtype}{tuple(g.shape)}@{g.device} vs eager {e.dtype}{tuple(e.shape)}@{e.device}"
        assert torch.equal(g, e), f"output {i} differs from eager"


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_cpu_snippet_matches_eager_exactly(name):
    make, run = SNIPPETS[name]
    inputs = make()
    eager_in, sched_in = _clone(inputs), _clone(inputs)
    expected = run(eager_in)
    with gpuos.scheduler_context():
        got = run(sched_in)
    _no_mode_left()
    _assert_identical(got, expected)
    # in-place snippets mutate their inputs: the mutations must match too
    for k in inputs:
        assert torch.equal(sched_in[k], eager_in[k]), f"input {k!r} mutated differently"


def test_cpu_tensors_are_not_intercepted():
    x = torch.randn(32)
    before = gpuos.stats()
    with gpuos.scheduler_context():
        y = (x + 1) * 2
        z = torch.relu(y).sum(-1)
    after = gpuos.stats()
    assert after["ops_intercepted"] == before["ops_intercepted"], "CPU ops must never be batched"
    nc = after["fallbacks"].get("not_cuda", 0) - before["fallbacks"].get("not_cuda", 0)
    assert nc >= 4, f"expected >= 4 'not_cuda' fallbacks, stats: {after['fallbacks']}"
    assert torch.equal(z, torch.relu((x + 1) * 2).sum(-1))


def test_unsupported_op_is_counted():
    a = torch.randn(3, 4)
    before = gpuos.stats()["fallbacks"].get("unsupported_op", 0)
    with gpuos.scheduler_context():
        c = torch.cumsum(a, 0)
    assert gpuos.stats()["fallbacks"].get("unsupported_op", 0) > before
    assert torch.equal(c, torch.cumsum(a, 0))


def test_matmul_falls_back_with_a_reason_that_names_the_switch():
    """aten::mm / addmm have worker handlers: while set_worker_matmul is off they run with cuBLAS and say why
    ('matmul_off'); on, a CPU product is still eager ('not_cuda')."""
    a, b, bias = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    was = gpuos.worker_matmul_enabled()
    try:
        for on, reason in ((False, "matmul_off"), (True, "not_cuda")):
            gpuos.set_worker_matmul(on)
            assert gpuos.worker_matmul_enabled() is on
            before = gpuos.stats()["fallbacks"].get(reason, 0)
            with gpuos.scheduler_context():
                c = torch.addmm(bias, a, b)
                d = a @ b
            assert gpuos.stats()["fallbacks"].get(reason, 0) >= before + 2, gpuos.stats()["fallbacks"]
            torch.testing.assert_close(c, torch.addmm(bias, a, b))
            torch.testing.assert_close(d, a @ b)
    finally:
        gpuos.set_worker_matmul(was)


# ============================================================================ autograd

def test_requires_grad_backward_inside_context():
    torch.manual_seed(1)
    x0, w0, b0 = torch.randn(4, 8), torch.randn(8, 6), torch.randn(6)

    def run():
        x = x0.clone().requires_grad_(True)
        w = w0.clone().requires_grad_(True)
        b = b0.clone().requires_grad_(True)
        h = F.gelu(x @ w + b)
        y = torch.softmax(h * 2, -1)
        loss = (y * torch.sigmoid(h)).sum()
        loss.backward()
        return loss.detach(), x.grad, w.grad, b.grad

    expected = run()
    assert torch.is_grad_enabled()
    with gpuos.scheduler_context():
        got = run()
    _assert_identical(got, expected)


def test_graph_built_inside_backward_outside():
    x0 = torch.randn(5, 7)
    x = x0.clone().requires_grad_(True)
    with gpuos.scheduler_context():
        y = (torch.tanh(x) * x + 1).mean(-1)
    y.sum().backward()
    xe = x0.clone().requires_grad_(True)
    (torch.tanh(xe) * xe + 1).mean(-1).sum().backward()
    assert torch.equal(y.detach(), (torch.tanh(x0) * x0 + 1).mean(-1))
    assert torch.equal(x.grad, xe.grad)


# ============================================================================ life cycle

def test_enter_exit_repeatedly():
    x = torch.randn(16)
    ctx = gpuos.scheduler_context()
    for i in range(20):
        with ctx:
            y = x * i + 1
        _no_mode_left()
        assert torch.equal(y, x * i + 1)
    for i in range(20):  # fresh contexts each time
        with gpuos.scheduler_context() as c:
            assert isinstance(c, GpuosScheduler)
            assert _get_current_dispatch_mode() is c
            y = torch.sigmoid(x) - i
        _no_mode_left()
        assert torch.equal(y, torch.sigmoid(x) - i)


def test_nested_contexts():
    x = torch.randn(3, 11)
    with gpuos.scheduler_context() as outer:
        a = x + 1
        with gpuos.scheduler_context(size_threshold=16, auto_flush_ms=0) as inner:
            assert _get_current_dispatch_mode() is inner
            b = torch.softmax(a, -1) * 2
        assert _get_current_dispatch_mode() is outer
        c = b - a
    _no_mode_left()
    assert torch.equal(c, torch.softmax(x + 1, -1) * 2 - (x + 1))


def test_nested_same_instance():
    x = torch.randn(10)
    ctx = gpuos.scheduler_context()
    with ctx:
        with ctx:
            y = x * 3
        z = y + 1
    _no_mode_left()
    assert torch.equal(z, x * 3 + 1)


class _Boom(Exception):
    pass


def test_exception_propagates_and_context_stays_usable():
    x = torch.randn(8)
    ctx = gpuos.scheduler_context()
    with pytest.raises(_Boom):
        with ctx:
            _ = x + 1
            raise _Boom("raised inside the context")
    _no_mode_left()
    # a torch error raised by an op inside the context propagates unchanged
    with pytest.raises(RuntimeError):
        with gpuos.scheduler_context():
            _ = torch.randn(3) + torch.randn(4)
    _no_mode_left()
    # the same instance and a fresh one are usable afterwards
    with ctx:
        y = torch.relu(x) * 2
    with gpuos.scheduler_context():
        z = torch.exp(x) + y
    _no_mode_left()
    assert torch.equal(y, torch.relu(x) * 2)
    assert torch.equal(z, torch.exp(x) + torch.relu(x) * 2)


def test_exception_inside_nested_contexts():
    with pytest.raises(KeyError):
        with gpuos.scheduler_context():
            with gpuos.scheduler_context():
                raise KeyError("inner")
    _no_mode_left()


def test_flush_without_pending_is_noop():
    """Flushing a context with nothing deferred (outside it, inside it, and its exit) returns None, publishes no
    batch, launches no worker, intercepts nothing, and leaves no dispatch mode behind."""
    gpuos.flush(sync=True)  # whatever earlier tests left pending (on a GPU machine) is not this test's
    before = gpuos.scheduler_stats()
    ctx = gpuos.scheduler_context()
    assert ctx.flush() is None
    assert ctx.flush("explicit") is None
    with ctx:
        assert ctx.flush() is None
    after = gpuos.scheduler_stats()
    for key in ("batches_by_cause", "launches_by_cause", "ops_intercepted", "fallbacks"):
        assert after[key] == before[key], (key, before[key], after[key])
    _no_mode_left()


# ============================================================================ public API surface

def test_scheduler_context_signature():
    sig = inspect.signature(gpuos.scheduler_context)
    params = sig.parameters
    assert list(params) == ["capacity", "threads_per_block", "size_threshold", "auto_flush_ms", "front", "cfront",
                            "live_idle_us"]
    assert params["front"].default is None and params["cfront"].default is True  # None: where cfront is off
    assert params["live_idle_us"].default is None  # None: GPUOS_LIVE_IDLE_US, else off (experimental)
    assert params["capacity"].default == 8192
    assert params["threads_per_block"].default == 256
    assert params["size_threshold"].default == 1 << 15
    assert params["auto_flush_ms"].default == 2.0
    assert isinstance(params["auto_flush_ms"].default, float)
    for p in params.values():
        assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def test_scheduler_context_returns_configured_mode():
    ctx = gpuos.scheduler_context(capacity=1024, threads_per_block=128, size_threshold=99, auto_flush_ms=0.5)
    assert isinstance(ctx, GpuosScheduler)
    assert (ctx.capacity, ctx.threads_per_block, ctx.size_threshold, ctx.auto_flush_ms) == (1024, 128, 99, 0.5)
    d = gpuos.scheduler_context()
    assert (d.capacity, d.threads_per_block, d.size_threshold, d.auto_flush_ms) == (8192, 256, 1 << 15, 2.0)
    assert d.front is None and gpuos.scheduler_context(front=False).front is False


def test_stats_has_scheduler_keys():
    st = gpuos.stats()
    for k in ("ops_intercepted", "fallbacks", "flushes_by_cause", "mean_batch_size"):
        assert k in st, f"gpuos.stats() lacks {k!r}: {sorted(st)}"
    assert isinstance(st["ops_intercepted"], int)
    assert isinstance(st["fallbacks"], dict)
    assert isinstance(st["flushes_by_cause"], dict)
    for k in ("fallback_ops", "batches_by_cause", "launches_by_cause"):
        assert isinstance(st[k], dict), k
        assert all(isinstance(v, int) for v in st[k].values()), k
    assert set(st["batches_by_cause"]) == set(st["launches_by_cause"]) == set(st["flushes_by_cause"])
    assert isinstance(st["mean_batch_size"], float)
    assert all(isinstance(v, int) for v in st["fallbacks"].values())
    ss = gpuos.scheduler_stats()
    assert set(ss) >= {"ops_intercepted", "fallbacks", "flushes_by_cause", "mean_batch_size", "flush_host_us"}
    assert set(ss["flush_host_us"]) == {"analyse_us", "emit_us", "keep_us", "publish_us"}
    assert isinstance(ss["recycled_outputs"], int) and ss["recycled_outputs"] >= 0
    assert all(isinstance(v, float) and v >= 0 for v in ss["flush_host_us"].values())


def test_gpuos_scheduler_class():
    assert issubclass(GpuosScheduler, TorchDispatchMode)
    assert gpuos.GpuosScheduler is GpuosScheduler
    assert GpuosScheduler.__doc__ and len(GpuosScheduler.__doc__.strip()) > 20
    assert gpuos.scheduler_context.__doc__
    for name in ("GpuosScheduler", "scheduler_context", "scheduler_stats", "intercepted_ops"):
        assert name in gpuos.__all__


def test_intercepted_ops_lists_core_overloads():
    ops = gpuos.intercepted_ops()
    assert ops == sorted(ops)
    for name in ("aten.add.Tensor", "aten.mul.Tensor", "aten.add_.Tensor", "aten.gelu.default",
                 "aten._softmax.default", "aten._log_softmax.default", "aten.sum.dim_IntList", "aten.mean.dim",
                 "aten.amax.default", "aten.relu_.default"):
        assert name in ops, f"{name} not in gpuos.intercepted_ops()"


# ============================================================================ the C++ __torch_dispatch__

def test_torch_dispatch_is_the_c_function_bound_to_the_mode():
    import gpuos_ext
    m = GpuosScheduler()
    assert m.__torch_dispatch__.__self__ is m  # torch requires a method bound to the mode
    assert m.__torch_dispatch__.__func__ is gpuos_ext.sched_dispatch
    # the class keeps the Python path, which sched_dispatch calls for overloads without a fast spec
    assert callable(m._dispatch_py) and callable(m._eager)


def test_fast_table_has_the_plain_elementwise_overloads_only():
    import gpuos_ext
    fast = set(gpuos_ext.sched_fast_ops())
    for name in ("aten.add.Tensor", "aten.add.Scalar", "aten.add_.Tensor", "aten.add.out", "aten.sub.Tensor",
                 "aten.mul.Tensor", "aten.div.Tensor", "aten.div_.Scalar", "aten.relu.default", "aten.sigmoid_.default",
                 "aten.exp.out", "aten.maximum.default", "aten.pow.Tensor_Scalar"):
        assert name in fast, name
    # other scalars (negative_slope, min/max, approximate) and reductions keep their Python handlers
    for name in ("aten.leaky_relu.default", "aten.clamp.default", "aten.gelu.default", "aten.sum.dim_IntList",
                 "aten._softmax.default", "aten.clamp.Tensor"):
        assert name not in fast, name
    assert fast <= set(gpuos.intercepted_ops())


def test_set_fast_rejects_a_bad_spec():
    import gpuos_ext
    before = gpuos_ext.sched_fast_ops()
    table = gpuos_ext.op_table()
    sum_id = next(r["id"] for r in table if r["name"] == "sum")
    add_id = next(r["id"] for r in table if r["name"] == "add")
    for spec in ((sum_id, 0, 1, 0.0, 0.0, 0, False),    # a reduction
                 (add_id, 0, 1, 1.0, 0.0, 1, False),    # wrong arity
                 (add_id, 3, 2, 1.0, 0.0, 1, False),    # no such mode
                 (add_id, 0, 2, 1.0, 0.0, 7, False)):   # no such scalar rule
        with pytest.raises(ValueError, match="bad spec"):
            gpuos_ext.sched_set_fast({torch.ops.aten.add.Tensor: spec})
    assert gpuos_ext.sched_fast_ops() == before  # a rejected table changes nothing


@pytest.mark.parametrize("case", ["alpha_kw", "alpha_pos", "alpha_tensor", "rounding_mode", "out_kw", "inplace"])
def test_fast_path_scalar_rules_match_eager_on_cpu(case):
    """CPU tensors take the fast table's argument reading, then run eagerly (not_cuda or a rejected scalar)."""
    a, b = torch.randn(8), torch.randn(8) + 3.0
    aten = torch.ops.aten
    calls = {
        "alpha_kw": lambda: aten.add.Tensor(a, b, alpha=2.5),
        "alpha_pos": lambda: aten.sub.Scalar(a, 2.0, 0.5),
        "alpha_tensor": lambda: torch.add(a, b, alpha=torch.tensor(2.0).item()),
        "rounding_mode": lambda: aten.div.Tensor_mode(a, b, rounding_mode="floor"),
        "out_kw": lambda: aten.mul.out(a, b, out=torch.empty(8)),
        "inplace": lambda: aten.mul_.Tensor(a.clone(), b),
    }
    expected = calls[case]()
    before = gpuos.stats()["fallbacks"]
    with gpuos.scheduler_context():
        got = calls[case]()
    after = gpuos.stats()["fallbacks"]
    assert torch.equal(got, expected)
    assert sum(after.values()) > sum(before.values())


# ============================================================================ the __torch_function__ front

def test_front_table_has_the_functional_calls_of_the_fast_ops():
    import gpuos_ext
    front = set(gpuos_ext.sched_front_ops())
    for f in (torch.add, torch.Tensor.add, torch.mul, torch.Tensor.mul, torch.Tensor.div, torch.sigmoid,
              torch.Tensor.relu, torch.maximum, torch.exp):
        assert repr(f) in front, f
    for f in (torch.Tensor.add_, torch.nn.functional.gelu, torch.clamp, torch.softmax, torch.sum, torch.matmul):
        assert repr(f) not in front, f


def _front_cases():
    x, y = torch.randn(6, 5), torch.randn(5) + 3.0
    return {
        "add": lambda: x + y, "radd": lambda: 2 + x, "mul_number": lambda: x * 2, "sub_alpha": lambda: torch.sub(x, y, alpha=3),
        "div": lambda: x / y, "div_floor": lambda: torch.div(x, y, rounding_mode="floor"),
        "add_out": lambda: torch.add(x, y, out=torch.empty(6, 5)), "sigmoid": lambda: torch.sigmoid(x),
        "relu_method": lambda: x.relu(), "maximum": lambda: torch.maximum(x, y), "pow_number": lambda: torch.pow(x, 2),
        "alpha_method": lambda: x.add(y, alpha=0.5),
        "shape": lambda: torch.tensor(x.shape), "view": lambda: x.view(30), "sum": lambda: x.sum(-1),
    }


@pytest.mark.parametrize("case", list(_front_cases()))
def test_front_passes_calls_through_unchanged(case):
    """With no CUDA tensor nothing is recorded: the front hands every call on (func(*args, **kwargs)) and the
    results equal eager's."""
    from gpuos.scheduler import _Front
    fn = _front_cases()[case]
    expected = fn()
    with GpuosScheduler(front=False):
        with _Front():
            got = fn()
    assert torch.equal(got, expected)


@pytest.mark.parametrize("bad", ["maximum_number", "sigmoid_number", "relu_two_args"])
def test_front_leaves_invalid_calls_to_pytorch(bad):
    """Calls PyTorch refuses (a number where a tensor must be, extra arguments) raise the same TypeError."""
    from gpuos.scheduler import _Front
    x = torch.randn(4)
    fn = {"maximum_number": lambda: torch.maximum(x, 2.0), "sigmoid_number": lambda: torch.sigmoid(2.0),
          "relu_two_args": lambda: torch.relu(x, x)}[bad]
    with pytest.raises(TypeError) as eager:
        fn()
    with GpuosScheduler(front=False):
        with _Front():
            with pytest.raises(TypeError) as fronted:
                fn()
    assert str(fronted.value) == str(eager.value)


def test_front_not_pushed_without_cuda_and_stacks_cleanly():
    depth = torch._C._len_torch_function_stack()
    with gpuos.scheduler_context() as m:
        inside = torch._C._len_torch_function_stack()
        with m:  # the same instance nested
            pass
        assert torch._C._len_torch_function_stack() == inside
    assert torch._C._len_torch_function_stack() == depth
    assert inside == depth + (1 if torch.cuda.is_available() else 0)


def test_front_conditions_seen_from_inside_a_function_mode():
    """_front_diag reports the front's checks where a __torch_function__ runs: a GpuosScheduler as the innermost
    dispatch mode and no other function mode qualify; another dispatch mode on top does not; CPU tensors never."""
    import gpuos_ext
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Probe(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(gpuos_ext._testing.front_diag(args[0]))
            return func(*args, **(kwargs or {}))

    class Other(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.ones(3)
    with GpuosScheduler(front=False):
        with Probe():
            x + 1
        with Other(), Probe():
            x + 1
        with Probe(), Probe():  # the inner one sees a function mode below it
            x + 1
    alone, other, inner, outer = seen  # the innermost function mode runs first, with the outer one still pushed
    assert alone["front_scheduler"] and alone["top_is_scheduler"] and alone["torch_function_stack"] == 0
    assert not other["front_scheduler"] and not other["top_is_scheduler"]
    assert inner["torch_function_stack"] == 1 and not inner["front_scheduler"]
    assert outer["torch_function_stack"] == 0 and outer["front_scheduler"]
    assert not any(d["plain_cuda_tensor"] for d in seen)  # CPU tensors


def test_front_called_with_a_list_and_a_mapping_passes_them_on():
    """Called directly with args / kwargs that are not a tuple / dict (torch never does), the front calls func as
    func(*args, **kwargs) would."""
    import types

    from gpuos.scheduler import _Front
    x, y = torch.randn(5), torch.randn(5)
    f = _Front()
    assert torch.equal(f.__torch_function__(torch.add, (), [x, y], types.MappingProxyType({"alpha": 2})),
                       torch.add(x, y, alpha=2))
    assert torch.equal(f.__torch_function__(torch.sigmoid, (), (x,), None), torch.sigmoid(x))
    with pytest.raises(TypeError):
        f.__torch_function__(torch.add, ())  # too few arguments for torch.add: PyTorch's own error


def test_front_alpha_beyond_a_double_is_pytorchs_error():
    """alpha=10**400 cannot become a float: the front passes the call on (with a CUDA tensor it reads alpha first
    and clears the OverflowError) and PyTorch raises its own error."""
    from gpuos.scheduler import _Front
    x = torch.randn(4)
    with pytest.raises(Exception) as eager:
        torch.add(x, x, alpha=10 ** 400)
    with GpuosScheduler(front=False):
        with _Front():
            with pytest.raises(type(eager.value)):
                torch.add(x, x, alpha=10 ** 400)


def test_every_ops_def_aten_overload_has_a_handler():
    """The scheduler's handler table is generated from ops.def's aten column: every overload torch has is served."""
    import gpuos_ext

    from gpuos import scheduler as sched

    missing = []
    for row in gpuos_ext.op_table():
        for entry in row["aten"]:
            name, _ = sched._parse_aten(entry)
            ov = sched._resolve_aten(name)
            if ov is not None and ov not in sched._HANDLERS:
                missing.append(entry)
    assert not missing, missing
    assert torch.ops.aten.rsub.Scalar in sched._HANDLERS and torch.ops.aten.pow.Scalar in sched._HANDLERS


def test_reasons_and_modes_come_from_the_extension():
    import gpuos_ext

    from gpuos import scheduler as sched

    assert sched._REASONS == gpuos_ext.sched_reasons() and sched._REASONS[6] == "unsupported_args"
    assert sched._MODES == {"functional": 0, "inplace": 1, "out": 2}
    lim = gpuos_ext.limits()
    assert lim["program_bytes"] == 16 + lim["prog_max_instr"] * 16


def test_casts_and_copies_have_handlers():
    """aten::_to_copy, copy_, cat, stack and native_layer_norm reach the scheduler's handlers (here on the CPU:
    'not_cuda'); a device move is refused before that ('unsupported_args')."""
    a, dst = torch.randn(3, 4), torch.empty(3, 4, dtype=torch.float16)
    before = dict(gpuos.stats()["fallbacks"])
    with gpuos.scheduler_context():
        h = a.half()
        dst.copy_(a)
        m = a.to("meta")
        c = torch.cat([a, a], -1)
        s = torch.stack([a, a])
        ln = torch.nn.functional.layer_norm(a, (4,))
    after = gpuos.stats()["fallbacks"]
    assert after.get("not_cuda", 0) - before.get("not_cuda", 0) >= 5, after
    torch.testing.assert_close(ln, torch.nn.functional.layer_norm(a, (4,)))
    assert torch.equal(c, torch.cat([a, a], -1)) and torch.equal(s, torch.stack([a, a]))
    assert after.get("unsupported_args", 0) - before.get("unsupported_args", 0) >= 1, after
    assert torch.equal(h, a.half()) and torch.equal(dst, a.half()) and m.device.type == "meta"


def test_timer_off_gil_switch_and_environment():
    """The flush timer publishes holding the GIL by default (the off-GIL way is off until its stress fix has run on a
    GPU); the switch and GPUOS_TIMER_OFF_GIL=1 turn it on (the A/B of sched/flush.cpp sched_flush_due); with no
    CUDA work, a timer call with nothing deferred publishes nothing."""
    import gpuos_ext
    from _helpers import describe, run_python
    was = gpuos_ext.sched_timer_off_gil()
    try:
        gpuos_ext.sched_set_timer_off_gil(False)
        assert gpuos_ext.sched_timer_off_gil() is False
        gpuos_ext.sched_set_timer_off_gil(True)
        assert gpuos_ext.sched_timer_off_gil() is True
        assert gpuos_ext.sched_flush_due(0.0) == 0
    finally:
        gpuos_ext.sched_set_timer_off_gil(was)
    code = "import gpuos_ext; print(gpuos_ext.sched_timer_off_gil())"
    for env, want in (({}, "False"), ({"GPUOS_TIMER_OFF_GIL": "0"}, "False"), ({"GPUOS_TIMER_OFF_GIL": "1"}, "True")):
        p = run_python(code, env_extra=env)
        assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == want, (env, describe(p))


def test_live_window_argument_and_bookkeeping():
    """scheduler_context(live_idle_us=...) takes a window >= 0 (a clear error otherwise); the windows open at once
    (threads, nested contexts) apply their longest, and closing them all leaves none (gpuos.stats()'s
    live_idle_us)."""
    import os

    import gpuos_ext

    with pytest.raises(ValueError, match=r"scheduler_context\(live_idle_us=-1\): .* >= 0"):
        gpuos.scheduler_context(live_idle_us=-1)
    with pytest.raises(ValueError, match=r"live_idle_us=nan"):
        gpuos.scheduler_context(live_idle_us=float("nan"))
    if os.environ.get("GPUOS_LIVE_IDLE_US"):
        pytest.skip("GPUOS_LIVE_IDLE_US replaces every context's window")
    assert gpuos_ext.sched_live_window_open(0.0) == 0.0       # 0: no window
    a = gpuos_ext.sched_live_window_open(5000.0)
    b = gpuos_ext.sched_live_window_open(3000.0)
    assert (a, b) == (5000.0, 3000.0)
    assert gpuos.stats()["live_idle_us"] == 5000.0             # the longest open one
    gpuos_ext.sched_live_window_close(a)
    assert gpuos.stats()["live_idle_us"] == 3000.0
    gpuos_ext.sched_live_window_close(b)
    gpuos_ext.sched_live_window_close(b)                       # not open: ignored
    assert gpuos.stats()["live_idle_us"] == 0.0
