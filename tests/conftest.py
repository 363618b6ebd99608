"""Shared pytest configuration for the GPUOS test suite.

* marker ``gpu``: the test needs a CUDA GPU; it is skipped (reason "no CUDA GPU") without one.
* fixture ``requires_gpu``: same skip, usable from any test as a fixture.
* fixture ``requires_nvrtc``: skips when ``gpuos_ext.nvrtc_version()`` raises ``gpuos.CudaError``;
  returns the (major, minor) NVRTC version.
* fixture ``rt``: initialises the runtime, yields the ``gpuos_ext`` module, and at teardown flushes
  with ``sync=True`` (and synchronises torch) so a test's GPU work cannot leak into the next test.
* every ``gpu`` test runs under a faulthandler watchdog: if it hangs for longer than
  ``GPUOS_TEST_WATCHDOG_S`` seconds (default 120; ``@pytest.mark.watchdog(s)`` overrides) all
  thread stacks are dumped and the process exits with a non-zero status, so a hang becomes a
  failure instead of an eternal wait.
"""

import atexit
import faulthandler
import os
import shutil
import sys
import tempfile

import pytest

os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")  # as `import gpuos` does, before torch initialises CUDA
import torch  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    # `python -m pytest` from the repo root already has it; plain `pytest` may not.
    sys.path.append(REPO_ROOT)

# Never let the test suite read or write the user's real JIT cache (~/.cache/gpuos) unless the
# caller chose a directory explicitly. Must happen before gpuos_ext is imported.
if "GPUOS_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="gpuos-test-cache-")
    os.environ["GPUOS_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)

# No background whole builds (csrc/inject/whole.h) unless a test asks for one: tests count and compare
# generations, and a whole build adds one asynchronously, tens of seconds after its tier-2 generation
# (tests/test_cpu_whole.py and test_gpu_link.py's whole-build test turn it on in their child processes).
os.environ.setdefault("GPUOS_WHOLE_BUILD", "0")

HAS_GPU = torch.cuda.is_available()
WATCHDOG_S = float(os.environ.get("GPUOS_TEST_WATCHDOG_S", "120"))

try:  # pytest-timeout is present on the GPU machine, maybe not here; we never depend on it.
    import pytest_timeout  # noqa: F401

    HAS_PYTEST_TIMEOUT = True
except ImportError:
    HAS_PYTEST_TIMEOUT = False

#: decorator form, for tests outside the gpu-marked module
requires_gpu_mark = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: test needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "watchdog(seconds): per-test hang watchdog for gpu tests "
                                       "(default GPUOS_TEST_WATCHDOG_S or 120 s)")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def requires_gpu():
    if not HAS_GPU:
        pytest.skip("no CUDA GPU")


@pytest.fixture(scope="session")
def requires_nvrtc():
    import gpuos
    import gpuos_ext

    try:
        return gpuos_ext.nvrtc_version()
    except gpuos.CudaError as e:
        pytest.skip(f"NVRTC not available: {e}")


@pytest.fixture(autouse=True)
def _gpu_watchdog(request):
    """Turn a hang in a gpu test into a process exit with stack dump (a failure)."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    m = request.node.get_closest_marker("watchdog")
    seconds = float(m.args[0]) if m is not None else WATCHDOG_S
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _sdpa_backends_restored(request):
    """GPU tests see the SDPA backends as they were before the test: benchmarks' make_case switches cuDNN SDPA off
    for the process (bench_models), which changes the overload the dispatcher hands the scheduler in every later
    test (test_gpu_rewrite's HF Llama counted no GQA reads after test_gpu_programs' HF cases, fourteenth session)."""
    if request.node.get_closest_marker("gpu") is None or not torch.cuda.is_available():
        yield
        return
    b = torch.backends.cuda
    saved = (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled())
    yield
    b.enable_cudnn_sdp(saved[0])
    b.enable_flash_sdp(saved[1])
    b.enable_mem_efficient_sdp(saved[2])
    b.enable_math_sdp(saved[3])


@pytest.fixture
def rt(requires_gpu):
    """The initialised runtime (the gpuos_ext module). Flushes and syncs at teardown."""
    import gpuos_ext

    gpuos_ext.init()
    assert gpuos_ext.is_initialized()
    yield gpuos_ext
    if gpuos_ext.is_initialized():
        gpuos_ext.flush(sync=True)
    torch.cuda.synchronize()


@pytest.fixture
def worker_matmul():
    """The scheduler's worker matmul on (gpuos.set_worker_matmul(True)) for the test, as it was afterwards."""
    import gpuos

    was = gpuos.worker_matmul_enabled()
    gpuos.set_worker_matmul(True)
    yield
    gpuos.set_worker_matmul(was)


_FAIL_LOG = os.environ.get("GPUOS_FAIL_LOG")


def pytest_runtest_logreport(report):
    """With GPUOS_FAIL_LOG set, each failure is appended to that file as it happens (with its duration), so a run
    killed by an outer timeout still shows what failed and why; every test's duration goes to <file>.durations."""
    if not _FAIL_LOG:
        return
    if report.when == "call" or report.failed:
        with open(_FAIL_LOG + ".durations", "a") as f:
            f.write(f"{report.duration:9.3f} {report.outcome:8} {report.nodeid} ({report.when})\n")
    if report.failed:
        with open(_FAIL_LOG, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")
