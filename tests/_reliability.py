"""Reliability engine (not a test module): the soak, the stress and the flush-drift measurement, shared by
tests/test_gpu_stress.py and tools/reliability_run.py.

* ``soak(n_ops, seed)``: random op chains (10-50 ops each) over the op table's aten overloads -- functional,
  Tensor-Scalar, in-place and ``out=`` forms, broadcasts, transposed / stepped / sliced / expanded inputs, 0-d and
  numel-0 tensors, fp32 / fp16 / bf16 and int32, last-dim reductions, plus foreign ops (where, casts, cumsum,
  matmul, views, host reads) that make the scheduler flush for dependencies. Each chain is generated and run
  eagerly first (an op eager rejects is dropped), then replayed under ``gpuos.scheduler_context(auto_flush_ms=0)``
  on the same inputs; every live tensor at the end is compared. Values are kept well conditioned by construction
  (interval bounds per tensor; domain guards -- themselves ops -- before log / sqrt / div / pow / exp; magnitudes
  <= 64), so ulp-level differences cannot grow into false mismatches. A chain outside the quick tolerance is
  replayed in float64: it counts as a mismatch only if gpuos is more than 4x further from the float64 answer than
  eager is (else it is "drift", reported separately), or if NaN/inf patterns, shapes or dtypes differ, or if the
  replay raised where eager did not.
* ``stress(seconds, threads, seed)``: threads mixing scheduler contexts, explicit submits and flushes, rejected
  calls, exceptions inside contexts, synchronize / empty_cache, GEMMs and other foreign kernels, hot chains
  (tier-2 code), an injected op with switch / rollback; every blocking call has a bound and a monitor thread
  records a hang as soon as one is exceeded; at the end the runtime must still work, shut down and init again.
* ``flush_drift(n_flushes)``: host RSS and ``torch.cuda.memory_allocated()`` across many flushes after a warm-up.

Each also runs in a child process: ``python tests/_reliability.py {soak,stress,drift} ...`` prints progress and one
``GPUOS_RESULT {json}`` line (``run_child`` runs it and parses that line), so a wedge becomes a failed child, never
a hung caller. Importable without a GPU.

The parts, each importing only those before it: ``_rel_ops`` (constants, value intervals, the op catalog),
``_rel_chains`` (input pools, leaves, the chain generator), ``_rel_check`` (gpuos vs eager verdicts, the soak),
``_rel_stress`` (hang bounds, the stress); this module adds the drift and the child-process entry.
"""
from __future__ import annotations

import faulthandler
import gc
import json
import os
import sys
import traceback

import torch
from _rel_ops import _now
from _rel_chains import Pools, ChainGen, make_leaves, run_chain  # noqa: F401  (re-exported: tools, a REPL)
from _rel_check import listing, rebuild_chain, soak  # noqa: F401  (re-exported)
from _rel_stress import _Stress, stress  # noqa: F401  (_Stress.ACTIVITIES: tests/test_gpu_stress.py)

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
RESULT_TAG = "GPUOS_RESULT "


# ================================================================================================ flush drift
def _rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak, the best fallback


RSS_BOUND = 16 << 20
ALLOC_BOUND = 1 << 20


def flush_drift(n_flushes=100_000, warmup=None, device="cuda", checkpoints=10, log=print):
    """Host RSS and torch.cuda.memory_allocated() across n_flushes flushes after a warm-up: explicit submit_add /
    submit('gelu') / submit_reduce each followed by flush(), every 10th a scheduler context around a fused chain
    (its exit flushes), every 1000th flush(sync=True). Measured after a full sync and gc.collect() at the same
    point of the cycle. Bounds: RSS_BOUND (16 MiB), ALLOC_BOUND (1 MiB) -- see tests/test_gpu_stress.py."""
    import gpuos
    import gpuos_ext as gx
    gx.init()
    n = 4096
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    o1, o2 = torch.empty_like(x), torch.empty_like(x)
    r_in = torch.randn(16, 256, device=device)
    r_out = torch.empty(16, device=device)
    ctx = gpuos.scheduler_context(auto_flush_ms=0)
    holder = [None]
    exp_z = torch.tanh(x) * 0.5 + y

    def one(i):
        k = i % 10
        if k == 9:
            with ctx:
                holder[0] = torch.tanh(x) * 0.5 + y
        elif k % 3 == 0:
            gx.submit_add(x, y, o1)
            gx.flush()
        elif k % 3 == 1:
            gpuos.submit("gelu", [x], o2)
            gx.flush()
        else:
            gpuos.submit_reduce("sum", r_in, r_out)
            gx.flush()
        if i % 1000 == 999:
            gx.flush(sync=True)

    def settle():
        holder[0] = None
        gx.flush(sync=True)
        torch.cuda.synchronize()
        gc.collect()
        return _rss_bytes(), torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    warm = warmup if warmup is not None else max(2000, n_flushes // 10)
    warm -= warm % 10
    t0 = _now()
    for i in range(warm):
        one(i)
    # The hot fused chain gets tier-2 code: a generation compiled by NVRTC in a background thread, which takes
    # ~110 MiB of RSS once (measured on the CPU: 221 -> 333 MiB over one compile of the worker). Measured from
    # after it: the 100,000-flush run at 4729f21 (H100) saw that step land 40,000-60,000 flushes into the window.
    gx.wait_generations()
    for i in range(warm, warm + 100):
        one(i)
    warm += 100
    rss0, al0, rs0 = settle()
    f0 = gx.stats()["flushes"]
    gens0 = len(gx.generation_info()["generations"])
    every = max(10, (n_flushes // max(checkpoints, 1)) // 10 * 10)
    series = []
    t1 = _now()
    for i in range(n_flushes):
        one(warm + i)
        if (i + 1) % every == 0 and i + 1 < n_flushes:
            rss, al, _ = settle()
            series.append({"flushes": i + 1, "rss_drift": rss - rss0, "alloc_drift": al - al0})
            log(f"drift: {i + 1:,} flushes, rss {(rss - rss0) / 1024:+.0f} KiB, allocated {al - al0:+d} B")
    loop_s = _now() - t1
    rss1, al1, rs1 = settle()
    runtime_flushes = gx.stats()["flushes"] - f0
    gens_during = len(gx.generation_info()["generations"]) - gens0
    correct = bool(torch.equal(o1, x + y)) and bool(torch.allclose(r_out, r_in.sum(-1), rtol=1e-5, atol=1e-4))
    with ctx:
        z = torch.tanh(x) * 0.5 + y
    correct = correct and bool(torch.allclose(z, exp_z, rtol=1e-5, atol=1e-5))
    res = {"flushes": n_flushes, "warmup_flushes": warm, "runtime_flushes": runtime_flushes,
           "rss_before": rss0, "rss_after": rss1, "rss_drift_bytes": rss1 - rss0,
           "alloc_before": al0, "alloc_after": al1, "alloc_drift_bytes": al1 - al0,
           "reserved_drift_bytes": rs1 - rs0,
           "max_rss_drift_bytes": max([s["rss_drift"] for s in series] + [rss1 - rss0]),
           "max_alloc_drift_bytes": max([abs(s["alloc_drift"]) for s in series] + [abs(al1 - al0)]),
           "series": series, "rss_bound_bytes": RSS_BOUND, "alloc_bound_bytes": ALLOC_BOUND,
           "results_correct": correct, "seconds": round(_now() - t0, 2), "generations_during": gens_during,
           "us_per_flush": round(1e6 * loop_s / max(n_flushes, 1), 2)}
    res["ok"] = correct and res["rss_drift_bytes"] < RSS_BOUND and abs(res["alloc_drift_bytes"]) <= ALLOC_BOUND
    return res


# ================================================================================================ child process
def _emit_result(res):
    sys.stdout.write(RESULT_TAG + json.dumps(res, default=str) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()


def main(argv=None):
    """python tests/_reliability.py {soak,stress,drift} [options]: run one part, print GPUOS_RESULT {json}."""
    import argparse
    p = argparse.ArgumentParser(prog="_reliability.py", description=main.__doc__)
    p.add_argument("kind", choices=["soak", "stress", "drift"])
    p.add_argument("--ops", type=int, default=1_000_000, help="soak: ops to run")
    p.add_argument("--max-seconds", type=float, default=None, help="soak: stop after this long (truncated)")
    p.add_argument("--inject-fault", type=int, default=0, help="soak self-test: corrupt every N-th chain")
    p.add_argument("--seconds", type=float, default=60.0, help="stress: duration")
    p.add_argument("--threads", type=int, default=6, help="stress: threads")
    p.add_argument("--no-register", action="store_true", help="stress: no injected op (no NVRTC compile)")
    p.add_argument("--activities", default=None,
                   help="stress: only these activities, comma-separated (_Stress.ACTIVITIES; default: all)")
    p.add_argument("--flushes", type=int, default=100_000, help="drift: flushes measured")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--hard-limit-s", type=float, default=None,
                   help="faulthandler exit (every thread's stack) after this long: the last resort")
    a = p.parse_args(argv)
    if a.hard_limit_s:
        faulthandler.dump_traceback_later(a.hard_limit_s, exit=True)
        import gpuos_ext   # the native side's state just before: each runtime's control words, each thread's wait
        gpuos_ext._testing.watchdog(max(1.0, a.hard_limit_s - 2))

    def log(msg):
        print(msg, flush=True)
    t0 = _now()
    try:
        if a.kind == "soak":
            res = soak(a.ops, seed=a.seed, device=a.device, max_seconds=a.max_seconds,
                       inject_fault=a.inject_fault, log=log)
        elif a.kind == "stress":
            acts = None if a.activities is None else tuple(x for x in a.activities.split(",") if x)
            unknown = sorted(set(acts or ()) - set(_Stress.ACTIVITIES))
            if unknown:
                raise ValueError(f"--activities: unknown {unknown}; the activities are {list(_Stress.ACTIVITIES)}")
            res = stress(a.seconds, a.threads, a.seed, a.device, activities=acts, register=not a.no_register,
                         log=log)
            res["modes"] = _scheduler_modes()
        else:
            res = flush_drift(a.flushes, device=a.device, log=log)
    except BaseException as e:  # noqa: BLE001 -- reported in the result
        res = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:2000]}", "traceback": traceback.format_exc()}
    res["kind"] = a.kind
    res["wall_s"] = round(_now() - t0, 2)
    try:
        import gpuos_ext
        res["gpuos_version"] = gpuos_ext.__version__
    except Exception:  # noqa: BLE001
        pass
    if a.device != "cpu" and torch.cuda.is_available():
        res["device_name"] = torch.cuda.get_device_name()
    _emit_result(res)
    os._exit(0)  # no atexit work on a possibly wedged runtime; daemon threads may be stuck


def _scheduler_modes():
    """The live scheduler's ways this process ran with (a stress failure names them: the A/B switches)."""
    import gpuos_ext
    return {"timer_off_gil": bool(gpuos_ext.sched_timer_off_gil()),
            "GPUOS_LIVE_IDLE_US": os.environ.get("GPUOS_LIVE_IDLE_US")}


def run_child(kind, args=(), timeout=600.0, timeout_s_env=None, env_extra=None):
    """Run ``main([kind, *args])`` in a fresh interpreter (tests/_helpers.run_python: repo importable, GPUOS_*
    settings stripped except those given; GPUOS_CACHE_DIR passed on). Returns a dict: result (the parsed
    GPUOS_RESULT, or None), rc, stdout, stderr, timed_out."""
    import subprocess
    if TESTS_DIR not in sys.path:
        sys.path.insert(0, TESTS_DIR)
    from _helpers import run_python
    env = dict(env_extra or {})
    if timeout_s_env is not None:
        env["GPUOS_TIMEOUT_S"] = str(timeout_s_env)
    if os.environ.get("GPUOS_CACHE_DIR") and "GPUOS_CACHE_DIR" not in env:
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    code = (f"import sys; sys.path.insert(0, {TESTS_DIR!r}); import _reliability; "
            f"_reliability.main({[kind] + [str(x) for x in args]!r})")
    out = {"result": None, "rc": None, "stdout": "", "stderr": "", "timed_out": False}
    try:
        proc = run_python(code, env_extra=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        out.update(timed_out=True, stdout=text(e.stdout), stderr=text(e.stderr))
        return out
    out.update(rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            out["result"] = json.loads(line[len(RESULT_TAG):])
    return out


def describe_child(c, tail=12000):
    """The child's output for an assertion message (the tail of each stream)."""
    def t(s):
        return s if len(s) <= tail else "...\n" + s[-tail:]
    return (f"rc={c['rc']} timed_out={c['timed_out']}\n--- stdout ---\n{t(c['stdout'])}\n"
            f"--- stderr ---\n{t(c['stderr'])}")


if __name__ == "__main__":
    main()
