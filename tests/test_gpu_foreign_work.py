"""GPU runtime with foreign work around it: GEMMs (cuBLAS) producing a batch's inputs, consuming its outputs and
issued while a worker is resident, the burst grid, early publications and joined batches, the runtime's settings
from the environment, and the claim trace (split out of test_gpu_runtime.py, whose helpers it uses).
"""

import math
import os
import time

import pytest
import torch
from torch.testing import assert_close

import gpuos
from _helpers import describe, run_python
from test_gpu_runtime import BOUND_S, SLEEP_CYCLES, ga, gpu_sleep, nan, ref

pytestmark = pytest.mark.gpu

# ============================================================================ foreign work (GEMMs)

GEMM_N = 2048


def test_gemm_produces_batch_input(rt):
    A, B = ga((GEMM_N, GEMM_N), torch.bfloat16), ga((GEMM_N, GEMM_N), torch.bfloat16)
    D = ga((GEMM_N, GEMM_N), torch.bfloat16)
    C = nan((GEMM_N, GEMM_N), torch.bfloat16)
    out = nan((GEMM_N, GEMM_N), torch.bfloat16)
    torch.matmul(A, B, out=C)
    rt.submit_add(C, D, out)
    rt.flush()
    expected = ref("add", C, D)
    assert not C.isnan().any()
    assert_close(out, expected)


def test_batch_output_consumed_by_gemm(rt):
    a, b = ga((GEMM_N, GEMM_N), torch.bfloat16), ga((GEMM_N, GEMM_N), torch.bfloat16)
    W = ga((GEMM_N, GEMM_N), torch.bfloat16)
    x = nan((GEMM_N, GEMM_N), torch.bfloat16)
    ex = ref("add", a, b)
    ey = ex @ W
    torch.cuda.synchronize()
    gpu_sleep()  # batch and GEMM would overlap if the GEMM were not ordered after the batch
    rt.submit_add(a, b, x)
    rt.flush()
    y = x @ W
    assert_close(x, ex)
    assert_close(y, ey)


def test_gemm_issued_while_worker_resident(rt):
    a, b, c = (ga((GEMM_N, GEMM_N), torch.bfloat16) for _ in range(3))
    W, P, Q = (ga((GEMM_N, GEMM_N), torch.bfloat16) for _ in range(3))
    x, w = nan((GEMM_N, GEMM_N), torch.bfloat16), nan((GEMM_N, GEMM_N), torch.bfloat16)
    ex = ref("add", a, b)
    ey = ex @ W
    ew = ref("mul", ey, c)
    epq = P @ Q
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gpu_sleep()
    rt.submit_add(a, b, x)
    rt.flush()
    y = x @ W  # GEMM right after flush: the worker may still be resident
    pq = P @ Q  # an independent GEMM too
    rt.submit_mul(y, c, w)  # second batch consumes the GEMM output
    rt.flush()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert dt < BOUND_S, f"GEMMs interleaved with batches took {dt:.1f} s"
    assert_close(x, ex)
    assert_close(y, ey)
    assert_close(pq, epq)
    assert_close(w, ew)


def test_big_flush_launches_the_burst_grid_and_gemms_still_run(rt):
    """A flush of >= burst_min (2,048) sub-ops launches the worker on every SM (stats()["burst_launches"]); a small
    one on the bounded grid. A GEMM issued right after the big batch still completes (the worker idles out)."""
    n = 3000
    a, b, out = ga((n, 256)), ga((n, 256)), nan((n, 256))
    W = ga((GEMM_N, GEMM_N), torch.bfloat16)
    ey = W @ W
    torch.cuda.synchronize()
    rt.flush(sync=True)
    torch.cuda.synchronize()  # the worker has left: the next flush launches one
    s0 = rt.stats()
    rt.submit_many("add", list(a.unbind(0)), list(b.unbind(0)), list(out.unbind(0)))  # 3,000 sub-ops
    rt.flush()
    y = W @ W
    torch.cuda.synchronize()
    s1 = rt.stats()
    assert_close(out, a + b)
    assert_close(y, ey)
    assert s1["burst_launches"] >= s0["burst_launches"] + 1, (s0, s1)  # + 1 per idle exit between early publishes
    rt.submit_add(a[0], b[0], out[0])  # one sub-op: the bounded grid
    rt.flush(sync=True)
    torch.cuda.synchronize()
    assert rt.stats()["burst_launches"] == s1["burst_launches"]
    assert "for flushes of >= 2048 sub-ops" in str(gpuos.runtime_info())


def test_batch_published_behind_a_gemm_while_the_burst_grid_is_resident_completes(rt):
    """A worker on every SM whose next batch is published behind a GEMM on the stream must not wait for it with
    every SM held (DESIGN F7): its poller, stuck on a published-but-not-ready batch, lets the blocks beyond the
    bounded grid go, the GEMM gets SMs, and the batch that reads the GEMM's output runs."""
    n = 3000
    a, b, out = ga((n, 256)), ga((n, 256)), nan((n, 256))
    W = ga((GEMM_N, GEMM_N), torch.bfloat16)
    ey = W @ W
    z = nan((GEMM_N, GEMM_N), torch.bfloat16)
    rt.flush(sync=True)
    torch.cuda.synchronize()
    s0 = rt.stats()
    t0 = time.perf_counter()
    rt.submit_many("add", list(a.unbind(0)), list(b.unbind(0)), list(out.unbind(0)))  # the burst grid
    rt.flush()
    y = W @ W  # behind the burst batch on the stream
    rt.submit_add(y, y, z)  # its ready write waits for the GEMM; the host publishes it at once
    rt.flush()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert rt.stats()["burst_launches"] > s0["burst_launches"]
    assert dt < BOUND_S, f"a batch behind a GEMM took {dt:.1f} s with the burst grid resident"
    assert_close(out, a + b)
    assert_close(y, ey)
    assert_close(z, ey + ey)


def test_recording_publishes_early_and_the_flush_still_orders_the_stream(rt):
    """>= publish_min (1,024) sub-ops recorded without a flush go out at once (stats()["early_publishes"]), with
    no stream wait; the flush() that follows -- nothing left to publish -- must still make the stream wait for
    them: a copy issued on the stream right after it sees every result."""
    n = 1024  # exactly publish_min one-tile sub-ops: all of them are published early
    a, b, out = ga((n, 4096)), ga((n, 4096)), nan((n, 4096))
    rt.flush(sync=True)
    torch.cuda.synchronize()
    s0 = rt.stats()
    rt.submit_many("add", list(a.unbind(0)), list(b.unbind(0)), list(out.unbind(0)))
    s1 = rt.stats()
    assert s1["early_publishes"] == s0["early_publishes"] + 1, (s0, s1)
    assert rt.pending() == 1  # published, but no stream is ordered after it yet
    rt.flush()
    got = out.clone()  # stream-ordered after the flush
    assert rt.pending() == 0
    torch.cuda.synchronize()
    assert_close(got, a + b)


def test_an_early_pieces_next_level_joins_it_and_waits_for_its_dependencies(rt):
    """After an early publication (publish_min = 1,024 sub-ops), what the flush records with no hazard against
    the last published level runs beside it (kReadyJoin, stats()["joined_batches"]) but still after that level's
    own dependencies: z = x + a joins y = x * b's batch and must wait for x = a + b; w = y + a depends on the
    joined level and runs after both. A spin kernel ahead on the stream holds every ready word back, so all
    four levels become ready together and a join that skipped its wait would read x before it is written."""
    n = 512  # 512 + 512 one-tile sub-ops (contiguous rows: no TensorRefs): one early publication after level 2
    a, b = [ga(4096) for _ in range(n)], [ga(4096) for _ in range(n)]
    x, y, z, w = ([nan(4096) for _ in range(n)] for _ in range(4))
    rt.flush(sync=True)
    torch.cuda.synchronize()
    s0 = rt.stats()
    torch.cuda._sleep(SLEEP_CYCLES)
    rt.submit_many("add", a, b, x)   # level 1
    rt.submit_many("mul", x, b, y)   # level 2; published early with level 1
    s1 = rt.stats()
    assert s1["early_publishes"] == s0["early_publishes"] + 1, (s0, s1)
    rt.submit_many("add", x, a, z)   # no hazard against level 2: joins it, waits for level 1
    rt.submit_many("add", y, a, w)   # reads level 2: a level after the joined one
    rt.flush()
    got = [v.clone() for lst in (x, y, z, w) for v in lst]  # stream-ordered after the flush
    torch.cuda.synchronize()
    s2 = rt.stats()
    assert s2["joined_batches"] == s1["joined_batches"] + 1, (s1, s2)
    for i in range(n):
        ex = a[i] + b[i]
        assert_close(got[i], ex)
        assert_close(got[n + i], ex * b[i])
        assert_close(got[2 * n + i], ex + a[i])
        assert_close(got[3 * n + i], ex * b[i] + a[i])


def test_a_joined_batch_that_finishes_first_still_signals_after_the_one_it_joined(rt):
    """Done words land in seq order: a tiny batch joined to a large early-published one (1,024 adds of 4,096
    floats), both made ready together behind a spin kernel, finishes first; the flush's stream wait (on the
    last batch) must still cover the large one -- a copy issued right after the flush sees every result."""
    n = 1024
    a, b, out = ga((n, 4096)), ga((n, 4096)), nan((n, 4096))
    c, d, e = ga(256), ga(256), nan(256)
    rt.flush(sync=True)
    torch.cuda.synchronize()
    s0 = rt.stats()
    torch.cuda._sleep(SLEEP_CYCLES)
    rt.submit_many("add", list(a.unbind(0)), list(b.unbind(0)), list(out.unbind(0)))  # published early
    rt.submit_add(c, d, e)            # tiny, joins it
    rt.flush()
    got, got_e = out.clone(), e.clone()
    torch.cuda.synchronize()
    s1 = rt.stats()
    assert s1["early_publishes"] == s0["early_publishes"] + 1, (s0, s1)
    assert s1["joined_batches"] == s0["joined_batches"] + 1, (s0, s1)
    assert_close(got, a + b)
    assert_close(got_e, c + d)


def test_join_levels_off_gives_the_same_results_without_joins():
    """GPUOS_JOIN_LEVELS=0 (the A/B switch): the same early-published flush, no joined batch, same results."""
    code = """
import torch, gpuos_ext
gpuos_ext.init()
a = [torch.randn(4096, device="cuda") for _ in range(1024)]
o = [torch.full((4096,), float("nan"), device="cuda") for _ in a]
c = torch.randn(256, device="cuda"); e = torch.full((256,), float("nan"), device="cuda")
gpuos_ext.submit_many("add", a, a, o)
gpuos_ext.submit_add(c, c, e)
gpuos_ext.flush(sync=True)
s = gpuos_ext.stats()
ok = all(torch.equal(x, y + y) for x, y in zip(o, a)) and torch.equal(e, c + c)
print("JOIN", ok, s["early_publishes"], s["joined_batches"])
"""
    env = {"GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"]} if os.environ.get("GPUOS_CACHE_DIR") else {}
    for flag, joined in (("0", 0), ("1", 1)):
        r = run_python(code, dict(env, GPUOS_JOIN_LEVELS=flag), timeout=150)
        assert r.returncode == 0, describe(r)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("JOIN")][-1].split()
        assert line[1:] == ["True", "1", str(joined)], (flag, line)


def test_runtime_created_on_first_use_takes_the_environments_settings():
    """Without gpuos.init(), the runtime that the first submit creates reads the GPUOS_* variables as init() does
    (it used to take the bare defaults: GPUOS_PUBLISH_MIN, GPUOS_BURST_*, GPUOS_ATTN_MIN_ROWS ... were ignored)."""
    code = """
import torch, gpuos
x = torch.randn(4096, device="cuda"); o = torch.full_like(x, float("nan"))
xs = [torch.randn(256, device="cuda") for _ in range(64)]; os_ = [torch.full_like(t, float("nan")) for t in xs]
gpuos.submit_add(x, x, o)  # no init: the runtime is created here
gpuos.submit_many("add", xs, xs, os_)
gpuos.flush(sync=True)
s = gpuos.stats()
ok = torch.equal(o, x + x) and all(torch.equal(b, a + a) for a, b in zip(xs, os_))
print("ENV", ok, s["early_publishes"], "for flushes of >= 4096 sub-ops" in str(gpuos.runtime_info()))
"""
    env = {"GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"]} if os.environ.get("GPUOS_CACHE_DIR") else {}
    r = run_python(code, dict(env, GPUOS_PUBLISH_MIN="16", GPUOS_BURST_MIN="4096"), timeout=150)
    assert r.returncode == 0, describe(r)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("ENV")][-1].split()
    assert line[1] == "True" and int(line[2]) >= 1 and line[3] == "True", line


_TRACE_SCRIPT = """
import torch, gpuos
gpuos.init(capacity=65536)
X = [torch.randn(128, 1024, device="cuda") for _ in range(300)]
O = [torch.full((128,), float("nan"), device="cuda") for _ in X]
gpuos.flush(sync=True)
torch.cuda.synchronize()  # the init's worker has left: every launch below starts and exits in the trace
gpuos.worker_trace()
l0 = gpuos.stats()["worker_launches"] + gpuos.stats()["kicks"]
for x, o in zip(X, O):
    gpuos.submit_reduce("sum", x, o)
gpuos.flush(sync=True)
torch.cuda.synchronize()  # the worker's idle exit
tr = gpuos.worker_trace()[torch.cuda.current_device()]
opens = [r for r in tr["records"] if r[0] == -1]
claims = [r for r in tr["records"] if r[0] >= 0]
starts = sorted(r[1] for r in tr["records"] if r[0] == -3 and r[3] == 0)
exits = sorted(r[1] for r in tr["records"] if r[0] == -3 and r[3] != 0)
worked = sum(1 for r in tr["records"] if r[0] == -3 and r[3] == 3)
ok = all(torch.allclose(o, x.sum(-1), rtol=1e-5, atol=1e-4) for x, o in zip(X, O))
print("TRACE", ok, tr["dropped"], sum(r[3] for r in opens), sum(r[3] for r in claims), len(opens),
      gpuos.stats()["subops"], gpuos.stats()["early_publishes"], len(gpuos.worker_trace()[0]["records"]))
print("LAUNCHES", gpuos.stats()["worker_launches"] + gpuos.stats()["kicks"] - l0, len(starts), starts == exits, worked)
"""


def test_worker_trace_accounts_for_every_sub_op():
    """GPUOS_TRACE: one record per batch opening and per claim; the claims of every batch cover exactly the
    batch's descriptors (none lost, none run twice), across early publications (300 x 8 tiles > 1,024); one start
    and one exit record per worker launch and per kick."""
    env = {"GPUOS_TRACE": "512"}
    if os.environ.get("GPUOS_CACHE_DIR"):
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    r = run_python(_TRACE_SCRIPT, env, timeout=150)
    assert r.returncode == 0, describe(r)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("TRACE")][-1].split()
    ok, dropped, opened, claimed, nopen, subops, early, after = line[1], *map(int, line[2:])
    assert ok == "True", line
    assert dropped == 0, line
    assert opened == claimed == subops == 2400, line  # 300 reductions x 8 tiles of 16 rows
    assert early >= 1 and nopen >= 2, line  # published in several batches while recording
    assert after == 0, line  # worker_trace() resets
    # Launch records (block -3): each launch of the flush (worker launches and kicks) starts and exits once, and
    # one of them ran the work.
    lline = [ln for ln in r.stdout.splitlines() if ln.startswith("LAUNCHES")][-1]
    launches, starts, paired, worked = lline.split()[1:]
    assert int(launches) >= 1 and int(starts) == int(launches) and paired == "True" and int(worked) >= 1, lline


_ITEM_TRACE_SCRIPT = """
import torch, gpuos
gpuos.init(capacity=65536)
q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
k = torch.randn(1, 8, 2048, 128, device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
o = torch.empty_like(q)
w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16) / 64
x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
y = torch.empty(1, 4096, device="cuda", dtype=torch.float16)
gpuos.worker_trace()
gpuos.submit_attention(q, k, v, o)
gpuos.flush(sync=True)
att = [r for r in gpuos.worker_trace()[torch.cuda.current_device()]["records"] if r[0] == -2]
gpuos.submit_matmul(x, w.t(), y)
gpuos.flush(sync=True)
mm = [r for r in gpuos.worker_trace()[torch.cuda.current_device()]["records"] if r[0] == -2]
w2 = torch.randn(4096, 256, device="cuda", dtype=torch.float16) / 16
x2 = torch.randn(1, 256, device="cuda", dtype=torch.float16)
y2 = torch.empty(1, 4096, device="cuda", dtype=torch.float16)
gpuos.submit_matmul(x2, w2.t(), y2)  # K 256: unsplit items
gpuos.flush(sync=True)
uns = [r for r in gpuos.worker_trace()[torch.cuda.current_device()]["records"] if r[0] == -2]
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1),
                                                       v.float().repeat_interleave(4, 1))
ok = torch.allclose(o.float(), ref, rtol=2e-2, atol=2e-2) and torch.allclose(
    y.float(), x.float() @ w.float().t(), rtol=2e-2, atol=2e-2) and torch.allclose(
    y2.float(), x2.float() @ w2.float().t(), rtol=2e-2, atol=2e-2)
nsm = torch.cuda.get_device_properties(0).multi_processor_count
for name, recs in (("ATT", att), ("MM", mm), ("UNS", uns)):
    print(name, ok, len(recs), len({r[2] for r in recs}), sum(r[3] & 0xff for r in recs),
          all(0 <= r[1] < nsm and r[4] > 0 and r[5] > 0 for r in recs),
          all(r[6] > 0 for r in recs if r[3] & 0xff), sum(r[0] != -3 for r in gpuos.worker_trace()[0]["records"]),
          sum(1 for r in recs if r[3] >> 8), sum(1 for r in recs if r[6] > 0))
"""


def test_worker_trace_item_records():
    """GPUOS_TRACE's item records: one per decode-attention item and per split-matmul item (its SM, start,
    duration), and exactly one combine / split finish per tile (32 / 8 heads, D 128, KV 2,048: 8 KV heads x 2 row
    groups = 16 tiles; 4,096^2 at M = 1: 256 column tiles of 16) -- and the results still right. Above the kind
    byte of k, the dispatch ahead of the item's first timestamp (worker.cu lead_bits): at least one item's (a part
    under 16 ns reads 0). Unsplit items (4,096 x 256 at M = 1) split their record at the end of the K loop: load
    the loads and mma steps, exec the outputs (matmul.h mm_mma's tk) -- no finish."""
    env = {"GPUOS_TRACE": "65536"}
    if os.environ.get("GPUOS_CACHE_DIR"):
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    r = run_python(_ITEM_TRACE_SCRIPT, env, timeout=150)
    assert r.returncode == 0, describe(r)
    for name, tiles in (("ATT", 16), ("MM", 256), ("UNS", 0)):
        line = [ln for ln in r.stdout.splitlines() if ln.startswith(name + " ")][-1].split()
        ok, n, distinct, combined, valid, timed, after, led, emitted = line[1], *map(int, line[2:4]), int(line[4]), \
            line[5], line[6], int(line[7]), int(line[8]), int(line[9])
        assert ok == "True", line
        assert n == distinct and n > tiles, line  # one record per item (its ring slot), more items than tiles
        assert combined == tiles, line            # one combine / finish per tile (unsplit: none)
        if name == "UNS":
            assert emitted >= 1, line             # the outputs' time after the K loop
        assert valid == "True" and timed == "True", line
        assert after == 0, line                   # worker_trace() takes the item records too (a launch record of
                                                  # the idle worker's exit may come after it)
        assert led >= 1, line                     # the items' dispatch times (tools/worker_trace.py item_lead)


def test_gemm_on_side_stream_completes_while_batches_flow(rt):
    A, B = ga((GEMM_N, GEMM_N), torch.bfloat16), ga((GEMM_N, GEMM_N), torch.bfloat16)
    eC = A @ B
    a, b, out = ga(1_000_000), ga(1_000_000), nan(1_000_000)
    torch.cuda.synchronize()
    rt.submit_add(a, b, out)
    rt.flush()  # no sync: worker may be resident on the GPU
    s = torch.cuda.Stream()
    t0 = time.perf_counter()
    with torch.cuda.stream(s):
        C = A @ B
    s.synchronize()
    dt = time.perf_counter() - t0
    assert dt < BOUND_S, f"side-stream GEMM took {dt:.1f} s with a batch just flushed"
    assert_close(C, eC)
    assert_close(out, a + b)


def test_alternating_batches_and_gemms(rt):
    n = 1024
    x = ga((n, n), torch.bfloat16)
    ex = x.clone()
    t0 = time.perf_counter()
    for _ in range(10):
        W = ga((n, n), torch.bfloat16) / math.sqrt(n)
        bias = ga((n, n), torch.bfloat16)
        h = nan((n, n), torch.bfloat16)
        gpu_sleep()
        rt.submit_add(x, bias, h)
        rt.flush()
        x = h @ W
        ex = ref("add", ex, bias) @ W
    torch.cuda.synchronize()
    assert time.perf_counter() - t0 < BOUND_S
    assert_close(x, ex)
