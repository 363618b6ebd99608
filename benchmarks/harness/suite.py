"""The suite's measurement machinery: time budgets, rep planning, a workload size (Case), a configuration's
callables (Prepared), the settings of a run (RunContext), check-then-time of one configuration
(measure_config) and the in-process peers of every size (peer_sweep).

Imports: timing, rows, gpuos_rt.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .env import env_line, env_metadata, skip_without_cuda
from .gpuos_rt import gpuos_stats, is_fatal_gpuos_error, stats_delta
from .results import write_results
from .rows import error_row, format_exc, is_gpuos_config, rnd, sweep, timing_row
from .timing import cuda_sync, no_sync, release_memory, time_reps


# --------------------------------------------------------------------------------------------------
# time budget
# --------------------------------------------------------------------------------------------------
class Budget:
    """A deadline ``seconds`` after ``start`` (perf_counter; default: now)."""

    def __init__(self, seconds: float, start: Optional[float] = None) -> None:
        self.seconds = float(seconds)
        self.start = time.perf_counter() if start is None else float(start)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        return self.start + self.seconds - time.perf_counter()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def part(self, seconds: float) -> "Budget":
        """A budget of ``seconds`` from now that never ends after this one."""
        return Budget(max(0.0, min(float(seconds), self.remaining())))


def plan_reps(per_rep_s: float, reps: int, warmup: int, share_s: float, min_reps: int = 3):
    """(reps, warmup, note): the requested reps and warm-up when they fit ``share_s`` seconds, else fewer
    (never below ``min_reps``; one warm-up at most) with a note that says why."""
    per = max(float(per_rep_s), 1e-6)
    if per * (reps + warmup) <= share_s:
        return reps, warmup, None
    warmup = min(warmup, 1)
    fit = max(min_reps, min(reps, int(share_s / per) - warmup))
    if fit >= reps:
        return reps, warmup, None
    return fit, warmup, (f"time budget: {fit} of {reps} reps ({per * 1e3:.1f} ms per rep, "
                         f"{share_s:.1f} s for this config)")


# --------------------------------------------------------------------------------------------------
# correctness
# --------------------------------------------------------------------------------------------------
def check_close(got: Any, exp: Any, tol: dict) -> tuple:
    """(True, None) when torch.testing.assert_close(got, exp, **tol) passes (tensors, or lists / dicts of
    them), else (False, the first 400 characters of why)."""
    import torch
    try:
        torch.testing.assert_close(got, exp, **tol)
        return True, None
    except AssertionError as exc:
        return False, " ".join(str(exc).split())[:400]
    except Exception as exc:  # wrong type / None / device mismatch
        return False, format_exc(exc, 400)


# --------------------------------------------------------------------------------------------------
# one configuration of one workload size: check, then time
# --------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One size of a workload: its inputs (``data``), the eager reference output and how to compare.

    ``size`` is the row's size (an int or a label such as "8x256"); ``extra`` goes into every row of
    this size; ``ops_per_rep`` (when known) adds ``us_per_op``.
    """
    size: Any
    ref: Any
    tol: dict
    data: Any = None
    extra: dict = field(default_factory=dict)
    ops_per_rep: Optional[int] = None


@dataclass
class Prepared:
    """What a configuration's setup returns.

    ``fn``: one timed repetition; returns its output (kept alive until after the sync).
    ``check``: run once before timing; returns what is compared with the reference (default ``fn``).
    ``extra``: fields for the row (e.g. capture_ms); read after ``check`` ran, so it may fill them.
    """
    fn: Callable[[], Any]
    check: Optional[Callable[[], Any]] = None
    extra: dict = field(default_factory=dict)


@dataclass
class RunContext:
    """Settings and state shared by the configurations of one workload run (in the suite or alone)."""
    budget: Budget
    reps: int = 20
    warmup: int = 2
    min_reps: int = 3
    quick: bool = False
    device: str = "cuda"
    configs: Optional[frozenset] = None  # None = every configuration
    log: Callable[[str], None] = print
    progress: Any = None  # a Progress, or None
    gpuos: Any = None  # the gpuos package (scheduler_context, stats), or None
    gpuos_err: Optional[str] = None
    capacity: int = 8192  # scheduler_context(capacity=...)
    units_left: int = 1  # configurations still to measure in this workload (for the per-config share)
    config_cap_s: Optional[float] = None  # at most this many seconds for one configuration's reps

    def wants(self, config: str) -> bool:
        return self.configs is None or config in self.configs

    def sync(self) -> None:
        if self.device == "cuda":
            cuda_sync()

    def share_s(self) -> float:
        """Seconds one configuration's reps may take: three times an even share of what is left (most
        configurations take far less than the average), never more than half of it."""
        left = max(0.0, self.budget.remaining())
        share = min(left / 2, 3 * left / max(1, self.units_left))
        return share if self.config_cap_s is None else min(share, self.config_cap_s)

    def advance(self, label: str) -> None:
        self.units_left = max(0, self.units_left - 1)
        if self.progress is not None:
            self.progress.advance(label)

    def scheduler(self):
        """A fresh gpuos.scheduler_context (raises when gpuos is unavailable)."""
        if self.gpuos is None:
            raise RuntimeError(f"gpuos unavailable: {self.gpuos_err}")
        return self.gpuos.scheduler_context(capacity=self.capacity)


def budget_error(ctx: RunContext) -> str:
    return f"time budget: skipped, the workload's {ctx.budget.seconds:.0f} s were spent"


def measure_config(ctx: RunContext, workload: str, case: Case, config: str,
                   setup: Callable[[], Any], extra: Optional[dict] = None) -> dict:
    """Set up one configuration, check its output against ``case.ref``, then time it; always a row.

    ``setup()`` returns a Prepared (or a bare callable = Prepared(fn)). The check call's time is
    ``first_call_s`` (it includes lazy compiles and captures); then ``ctx.warmup`` untimed calls (at least
    one; the last estimates a rep), and the reps shrink (row field ``reps_note``) when ``ctx.reps`` would
    not fit this config's share of the budget. Errors of any kind become an error row.
    """
    size = case.size
    fields = dict(case.extra)
    fields.update(extra or {})
    if is_gpuos_config(config) and ctx.gpuos is None:
        return error_row(workload, size, config, f"gpuos unavailable: {ctx.gpuos_err}", **fields)
    if ctx.budget.expired():
        return error_row(workload, size, config, budget_error(ctx), **fields)
    st0 = gpuos_stats(ctx.gpuos) if is_gpuos_config(config) else None
    try:
        prep = setup()
        if not isinstance(prep, Prepared):
            prep = Prepared(prep)
        ctx.sync()
        t0 = time.perf_counter()
        out = (prep.check or prep.fn)()
        ctx.sync()
        first_s = time.perf_counter() - t0
        correct, detail = check_close(out, case.ref, case.tol)
        del out
        share = ctx.share_s()
        spent = 0.0
        for _ in range(max(1, ctx.warmup)):  # warm-up calls; the last one's time estimates a rep
            t0 = time.perf_counter()
            r = prep.fn()
            ctx.sync()
            per_rep_s = time.perf_counter() - t0
            spent += per_rep_s
            del r
            if spent > share / 4:
                break
        reps, _, note = plan_reps(per_rep_s, ctx.reps, 0, share - spent, ctx.min_reps)
        if ctx.quick and note is None:
            note = f"quick run: {reps} reps"
        timing = time_reps(prep.fn, reps=reps, warmup=0, sync=cuda_sync if ctx.device == "cuda" else no_sync,
                           gpu_events=ctx.device == "cuda")
    except Exception as exc:
        try:
            ctx.sync()
        except Exception:
            pass
        ctx.log(f"{workload} {size} {config}: ERROR {format_exc(exc, 300)}")
        if is_gpuos_config(config) and is_fatal_gpuos_error(exc):  # later gpuos configs: error rows at once
            ctx.gpuos, ctx.gpuos_err = None, f"an earlier gpuos call failed ({workload} {size}): {format_exc(exc, 200)}"
        return error_row(workload, size, config, exc, **fields)
    fields.update(prep.extra)
    row = timing_row(workload, size, config, timing, correct, host_median_ms=rnd(timing.host_median_ms),
                     first_call_s=rnd(first_s), **fields)
    if case.ops_per_rep:
        row["ops_per_rep"] = case.ops_per_rep
        row["us_per_op"] = rnd(timing.median_ms * 1e3 / case.ops_per_rep)
    if note:
        row["reps_note"] = note
    if detail:
        row["correct_detail"] = detail
    d = stats_delta(st0, gpuos_stats(ctx.gpuos)) if st0 is not None else None
    if d:
        row["stats_delta"] = d
    gpu = f" gpu {row['median_gpu_ms']:.3f}" if row.get("median_gpu_ms") is not None else ""
    ctx.log(f"{workload} {size} {config:<24} median {timing.median_ms:9.3f} ms (min {timing.min_ms:.3f}, "
            f"max {timing.max_ms:.3f}) host {timing.host_median_ms:.3f}{gpu} reps {timing.reps} correct={correct}")
    return row


def peer_sweep(ctx: RunContext, workload: str, sizes: Sequence[Any], make_case: Callable[[Any], Case],
               setups: dict, rows: list, save: Optional[Callable[[], Any]] = None) -> None:
    """For every size: build its Case, then measure each wanted configuration of ``setups``
    ({config: setup(case) -> Prepared}); appends one row per (size, config), saving after each."""
    wanted = [c for c in setups if ctx.wants(c)]
    for size in sizes:
        try:
            case = make_case(size)
        except Exception as exc:
            ctx.log(f"{workload} {size}: ERROR building inputs: {format_exc(exc, 300)}")
            for config in wanted:
                rows.append(error_row(workload, size, config, f"inputs: {format_exc(exc, 300)}"))
                ctx.advance(f"{workload} {size} {config}")
            continue
        for config in wanted:
            rows.append(measure_config(ctx, workload, case, config, lambda c=config: setups[c](case)))
            ctx.advance(f"{workload} {case.size} {config}")
            if save is not None:
                save()
        case = None  # free this size's tensors before the next size
        release_memory(ctx.device)


def select_cases(cases: list, label: Callable[..., str], only: Any) -> list:
    """The cases of a grid whose label contains one of the strings of ``only`` (None: every case); a ValueError
    naming the labels when none matches."""
    if not only:
        return list(cases)
    picked = [c for c in cases if any(o in label(*c) for o in only)]
    if not picked:
        raise ValueError(f"--only {' '.join(only)}: no case matches; the cases are "
                         + ", ".join(label(*c) for c in cases))
    return picked


def grid_main(doc: str, argv: Any, script: str, name: str, workload: str, grid: Callable[[bool], list],
              run: Callable[..., None], label: Callable[..., str]) -> int:
    """main() of a micro-benchmark grid (bench_matmul, bench_attention): ``--quick`` / ``--reps``, exit 0 without
    a GPU, the runtime started, ``run(*case, reps, rows)`` for every case of ``grid(quick)`` (a case that raises
    becomes an error row named ``label(*case)``), the rows written to benchmarks/results/<name>.json."""
    import argparse
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--only", nargs="+", metavar="PART",
                   help="run only the cases whose label contains one of these (e.g. M1-N4096 for bench_matmul); "
                        "the rows are printed, the results file is left as it is")
    a = p.parse_args(argv)
    if skip_without_cuda(script):
        return 0
    try:
        cases = select_cases(grid(a.quick), label, a.only)
    except ValueError as e:
        p.error(str(e))
    import gpuos
    gpuos.init()
    meta = env_metadata(name)
    print(env_line(meta), flush=True)
    rows: list = []
    sweep(lambda *case: run(*case, a.reps, rows), cases, rows, workload, label, after=release_memory)
    if a.only:  # a subset of the grid does not replace the results file of the whole one
        print(f"--only: {len(rows)} rows, benchmarks/results/{name}.json left as it is")
        return 0
    path = write_results(name, meta, rows)
    print(f"results written to {path}")
    return 0


@contextlib.contextmanager
def worker_tasks(gpuos, matmul: bool, attention: bool):
    """The scheduler's worker matmul / attention settings for the duration of the block (restored after)."""
    was = (gpuos.worker_matmul_enabled(), gpuos.worker_attention_enabled())
    gpuos.set_worker_matmul(matmul)
    gpuos.set_worker_attention(attention)
    try:
        yield
    finally:
        gpuos.set_worker_matmul(was[0])
        gpuos.set_worker_attention(was[1])


def capture_program(gpuos, f: Callable, args: tuple, sync: Callable[[], None]) -> tuple:
    """(gpuos.capture(f, *args), its milliseconds between syncs), with the worker's matmul and attention on."""
    with worker_tasks(gpuos, True, True):
        sync()
        t0 = time.perf_counter()
        prog = gpuos.capture(f, *args)
        sync()
    return prog, (time.perf_counter() - t0) * 1e3


def settle_program(call: Callable[[], Any], sync: Callable[[], None]) -> float:
    """A captured program's steady state before it is timed: replays past the tier-2 threshold (its hot fused
    entries -- row programs, chains -- are then compiled as straight-line code in the background,
    ``gpuos_ext.specialize_after()`` uses), then the wait for that code's generation. Without it a row timed the
    interpreter or the tier-2 code depending on whether the disk cache already held it (W7 Llama-small: 21.8 vs
    16.9 ms per 32 steps on one H200 build). Returns its milliseconds (the row's ``settle_ms``: like
    torch.compile's compile time, outside the per-rep figure)."""
    import gpuos_ext
    t0 = time.perf_counter()
    for _ in range(gpuos_ext.specialize_after() + 16):
        call()
    sync()
    gpuos_ext.wait_generations()
    # Then the tier-2 generation compiled whole in the background (csrc/inject/whole.h; GPUOS_WHOLE_BUILD=0: none):
    # the steady state a long-running process reaches (W7, H200: ~8 % faster per step than the linked image).
    if not gpuos_ext.wait_whole_builds(300):
        print(f"settle_program: the whole build did not finish in 300 s: {gpuos_ext.whole_build_info()}")
    gpuos_ext.yield_worker()  # the next call starts the worker on the newest generation
    call()
    sync()
    return (time.perf_counter() - t0) * 1e3


def whole_build_extra() -> dict:
    """A program row's note of the background whole build: whether the timed generation was compiled whole."""
    import gpuos_ext
    w = gpuos_ext.whole_build_info()
    return {"whole_build": {"enabled": w["enabled"], "published": w["published"], "failed": w["failed"],
                            "last_s": round(w["last_s"], 1)}}


def program_setup(ctx: RunContext, fn_of: Callable[[Case], Callable], args_of: Callable[[Case], tuple],
                  loop: Optional[Callable[[Case, Callable], Any]] = None) -> Callable[[Case], Prepared]:
    """Setup of the ``gpuos_program`` peer (issue #17): ``fn_of(case)`` captured once with gpuos.capture on
    ``args_of(case)`` (worker matmul and attention on while capturing); a repetition is ``loop(case, prog)``
    (default: one ``prog(*args)``). The row says what the program holds and what the capture cost."""
    def setup(case: Case) -> Prepared:
        import collections
        args = args_of(case)
        prog, ms = capture_program(ctx.gpuos, fn_of(case), args, ctx.sync)
        info = prog.info()
        run = (lambda: loop(case, prog)) if loop is not None else (lambda: prog(*args))
        settle_ms = settle_program(lambda: prog(*args), ctx.sync)
        return Prepared(run, extra={"capture_ms": round(ms, 3), "settle_ms": round(settle_ms, 1),
                                    "subops": info["entries"], "tiles": info["tiles"],
                                    "segments": info["segments"], "levels": sum(info["levels"]),
                                    "eager_ops": dict(collections.Counter(info["fallbacks"])),
                                    **whole_build_extra()})
    return setup


def scheduler_setup(ctx: RunContext, run: Callable[[Case], Any]) -> Callable[[Case], Prepared]:
    """Setup of the ``gpuos_scheduler`` peer: the eager ``run(case)`` inside one gpuos.scheduler_context()."""
    def setup(case: Case) -> Prepared:
        def fn():
            with ctx.scheduler():
                return run(case)
        return Prepared(fn)
    return setup
