"""Faults a user's injected code can cause, each in a child process (a stuck or faulted worker is per process):

* an op that never returns: the waiting call raises CudaError after GPUOS_TIMEOUT_S, naming the batch and the op;
  shutdown() raises too and abandons the stuck runtime; init() then refuses at once (a stuck kernel can block
  module loads in the context without bound) and says to restart; the process still exits;
* an op that traps: the waiting call raises CudaError at once (not after the timeout) saying the CUDA context is
  lost;
* a generation whose module fails to load: the running generation keeps serving, the failure is recorded in
  generation_info(), and the next flush that needs the new generation loads it.

Every child registers the same op set (one generation), so with a shared GPUOS_CACHE_DIR only the first child
compiles it.
"""

import json
import os
import time

import pytest

from _helpers import describe, run_python

pytestmark = pytest.mark.gpu

_PRELUDE = r'''
import faulthandler, json, os, time
faulthandler.dump_traceback_later(200, exit=True)
import torch, gpuos, gpuos_ext
gpuos_ext.init()
x = torch.randn(4096, device="cuda")
out = torch.empty_like(x)
dev = torch.cuda.current_device()
def register():
    with gpuos.batch_install(wait=True):
        gpuos.register_op("fault_spin", "__device__ float fault_spin(float a) { for (;;) __nanosleep(1000); return a; }")
        gpuos.register_op("fault_trap", "__device__ float fault_trap(float a) { __trap(); return a; }")
        gpuos.register_elementwise("fault_ok", "a * 2.0f + 1.0f", arity=1)
def result(**kw):
    print("GPUOS_RESULT " + json.dumps(kw), flush=True)
'''


def _run(body, timeout_s):
    env = {"GPUOS_TIMEOUT_S": str(timeout_s)}
    if os.environ.get("GPUOS_CACHE_DIR"):
        env["GPUOS_CACHE_DIR"] = os.environ["GPUOS_CACHE_DIR"]
    t0 = time.monotonic()
    proc = run_python(_PRELUDE + body, env_extra=env, timeout=240)
    wall = time.monotonic() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPUOS_RESULT ")]
    assert lines, describe(proc)
    return json.loads(lines[-1][len("GPUOS_RESULT "):]), proc, wall


@pytest.mark.watchdog(300)
def test_op_that_never_returns_times_out_naming_batch_and_op():
    out, proc, wall = _run(r'''
register()
gpuos_ext.submit_add(x, x, out)
gpuos_ext.flush(sync=True)
ok_before = bool(torch.equal(out, x + x))
t0 = time.monotonic()
try:
    gpuos.submit("fault_spin", [x], out)
    gpuos.flush(sync=True)
    err = None
except gpuos_ext.CudaError as e:
    err = str(e)
waited = time.monotonic() - t0
try:   # the stuck runtime cannot finish: shutdown raises, and abandons it so that init() starts a new one
    gpuos_ext.shutdown()
    shut = "no error"
except gpuos_ext.CudaError as e:
    shut = "CudaError: " + str(e)
still = gpuos_ext.is_initialized()
t1 = time.monotonic()
try:   # refused at once: a stuck kernel in the context can block module loads without bound
    gpuos_ext.init()
    reinit = "no error"
except gpuos_ext.CudaError as e:
    reinit = "CudaError: " + str(e)
result(ok_before=ok_before, err=err, waited=waited, shut=shut, still=still, reinit=reinit,
       reinit_s=time.monotonic() - t1, t_exit=time.time())
''', timeout_s=3)
    assert out["ok_before"], out
    err = out["err"]
    assert err is not None, "flush(sync=True) returned although the op never finishes"
    assert "timed out after 3" in err and "batch" in err and "fault_spin" in err, err
    assert 2.5 <= out["waited"] < 30, out
    assert out["shut"].startswith("CudaError") and not out["still"], out
    assert out["reinit"].startswith("CudaError") and "abandoned" in out["reinit"], out
    assert "Restart the process" in out["reinit"] and out["reinit_s"] < 1.0, out
    # The process ends although its worker never will (atexit shutdown gives up after the timeout).
    assert time.time() - out["t_exit"] < 60, describe(proc)


@pytest.mark.watchdog(300)
def test_op_that_traps_says_the_context_is_lost():
    out, proc, wall = _run(r'''
register()
t0 = time.monotonic()
try:
    gpuos.submit("fault_trap", [x], out)
    gpuos.flush(sync=True)
    err = None
except gpuos_ext.CudaError as e:
    err = str(e)
result(err=err, waited=time.monotonic() - t0, t_exit=time.time())
''', timeout_s=30)
    err = out["err"]
    assert err is not None, "a trapping op raised nothing"
    assert "context is lost" in err and "restart the process" in err, err
    assert out["waited"] < 20, f"the fault was found by the timeout, not at once: {out}"
    assert time.time() - out["t_exit"] < 90, describe(proc)


@pytest.mark.watchdog(300)
def test_failed_module_load_keeps_the_running_generation():
    out, proc, wall = _run(r'''
gpuos_ext.submit_add(x, x, out)
gpuos_ext.flush(sync=True)
active0 = gpuos.generation_info()["active"][dev]
gpuos_ext._testing.fail_next_module_loads(1)
register()   # the new generation is ready; its first load (idle adoption or the next flush's) fails
r = {"active0": active0}
y = torch.randn(4096, device="cuda")
gpuos_ext.submit_add(x, y, out)
gpuos_ext.flush(sync=True)
r["serving"] = bool(torch.equal(out, x + y))
info = gpuos.generation_info()
r["active1"] = info["active"][dev]
r["latest"] = info["ready"]
r["errors"] = [g.get("error", "") for g in info["generations"]]
gpuos.submit("fault_ok", [x], out)     # needs the new generation: loads it again (no failure left), runs
gpuos.flush(sync=True)
r["ok_op"] = bool(torch.allclose(out, x * 2 + 1))
r["active2"] = gpuos.generation_info()["active"][dev]
result(**r)
''', timeout_s=20)
    assert out["serving"] and out["active1"] == out["active0"] < out["latest"], out
    assert any("failed to load" in e and "keeps running" in e for e in out["errors"]), out
    assert out["ok_op"] and out["active2"] == out["latest"], out
