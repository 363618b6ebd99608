"""Replay one captured W7 decode step many times, untraced: the workload for profiling the worker on a GPU machine.

    python tools/replay_loop.py [label] [calls]        # default llama-small-fp16-sdpa-static, 120 calls
    M=l1tex__t_sectors_pipe_lsu_mem_local_op_ld
    ncu --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis_Tables \
        --metrics $M.sum,${M}_lookup_hit.sum -k regex:gpuos_worker --launch-skip 100 --launch-count 1 \
        python tools/replay_loop.py

Captures the step as `worker_trace.py hf` does (benchmarks/bench_models.py's model and cache, the token and
position bound by pointer), waits for its tier-2 code (the benchmarks' settle), then replays it `calls` times back
to back; every replay launches the worker once (a gated launch), so `--launch-skip` picks a settled replay. Prints
the replay's mean wall time per call. Needs transformers and a GPU.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpuos  # noqa: E402


def main(argv):
    from benchmarks import bench_models as B

    label = argv[0] if argv else "llama-small-fp16-sdpa-static"
    calls = int(argv[1]) if len(argv) > 1 else 120
    prog, tok, pos, _case = B.captured_step(label)
    gpuos.flush(sync=True)
    t0 = time.perf_counter()
    for _ in range(calls):
        prog(tok, pos)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / calls
    print(f"{label}: {calls} replays, {dt * 1e6:.1f} us per call; levels per step {sum(prog.info()['levels'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
