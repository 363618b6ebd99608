"""Where the benchmarks run: paths, device, driver, torch and gpuos versions, the no-GPU exits, the watchdog.

Imports nothing from the harness (the bottom layer); torch is imported inside the functions that need it, so
report.py and plots.py run without torch.
"""
from __future__ import annotations

import datetime as _dt
import faulthandler
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent.parent  # benchmarks/
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"


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


def env_line(meta: dict) -> str:
    """The log line naming a run's environment: device | driver | torch | gpuos."""
    return f"{meta['device']} | driver {meta['driver']} | torch {meta['torch']} | gpuos {meta['gpuos']}"


def cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:
        return False


def no_cuda_reason() -> Optional[str]:
    """None when a CUDA GPU is usable, else why not (torch's version and CUDA build, or the import error)."""
    if cuda_available():
        return None
    try:
        import torch
        return (f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'}) reports "
                f"torch.cuda.is_available() == False")
    except Exception as exc:  # pragma: no cover - torch missing
        return f"torch could not be imported ({exc})"


def require_cuda(benchmark: str) -> None:
    """Exit with status 0 and a clear message when no CUDA GPU is usable."""
    why = no_cuda_reason()
    if why is None:
        return
    print(f"[{benchmark}] no CUDA GPU available: {why}. Nothing to benchmark; "
          f"run this on a machine with an NVIDIA GPU. (exit 0)")
    sys.exit(0)


def skip_without_cuda(script: str) -> bool:
    """True (after saying so) when there is no CUDA GPU: the value-row scripts then measure nothing, exit 0."""
    if cuda_available():
        return False
    print(f"{script}: no CUDA GPU here; nothing measured.")
    return True


def start_watchdog(seconds: Optional[float] = None) -> None:
    """faulthandler on; with ``seconds`` > 0, dump every thread's stack and exit if the run is still going then."""
    faulthandler.enable()
    if seconds and seconds > 0:
        faulthandler.dump_traceback_later(seconds, exit=True)


def ensure_repo_on_path() -> None:
    """Put the repository root on sys.path so an in-place build of gpuos_ext / the gpuos package imports."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)
