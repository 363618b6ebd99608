"""Where to find NVRTC: the nvidia-cuda-nvrtc wheel (installed with CUDA builds of torch) and CUDA_HOME."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def nvrtc_search_dirs() -> list[str]:
    dirs: list[str] = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            for lib in sorted(Path(base).glob("*/lib")):
                if any(lib.glob("libnvrtc.so*")):
                    dirs.append(str(lib))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(env)
        if home:
            dirs.append(str(Path(home) / "lib64"))
    return dirs
