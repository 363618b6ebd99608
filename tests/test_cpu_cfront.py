"""The scheduler's dispatcher front (csrc/sched/cfront.h) on the CPU machine: it is registered on the first entered
context, turned on and off per thread with the contexts (nested, on exceptions), hands every op it does not take on
unchanged (CPU tensors: all of them), and reports why it is off. What it records (CUDA tensors) is checked by
tests/test_gpu_cfront.py."""
import json
import threading

import pytest
import torch

import gpuos
import gpuos_ext
from _helpers import describe, run_python
from gpuos.scheduler import GpuosScheduler


def _step(x, w):
    h = (x * 0.5 + 1.0).relu()
    h = h - h.mean(-1, keepdim=True)
    return torch.nn.functional.linear(h, w).view(-1).unsqueeze(0).transpose(0, 1).sigmoid()


def test_front_is_on_inside_a_context_and_off_after():
    with gpuos.scheduler_context():
        inside = gpuos_ext.cfront_info()
    after = gpuos_ext.cfront_info()
    assert inside["available"] and inside["reason"] == "" and inside["key"] == "DeferredInit", inside
    assert inside["enabled_here"] and inside["depth"] == 1, inside
    assert not after["enabled_here"] and after["depth"] == 0, after
    assert inside["fast_ops"] > 0


def test_ops_pass_through_unchanged_on_cpu_tensors():
    """Every op under the context reaches the fallback and goes on to the dispatch mode (CPU tensors are never
    recorded nor run below it): results equal eager, nothing counted as recorded or no-data."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    ref = _step(x, w)
    before = gpuos_ext.cfront_info()
    with gpuos.scheduler_context():
        out = _step(x, w)
    after = gpuos_ext.cfront_info()
    torch.testing.assert_close(out, ref)
    assert after["seen"] - before["seen"] >= 8, (before, after)
    assert after["recorded"] == before["recorded"] and after["nodata"] == before["nodata"], (before, after)


def test_nested_contexts_and_exceptions_restore_the_thread_state():
    with gpuos.scheduler_context() as m:
        with m:  # the same instance nested
            assert gpuos_ext.cfront_info()["depth"] == 2
        with gpuos.scheduler_context():
            assert gpuos_ext.cfront_info()["depth"] == 2
        assert gpuos_ext.cfront_info()["depth"] == 1
        with pytest.raises(ZeroDivisionError):
            with gpuos.scheduler_context():
                1 / 0
        assert gpuos_ext.cfront_info()["depth"] == 1 and gpuos_ext.cfront_info()["enabled_here"]
    assert gpuos_ext.cfront_info()["depth"] == 0 and not gpuos_ext.cfront_info()["enabled_here"]


def test_cfront_false_leaves_it_off():
    with GpuosScheduler(cfront=False):
        assert not gpuos_ext.cfront_info()["enabled_here"]
    assert gpuos.scheduler_context(cfront=False).cfront is False


def test_the_front_is_per_thread():
    """A context on one thread turns the front on for that thread only."""
    seen = {}
    entered, release = threading.Event(), threading.Event()

    def other():
        entered.wait(10)
        seen["other"] = gpuos_ext.cfront_info()["enabled_here"]
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with gpuos.scheduler_context():
        seen["here"] = gpuos_ext.cfront_info()["enabled_here"]
        entered.set()
        release.wait(10)
    t.join(10)
    assert seen == {"here": True, "other": False}


def test_table_has_the_functional_and_in_place_fast_overloads():
    from gpuos import scheduler as S
    taken = {ov for ov, spec in S._FAST.items() if spec[1] in (0, 1) and ov not in S._USER_KEYS}  # not out=
    assert any(S._FAST[ov][1] == 1 for ov in taken)
    assert gpuos_ext.cfront_info()["fast_ops"] == len(taken) > 0


def _info_in_child(expr: str, env: dict) -> dict:
    """cfront_info() in a fresh process with `env`, taken inside a context after `y = <expr>` (x: 8 x 8 on the CPU),
    and ok: y equals the same expression run outside."""
    code = ("import json, torch, gpuos, gpuos_ext\n"
            "x = torch.randn(8, 8)\n"
            "with gpuos.scheduler_context():\n"
            f"    y = {expr}\n"
            "    info = gpuos_ext.cfront_info()\n"
            f"print('CFRONT', json.dumps(dict(info, ok=bool(torch.allclose(y, {expr})))))\n")
    p = run_python(code, env, timeout=120)
    assert p.returncode == 0, describe(p)
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("CFRONT ")][-1][7:])


def test_off_by_environment_says_so():
    out = _info_in_child("(x + 1).relu()", {"GPUOS_CFRONT": "0"})
    assert out["ok"] and not out["available"] and not out["enabled_here"], out
    assert "GPUOS_CFRONT=0" in out["reason"], out


def test_allocations_run_below_the_mode():
    """An allocation with no tensor argument (in the no-data set) runs below the dispatch mode -- out of the call's
    own key set too: with the mode's Python key left in it, PyTorch asserted (the first version, found by a gloo
    collective's test) -- and a view of a CPU tensor goes on to the mode."""
    before = gpuos_ext.cfront_info()
    with gpuos.scheduler_context():
        e = torch.empty(3, 4)
        v = torch.ones(12).view(3, 4)
    after = gpuos_ext.cfront_info()
    assert e.shape == (3, 4) and torch.equal(v, torch.ones(3, 4))
    assert after["nodata"] - before["nodata"] >= 1, (before, after)


def _work(x):
    return (torch.mm(x, x.t().contiguous()), torch.max(x, dim=1), torch.sum(x, dim=1, dtype=torch.float64),
            torch.cat([x, x], dim=0), torch.sort(x, dim=-1, descending=True), torch.cumsum(x, 0))


def test_direct_calls_equal_eager():
    """Functional ops the front neither records nor runs go to the scheduler's dispatch straight from the front
    (csrc/sched/cfront_call.cpp): a keyword-only argument, multiple returns, a list of tensors -- results equal
    eager, each counted as a direct call."""
    torch.manual_seed(0)
    x = torch.randn(6, 10)
    ref = _work(x)
    before = gpuos_ext.cfront_info()
    with torch.no_grad(), gpuos.scheduler_context():
        out = _work(x)
    after = gpuos_ext.cfront_info()
    assert after["direct_on"], after
    for o, r in zip(out, ref):
        torch.testing.assert_close(tuple(o) if isinstance(r, tuple) else o, tuple(r) if isinstance(r, tuple) else r)
    assert after["direct"] - before["direct"] >= 6, (before, after)  # mm, max.dim, sum.dim_IntList, cat, sort, cumsum


def test_direct_calls_pass_what_the_python_key_passes():
    """The arguments a direct call gives the mode's Python path are those a Python dispatch mode receives for the
    same calls: defaults left out, keyword-only arguments as keywords."""
    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append(_shape_of_call(func, args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    x = torch.randn(6, 10)
    with torch.no_grad(), Seen() as seen:
        _work(x)
    m = gpuos.scheduler_context()
    got = []
    inner = m._dispatch_py

    def record(func, types, args=(), kwargs=None):
        got.append(_shape_of_call(func, args, kwargs or {}))
        return inner(func, types, args, kwargs)

    m._dispatch_py = record
    with torch.no_grad(), m:
        _work(x)
    names = {"aten.mm.default", "aten.max.dim", "aten.sum.dim_IntList", "aten.cat.default", "aten.sort.default",
             "aten.cumsum.default"}
    direct, want = [c for c in got if c[0] in names], [c for c in seen.calls if c[0] in names]
    assert len(want) == 6 and direct == want, (direct, want)


def _shape_of_call(func, args, kwargs):
    def arg(a):
        if isinstance(a, torch.Tensor):
            return ("T", tuple(a.shape), a.dtype)
        if isinstance(a, (list, tuple)):
            return tuple(arg(b) for b in a)
        return a
    return (str(func), tuple(arg(a) for a in args), tuple(sorted((k, arg(v)) for k, v in kwargs.items())))


def test_direct_calls_leave_autograd_and_errors_as_they_were():
    """A tensor that needs grad (grad mode on) goes the mode's way through Autograd: the result has its grad_fn; an
    op that raises raises the same error type from a direct call, and the thread goes on."""
    x, w = torch.randn(4, 8), torch.randn(8, 3, requires_grad=True)
    a, b = torch.randn(2, 3), torch.randn(4, 5)
    before = gpuos_ext.cfront_info()
    with gpuos.scheduler_context():
        y = torch.mm(x, w)
        with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
            torch.mm(a, b)
        z = torch.mm(x, w.detach())
    after = gpuos_ext.cfront_info()
    assert y.grad_fn is not None and z.grad_fn is None
    torch.testing.assert_close(y.detach(), x @ w.detach())
    assert after["direct"] - before["direct"] == 2, (before, after)  # the failing mm and z; not y


def test_direct_calls_off_by_environment():
    out = _info_in_child("torch.mm(x, x)", {"GPUOS_CFRONT_DIRECT": "0"})
    assert out["ok"] and out["available"] and not out["direct_on"] and out["direct"] == 0, out


def test_handlers_own_calls_skip_the_front():
    """A direct call's handler runs its own ops past the front, as under PyTorch's Python key (where they never reach
    it): one op seen per direct call of an eager reduction, not the kernels it calls."""
    x = torch.randn(4, 64)
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        c0 = gpuos_ext.cfront_info()
        m = x.mean(-1, keepdim=True)
        c1 = gpuos_ext.cfront_info()
    torch.testing.assert_close(m, x.mean(-1, keepdim=True))
    assert (c1["seen"] - c0["seen"], c1["direct"] - c0["direct"]) == (1, 1), (c0, c1)


def test_direct_calls_switch_at_run_time():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    try:
        for on in (False, True):
            gpuos_ext.cfront_set_direct(on)
            with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
                c0 = gpuos_ext.cfront_info()
                y = torch.mm(x, w)
                c1 = gpuos_ext.cfront_info()
            torch.testing.assert_close(y, x @ w)
            assert c1["direct_on"] is on and c1["direct"] - c0["direct"] == int(on), (on, c0, c1)
    finally:
        gpuos_ext.cfront_set_direct(True)


def test_kernels_inner_calls_skip_the_front():
    """An op the front hands on (in place: to the dispatch mode) runs its kernel's own dispatcher calls past the
    front (index_put_ calls _index_put_impl_): one pass per op, not one per inner call; the result is eager's."""
    x, idx, v = torch.zeros(8, 4), torch.tensor([1, 3]), torch.ones(2, 4)
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        c0 = gpuos_ext.cfront_info()
        x.index_put_((idx,), v)
        c1 = gpuos_ext.cfront_info()
    assert c1["seen"] - c0["seen"] == 1, (c0, c1)
    assert torch.equal(x[[1, 3]], v) and x.sum().item() == 8.0


def test_native_ops_refused_on_cpu_go_to_their_handlers():
    """mm / addmm / _to_copy / cat / clone are recorded by the front itself only on plain CUDA tensors (cfront_native.cpp);
    on the CPU they go on to their Python handlers (a direct call), results eager's, nothing counted native."""
    x, w, b = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        c0 = gpuos_ext.cfront_info()
        y = torch.mm(x, w)
        z = torch.addmm(b, x, w, beta=0.5, alpha=2.0)
        h = x.to(torch.float16)
        j, k = torch.cat([x, x], -1), x.t().clone()
        c1 = gpuos_ext.cfront_info()
    torch.testing.assert_close(j, torch.cat([x, x], -1), rtol=0, atol=0)
    assert torch.equal(k, x.t()) and k.stride() == x.t().stride()
    torch.testing.assert_close(y, x @ w)
    torch.testing.assert_close(z, 0.5 * b + 2.0 * (x @ w))
    assert h.dtype == torch.float16 and torch.equal(h, x.half())
    assert c1["native"] == c0["native"] and c1["direct"] - c0["direct"] == 5, (c0, c1)


def test_inplace_ops_on_cpu_go_to_the_mode():
    """index_copy_ and in-place add_ / mul_ (integer and float) are recorded by the front only on plain CUDA tensors;
    on the CPU they go on to the mode: results and version counters eager's, nothing counted native or recorded."""
    def make():
        return torch.zeros(1, 2, 8, 4), torch.tensor([3]), torch.arange(4), torch.ones(4, 8)

    def step(cache, pos, n, x):
        return [cache.index_copy_(2, pos, torch.ones(1, 2, 1, 4)) is cache, pos.add_(1) is pos, n.mul_(3) is n,
                x.add_(x, alpha=0.5) is x]

    ref, got = make(), make()
    assert step(*ref) == [True] * 4
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        c0 = gpuos_ext.cfront_info()
        same = step(*got)
        c1 = gpuos_ext.cfront_info()
    assert same == [True] * 4
    for r, g in zip(ref, got):
        assert torch.equal(r, g) and r._version == g._version, (r, g)
    assert c1["native"] == c0["native"] and c1["recorded"] == c0["recorded"], (c0, c1)


def test_native_table_leaves_out_registered_ops():
    from gpuos import scheduler as S
    assert {str(ov) for ov in S._CFRONT_NATIVE} == {"aten.mm.default", "aten.bmm.default", "aten.addmm.default",
                                                    "aten.baddbmm.default", "aten._to_copy.default",
                                                    "aten.clone.default", "aten.cat.default",
                                                    "aten.scalar_tensor.default", "aten.where.self",
                                                    "aten.arange.default", "aten.arange.start",
                                                    "aten.arange.start_step",
                                                    "aten._scaled_dot_product_efficient_attention.default",
                                                    "aten.index_copy_.default", "aten.embedding.default",
                                                    "aten.argmax.default",
                                                    "aten.native_layer_norm.default", "aten.zeros.default",
                                                    "aten.ones.default", "aten.full.default"} | \
        {f"aten.{c}.{ov}" for c in ("lt", "le", "gt", "ge", "eq", "ne") for ov in ("Tensor", "Scalar")}
    assert not set(S._CFRONT_NATIVE) & S._USER_KEYS
    assert {"aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default", "aten._softmax.default"} <= \
        {str(ov) for ov in S._REDUCE_IDS}, S._REDUCE_IDS


def test_timing_counts_each_pass_by_what_the_front_did():
    """cfront_set_timing: each pass of a timed run counted once, by what the front did (CPU tensors: the fast ops and
    views are handed on to the mode, mm is a direct call), with its own time; per operator for the ops not recorded;
    off again, nothing more is counted."""
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gpuos_ext.cfront_set_timing(True)
    try:
        with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
            c0 = gpuos_ext.cfront_info()
            y = torch.mm(x * 2, w).view(-1)
            c1 = gpuos_ext.cfront_info()
    finally:
        gpuos_ext.cfront_set_timing(False)
    t = gpuos_ext.cfront_times()
    torch.testing.assert_close(y, (x * 2 @ w).view(-1))
    cats = t["by_category"]
    assert set(cats) == {"pass", "composite", "record", "nodata", "direct", "native", "handed"}, cats
    assert sum(n for n, _ in cats.values()) >= c1["seen"] - c0["seen"] >= 3, (cats, c0, c1)
    assert cats["direct"][0] >= 1 and cats["handed"][0] >= 2, cats
    assert all(ns >= 0 for _, ns in cats.values()) and cats["direct"][1] > 0, cats
    assert t["by_op"]["aten::mm"]["direct"][0] == 1 and t["by_op"]["aten::mul.Tensor"]["handed"][0] == 1, t["by_op"]
    assert not t["timing"]
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        torch.mm(x, w)
    assert gpuos_ext.cfront_times()["by_category"] == cats


# torch.autograd.forward_ad loads its jvp decompositions through torch.jit.script (deprecated in torch 2.13)
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_an_open_forward_ad_level_sends_every_op_the_modes_way():
    """While a forward-AD level is open the front steps aside (Autograd's forward-mode kernels, below it, carry the
    tangents): every pass counted 'pass', nothing handed on, direct or native; tangents and values equal eager's.
    Closed again, the front takes ops as before."""
    import torch.autograd.forward_ad as fwAD
    x, t, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 3)

    def step(d):
        return torch.mm(d * 3 + 1, w).relu()

    with fwAD.dual_level():
        ref = fwAD.unpack_dual(step(fwAD.make_dual(x, t)))
    gpuos_ext.cfront_set_timing(True)
    try:
        with fwAD.dual_level():
            with gpuos.scheduler_context(auto_flush_ms=0):
                got = fwAD.unpack_dual(step(fwAD.make_dual(x, t)))
        inside = gpuos_ext.cfront_times()["by_category"]
        with gpuos.scheduler_context(auto_flush_ms=0):
            step(x)
        after = gpuos_ext.cfront_times()["by_category"]
    finally:
        gpuos_ext.cfront_set_timing(False)
    assert got.tangent is not None
    torch.testing.assert_close(got.primal, ref.primal)
    torch.testing.assert_close(got.tangent, ref.tangent)
    assert inside["pass"][0] >= 4 and all(inside[c][0] == 0 for c in ("handed", "direct", "native")), inside
    assert after["direct"][0] >= 1 and after["handed"][0] >= 1, after  # mm: a direct call; mul / add: handed on
