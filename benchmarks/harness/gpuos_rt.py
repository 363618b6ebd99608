"""The GPUOS runtime as the benchmarks use it: importing it (extension or package), (re)initialising it,
its counters and their deltas, and telling when it is unusable.

Imports: env, rows.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .env import ensure_repo_on_path
from .rows import format_exc


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


def import_gpuos_reduce():
    """(module, submit_reduce, None) or (None, None, reason).

    ``module`` provides flush/init/shutdown/stats (gpuos_ext preferred); ``submit_reduce`` is taken from
    gpuos_ext, else from the gpuos package (both share one runtime).
    """
    mod, err = import_gpuos()
    if mod is None:
        return None, None, err
    fn = getattr(mod, "submit_reduce", None)
    if fn is None:
        try:
            import gpuos as pkg  # noqa: WPS433
            fn = getattr(pkg, "submit_reduce", None)
        except Exception as exc:
            return None, None, (f"{mod.__name__} has no submit_reduce and import gpuos failed: "
                                f"{format_exc(exc, 200)}")
    if fn is None:
        return None, None, (f"{mod.__name__} (and the gpuos package) have no submit_reduce: the issue-3 "
                            f"operator library is not built into this gpuos")
    return mod, fn, None


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


def init_gpuos(mod, err: Optional[str], capacity: Optional[int]) -> tuple:
    """(mod, None) after gpuos_reinit(mod, capacity), or (None, why): ``err`` when ``mod`` did not import,
    "init failed: ..." when the init raised."""
    if mod is None:
        return None, err
    try:
        gpuos_reinit(mod, capacity)
    except Exception as exc:
        return None, f"init failed: {format_exc(exc, 300)}"
    return mod, None


def gpuos_unavailable(config: str, submit_configs: Sequence[str], mod, mod_err: Optional[str],
                      ctx: Any) -> Optional[str]:
    """Why ``config`` cannot run, or None: the submit-API configs need ``mod``, gpuos_scheduler needs the
    gpuos package of ``ctx`` (a RunContext)."""
    if config in submit_configs and mod is None:
        return str(mod_err)
    if config == "gpuos_scheduler" and ctx.gpuos is None:
        return str(ctx.gpuos_err)
    return None


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


def add_stats_delta(row: dict, before: Optional[dict], mod) -> None:
    """row["stats_delta"]: the runtime's counters since ``before`` (nothing when ``before`` is None)."""
    if before is None:
        return
    d = stats_delta(before, gpuos_stats(mod))
    if d is not None:
        row["stats_delta"] = d


def is_fatal_gpuos_error(exc: BaseException) -> bool:
    """Errors after which the runtime is probably unusable (timeouts, CUDA errors): skip later gpuos rows."""
    if isinstance(exc, (TypeError, ValueError, NotImplementedError, AttributeError)):
        return False
    names = {k.__name__ for k in type(exc).__mro__}
    msg = str(exc).lower()
    return bool(names & {"GpuosError", "CudaError"}) or "timeout" in msg or "timed out" in msg \
        or "illegal" in msg or "cuda error" in msg


def check_one_batch(ext, before: dict) -> None:
    """Only the exit flush may have published since ``before`` (ext.sched_stats()["flushes_by_cause"]):
    else events around the context's exit timed a part of the work only."""
    causes = ext.sched_stats()["flushes_by_cause"]
    extra = {k: v - before.get(k, 0) for k, v in causes.items() if k != "exit" and v != before.get(k, 0)}
    if extra:
        raise RuntimeError(f"the loop was published in several batches ({extra}): raise the scheduler capacity")
