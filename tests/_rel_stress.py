"""Reliability engine, part 4: hang bounds (Watch, bounded) and the multi-threaded stress."""
from __future__ import annotations

import contextlib
import faulthandler
import json
import math
import os
import random
import sys
import threading
import time
import traceback

import torch
import torch.nn.functional as F
from _rel_ops import (  # noqa: F401
    BF16,
    F16,
    F32,
    FLOATS,
    _meta,
    _now,
    timeout_s,
)
from _rel_chains import (  # noqa: F401
    ChainGen,
    Pools,
    make_leaves,
    run_chain,
)
from _rel_check import (  # noqa: F401
    _first_bad,
    diagnose,
    listing,
    quick_count,
)


# ================================================================================================ hang bounds
class Watch:
    """Bounds on blocking calls. ``with watch.call(what, bound):`` around a call; a monitor thread records a hang
    as soon as one runs past its bound (and dumps every thread's stack once); a call that returns late is recorded
    when it returns. A hang is counted once, for the innermost call (its enclosing calls are not counted again)."""

    def __init__(self, log=print):
        self.lock = threading.Lock()
        self.stacks = {}  # thread ident -> [[what, t0, bound, flagged]]
        self.hangs = []
        self.log = log
        self.dumped = False
        self._stop = threading.Event()
        self._thread = None

    @contextlib.contextmanager
    def call(self, what, bound):
        me = threading.get_ident()
        rec = [what, _now(), bound, False, threading.current_thread().name]
        with self.lock:
            st = self.stacks.setdefault(me, [])
            st.append(rec)
        try:
            yield
        finally:
            el = _now() - rec[1]
            with self.lock:
                st.pop()
                if el > bound and not rec[3]:
                    self._flag(st + [rec], el, finished=True)

    def _flag(self, stack, elapsed, finished):
        rec = stack[-1]
        for r in stack:
            r[3] = True
        h = {"thread": rec[4], "call": rec[0], "bound_s": rec[2], "elapsed_s": round(elapsed, 2),
             "finished": finished, "inside": [r[0] for r in stack[:-1]]}
        self.hangs.append(h)
        self.log(f"HANG: {json.dumps(h)}")

    def scan(self):
        now = _now()
        dump = False
        with self.lock:
            for st in self.stacks.values():
                for rec in st:
                    if not rec[3] and now - rec[1] > rec[2]:
                        # the innermost overdue call
                        k = max(i for i in range(len(st)) if now - st[i][1] > st[i][2])
                        self._flag(st[:k + 1], now - st[k][1], finished=False)
                        dump = True
                        break
        if dump and not self.dumped:
            self.dumped = True
            print("=== every thread's stack (a call passed its bound) ===", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)

    def start(self):
        def loop():
            while not self._stop.wait(0.25):
                self.scan()
        self._thread = threading.Thread(target=loop, name="reliability-watch", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def active(self):
        now = _now()
        with self.lock:
            return [{"thread": r[4], "call": r[0], "running_s": round(now - r[1], 1)}
                    for st in self.stacks.values() for r in st]


def bounded(what, fn, timeout, watch=None):
    """Run fn() in a daemon thread joined with `timeout`: (ok, value or exception text). A call still running is a
    hang (recorded in watch if given); it is left behind (a daemon)."""
    box = {}

    def run():
        try:
            box["v"] = fn()
        except BaseException as e:  # noqa: BLE001 -- reported
            box["e"] = f"{type(e).__name__}: {str(e)[:800]}"
            box["tb"] = traceback.format_exc()[-3000:]

    t = threading.Thread(target=run, name="bounded:" + what, daemon=True)
    t0 = _now()
    t.start()
    t.join(timeout)
    if t.is_alive():
        if watch is not None:
            with watch.lock:
                watch._flag([[what, t0, timeout, False, t.name]], _now() - t0, finished=False)
        print(f"=== stacks: {what} did not return within {timeout:.1f} s ===", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
        return False, f"no return within {timeout:.1f} s"
    if "e" in box:
        return False, box["e"] + "\n" + box["tb"]
    return True, box.get("v")


class _RW:
    """Many activities at once (shared), or one alone (exclusive: the rejected-call checks compare the global
    pending state before and after); a waiting exclusive holder blocks new shared ones."""

    def __init__(self):
        self.c = threading.Condition()
        self.readers = 0
        self.writer = False
        self.waiting = 0

    def acquire(self, exclusive, timeout):
        """False when not acquired within `timeout` (another holder is stuck: its own bound reports it)."""
        end = _now() + timeout
        with self.c:
            if exclusive:
                self.waiting += 1
                try:
                    while self.writer or self.readers:
                        left = end - _now()
                        if left <= 0:
                            return False
                        self.c.wait(left)
                    self.writer = True
                    return True
                finally:
                    self.waiting -= 1
                    self.c.notify_all()  # shared holders held back by this waiter may go on
            while self.writer or self.waiting:
                left = end - _now()
                if left <= 0:
                    return False
                self.c.wait(left)
            self.readers += 1
            return True

    def release(self, exclusive):
        with self.c:
            if exclusive:
                self.writer = False
            else:
                self.readers -= 1
            self.c.notify_all()


# ================================================================================================ stress
class _StressError(Exception):
    """Raised inside scheduler contexts on purpose: must come out unchanged."""


class _Stress:
    ACTIVITIES = ("chain", "explicit", "bad_inputs", "raise_in_ctx", "sync", "gemm_mix", "hot_chain", "nested")
    WEIGHTS = (30, 18, 4, 6, 5, 10, 8, 6)

    def __init__(self, seconds, threads, seed, device, log, activities=None, register=True):
        import gpuos
        import gpuos_ext
        self.gpuos, self.gx = gpuos, gpuos_ext
        self.seconds, self.nthreads, self.seed, self.dev, self.log = seconds, threads, seed, device, log
        self.acts = tuple(a for a in self.ACTIVITIES if activities is None or a in activities)
        self.weights = tuple(w for a, w in zip(self.ACTIVITIES, self.WEIGHTS) if a in self.acts)
        self.register = register
        T_ = timeout_s()
        self.block_s = 2 * T_ + 10     # one blocking call (a runtime wait raises after T_; a flush may wait twice)
        self.activity_s = 3 * T_ + 30  # one whole activity
        self.compile_s = max(300.0, 3 * T_)
        self.lock = threading.Lock()
        self.rw = _RW()
        self.watch = Watch(log)
        self.stop = threading.Event()
        self.iters = {}
        self.expected = {}
        self.info = {}
        self.mismatches, self.errors, self.drift = [], [], []
        self.n_mismatch = self.n_error = self.n_drift = 0
        self.inj = {"registered": [], "switches": 0, "rows_checked": 0}
        self.pools = None
        self.injector_waiting = False

    # ---------------------------------------------------------------- bookkeeping
    def count(self, what, d=None):
        with self.lock:
            (self.iters if d is None else d)[what] = (self.iters if d is None else d).get(what, 0) + 1

    def mismatch(self, what, detail):
        with self.lock:
            self.n_mismatch += 1
            if len(self.mismatches) < 10:
                self.mismatches.append({"activity": what, "thread": threading.current_thread().name, **detail})
        self.log(f"MISMATCH in {what}: {json.dumps(detail, default=str)[:4000]}")

    def error(self, what, e, tb=None):
        with self.lock:
            self.n_error += 1
            if len(self.errors) < 10:
                self.errors.append({"activity": what, "thread": threading.current_thread().name,
                                    "error": f"{type(e).__name__}: {str(e)[:800]}",
                                    "traceback": (tb or traceback.format_exc())[-3000:]})
        self.log(f"ERROR in {what}: {type(e).__name__}: {str(e)[:800]}")

    def close(self, what, got, exp, rtol=0.0, atol=0.0):
        """Compare (a host sync); a difference is a mismatch with the first bad element."""
        with self.watch.call(f"{what}: compare (host read)", self.block_s):
            if got.shape != exp.shape or got.dtype != exp.dtype:
                self.mismatch(what, {"why": f"gpuos {_meta(got)} vs eager {_meta(exp)}"})
                return False
            ok = torch.isclose(got.double(), exp.double(), rtol=rtol, atol=atol, equal_nan=True).all()
            if bool(ok):
                return True
        d = _first_bad(got, exp) if got.dtype.is_floating_point else {}
        self.mismatch(what, {"tensor": _meta(got), "rtol": rtol, "atol": atol,
                             **{k: v for k, v in d.items()}, "max_abs_diff": d.get("max_abs_diff")})
        return False

    def ctx_kw(self, tc, **kw):
        """A context's random settings (auto_flush_ms, sometimes front off or a small size_threshold)."""
        r = tc.rng
        kw.setdefault("auto_flush_ms", r.choice([0.0, 0.5, 2.0]))
        if r.random() < 0.15:
            kw.setdefault("front", False)
        if r.random() < 0.08:
            kw.setdefault("size_threshold", 1024)
        return kw

    def ctx(self, tc, **kw):
        return self.gpuos.scheduler_context(**self.ctx_kw(tc, **kw))

    def randn(self, tc, *shape, dtype=F32, scale=1.0):
        return (torch.randn(*shape, device=self.dev, generator=tc.g) * scale).to(dtype)

    # ---------------------------------------------------------------- activities
    def a_chain(self, tc):
        r = tc.rng
        cseed = r.randrange(1 << 30)
        crng = random.Random(cseed)  # rebuild_chain(cseed, pool_seed=seed, chain_len=(5, 25)) gives it back
        chain, env_e = tc.gen.build(crng, crng.randint(5, 25), seed=cseed)
        kw = {"auto_flush_ms": r.choice([0.0, 0.5, 2.0])}
        lv = make_leaves(chain, self.pools, "gpuos")
        try:
            with self.watch.call("chain: scheduler context (ops + exit flush)", self.block_s):
                with self.gpuos.scheduler_context(**kw):
                    env_g = run_chain(chain, self.pools, "gpuos", lv)
        except self.gpuos.GpuosError:
            raise
        except Exception as e:  # noqa: BLE001 -- eager ran this chain
            self.mismatch("chain raised under the scheduler", {"seed": cseed, "error": f"{type(e).__name__}: {e}",
                                                               "program": listing(chain, self.pools)})
            return
        cnt, meta_bad = quick_count(env_g, env_e)
        with self.watch.call("chain: compare (host read)", self.block_s):
            n = int(cnt) if cnt is not None else 0
        if n or meta_bad:
            verdict, info = diagnose(chain, env_g, env_e, self.pools, kw)
            if verdict == "mismatch":
                self.mismatch("chain", info)
            elif verdict == "drift":
                with self.lock:
                    self.n_drift += 1
                    if len(self.drift) < 3:
                        self.drift.append(info)

    def a_explicit(self, tc):
        r, gx, gp = tc.rng, self.gx, self.gpuos
        dt = r.choice(FLOATS)
        shape = r.choice([(4096,), (1000,), (64, 64), (33, 65), (7,)])
        a, b = self.randn(tc, *shape, dtype=dt), self.randn(tc, *shape, dtype=dt)
        if len(shape) == 2 and r.random() < 0.3:  # a transposed operand
            a = self.randn(tc, shape[1], shape[0], dtype=dt).t()
        out = torch.full(shape, math.nan, device=self.dev, dtype=dt)
        kind = r.choice(["add", "sub", "mul", "div", "many", "gelu", "bcast", "reduce", "softmax", "mid_bad"])
        tol = (0.0, 0.0)
        if kind == "add":
            gx.submit_add(a, b, out)
            exp = a + b
        elif kind == "sub":
            gx.submit_sub(a, b, out)
            exp = a - b
        elif kind == "mul":
            gx.submit_mul(a, b, out)
            exp = a * b
        elif kind == "div":
            b = b.abs() + 0.5
            gx.submit_div(a, b, out)
            exp = a / b
        elif kind == "many":
            outs = [torch.full(shape, math.nan, device=self.dev, dtype=dt) for _ in range(3)]
            bs = [self.randn(tc, *shape, dtype=dt) for _ in range(3)]
            gx.submit_many("mul", [a] * 3, bs, outs)
            exp = torch.stack([a * x for x in bs])
        elif kind == "gelu":
            gp.submit("gelu", [a], out)
            exp = F.gelu(a.float()).to(dt)
            tol = {F32: (1e-4, 1e-5), F16: (2e-3, 1e-3), BF16: (1.6e-2, 1e-2)}[dt]
        elif kind == "bcast":
            row = self.randn(tc, shape[-1], dtype=dt)
            gp.submit("add", [a, row], out, alpha=0.5)
            exp = torch.add(a.float(), row.float(), alpha=0.5).to(dt)
            tol = {F32: (1e-6, 1e-6), F16: (1e-3, 1e-3), BF16: (1e-2, 1e-2)}[dt]
        elif kind in ("reduce", "softmax"):
            x = self.randn(tc, 16, 256, dtype=dt)
            if kind == "reduce":
                out = torch.full((16,), math.nan, device=self.dev, dtype=dt)
                gp.submit_reduce("sum", x, out)
                exp = x.float().sum(-1).to(dt)
                tol = {F32: (1e-5, 1e-4), F16: (2e-3, 2e-2), BF16: (1.6e-2, 1e-1)}[dt]
            else:
                out = torch.full((16, 256), math.nan, device=self.dev, dtype=dt)
                gp.submit_reduce("softmax", x, out)
                exp = torch.softmax(x.float(), -1).to(dt)
                tol = {F32: (1e-5, 1e-6), F16: (2e-3, 1e-4), BF16: (1.6e-2, 1e-3)}[dt]
        else:  # mid_bad: a rejected call between two good ones records nothing of its own
            gx.submit_add(a, b, out)
            try:
                gx.submit_add(a, b[..., :1] if b.dim() else b, torch.empty_like(out))
                if shape[-1] != 1:
                    self.mismatch("explicit mid_bad", {"why": "a shape-mismatched submit_add raised nothing"})
            except ValueError:
                self.count("explicit mid_bad ValueError", self.expected)
            out2 = torch.full(shape, math.nan, device=self.dev, dtype=dt)
            gx.submit_mul(a, b, out2)
            with self.watch.call("explicit: flush(sync=True)", self.block_s):
                gx.flush(sync=True)
            self.close("explicit mid_bad (mul after the rejected call)", out2, a * b)
            exp = a + b
            kind = "mid_bad"
        if kind != "mid_bad":
            if r.random() < 0.3:  # stream-ordered flush, then a stream sync
                with self.watch.call("explicit: flush() + stream sync", self.block_s):
                    gx.flush()
                    torch.cuda.current_stream().synchronize()
            else:
                with self.watch.call("explicit: flush(sync=True)", self.block_s):
                    gx.flush(sync=True)
        if kind == "many":
            out = torch.stack(outs)  # after the flush: stack reads the outputs
        self.close(f"explicit {kind} {dt}", out, exp, *tol)

    def a_bad_inputs(self, tc):
        """Rejected calls: each raises its typed error and leaves the global pending state unchanged (this
        activity runs alone: no other thread records meanwhile)."""
        gx = self.gx
        x = torch.randn(16, device=self.dev)
        cases = [
            ("cpu tensor", TypeError, lambda: gx.submit_add(torch.ones(4), torch.ones(4), torch.empty(4))),
            ("shape mismatch", ValueError,
             lambda: gx.submit_add(torch.randn(16, device=self.dev), torch.randn(8, device=self.dev),
                                   torch.empty(16, device=self.dev))),
            ("int64", TypeError,
             lambda: gx.submit_add(torch.arange(8, device=self.dev), torch.arange(8, device=self.dev),
                                   torch.empty(8, device=self.dev, dtype=torch.int64))),
            ("partial overlap", ValueError, lambda: gx.submit_add(x[0:8], x[0:8], x[4:12])),
            ("submit_mul cpu out", (TypeError, ValueError), lambda: gx.submit_mul(x, x, torch.empty(16))),
        ]
        tc.rng.shuffle(cases)

        def state():
            s = gx.stats()
            return (gx.pending(), gx.sched_stats()["deferred"], s["submitted"], s["subops"])
        before = state()
        for name, exc, call in cases[:tc.rng.randint(1, len(cases))]:
            want = exc.__name__ if isinstance(exc, type) else "/".join(x.__name__ for x in exc)
            try:
                call()
            except exc as e:
                self.count(f"bad input: {name} -> {type(e).__name__}", self.expected)
                continue
            except Exception as e:  # noqa: BLE001
                self.mismatch("bad_inputs", {"case": name, "why": f"expected {want}, got "
                                             f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            self.mismatch("bad_inputs", {"case": name, "why": f"no {want} raised"})
        after = state()
        if after != before:
            self.mismatch("bad_inputs", {"why": "rejected calls changed (pending, deferred, submitted, subops)",
                                         "before": before, "after": after})
        if before[0] or before[1]:
            self.count("work pending while every other activity was paused", self.info)
        # a bad op inside a scheduler context: torch's own error, and the context goes on
        a = self.randn(tc, 64)
        try:
            with self.ctx(tc):
                y = a * 2
                try:
                    torch.add(a, torch.ones(64))  # CUDA + CPU: eager raises (after the deferred work it depends on)
                    self.mismatch("bad_inputs", {"why": "cuda + cpu tensor add raised nothing"})
                except RuntimeError:
                    self.count("bad input in context -> RuntimeError", self.expected)
                z = y + 1
        except Exception as e:  # noqa: BLE001
            self.error("bad_inputs (in context)", e)
            return
        self.close("bad op inside a context", z, a * 2 + 1)

    def a_raise_in_ctx(self, tc):
        r = tc.rng
        x = self.randn(tc, r.choice([4096, 1000, 64]))
        err = _StressError(r.randrange(1 << 30))
        variant = r.choice(["plain", "after_fallback", "nested_inner"])
        y = None
        try:
            with self.watch.call("raise_in_ctx: context exit", self.block_s):
                if variant == "nested_inner":
                    with self.ctx(tc):
                        y = x * 2 + 1
                        try:
                            with self.ctx(tc):
                                y2 = torch.tanh(y)
                                raise err
                        except _StressError as e:
                            if e is not err:
                                self.mismatch("raise_in_ctx", {"why": "inner exception replaced", "got": repr(e)})
                        y = y2 * 0.5
                        raise err
                with self.ctx(tc):
                    y = x * 2 + 1
                    if variant == "after_fallback":
                        y = torch.cumsum(y, 0) * 0.5  # an eager op on deferred work, then a recorded one
                    raise err
        except _StressError as e:
            if e is not err or e.args != err.args:
                self.mismatch("raise_in_ctx", {"why": "exception changed on its way out", "got": repr(e)})
        except Exception as e:  # noqa: BLE001
            self.mismatch("raise_in_ctx", {"why": f"{type(e).__name__} instead of the raised _StressError",
                                           "error": str(e)[:500]})
            return
        else:
            self.mismatch("raise_in_ctx", {"why": "the exception did not propagate"})
            return
        if variant == "nested_inner":
            exp = torch.tanh(x * 2 + 1) * 0.5
        elif variant == "after_fallback":
            exp = torch.cumsum(x * 2 + 1, 0) * 0.5
        else:
            exp = x * 2 + 1
        self.close(f"raise_in_ctx {variant}: result of the ops before the raise", y, exp, 1e-5, 1e-5)

    def a_sync(self, tc):
        r = tc.rng
        k = r.choice(["synchronize", "empty_cache", "in_ctx_sync", "in_ctx_empty_cache", "stream_sync"])
        if k == "synchronize":
            with self.watch.call("torch.cuda.synchronize()", self.block_s):
                torch.cuda.synchronize()
        elif k == "empty_cache":
            with self.watch.call("torch.cuda.empty_cache()", self.block_s):
                torch.cuda.empty_cache()
        elif k == "stream_sync":
            with self.watch.call("current_stream().synchronize()", self.block_s):
                torch.cuda.current_stream().synchronize()
        else:
            x = self.randn(tc, 4096)
            with self.watch.call(f"{k}: context", self.block_s):
                with self.ctx(tc):
                    y = x * 3
                    if k == "in_ctx_sync":
                        torch.cuda.synchronize()
                    else:
                        torch.cuda.empty_cache()
                    z = torch.sigmoid(y) + 1
            self.close(k, z, torch.sigmoid(x * 3) + 1, 1e-5, 1e-6)
        self.count(k, self.info)

    def a_gemm_mix(self, tc):
        A, B, C, bias = tc.gemm
        with self.watch.call("gemm_mix: context", self.block_s):
            with self.ctx(tc):
                h = A @ B                         # heavy: the worker yields
                s = h[:32] * 0.5 + bias           # recorded (16,384 elements)
                m = s @ C                         # eager, depends on deferred s: a dependency flush
                t = torch.sigmoid(m) * 2 - 1      # recorded
                u = torch.cumsum(t, -1)           # foreign kernel on deferred work
                v = torch.softmax(u, -1)          # recorded reduction
                w = F.layer_norm(s, (s.shape[-1],))  # foreign, on deferred s
                srt = torch.sort(t, -1).values    # foreign
                o = (w[:, :64] * v[:, :1]).sum(-1)  # recorded
        h_e = A @ B
        s_e = h_e[:32] * 0.5 + bias
        m_e = s_e @ C
        t_e = torch.sigmoid(m_e) * 2 - 1
        u_e = torch.cumsum(t_e, -1)
        v_e = torch.softmax(u_e, -1)
        w_e = F.layer_norm(s_e, (s_e.shape[-1],))
        o_e = (w_e[:, :64] * v_e[:, :1]).sum(-1)
        for name, g, e in (("s", s, s_e), ("t", t, t_e), ("v", v, v_e), ("w", w, w_e),
                           ("sort", srt, torch.sort(t_e, -1).values), ("o", o, o_e)):
            if not self.close(f"gemm_mix {name}", g, e, 1e-3, 1e-4):
                break

    def a_hot_chain(self, tc):
        a, exp = tc.hot
        k = tc.rng.randint(10, 80)
        keep = tc.rng.randrange(k)
        kept = None
        with self.watch.call("hot_chain: context", self.block_s):
            with self.ctx(tc):
                for i in range(k):
                    b = torch.tanh(a) * 0.5 + a
                    if i == keep:
                        kept = b
        self.close("hot_chain (last)", b, exp, 1e-5, 1e-5)
        self.close("hot_chain (kept)", kept, exp, 1e-5, 1e-5)

    def a_nested(self, tc):
        r = tc.rng
        x = self.randn(tc, 32, 128)
        kw_outer = self.ctx_kw(tc)
        s = self.gpuos.scheduler_context(**kw_outer)
        kw_inner = None if r.random() < 0.5 else self.ctx_kw(tc)  # the same instance re-entered, or another
        with self.watch.call("nested: contexts", self.block_s):
            with s:
                y = x * 2
                with (s if kw_inner is None else self.gpuos.scheduler_context(**kw_inner)):
                    z = y + 1
                self.gpuos.flush()          # explicit flush inside a context
                v = z.sum(-1)[0].item()     # host read of deferred work
                w = z * y
        # y and z after the exit as well: wrong there means their batch was lost or ran late; right there with v or
        # w wrong means a reader inside did not wait for the batch that wrote them.
        ok = [self.close(what, t, e, 1e-6, 1e-6)
              for what, t, e in (("nested w", w, (x * 2 + 1) * (x * 2)), ("nested y", y, x * 2), ("nested z", z, x * 2 + 1))]
        ev = float((x * 2 + 1).sum(-1)[0])
        if not math.isclose(v, ev, rel_tol=1e-4, abs_tol=1e-3) or not all(ok):
            self.mismatch("nested item", {"got": v, "eager": ev, "w_y_z_ok": ok, "outer": kw_outer,
                                          "inner": "same" if kw_inner is None else kw_inner})

    # ---------------------------------------------------------------- injection (thread 0)
    def inj_register(self, tc, which):
        gp = self.gpuos
        name = f"stress_{which}_{os.getpid()}_{self.seed}"
        try:
            with self.watch.call(f"register {name} (quick check; compile in the background)", self.block_s):
                with gp.batch_install(wait=False):
                    if which == "sw":
                        gp.register_elementwise(name, "a + b", arity=2)
                        gp.install(name, "a - b", slot=1)
                    else:
                        gp.register_elementwise(name, "a * 0.5f + 1.0f", arity=1)
        except Exception as e:  # noqa: BLE001
            self.error(f"register {which}", e)
            return
        self.inj["registered"].append({"name": name, "kind": which, "t": round(_now() - self.t0, 1)})
        tc.inj_pending.append((name, which, _now()))

    def inj_poll(self, tc):
        """Pending registrations: ready -> usable; past the compile bound -> a hang."""
        if not tc.inj_pending:
            return
        ops = {o["name"]: o for o in self.gpuos.user_ops()}
        for item in list(tc.inj_pending):
            name, which, t0 = item
            st = ops.get(name, {}).get("state")
            if st == "ready":
                tc.inj_pending.remove(item)
                tc.inj_ready[which] = name
                self.inj.setdefault("ready", {})[name] = round(_now() - t0, 1)
            elif st == "failed":
                tc.inj_pending.remove(item)
                self.error(f"register {name}", RuntimeError(ops[name].get("error", "failed")))
            elif _now() - t0 > self.compile_s:
                tc.inj_pending.remove(item)
                with self.watch.lock:
                    self.watch._flag([[f"generation compile of {name}", t0, self.compile_s, False, "gen"]],
                                     _now() - t0, finished=False)

    def a_inj(self, tc):
        """The switched op: rows of one sub-op each, a switch between two of them; after the flush every row is
        wholly old (a + b) or new (a - b), and rows recorded after switch() returned are new."""
        gp, gx, r = self.gpuos, self.gx, tc.rng
        name = tc.inj_ready.get("sw")
        if name is not None:
            rows = r.choice([8, 32, 64])
            a = self.randn(tc, rows, 256)
            b = torch.rand(rows, 256, device=self.dev, generator=tc.g) + 0.5
            out = torch.full((rows, 256), math.nan, device=self.dev)
            cur = tc.inj_slot
            at = r.randrange(rows)
            for i in range(rows):
                if i == at:
                    with self.watch.call("switch() / rollback()", self.block_s):
                        if cur == 1 and r.random() < 0.4:
                            now = gp.rollback(name)  # returns the slot now active
                            if now != 0:
                                self.mismatch("inj", {"why": f"rollback() made slot {now} active, expected 0"})
                        else:
                            prev = gp.switch(name, 1 - cur)  # returns the previous slot
                            if prev != cur:
                                self.mismatch("inj", {"why": f"switch() returned {prev}, the active slot was {cur}"})
                    cur = 1 - cur
                    tc.inj_slot = cur
                    self.inj["switches"] += 1
                gp.submit(name, [a[i], b[i]], out[i])
            with self.watch.call("inj: flush(sync=True)", self.block_s):
                gx.flush(sync=True)
            old, new = (a + b, a - b) if cur == 1 else (a - b, a + b)  # new = the slot active after the switch
            is_old = (out == old).all(1)
            is_new = (out == new).all(1)
            bad = ~(is_old | is_new)
            late_old = ~is_new[at:]
            if bool(bad.any()) or bool(late_old.any()):
                i = int(bad.nonzero()[0]) if bool(bad.any()) else at + int(late_old.nonzero()[0])
                self.mismatch("inj switch", {"row": i, "switched_before_row": at, "active_slot_after": cur,
                                             "nan": int(out[i].isnan().sum()),
                                             "old_elems": int((out[i] == old[i]).sum()),
                                             "new_elems": int((out[i] == new[i]).sum()), "of": 256})
            self.inj["rows_checked"] += rows
        name = tc.inj_ready.get("f")
        if name is not None:
            dt = r.choice(FLOATS)
            x = self.randn(tc, 1000, dtype=dt)
            o = torch.full((1000,), math.nan, device=self.dev, dtype=dt)
            gp.submit(name, [x], o)
            with self.watch.call("inj f: flush(sync=True)", self.block_s):
                gx.flush(sync=True)
            self.close(f"injected {name} {dt}", o, (x.float() * 0.5 + 1.0).to(dt), 1e-3 if dt != F32 else 0.0, 0.0)

    # ---------------------------------------------------------------- threads
    def thread_main(self, i):
        tc = _TC()
        tc.rng = random.Random(self.seed * 7919 + i)
        tc.g = torch.Generator(device=self.dev)
        tc.g.manual_seed(self.seed * 7919 + i)
        tc.gen = ChainGen(self.pools)
        tc.inj_pending, tc.inj_ready, tc.inj_slot = [], {}, 0
        if self.device_index is not None:
            torch.cuda.set_device(self.device_index)
        with torch.no_grad():
            A = self.randn(tc, 512, 512, scale=512 ** -0.25)
            B = self.randn(tc, 512, 512, scale=512 ** -0.25)
            C = self.randn(tc, 512, 64, scale=512 ** -0.5)
            tc.gemm = (A, B, C, self.randn(tc, 512))
            a = self.randn(tc, 4096)
            tc.hot = (a, torch.tanh(a) * 0.5 + a)
            injector = i == 0 and self.register
            second_at = self.t0 + self.seconds / 2 if self.seconds >= 40 else None
            if injector:
                self.inj_register(tc, "sw")
            end = self.t0 + self.seconds
            while _now() < end and not self.stop.is_set():
                if injector:
                    self.inj_poll(tc)
                    if second_at is not None and _now() >= second_at:
                        second_at = None
                        self.inj_register(tc, "f")
                acts, ws = self.acts, self.weights
                if injector and tc.inj_ready:
                    acts, ws = acts + ("inj",), ws + (15,)
                act = tc.rng.choices(acts, ws)[0]
                exclusive = act == "bad_inputs"
                if not self.rw.acquire(exclusive, self.activity_s):
                    self.error(act, TimeoutError(f"could not start {act} within {self.activity_s:.0f} s "
                                                 f"(another activity holds the lock)"), tb="")
                    continue
                try:
                    with self.watch.call(f"activity {act}", self.activity_s):
                        getattr(self, "a_" + act)(tc)
                    self.count(act)
                except Exception as e:  # noqa: BLE001 -- an error that is not an expected typed one
                    self.error(act, e)
                    if isinstance(e, self.gpuos.GpuosError):
                        self.stop.set()  # the runtime failed: the final checks tell whether it recovers
                finally:
                    self.rw.release(exclusive)
            if injector:  # registrations still compiling: wait (bounded) so the result says if they ever finish
                self.injector_waiting = bool(tc.inj_pending)
                while tc.inj_pending and not self.stop.is_set():
                    self.inj_poll(tc)
                    time.sleep(0.2)
                self.injector_waiting = False

    def run(self):
        gx = self.gx
        gpu = self.dev != "cpu"  # cpu: a dry run of the machinery (scheduler contexts fall back to eager)
        self.device_index = torch.cuda.current_device() if gpu else None
        if gpu:
            ok, v = bounded("init()", gx.init, 300.0, self.watch)
            if not ok:
                return {"ok": False, "error": f"init() failed: {v}"}
        self.pools = Pools(self.dev, self.seed)
        errors = []
        orig_hook = threading.excepthook

        def hook(args):
            errors.append({"thread": args.thread.name if args.thread else "?", "type": args.exc_type.__name__,
                           "msg": str(args.exc_value)[:800]})
            orig_hook(args)
        threading.excepthook = hook
        self.watch.start()
        self.t0 = _now()
        threads = [threading.Thread(target=self.thread_main, args=(i,), name=f"stress-{i}", daemon=True)
                   for i in range(self.nthreads)]
        for t in threads:
            t.start()
        # wait for the threads: their last activity may take up to its bound, the injector may wait for a
        # generation compile; a thread stuck in a call flagged as a hang is not waited for beyond that
        end = self.t0 + self.seconds + self.activity_s
        end_inj = end + self.compile_s
        while True:
            alive = [t for t in threads if t.is_alive()]
            if not alive:
                break
            if self.watch.hangs:
                self.stop.set()
                hung = {h["thread"] for h in self.watch.hangs if not h["finished"]}
                if all(t.name in hung for t in alive):
                    break
            now = _now()
            if now > end_inj or (now > end and not (threads[0].is_alive() and self.injector_waiting)):
                break
            time.sleep(0.1)
        stuck = [t.name for t in threads if t.is_alive()]
        elapsed = _now() - self.t0
        if stuck:
            self.stop.set()
            self.log(f"threads still running after the run: {stuck}; active calls: {self.watch.active()}")
            self.watch.scan()
        self.watch.stop()
        timers = [t.name for t in threading.enumerate() if t.name == "gpuos-flush-timer"]
        final = self.final_checks() if gpu else {"ok": True, "skipped": "cpu dry run"}
        threading.excepthook = orig_hook
        res = {
            "seconds": round(elapsed, 1), "threads": self.nthreads, "seed": self.seed,
            "iterations": dict(sorted(self.iters.items())), "total_iterations": sum(self.iters.values()),
            "expected_errors": dict(sorted(self.expected.items())), "info": self.info,
            "mismatches": self.n_mismatch, "mismatch_details": self.mismatches,
            "drift_chains": self.n_drift, "drift_details": self.drift,
            "hangs": len(self.watch.hangs), "hang_details": self.watch.hangs[:20],
            "errors": self.n_error + len(errors), "error_details": self.errors, "thread_errors": errors,
            "stuck_threads": stuck, "timer_threads_left": timers, "injection": self.inj, "final": final,
            "bounds_s": {"call": self.block_s, "activity": self.activity_s, "compile": self.compile_s,
                         "gpuos_timeout_s": timeout_s()},
        }
        res["ok"] = (not res["mismatches"] and not res["hangs"] and not res["errors"] and not stuck
                     and not timers and final.get("ok", False))
        return res

    def final_checks(self):
        gx, gp = self.gx, self.gpuos
        out = {}
        n = 4096
        x = torch.randn(n, device=self.dev)
        y = torch.randn(n, device=self.dev)

        def add_check():
            o = torch.full((n,), math.nan, device=self.dev)
            gx.submit_add(x, y, o)
            gx.flush(sync=True)
            return bool(torch.equal(o, x + y))

        def sched_check():
            with gp.scheduler_context(auto_flush_ms=0):
                z = torch.tanh(x) * 0.5 + y
            torch.cuda.synchronize()
            return bool(torch.allclose(z, torch.tanh(x) * 0.5 + y, rtol=1e-5, atol=1e-5))

        def shutdown():
            gx.shutdown()
            return not gx.is_initialized()
        ok, v = bounded("stats()", lambda: dict(gp.stats()), 20.0, self.watch)
        out["stats_at_end"] = v if ok else f"stats() failed: {v}"
        steps = [("submit_add + flush(sync=True)", add_check, self.block_s),
                 ("scheduler context", sched_check, self.block_s),
                 ("shutdown()", shutdown, self.block_s),
                 ("init() again", lambda: gx.init() or gx.is_initialized(), 300.0),
                 ("submit_add after re-init", add_check, self.block_s),
                 ("final shutdown()", shutdown, self.block_s)]
        all_ok = True
        for what, fn, bound in steps:
            t0 = _now()
            ok, v = bounded(what, fn, bound, self.watch)
            out[what] = {"ok": ok and v is True, "seconds": round(_now() - t0, 2),
                         **({} if ok and v is True else {"detail": v})}
            if not (ok and v is True):
                all_ok = False
                self.log(f"FINAL CHECK FAILED: {what}: {v}")
                if not ok:
                    break
        out["ok"] = all_ok
        return out


class _TC:
    """Per-thread state of the stress."""


def stress(seconds=60.0, threads=6, seed=0, device="cuda", activities=None, register=True, log=print):
    """Threads mixing every kind of call for `seconds` (see the module docstring and _Stress). Returns counts of
    iterations per activity, mismatches (first ones in detail), hangs (calls past their bound), errors that were
    not the expected typed ones, and the final checks (runtime usable, shutdown, init again)."""
    return _Stress(seconds, threads, seed, device, log, activities, register).run()
