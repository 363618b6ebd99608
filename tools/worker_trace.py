"""Where does the worker's time go? Run on a GPU machine: python tools/worker_trace.py [scenario ...]

Sets GPUOS_TRACE (claim trace, see gpuos_ext.worker_trace) and runs W3-like scenarios (default: all; names: w3,
views, single, levels, rows; env TPB = threads_per_block, GPUOS_PUBLISH_MIN=0 = no early publication), each as
`reps` repetitions of: record the sub-ops (host time), flush(sync=True) (host time); the last rep's trace is
summarised: when the batch's slot was filled and its first claim started (relative to the flush call, when the GPU's
%globaltimer and the host's CLOCK_REALTIME agree), how long until the last claim ended, achieved bandwidth,
and per claim: descriptor-load time (with the wait for the previous level: a block claims a level's chunk before
the level before it has completed), execution time (block barrier), gaps between a block's claims.
`levels` (a chain of dependent one-sub-op levels) adds the level handoff (level_gaps): from the last claim of a
level ending (before its block's atomicSub) to the first claim of the next level starting to execute.
`rows` (dependent RMSNorms under the scheduler, row fusion on and off) splits a row program's level the same way.
`ops` (dependent chains of one small op under the scheduler: add, casts, a mean, a strided add) gives one warp's
cost per op kind. `calls` (W5's MLP block captured as a program and called 20 times back to back: per call the exec span of its
levels, the handoffs inside it and the gap before the next call, and the worker launches (launch_timeline); env
CALLS_SIZE (W5 size, ew: program_probe callcost's one-level program, or rounds<k>: its k-round one), CALLS_N (calls, default 20), CALLS_IMAGES=0
(replays staged entry by entry instead of from tape images)). `hf` (W7's llama-small / gpt2-small static decode step captured as a program, one replay traced;
needs transformers; env HF_SIZE_THRESHOLD: the capture's size threshold, HF_LABELS: W7 labels, comma-separated,
HF_TOP: how many of the slowest levels to list, 0 for every level in order):
where a replayed step's time goes, per level -- its execution span (first claim executing to last claim done) and the handoff before it -- summed by the
ops the level holds, and the slowest levels (`Tape.level_map` names each level's sub-ops; each with its home blocks,
how long after the level before ended its first claim started, and the blocks that claimed it); with the sub-op records
(every sub-op, in the worker built for GPUOS_TRACE), each level group's lead-in, sub-op load / exec and tail. `attn` (one Llama-shape
decode attention per flush at KV 2,048 and 8,192) and `mm` (one worker matmul per flush, M = 1 / 16 at 4,096^2, M = 1
at 1,024^2; env MM_SHAPES="MxNxK,...", MM_WEIGHTS: weights cycled through, 1 for L2-hot), `mmC` (matmul_chain:
decode-shaped linears captured as programs, hf's per-level report; MMC_H / MMC_VARIANTS=links: a program chain of
large products), `mmL` (a live chain of MML_L, default 3,
dependent 4,096^2 products in one flush: per level, its first claim, exec start, items and claims' end against the
level before's end -- level_timeline): where a batch of items goes -- claims, and per item (GPUOS_TRACE's item records) its duration, its SM
and the tile's combine / split finish. `attnL` (ATTN_KV, ATTN_L: 4,096, 16): bench_attention's one flush of L
attentions -- its early publications, joined batches and items (this tool's ring has 65,536 slots, the bench's
the default 4,096). `attnC` (ATTN_KVS: 128,4096; ATTN_L): bench_attention's gpuos_program_chain row -- L attentions
each reading the previous one's output, captured as a program, one replay traced (one attention per level).
"""
import os
import statistics
import sys
import time

import torch

import gpuos
import gpuos_ext

# `hf` and `attn` import the benchmarks package: the repository root on sys.path (a pip-installed gpuos does not
# put it there).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


CAPACITY = 65536  # the ring this tool's runtime is made with (main): level_timeline maps ring indices to batches


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0


def item_lead(k):
    """An item record's k: its kind in the low byte and, from the traced worker's matmul / attention items, the
    dispatch ahead of the item's first timestamp above it (device_src/worker.cu lead_bits): (kind, None) or (kind,
    (arguments in shared memory -> item function entry, the matmul prologue, the item's arguments and tile
    arithmetic), in us; a saturated field reads as its maximum, 4.08 / 32.6 / 4.08 us)."""
    kind, bits = k & 0xFF, k >> 8
    if bits == 0:
        return kind, None
    return kind, ((bits & 0xFF) * 0.016, ((bits >> 8) & 0xFF) * 0.128, ((bits >> 16) & 0xFF) * 0.016)


def split_items(recs):
    """Records with every item's (block -2) k reduced to its kind, and the items' leads (item_lead) by the
    record's position in the returned list."""
    out, leads = [], {}
    for r in recs:
        if r[0] == -2:
            kind, lead = item_lead(r[3])
            if lead is not None:
                leads[len(out)] = lead
            r = (r[0], r[1], r[2], kind) + tuple(r[4:])
        out.append(r)
    return out, leads


def level_gaps(recs):
    """Per pair of consecutive traced batches (seq, seq + 1) that both have claims: the next level's first claim
    starting to execute (t0 + load_ns: descriptors loaded and the previous level complete) minus this level's
    last claim ending (t0 + load_ns + exec_ns), in us; and how far ahead of that end the next level's first claim
    was made (us, positive = before it). Records as gpuos_ext.worker_trace returns them."""
    first_exec, first_claim, last_end = {}, {}, {}
    for blk, seq, _idx, _k, t0, load, exe in recs:
        if blk < 0:
            continue
        first_exec[seq] = min(first_exec.get(seq, t0 + load), t0 + load)
        first_claim[seq] = min(first_claim.get(seq, t0), t0)
        last_end[seq] = max(last_end.get(seq, t0 + load + exe), t0 + load + exe)
    gaps, leads = [], []
    for seq in sorted(last_end):
        if seq + 1 in first_exec:
            gaps.append((first_exec[seq + 1] - last_end[seq]) / 1e3)
            leads.append((last_end[seq] - first_claim[seq + 1]) / 1e3)
    return gaps, leads


def summarise(name, recs, t_flush_ns, nbytes, host_ms, flush_ms):
    opens = [r for r in recs if r[0] == -1]
    claims = [r for r in recs if r[0] >= 0]
    if not claims:
        print(f"{name}: no claims traced")
        return
    t_first = min(r[4] for r in claims)
    t_last = max(r[4] + r[5] + r[6] for r in claims)
    span_us = (t_last - t_first) / 1e3
    blocks = sorted({r[0] for r in claims})
    skew = t_flush_ns - (opens[0][4] if opens else t_first)
    rel = lambda t: f"{(t - t_flush_ns) / 1e3:+.1f} us" if abs(skew) < 10**9 else "n/a"  # noqa: E731
    print(f"{name}: submit {host_ms:.3f} ms, flush+sync {flush_ms:.3f} ms; {len(opens)} batch(es) "
          f"{[o[3] for o in opens][:6]}, {len(claims)} claims by {len(blocks)} blocks")
    if opens:
        print(f"  batch filled at {rel(opens[0][4])} from the flush call, first claim {rel(t_first)}, "
              f"last claim done {rel(t_last)}")
    print(f"  claims span {span_us:.1f} us: {nbytes / (span_us * 1e-6) / 1e9:.0f} GB/s of input")
    load = [r[5] / 1e3 for r in claims]
    exe = [r[6] / 1e3 for r in claims]
    per_sub = [r[6] / 1e3 / max(1, r[3]) for r in claims]
    print(f"  per claim: load median {statistics.median(load):.2f} us (p90 {pct(load, .9):.2f}); exec median "
          f"{statistics.median(exe):.2f} us (p90 {pct(exe, .9):.2f}, max {max(exe):.2f}); k median "
          f"{statistics.median([r[3] for r in claims])}; exec/sub-op median {statistics.median(per_sub):.2f} us")
    gaps, busy, starts = [], [], []
    for b in blocks:
        rs = sorted((r for r in claims if r[0] == b), key=lambda r: r[4])
        starts.append((rs[0][4] - t_first) / 1e3)
        busy.append(sum(r[5] + r[6] for r in rs) / 1e3)
        for x, y in zip(rs, rs[1:]):
            gaps.append((y[4] - (x[4] + x[5] + x[6])) / 1e3)
    print(f"  block first-claim offsets: median {statistics.median(starts):.1f} us, max {max(starts):.1f} us; "
          f"busy per block median {statistics.median(busy):.1f} us (of {span_us:.1f}); gaps between claims "
          f"median {statistics.median(gaps) if gaps else 0:.2f} us, p90 {pct(gaps, .9):.2f} us")
    hand, lead = level_gaps(recs)
    if hand:
        print(f"  level handoff ({len(hand)} pairs): median {statistics.median(hand):.2f} us (p90 "
              f"{pct(hand, .9):.2f}); next level claimed {statistics.median(lead):.2f} us before the end (median)")


def traced(record, reps=4, prepare=None):
    """`reps` times: prepare(), record() (host time), flush(sync=True) (host time); the last rep's trace:
    (records, dropped, flush call's CLOCK_REALTIME ns, record ms, flush ms)."""
    for _ in range(reps):
        if prepare is not None:
            prepare()
        torch.cuda.synchronize()
        gpuos_ext.worker_trace()  # reset
        t0 = time.perf_counter()
        record()
        t1 = time.perf_counter()
        t_flush_ns = time.time_ns()
        gpuos.flush(sync=True)
        t2 = time.perf_counter()
        tr = gpuos_ext.worker_trace()[torch.cuda.current_device()]
    return tr["records"], tr["dropped"], t_flush_ns, (t1 - t0) * 1e3, (t2 - t1) * 1e3


def run(name, X, O, op, big=None):
    def record():
        if big is not None:
            gpuos.submit_reduce(op, big[0], big[1])
        else:
            for x, o in zip(X, O):
                gpuos.submit_reduce(op, x, o)
    recs, dropped, t_flush_ns, host_ms, flush_ms = traced(record)
    nbytes = (big[0].numel() * big[0].element_size()) if big is not None else sum(x.numel() * x.element_size() for x in X)
    summarise(name, recs, t_flush_ns, nbytes, host_ms, flush_ms)
    if dropped:
        print(f"  ({dropped} records dropped: raise GPUOS_TRACE)")


def levels(depth=64, n=1024):
    """A chain of `depth` (even) dependent one-sub-op levels: explicit adds ping-ponging between two tensors."""
    ref = torch.randn(n, device="cuda")
    a, b = torch.empty_like(ref), torch.empty_like(ref)

    def record():
        for i in range(depth):
            src, dst = (a, b) if i % 2 == 0 else (b, a)
            gpuos_ext.submit_add(src, src, dst)
    recs, _, t_flush_ns, host_ms, flush_ms = traced(record, prepare=lambda: a.copy_(ref))
    torch.testing.assert_close(a, ref * 2.0 ** depth)  # doublings are exact in fp32
    summarise(f"levels: {depth} dependent adds of {n}", recs, t_flush_ns, 0, host_ms, flush_ms)


def op_chain(name, x0, fn, depth=16, row_fusion=False):
    """`depth` dependent applications of `fn` recorded by the scheduler, published by one flush: one warp's tile
    per level when the op is small (live flushes keep whole tiles), so the claims' exec time is that cost."""
    out = []

    def record():
        x = x0
        with gpuos.scheduler_context(auto_flush_ms=0):
            for _ in range(depth):
                x = fn(x)
        out[:] = [x]
    gpuos.set_row_fusion(row_fusion)
    try:
        recs, _, t_flush_ns, host_ms, flush_ms = traced(record)
    finally:
        gpuos.set_row_fusion(True)
    ref = x0
    for _ in range(depth):
        ref = fn(ref)
    torch.testing.assert_close(out[0], ref, rtol=2e-2, atol=2e-2)
    summarise(f"{name}, row fusion {row_fusion}", recs, t_flush_ns, 0, host_ms, flush_ms)


def norm_rows(hidden, depth=16, row_fusion=True):
    """`depth` dependent RMSNorms (HF's form, fp16, one row of `hidden`): with row fusion each is one row-program
    level (its claim's exec time is the row's cost)."""
    w = torch.rand(hidden, device="cuda", dtype=torch.float16) + 0.5

    def rms(x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)
    x0 = torch.randn(1, hidden, device="cuda", dtype=torch.float16)
    op_chain(f"rows: {depth} dependent RMSNorms of {hidden}", x0, rms, depth, row_fusion)


def op_chains():
    for n in (1024, 4096):
        y = torch.randn(n, device="cuda")
        op_chain(f"ops: 16 x fp32 add of {n}", torch.randn(n, device="cuda"), lambda x: x + y)
        op_chain(f"ops: 16 x fp16 -> fp32 -> fp16 casts of {n}", torch.randn(n, device="cuda", dtype=torch.float16),
                 lambda x: x.float().half())
        op_chain(f"ops: 16 x fp32 mean of (1, {n}) then subtract", torch.randn(1, n, device="cuda"),
                 lambda x: x - x.mean(-1, keepdim=True) * 0.5)
        m = int(n ** 0.5)
        op_chain(f"ops: 16 x fp32 transposed add of ({m}, {m})", torch.randn(m, m, device="cuda"),
                 lambda x: x.t() + 1.0)


def hf_levels(label, top=12):
    """One traced replay of a captured static decode step (tier 2 waited for): per level exec span and handoff,
    grouped by the ops of the level."""
    from benchmarks import bench_models as B
    import gpuos.programs as P
    P.DEFAULT_SIZE_THRESHOLD = int(os.environ.get("HF_SIZE_THRESHOLD", P.DEFAULT_SIZE_THRESHOLD))
    prog, tok, pos, _case = B.captured_step(label)  # settled: tier 2 in, as the benchmarks time it
    program_levels(f"hf {label}", prog, lambda: prog(tok, pos), top)


def program_levels(name, prog, call, top=12):
    """One traced call of a captured program (`call()` runs it): per level its exec span, handoff and item median,
    grouped by the ops of the level, and the slowest levels' claims (hf_levels' report for any program)."""
    import collections
    gpuos.flush(sync=True)
    gpuos_ext.worker_trace()  # reset
    call()
    torch.cuda.synchronize()
    gpuos.flush(sync=True)
    all_recs = gpuos_ext.worker_trace()[torch.cuda.current_device()]["records"]
    recs = [r for r in all_recs if r[0] >= 0]
    segs = [s for s in prog.steps if s[0] == "seg"]
    lmap = []  # per level (in publication order): [entry dicts]
    for sg in segs:
        ents = prog.tape.level_map(sg[1], sg[2])
        nl = max((e["level"] for e in ents), default=0)
        per = [[] for _ in range(nl)]
        for e in ents:
            per[e["level"] - 1].append(e)
        lmap.extend(per)
    seq0 = min(r[1] for r in recs)
    span = {}
    for blk, seq, _i, _k, t0, load, exe in recs:
        a, b = span.get(seq, (1 << 62, 0))
        span[seq] = (min(a, t0 + load), max(b, t0 + load + exe))
    seqs = sorted(span)
    if len(seqs) != len(lmap):
        print(f"{name}: {len(seqs)} traced batches vs {len(lmap)} levels (segments {len(segs)}); "
              "per-level figures skipped")
        return
    by = collections.defaultdict(lambda: [0, 0.0, 0.0])
    # Home blocks per level piece (Tape.homes, segment order; a level cut into several pieces: column left out) and
    # the traced claims of each level: which blocks, and how long after the level before ended the first of them
    # started (late > 0: the claim itself was on the critical path).
    homes = [h for seg in prog.info()["homes"] for h in seg]
    homes = homes if len(homes) == len(seqs) else None
    claims = collections.defaultdict(list)
    for r in recs:
        claims[r[1]].append(r)
    items = [r for r in all_recs if r[0] == -2]  # sub-op records (below)
    level_items = {sq: [r for r in items if span[sq][0] - 500 <= r[4] <= span[sq][1]] for sq in seqs}  # by start
    rows, prev_end = [], None
    for lv, sq in enumerate(seqs):
        a, b = span[sq]
        ex, hand = (b - a) / 1e3, ((a - prev_end) / 1e3 if prev_end is not None else 0.0)
        cl = claims.get(sq, [])
        late = max(0.0, (min(r[4] for r in cl) - prev_end) / 1e3) if cl and prev_end is not None else 0.0
        prev_end = b
        ops = lmap[lv]
        key = "+".join(sorted({e["op"] + ("@" + str(e["row"]) if e["row"] else "") for e in ops}))
        g = by[key]
        g[0] += 1; g[1] += ex; g[2] += hand  # noqa: E702
        its = level_items[sq]
        lead = (f"lead {(min(r[4] for r in its) - a) / 1e3:5.2f} items "
                f"{statistics.median((r[5] + r[6]) / 1e3 for r in its):5.2f} ") if its else ""
        where = (f"home {homes[lv][1]}+{homes[lv][2]} " if homes else "") + lead + f"late {late:4.2f} blocks " + \
            ",".join(str(x) for x in sorted({r[0] for r in cl})[:6])
        rows.append((ex, lv + 1, hand, where + "  " + ", ".join(f"{e['op']}:{e['elems']}/{e['tiles']}t" for e in ops)))
    # Sub-op records (block -2; every kind since the 21st session: k 0/1 attention / matmul items, 2 / 3 fused
    # tier 2 / interpreter, 4 + kind the rest) by the level whose span holds their start: per op group, the
    # level's lead-in (its first claim executing -> its first sub-op starting), the sub-ops' durations (load_ns:
    # arguments / program fetched, exec_ns: the rest; a matmul / attention item's own time is load_ns, and an unsplit
    # mma item's load_ns is its K loop, its exec_ns its outputs -- a split one's exec_ns its finish) and its
    # tail (the last sub-op's end -> the level's last claim done).
    parts = collections.defaultdict(lambda: [[], [], [], [], [], []])
    for lv, sq in enumerate(seqs):
        a, b = span[sq]
        its = level_items[sq]
        if not its:
            continue
        ops = lmap[lv]
        key = "+".join(sorted({e["op"] + ("@" + str(e["row"]) if e["row"] else "") for e in ops}))
        g = parts[key]
        g[0].append((min(r[4] for r in its) - a) / 1e3)
        g[1].extend(r[5] / 1e3 for r in its)
        g[2].extend(r[6] / 1e3 for r in its)
        g[3].append((b - max(r[4] + r[5] + r[6] for r in its)) / 1e3)
        g[4].extend(item_lead(r[3])[0] for r in its)
        g[5].extend(ld for ld in (item_lead(r[3])[1] for r in its) if ld is not None)
    if parts:
        print("  sub-op records by level group: lead-in, sub-op load / exec (us, medians), tail, record kinds:")
        for key, (lead, ld, ex, tail, ks, disp) in sorted(parts.items(), key=lambda kv: -len(kv[1][0])):
            print(f"    {key[:40]:40s} lead {statistics.median(lead):5.2f} ({min(lead):.2f}..{max(lead):.2f})  "
                  f"load {statistics.median(ld):5.2f} (max {max(ld):5.2f})  exec {statistics.median(ex):5.2f} (max {max(ex):5.2f})  tail "
                  f"{statistics.median(tail):5.2f}  kinds {sorted(set(ks))}")
            if disp:
                print("      " + dispatch_line(disp))
    tot_ex, tot_h = sum(r[0] for r in rows), sum(r[2] for r in rows)
    first, last = min(span[s][0] for s in seqs), max(span[s][1] for s in seqs)
    print(f"{name}: {len(seqs)} levels ({seq0}..), span {(last - first) / 1e3:.1f} us = exec {tot_ex:.1f} + "
          f"handoffs {tot_h:.1f} us; fallbacks {list(prog.fallbacks)}")
    for key, (n, ex, hand) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {key:40s} levels {n:3d}  exec {ex:8.1f} us ({ex / n:6.2f}/level)  handoff {hand:7.1f} us")
    top = int(os.environ.get("HF_TOP", top))  # 0: every level, in level order
    print("  " + ("every level" if top == 0 else "slowest levels") + " (exec us, level, handoff us, home first+span, "
          "lead: its first sub-op's start after the level's (us), items: their median (us), late: its first claim's start after the level "
          "before ended (us), claiming blocks, sub-ops op:elems/tiles):")
    for ex, lv, hand, desc in (rows if top == 0 else sorted(rows, reverse=True)[:top]):
        print(f"    {ex:7.2f}  L{lv:<3d} {hand:6.2f}  {desc[:200]}")
    print("  claims of the 3 slowest levels (traced blocks only): count, blocks, claims per block max, sub-ops per "
          "claim, load / exec us median and max, first and last claim start after the level's first (us):")
    for ex, lv, hand, desc in sorted(rows, reverse=True)[:3]:
        cl = [r for r in recs if r[1] == seqs[lv - 1]]
        per_blk = collections.Counter(r[0] for r in cl)
        t_first = min(r[4] for r in cl)
        starts = sorted(r[4] - t_first for r in cl)
        loads, exes = [r[5] / 1e3 for r in cl], [r[6] / 1e3 for r in cl]
        print(f"    L{lv:<3d} {len(cl)} claims, {len(per_blk)} blocks, <= {max(per_blk.values())} per block, "
              f"k {min(r[3] for r in cl)}..{max(r[3] for r in cl)}; load {statistics.median(loads):.2f} / "
              f"{max(loads):.2f}, exec {statistics.median(exes):.2f} / {max(exes):.2f}; starts "
              f"{starts[len(cl) // 2] / 1e3:.2f} / {starts[-1] / 1e3:.2f}")
        slow_cl = sorted(cl, key=lambda r: -r[6])[:6]
        print("      slowest claims (block: exec us, start after the level's first claim us): " + ", ".join(
            f"{r[0]}: {r[6] / 1e3:.2f} @{(r[4] + r[5] - span[seqs[lv - 1]][0]) / 1e3:.1f}" for r in slow_cl))
        # Its sub-ops by SM (a sub-op record's seq is its SM): is the straggler an SM that ran more (two blocks on
        # one SM), or slow items anywhere?
        a = span[seqs[lv - 1]][0]
        its = level_items[seqs[lv - 1]]
        if its:
            per_sm = collections.defaultdict(list)
            for r in its:
                per_sm[r[1]].append((r[5] + r[6]) / 1e3)
            by_n = collections.defaultdict(list)
            for v in per_sm.values():
                by_n[len(v)].extend(v)
            # By the item's place in its claim (ring index mod the claim's size: the warp that ran it when the
            # level's claims start at multiples of it): is the claim's straggler one warp's (warp 0's thread
            # claims and waits), or any?
            kc = max(r[3] for r in cl)
            by_w = collections.defaultdict(list)
            for r in its:
                by_w[r[2] % kc].append(r)
            print(f"      items by place in the claim (ri mod {kc}: load / exec median, exec max): " + ", ".join(
                f"{w}: {statistics.median(r[5] / 1e3 for r in v):.2f} / {statistics.median(r[6] / 1e3 for r in v):.2f}"
                f" {max(r[6] / 1e3 for r in v):.1f}" for w, v in sorted(by_w.items())))
            slow = sorted(its, key=lambda r: -(r[5] + r[6]))[:3]
            print(f"      {len(its)} sub-ops on {len(per_sm)} SMs; sub-op us by sub-ops per SM: " + ", ".join(
                f"{n}: median {statistics.median(v):.2f} max {max(v):.2f} ({len(v) // n} SMs)"
                for n, v in sorted(by_n.items())) + "; slowest (us, SM, ends after the level's start): " + ", ".join(
                f"{(r[5] + r[6]) / 1e3:.2f} SM{r[1]} {(r[4] + r[5] + r[6] - a) / 1e3:.1f}" for r in slow))


def dispatch_line(leads):
    """The medians and maxima of items' leads (item_lead), one line."""
    names = ("to the item function", "prologue", "arguments")
    cols = list(zip(*leads))
    return "dispatch before the item's first timestamp (us, median / max): " + ", ".join(
        f"{n} {statistics.median(c):.2f} / {max(c):.2f}" for n, c in zip(names, cols)) + f" ({len(leads)} items)"


def claim_timeline(claims, items):
    """One line: where a claim's exec goes, on one time axis (us from the first claim's start; claims as
    (block, seq, idx, k, t0, load_ns, exec_ns), items as item_summary's). The claims' exec starts (descriptors in,
    previous level done), the items' starts and ends (an unsplit item's outputs included), the claims' ends (every
    warp past the finish phase: a split tile's combine runs between its items' end and its claim's end). Thirty-sixth
    session (H200, 4,096^2 at M = 1): exec 38.9 us per claim against 13.4-us items -- this line says on which side
    of the items the rest lies."""
    t0 = min(r[4] for r in claims)
    rel = lambda ts: sorted((t - t0) / 1e3 for t in ts)  # noqa: E731
    starts = rel(r[4] + r[5] for r in claims)
    ends = rel(r[4] + r[5] + r[6] for r in claims)
    i_start = rel(r[4] for r in items)
    i_end = rel(r[4] + r[5] + (0 if r[3] else r[6]) for r in items)
    q = lambda v: f"p50 {pct(v, .5):.1f} / max {v[-1]:.1f}"  # noqa: E731
    return (f"timeline (us from the first claim): claims' exec start {q(starts)}; items start {q(i_start)}, "
            f"end {q(i_end)}; claims end {q(ends)}")


def item_summary(recs, qs=(0.1, 0.5, 0.8, 0.9, 0.95, 1.0)):
    """Item records (block -2: decode attention and split-matmul items, one per warp): durations, the combines /
    split finishes of the tiles' last items, and item duration by how many items an SM ran."""
    recs, leads = split_items(recs)
    items = [r for r in recs if r[0] == -2 and r[3] in (0, 1)]  # (-2, sm, ring index, combined, t0, item, combine ns)
    if items:
        t_first = min(r[4] for r in items)
        dur = sorted(r[5] / 1e3 for r in items)
        comb = sorted(r[6] / 1e3 for r in items if r[3])
        print(f"  {len(items)} items: duration " + ", ".join(f"p{int(q * 100)} {pct(dur, q):.1f}" for q in qs)
              + f"; start offsets p50 {pct([(r[4] - t_first) / 1e3 for r in items], .5):.1f} / max "
              f"{max((r[4] - t_first) / 1e3 for r in items):.1f} us")
        if leads:
            print("  " + dispatch_line(list(leads.values())))
        rest = [r[6] / 1e3 for r in items if not r[3] and r[6]]
        if rest:  # an unsplit traced item's record is split: its duration above, the rest (its outputs) here
            print(f"  {len(rest)} unsplit items, after the split point (us): p50 {pct(rest, .5):.2f}, p90 "
                  f"{pct(rest, .9):.2f}, max {max(rest):.2f}")
        if comb:
            print(f"  {len(comb)} combines / finishes (us): " + ", ".join(f"p{int(q * 100)} {pct(comb, q):.1f}" for q in qs)
                  + "; their items end at " + ", ".join(
                      f"{(r[4] + r[5] - t_first) / 1e3:.1f}" for r in sorted(items, key=lambda r: r[4] + r[5])
                      if r[3])[:200])
        claims = [r for r in recs if r[0] >= 0]
        if claims:
            print("  " + claim_timeline(claims, items))
        per_sm = {}
        for r in items:
            per_sm.setdefault(r[1], []).append(r[5] / 1e3)
        by_n = {}
        for v in per_sm.values():
            by_n.setdefault(len(v), []).extend(v)
        print(f"  {len(per_sm)} SMs ran items; item duration by items per SM: " + ", ".join(
            f"{n}: median {statistics.median(v):.1f} ({len(v) // n} SMs)" for n, v in sorted(by_n.items())))


def attention(kvs=(2048, 8192), caches=8):
    """`attn`: one decode attention of bench_attention's Llama shape (32 / 8 heads, D 128, fp16, query length 1) per
    flush, traced: the batch's claims (one item per warp; a tile's last item also combines the KV splits) and the
    item records (item_summary: each item's duration, the combines apart), and the batch-filled / first-claim
    offsets tell the publication's share (its descriptors go by DMA). Each rep reads another of `caches` KV caches
    (together larger than the L2 cache at KV 8,192), as bench_attention's rows do; env ATTN_HOT=1 reads one."""
    hot = os.environ.get("ATTN_HOT") == "1"
    for kv in kvs:
        n = 1 if hot else caches
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
        ks = [torch.randn(1, 8, kv, 128, device="cuda", dtype=torch.float16) for _ in range(n)]
        vs = [torch.randn_like(k) for k in ks]
        o = torch.empty_like(q)
        it = [0]

        def record():
            it[0] += 1
            gpuos.submit_attention(q, ks[it[0] % n], vs[it[0] % n], o)
        recs, dropped, t_flush_ns, host_ms, flush_ms = traced(record, reps=2 * n)
        k, v = ks[it[0] % n], vs[it[0] % n]
        summarise(f"attn 32/8 heads D 128 KV {kv}{' (L2-hot)' if hot else ''}", recs, t_flush_ns,
                  2 * k.numel() * k.element_size(), host_ms, flush_ms)
        claims = [r for r in recs if r[0] >= 0]
        qs = (0.1, 0.5, 0.8, 0.9, 0.95, 1.0)
        if claims:  # the exec distribution: items alone vs items that also combined their tile
            exe = sorted(r[6] / 1e3 for r in claims)
            print("  claim exec percentiles (us): " + ", ".join(f"p{int(q * 100)} {pct(exe, q):.1f}" for q in qs))
        item_summary(recs, qs)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float().repeat_interleave(4, 1), v.float().repeat_interleave(4, 1))
        torch.testing.assert_close(o.float(), ref, rtol=2e-2, atol=2e-2)
        if dropped:
            print(f"  ({dropped} records dropped: raise GPUOS_TRACE)")


def attention_many(kv=4096, L=16):
    """`attnL`: bench_attention's gpuos_worker row at one KV length -- L decode attentions (Llama shape, fp16, one
    KV cache each) submitted and flushed once -- traced: how the flush's early publications (one per attention at
    KV 4,096), their batches and the items of consecutive attentions overlap (joined batches run beside the one
    before them: stats()["joined_batches"]), and the item records."""
    q = [torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16) for _ in range(L)]
    ks = [torch.randn(1, 8, kv, 128, device="cuda", dtype=torch.float16) for _ in range(L)]
    vs = [torch.randn_like(k) for k in ks]
    o = [torch.empty_like(x) for x in q]
    s0 = gpuos.stats()

    def record():
        for i in range(L):
            gpuos.submit_attention(q[i], ks[i], vs[i], o[i])
    recs, dropped, t_flush_ns, host_ms, flush_ms = traced(record, reps=2)
    s1 = gpuos.stats()
    summarise(f"attnL {L} attentions 32/8 heads D 128 KV {kv}", recs, t_flush_ns,
              L * 2 * ks[0].numel() * ks[0].element_size(), host_ms, flush_ms)
    print("  per flush: " + ", ".join(f"{k} {(s1[k] - s0[k]) / 2:g}" for k in
                                      ("batches", "early_publishes", "joined_batches", "worker_launches", "room_waits")))
    item_summary(recs)
    for i in (0, L - 1):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[i].float(), ks[i].float().repeat_interleave(4, 1), vs[i].float().repeat_interleave(4, 1))
        torch.testing.assert_close(o[i].float(), ref, rtol=2e-2, atol=2e-2)
    if dropped:
        print(f"  ({dropped} records dropped: raise GPUOS_TRACE)")


def mm_shapes(spec):
    """MM_SHAPES ("MxNxK,...", e.g. "1x32000x256" for Llama-small's LM head) as (M, N, K) tuples."""
    out = tuple(tuple(int(v) for v in s.split("x")) for s in spec.split(",") if s)
    bad = [s for s in out if len(s) != 3]
    if bad:
        raise ValueError(f"MM_SHAPES={spec!r}: every entry is MxNxK (three integers joined by 'x'), not {bad}")
    return out


def matmul_items(sizes=((1, 4096, 4096), (16, 4096, 4096), (1, 1024, 1024)), weights=8):
    """`mm`: one worker matmul per flush (fp16, x @ w.t() -- the tensor-core path), M x N x K (env MM_SHAPES), each
    rep reading another of `weights` weights (env MM_WEIGHTS; 8: cold, as bench_matmul's rows; 1: L2-hot): claims
    and items (one per warp; a tile's last K slice also finishes the split)."""
    sizes = mm_shapes(os.environ.get("MM_SHAPES", "")) or sizes
    weights = int(os.environ.get("MM_WEIGHTS", weights))
    for m, n, kk in sizes:
        ws = [torch.randn(n, kk, device="cuda", dtype=torch.float16) / kk ** 0.5 for _ in range(weights)]
        x = torch.randn(m, kk, device="cuda", dtype=torch.float16)
        o = torch.empty(m, n, device="cuda", dtype=torch.float16)
        it = [0]

        def record():
            it[0] += 1
            gpuos.submit_matmul(x, ws[it[0] % weights].t(), o)
        recs, dropped, t_flush_ns, host_ms, flush_ms = traced(record, reps=2 * weights)
        w = ws[it[0] % weights]
        summarise(f"mm M {m} N {n} K {kk} fp16 ({weights} weights)", recs, t_flush_ns, w.numel() * 2, host_ms,
                  flush_ms)
        item_summary(recs)
        torch.testing.assert_close(o.float(), x.float() @ w.float().t(), rtol=2e-2, atol=2e-2)
        if dropped:
            print(f"  ({dropped} records dropped: raise GPUOS_TRACE)")


def level_timeline(recs, capacity):
    """Per traced batch of a chain (one level each), on one axis from the level before's last claim end (us; the
    first level from its own first claim): its first claim, its claims' exec start (descriptors in and the level
    before complete), its items' start and end, its claims' end -- p50 / max each. Items go to a batch by their ring
    index (the batch's fill record gives its ring start and count). Records as gpuos_ext.worker_trace returns them."""
    recs, _ = split_items(recs)
    fills = {r[1]: (r[2], r[3]) for r in recs if r[0] == -1}
    claims = [r for r in recs if r[0] >= 0]
    items = [r for r in recs if r[0] == -2 and r[3] in (0, 1)]
    q = lambda v: f"{pct(v, .5):+.1f} / {max(v):+.1f}" if v else "-"  # noqa: E731
    prev_end = None
    for seq in sorted({r[1] for r in claims}):
        cl = [r for r in claims if r[1] == seq]
        start, count = fills.get(seq, (None, 0))
        its = [r for r in items if start is not None and (r[2] - start) % capacity < count]
        origin = prev_end if prev_end is not None else min(r[4] for r in cl)
        rel = lambda ts: [(t - origin) / 1e3 for t in ts]  # noqa: E731
        ends = [r[4] + r[5] + r[6] for r in cl]
        print(f"  level seq {seq} ({len(cl)} claims, {len(its)} items), us from "
              f"{'the level before ends' if prev_end is not None else 'its first claim'}: first claim "
              f"{min(rel(r[4] for r in cl)):+.1f}; exec start {q(rel(r[4] + r[5] for r in cl))}; items start "
              f"{q(rel(r[4] for r in its))}, end {q(rel(r[4] + r[5] + (0 if r[3] else r[6]) for r in its))}; "
              f"claims end {q(rel(ends))}")
        prev_end = max(ends)


def matmul_levels(L=3, shape=(1, 4096, 4096), weights=2):
    """`mmL`: a chain of L dependent worker matmuls in one live flush (fp16, x @ w.t(); M x N x K the first entry of
    MM_SHAPES, N == K; env MML_L), one product per level, each rep on another set of `weights` weights: where a
    chained level's time goes (level_timeline) -- bench_matmul's chain rows stream at ~50 % of copy against ~80 % for
    a level of independent products (DEVELOPING Next 5 (b)). GPUOS_PUBLISH_MIN=0: the flush published whole."""
    m, n, kk = (mm_shapes(os.environ.get("MM_SHAPES", "")) or (shape,))[0]
    if n != kk:
        raise ValueError(f"mmL chains products: N ({n}) must equal K ({kk})")
    L = int(os.environ.get("MML_L", L))
    ws = [torch.randn(n, kk, device="cuda", dtype=torch.float16) / kk ** 0.5 for _ in range(L * weights)]
    x = torch.randn(m, kk, device="cuda", dtype=torch.float16)
    outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(L)]
    it = [0]

    def record():
        it[0] += 1
        cur = x
        for i in range(L):
            gpuos.submit_matmul(cur, ws[(it[0] % weights) * L + i].t(), outs[i])
            cur = outs[i]
    recs, dropped, t_flush_ns, host_ms, flush_ms = traced(record, reps=2 * weights)
    summarise(f"mmL chain of {L} x M {m} N {n} K {kk} fp16", recs, t_flush_ns, L * n * kk * 2, host_ms, flush_ms)
    level_timeline(recs, CAPACITY)
    ref = x
    for i in range(L):
        ref = (ref.float() @ ws[(it[0] % weights) * L + i].float().t()).half()
    torch.testing.assert_close(outs[-1].float(), ref.float(), rtol=3e-2, atol=3e-2)
    if dropped:
        print(f"  ({dropped} records dropped: raise GPUOS_TRACE)")


def matmul_chain():
    """`mmC`: decode-shaped matmuls captured as programs (fp16, M = 1, no bias), one call traced each
    (program_levels): `chain` MMC_L (default 8) dependent K MMC_H -> N MMC_H (default 256) linears then an LM head
    (N MMC_VOCAB, default 32,000: Llama-small's, 2,000 column tiles run as 1,000 items of two -- Runtime's
    matmul_group; 16,000 gives one tile per item); `alone` the LM head alone; `f32` its output cast to fp32 (the
    step's logits[:, -1].float()); `cold` 12 programs of as many heads (together larger than the L2 cache) called in
    turn, the traced one's weights evicted by the others; `links` the chain without its head (not in the default
    set: `MMC_H=4096 MMC_L=4 MMC_VARIANTS=links` is a program chain of large products, one per level, with no host
    publication between them -- DEVELOPING *Next* 5; `mmL` traces the live one). Env MMC_VARIANTS (comma-separated;
    default chain,alone,f32,cold). Thirty-first session (H200, one-tile items, traced worker): a tile costs 6.6-7.4
    us in every variant, as in `mm`'s one flush -- the same items in a program, behind 8 or 60 other levels, fp32
    out or weights out of L2."""
    import torch.nn.functional as F
    from benchmarks.harness import suite as H
    L, vocab = int(os.environ.get("MMC_L", "8")), int(os.environ.get("MMC_VOCAB", "32000"))
    h = int(os.environ.get("MMC_H", "256"))
    want = os.environ.get("MMC_VARIANTS", "chain,alone,f32,cold").split(",")
    x = torch.randn(1, h, device="cuda", dtype=torch.float16)
    ws = [torch.randn(h, h, device="cuda", dtype=torch.float16) / h ** 0.5 for _ in range(L)]
    n_heads = 0 if want == ["links"] else 12  # `links` alone: no LM heads allocated (12 x vocab x h)
    heads = [torch.randn(vocab, h, device="cuda", dtype=torch.float16) / h ** 0.5 for _ in range(n_heads)]

    def links(x):
        for w in ws:
            x = F.linear(x, w)
        return x

    def chain(x):
        return F.linear(links(x), heads[0])

    def head_fn(i, f32):
        return (lambda x: F.linear(x, heads[i]).float()) if f32 else (lambda x: F.linear(x, heads[i]))
    variants = {
        "links": (f"mmC {L} linears {h} (no head)", [links]),
        "chain": (f"mmC {L} linears {h} + LM head {vocab}", [chain]),
        "alone": (f"mmC LM head {vocab} alone", [head_fn(0, False)]),
        "f32": (f"mmC LM head {vocab} alone, fp32 output", [head_fn(0, True)]),
        "cold": (f"mmC LM head {vocab}, 12 heads in turn (weights not in L2)", [head_fn(i, False) for i in range(12)]),
    }
    unknown = [k for k in want if k not in variants]
    if unknown:
        raise ValueError(f"MMC_VARIANTS: unknown {unknown}; choose from {list(variants)}")
    for key in want:
        name, fns = variants[key]
        progs = [H.capture_program(gpuos, fn, (x,), torch.cuda.synchronize)[0] for fn in fns]  # worker matmul on
        for _ in range(3):
            for p in progs:
                p(x)
        torch.cuda.synchronize()
        for p in progs[1:]:  # the others' heads after the traced one's: its weights evicted
            p(x)
        program_levels(name, progs[0], lambda: progs[0](x))
        torch.testing.assert_close(progs[0](x).float(), fns[0](x).float(), rtol=3e-2, atol=3e-2)


def attention_chain(kv=128, L=16):
    """`attnC`: bench_attention's gpuos_program_chain row traced -- L Llama-shape decode attentions (fp16), each
    reading the previous one's output, captured as a program (the worker's attention on) and replayed: one
    attention per level, as in a decode step. Where a level's time goes: the handoff before it (level_gaps), the
    claims, and per item its duration and the tile's combine (item_summary)."""
    from benchmarks import bench_attention as BA
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
    ks = [torch.randn(1, 8, kv, 128, device="cuda", dtype=torch.float16) for _ in range(L)]
    vs = [torch.randn_like(k) for k in ks]
    prog = BA.capture_with_worker_attention(BA.chain_of_attentions(q, ks, vs))
    out = []
    recs, dropped, t_flush_ns, host_ms, flush_ms = traced(lambda: out.__setitem__(slice(None), [prog()]), reps=3)
    info = prog.info()
    summarise(f"attnC {L} chained attentions 32/8 heads D 128 KV {kv} ({sum(info['levels'])} levels, "
              f"{info['tiles']} items)", recs, t_flush_ns, L * 2 * ks[0].numel() * ks[0].element_size(), host_ms,
              flush_ms)
    item_summary(recs)
    torch.testing.assert_close(out[0].float(), BA.chain_reference(q, ks, vs), rtol=2e-2, atol=2e-2)
    if dropped:
        print(f"  ({dropped} records dropped: raise GPUOS_TRACE)")


def launch_timeline(recs, kick_flag=None):
    """The launches of a trace (records of block -3). Worker launches (the side stream): how many, how many ran work,
    the median lifetime (start to exit, us) of those that ran work and of those that found nothing (standbys whose
    batch a resident worker ran), and the median gap from one launch's exit to the next one's start (the side
    stream: its gated wait, the launch). Kicks (standby flag `kick` of gpuos_ext.launch_flags(): one block on a
    publishing stream) apart: how many, how many took the poller token and filled a batch, their median and p90
    lifetime."""
    if kick_flag is None:
        kick_flag = gpuos_ext.launch_flags()["kick"]
    start, end, kick = {}, {}, set()
    for blk, gen, _idx, k, t0, flags, _e in recs:
        if blk == -3:
            if flags & kick_flag:
                kick.add(gen)
            if k == 0:
                start[gen] = t0
            else:
                end[gen] = (t0, k == 3)
    both = sorted(g for g in start if g in end)
    med = lambda v: round(statistics.median(v), 1) if v else float("nan")  # noqa: E731
    p90 = lambda v: round(sorted(v)[int(.9 * len(v))], 1) if v else float("nan")  # noqa: E731
    life = lambda g: (end[g][0] - start[g]) / 1e3  # noqa: E731
    launches = [g for g in both if g not in kick]
    kicks = [g for g in both if g in kick]
    nxt = sorted(g for g in start if g not in kick)  # the side stream's launches in order (the last may still run)
    gaps = [(start[b] - end[a][0]) / 1e3 for a, b in zip(nxt, nxt[1:]) if a in end]
    work = [life(g) for g in launches if end[g][1]]
    kick_life = [life(g) for g in kicks]
    return {"launches": len(launches), "ran_work": len(work), "life_working_us": med(work),
            "life_idle_us": med([life(g) for g in launches if not end[g][1]]), "gap_exit_to_next_start_us": med(gaps),
            "gap_p90_us": p90(gaps), "kicks": len(kicks), "kicks_filled": sum(end[g][1] for g in kicks),
            "kick_life_us": med(kick_life), "kick_life_p90_us": p90(kick_life)}


def calls(n_calls=20):
    """W5's MLP block (1x256 fp16, worker matmul) captured as a program and called n_calls times back to back,
    one trace: per call, the device span of its levels, the handoffs inside it, and the gap before the next call
    -- split at the moment the poller filled the next call's first batch (its ready word had landed: the stream's
    wait for the previous call, the call's copies and its ready-word write are behind it)."""
    from benchmarks import bench_mlp as M
    from benchmarks.harness import suite as H
    gpuos_ext._testing.set_tape_images(os.environ.get("CALLS_IMAGES", "1") != "0")  # 0: entry-by-entry replays
    gpuos_ext._testing.set_program_runs(os.environ.get("CALLS_RUNS", "1") != "0")  # 0: a ready word per level
    size = os.environ.get("CALLS_SIZE", "1x256")
    if size == "ew" or size.startswith("rounds"):  # callcost's programs on 16 x 256 fp32 (program_probe.py): the
        from tools.program_probe import callcost_fn  # one-level chain (ew) or k mean-subtract rounds (e.g. rounds8)
        x = torch.randn(16, 256, device="cuda")
        prog = gpuos.capture(callcost_fn(0 if size == "ew" else int(size[6:])), x)
    else:
        d = M.make_case(size, 10, "cuda").data
        x = d.x
        prog, _ = H.capture_program(gpuos, lambda t: M.mlp_block(t, *M._weights(d)), (x,), torch.cuda.synchronize)
    nlev = sum(prog.info()["levels"])
    for _ in range(5):
        prog(x)
    torch.cuda.synchronize()
    gpuos.flush(sync=True)
    gpuos_ext.worker_trace()  # reset
    s0 = gpuos.stats()
    t0 = time.perf_counter()
    for _ in range(n_calls):
        prog(x)
    host_us = (time.perf_counter() - t0) * 1e6 / n_calls
    s1 = gpuos.stats()
    per = {k: (s1[k] - s0[k]) / n_calls / (1e3 if k.endswith("_ns") else 1)
           for k in ("program_call_ns", "replay_stage_ns", "publish_ns", "publish_memop_ns", "publish_launch_ns",
                     "worker_launches", "gated_launches", "batches", "program_bells", "ref_site_writes", "dma_batches")}
    torch.cuda.synchronize()
    gpuos.flush(sync=True)
    recs = gpuos_ext.worker_trace()[torch.cuda.current_device()]["records"]
    fill = {r[1]: r[4] for r in recs if r[0] == -1}
    span = {}
    for blk, seq, _i, _k, t, load, exe in recs:
        if blk >= 0:
            a, b = span.get(seq, (1 << 62, 0))
            span[seq] = (min(a, t + load), max(b, t + load + exe))
    seqs = sorted(span)
    claims = [r for r in recs if r[0] >= 0]
    kick_block = gpuos_ext.launch_flags()["kick_block"]  # the block number of a kick's claim records
    by_kick = sum(r[0] == kick_block for r in claims)
    print(f"calls {size} launches: {launch_timeline(recs)}; claims {len(claims)}, by kicks {by_kick}, blocks "
          f"{len({r[0] for r in claims})}", flush=True)
    if len(seqs) != nlev * n_calls:
        print(f"calls: {len(seqs)} traced batches for {n_calls} calls of {nlev} levels; skipped")
        return
    execs, hands, gaps, waits = [], [], [], []
    for c in range(n_calls):
        ss = seqs[c * nlev:(c + 1) * nlev]
        execs.append(sum(span[s][1] - span[s][0] for s in ss) / 1e3)
        hands.append(sum(span[b][0] - span[a][1] for a, b in zip(ss, ss[1:])) / 1e3)
        if c + 1 < n_calls:
            nxt = seqs[(c + 1) * nlev]
            gaps.append((span[nxt][0] - span[ss[-1]][1]) / 1e3)
            if nxt in fill:
                waits.append((fill[nxt] - span[ss[-1]][1]) / 1e3)
    med = statistics.median
    print(f"calls {size} (images {int(gpuos_ext._testing.tape_images())}): {nlev} levels per call, host {host_us:.1f} us per call; per call (median): exec "
          f"{med(execs):.1f} us, handoffs inside {med(hands):.1f} us, gap to the next call {med(gaps):.1f} us "
          f"(of which until its first batch was filled {med(waits) if waits else float('nan'):.1f} us); "
          f"wall per call {(span[seqs[-1]][1] - span[seqs[0]][0]) / 1e3 / n_calls:.1f} us", flush=True)
    print(f"calls {size} per call (runs {int(gpuos_ext._testing.program_runs())}): "
          + ", ".join(f"{k.replace('_ns', '_us')} {v:.1f}" for k, v in per.items()), flush=True)


def main():
    os.environ.setdefault("GPUOS_TRACE", "4096")  # read when the runtime starts (gpuos.init below)
    gpuos.init(capacity=CAPACITY, threads_per_block=int(os.environ.get("TPB", "256")))
    print(gpuos.runtime_info(), flush=True)
    want = set(sys.argv[1:])
    n = 1000

    def on(s):
        return not want or s in want

    if on("calls"):
        calls(int(os.environ.get("CALLS_N", "20")))
        if want == {"calls"}:
            return
    if on("w3"):
        for rows, cols in ((8, 256), (64, 512), (128, 1024)):
            X = [torch.randn(rows, cols, device="cuda") for _ in range(n)]
            O = [torch.empty(rows, device="cuda") for _ in range(n)]
            run(f"w3 {rows}x{cols} sum", X, O, "sum")
            torch.testing.assert_close(O[3], X[3].sum(-1), rtol=1e-5, atol=1e-4)
    if on("views"):
        buf = torch.randn(n * 128, 1024, device="cuda")
        out = torch.empty(n * 128, device="cuda")
        run("views 1000 x 128x1024 of one buffer", list(buf.split(128)), list(out.split(128)), "sum")
    if on("single"):
        buf = torch.randn(n * 128, 1024, device="cuda")
        out = torch.empty(n * 128, device="cuda")
        run("single 128000x1024", None, None, "sum", big=(buf, out))
        torch.testing.assert_close(out, buf.sum(-1), rtol=1e-5, atol=1e-3)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            torch.sum(buf, -1, out=out)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 100
        print(f"  torch.sum of the same 128000x1024: {ms:.3f} ms ({buf.numel() * 4 / (ms * 1e-3) / 1e9:.0f} GB/s)")
    if on("levels"):
        levels()
    if on("mm"):
        matmul_items()
    if on("mmC"):
        matmul_chain()
    if on("mmL"):
        matmul_levels()
    if on("attn"):
        attention()
    if on("attnL"):
        attention_many(int(os.environ.get("ATTN_KV", "4096")), int(os.environ.get("ATTN_L", "16")))
    if on("attnC"):
        for kv in (int(x) for x in os.environ.get("ATTN_KVS", "128,4096").split(",")):
            attention_chain(kv, int(os.environ.get("ATTN_L", "16")))
    if on("rows"):
        for hidden in (256, 4096):
            for rf in (True, False):
                norm_rows(hidden, row_fusion=rf)
    if on("ops"):
        op_chains()
    if on("hf"):
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("hf: transformers is not installed")
        else:
            labels = os.environ.get("HF_LABELS", "llama-small-fp16-sdpa-static,gpt2-small-fp16-sdpa-static")
            for label in labels.split(","):
                hf_levels(label.strip())
    print("stats", {k: v for k, v in gpuos.stats().items() if v}, flush=True)


if __name__ == "__main__":
    main()
