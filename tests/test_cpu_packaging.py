"""Packaging and the user-facing edges, without a GPU: `import gpuos_ext` first (before torch) in a fresh
interpreter, the build-torch check, `python -m gpuos` (doctor, self-test), one version, exception names, the
re-exports, the logger."""
import logging
import os
import re
import subprocess
import sys

import pytest

from _helpers import REPO_ROOT, describe, run_python

import gpuos
import gpuos_ext


def test_import_gpuos_ext_first_sets_eager_loading_and_keeps_a_user_choice():
    code = ("import os\nos.environ.pop('CUDA_MODULE_LOADING', None)\nimport gpuos_ext, sys\n"
            "print(os.environ['CUDA_MODULE_LOADING'], 'torch' in sys.modules, gpuos_ext.__version__)")
    out = run_python(code)
    assert out.returncode == 0, describe(out)
    assert out.stdout.split() == ["EAGER", "True", gpuos.__version__]
    out = run_python("import os\nimport gpuos_ext\nprint(os.environ['CUDA_MODULE_LOADING'])",
                     env_extra={"CUDA_MODULE_LOADING": "LAZY"})
    assert out.returncode == 0 and out.stdout.strip() == "LAZY", describe(out)


def test_torch_version_mismatch_raises_with_the_fix():
    out = run_python("import torch\ntorch.__version__ = '1.0.0'\nimport gpuos_ext")
    assert out.returncode != 0
    msg = out.stderr.strip().splitlines()[-1]
    assert msg.startswith("ImportError: gpuos_ext was built against torch "), msg
    assert "torch 1.0.0 is installed" in msg and "--no-build-isolation --force-reinstall" in msg


def _setup_check_build_torch(build_torch_version):
    """setup.py's check_build_torch, compiled from its source with `torch` standing for the build environment's."""
    import ast
    import types
    with open(os.path.join(REPO_ROOT, "setup.py")) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check_build_torch")
    ns = {"os": os, "torch": types.SimpleNamespace(__version__=build_torch_version)}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "setup.py", "exec"), ns)
    return ns["check_build_torch"]


def test_isolated_build_against_another_torch_is_refused():
    """pip's isolated build environment may bring another torch than the installed one: setup.py refuses to build
    against it (the extension is not ABI-stable across torch versions) and names the fix; the same torch passes."""
    import torch
    with pytest.raises(SystemExit, match=r"this build sees torch 0\.0\.fake .* but torch " + re.escape(torch.__version__) +
                       r" is installed.*pip install --no-build-isolation \."):
        _setup_check_build_torch("0.0.fake")()
    _setup_check_build_torch(torch.__version__)()  # the installed torch itself: no error


def test_one_version_and_the_build_torch():
    import torch
    from gpuos._version import __version__
    assert gpuos.__version__ == gpuos_ext.__version__ == __version__
    assert gpuos_ext.__build_torch__.split("+")[0] == torch.__version__.split("+")[0]
    text = open(os.path.join(REPO_ROOT, "pyproject.toml")).read()
    assert re.search(r'^\[project\]$', text, re.M) and 'name = "gpuos"' in text
    assert 'requires-python = ">=3.10"' in text and '"torch' in text
    assert os.path.isfile(os.path.join(REPO_ROOT, "LICENSE"))


def test_errors_and_reexports_are_gpuos_names():
    assert gpuos.CudaError.__module__ == "gpuos" and gpuos.CudaError.__name__ == "CudaError"
    assert issubclass(gpuos.CompileError, gpuos.GpuosError) and gpuos.CudaError is gpuos_ext.CudaError
    for name in ("set_fusion", "set_specialize_after", "yield_worker", "pending", "link_info", "clear_index_faults",
                 "submit_attention", "set_worker_attention", "worker_attention_enabled", "submit_matmul"):
        assert getattr(gpuos, name) is getattr(gpuos_ext, name), name
        assert name in gpuos.__all__


def test_doctor_reports_and_exits_zero():
    out = subprocess.run([sys.executable, "-m", "gpuos"], capture_output=True, text=True, timeout=120,
                         cwd=REPO_ROOT)
    assert out.returncode == 0, describe(out)
    for key in ("torch", "gpuos", "built against torch", "NVRTC", "JIT cache", "Result: OK"):
        assert key in out.stdout, (key, out.stdout)


def test_doctor_selftest_compiles_the_worker():
    import torch
    if torch.cuda.is_available():
        pytest.skip("the GPU self-test runs in tests/test_gpu_runtime.py")
    out = subprocess.run([sys.executable, "-m", "gpuos", "--selftest"], capture_output=True, text=True,
                         timeout=300, cwd=REPO_ROOT)
    assert out.returncode == 0, describe(out)
    arch = gpuos_ext.jit_newest_arch()
    assert arch.startswith("compute_")
    assert re.search(rf"pass  NVRTC compiles the worker for {arch} \(.*bytes", out.stdout), out.stdout
    assert "pass  the device functors on the CPU" in out.stdout and "skip  GPU checks: no GPU" in out.stdout


def test_fallback_logged_once_per_op_and_reason(caplog):
    from gpuos import _log
    caplog.set_level(logging.INFO, logger="gpuos")
    _log._seen_fallbacks.clear()
    for _ in range(3):
        _log.note_fallback("aten.mm.default", "unsupported_op")
    _log.note_fallback("aten.mm.default", "size")
    msgs = [r.getMessage() for r in caplog.records if r.name == "gpuos"]
    assert len(msgs) == 2 and all("aten.mm.default runs eagerly" in m for m in msgs), msgs


def test_start_runtime_logs_an_nvrtc_compile(caplog):
    from gpuos import _log

    class Ext:
        def __init__(self):
            self.n, self.up = 0, False

        def is_initialized(self):
            return self.up

        def stats(self):
            return {"jit_compiles": self.n}

        def init(self, **kw):
            self.n, self.up = self.n + 1, True

        def jit_cache_dir(self):
            return "/tmp/cache"

        def link_info(self):
            return {"mode": "linked", "version": "13.0", "library": "libnvJitLink.so.13", "reason": ""}
    caplog.set_level(logging.INFO, logger="gpuos")
    ext = Ext()
    _log.start_runtime(ext, capacity=0)
    _log.start_runtime(ext, capacity=0)  # running: no message
    msgs = [r.getMessage() for r in caplog.records if r.name == "gpuos"]
    assert len([m for m in msgs if "compiled the GPUOS worker with NVRTC in" in m and "/tmp/cache" in m]) == 1, msgs


@pytest.mark.parametrize("reason,level", [("nvJitLink (libnvJitLink) could not be loaded", logging.WARNING),
                                          ("GPUOS_LINK=0: whole NVRTC compiles", logging.INFO)])
def test_whole_compile_mode_is_logged_once_with_its_reason(caplog, monkeypatch, reason, level):
    from gpuos import _log

    class Ext:
        def link_info(self):
            return {"mode": "whole", "version": "", "library": "", "reason": reason}
    monkeypatch.setattr(_log, "_link_noted", False)
    caplog.set_level(logging.INFO, logger="gpuos")
    _log.note_link_mode(Ext())
    _log.note_link_mode(Ext())
    recs = [r for r in caplog.records if r.name == "gpuos"]
    assert len(recs) == 1 and recs[0].levelno == level and reason in recs[0].getMessage(), recs


def test_handovers_and_compiles_are_logged_once(caplog):
    from gpuos import _log

    class Ext:
        counts = {"handovers": 0, "idle_adoptions": 0, "busy_adoptions": 0, "jit_compiles": 0}

        def stats(self):
            return dict(self.counts)
    caplog.set_level(logging.INFO, logger="gpuos")
    _log._last_counts.clear()
    ext = Ext()
    _log.note_runtime_events(ext)                  # first call: the baseline
    ext.counts.update(handovers=3, idle_adoptions=1, busy_adoptions=1, jit_compiles=1)
    _log.note_runtime_events(ext)
    _log.note_runtime_events(ext)                  # nothing new
    msgs = [r.getMessage() for r in caplog.records if r.name == "gpuos"]
    assert msgs == ["1 NVRTC compile(s) finished (tier-2 code of hot fused chains or injected ops)",
                    "3 handover(s) to a new worker generation (1 while no worker was resident, 1 from a resident "
                    "worker once the published work was done)"], msgs
