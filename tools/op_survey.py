"""Which way each aten op of a Hugging Face decode step would take under the scheduler, by its tables alone -- no GPU
needed (issue #16: what still reaches a Python handler or stays eager).

    python tools/op_survey.py [label ...]     # default: llama-small-fp16-sdpa-static gpt2-small-fp16-sdpa-static
    env: SURVEY_STEPS (2 decode steps), SURVEY_DEVICE (cuda when there is one, else cpu)

W7's model of each label (benchmarks/bench_models.py) runs its decode steps under a counting dispatch mode; each aten
overload it saw is classed by gpuos/scheduler.py's tables: fast (recorded by the front's elementwise record;
fast_inplace, fast_out), nodata (views, allocation: run below the modes), native (cfront_native.cpp records it
itself), native_reduce, handler (a Python handler: a direct call from the front) and eager? (none of these: the mode
runs it eagerly). Counts are per step. On the CPU, SDPA takes the CPU's own backend op (on a GPU with cuDNN SDPA
off: the efficient backend's, a native op); everything else is the op a GPU step issues. The classes say which path
an op is offered, not whether its arguments are taken (a refused op goes on to its handler, then eager).
"""
import collections
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks import bench_models as BM  # noqa: E402


class Names(TorchDispatchMode):
    """Counts the aten overloads it sees."""
    def __init__(self) -> None:
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[func] += 1
        return func(*args, **(kwargs or {}))


def klass(S, ov) -> str:
    if ov in S._FAST:
        return ("fast", "fast_inplace", "fast_out")[S._FAST[ov][1]]
    if ov in S._NO_DATA:
        return "nodata"
    if ov in S._CFRONT_NATIVE:
        return "native"
    if ov in S._REDUCE_IDS:
        return "native_reduce"
    if ov in S._BUILTIN_HANDLERS:
        return "handler"
    return "eager?"


def survey(label: str, steps: int, device: str) -> str:
    from gpuos import scheduler as S
    case = BM.make_case(label, steps, device)
    d, cache = case.data, BM._cached(case)
    mode = Names()
    BM.reset_cache(d, cache)
    with torch.no_grad(), mode:
        for i in range(steps):
            BM.step_logits(d.model, d.forced[i], cache, d.positions[i], d.cache_kw)
    by = collections.defaultdict(list)
    for ov, n in mode.seen.items():
        by[klass(S, ov)].append((n / steps, str(ov)))
    lines = [f"{label} ({device}): {sum(mode.seen.values()) / steps:.0f} aten ops per step"]
    for k in sorted(by):
        rows = sorted(by[k], reverse=True)
        total = sum(n for n, _ in rows)
        if k in ("fast", "nodata"):
            lines.append(f"  {k:13s} {total:5.0f}")
        else:
            lines.append(f"  {k:13s} {total:5.0f}: " + ", ".join(f"{o} {n:g}" for n, o in rows))
    return "\n".join(lines)


def main() -> int:
    labels = sys.argv[1:] or ["llama-small-fp16-sdpa-static", "gpt2-small-fp16-sdpa-static"]
    steps = int(os.environ.get("SURVEY_STEPS", "2"))
    device = os.environ.get("SURVEY_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    for label in labels:
        print(survey(label, steps, device), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
