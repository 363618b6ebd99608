"""Helpers shared by the GPUOS benchmarks (the suite ``python -m benchmarks`` and every bench_*.py).

Environment and rows:
* ``env_metadata(name)``      -- the header fields of a result file (device, driver, torch, gpuos, date)
* ``require_cuda(name)``      -- exit 0 with a clear message when there is no CUDA GPU
* ``import_gpuos()`` / ``import_gpuos_package()`` -- the runtime module / the gpuos package, or why not
* ``gpuos_reinit / gpuos_stats / stats_delta`` -- runtime (re)initialisation and counter deltas
* ``time_reps(fn, ...)``      -- warm-up + timed reps: host wall clock around work + sync, CUDA events
* ``timing_row / value_row / error_row / not_applicable_row`` -- rows in the BENCH_SCHEMA.md shape
* ``write_results(name, meta, rows)`` -- writes benchmarks/results/<name>.json atomically
* ``print_table(...)``        -- rich table when rich is importable, plain aligned text otherwise
* ``capture_cuda_graph``      -- side-stream warm-up, then one torch.cuda.CUDAGraph capture

The suite's machinery (used by run_all.py and the workload modules):
* ``Budget`` / ``plan_reps``  -- deadlines, and fewer reps (with a note) when the budget is short
* ``Case`` / ``Prepared`` / ``RunContext`` -- one size's inputs and reference, one config's callables, the
  settings of a workload run
* ``measure_config``          -- check against eager first, then time; any failure becomes an error row
* ``peer_sweep`` / ``run_standard_workload`` / ``standard_hooks`` -- the in-process peers of every size,
  then the torch.compile peers in a child process (``child_rows`` / ``run_child`` here, ``compile_sweep``
  and ``emit_row`` in the child, entry point ``benchmarks/_child.py``)
* ``CompileCounters``         -- graphs compiled, CUDA graphs recorded, cudagraph skips
* ``Progress``                -- rich / tqdm on a terminal, plain lines otherwise
* ``load_result_docs / gpuos_vs_best_peer`` -- reading result files (report.py, plots.py)

Result format: see BENCH_SCHEMA.md (copied in the docstring of ``write_results``).
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"


# --------------------------------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------------------------------
def _run_text(cmd: Sequence[str], cwd: Optional[Path] = None, timeout: float = 10.0) -> Optional[str]:
    try:
        res = subprocess.run(list(cmd), cwd=str(cwd) if cwd else None, capture_output=True,
                             text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    out = res.stdout.strip()
    return out or None


def driver_version() -> str:
    """NVIDIA driver version from nvidia-smi, or "unknown"."""
    out = _run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if not out:
        return "unknown"
    return out.splitlines()[0].strip() or "unknown"


def git_sha(repo: Path = REPO_ROOT) -> str:
    """Short git sha of the GPUOS checkout ($GPUOS_GIT_SHA wins: copies without .git), or "unknown"."""
    if os.environ.get("GPUOS_GIT_SHA"):
        return os.environ["GPUOS_GIT_SHA"]
    out = _run_text(["git", "rev-parse", "--short", "HEAD"], cwd=repo)
    return out.splitlines()[0].strip() if out else "unknown"


def utc_now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def device_name() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:  # pragma: no cover - defensive
        pass
    return "cpu"


def env_metadata(benchmark: str) -> dict:
    """Header of a result file: benchmark, device, driver, torch, gpuos, date (BENCH_SCHEMA.md)."""
    import torch
    return {
        "benchmark": benchmark,
        "device": device_name(),
        "driver": driver_version(),
        "torch": torch.__version__,
        "gpuos": git_sha(),
        "date": utc_now_iso(),
    }


def cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:
        return False


def require_cuda(benchmark: str) -> None:
    """Exit with status 0 and a clear message when no CUDA GPU is usable."""
    if cuda_available():
        return
    try:
        import torch
        why = (f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'}) reports "
               f"torch.cuda.is_available() == False")
    except Exception as exc:  # pragma: no cover - torch missing
        why = f"torch could not be imported ({exc})"
    print(f"[{benchmark}] no CUDA GPU available: {why}. Nothing to benchmark; "
          f"run this on a machine with an NVIDIA GPU. (exit 0)")
    sys.exit(0)


def ensure_repo_on_path() -> None:
    """Put the repository root on sys.path so an in-place build of gpuos_ext / the gpuos package imports."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


def import_gpuos():
    """Return (module, None) with the submit/flush API, or (None, reason).

    Prefers the C++ extension ``gpuos_ext``; falls back to the ``gpuos`` package (which re-exports it).
    """
    ensure_repo_on_path()
    errors = []
    for name in ("gpuos_ext", "gpuos"):
        try:
            mod = __import__(name)
        except Exception as exc:  # ImportError, or an error raised while importing
            errors.append(f"import {name}: {type(exc).__name__}: {exc}")
            continue
        if all(hasattr(mod, f) for f in ("submit_add", "submit_many", "flush", "init", "shutdown")):
            return mod, None
        errors.append(f"{name} lacks submit_add/submit_many/flush/init/shutdown")
    return None, "; ".join(errors)


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------
def summarize(samples: Sequence[float]) -> dict:
    if not samples:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples)}


@dataclass
class Timing:
    """Per-rep samples in milliseconds.

    ``samples_ms``: perf_counter from before the work until after the trailing sync (end to end).
    ``host_ms``: perf_counter from before the work until the work callable returned (before the sync).
    ``gpu_ms``: CUDA events recorded on the current stream just before and just after the work: the
    stream's span for the rep (empty when events were not used, e.g. on the CPU).
    """
    samples_ms: list = field(default_factory=list)
    host_ms: list = field(default_factory=list)
    gpu_ms: list = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return summarize(self.samples_ms)["median"]

    @property
    def min_ms(self) -> float:
        return summarize(self.samples_ms)["min"]

    @property
    def max_ms(self) -> float:
        return summarize(self.samples_ms)["max"]

    @property
    def host_median_ms(self) -> float:
        return summarize(self.host_ms)["median"]

    @property
    def gpu_median_ms(self) -> Optional[float]:
        return summarize(self.gpu_ms)["median"] if self.gpu_ms else None

    @property
    def reps(self) -> int:
        return len(self.samples_ms)


def cuda_sync() -> None:
    import torch
    torch.cuda.synchronize()


def no_sync() -> None:
    """The sync of CPU runs (nothing to wait for)."""


def _events_usable() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


def time_reps(fn: Callable[[], Any], reps: int = 20, warmup: int = 3,
              sync: Optional[Callable[[], None]] = None, disable_gc: bool = True,
              gpu_events: Optional[bool] = None) -> Timing:
    """Warm up, then time ``reps`` calls of ``fn`` end to end on the host (and on the GPU stream).

    Each rep: sync(); [start event]; t0 = perf_counter(); r = fn(); t1; [end event]; sync(); t2.
    ``samples_ms`` = t2 - t0, ``host_ms`` = t1 - t0, ``gpu_ms`` = end - start event (CUDA events on the
    current stream; ``gpu_events`` None = when CUDA is initialised). Whatever ``fn`` returns is kept alive
    until after the sync (so freeing eager outputs is not timed) and dropped before the next rep. Python's
    GC is disabled during the timed reps (collected before) so a collection does not land inside one rep.
    """
    sync = sync or cuda_sync
    if gpu_events is None:
        gpu_events = sync is cuda_sync and _events_usable()
    for _ in range(max(0, warmup)):
        r = fn()
        sync()
        del r
    events = []
    if gpu_events:
        import torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
    gc.collect()
    was_enabled = gc.isenabled()
    if disable_gc:
        gc.disable()
    t = Timing()
    try:
        for i in range(reps):
            sync()
            if events:
                events[i][0].record()
            t0 = time.perf_counter()
            r = fn()
            t1 = time.perf_counter()
            if events:
                events[i][1].record()
            sync()
            t2 = time.perf_counter()
            del r
            t.samples_ms.append((t2 - t0) * 1e3)
            t.host_ms.append((t1 - t0) * 1e3)
    finally:
        if disable_gc and was_enabled:
            gc.enable()
    t.gpu_ms = [start.elapsed_time(end) for start, end in events]
    return t


# --------------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------------
def _r(x: Optional[float], nd: int = 4) -> Optional[float]:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def timing_row(workload: str, size: Optional[int], config: str, timing: Timing,
               correct: Optional[bool], **extra: Any) -> dict:
    row = {"workload": workload}
    if size is not None:
        row["size"] = size
    row.update({"config": config, "median_ms": _r(timing.median_ms), "min_ms": _r(timing.min_ms),
                "max_ms": _r(timing.max_ms), "reps": timing.reps, "correct": correct})
    if timing.gpu_ms:
        row["median_gpu_ms"] = _r(timing.gpu_median_ms)
    row.update(extra)
    return row


def value_row(workload: str, config: str, value: float, unit: str, size: Optional[int] = None,
              **extra: Any) -> dict:
    row = {"workload": workload}
    if size is not None:
        row["size"] = size
    row.update({"config": config, "value": _r(value), "unit": unit})
    row.update(extra)
    return row


def format_exc(exc: BaseException, limit: int = 500) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def error_row(workload: str, size: Optional[int], config: str, error: Any, **extra: Any) -> dict:
    row = {"workload": workload}
    if size is not None:
        row["size"] = size
    row["config"] = config
    row["error"] = format_exc(error) if isinstance(error, BaseException) else str(error)
    row.update(extra)
    return row


def find_row(rows: Iterable[dict], config: str, size: Optional[int] = None,
             workload: Optional[str] = None) -> Optional[dict]:
    for row in rows:
        if row.get("config") != config:
            continue
        if size is not None and row.get("size") != size:
            continue
        if workload is not None and row.get("workload") != workload:
            continue
        return row
    return None


def row_median(row: Optional[dict]) -> Optional[float]:
    """median_ms of a timing row that ran (no error), else None."""
    if not row or "error" in row:
        return None
    v = row.get("median_ms")
    return v if isinstance(v, (int, float)) and v > 0 else None


# --------------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------------
def _json_default(o: Any):
    try:
        import torch
        if isinstance(o, torch.Tensor) and o.numel() == 1:
            return o.item()
    except Exception:
        pass
    if isinstance(o, Path):
        return str(o)
    return str(o)


def sanitize(o: Any) -> Any:
    """Recursively replace non-finite floats by None so the JSON stays strict (no NaN/Infinity)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): sanitize(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [sanitize(v) for v in o]
    return o


def merge_results(name: str, meta: dict, rows: list) -> Path:
    """Write ``rows`` into benchmarks/results/<name>.json, replacing rows of the same config and keeping the
    others (several scripts share one file, e.g. injection.json)."""
    path = RESULTS_DIR / f"{name}.json"
    old = []
    if path.exists():
        try:
            old = json.loads(path.read_text()).get("rows", [])
        except (OSError, ValueError):
            old = []
    mine = {r["config"] for r in rows}
    return write_results(name, meta, [r for r in old if r.get("config") not in mine] + rows, path=path)


def merge_and_print_values(name: str, rows: list) -> Path:
    """merge_results for a script's value rows (env metadata of this run), then one line per row: figure,
    value, unit, goal. Returns the file written."""
    path = merge_results(name, env_metadata(name), rows)
    w = max([len("figure")] + [len(r["config"]) for r in rows])
    print(f"{'figure':{w}s} {'value':>10s}  unit")
    for r in rows:
        print(f"{r['config']:{w}s} {r['value']:10.4g}  {r['unit']}  {r.get('goal', '')}")
    return path


def write_results(name: str, meta: dict, rows: list, path: Optional[Path] = None, **extra: Any) -> Path:
    """Write ``{**meta, "rows": rows, **extra}`` to benchmarks/results/<name>.json (atomic rename).

    Shape (BENCH_SCHEMA.md): benchmark, device, driver, torch, gpuos, date, rows[]. Timing rows have
    workload/size/config/median_ms/min_ms/max_ms/reps/correct; value rows config/value/unit; rows that
    could not run have "error" and no times.
    """
    path = Path(path) if path else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = dict(meta)
    doc["rows"] = rows
    doc.update(extra)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(sanitize(doc), fh, indent=2, default=_json_default, allow_nan=False)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def fmt_num(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.1f}"
        if abs(x) >= 100:
            return f"{x:.1f}"
        return f"{x:.{nd}f}"
    return str(x)


def fmt_ratio(x: Optional[float]) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.2f}x" if x < 100 else f"{x:.0f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: Optional[str] = None,
                plain: bool = False, align: Optional[str] = None) -> None:
    """Print a table: rich if importable (and not ``plain``), else aligned plain text.

    ``align``: one letter per column, "l" or "r" (default: first column left, the rest right).
    Non-string cells are formatted with ``fmt_num``.
    """
    cells = [[c if isinstance(c, str) else fmt_num(c) for c in r] for r in rows]
    align = (align or ("l" + "r" * (len(headers) - 1))).ljust(len(headers), "r")
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
            table = Table(title=title)
            for i, h in enumerate(headers):
                table.add_column(h, justify="left" if align[i] == "l" else "right")
            for r in cells:
                table.add_row(*r)
            Console().print(table)
            return
        except ImportError:
            pass
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(vals):
        return "  ".join(v.ljust(widths[i]) if align[i] == "l" else v.rjust(widths[i])
                         for i, v in enumerate(vals)).rstrip()

    if title:
        print(f"\n{title}")
    print(line(list(headers)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(line(r))
    sys.stdout.flush()


def parse_int_list(values: Sequence[str]) -> list:
    """Parse ``--sizes 256 1024`` or ``--sizes 256,1024`` into [256, 1024]."""
    out = []
    for v in values:
        for part in str(v).replace(";", ",").split(","):
            part = part.strip()
            if part:
                out.append(int(part))
    return out


def parse_capacity(arg, need: int, error) -> "int | None":
    """--capacity: 'auto' (a power of two >= need and >= 4096), 'default' (None: the runtime default) or an int.
    `error` is argparse's parser.error."""
    cap = str(arg).strip().lower()
    if cap == "auto":
        return max(4096, 1 << max(0, int(need - 1).bit_length()))
    if cap == "default":
        return None
    try:
        return int(cap)
    except ValueError:
        error("--capacity must be 'auto', 'default' or an integer")


def select_configs(values, choices, error) -> list:
    """--configs values (space- or comma-separated) validated against `choices`; all of them when None."""
    if not values:
        return list(choices)
    picked = [c.strip() for v in values for c in v.split(",") if c.strip()]
    bad = [c for c in picked if c not in choices]
    if bad:
        error(f"unknown config(s) {bad}; choose from {list(choices)}")
    return picked


def capture_cuda_graph(warmup, capture):
    """Run warmup() on a side stream (as the CUDA graphs docs recommend), then capture one capture() call into
    a torch.cuda.CUDAGraph. Returns (graph, capture()'s result, capture time in ms)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warmup()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    try:  # thread_local: a runtime helper thread touching CUDA must not invalidate our capture
        ctx = torch.cuda.graph(g, capture_error_mode="thread_local")
    except TypeError:
        ctx = torch.cuda.graph(g)
    with ctx:
        result = capture()
    torch.cuda.synchronize()
    return g, result, (time.perf_counter() - t0) * 1e3


# --------------------------------------------------------------------------------------------------
# gpuos runtime helpers (shared by every workload)
# --------------------------------------------------------------------------------------------------
def import_gpuos_package():
    """Return (the ``gpuos`` package, None) or (None, reason): the package has scheduler_context()."""
    ensure_repo_on_path()
    try:
        import gpuos
    except Exception as exc:
        return None, f"import gpuos: {format_exc(exc, 300)}"
    if not hasattr(gpuos, "scheduler_context"):
        return None, "this gpuos has no scheduler_context (the issue-4 scheduler is not built in)"
    return gpuos, None


def gpuos_reinit(mod, capacity: Optional[int]) -> None:
    """shutdown() (if up) then init(capacity=...); capacity None = runtime default."""
    try:
        up = bool(mod.is_initialized()) if hasattr(mod, "is_initialized") else True
    except Exception:
        up = True
    if up:
        mod.shutdown()
    if capacity is None:
        mod.init()
    else:
        mod.init(capacity=int(capacity))


def gpuos_stats(mod) -> Optional[dict]:
    """mod.stats() as a dict, or None (no module, or the call failed)."""
    if mod is None:
        return None
    try:
        return dict(mod.stats())
    except Exception:
        return None


def stats_delta(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """after - before for int counters and, per key, for dict-valued counters (the scheduler's
    fallbacks / flushes_by_cause); zero differences are left out; adds batch_ops_mean when the
    scheduler flushed."""
    if before is None or after is None:
        return None
    out: dict = {}
    for k, v in after.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            dv = v - before.get(k, 0)
            if dv:
                out[k] = dv
        elif isinstance(v, dict):
            old = before.get(k, {}) or {}
            dd = {kk: vv - old.get(kk, 0) for kk, vv in v.items()
                  if isinstance(vv, int) and vv - old.get(kk, 0)}
            if dd:
                out[k] = dd
    flushes = sum(out.get("flushes_by_cause", {}).values())
    if flushes:
        out["batch_ops_mean"] = round(out.get("ops_intercepted", 0) / flushes, 2)
    return out


def is_fatal_gpuos_error(exc: BaseException) -> bool:
    """Errors after which the runtime is probably unusable (timeouts, CUDA errors): skip later gpuos rows."""
    if isinstance(exc, (TypeError, ValueError, NotImplementedError, AttributeError)):
        return False
    names = {k.__name__ for k in type(exc).__mro__}
    msg = str(exc).lower()
    return bool(names & {"GpuosError", "CudaError"}) or "timeout" in msg or "timed out" in msg \
        or "illegal" in msg or "cuda error" in msg


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
PEER_CONFIGS = ("eager", "eager_out", "foreach", "cudagraph", "compile", "compile_reduce_overhead")
COMPILE_MODES = (("compile", "default"), ("compile_reduce_overhead", "reduce-overhead"))


def is_gpuos_config(config: str) -> bool:
    return config.startswith("gpuos")


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
    row = timing_row(workload, size, config, timing, correct, host_median_ms=_r(timing.host_median_ms),
                     first_call_s=_r(first_s), **fields)
    if case.ops_per_rep:
        row["ops_per_rep"] = case.ops_per_rep
        row["us_per_op"] = _r(timing.median_ms * 1e3 / case.ops_per_rep)
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


def release_memory(device: str = "cuda") -> None:
    """Collect garbage and return cached GPU memory between sizes."""
    gc.collect()
    if device == "cuda":
        try:
            import torch
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


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


def not_applicable_row(workload: str, config: str, reason: str) -> dict:
    """A peer that cannot run this workload at all (listed, never skipped silently)."""
    return {"workload": workload, "config": config, "error": f"not applicable: {reason}", "not_applicable": True}


# --------------------------------------------------------------------------------------------------
# torch.compile peers: run in a child process with a timeout
# --------------------------------------------------------------------------------------------------
CHILD_MARK = "@@GPUOS_BENCH_ROW@@"
MIN_CHILD_S = 20.0  # a compile child is not started with less time than this


def emit_row(row: dict) -> None:
    """Child side: hand one row to the parent (one marked JSON line, flushed at once)."""
    print(CHILD_MARK + json.dumps(sanitize(row), default=_json_default), flush=True)


def run_child(module: str, params: dict, timeout_s: float, env: Optional[dict] = None) -> tuple:
    """Parent side: run ``python -m benchmarks._child <module> <params>`` for at most ``timeout_s``.

    Returns (rows, problem): the rows the child emitted (also those before a timeout or a crash) and
    None, or a text saying why it stopped early. The child runs in its own process group, killed
    whole at the timeout (torch.compile's worker processes included).
    """
    import signal
    cmd = [sys.executable, "-m", "benchmarks._child", module, json.dumps(params)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    problem = None
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        out, err = proc.communicate()
        problem = f"time budget: the torch.compile child was stopped after {timeout_s:.0f} s"
    rows = []
    for line in (out or "").splitlines():
        if line.startswith(CHILD_MARK):
            try:
                rows.append(json.loads(line[len(CHILD_MARK):]))
            except ValueError:
                pass
    if problem is None and proc.returncode != 0:
        tail = " | ".join((err or out or "").strip().splitlines()[-4:])
        problem = f"torch.compile child exited with status {proc.returncode}: {tail[:400]}"
    return rows, problem


def child_rows(ctx: RunContext, workload: str, module: str, params: dict, expected: Sequence[tuple]) -> list:
    """Run a workload's torch.compile peers in one child process (fresh, private TORCHINDUCTOR_CACHE_DIR and
    TRITON_CACHE_DIR, so the first mode's compiles are cold), killed when the context's budget is spent.
    Every expected (size, config) that did not come back becomes an error row saying why (time budget,
    crash)."""
    import tempfile
    timeout = ctx.budget.remaining()
    order = [c for c, _ in COMPILE_MODES]
    configs = sorted({c for _, c in expected}, key=lambda c: order.index(c) if c in order else len(order))
    if timeout < MIN_CHILD_S:
        rows: list = []
        problem = f"time budget: {max(0.0, timeout):.0f} s left, a torch.compile child needs {MIN_CHILD_S:.0f} s"
    else:
        p = dict(params)
        p.update({"reps": ctx.reps, "warmup": ctx.warmup, "min_reps": ctx.min_reps, "quick": ctx.quick,
                  "device": ctx.device, "budget_s": timeout - 3.0, "configs": configs})
        ctx.log(f"{workload}: {' and '.join(configs)} in a child process (at most {timeout:.0f} s)")
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="gpuos-bench-compile-") as tmp:
            env = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"),
                   "TRITON_CACHE_DIR": os.path.join(tmp, "triton")}
            rows, problem = run_child(module, p, timeout, env=env)
        ctx.log(f"{workload}: compile child returned {len(rows)} rows in {time.perf_counter() - t0:.1f} s"
                + (f" ({problem})" if problem else ""))
    seen = {(r.get("size"), r.get("config")) for r in rows}
    rows += [error_row(workload, size, c, problem or "the compile child returned no row")
             for size, c in expected if (size, c) not in seen]
    for size, c in expected:
        ctx.advance(f"{workload} {size} {c}")
    return rows


def reset_dynamo() -> None:
    """Forget every compiled graph (each compile mode starts cold) and allow enough recompiles that no
    size silently falls back to eager."""
    import torch
    torch._dynamo.reset()
    try:
        torch._dynamo.config.recompile_limit = 64
    except Exception:  # older torch: cache_size_limit
        torch._dynamo.config.cache_size_limit = 64


def mark_static(*tensors) -> None:
    """Tell torch.compile(mode="reduce-overhead") that these inputs keep their address (weights, caches):
    its CUDA graphs then read them in place instead of copying them in on every replay."""
    import torch
    for t in tensors:
        torch._dynamo.mark_static_address(t)


class CompileCounters:
    """Context manager: graphs dynamo compiled, CUDA graphs cudagraph-trees recorded, and cudagraph
    skips (reduce-overhead falling back to no graphs) while it is open."""

    def __init__(self) -> None:
        self.recordings = 0
        self._before: dict = {}
        self._patched = None

    def _counts(self) -> dict:
        from torch._dynamo.utils import counters
        return {"graphs_compiled": counters["stats"]["unique_graphs"],
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}

    def __enter__(self) -> "CompileCounters":
        self._before = self._counts()
        try:
            from torch._inductor import cudagraph_trees as cgt
            orig = cgt.CUDAGraphTreeManager.record_function
            counter = self

            def record_function(mgr, *args, **kwargs):
                counter.recordings += 1
                return orig(mgr, *args, **kwargs)
            cgt.CUDAGraphTreeManager.record_function = record_function
            self._patched = (cgt.CUDAGraphTreeManager, orig)
        except Exception:  # internals moved: the recording count is then unknown
            self.recordings = None
        return self

    def __exit__(self, *exc) -> None:
        if self._patched is not None:
            cls, orig = self._patched
            cls.record_function = orig
        after = self._counts()
        self.fields = {k: after[k] - self._before.get(k, 0) for k in after}
        if self.recordings is not None:
            self.fields["cudagraph_recordings"] = self.recordings


def compile_sweep(ctx: RunContext, workload: str, sizes: Sequence[Any], make_case: Callable[[Any], Case],
                  target: Callable, prepare: Callable[[Case, Callable, str], Prepared],
                  emit: Callable[[dict], None], modes: Sequence[tuple] = COMPILE_MODES) -> None:
    """Child side: for each wanted (config, mode), within an equal share of the child's budget: dynamo reset,
    ``compiled = torch.compile(target, mode=)``, then every size (recompiling as torch.compile does by
    default: static first, dynamic shapes after a change). ``prepare(case, compiled, mode)`` returns the
    Prepared to measure. Emits each timing row (with graphs_compiled / cudagraph_recordings /
    cudagraph_skips / inductor_cache) and a ``compile_time_s`` value row: the first call minus one steady
    call, i.e. the compile (and CUDA-graph recording) cost at that size. The first mode compiles with cold
    caches; later modes find the graphs the earlier ones compiled in this process (inductor_cache "warm")."""
    import torch
    wanted = [(config, mode) for config, mode in modes if ctx.wants(config)]
    whole = ctx.budget
    for i, (config, mode) in enumerate(wanted):
        ctx.budget = whole.part(whole.remaining() / (len(wanted) - i))
        ctx.units_left = len(sizes)
        cache = "cold" if i == 0 else f"warm (after {wanted[0][0]} in this process)"
        reset_dynamo()
        compiled = torch.compile(target, mode=mode)
        first = True
        for size in sizes:
            try:
                case = make_case(size)
            except Exception as exc:
                emit(error_row(workload, size, config, f"inputs: {format_exc(exc, 300)}"))
                continue
            with CompileCounters() as cnt:
                row = measure_config(ctx, workload, case, config, lambda: prepare(case, compiled, mode),
                                     extra={"mode": mode, "inductor_cache": cache})
            row.update(cnt.fields)
            emit(row)
            ctx.advance(f"{workload} {case.size} {config}")
            if "error" not in row:
                compile_s = max(0.0, row["first_call_s"] - row["median_ms"] / 1e3)
                emit(value_row(workload, "compile_time_s", compile_s, "s", size=case.size, for_config=config,
                               first_size=first, first_call_s=row["first_call_s"], inductor_cache=cache,
                               **cnt.fields))
                first = False
            case = None
            release_memory(ctx.device)


# --------------------------------------------------------------------------------------------------
# progress display
# --------------------------------------------------------------------------------------------------
class Progress:
    """A progress display: rich or tqdm on a terminal when importable, else plain lines.

    ``kind``: "auto" (rich, then tqdm, on a TTY; plain otherwise), "rich", "tqdm" or "plain".
    ``log`` prints a line above the bar; ``advance`` moves the bar and names the current step.
    """

    def __init__(self, total: int, kind: str = "auto", desc: str = "benchmarks") -> None:
        self.total, self.done, self.kind = max(1, int(total)), 0, "plain"
        self._t0 = time.perf_counter()
        self._bar = None
        order = {"auto": ("rich", "tqdm") if sys.stdout.isatty() else (), "rich": ("rich",),
                 "tqdm": ("tqdm",), "plain": ()}[kind]
        for k in order:
            try:
                if k == "rich":
                    from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                               TextColumn, TimeElapsedColumn)
                    bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                       TimeElapsedColumn())
                    bar.start()
                    self._task = bar.add_task(desc, total=self.total)
                else:
                    from tqdm import tqdm
                    bar = tqdm(total=self.total, desc=desc, dynamic_ncols=True)
                self._bar, self.kind = bar, k
                break
            except ImportError:
                continue

    def log(self, msg: str) -> None:
        if self.kind == "rich":
            self._bar.console.print(msg, markup=False, highlight=False)
        elif self.kind == "tqdm":
            self._bar.write(msg)
        else:
            print(msg, flush=True)

    def advance(self, label: str, n: int = 1) -> None:
        self.done += n
        if self.kind == "rich":
            self._bar.update(self._task, advance=n, description=label)
        elif self.kind == "tqdm":
            self._bar.set_description_str(label)
            self._bar.update(n)
        else:
            print(f"[{self.done}/{self.total} {time.perf_counter() - self._t0:6.1f} s] {label}", flush=True)

    def close(self) -> None:
        if self.kind == "rich":
            self._bar.stop()
        elif self.kind == "tqdm":
            self._bar.close()


def run_standard_workload(ctx: RunContext, workload: str, module: str, sizes: Sequence[Any],
                          make_case: Callable[[Any], Case], setups: dict, params: dict,
                          save: Callable[[list], Any], in_process_share: float,
                          not_applicable: Optional[dict] = None) -> list:
    """The usual shape of a workload run: a row for each peer that does not apply, the in-process peers
    (``setups``) for every size within ``in_process_share`` of the budget, then the torch.compile peers
    in ``benchmarks.<module>``'s compile child with the rest. Returns the rows."""
    rows: list = [not_applicable_row(workload, c, why) for c, why in (not_applicable or {}).items()
                  if ctx.wants(c)]
    setups = dict(setups)
    if ctx.device != "cuda":
        for config in [c for c in setups if c == "cudagraph" or is_gpuos_config(c)]:
            setups.pop(config)
            if ctx.wants(config):
                rows.append(error_row(workload, None, config, "needs CUDA (this is a CPU debug run)"))
    whole = ctx.budget
    ctx.budget = whole.part(whole.remaining() * in_process_share)
    ctx.units_left = len(sizes) * sum(ctx.wants(c) for c in setups)
    try:
        peer_sweep(ctx, workload, sizes, make_case, setups, rows, lambda: save(rows))
    finally:
        ctx.budget = whole
    expected = [(size, c) for size in sizes for c, _ in COMPILE_MODES if ctx.wants(c)]
    if expected:
        rows += child_rows(ctx, workload, module, params, expected)
    return rows


def standard_units(n_sizes: int, configs: Iterable[str], ctx: RunContext) -> int:
    """Progress units of a standard workload: one per (size, wanted config), compile peers included."""
    return n_sizes * sum(ctx.wants(c) for c in list(configs) + [c for c, _ in COMPILE_MODES])


def scheduler_setup(ctx: RunContext, run: Callable[[Case], Any]) -> Callable[[Case], Prepared]:
    """Setup of the ``gpuos_scheduler`` peer: the eager ``run(case)`` inside one gpuos.scheduler_context()."""
    def setup(case: Case) -> Prepared:
        def fn():
            with ctx.scheduler():
                return run(case)
        return Prepared(fn)
    return setup


def standalone_main(workload: str, argv: Optional[Sequence[str]] = None) -> int:
    """``python benchmarks/bench_<x>.py [options]`` = ``python -m benchmarks --only <workload> [options]``."""
    from benchmarks import run_all
    return run_all.main(["--only", workload] + list(sys.argv[1:] if argv is None else argv))


# --------------------------------------------------------------------------------------------------
# reading result files (report.py, plots.py, run_all's summary)
# --------------------------------------------------------------------------------------------------
def load_result_docs(results_dir: Path = RESULTS_DIR, quick: bool = False) -> list:
    """[(path, doc)] of the result JSON files in ``results_dir`` (sorted by name): the ``*_quick.json`` ones
    when ``quick``, the others otherwise. Unreadable files are reported on stderr and left out."""
    docs = []
    for path in sorted(Path(results_dir).glob("*.json")):
        if path.name.endswith("_quick.json") != quick:
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
            docs.append((path, doc))
    return docs


def timed_rows(doc: dict) -> list:
    """The rows of a result file that carry a median time (and no error)."""
    return [r for r in doc.get("rows", []) if isinstance(r.get("median_ms"), (int, float)) and "error" not in r]


def group_key(row: dict) -> tuple:
    """Rows comparable with each other: same workload, size and op (W3 measures sum and softmax)."""
    return (row.get("workload"), row.get("size"), row.get("op"))


def gpuos_vs_best_peer(rows: Iterable[dict]) -> list:
    """Per (workload, size, op): the fastest correct GPUOS config against the fastest correct peer.

    Returns dicts with workload, size, op, gpuos (config), gpuos_ms, peer (config), peer_ms and
    ratio = peer_ms / gpuos_ms (> 1: GPUOS is faster). Groups without both sides are left out."""
    groups: dict = {}
    for r in rows:
        if "error" in r or not isinstance(r.get("median_ms"), (int, float)) or r.get("correct") is not True:
            continue
        side = "gpuos" if is_gpuos_config(r["config"]) else "peer"
        best = groups.setdefault(group_key(r), {})
        if side not in best or r["median_ms"] < best[side]["median_ms"]:
            best[side] = r
    out = []
    for (workload, size, op), best in groups.items():
        if "gpuos" in best and "peer" in best and best["gpuos"]["median_ms"] > 0:
            g, p = best["gpuos"], best["peer"]
            out.append({"workload": workload, "size": size, "op": op, "gpuos": g["config"], "gpuos_ms": g["median_ms"],
                        "peer": p["config"], "peer_ms": p["median_ms"], "ratio": p["median_ms"] / g["median_ms"]})
    return out


def standard_hooks(workload: str, module: str, sizes: Callable[[dict], Sequence[Any]],
                   make_case: Callable[[Any, dict, str], Case], make_setups: Callable[[RunContext], dict],
                   target: Callable, prepare: Callable[[Case, Callable, str, RunContext], Prepared],
                   in_process: Sequence[str], in_process_share: float, not_applicable: Optional[dict] = None,
                   extra_rows: Optional[Callable[[list], list]] = None) -> tuple:
    """The suite hooks of a workload module built from its parts: (run_workload, compile_child, suite_units).

    ``sizes(params)`` lists the sizes, ``make_case(size, params, device)`` builds one, ``make_setups(ctx)``
    gives the in-process peers (named ``in_process``), ``target`` is what torch.compile compiles and
    ``prepare(case, compiled, mode, ctx)`` how a compiled peer runs; ``extra_rows(rows)`` may derive value
    rows at the end.
    """
    def run_workload(ctx: RunContext, params: dict, save: Callable[[list], Any]) -> list:
        rows = run_standard_workload(ctx, workload, module, sizes(params),
                                     lambda size: make_case(size, params, ctx.device), make_setups(ctx), params,
                                     save, in_process_share, not_applicable)
        return rows + (extra_rows(rows) if extra_rows else [])

    def compile_child(ctx: RunContext, params: dict, emit: Callable[[dict], None]) -> None:
        compile_sweep(ctx, workload, sizes(params), lambda size: make_case(size, params, ctx.device), target,
                      lambda case, compiled, mode: prepare(case, compiled, mode, ctx), emit)

    def suite_units(params: dict, ctx: RunContext) -> int:
        return standard_units(len(sizes(params)), in_process, ctx)

    return run_workload, compile_child, suite_units


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    """num / den, or None when either is missing or den is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return num / den


def incorrect(row: Optional[dict]) -> bool:
    """A row whose correctness check failed."""
    return row is not None and row.get("correct") is False
