"""Why a walk of tiny levels is slow: program_probe's walk under the claim trace (GPU machine, seconds).

    GPUOS_HOME_LEVELS=0 python tools/walk_trace.py                           # homes off, the burst grid (132 on an H200)
    GPUOS_HOME_LEVELS=0 GPUOS_BURST_BLOCKS=33 python tools/walk_trace.py     # the same on 33 blocks

`program_probe.py walk`'s fused chain (256 dependent `x * 1.0001 + 0.5` on 1,024 floats, captured: 45 levels of one
kind, one tile each) replayed WALK_REPS times (default: ~600 levels' worth) while the stream sleeps, so every call
is published before the worker starts (the probe's gated timing), then summarised from the trace: for each level,
when its slot was filled, when its first claim was made and when it started executing, each against the end of
the level before it (negative: ahead of it), its execution span and how many blocks claimed it.
- filled late (> 0): the poller's fills bound the walk;
- filled ahead, claimed late: the claims bound it (blocks walking levels already claimed);
- claimed ahead, started late: the handoff itself (the pollers of the level before's words).
The twenty-seventh session measured the walk at 17.05 us per level with homes off on 132 blocks, 3.53 on 33 or 8
(H200, one call), 5.08 with homes on. Its first run (twenty-eighth session, H200) did not show that difference:
under the traced worker every variant walked at ~21 us per level (levels' execution ~18 us, starts 3.5-3.8 us
after the level before), so it reads the traced walk's anatomy, not the untraced one's (`program_probe.py walk`).
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_trace import pct  # noqa: E402  (the tools are scripts: their folder on the path)


def walk_summary(recs):
    """recs: gpuos_ext.worker_trace records (block, seq, idx, k, t0, load_ns, exec_ns). Block -1: a slot fill (t0 =
    when); block >= 0: a claim (t0 = made, t0 + load = executing: descriptors loaded and the level before complete,
    + exec = done); other blocks (sub-op records) are ignored. Returns one dict per level that has a traced level
    before it: filled / claimed / started (us after that level's end), exec (us), blocks."""
    fills, claimed, start, end, blocks = {}, {}, {}, {}, {}
    for blk, seq, _idx, _k, t0, load, exe in recs:
        if blk == -1:
            fills[seq] = min(fills.get(seq, t0), t0)
        elif blk >= 0:
            claimed[seq] = min(claimed.get(seq, t0), t0)
            start[seq] = min(start.get(seq, t0 + load), t0 + load)
            end[seq] = max(end.get(seq, t0 + load + exe), t0 + load + exe)
            blocks.setdefault(seq, set()).add(blk)
    rows = []
    for seq in sorted(end):
        before = end.get(seq - 1)
        if before is None:
            continue
        rows.append({"seq": seq, "filled": (fills[seq] - before) / 1e3 if seq in fills else None,
                     "claimed": (claimed[seq] - before) / 1e3, "started": (start[seq] - before) / 1e3,
                     "exec": (end[seq] - start[seq]) / 1e3, "blocks": len(blocks[seq])})
    return rows


def describe(rows):
    """One line per figure: median and p90 over the levels."""
    lines = []
    for key in ("filled", "claimed", "started", "exec", "blocks"):
        v = [r[key] for r in rows if r[key] is not None]
        if v:
            lines.append(f"  {key:8s} median {statistics.median(v):8.2f}  p90 {pct(v, 0.9):8.2f}  "
                         f"min {min(v):8.2f}  max {max(v):8.2f}  ({len(v)} levels)")
    return lines


def main():
    os.environ.setdefault("GPUOS_TRACE", "4096")  # read when the runtime starts (gpuos.init below)
    import program_probe as PP

    import gpuos
    import gpuos_ext
    import torch

    gpuos.init()
    print(gpuos.runtime_info(), flush=True)
    x = torch.randn(1024, device="cuda")
    prog = gpuos.capture(PP.chain(256), x)
    lv = sum(prog.info()["levels"])
    reps = int(os.environ.get("WALK_REPS", max(1, 600 // max(lv, 1))))
    for _ in range(3):
        prog(x)
    torch.cuda.synchronize()
    gpuos.flush(sync=True)
    gpuos_ext.worker_trace()  # reset
    us = PP.gpu_us(lambda: prog(x), reps, warmup=0, gated=True)  # every call published before the worker starts
    gpuos.flush(sync=True)
    recs = gpuos_ext.worker_trace()[torch.cuda.current_device()]["records"]
    rows = walk_summary(recs)
    print(f"walk: {reps} calls of {lv} levels, {us / lv:.2f} us per level (traced worker; "
          f"GPUOS_HOME_LEVELS={os.environ.get('GPUOS_HOME_LEVELS', 'default')}, "
          f"GPUOS_BURST_BLOCKS={os.environ.get('GPUOS_BURST_BLOCKS', 'default')}); per level, us after the end "
          f"of the level before (negative: ahead of it):", flush=True)
    print("\n".join(describe(rows)))
    print("stats", {k: v for k, v in gpuos.stats().items() if v and not isinstance(v, dict)}, flush=True)


if __name__ == "__main__":
    main()
