"""gpuos_ext: GPUOS's C++ core, the prototype's module name (``gpuos_ext.init / submit_add / flush / shutdown``).

The compiled extension is ``_gpuos_C``; this module loads it the way it must be loaded, so that ``import gpuos_ext``
works first, before ``import torch``, in every install mode:

* ``CUDA_MODULE_LOADING=EAGER`` unless the user chose, before CUDA initialises (torch would pick LAZY). With lazy
  loading the first launch of any kernel waits until no kernel is resident on the GPU, and a resident worker
  waiting for a batch queued behind that launch never leaves: measured on an H100, the soak wedged within 50 random
  chains in every lazy run and never with eager loading. A context that is lazy anyway (CUDA initialised before
  this import, or the user's choice) is handled by the runtime at some cost (``runtime_info()`` says which).
* torch first: the extension links against libc10 / libtorch, which ``import torch`` loads.
* The torch the extension was built against must be the one installed (C++ extensions are not ABI-stable across
  torch versions): a mismatch raises ImportError naming both and the fix.
"""
import os as _os
import sys as _sys

_os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

import torch as _torch  # noqa: E402  (loads libc10 / libtorch before the extension)


def _base(version: str) -> str:
    return version.split("+")[0]


try:
    import _gpuos_C as _C  # noqa: E402
except ImportError as _e:  # pragma: no cover -- a broken install
    raise ImportError(
        f"gpuos_ext: the compiled extension _gpuos_C could not be loaded ({_e}). Fix: build it against the installed "
        f"torch ({_torch.__version__}) with `pip install --no-build-isolation .` from the GPUOS source tree, then "
        f"check with `python -m gpuos`.") from _e

if _base(_C.__build_torch__) != _base(_torch.__version__):
    raise ImportError(
        f"gpuos_ext was built against torch {_C.__build_torch__} but torch {_torch.__version__} is installed: C++ "
        f"extensions are not ABI-stable across torch versions. Fix: rebuild against the installed torch with "
        f"`pip install --no-build-isolation --force-reinstall --no-deps .` from the GPUOS source tree.")

# The background whole build's helper (csrc/inject/whole.h): this interpreter, finding this extension and this
# module whatever the helper's sys.path, compiles one generation header into the JIT cache and exits. On Linux it
# dies with this process (PR_SET_PDEATHSIG: a process killed outright runs no atexit to kill its helper), and it
# exits at once if this process is gone already.
_WHOLE_HELPER = ("import os, sys\n"
                 "if sys.platform.startswith('linux'):\n"
                 "    import ctypes, signal; ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))\n"
                 "if os.getppid() != int(sys.argv[5]): sys.exit(3)\n"
                 "sys.path[:0] = sys.argv[1:3]\n"
                 "import gpuos_ext; gpuos_ext._compile_whole_image(sys.argv[3], sys.argv[4])\n")
if _sys.executable:
    _C._set_whole_build_command([_sys.executable, "-c", _WHOLE_HELPER, _os.path.dirname(_os.path.abspath(_C.__file__)),
                                 _os.path.dirname(_os.path.abspath(__file__))])

globals().update({_k: _v for _k, _v in vars(_C).items() if not _k.startswith("__")})
__version__ = _C.__version__
__build_torch__ = _C.__build_torch__
__doc__ = (_C.__doc__ or "") + "\n\n" + __doc__
