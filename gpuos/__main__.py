"""``python -m gpuos``: what GPUOS finds on this machine, and whether it works.

    python -m gpuos              # torch / CUDA build, driver, GPUs, NVRTC, JIT cache, build torch, settings
    python -m gpuos --selftest   # + checks that run: NVRTC compiles the worker; on a GPU: the explicit API,
                                 #   the scheduler and a reduction against eager
    python -m gpuos --warm       # fill the JIT cache for this machine's GPUs (or --arch sm_90 ...): the worker
                                 #   compiled whole (every process then starts on it) and its linkable object

Exit status: 0 when everything GPUOS needs is there (and every self-test passed), 1 otherwise; each problem is
printed with its fix. No GPU is reported, not a failure: the CPU tests and NVRTC compiles work without one.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

PROBLEMS: list = []


def line(key: str, value) -> None:
    print(f"  {key:<22s} {value}")


def problem(what: str, fix: str) -> None:
    PROBLEMS.append(what)
    print(f"  PROBLEM: {what}\n           fix: {fix}")


def _dir_size(path: Path) -> tuple:
    n = size = 0
    for p in path.rglob("*"):
        if p.is_file():
            n += 1
            size += p.stat().st_size
    return n, size


def report(archs=()) -> tuple:
    """Print the environment; returns (gpuos_ext or None, list of (index, name, arch)). `archs`: also say whether
    the JIT cache holds their base images (the GPUs' archs are always checked)."""
    import torch
    print("GPUOS doctor")
    line("python", sys.version.split()[0])
    line("torch", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'none, a CPU build'})")
    line("CUDA_MODULE_LOADING", os.environ.get("CUDA_MODULE_LOADING", "(unset)"))
    try:
        import gpuos_ext as gx
    except ImportError as e:
        problem(f"the GPUOS extension does not load: {e}",
                "pip install --no-build-isolation . from the GPUOS source tree")
        return None, []
    from gpuos import __version__
    line("gpuos", f"{__version__} (extension {sys.modules['_gpuos_C'].__file__})")
    line("built against torch", gx.__build_torch__)
    if gx.__version__ != __version__:
        problem(f"the extension is version {gx.__version__}, the Python package {__version__} (a stale build)",
                "rebuild: pip install --no-build-isolation --force-reinstall --no-deps .")
    try:
        line("NVRTC", f"{'.'.join(map(str, gx.nvrtc_version()))} at {gx.nvrtc_path()}")
    except Exception as e:  # noqa: BLE001 -- reported
        problem(f"NVRTC not found: {str(e)[:300]}",
                "pip install nvidia-cuda-nvrtc, or set CUDA_HOME / GPUOS_NVRTC_PATH to a CUDA 12+ toolkit")
    li = gx.link_info()
    if li["mode"] == "linked":
        line("nvJitLink", f"{li['version']} at {li['library']} (a new op compiles alone and links: issue #18)")
    elif "GPUOS_LINK=0" in li["reason"]:
        line("nvJitLink", "not used (GPUOS_LINK=0): every generation is a whole NVRTC compile")
    else:
        problem(f"generations compile whole (seconds per injected op): {li['reason'][:300]}",
                "pip install nvidia-nvjitlink (the version of nvidia-cuda-nvrtc), or set GPUOS_NVJITLINK_PATH")
    cache = Path(gx.jit_cache_dir())
    n, size = _dir_size(cache) if cache.is_dir() else (0, 0)
    bound = int(gx.config().get("GPUOS_CACHE_MAX_MB", "0"))
    line("JIT cache", f"{cache} ({n} files, {size / 2**20:.1f} MiB"
         f"{f' of at most {bound} MiB' if bound else ', no bound'}; GPUOS_CACHE_DIR moves it, GPUOS_CACHE_MAX_MB "
         f"bounds it)")
    if li["mode"] == "linked":
        wb = gx.whole_build_info()
        if not wb["enabled"]:
            line("whole build", "off (GPUOS_WHOLE_BUILD=0): generations run linked")
        elif not gx.jit_cache_dir():
            problem("the background whole build has no JIT cache dir to receive its image",
                    "set GPUOS_CACHE_DIR to a writable directory")
        else:
            line("whole build", "on: each linked generation (generation 0 once per machine, op changes, hot programs' "
                 "tier-2 code) is compiled whole by a helper process; its image stays in the JIT cache")
    gpus = _gpus(torch, gx)
    if li["mode"] == "linked" and gx.whole_build_info()["enabled"] and gx.jit_cache_dir():
        for arch in dict.fromkeys(list(archs) + [g[2] for g in gpus]):
            try:
                cached = gx.jit_base_cached(arch)
            except ValueError as e:  # a setting the compile options refuse (GPUOS_FAST_COMPILE)
                problem(f"base image {arch}: {e}", "fix the setting it names")
                continue
            line(f"base image {arch}", "in the JIT cache: every process's generation 0 starts whole"
                 if cached else "not in the JIT cache yet: `python -m gpuos --warm` compiles it "
                 "(~15-30 s, once per machine and build); until then each process starts linked")
    settings = {k: v for k, v in gx.config().items() if k in os.environ}
    line("GPUOS_* settings", ", ".join(f"{k}={v}" for k, v in settings.items()) or "(defaults)")
    return gx, gpus


def _gpus(torch, gx) -> list:
    """Print the driver and the GPUs; returns [(index, name, arch)]."""
    gpus = []
    if torch.cuda.is_available():
        try:
            line("CUDA driver", ".".join(map(str, gx.driver_version())))
        except Exception as e:  # noqa: BLE001 -- reported
            problem(f"the CUDA driver API does not answer: {str(e)[:200]}", "check the NVIDIA driver install")
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            arch = f"sm_{p.major}{p.minor}"
            try:
                jit = gx.jit_arch_for(p.major, p.minor)  # what the runtime compiles for it
            except Exception:  # noqa: BLE001 -- no NVRTC: reported above
                jit = arch
            gpus.append((i, p.name, jit))
            line(f"GPU {i}", f"{p.name}, {arch}{'' if jit == arch else f' (compiled as {jit})'}, "
                 f"{p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
            if p.major < 8:  # the worker's bf16 conversions and mma.sync m16n8k16 need sm_80 (ptxas)
                problem(f"GPU {i} ({p.name}, {arch}) is older than Ampere",
                        "GPUOS needs sm_80 or newer (Ampere, Ada, Hopper, Blackwell)")
    else:
        line("GPU", "none visible to torch (GPUOS runs its CPU tests and NVRTC compiles only)")
    return gpus


def warm(gx, archs) -> None:
    """Fill the JIT cache for each arch: the base image (generation 0 compiled whole) and the linkable worker."""
    print("Warm the JIT cache")
    if not archs:
        problem("no arch to warm: no GPU is visible", "name one: python -m gpuos --warm --arch sm_90")
    for arch in archs:
        def one(arch=arch):
            w = gx.jit_warm(arch)
            base = "was cached" if w["base_was_cached"] else f"compiled in {w['base_s']:.1f} s"
            obj = f", linkable worker object {w['object_s']:.1f} s" if w["linked"] else ""
            return f"base image {base}{obj}"
        check(f"{arch}", one)


def check(name: str, fn) -> bool:
    t0 = time.perf_counter()
    try:
        detail = fn()
    except Exception as e:  # noqa: BLE001 -- reported
        print(f"  FAIL  {name}: {type(e).__name__}: {str(e)[:400]}")
        PROBLEMS.append(name)
        return False
    print(f"  pass  {name} ({time.perf_counter() - t0:.2f} s){': ' + detail if detail else ''}")
    return True


def selftest(gx, gpus) -> None:
    import torch
    print("Self-test")
    arch = gpus[0][2] if gpus else gx.jit_newest_arch()  # no GPU: PTX for the newest arch NVRTC knows
    check(f"NVRTC compiles the worker for {arch}", lambda: f"{len(gx.jit_compile(arch)):,} bytes")

    def cpu_numerics():
        x, y = torch.randn(1000), torch.randn(1000)
        out = torch.empty(1000)
        gx._testing.cpu_apply("add", [x, y], out, 1.0, 0.0)
        torch.testing.assert_close(out, x + y)
    check("the device functors on the CPU (add)", cpu_numerics)
    if not gpus:
        print("  skip  GPU checks: no GPU")
        return
    import gpuos
    a, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")

    def explicit():
        gpuos.init()
        out = torch.empty_like(a)
        gpuos.submit_add(a, b, out)
        gpuos.flush(sync=True)
        torch.testing.assert_close(out, a + b, rtol=0, atol=0)
        return ", ".join(f"{v}" for v in gpuos.runtime_info().values())

    def scheduler():
        with torch.no_grad(), gpuos.scheduler_context():
            y = torch.tanh(a) * 0.5 + b
        torch.testing.assert_close(y, torch.tanh(a) * 0.5 + b, rtol=1e-5, atol=1e-6)
        return f"{gpuos.stats()['ops_intercepted']} ops intercepted"

    def reduction():
        x = torch.randn(64, 512, device="cuda")
        out = torch.empty_like(x)
        gpuos.submit_reduce("softmax", x, out)
        gpuos.flush(sync=True)
        torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)

    if check("explicit API: submit_add + flush(sync=True)", explicit):
        check("scheduler_context: tanh(a) * 0.5 + b", scheduler)
        check("submit_reduce: softmax of 64 x 512", reduction)
        check("shutdown", gpuos.shutdown)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuos", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--selftest", action="store_true", help="also run checks (NVRTC compile; GPU: API, scheduler)")
    p.add_argument("--warm", action="store_true",
                   help="compile the worker whole for this machine's GPUs into the JIT cache (~40-90 s per arch)")
    p.add_argument("--arch", nargs="+", default=[], metavar="ARCH",
                   help="with --warm: these archs (sm_80, sm_90, ...) instead of the visible GPUs'")
    a = p.parse_args(argv)
    if a.arch and not a.warm:
        p.error("--arch goes with --warm")
    bad = [x for x in a.arch if not re.fullmatch(r"(sm|compute)_\d+", x)]
    if bad:
        p.error(f"--arch {' '.join(bad)}: name archs as NVRTC does, e.g. sm_80, sm_90 or compute_90 (PTX)")
    gx, gpus = report(a.arch)
    if a.warm and gx is not None:
        warm(gx, a.arch or list(dict.fromkeys(g[2] for g in gpus)))
    if a.selftest and gx is not None:
        selftest(gx, gpus)
    print(f"Result: {'OK' if not PROBLEMS else f'{len(PROBLEMS)} problem(s): ' + '; '.join(PROBLEMS)}")
    return 0 if not PROBLEMS else 1


if __name__ == "__main__":
    sys.exit(main())
