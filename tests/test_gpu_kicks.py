"""Kicks (the default; GPUOS_KICKS=0: gated standbys; docs/design/programs.md *Kicks*): every publication launches
one block of the worker kernel on its own stream behind its ready words instead of a gated standby on the side
stream, and the poller role is a device token. Each test runs a child process with the setting (it is read when the
runtime starts) and checks results against eager, what the launches did (stats, launch records) and that nothing
wedges. The rest of the GPU suite runs with the default; the tests here marked "standbys" keep the GPUOS_KICKS=0
path covered."""
import json
import os

import pytest

from _helpers import describe, run_python
from test_gpu_reliability import _DEVICE_WIDE_CHILD

pytestmark = pytest.mark.gpu


def _env(kicks="1", **extra):
    env = {"GPUOS_KICKS": kicks, "GPUOS_TIMEOUT_S": "20", **extra}
    if os.environ.get("GPUOS_CACHE_DIR"):
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    return env


def _result(proc, tag="KICKS"):
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag + " ")]
    assert proc.returncode == 0 and lines, describe(proc)
    return json.loads(lines[-1][len(tag) + 1:])


_LOOP = """
import json, torch, gpuos, gpuos_ext
gpuos.init()
kicks = gpuos_ext.config()["GPUOS_KICKS"]
x = torch.randn(16, 256, device="cuda")
f = lambda t: torch.sigmoid(torch.relu(t + 1.0) * 2.0)
prog = gpuos.capture(f, x)
torch.cuda.synchronize()
gpuos_ext.worker_trace()
s0 = gpuos.stats()
xs = [torch.randn(16, 256, device="cuda") for _ in range(300)]
outs = [prog(t) for t in xs]
torch.cuda.synchronize()
s1 = gpuos.stats()
recs = gpuos_ext.worker_trace()[torch.cuda.current_device()]["records"] if gpuos_ext.config()["GPUOS_TRACE"] != "0" else []
KICK = gpuos_ext.launch_flags()["kick"]
kick_starts = sum(1 for r in recs if r[0] == -3 and r[3] == 0 and r[5] & KICK)
kick_exits = sum(1 for r in recs if r[0] == -3 and r[3] != 0 and r[5] & KICK)
ok = all(torch.allclose(o, f(t), rtol=1e-5, atol=1e-6) for o, t in zip(outs, xs))
res = dict(ok=ok, setting=kicks, kick_starts=kick_starts, kick_exits=kick_exits,
           **{k: s1[k] - s0[k] for k in ("kicks", "worker_launches", "gated_launches", "batches")})
print("KICKS", json.dumps(res))
gpuos.shutdown()
print("KICKS", json.dumps(dict(res, shutdown=True)))
"""


def test_program_loop_with_kicks():
    """300 calls back to back: right results, one kick and no gated launch per call, and far fewer worker launches
    than calls (a resident worker runs the batches; a kick that finds the token held exits). The trace's launch
    records show every kick start and exit (standby flags: kStandbyKick). shutdown() waits for the kicks."""
    out = _result(run_python(_LOOP, env_extra=_env(GPUOS_TRACE="4096"), timeout=170))
    assert out["ok"] and out.get("shutdown") and out["setting"] == "1", out
    assert out["kicks"] == 300 and out["gated_launches"] == 0, out
    assert out["worker_launches"] < 100, out
    assert out["kick_starts"] == out["kick_exits"] == 300, out


def test_kicks_run_the_batches_when_no_worker_is_resident():
    """A worker idle time of 0 (every worker leaves at once): the kicks take the token and run the calls
    themselves, one block each -- still right."""
    out = _result(run_python(_LOOP, env_extra=_env(GPUOS_IDLE_US="0", GPUOS_PROGRAM_IDLE_US="0"), timeout=170))
    assert out["ok"] and out.get("shutdown") and out["kicks"] == 300, out


_LIVE = """
import json, torch, gpuos
gpuos.init()
torch.manual_seed(0)
xs = [torch.randn(64, 512, device="cuda") for _ in range(20)]
w = torch.randn(512, 512, device="cuda") / 16
ok = True
s0 = gpuos.stats()
for step in range(50):
    with gpuos.scheduler_context():
        ys = [((x * 0.5 + 1.0).relu() - x.mean(-1, keepdim=True)) for x in xs]
        z = ys[step % 20] @ w          # eager (cuBLAS): the next flush's stream is busy with it
        zs = [(y + z).sigmoid() for y in ys[:4]]
    ref_y = [((x * 0.5 + 1.0).relu() - x.mean(-1, keepdim=True)) for x in xs]
    ref_z = ref_y[step % 20] @ w
    ok = ok and all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(ys, ref_y))
    ok = ok and all(torch.allclose(a, (b + ref_z).sigmoid(), rtol=1e-4, atol=1e-5) for a, b in zip(zs, ref_y[:4]))
s1 = gpuos.stats()
print("KICKS", json.dumps(dict(ok=ok, kicks=s1["kicks"] - s0["kicks"], publications=s1["publications"] - s0["publications"],
                               gated=s1["gated_launches"] - s0["gated_launches"])))
"""


def test_live_scheduler_with_kicks():
    """The scheduler's flushes behind eager work on the same stream: one kick per publication, no gated launch,
    results equal eager."""
    out = _result(run_python(_LIVE, env_extra=_env(), timeout=170))
    assert out["ok"] and out["gated"] == 0 and out["kicks"] == out["publications"] > 0, out


def test_small_publications_run_by_their_kicks_alone():
    """GPUOS_KICK_ALONE: a publication of at most that many sub-ops launches no worker -- its kick (one block on
    the caller's stream) runs it. 300 calls: right results, one kick each, no worker launch at all."""
    out = _result(run_python(_LOOP, env_extra=_env(GPUOS_KICK_ALONE="100000"), timeout=170))
    assert out["ok"] and out.get("shutdown") and out["setting"] == "1", out
    assert out["kicks"] == 300 and out["worker_launches"] == 0 and out["gated_launches"] == 0, out


def test_live_scheduler_with_kicks_alone():
    """The live scheduler's flushes behind eager matmuls, every publication run by its kick alone: results equal
    eager, nothing waits for a worker that was never launched."""
    out = _result(run_python(_LIVE, env_extra=_env(GPUOS_KICK_ALONE="100000"), timeout=170))
    assert out["ok"] and out["gated"] == 0 and out["kicks"] == out["publications"] > 0, out


def test_program_loop_with_standbys():
    """GPUOS_KICKS=0 (the gated standbys of the sessions before kicks): the same 300 calls are right, no kick is
    launched, the calls that found the stream busy queued gated standbys, and shutdown() completes."""
    out = _result(run_python(_LOOP, env_extra=_env(kicks="0", GPUOS_TRACE="4096"), timeout=170))
    assert out["ok"] and out.get("shutdown") and out["setting"] == "0", out
    assert out["kicks"] == 0 and out["kick_starts"] == 0 and out["gated_launches"] > 0, out


def test_program_loop_with_waiting_kicks():
    """GPUOS_KICK_WAIT=1: a kick that finds the worker holding the token stays until its call's batches are done,
    running claims. 300 calls: right results, one kick each, the resident worker kept, shutdown() completes."""
    out = _result(run_python(_LOOP, env_extra=_env(GPUOS_KICK_WAIT="1", GPUOS_TRACE="4096"), timeout=170))
    assert out["ok"] and out.get("shutdown") and out["setting"] == "1", out
    assert out["kicks"] == 300 and out["gated_launches"] == 0 and out["worker_launches"] < 100, out
    assert out["kick_starts"] == out["kick_exits"] == 300, out


def test_live_scheduler_with_waiting_kicks():
    """The live scheduler's flushes behind eager matmuls with waiting kicks: results equal eager."""
    out = _result(run_python(_LIVE, env_extra=_env(GPUOS_KICK_WAIT="1"), timeout=170))
    assert out["ok"] and out["gated"] == 0 and out["kicks"] == out["publications"] > 0, out


_ADOPT = """
import json, time, torch, gpuos, gpuos_ext
gpuos.init()
gpuos_ext.set_specialize_after(3)  # the program's row code goes to tier 2 after 3 replays
dev = torch.cuda.current_device()
x = torch.randn(16, 256, device="cuda")
def f(t):
    for _ in range(4):
        t = (t - t.mean(-1, keepdim=True)) * 0.5
    return t
prog = gpuos.capture(f, x)
ref = f(x)
torch.cuda.synchronize()
g0 = gpuos.generation_info()["active"][dev]
s0 = gpuos.stats()
calls, t_end = 0, time.monotonic() + 90
while gpuos.generation_info()["ready"] <= g0 and time.monotonic() < t_end:  # no synchronization: always busy
    for _ in range(16):
        out = prog(x)
    calls += 16
ready = gpuos.generation_info()["ready"]
outs = [prog(x) for _ in range(200)]
active = gpuos.generation_info()["active"][dev]  # before any synchronization
torch.cuda.synchronize()
s1 = gpuos.stats()
ok = all(torch.allclose(o, ref, rtol=1e-4, atol=1e-5) for o in outs + [out])
print("KICKS", json.dumps(dict(ok=ok, g0=g0, ready=ready, active=active, calls=calls,
                               **{k: s1[k] - s0[k] for k in ("busy_adoptions", "idle_adoptions", "handovers")})))
"""


def test_busy_program_loop_adopts_a_ready_generation():
    """A program called back to back, never synchronized, with a worker idle time longer than the loop (the worker
    stays resident for good: a kick covers every call): once a newer generation is ready (the program's tier-2
    code), the next publication waits for the published calls and hands over -- the loop runs the newer
    generation's code before it ends (before the fix it ran the interpreter until the loop paused), with results
    equal to eager throughout."""
    out = _result(run_python(_ADOPT, env_extra=_env(GPUOS_IDLE_US="100000", GPUOS_PROGRAM_IDLE_US="100000"),
                             timeout=170))
    assert out["ok"] and out["ready"] > out["g0"], out
    assert out["active"] >= out["ready"] and out["busy_adoptions"] >= 1 and out["handovers"] >= 1, out


_TWO_PUBLICATIONS = """
import json, sys, torch, gpuos, gpuos_ext
sys.path.insert(0, TESTS_DIR)
from test_gpu_programs import decode_block  # a worker matmul, decode attention, silu: two segments per call
gpuos.init()
gpuos.set_worker_matmul(True)
gpuos.set_worker_attention(True)
block = decode_block()
hs = [torch.randn(1, 64, device="cuda", dtype=torch.float16) for _ in range(8)]
prog = gpuos.capture(block, hs[0])
want = [block(h) for h in hs]
torch.cuda.synchronize()
one = gpuos.stats()["publications"]
prog(hs[0])
torch.cuda.synchronize()
s0 = gpuos.stats()
one = s0["publications"] - one  # one call's publications (its segments)
n = 400
outs = [prog(hs[i % 8]) for i in range(n)]
torch.cuda.synchronize()
s1 = gpuos.stats()
ok = all(torch.allclose(o.float(), want[i % 8].float(), rtol=2e-2, atol=2e-2) for i, o in enumerate(outs))
print("KICKS", json.dumps(dict(ok=ok, n=n, one=one, **{k: s1[k] - s0[k] for k in
      ("publications", "kicks", "worker_launches", "gated_launches", "handovers")})))
"""


def test_two_publication_calls_keep_the_worker_resident():
    """400 calls of a program of two segments (two publications per call: test_gpu_program_calls.py's loop) with a
    worker idle time longer than the loop: one kick per publication, no gated launch, and the resident worker runs
    the calls -- a worker launch where a handover (a newer generation taken over) made it leave, and a few more at
    most."""
    code = _TWO_PUBLICATIONS.replace("TESTS_DIR", repr(os.path.dirname(os.path.abspath(__file__))))
    out = _result(run_python(code, env_extra=_env(GPUOS_IDLE_US="100000", GPUOS_PROGRAM_IDLE_US="100000"),
                             timeout=170))
    assert out["ok"] and out["one"] >= 2 and out["publications"] == out["one"] * out["n"], out
    assert out["kicks"] == out["publications"] and out["gated_launches"] == 0, out
    assert out["worker_launches"] <= out["handovers"] + out["n"] // 50, out  # (a launch per call: 400)


@pytest.mark.watchdog(200)
@pytest.mark.parametrize("setting", [dict(kicks="0"), dict(GPUOS_KICK_WAIT="1")], ids=["standbys", "waiting_kicks"])
def test_publication_beside_device_wide_blocking_calls(setting):
    """The wedge regression of test_gpu_reliability.py (which runs with kicks, the default) with GPUOS_KICKS=0 and
    with waiting kicks (a kick that stays on its stream until its batches are done): three publishing threads beside
    a thread that frees memory, synchronizes and starts threads that run their first GEMM -- every thread finishes,
    results are right, shutdown() completes."""
    proc = run_python(_DEVICE_WIDE_CHILD, env_extra=_env(GPUOS_TIMEOUT_S="10", GPUOS_IDLE_US="20", **setting),
                      timeout=170)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPUOS_RESULT ")]
    assert lines, "the child printed no result (a wedge: see every thread's stack below)\n" + describe(proc)
    out = json.loads(lines[-1][len("GPUOS_RESULT "):])
    assert not out["stuck"] and not out["errors"] and not out["wrong"], (out, describe(proc))
    assert len(out["publish_iters"]) == 3 and min(out["publish_iters"]) > 0 and out["blocking_iters"] > 0, out
