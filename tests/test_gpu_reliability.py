"""GPU reliability: the wedge report (a batch published that the worker never completes: "timed out after 60 s
waiting for batch 57 (shutdown: pending work) ... done word=0, worker state=1") and its relatives.

Reported sequence (H100): gpuos_ext.init(); four explicit-API calls with bad input raise TypeError / ValueError
(CPU tensor, shape mismatch, int64, partial overlap); then four Python threads each run
``with torch.no_grad(), gpuos.scheduler_context():`` around 200 iterations of ``b = torch.tanh(a) * 0.5 + a`` on
their own 4,096-element CUDA tensor. The threads never finished; later ``submit_add`` + ``flush(sync=True)`` hung
and ``shutdown()`` timed out. The same threads alone finished in 0.1 s; an exception inside a scheduler context,
or a numel-0 and a 0-d op inside a context, before them was also reported to lead to the hang.

How a hang becomes a failure here, never a hung pytest:

* Every scenario runs in a fresh interpreter (``_helpers.run_python`` with a ``subprocess`` timeout): a wedged
  runtime is per process, so it cannot poison the rest of the suite, and a child that hangs is killed.
* In the child, ``GPUOS_TIMEOUT_S`` (read by ``init()`` into ``Config::timeout_s``, the bound of every host wait for
  the GPU) is small, every flush / sync / shutdown / init runs in a daemon thread joined with a timeout, the
  scheduler threads are daemons joined with a timeout, and ``faulthandler.dump_traceback_later(exit=True)`` is the
  last resort (it dumps every thread's stack without needing the GIL, then exits).
* Exceptions of every thread -- including the scheduler's ``gpuos-flush-timer`` threads, whose errors are otherwise
  only printed -- are collected with ``threading.excepthook`` and reported.

The child prints one ``GPUOS_RESULT {json}`` line (failures, thread errors, steps, stats); the test asserts it is
clean and shows the child's whole output otherwise. The isolation variants (tier-2 specialization off, flush timer
off, fusion off, capacity 8192) are there to localize a wedge: a variant that passes where the report sequence
fails names the mechanism involved.

In-process tests at the end check the invariants the diagnosis relies on: rejected explicit calls, an exception
inside a context and numel-0 / 0-d ops leave nothing pending and publish no empty batch.
"""

import json
import os
import subprocess

import pytest
import torch
from torch.testing import assert_close

from _helpers import describe, run_python

pytestmark = pytest.mark.gpu

DEV = "cuda"
CHILD_TIMEOUT_S = 420     # subprocess limit (a cold NVRTC compile of the worker is ~8-30 s of it)
WATCHDOG_S = 480          # conftest's per-test watchdog, above the child's limit

# --------------------------------------------------------------------------------------------------------- child
_CHILD = r'''
import faulthandler, json, os, sys, threading, time, traceback

CFG = json.loads(os.environ["GPUOS_RELIABILITY_CFG"])
faulthandler.dump_traceback_later(CFG["hard_limit_s"], exit=True)  # last resort: every thread's stack, then exit

import torch
import gpuos
import gpuos_ext
from torch.testing import assert_close

DEV = "cuda"
STEP_S = CFG["step_s"]
failures, steps, thread_errors = [], [], []
_orig_hook = threading.excepthook


def _hook(args):
    thread_errors.append({"thread": args.thread.name if args.thread is not None else "?",
                          "type": args.exc_type.__name__, "msg": str(args.exc_value)[:800]})
    _orig_hook(args)


threading.excepthook = _hook


def step(msg):
    steps.append(msg)
    print("STEP", msg, flush=True)


def fail(msg):
    failures.append(msg)
    print("FAIL", msg, flush=True)


def dump_stacks(why):
    print("=== all thread stacks (" + why + ") ===", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(all_threads=True)


def bounded(what, fn, timeout=STEP_S):
    """Run fn() in a daemon thread; (ok, value). A call still running after `timeout` is a hang: recorded,
    stacks dumped, and the caller goes on (the stuck thread is left behind, it is a daemon)."""
    box = {}

    def run():
        try:
            box["v"] = fn()
        except BaseException as e:  # noqa: BLE001 -- reported
            box["e"] = e
            box["tb"] = traceback.format_exc()

    t = threading.Thread(target=run, name="bounded:" + what, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        fail(what + ": no return within %.0f s (hang)" % timeout)
        dump_stacks(what)
        return False, None
    if "e" in box:
        fail(what + ": raised " + type(box["e"]).__name__ + ": " + str(box["e"])[:800])
        print(box["tb"], file=sys.stderr, flush=True)
        return False, None
    return True, box.get("v")


def stats_snapshot():
    ok, s = bounded("stats", lambda: {"stats": gpuos.stats(), "pending": gpuos_ext.pending(),
                                       "initialized": gpuos_ext.is_initialized()}, 10)
    return s if ok else None


def finish():
    result = {"failures": failures, "thread_errors": thread_errors, "steps": steps, "cfg": CFG,
              "end": stats_snapshot()}
    print("GPUOS_RESULT " + json.dumps(result, default=str), flush=True)
    os._exit(0 if not failures and not thread_errors else 1)   # no atexit work on a possibly wedged runtime


def synced(what, fn, timeout=STEP_S):
    """fn() then torch.cuda.synchronize(), bounded (a sync behind a wedged batch never returns)."""
    def run():
        v = fn()
        torch.cuda.synchronize()
        return v
    return bounded(what, run, timeout)


def check_close(what, got, exp, **tol):
    try:
        assert_close(got, exp, **tol)
    except AssertionError as e:
        fail(what + ": wrong result: " + str(e)[:800])


# ------------------------------------------------------------------ preludes (what ran before the threads)
def prelude_bad_inputs():
    """The report's four explicit-API calls with bad input, each must raise its error and record nothing."""
    x = torch.randn(16, device=DEV)
    cases = [
        ("cpu tensor", TypeError, lambda: gpuos_ext.submit_add(torch.ones(4), torch.ones(4), torch.empty(4))),
        ("shape mismatch", ValueError,
         lambda: gpuos_ext.submit_add(torch.randn(16, device=DEV), torch.randn(8, device=DEV),
                                      torch.empty(16, device=DEV))),
        ("int64", TypeError,
         lambda: gpuos_ext.submit_add(torch.arange(8, device=DEV), torch.arange(8, device=DEV),
                                      torch.empty(8, device=DEV, dtype=torch.int64))),
        ("partial overlap", ValueError, lambda: gpuos_ext.submit_add(x[0:8], x[0:8], x[4:12])),
    ]
    for name, exc, call in cases:
        try:
            call()
        except exc:
            continue
        except BaseException as e:  # noqa: BLE001
            fail("bad input '%s': expected %s, got %s: %s" % (name, exc.__name__, type(e).__name__, e))
            continue
        fail("bad input '%s': no error raised" % name)


def prelude_exception_in_context():
    """An exception raised inside a scheduler context (after an op was recorded); the op's result must still be
    right once the context has exited."""
    x = torch.randn(4096, device=DEV)
    exp = x * 2 + 1
    try:
        with gpuos.scheduler_context():
            y = x * 2 + 1
            raise RuntimeError("boom inside the context")
    except RuntimeError as e:
        if "boom" not in str(e):
            raise
    ok, _ = synced("prelude exception_in_context: sync", lambda: None)
    if ok:
        check_close("prelude exception_in_context", y, exp)


def prelude_empty_and_0d():
    """A numel-0 op and 0-d ops (alone and broadcast into a 4,096-element tensor) inside a context."""
    e = torch.empty(0, device=DEV)
    s = torch.tensor(1.5, device=DEV)
    x = torch.randn(4096, device=DEV)
    with gpuos.scheduler_context():
        ye = e * 2 + 1          # numel 0
        ys = s * 3 - 1          # 0-d
        ye2 = torch.mul(e, e)   # tensor-tensor forms: recorded, never a scalar fallback
        ys2 = torch.mul(s, s)
        yb = x * s              # 0-d broadcast (expanded at lowering)
    ok, _ = synced("prelude empty_and_0d: sync", lambda: None)
    if ok:
        for name, t in (("ye", ye), ("ye2", ye2)):
            if tuple(t.shape) != (0,):
                fail("numel-0 result %s has shape %s" % (name, tuple(t.shape)))
        check_close("prelude 0-d", ys, s * 3 - 1)
        check_close("prelude 0-d mul", ys2, s * s)
        check_close("prelude 0-d broadcast", yb, x * s)


PRELUDES = {"bad_inputs": prelude_bad_inputs, "exception_in_context": prelude_exception_in_context,
            "empty_and_0d": prelude_empty_and_0d}


# ------------------------------------------------------------------ the four threads
def thread_phase(round_no):
    n, iters, nthreads = CFG["numel"], CFG["iters"], CFG["threads"]
    As = [torch.randn(n, device=DEV) for _ in range(nthreads)]
    exp = [torch.tanh(a) * 0.5 + a for a in As]      # eager, outside any context
    torch.cuda.synchronize()
    results = [None] * nthreads
    errors = []
    barrier = threading.Barrier(nthreads)
    device = torch.cuda.current_device()
    kw = {"auto_flush_ms": CFG["auto_flush_ms"]}
    if CFG.get("sched_capacity"):
        kw["capacity"] = CFG["sched_capacity"]

    def worker(i):
        try:
            torch.cuda.set_device(device)
            a = As[i]
            barrier.wait(timeout=30)
            with torch.no_grad(), gpuos.scheduler_context(**kw):
                for _ in range(iters):
                    b = torch.tanh(a) * 0.5 + a
            results[i] = b
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append((i, type(e).__name__ + ": " + str(e)[:800]))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,), name="sched-%d-%d" % (round_no, i), daemon=True)
               for i in range(nthreads)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + CFG["join_s"]
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    step("round %d: threads done in %.3f s, alive %s" % (round_no, time.perf_counter() - t0, alive))
    if alive:
        fail("round %d: scheduler threads did not finish within %.0f s: %s" % (round_no, CFG["join_s"], alive))
        dump_stacks("scheduler threads hung")
        return False
    for i, msg in errors:
        fail("round %d: thread %d raised %s" % (round_no, i, msg))
    if errors:
        return False
    ok, _ = synced("round %d: sync after threads" % round_no, lambda: None)
    if not ok:
        return False
    for i in range(nthreads):
        check_close("round %d thread %d" % (round_no, i), results[i], exp[i], rtol=1e-5, atol=1e-5)
    timers = [t.name for t in threading.enumerate() if t.name == "gpuos-flush-timer"]
    if timers:
        fail("round %d: %d gpuos-flush-timer threads still alive after every context exited" % (round_no, len(timers)))
    return True


# ------------------------------------------------------------------ after the threads
def explicit_add(what):
    x = torch.randn(4096, device=DEV)
    y = torch.randn(4096, device=DEV)
    out = torch.full((4096,), float("nan"), device=DEV)

    def run():
        gpuos_ext.submit_add(x, y, out)
        gpuos_ext.flush(sync=True)
    ok, _ = bounded(what + ": submit_add + flush(sync=True)", run)
    if ok:
        check_close(what + ": submit_add", out, x + y, rtol=0, atol=0)
    return ok


def main():
    step("start " + json.dumps(CFG))
    if CFG.get("specialize_after") is not None:
        gpuos_ext.set_specialize_after(CFG["specialize_after"])
    if CFG.get("fusion") is False:
        gpuos_ext.set_fusion(False)
    # init() and the preludes run on the main thread, as in the report (their own GPU waits are bounded by
    # GPUOS_TIMEOUT_S and by synced(); faulthandler's hard limit is the backstop).
    if CFG["init"] == "explicit":
        gpuos_ext.init(**({"capacity": CFG["init_capacity"]} if CFG.get("init_capacity") else {}))
    else:   # the first scheduler context creates the runtime (its capacity, 8192)
        torch.zeros(1, device=DEV)
    for name in CFG["preludes"]:
        step("prelude " + name)
        try:
            PRELUDES[name]()
        except BaseException as e:  # noqa: BLE001
            fail("prelude %s raised %s: %s" % (name, type(e).__name__, str(e)[:800]))
            traceback.print_exc()
            finish()
    for r in range(CFG["rounds"]):
        if not thread_phase(r):
            break
    step("after threads: " + json.dumps(stats_snapshot(), default=str))
    # Whatever happened above: does the runtime still work, and can it be shut down and re-created?
    if explicit_add("after threads"):
        ok, _ = bounded("shutdown()", gpuos_ext.shutdown)
        if ok and gpuos_ext.is_initialized():
            fail("shutdown(): runtime still initialized")
        if ok:
            ok, _ = bounded("re-init()", gpuos_ext.init, CFG["init_s"])
        if ok and explicit_add("after re-init"):
            x = torch.randn(4096, device=DEV)
            holder = {}

            def sched():
                with gpuos.scheduler_context(auto_flush_ms=CFG["auto_flush_ms"]):
                    holder["z"] = torch.tanh(x) * 0.5 + x
            ok, _ = synced("scheduler after re-init", sched)
            if ok:
                check_close("scheduler after re-init", holder["z"], torch.tanh(x) * 0.5 + x, rtol=1e-5, atol=1e-5)
            bounded("final shutdown()", gpuos_ext.shutdown)
    finish()


try:
    main()
except BaseException:  # noqa: BLE001
    fail("child crashed: " + traceback.format_exc()[-2000:])
    finish()
'''

_BASE_CFG = {
    "init": "explicit",        # "explicit": gpuos_ext.init() first (as the report); "scheduler": the context does
    "init_capacity": None,     # init(capacity=...) (None: the default, 4096)
    "sched_capacity": None,    # scheduler_context(capacity=...) (ignored once a runtime exists)
    "preludes": [],
    "threads": 4,
    "iters": 200,
    "numel": 4096,
    "rounds": 3,               # the thread phase repeated: a race gets several chances
    "auto_flush_ms": 2.0,      # the scheduler's default timer
    "specialize_after": None,  # None: default (64 uses); 0: tier-2 specialization off
    "fusion": True,
    "step_s": 30.0,            # bound of each flush / sync / shutdown (the runtime's own waits raise after 5 s)
    "join_s": 45.0,            # bound of one thread phase
    "init_s": 180.0,           # bound of init() (a cold NVRTC compile of the worker)
    "hard_limit_s": 390.0,     # faulthandler exit: below CHILD_TIMEOUT_S
}


def _run_child(**overrides):
    cfg = dict(_BASE_CFG)
    cfg.update(overrides)
    env = {"GPUOS_RELIABILITY_CFG": json.dumps(cfg), "GPUOS_TIMEOUT_S": "5"}
    if os.environ.get("GPUOS_CACHE_DIR"):  # the session's JIT cache: one cold compile for the whole module
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    try:
        proc = run_python(_CHILD, env_extra=env, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        pytest.fail(f"child did not exit within {CHILD_TIMEOUT_S} s (killed): a hang past every bound\n"
                    f"--- stdout ---\n{text(e.stdout)}\n--- stderr ---\n{text(e.stderr)}")
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("GPUOS_RESULT "):
            result = json.loads(line[len("GPUOS_RESULT "):])
    assert result is not None, "child printed no result\n" + describe(proc)
    assert not result["failures"] and not result["thread_errors"] and proc.returncode == 0, (
        "failures: " + json.dumps(result["failures"], indent=1) + "\nthread errors: " +
        json.dumps(result["thread_errors"], indent=1) + "\n" + describe(proc))
    return result


# --------------------------------------------------------------------------------------------------------- tests
@pytest.mark.watchdog(WATCHDOG_S)
def test_report_sequence():
    """The exact reported sequence: init(), four rejected explicit calls, four scheduler threads; then
    submit_add + flush(sync=True), shutdown(), init() and the scheduler again must all work."""
    _run_child(init="explicit", preludes=["bad_inputs"])


@pytest.mark.watchdog(WATCHDOG_S)
@pytest.mark.parametrize("init", ["explicit", "scheduler"])
@pytest.mark.parametrize("preludes", [[], ["bad_inputs"], ["exception_in_context"], ["empty_and_0d"],
                                      ["bad_inputs", "exception_in_context", "empty_and_0d"]],
                         ids=["threads_alone", "bad_inputs", "exception_in_context", "empty_and_0d", "all"])
def test_threads_after_prelude(init, preludes):
    """The four threads after each reported prelude (and alone: the control), with the runtime created by an
    explicit init() (capacity 4096) or by the first scheduler context (capacity 8192)."""
    _run_child(init=init, preludes=preludes)


@pytest.mark.watchdog(WATCHDOG_S)
@pytest.mark.parametrize("variant", ["no_tier2", "no_timer", "no_fusion", "capacity_8192"])
def test_report_sequence_isolation(variant):
    """The report sequence with one mechanism switched off: tier-2 specialization (no generation handover while
    the threads run), the flush timer threads, fusion, or the small ring (capacity 8192 as a scheduler context
    would create). A variant that passes where test_report_sequence fails localizes the wedge."""
    over = {"no_tier2": {"specialize_after": 0}, "no_timer": {"auto_flush_ms": 0.0},
            "no_fusion": {"fusion": False}, "capacity_8192": {"init_capacity": 8192}}[variant]
    _run_child(init="explicit", preludes=["bad_inputs"], **over)


# ------------------------------------------------------------------ in-process invariants (no threads)
def _pending_state(gx):
    s = gx.stats()
    return gx.pending(), gx.sched_stats()["deferred"], s["submitted"], s["subops"], s["batches"]


def test_rejected_explicit_calls_record_nothing(rt):
    """Validation runs before the runtime is touched: rejected calls leave nothing pending, recorded or published."""
    rt.flush(sync=True)
    before = _pending_state(rt)
    x = torch.randn(16, device=DEV)
    with pytest.raises(TypeError):
        rt.submit_add(torch.ones(4), torch.ones(4), torch.empty(4))
    with pytest.raises(ValueError):
        rt.submit_add(torch.randn(16, device=DEV), torch.randn(8, device=DEV), torch.empty(16, device=DEV))
    with pytest.raises(TypeError):
        rt.submit_add(torch.arange(8, device=DEV), torch.arange(8, device=DEV),
                      torch.empty(8, device=DEV, dtype=torch.int64))
    with pytest.raises(ValueError):
        rt.submit_add(x[0:8], x[0:8], x[4:12])
    assert _pending_state(rt) == before


def test_exception_inside_context_leaves_nothing_deferred(rt):
    import gpuos

    x = torch.randn(4096, device=DEV)
    with pytest.raises(RuntimeError, match="boom"):
        with gpuos.scheduler_context(auto_flush_ms=0):
            y = x * 2 + 1
            raise RuntimeError("boom")
    pending, deferred = rt.pending(), rt.sched_stats()["deferred"]
    assert deferred == 0 and pending == 0, (pending, deferred)
    rt.flush(sync=True)
    assert_close(y, x * 2 + 1)


def test_empty_and_0d_ops_publish_no_empty_batch(rt):
    """A recorded numel-0 op records no sub-op (and so no batch); a recorded 0-d op exactly one; nothing stays
    pending. (Tensor-tensor ops: both operands CUDA tensors, so the scheduler records rather than falls back.)"""
    import gpuos

    rt.flush(sync=True)
    e = torch.empty(0, device=DEV)
    s = torch.tensor(1.5, device=DEV)
    b0, i0 = rt.stats(), rt.sched_stats()["ops_intercepted"]
    with gpuos.scheduler_context(auto_flush_ms=0):
        ye = torch.mul(e, e)
    b1, i1 = rt.stats(), rt.sched_stats()["ops_intercepted"]
    assert i1 - i0 == 1, "the numel-0 op was not recorded"
    assert b1["subops"] == b0["subops"] and b1["batches"] == b0["batches"], (b0, b1)
    with gpuos.scheduler_context(auto_flush_ms=0):
        ys = torch.mul(s, s)
    b2, i2 = rt.stats(), rt.sched_stats()["ops_intercepted"]
    assert i2 - i1 == 1, "the 0-d op was not recorded"
    assert b2["subops"] - b1["subops"] == 1 and b2["batches"] - b1["batches"] == 1, (b1, b2)
    assert rt.pending() == 0 and rt.sched_stats()["deferred"] == 0
    rt.flush(sync=True)
    assert ye.shape == (0,)
    assert_close(ys, s * s)


_POISON_CHILD = r'''
import faulthandler, json, os
faulthandler.dump_traceback_later(240, exit=True)
import torch, gpuos, gpuos_ext
out = {}
gpuos_ext.init()
t = torch.randn([2] * 9, device="cuda").permute(*reversed(range(9)))   # 9 dims, none mergeable
try:
    with gpuos.scheduler_context(auto_flush_ms=0):
        u = torch.mul(t, t)
    out["exit"] = "ok" if torch.equal(u, t * t) else "wrong result"
except Exception as e:
    out["exit"] = type(e).__name__ + ": " + str(e)[:300]
out["deferred_after"] = gpuos_ext.sched_stats()["deferred"]
x = torch.randn(64, device="cuda")
try:
    with gpuos.scheduler_context(auto_flush_ms=0):
        y = torch.add(x, x)
    gpuos_ext.flush(sync=True)
    out["later_context"] = "ok" if torch.equal(y, x + x) else "wrong result"
except Exception as e:
    out["later_context"] = type(e).__name__ + ": " + str(e)[:300]
try:
    gpuos_ext.shutdown()
    out["shutdown"] = "ok" if not gpuos_ext.is_initialized() else "still initialized"
except Exception as e:
    out["shutdown"] = type(e).__name__ + ": " + str(e)[:300]
print("GPUOS_RESULT " + json.dumps(out), flush=True)
os._exit(0)
'''


@pytest.mark.watchdog(300)
def test_lowering_error_does_not_poison_the_deferred_queue():
    """An op the scheduler accepts but the runtime cannot lower (more than 8 non-mergeable dims, refused by
    merge_refs only at lowering) must not stay in the shared deferred queue: left there, it re-raises at every
    later flush -- from any thread's context exit, the timer, gpuos.flush() -- and makes shutdown() raise before
    the runtime is released. (Run in a child process: the poisoned queue would break every later test.)"""
    env = {"GPUOS_TIMEOUT_S": "5"}
    if os.environ.get("GPUOS_CACHE_DIR"):
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    proc = run_python(_POISON_CHILD, env_extra=env, timeout=270)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPUOS_RESULT ")]
    assert lines, describe(proc)
    out = json.loads(lines[-1][len("GPUOS_RESULT "):])
    assert out["exit"] == "ok", out
    assert out["deferred_after"] == 0, out
    assert out["later_context"] == "ok", out
    assert out["shutdown"] == "ok", out


def test_init_with_other_settings_raises(rt):
    """init() on a running runtime with another ring size or block size raises, naming both and the fix; the
    same values, or none, are accepted (idempotent)."""
    import gpuos

    rt.init()
    with pytest.raises(ValueError, match=r"capacity=12345.*already runs with capacity=.*gpuos.shutdown\(\)"):
        rt.init(capacity=12345)
    with pytest.raises(ValueError, match="threads_per_block=64"):
        rt.init(threads_per_block=64)
    rt.init(capacity=0, threads_per_block=0)  # 0: no preference
    with gpuos.scheduler_context(capacity=12345, auto_flush_ms=0):  # a context takes the running runtime as is
        y = torch.ones(8, device=DEV) + 1
    rt.flush(sync=True)
    assert torch.equal(y, torch.full((8,), 2.0, device=DEV))


_DEVICE_WIDE_CHILD = r'''
import faulthandler, json, os, sys, threading, time
faulthandler.dump_traceback_later(100, exit=True)   # last resort: every thread's stack, then exit
import torch, gpuos, gpuos_ext
gpuos_ext._testing.watchdog(45)   # a wedge: the native side's state too (the run takes ~10 s)
def tid(name):   # native ids, to read the hang report's per-thread kernel waits
    print(f"{name}: native thread {threading.get_native_id()}", file=sys.stderr, flush=True)

out = {"publish_iters": [], "blocking_iters": 0, "wrong": [], "errors": []}
tid('main')
gpuos_ext.init()
stop = threading.Event()

def publisher(k):
    tid(f"publisher {k}")
    x = torch.randn(4096, device="cuda") + k
    y = torch.randn(4096, device="cuda")
    n = 0
    try:
        while not stop.is_set():
            o = torch.empty(4096, device="cuda")
            gpuos_ext.submit_add(x, y, o)
            gpuos_ext.flush()                      # the stream waits for the batch (no host wait)
            with gpuos.scheduler_context(auto_flush_ms=0):
                z = torch.sigmoid(o) * 2 + x       # recorded; flushed at exit
            if n % 16 == 0:
                torch.cuda.current_stream().synchronize()
                if not torch.allclose(z, torch.sigmoid(x + y) * 2 + x, rtol=1e-5, atol=1e-5):
                    out["wrong"].append(f"publisher {k} iteration {n}")
            n += 1
    except Exception as e:
        out["errors"].append(f"publisher {k}: {type(e).__name__}: {str(e)[:400]}")
    out["publish_iters"].append(n)

def first_gemm():   # a fresh thread's first matmul creates its cuBLAS handle and workspace
    tid("first_gemm")
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()

def blocking():
    tid("blocking")
    n = 0
    try:
        while not stop.is_set():
            t = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
            del t
            torch.cuda.empty_cache()               # cudaFree: waits for every stream, holding the context's locks
            if n % 4 == 0:
                th = threading.Thread(target=first_gemm); th.start(); th.join(30)
            if n % 3 == 0:
                torch.cuda.synchronize()
            n += 1
    except Exception as e:
        out["errors"].append(f"blocking: {type(e).__name__}: {str(e)[:400]}")
    out["blocking_iters"] = n

threads = [threading.Thread(target=publisher, args=(k,), daemon=True) for k in range(3)]
threads.append(threading.Thread(target=blocking, daemon=True))
for t in threads: t.start()
time.sleep(float(os.environ.get("GPUOS_TEST_SECONDS", "8")))   # the workload's duration, not a synchronization
stop.set()
for t in threads: t.join(40)
out["stuck"] = [t.name for t in threads if t.is_alive()]
out["stats"] = {k: v for k, v in gpuos_ext.stats().items()
                if k in ("worker_launches", "gated_launches", "batches", "flushes")}   # (shutdown resets them)
if not out["stuck"]:
    gpuos_ext.shutdown()
print("GPUOS_RESULT " + json.dumps(out), flush=True)
os._exit(0)
'''


@pytest.mark.watchdog(200)
def test_publication_beside_device_wide_blocking_calls():
    """A wedge the stress test found (GPU idle, every thread frozen): one thread had published a batch -- the
    stream's wait for it enqueued -- and was about to launch the worker, while another thread entered a
    device-wide blocking call (cudaFree through empty_cache, a fresh thread's cuBLAS handle creation) that waits
    for every stream, so for that batch, while holding the context lock the launch needs. Publication is now
    ready words, then the launch, then the stream's wait (core/publish.cpp), so the device never depends on a
    driver call the publishing thread has yet to make. Here three threads publish (explicit submits, scheduler
    contexts; a 20 us idle time makes most publications launch a worker) beside a thread that frees memory,
    synchronizes and starts threads that run their first GEMM, for 8 s: every thread finishes, results are
    right, shutdown() completes."""
    env = {"GPUOS_TIMEOUT_S": "10", "GPUOS_IDLE_US": "20"}
    if os.environ.get("GPUOS_CACHE_DIR"):
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    proc = run_python(_DEVICE_WIDE_CHILD, env_extra=env, timeout=170)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPUOS_RESULT ")]
    assert lines, "the child printed no result (a wedge: see every thread's stack below)\n" + describe(proc)
    out = json.loads(lines[-1][len("GPUOS_RESULT "):])
    assert not out["stuck"] and not out["errors"] and not out["wrong"], (out, describe(proc))
    assert len(out["publish_iters"]) == 3 and min(out["publish_iters"]) > 0 and out["blocking_iters"] > 0, out
    assert out["stats"]["worker_launches"] > 1, out   # the short idle time made the worker leave and come back
