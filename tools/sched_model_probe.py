"""Where a Hugging Face decode step's time goes under the live scheduler (issue #16, acceptance 3: >= 1.0x eager).

    python tools/sched_model_probe.py [label ...]  # on a GPU machine; default llama-small-fp16-sdpa-static
    env: PROBE_STEPS (16 decode steps per run), PROBE_RUNS (3 timed runs per config), PROBE_TOP (25 profile rows),
         PROBE_FRONT_TOP (12 rows of the front's own time per operator), PROBE_FLUSH_MS (2.0: auto_flush_ms),
         PROBE_SAMPLE=1 (one sched_worker run's host stacks sampled: tools/host_profile.py; PROBE_SAMPLE_HZ 4000,
         PROBE_SAMPLE_TOP 30 rows),
         PROBE_CONFIGS (a comma list of the configs below to run; default all)

W7's model of each label (benchmarks/bench_models.py: random weights, teacher-forced tokens; several labels run one
after another in one process, e.g. `llama-small-fp16-sdpa-static gpt2-small-fp16-sdpa-static
llama-small-bf16-eager-static`), the same steps under each config, the timed runs interleaved (one of each config
per round); per config, medians over the runs of: the host time of one step (until the model's forward returned)
and the whole run per step (synchronized at the end; the scheduler's exit flush included), its speed against eager
(the median over rounds of eager's time over its own), what it adds per aten op of the step (counted once by a
counting mode), and how many of its greedy tokens are eager's:
  eager          no mode
  noop_mode      a TorchDispatchMode that runs every op as it comes: PyTorch's cost of a Python mode written the
                 usual way (a class method, which PyTorch wraps in a Dynamo-disable call per op)
  noop_raw       the same bound as an instance attribute (no wrapper), as the scheduler binds its dispatch
  sched          gpuos.scheduler_context(), the worker's matmul and attention off (matmuls / SDPA stay eager)
  sched_worker   the same with both on (bench_models' gpuos_scheduler_worker)
  sched_worker_nocfront  sched_worker without the dispatcher front (csrc/sched/cfront.h): the dispatch mode alone
  sched_worker_front     sched_worker with the __torch_function__ front as well (by default only where cfront is
                         off)
  sched_worker_nonative  sched_worker with the front's own records (cfront_native.cpp) off: those ops go to
                         the Python handlers by direct calls
  sched_worker_nodirect  ... and direct calls off too (gpuos_ext.cfront_set_direct): through the mode machinery
  sched_worker_gil  sched_worker with the flush timer publishing under the GIL (the default since the fifty-third
                 session; the sched_worker configs set the off-GIL timer, GPUOS_TIMER_OFF_GIL=1)
  sched_worker_live  sched_worker with the live window (experimental, off by default): live_idle_us = 2 x the timer's
                 period + 1 ms, so one worker stays resident across the timer's flushes (without it the worker idles
                 out 200 us after each flush and the next one launches it again)
Then sched_worker's gpuos.stats() per step (intercepted ops, flushes by cause, launches, host publication time),
and cProfile over one sched_worker run: the top functions by own time and by cumulative time -- the model's
Python, the scheduler's Python handlers, PyTorch's mode machinery. (The C++ dispatch -- sched_dispatch -- is not a
Python frame: it shows as the time of the frames that call into it.)
PROBE_CPU=1 runs eager and noop_mode on the CPU (no gpuos): a check of the probe itself on a machine without a GPU.
"""
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import types as _types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # (host_profile)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks import bench_models as BM  # noqa: E402
from benchmarks import harness as H  # noqa: E402


def _run_op(self, func, types, args=(), kwargs=None):
    return func(*args, **(kwargs or {}))


class NoopMode(TorchDispatchMode):
    __torch_dispatch__ = _run_op


class NoopRawMode(TorchDispatchMode):
    """NoopMode without the Dynamo-disable wrapper PyTorch puts around a subclass's __torch_dispatch__ (an eval-frame
    switch per op): bound as an instance attribute, as the scheduler binds its C++ sched_dispatch."""
    def __init__(self) -> None:
        super().__init__()
        self.__torch_dispatch__ = _types.MethodType(_run_op, self)


class CountMode(TorchDispatchMode):
    """NoopMode that counts the aten ops it sees."""
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_steps(d, cache, ctx, device: str) -> tuple:
    """One run of d.steps teacher-forced steps inside ctx(): (median host us per step, us per step in all, each
    step's greedy token: compared with eager's by the caller)."""
    BM.reset_cache(d, cache)
    host, logits = [], []
    sync(device)
    t_all = time.perf_counter()
    with torch.no_grad(), ctx():
        for i in range(d.steps):
            t0 = time.perf_counter()
            logits.append(BM.step_logits(d.model, d.forced[i], cache, d.positions[i], d.cache_kw))
            host.append(time.perf_counter() - t0)
    sync(device)
    t_all = (time.perf_counter() - t_all) / d.steps * 1e6
    return statistics.median(host) * 1e6, t_all, torch.cat(logits).argmax(-1)


def per_step_stats(s0: dict, s1: dict, steps: int) -> dict:
    """bench_models' per-step figures of the scheduler, with the record and publication counters beside them."""
    counters = [k for k in ("ops_intercepted", "front_ops", "subops", "flushes", "publications", "gated_launches",
                            "working_launches", "dma_batches", "lock_waits", "handovers", "busy_adoptions",
                            "idle_adoptions", "lazy_drains") if k in s0 and k in s1]
    ns = ("publish_ns", "publish_copy_ns", "publish_launch_ns", "publish_memop_ns", "publish_gen_ns",
          "publish_wait_ns", "publish_hook_ns", "lock_wait_ns")
    h0, h1 = s0.get("flush_host_us") or {}, s1.get("flush_host_us") or {}  # the scheduler's lowering, whole flushes
    return {**BM.per_step_stats(s0, s1, steps), **BM.counts_per_step(s0, s1, steps, counters),
            **{k[:-3] + "_us_per_step": round((s1[k] - s0[k]) / steps / 1e3, 1) for k in ns if k in s0 and k in s1},
            **{"flush_" + k[:-3] + "_us_per_step": round((h1[k] - h0[k]) / steps, 1) for k in h1 if k in h0}}


def front_times(ext, run, steps: int, top: int = 12) -> str:
    """One run with the dispatcher front timing each pass (gpuos_ext.cfront_set_timing): its own time per step by
    what it did, and the operators that cost most among those it called Python for or handed on."""
    ext.cfront_set_timing(True)
    try:
        host, total, _ = run()
    finally:
        ext.cfront_set_timing(False)
    t = ext.cfront_times()
    lines = [f"  front's own time, timed run (host {host:.0f} us/step, all {total:.0f}): " + ", ".join(
        f"{c} {ns / 1e3 / steps:.0f} us/step ({n / steps:.0f} x {ns / max(n, 1) / 1e3:.2f} us)"
        for c, (n, ns) in t["by_category"].items() if n)]
    rows = sorted(((ns, n, op, c) for op, per in t["by_op"].items() for c, (n, ns) in per.items()), reverse=True)
    lines += [f"    {op:40s} {c:7s} {n / steps:6.1f}/step  {ns / max(n, 1) / 1e3:7.2f} us  {ns / 1e3 / steps:7.1f} us/step"
              for ns, n, op, c in rows[:top]]
    return "\n".join(lines)


def profile(d, cache, ctx, device: str, top: int) -> str:
    pr = cProfile.Profile()
    pr.enable()
    run_steps(d, cache, ctx, device)
    pr.disable()
    buf = io.StringIO()
    for key in ("tottime", "cumulative"):
        buf.write(f"--- top {top} by {key} (one run of {d.steps} steps) ---\n")
        pstats.Stats(pr, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
    return "\n".join(line[:200] for line in buf.getvalue().splitlines() if line.strip())


def main() -> int:
    labels = sys.argv[1:] or ["llama-small-fp16-sdpa-static"]
    steps, runs = int(os.environ.get("PROBE_STEPS", "16")), int(os.environ.get("PROBE_RUNS", "3"))
    top = int(os.environ.get("PROBE_TOP", "25"))
    cpu = os.environ.get("PROBE_CPU") == "1"
    if not cpu and not torch.cuda.is_available():
        print("sched_model_probe: no CUDA GPU here; nothing to measure (PROBE_CPU=1 checks the probe on the CPU)")
        return 0
    device = "cpu" if cpu else "cuda"
    configs = {"eager": contextlib.nullcontext, "noop_mode": NoopMode, "noop_raw": NoopRawMode}
    gpuos = None
    if not cpu:
        import gpuos
        import gpuos_ext
        gpuos.init()

        flush_ms = float(os.environ.get("PROBE_FLUSH_MS", "2.0"))  # the scheduler's timer period

        def sched(worker: bool, cfront: bool = True, front=None, native: bool = True, direct: bool = True,
                  off_gil: bool = True, live: bool = False):
            @contextlib.contextmanager
            def ctx():
                was_off = gpuos_ext.sched_timer_off_gil() if hasattr(gpuos_ext, "sched_timer_off_gil") else None
                if was_off is not None:
                    gpuos_ext.sched_set_timer_off_gil(off_gil)
                live_kw = {"live_idle_us": 2000.0 * flush_ms + 1000.0} if live else {}  # (scheduler_context's doc)
                with H.worker_tasks(gpuos, worker, worker), gpuos.scheduler_context(cfront=cfront, front=front,
                                                                                   auto_flush_ms=flush_ms, **live_kw):
                    if not native and hasattr(gpuos_ext, "sched_set_cfront_native"):
                        gpuos_ext.sched_set_cfront_native([], {})
                    if not direct and hasattr(gpuos_ext, "cfront_set_direct"):
                        gpuos_ext.cfront_set_direct(False)
                    try:
                        yield
                    finally:
                        if hasattr(gpuos_ext, "cfront_set_direct"):
                            gpuos_ext.cfront_set_direct(True)
                        if not native:
                            gpuos.scheduler._push_tables()
                if was_off is not None:
                    gpuos_ext.sched_set_timer_off_gil(was_off)
            return ctx
        configs |= {"sched": sched(False), "sched_worker": sched(True), "sched_worker_nocfront": sched(True, False),
                    "sched_worker_front": sched(True, True, True),
                    "sched_worker_nonative": sched(True, native=False),
                    "sched_worker_nodirect": sched(True, native=False, direct=False),
                    "sched_worker_gil": sched(True, off_gil=False),
                    "sched_worker_live": sched(True, live=True)}
    if os.environ.get("PROBE_CONFIGS"):  # e.g. PROBE_CONFIGS=eager,sched_worker (eager is always kept: the ratios)
        keep = {"eager", *os.environ["PROBE_CONFIGS"].split(",")}
        configs = {k: v for k, v in configs.items() if k in keep}
    for label in labels:
        probe(label, configs, steps, runs, top, device, gpuos)
    return 0


def probe(label, configs, steps, runs, top, device, gpuos) -> None:
    """One label's model: every config's step times, sched_worker's stats and front timing, the profile."""
    gpuos_ext = sys.modules.get("gpuos_ext")
    case = BM.make_case(label, steps, device)
    d = case.data
    cache = BM._cached(case)
    print(f"sched_model_probe {label}: {steps} steps per run, {runs} runs per config, device {device} "
          f"({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), sdpa: {BM.SDPA_NOTE}")
    counter = CountMode()
    run_steps(d, cache, lambda: counter, device)
    ops = counter.ops / steps
    print(f"  {ops:.1f} aten ops per step (a counting TorchDispatchMode)")
    # Interleaved rounds (each config once per round, eager first): a host whose speed drifts during the probe
    # (measured: eager 3.8 vs 6.9 ms/step in two probes of one H200 machine) moves every config alike; each
    # config's ratio is the median over rounds of eager's time in that round over its own.
    for ctx in configs.values():
        run_steps(d, cache, ctx, device)  # warm: first compiles, generations, allocator
    res = {name: [] for name in configs}
    for _ in range(runs):
        for name, ctx in configs.items():
            res[name].append(run_steps(d, cache, ctx, device))
    eager_all = [r[1] for r in res["eager"]]
    for name, rs in res.items():
        host, total = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        ratio = statistics.median(e / r[1] for e, r in zip(eager_all, rs))
        extra = f", {(total - statistics.median(eager_all)) / ops:+.1f} us per aten op" if name != "eager" else ""
        same = min(int((r[2] == case.ref[0]).sum()) for r in rs)  # eager's greedy tokens (bench_models' ref)
        print(f"  {name:13s} host {host:9.1f} us/step  all {total:9.1f} us/step  ({ratio:.2f}x eager{extra}; "
              f"tokens {same}/{steps} eager's)", flush=True)
    if gpuos is not None:
        for name in [n for n in ("sched_worker", "sched_worker_nonative", "sched_worker_nodirect",
                                 "sched_worker_live") if n in configs]:
            s0, c0 = gpuos.stats(), gpuos_ext.cfront_info()
            run_steps(d, cache, configs[name], device)
            c1, s1 = gpuos_ext.cfront_info(), gpuos.stats()
            print(f"{name} per step:", per_step_stats(s0, s1, steps))
            # the dispatcher front: ops it saw (composites and their parts each), recorded, ran below the mode
            keys = ("seen", "recorded", "nodata", "direct", "native")
            print("  cfront per step:", {k: round((c1[k] - c0[k]) / steps, 1) for k in keys if k in c1})
            print("  fallbacks per step:", {k: round((v - s0["fallbacks"].get(k, 0)) / steps, 1)
                                            for k, v in s1["fallbacks"].items() if v != s0["fallbacks"].get(k, 0)})
            if name == "sched_worker" and hasattr(gpuos_ext, "cfront_set_timing"):
                print(front_times(gpuos_ext, lambda: run_steps(d, cache, configs[name], device), steps,
                                  int(os.environ.get("PROBE_FRONT_TOP", "12"))))
    if top > 0:
        print(profile(d, cache, configs["sched_worker" if gpuos is not None else "noop_mode"], device, top))
    if os.environ.get("PROBE_SAMPLE") == "1":  # the C++ and interpreter frames of one run (tools/host_profile.py)
        import host_profile
        name = "sched_worker" if gpuos is not None else "noop_mode"
        prof = host_profile.sample(lambda: run_steps(d, cache, configs[name], device),
                                   hz=float(os.environ.get("PROBE_SAMPLE_HZ", "4000")))
        print(f"{name}, one run sampled: " + prof.report(top=int(os.environ.get("PROBE_SAMPLE_TOP", "30")), per=steps))
    del case, d, cache
    if device == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
