"""The ``gpuos`` logger and the profiler ranges.

Logger: ``logging.getLogger("gpuos")``; ``GPUOS_LOG=INFO`` (or DEBUG, WARNING, ...) sets its level and prints to
stderr. What it says: runtime start-up and the worker's NVRTC compile with its duration (a compile of a second or
more is a WARNING, once per process: the first run of a build on a machine), each aten op the scheduler runs
eagerly, once per (op, reason) (INFO; ``gpuos.stats()["fallback_ops"]`` counts them all), and the handovers and
background NVRTC compiles seen at a scheduler context's exit or a gpuos.flush (INFO).

Profiler: while a ``torch.profiler`` (or ``torch.autograd.profiler``, incl. ``emit_nvtx`` for Nsight) is active,
GPUOS flushes run inside ``record_function`` ranges named ``gpuos.flush[<cause>]``, so GPUOS work shows in a
trace next to PyTorch's ops. No cost when no profiler runs (one flag read).
"""
from __future__ import annotations

import logging
import os
import threading
import time

import torch

logger = logging.getLogger("gpuos")
if os.environ.get("GPUOS_LOG"):
    logging.basicConfig()
    logger.setLevel(os.environ["GPUOS_LOG"].upper())

_seen_fallbacks: set = set()
_seen_lock = threading.Lock()
_last_counts: dict = {}


def start_runtime(ext, **kwargs) -> None:
    """``ext.init(**kwargs)``, saying what it cost when it starts a runtime (an NVRTC compile in particular)."""
    if ext.is_initialized():
        ext.init(**kwargs)
        return
    if torch.cuda.is_available():
        logger.info("starting the GPUOS runtime on %s (the first run of this build on a machine compiles the "
                    "worker with NVRTC)", torch.cuda.get_device_name())
    before = ext.stats().get("jit_compiles", 0)
    t0 = time.perf_counter()
    note_link_mode(ext)
    ext.init(**kwargs)
    dt = time.perf_counter() - t0
    compiles = ext.stats().get("jit_compiles", 0) - before
    if compiles:
        logger.log(logging.WARNING if dt >= 1.0 else logging.INFO,
                   "compiled the GPUOS worker with NVRTC in %.1f s (first run of this build on this machine; later "
                   "runs load it from %s)", dt, ext.jit_cache_dir())
    else:
        logger.info("GPUOS runtime started in %.3f s (worker loaded from the JIT cache)", dt)


_link_noted = False


def note_link_mode(ext) -> None:
    """Say once per process how generations are built (issue #18): linked from cached objects (an injection costs
    its own small compile and a link), or whole NVRTC compiles (seconds per injection) and why: a WARNING when
    nvJitLink is missing or too old, INFO when GPUOS_LINK=0 chose it."""
    global _link_noted
    if _link_noted:
        return
    _link_noted = True
    info = ext.link_info()
    if info["mode"] == "linked":
        logger.info("generations link cached objects with nvJitLink %s (%s)", info["version"], info["library"])
        return
    off = "GPUOS_LINK=0" in info["reason"] or "set_link_override" in info["reason"]
    logger.log(logging.INFO if off else logging.WARNING,
               "every generation (injected op, installed slot, tier-2 code) is a whole NVRTC compile: %s",
               info["reason"])


def note_fallback(func, reason: str) -> None:
    """An aten op the scheduler ran eagerly: logged once per (op, reason) when INFO is enabled."""
    if not logger.isEnabledFor(logging.INFO):
        return
    key = (func, reason)
    with _seen_lock:
        if key in _seen_fallbacks:
            return
        _seen_fallbacks.add(key)
    logger.info("scheduler: %s runs eagerly (%s); logged once, gpuos.stats()['fallback_ops'] counts every call",
                func, reason)


def note_runtime_events(ext) -> None:
    """When INFO is enabled: log the handovers and NVRTC compiles (tier-2 code, injected ops) since the last call.
    Called at a scheduler context's exit and at gpuos.flush; costs one flag read otherwise."""
    if not logger.isEnabledFor(logging.INFO):
        return
    st = ext.stats()
    now = {k: st.get(k, 0) for k in ("handovers", "idle_adoptions", "busy_adoptions", "jit_compiles")}
    with _seen_lock:
        before = dict(_last_counts) or now
        _last_counts.update(now)
    if now["jit_compiles"] > before["jit_compiles"]:
        logger.info("%d NVRTC compile(s) finished (tier-2 code of hot fused chains or injected ops)",
                    now["jit_compiles"] - before["jit_compiles"])
    if now["handovers"] > before["handovers"]:
        logger.info("%d handover(s) to a new worker generation (%d while no worker was resident, %d from a resident "
                    "worker once the published work was done)", now["handovers"] - before["handovers"],
                    now["idle_adoptions"] - before["idle_adoptions"], now["busy_adoptions"] - before["busy_adoptions"])


def traced(cause: str, fn, *args):
    """``fn(*args)``, inside a ``gpuos.flush[<cause>]`` range of the profiler's trace while one records (checked
    with one flag read: no cost otherwise)."""
    if not torch.autograd.profiler._is_profiler_enabled:
        return fn(*args)
    with torch.autograd.profiler.record_function(f"gpuos.flush[{cause}]"):
        return fn(*args)
