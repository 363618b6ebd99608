"""Small helpers shared by the GPUOS benchmarks.

Used by bench_microbatch.py (and later bench_reduce.py, bench_scheduler.py):

* ``env_metadata(name)``      -- the header fields of a result file (device, driver, torch, gpuos, date)
* ``require_cuda(name)``      -- exit 0 with a clear message when there is no CUDA GPU
* ``import_gpuos()``          -- the gpuos_ext module (or the gpuos package) or the reason it is missing
* ``time_reps(fn, ...)``      -- warm-up + timed reps, host wall clock around work + sync
* ``timing_row / value_row / error_row`` -- rows in the BENCH_SCHEMA.md shape
* ``write_results(name, meta, rows)`` -- writes benchmarks/results/<name>.json atomically
* ``print_table(...)``        -- rich table when rich is importable, plain aligned text otherwise

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
    """
    samples_ms: list = field(default_factory=list)
    host_ms: list = field(default_factory=list)

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
    def reps(self) -> int:
        return len(self.samples_ms)


def cuda_sync() -> None:
    import torch
    torch.cuda.synchronize()


def time_reps(fn: Callable[[], Any], reps: int = 20, warmup: int = 3,
              sync: Optional[Callable[[], None]] = None, disable_gc: bool = True) -> Timing:
    """Warm up, then time ``reps`` calls of ``fn`` end to end on the host.

    Each rep: sync(); t0 = perf_counter(); r = fn(); t1; sync(); t2.  ``samples_ms`` = t2 - t0,
    ``host_ms`` = t1 - t0. Whatever ``fn`` returns is kept alive until after the sync (so freeing
    eager outputs is not timed) and dropped before the next rep. Python's GC is disabled during the
    timed reps (collected before) so a collection does not land inside one rep.
    """
    sync = sync or cuda_sync
    for _ in range(max(0, warmup)):
        r = fn()
        sync()
        del r
    gc.collect()
    was_enabled = gc.isenabled()
    if disable_gc:
        gc.disable()
    t = Timing()
    try:
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            r = fn()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            del r
            t.samples_ms.append((t2 - t0) * 1e3)
            t.host_ms.append((t1 - t0) * 1e3)
    finally:
        if disable_gc and was_enabled:
            gc.enable()
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
