"""Operator injection on the GPU (issue #5): registered ops run through the worker for every dtype and
layout; the dual-slot alias switch is atomic per sub-op under continuous load; an op replaced in place under
load gives old or new results, never a mix, none lost; a broken source keeps the old generation; a warm
process installs the same ops without compiling, and an idle runtime adopts a new generation before any
flush needs it; handover (drain + load + relaunch) under load loses nothing.

Wall time: with linked generations (issue #18, the default when nvJitLink is usable) a generation compiles only
its new ops' small objects and links; with GPUOS_LINK=0 every generation is a full worker compile (~10-25 s on a
cold cache). The module registers all its ops in one generation (tests/_inj_ops.py); the in-place install and the
broken-source test add one generation each.
"""

import os
import statistics
import threading
import time

import pytest
import torch

import gpuos
import gpuos_ext
from _helpers import REPO_ROOT, describe, run_python
import _inj_ops

pytestmark = pytest.mark.gpu

ROW = 256  # elements per row: one sub-op (tile) per row


@pytest.fixture(scope="module")
def inj():
    """Runtime up and the module's ops registered in one generation. Submitting an op whose generation is
    still compiling waits for it (the registrations do not wait: batch_install(wait=False))."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpuos_ext.init()
    ids = _inj_ops.register_all(gpuos, wait=False)
    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    out = torch.empty_like(x)
    gpuos.submit("inj_axb1", [x, y], out)  # waits for the generation, then records
    gpuos.flush(sync=True)
    torch.testing.assert_close(out, x * y + 1.0, rtol=1e-6, atol=1e-6)
    info = gpuos.generation_info()
    assert info["ready"] >= 1 and not info["compiling"], info
    dev = torch.cuda.current_device()
    assert info["active"][dev] == info["ready"], info
    yield ids
    for name in ("inj_sw", "mul"):  # leave every op on slot 0 for later test modules
        op = {o["name"]: o for o in gpuos.user_ops()}[name]
        if op["active_slot"] != 0:
            gpuos.switch(name, 0)


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=1e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_registered_ops_match_torch(inj, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    n = 10_000  # 3 tiles; fp16/bf16 take the 8-wide vector path, the tail the scalar one
    x, y, z = (torch.randn(n, device="cuda", generator=g).to(dtype) for _ in range(3))
    f = lambda t: t.float()  # noqa: E731
    cases = [
        ("inj_axb1", [x, y], {}, f(x) * f(y) + 1.0),
        (inj["inj_axb1"], [x, y], {}, f(x) * f(y) + 1.0),  # by id
        ("inj_sqd", [x, y], {}, (f(x) - f(y)) ** 2),
        ("inj_lerp", [x, y, z], {"s0": 0.25}, f(x) + 0.25 * (f(y) - f(x)) + f(z)),
        ("inj_sw", [x, 2.0], {}, f(x) + 2.0),  # a Python number operand
    ]
    for op, ins, sc, ref in cases:
        out = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
        gpuos.submit(op, ins, out, **sc)
        gpuos.flush(sync=True)
        torch.testing.assert_close(out.float(), ref.to(dtype).float(), **TOL[dtype], msg=lambda m: f"{op}: {m}")


def test_registered_ops_strided_and_broadcast(inj):
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(64, 96, device="cuda", generator=g).t()  # (96, 64), transposed
    row = torch.randn(64, device="cuda", generator=g)        # broadcast over rows
    out = torch.empty(64, 96, device="cuda").t()             # strided output
    gpuos.submit("inj_sqd", [x, row], out)
    half = torch.randn(96, 128, device="cuda", generator=g).half()[:, ::2]  # stepped, fp16
    col = torch.randn(96, 1, device="cuda", generator=g).half()
    out2 = torch.empty(96, 64, device="cuda", dtype=torch.float16)
    gpuos.submit("inj_axb1", [half, col], out2)
    gpuos.flush(sync=True)
    torch.testing.assert_close(out, (x - row) ** 2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2.float(), (half.float() * col.float() + 1.0).half().float(), rtol=2e-3, atol=1e-3)


def test_user_ops_listing(inj):
    ops = {o["name"]: o for o in gpuos.user_ops()}
    a = ops["inj_axb1"]
    assert a["id"] == inj["inj_axb1"] >= 64 and a["arity"] == 2 and a["aten"] == "aten::inj_axb1"
    assert a["state"] == "ready" and a["generation"] >= 1 and a["slots"] == [0]
    assert ops["inj_sqd"]["kinds"] == {0: "function"} and ops["inj_sqd"]["arity"] == 2
    assert ops["inj_sw"]["slots"] == [0, 1]
    m = ops["mul"]
    assert m["builtin"] and m["id"] == 2 and m["kinds"] == {0: "builtin", 1: "function"}


def test_dual_slot_switch(inj):
    """switch, verify, roll back, verify (the prototype's test_dual_slot_switch)."""
    a = torch.randn(5000, device="cuda")
    b = torch.rand(5000, device="cuda") + 0.5
    out = torch.empty_like(a)

    def run():
        out.fill_(float("nan"))
        gpuos.submit("inj_sw", [a, b], out)
        gpuos.flush(sync=True)
        return out.clone()

    assert torch.equal(run(), a + b)
    assert gpuos.switch("inj_sw", 1) == 0
    try:
        assert torch.equal(run(), a - b)
        assert {o["name"]: o for o in gpuos.user_ops()}["inj_sw"]["active_slot"] == 1
    finally:
        assert gpuos.rollback("inj_sw") == 0
    assert torch.equal(run(), a + b)
    with pytest.raises(ValueError, match="nothing is installed in slot 1"):
        gpuos.switch("inj_axb1", 1)


def test_builtin_op_slot1_switch(inj):
    """A built-in op (mul) switched to an installed implementation and back: submit_mul, submit('mul')."""
    a = torch.randn(3000, device="cuda")
    b = torch.randn(3000, device="cuda")
    out1, out2 = torch.empty_like(a), torch.empty_like(a)
    gpuos.switch("mul", 1)
    try:
        gpuos.submit_mul(a, b, out1)
        gpuos.submit("mul", [a, b], out2)
        gpuos.flush(sync=True)
        torch.testing.assert_close(out1, a * b + 1.0, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out2, a * b + 1.0, rtol=1e-6, atol=1e-6)
    finally:
        gpuos.rollback("mul")
    gpuos.submit_mul(a, b, out1)
    gpuos.flush(sync=True)
    assert torch.equal(out1, a * b)


class Loader:
    """A second thread submitting `op` row by row (one sub-op per row) in chunks, flushing each chunk with
    sync=True and classifying every row as old(a, b) or new(a, b) -- any other row (a mix, or NaN = lost) is
    an error."""

    def __init__(self, op, rows, old, new, sync=True):
        g = torch.Generator(device="cuda").manual_seed(3)
        self.a = torch.randn(rows, ROW, device="cuda", generator=g)
        self.b = torch.rand(rows, ROW, device="cuda", generator=g) + 0.5  # old != new everywhere
        self.old, self.new = old(self.a, self.b), new(self.a, self.b)
        assert not (self.old == self.new).any()
        self.op, self.rows, self.sync = op, rows, sync
        self.chunks = []  # (n_old, n_new) per completed chunk
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            out = torch.empty(self.rows, ROW, device="cuda")
            while not self.stop.is_set():
                out.fill_(float("nan"))
                for i in range(self.rows):
                    gpuos.submit(self.op, [self.a[i], self.b[i]], out[i])
                gpuos_ext.flush(sync=True)
                is_old = (out == self.old).all(1)
                is_new = (out == self.new).all(1)
                bad = ~(is_old | is_new)
                if bool(bad.any()):
                    i = int(bad.nonzero()[0])
                    self.errors.append(f"chunk {len(self.chunks)} row {i}: neither old nor new "
                                       f"(nan={int(out[i].isnan().sum())}, old={int((out[i] == self.old[i]).sum())}, "
                                       f"new={int((out[i] == self.new[i]).sum())} of {ROW})")
                    return
                self.chunks.append((int(is_old.sum()), int(is_new.sum())))
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            self.errors.append(repr(e))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(120)
        assert not self.thread.is_alive(), "loader thread did not finish"

    def wait_chunks(self, n, timeout=120):
        target = len(self.chunks) + n
        t0 = time.monotonic()
        while len(self.chunks) < target and not self.errors:
            assert self.thread.is_alive() or self.errors, "loader thread died"
            assert time.monotonic() - t0 < timeout, f"loader made no progress for {timeout} s"
            time.sleep(0.0005)
        assert not self.errors, self.errors

    def subops(self):
        return sum(o + n for o, n in self.chunks)


@pytest.mark.watchdog(300)
def test_online_switch_under_load(inj):
    """100,000+ sub-ops from a second thread while the op is switched and rolled back 100 times: every
    sub-op's output is wholly old (a+b) or wholly new (a-b), none is lost, and each switch took effect."""
    rows = 500
    with Loader("inj_sw", rows, lambda a, b: a + b, lambda a, b: a - b) as ld:
        ld.wait_chunks(1)
        for _ in range(100):
            gpuos.switch("inj_sw", 1)
            ld.wait_chunks(2)  # the 2nd chunk from now was published after the switch returned: all new
            gpuos.rollback("inj_sw")
            ld.wait_chunks(2)
        while ld.subops() < 100_000 and not ld.errors:
            ld.wait_chunks(1)
    assert not ld.errors, ld.errors
    n_old = sum(o for o, _ in ld.chunks)
    n_new = sum(n for _, n in ld.chunks)
    assert n_old + n_new == ld.subops() >= 100_000
    assert n_new >= 100 * rows and n_old >= 100 * rows, (n_old, n_new)


@pytest.mark.watchdog(300)
def test_handover_under_load(inj):
    """Explicit handovers (drain, load a new module, relaunch) while a second thread keeps submitting: no
    sub-op lost or wrong, and each handover is counted."""
    assert {o["name"]: o for o in gpuos.user_ops()}["inj_sw"]["active_slot"] == 0
    before = gpuos.stats()["handovers"]
    times = []
    with Loader("inj_sw", 300, lambda a, b: a + b, lambda a, b: a - b) as ld:
        ld.wait_chunks(1)
        for _ in range(20):
            times.append(gpuos_ext._force_handover())
            ld.wait_chunks(1)
    assert not ld.errors, ld.errors
    assert all(c == (300, 0) for c in ld.chunks), [c for c in ld.chunks if c != (300, 0)][:5]
    assert gpuos.stats()["handovers"] - before == 20
    med = statistics.median(t["total_us"] for t in times)
    print(f"handover under load: median {med:.0f} us "
          f"(drain {statistics.median(t['drain_us'] for t in times):.0f}, "
          f"load {statistics.median(t['load_us'] for t in times):.0f})")


@pytest.mark.watchdog(300)
def test_inplace_install_under_load(inj):
    """The prototype's test_online_switch: overwrite the active implementation in place while a second thread
    keeps submitting. Rows are wholly old (a+b) or wholly new (a-b), none lost; everything submitted after
    install() returned runs the new code, on a newer generation taken over by a handover."""
    dev = torch.cuda.current_device()
    info0 = gpuos.generation_info()
    handovers0 = gpuos.stats()["handovers"]
    with Loader("inj_ow", 300, lambda a, b: a + b, lambda a, b: a - b) as ld:
        ld.wait_chunks(2)
        gpuos.install("inj_ow", "a - b", slot=0)  # blocks for the generation compile; the loader keeps going
        after = len(ld.chunks)
        ld.wait_chunks(3)
    assert not ld.errors, ld.errors
    assert ld.chunks[0] == (300, 0), ld.chunks[:3]
    assert all(c == (0, 300) for c in ld.chunks[after + 1:]), ld.chunks[after:]
    info = gpuos.generation_info()
    assert info["ready"] > info0["ready"] and info["active"][dev] == info["ready"], info
    assert gpuos.stats()["handovers"] > handovers0
    op = {o["name"]: o for o in gpuos.user_ops()}["inj_ow"]
    assert op["generation"] == info["ready"] and op["state"] == "ready", op


@pytest.mark.watchdog(300)
def test_broken_source_keeps_old_generation(inj):
    """A source NVRTC rejects fails fast; one that passes the front end but fails in ptxas fails the generation
    compile. Both raise CompileError with the log and leave the running generation and the op untouched."""
    dev = torch.cuda.current_device()
    info0 = gpuos.generation_info()
    with pytest.raises(gpuos.CompileError) as ei:
        gpuos.install("inj_sw", "a +* b", slot=1)
    assert ei.value.log.strip() and "inj_sw" in str(ei.value)
    assert gpuos.generation_info()["latest"] == info0["latest"]  # no generation was even queued
    bad = '__device__ float inj_sw(float a, float b) { asm volatile("gpuos.bogus.instruction;"); return a * b; }'
    linked = gpuos_ext.link_info()["mode"] == "linked"
    with pytest.raises(gpuos.CompileError) as ei:
        gpuos.install("inj_sw", bad, slot=1)
    info = gpuos.generation_info()
    if linked:  # the quick check compiles the op's own object for the GPU's arch, ptxas included: it fails there
        assert "does not compile" in str(ei.value) and ei.value.log.strip(), str(ei.value)
        assert info["latest"] == info0["latest"], info  # no generation was queued
    else:       # the quick check is PTX only: the generation's compile fails
        assert "failed to compile" in str(ei.value), str(ei.value)
        assert info["generations"][-1]["state"] == "failed", info
    assert info["ready"] == info0["ready"], info
    assert info["active"][dev] == info0["active"][dev]
    op = {o["name"]: o for o in gpuos.user_ops()}["inj_sw"]
    assert op["kinds"] == {0: "expr", 1: "expr"} and op["state"] == "ready", op  # slot 1 is still "a - b"
    a = torch.randn(2000, device="cuda")
    b = torch.rand(2000, device="cuda") + 0.5
    out = torch.empty_like(a)
    gpuos.switch("inj_sw", 1)
    try:
        gpuos.submit("inj_sw", [a, b], out)
        gpuos.flush(sync=True)
        assert torch.equal(out, a - b)
    finally:
        gpuos.rollback("inj_sw")


_WARM_SCRIPT = r"""
import sys
sys.path.insert(0, {tests!r})
import torch, gpuos, gpuos_ext
import _inj_ops
gpuos.init()
_inj_ops.register_all(gpuos)
info, st = gpuos.generation_info(), gpuos_ext.stats()  # nothing submitted or flushed yet
print("ADOPTED", st["idle_adoptions"], info["active"][torch.cuda.current_device()] == info["ready"], st["flushes"])
x = torch.randn(3000, device="cuda"); y = torch.rand(3000, device="cuda") + 0.5; out = torch.empty_like(x)
gpuos.submit("inj_sw", [x, y], out); gpuos.flush(sync=True)
assert torch.equal(out, x + y)
gpuos.switch("inj_sw", 1)
gpuos.submit("inj_sw", [x, y], out); gpuos.flush(sync=True)
assert torch.equal(out, x - y)
gpuos.rollback("inj_sw")
gpuos.submit("inj_sqd", [x, y], out); gpuos.flush(sync=True)
torch.testing.assert_close(out, (x - y) ** 2)
print("GENERATION", gpuos.generation_info()["active"])
print("COMPILES", gpuos_ext.stats()["jit_compiles"])
"""


@pytest.mark.watchdog(300)
def test_warm_process_installs_with_zero_compiles(inj):
    """A process that registers and installs the same ops as an earlier process with the same GPUOS_CACHE_DIR
    (same generated source, same cache key) runs them with GPUOS_FORBID_COMPILE=1: zero NVRTC compiles.
    The earlier process is a child too: this test process's own generations may also hold tier-2 code of fused
    chains other test modules ran hot, which a fresh process does not have (a different generation source)."""
    code = _WARM_SCRIPT.format(tests=os.path.join(REPO_ROOT, "tests"))
    warm = run_python(code, env_extra={"GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"]}, timeout=280)
    assert warm.returncode == 0, describe(warm)
    env = {"GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"], "GPUOS_FORBID_COMPILE": "1"}
    p = run_python(code, env_extra=env, timeout=280)
    assert p.returncode == 0, describe(p)
    assert "COMPILES 0" in p.stdout, describe(p)
    # The idle runtime took the new generation over on the compile thread, before any flush needed it: the
    # module load is not on the path of the first submit (handover at idle, issue #5).
    for child in (warm, p):
        assert "ADOPTED 1 True 0" in child.stdout, describe(child)


def test_scheduler_intercepts_registered_op_mapped_to_aten(inj):
    """register_elementwise(..., aten="aten::hypot"): torch.hypot under scheduler_context runs the injected op."""
    x = torch.randn(4, 300, device="cuda")
    y = torch.randn(300, device="cuda")
    before = gpuos.stats()
    with gpuos.scheduler_context(auto_flush_ms=0):
        h = torch.hypot(x, y) * 2.0
    after = gpuos.stats()
    torch.testing.assert_close(h, torch.hypot(x, y) * 2.0, rtol=1e-5, atol=1e-5)
    assert after["submitted"] - before["submitted"] >= 2
    assert after["fallbacks"].get("unsupported_op", 0) == before["fallbacks"].get("unsupported_op", 0)


_OVERRIDE_SCRIPT = r"""
import torch, gpuos, gpuos_ext
gpuos.init()
x = torch.randn(4, 300, device="cuda"); y = torch.randn(300, device="cuda")
assert "aten.mul.Tensor" in gpuos_ext.sched_fast_ops()
gpuos.register_elementwise("inj_mul_over", "a * b + 1.0f", arity=2, aten="aten::mul.Tensor")
with gpuos.scheduler_context(auto_flush_ms=0):
    got = x * y
torch.testing.assert_close(got, x * y + 1.0, rtol=1e-6, atol=1e-6)
assert "aten.mul.Tensor" not in gpuos_ext.sched_fast_ops()
assert "aten.add.Tensor" in gpuos_ext.sched_fast_ops()
print("OVERRIDDEN")
"""


@pytest.mark.watchdog(300)
def test_registered_op_mapped_to_a_fast_overload_takes_it_over():
    """A user op mapped to aten::mul.Tensor (which the C++ dispatcher records itself) leaves the fast table: the
    scheduler runs the user's code for x * y. In a child process: the mapping lasts for the process."""
    p = run_python(_OVERRIDE_SCRIPT, env_extra={"GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"]}, timeout=280)
    assert p.returncode == 0 and "OVERRIDDEN" in p.stdout, describe(p)


def test_switched_builtin_is_not_fused_by_the_scheduler(inj):
    """The fused-chain interpreter runs ops.def functors; a built-in switched to slot 1 must run its slot-1
    code, so the scheduler keeps it out of fused chains."""
    x = torch.randn(2048, device="cuda")
    y = torch.randn(2048, device="cuda")
    gpuos.switch("mul", 1)  # slot 1: a * b + 1
    try:
        with gpuos.scheduler_context(auto_flush_ms=0):
            out = torch.relu(x * y) + 0.5
        torch.testing.assert_close(out, torch.relu(x * y + 1.0) + 0.5, rtol=1e-6, atol=1e-6)
    finally:
        gpuos.switch("mul", 0)
    with gpuos.scheduler_context(auto_flush_ms=0):
        out = torch.relu(x * y) + 0.5
    torch.testing.assert_close(out, torch.relu(x * y) + 0.5, rtol=1e-6, atol=1e-6)
