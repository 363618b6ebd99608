"""Several GPUs (issue #20): one runtime per device, flush per device and stream, threads per device, and NCCL
collectives inside scheduler_context.

Single-GPU tests (in process): flush(stream=) / flush(device=) semantics. Two-GPU tests (skipped with fewer): each
runs in a child process (``_helpers.run_python``, bounded) whose every wait is bounded (GPUOS_TIMEOUT_S, joins with
timeouts, a faulthandler exit): one process driving both devices from one thread and from one thread per device,
and a 2-process NCCL group (torch.multiprocessing spawn) checking worker-produced tensors all_reduced / all_gathered
inside scheduler_context against eager. The whole file: well under 90 s on a 2-GPU host with a warm JIT cache.
"""
import json
import os
import subprocess

import pytest
import torch

from _helpers import describe, run_python

pytestmark = pytest.mark.gpu

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
CHILD_TIMEOUT_S = 150


def _busy(stream=None, ms=30):
    """Keep `stream` busy on the GPU for about `ms` ms (a spin kernel), so that work queued behind it runs late."""
    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        torch.cuda._sleep(int(ms * 2_000_000))


# ------------------------------------------------------------------------------------------ one GPU: semantics
def test_flush_stream_waits_for_deferred_stream(rt):
    """Deferred ops recorded under the current stream, flushed with stream=s2: s2 must wait for them (an event),
    though they run on the stream they were recorded under. A read on s2 sees the results, not the sentinel."""
    import gpuos

    a = torch.randn(4096, device="cuda")
    s2 = torch.cuda.Stream()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        _busy()                       # the deferred batch runs after ~30 ms on the current stream
        y = torch.tanh(a) * 0.5 + a
        gpuos.flush(stream=s2)        # published on the current stream; s2 waits for it
        with torch.cuda.stream(s2):
            seen = y.clone()          # on s2
    torch.cuda.synchronize()
    torch.testing.assert_close(seen, torch.tanh(a) * 0.5 + a)


def test_flush_explicit_work_on_given_stream(rt):
    import gpuos

    a, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    out = torch.full_like(a, float("nan"))
    s2 = torch.cuda.Stream()
    s2.wait_stream(torch.cuda.current_stream())   # a, b are ready on s2
    gpuos.submit_add(a, b, out)
    _busy(s2)                                     # the publication queues behind s2's spin
    gpuos.flush(stream=s2)
    assert rt.pending() == 0
    with torch.cuda.stream(s2):
        seen = out.clone()
    torch.cuda.synchronize()
    torch.testing.assert_close(seen, a + b)


def test_flush_device_argument(rt):
    import gpuos

    a = torch.randn(1024, device="cuda")
    out = torch.empty_like(a)
    gpuos.submit_mul(a, a, out)
    assert rt.pending() == 1
    gpuos.flush(device=torch.cuda.device_count())  # no runtime there: nothing happens
    assert rt.pending() == 1
    gpuos.flush(device=torch.cuda.current_device(), sync=True)
    assert rt.pending() == 0
    torch.testing.assert_close(out, a * a)


def test_scheduler_flush_this_thread_only(rt):
    """A context's exit / explicit flush publishes the calling thread's devices only: another thread's deferred
    ops wait for that thread's own flush (threads per device never publish each other's half-recorded batches)."""
    import threading

    import gpuos
    import gpuos_ext

    gpuos_ext.sched_flush("explicit", True)  # this thread's own earlier work (earlier tests) goes out first
    a = torch.randn(2048, device="cuda")
    recorded, checked = threading.Event(), threading.Event()
    box = {}

    def recorder():
        try:
            with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
                box["y"] = torch.sigmoid(a) + 1.0
                recorded.set()
                if not checked.wait(30):
                    raise TimeoutError("main thread did not check in 30 s")
        except BaseException as e:  # noqa: BLE001
            box["err"] = e
            recorded.set()

    t = threading.Thread(target=recorder, daemon=True)
    t.start()
    assert recorded.wait(30), "recorder did not record in 30 s"
    try:
        assert "err" not in box, box.get("err")
        assert gpuos_ext.sched_flush("explicit", True) == []  # this thread deferred nothing
        assert gpuos_ext.sched_stats()["deferred"] >= 1       # the recorder's ops are still deferred
    finally:
        checked.set()
        t.join(30)
    assert not t.is_alive() and "err" not in box, box.get("err")
    torch.cuda.synchronize()
    torch.testing.assert_close(box["y"], torch.sigmoid(a) + 1.0)


# ------------------------------------------------------------------------------------------ two GPUs, one process
_DEVICES_CHILD = r'''
import faulthandler, json, threading, traceback
faulthandler.dump_traceback_later(120, exit=True)
import torch, gpuos, gpuos_ext
from torch.testing import assert_close

fail = []
def check(name, got, want):
    try:
        assert_close(got, want)
    except AssertionError as e:
        fail.append(f"{name}: {str(e)[:300]}")

# 1. One thread, both devices: contexts record on each device; flush(device=) publishes that device only.
for d in (0, 1):
    with torch.cuda.device(d):
        gpuos.init()
x = [torch.randn(4096, device=f"cuda:{d}") for d in (0, 1)]
with torch.no_grad(), gpuos.scheduler_context():
    y = [torch.tanh(t) * 2 + t for t in x]
for d in (0, 1):
    check(f"ctx cuda:{d}", y[d], torch.tanh(x[d]) * 2 + x[d])
outs = [torch.empty_like(t) for t in x]
for d in (0, 1):
    gpuos.submit_add(x[d], x[d], outs[d])
assert gpuos_ext.pending() == 2, gpuos_ext.pending()
gpuos.flush(device=1)
assert gpuos_ext.pending() == 1, gpuos_ext.pending()
s1 = torch.cuda.Stream(device=1)
gpuos.submit_mul(x[1], x[1], outs[1])
with torch.cuda.device(0):  # a stream of cuda:1 while cuda:0 is current: only cuda:1, on s1
    s1.wait_stream(torch.cuda.current_stream(1))
    gpuos.flush(stream=s1, sync=True)
    assert gpuos_ext.pending() == 1, gpuos_ext.pending()
gpuos.flush(sync=True)
assert gpuos_ext.pending() == 0
check("explicit cuda:0", outs[0], x[0] + x[0])
check("explicit cuda:1 (s1)", outs[1], x[1] * x[1])
try:
    gpuos.flush(stream=s1, device=0)
    fail.append("flush(stream of cuda:1, device=0) did not raise")
except ValueError as e:
    if "belongs to another device" not in str(e):
        fail.append(f"flush(stream of cuda:1, device=0): {e}")

# 2. One thread per device: contexts, explicit submits and flushes with the thread's device / stream.
errors = []
ITERS = 200
def per_device(d):
    try:
        torch.cuda.set_device(d)
        s = torch.cuda.Stream(device=d)
        g = torch.Generator(device=f"cuda:{d}").manual_seed(d)
        a = torch.randn(8192, device=f"cuda:{d}", generator=g)
        with torch.cuda.stream(s):
            for i in range(ITERS):
                with torch.no_grad(), gpuos.scheduler_context():
                    y = torch.relu(a * (i % 7) - 1.0) + torch.sigmoid(a)
                o = torch.empty_like(a)
                gpuos.submit("mul", [y, 0.5], o)
                gpuos.flush(stream=s) if i % 2 else gpuos.flush(device=d)
                want = (torch.relu(a * (i % 7) - 1.0) + torch.sigmoid(a)) * 0.5
                if i % 25 == 0 or i == ITERS - 1:
                    gpuos.flush(device=d, sync=True)
                    if not torch.allclose(o, want, atol=1e-5, rtol=1e-5):
                        errors.append(f"cuda:{d} iteration {i}: max err {(o - want).abs().max().item()}")
    except BaseException:
        errors.append(f"cuda:{d}: " + traceback.format_exc()[-1500:])
ts = [threading.Thread(target=per_device, args=(d,), daemon=True) for d in (0, 1)]
for t in ts: t.start()
for t in ts: t.join(90)
hung = [t.name for t in ts if t.is_alive()]
gpuos.shutdown()
print("GPUOS_RESULT " + json.dumps({"fail": fail, "errors": errors, "hung": hung}))
'''


def _child_env():
    env = {"GPUOS_TIMEOUT_S": "20"}
    if os.environ.get("GPUOS_CACHE_DIR"):
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    return env


def _result(proc):
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPUOS_RESULT ")]
    assert proc.returncode == 0 and lines, describe(proc)
    return json.loads(lines[-1].split(" ", 1)[1])


@two_gpus
@pytest.mark.watchdog(CHILD_TIMEOUT_S + 30)
def test_two_devices_one_process_threads():
    try:
        proc = run_python(_DEVICES_CHILD, env_extra=_child_env(), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"two-device child hung past {CHILD_TIMEOUT_S} s: {e.stdout!r}\n{e.stderr!r}")
    r = _result(proc)
    assert r == {"fail": [], "errors": [], "hung": []}, describe(proc)


# ------------------------------------------------------------------------------------------ two GPUs, NCCL
_NCCL_CHILD = r'''
import faulthandler, json, os, socket, sys, traceback, datetime
faulthandler.dump_traceback_later(120, exit=True)
import torch, torch.distributed as dist, torch.multiprocessing as mp

def body(rank, port, q):
    try:
        import gpuos
        import torch.distributed._functional_collectives as funcol
        torch.cuda.set_device(rank)
        os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("nccl", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60),
                                device_id=torch.device("cuda", rank))
        g = torch.Generator(device="cuda").manual_seed(100 + rank)
        a = torch.randn(4096, device="cuda", generator=g)
        b = torch.randn(4096, device="cuda", generator=g)
        w = torch.randn(64, 4096, device="cuda", dtype=torch.float16, generator=g) / 64

        gpuos.init()

        def step(sched):
            torch.cuda._sleep(60_000_000)   # the stream is busy: worker batches run late, an unordered read fails
            t = torch.tanh(a) * 2 + b       # worker tasks
            dist.all_reduce(t)              # c10d.allreduce_ on the worker's output, in place
            u = t * 0.5 + 1.0               # later tasks read NCCL's result
            o = torch.empty(2 * 4096, device="cuda")
            dist.all_gather_into_tensor(o, torch.sigmoid(u))
            r = funcol.all_reduce(u - 1.0, "sum", dist.group.WORLD)   # AsyncCollectiveTensor
            v = r * 3 + o[:4096]            # deferred reads of a functional collective's result
            x = torch.nn.functional.linear(v.half().view(1, -1), w)   # a matmul (worker matmul when enabled)
            hidden = torch.relu(x.float()) + 1
            dist.all_reduce(hidden)
            if sched:
                e = torch.empty_like(b)
                gpuos.submit("add", [b, 1.0], e)  # explicit-API work pending when the collective is issued
            else:
                e = b + 1.0
            dist.all_reduce(e)
            return [t, u, o, v, hidden, e]

        with torch.no_grad():
            ref = [x.clone() for x in step(False)]
            torch.cuda.synchronize()
            res = {}
            for mm in (False, True):
                gpuos.set_worker_matmul(mm)
                before = gpuos.scheduler_stats()
                with gpuos.scheduler_context(auto_flush_ms=0):
                    got = step(True)
                torch.cuda.synchronize()
                st = gpuos.scheduler_stats()
                bad = [i for i, (x, y) in enumerate(zip(ref, got)) if not torch.allclose(x, y, atol=2e-2, rtol=2e-3)]
                res[str(mm)] = {"bad": bad,
                                "intercepted": st["ops_intercepted"] - before["ops_intercepted"],
                                "collective": st["fallbacks"].get("collective", 0) - before["fallbacks"].get("collective", 0)}
        q.put((rank, res, None))
        dist.destroy_process_group()
    except BaseException:
        q.put((rank, None, traceback.format_exc()[-2500:]))

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=body, args=(r, port, q)) for r in range(2)]
    for p in ps: p.start()
    out = []
    try:
        for _ in ps:
            out.append(q.get(timeout=100))
    finally:
        for p in ps:
            p.join(timeout=20)
            if p.is_alive(): p.kill()
    print("GPUOS_RESULT " + json.dumps(sorted(out, key=lambda r: r[0])))
'''


@two_gpus
@pytest.mark.watchdog(CHILD_TIMEOUT_S + 30)
def test_nccl_collectives_inside_scheduler_context(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed with NCCL not available")
    script = tmp_path / "nccl_child.py"
    script.write_text(_NCCL_CHILD)
    try:
        proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                          env_extra=_child_env(), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"NCCL child hung past {CHILD_TIMEOUT_S} s: {e.stdout!r}\n{e.stderr!r}")
    ranks = _result(proc)
    assert len(ranks) == 2, describe(proc)
    for rank, res, err in ranks:
        assert err is None, f"rank {rank}:\n{err}"
        for mm, r in res.items():
            assert r["bad"] == [], f"rank {rank} worker_matmul={mm}: outputs {r['bad']} differ from eager"
            assert r["intercepted"] >= 8, (rank, mm, r)   # the tensors really came from the worker
            assert r["collective"] >= 4, (rank, mm, r)    # every collective went through the dispatch mode
