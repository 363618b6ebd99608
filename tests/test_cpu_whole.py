"""The background whole build without a GPU (csrc/inject/whole.h): a linked tier-2 generation is compiled again
as one whole NVRTC program by a helper process, whose image becomes the next generation; a newer tier-2
generation supersedes a running helper (killed), and exit kills a running one instead of waiting for it.

Each case runs in a child process with its own cache dir (the session cache's worker objects copied in), so the
whole image is never a cache hit from an earlier test and the helper really compiles."""

import os
import time
from pathlib import Path

import pytest

import gpuos_ext
from _helpers import REPO_ROOT, describe, run_python, seeded_cache
from test_cpu_link import _op_id, _program, cold_cache, requires_link  # noqa: F401 (cold_cache: a fixture)


def _env(cache):
    return {"GPUOS_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": "", "GPUOS_WHOLE_BUILD": "1"}


def _child_env(cache):
    """The whole environment of a child started with subprocess directly (run_python adds the repo path itself)."""
    return dict(os.environ, **_env(cache), PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _prog(scale):
    """A two-instruction program whose constant makes its tier-2 code (and so the generation's header) unique."""
    return _program([(_op_id("add"), 2, [0, 1], 0.0, 0.0), (_op_id("clamp_min"), 3, [2], scale, 0.0)], 2, 3)


_PUBLISH = r"""
import struct, gpuos_ext
gpuos_ext._registry_add_arch("sm_90")
gpuos_ext._request_tier2([(7, PROG)])
linked = gpuos_ext.wait_generations()
assert gpuos_ext.wait_whole_builds(900), gpuos_ext.whole_build_info()
w = gpuos_ext.whole_build_info()
assert (w["requested"], w["helpers"], w["published"], w["failed"]) == (1, 1, 1, 0), w
info = gpuos_ext.generation_info()
last = info["generations"][-1]
src = info["generations"][linked]
assert info["latest"] == linked + 1 and info["ready"] == linked + 1, info
assert last["whole_of"] == linked and last["ops"] == src["ops"] == ["fused#7"] and last["state"] == "ready", info
whole = gpuos_ext._generation_image(linked + 1, "sm_90")
lnk = gpuos_ext._generation_image(linked, "sm_90")
assert whole[:4] == b"\x7fELF" and struct.unpack_from("<H", whole, 18)[0] == 190 and whole != lnk
# The helper's image is the one this process would compile whole (same JIT key): read from the cache, no NVRTC.
n = gpuos_ext.stats()["jit_compiles"]
gpuos_ext._set_link_override(0)
again = gpuos_ext._generation_image_for("sm_90", [], [(7, PROG)])
assert again == whole and gpuos_ext.stats()["jit_compiles"] == n
assert gpuos_ext.link_info()["linked_generations"] >= 1
print("OK", w["last_s"])
"""


@requires_link
def test_whole_build_becomes_the_next_generation(cold_cache):
    cache = cold_cache
    p = run_python(f"PROG = {_prog(3.0)!r}\n" + _PUBLISH, env_extra=_env(cache), timeout=1200)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)
    assert not list(cache.glob("whole-[0-9]*")), list(cache.iterdir())  # the job's header and log are removed


_SUPERSEDE = r"""
import os, gpuos_ext
gpuos_ext._registry_add_arch("sm_90")
gpuos_ext._request_tier2([(7, PROG_A)])
first = gpuos_ext.wait_generations()
gpuos_ext._request_tier2([(8, PROG_B)])          # a newer tier-2 generation: the first build is dropped
second = gpuos_ext.wait_generations()
w = gpuos_ext.whole_build_info()
assert second == first + 1 and (w["requested"], w["superseded"], w["published"], w["failed"]) == (2, 1, 0, 0), w
print("PID", os.getpid(), flush=True)
"""


def _helpers_of(pid):
    """Processes whose command line names a job of process `pid` (the helper's header file whole-<pid>-...)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"whole-{pid}-".encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@requires_link
def test_superseded_build_and_exit_kill_the_helper(cold_cache):
    """The second request kills or skips the first build; exit with the second helper compiling returns at once
    (a whole compile takes tens of seconds here) and leaves no helper behind."""
    cache = cold_cache
    t0 = time.monotonic()
    p = run_python(f"PROG_A = {_prog(5.0)!r}\nPROG_B = {_prog(6.0)!r}\n" + _SUPERSEDE, env_extra=_env(cache),
                   timeout=600)
    assert p.returncode == 0 and "PID" in p.stdout, describe(p)
    pid = int(p.stdout.split("PID")[1].split()[0])
    assert _helpers_of(pid) == [], "a helper outlived its process"
    assert not list(cache.glob("whole-*.h")), list(cache.iterdir())
    assert time.monotonic() - t0 < 120, describe(p)


def test_whole_build_settings():
    w = gpuos_ext.whole_build_info()
    assert set(w) >= {"enabled", "running", "helpers", "published", "superseded", "failed", "command", "helper_pid"}
    assert gpuos_ext.config()["GPUOS_WHOLE_BUILD"] in ("0", "1")
    assert w["command"].startswith(os.path.realpath(os.sys.executable)) or w["command"].startswith(os.sys.executable)
    was = w["enabled"]
    try:
        gpuos_ext.set_whole_build(not was)
        assert gpuos_ext.whole_build_info()["enabled"] == (not was)
    finally:
        gpuos_ext.set_whole_build(was)
    assert gpuos_ext.wait_whole_builds(1.0)  # nothing queued in this process


_FAILS = r"""
import sys, gpuos_ext
gpuos_ext._set_whole_build_command([sys.executable, "-c", "import sys; print('helper says no'); sys.exit(5)"])
gpuos_ext._registry_add_arch("sm_90")
gpuos_ext._request_tier2([(7, PROG)])
linked = gpuos_ext.wait_generations()
assert gpuos_ext.wait_whole_builds(120)
w = gpuos_ext.whole_build_info()
assert (w["helpers"], w["published"], w["failed"]) == (1, 0, 1), w
assert "status 5" in w["last_error"] and "helper says no" in w["last_error"], w
assert gpuos_ext.generation_info()["latest"] == linked  # the linked generation stays
print("OK")
"""


@requires_link
def test_failed_helper_keeps_the_linked_generation_and_says_why(cold_cache):
    p = run_python(f"PROG = {_prog(7.0)!r}\n" + _FAILS, env_extra=_env(cold_cache), timeout=300)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)
    assert p.stderr.count("the background whole build failed") == 1, describe(p)


_NO_CACHE = r"""
import gpuos_ext
gpuos_ext._registry_add_arch("sm_90")
gpuos_ext._request_tier2([(7, PROG)])
linked = gpuos_ext.wait_generations()
assert gpuos_ext.wait_whole_builds(120)
w = gpuos_ext.whole_build_info()
assert (w["helpers"], w["published"], w["failed"]) == (0, 0, 1), w
assert "no JIT cache dir" in w["last_error"] and "GPUOS_CACHE_DIR" in w["last_error"], w
assert gpuos_ext.generation_info()["latest"] == linked
print("OK")
"""


@requires_link
def test_no_cache_dir_means_no_whole_build_and_says_the_fix():
    """The helper's image reaches this process through the JIT's disk cache: without one, no helper starts."""
    p = run_python(f"PROG = {_prog(8.0)!r}\n" + _NO_CACHE, env_extra={"GPUOS_DISABLE_CACHE": "1",
                   "CUDA_VISIBLE_DEVICES": "", "GPUOS_WHOLE_BUILD": "1"}, timeout=600)
    assert p.returncode == 0 and "OK" in p.stdout, describe(p)


_KILLED = r"""
import os, sys, gpuos_ext
gpuos_ext._registry_add_arch("sm_90")
gpuos_ext._request_tier2([(7, PROG)])
gpuos_ext.wait_generations()
print("PID", os.getpid(), flush=True)
sys.stdin.read()  # until the test kills this process
"""


@requires_link
def test_a_killed_process_takes_its_helper_with_it(cold_cache):
    """SIGKILL runs no atexit: the helper still dies with its parent (PR_SET_PDEATHSIG) instead of compiling on."""
    import signal
    import subprocess
    import sys
    env = _child_env(cold_cache)
    child = subprocess.Popen([sys.executable, "-c", f"PROG = {_prog(9.0)!r}\n" + _KILLED], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("PID"), child.stderr.read() if child.poll() is not None else line
        pid = int(line.split()[1])
        deadline = time.monotonic() + 120  # the helper starts once the linked generation is ready
        while not _helpers_of(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        helpers = _helpers_of(pid)
        assert helpers, "no helper started"
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{h}").exists() and b"zombie" not in _state(h) for h in helpers) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [h for h in helpers if Path(f"/proc/{h}").exists() and b"zombie" not in _state(h)], helpers


def _state(pid):
    """/proc/<pid>/status's State line (b"" once the process is gone)."""
    try:
        return next((ln for ln in Path(f"/proc/{pid}/status").read_bytes().splitlines() if ln.startswith(b"State")),
                    b"")
    except OSError:
        return b""


@pytest.fixture
def objects_only_cache(tmp_path):
    """A cache dir with only the shared cache's relocatable worker objects (`worker-*.o.cubin`): cold_cache also
    copies whole worker images, and the base image (generation 0 compiled whole) may be among them."""
    return seeded_cache(tmp_path / "cache", "worker-*.o.cubin")


_BASE_FIRST = r"""
import hashlib, gpuos_ext
gpuos_ext._registry_add_arch("sm_90")
gpuos_ext._generation_image(0, "sm_90")           # linked: asks for the base image's whole build
g = gpuos_ext.generation_info()["generations"]
assert g[0]["built"] == "linked", g
gpuos_ext._request_tier2([(7, PROG)])             # a newer generation while the base build runs
linked = gpuos_ext.wait_generations()
assert linked == 1, linked
assert gpuos_ext.wait_whole_builds(1500), gpuos_ext.whole_build_info()
w = gpuos_ext.whole_build_info()
# The base build ran to the end (its publish found generation 1, so it only went into the cache), then generation
# 1's build, published as generation 2.
assert (w["requested"], w["helpers"], w["published"], w["superseded"], w["failed"]) == (2, 2, 1, 1, 0), w
info = gpuos_ext.generation_info()
assert info["latest"] == 2 and info["generations"][2]["whole_of"] == 1, info
assert [x["built"] for x in info["generations"]] == ["linked", "linked", "whole"], info
n = gpuos_ext.link_info()["cached_whole_generations"]
base = gpuos_ext._generation_image_for("sm_90", [], [])  # the base image: from the cache now
assert gpuos_ext.link_info()["cached_whole_generations"] == n + 1, gpuos_ext.link_info()
print("BASE", hashlib.sha1(base).hexdigest())
print("TIER2", hashlib.sha1(gpuos_ext._generation_image(2, "sm_90")).hexdigest())
"""

_BASE_CACHED = r"""
import hashlib, os, gpuos_ext
gpuos_ext._registry_add_arch("sm_90")
base = gpuos_ext._generation_image(0, "sm_90")
gpuos_ext._request_tier2([(7, PROG)])
gpuos_ext.wait_generations()
info = gpuos_ext.generation_info()
li = gpuos_ext.link_info()
w = gpuos_ext.whole_build_info()
print("BUILT", [x["built"] for x in info["generations"]], li["cached_whole_generations"], w["requested"], w["helpers"])
print("BASE", hashlib.sha1(base).hexdigest())
print("TIER2", hashlib.sha1(gpuos_ext._generation_image(1, "sm_90")).hexdigest())
gpuos.register_op("whole_relu_b", "__device__ float whole_relu_b(float a) { return a > 0.0f ? a : 0.0f; }")
w = gpuos_ext.whole_build_info()
print("OPCHANGE", gpuos_ext.generation_info()["generations"][-1]["built"], w["requested"])
print("PID", os.getpid(), flush=True)
"""


def _field(out, key):
    return [ln.split(None, 1)[1] for ln in out.splitlines() if ln.startswith(key + " ")][0]


@requires_link
def test_base_image_is_built_once_and_later_processes_start_whole(objects_only_cache):
    """Generation 0 linked asks for the base image's whole build, which a newer generation neither kills nor drops;
    a later process on the same cache takes generation 0 and the same tier-2 generation whole from the cache (no
    link, no helper), and an op change there asks for a whole build of its own. Whole builds off, the cache is not
    read: generation 0 is linked."""
    env, prog = _env(objects_only_cache), f"PROG = {_prog(11.0)!r}\n"
    p = run_python(prog + _BASE_FIRST, env_extra=env, timeout=1600)
    assert p.returncode == 0 and "TIER2" in p.stdout, describe(p)
    q = run_python("import gpuos\n" + prog + _BASE_CACHED, env_extra=env, timeout=600)
    assert q.returncode == 0 and "OPCHANGE" in q.stdout, describe(q)
    assert _field(q.stdout, "BUILT") == "['cached whole', 'cached whole'] 2 0 0", describe(q)
    assert _field(q.stdout, "BASE") == _field(p.stdout, "BASE"), (describe(p), describe(q))
    assert _field(q.stdout, "TIER2") == _field(p.stdout, "TIER2"), (describe(p), describe(q))
    assert _field(q.stdout, "OPCHANGE") == "linked 1", describe(q)
    assert _helpers_of(int(_field(q.stdout, "PID"))) == [], "a helper outlived its process"
    off = run_python(prog + _BASE_CACHED.split("gpuos.register_op")[0], env_extra=dict(env, GPUOS_WHOLE_BUILD="0"),
                     timeout=600)
    assert off.returncode == 0 and _field(off.stdout, "BUILT") == "['linked', 'linked'] 0 0 0", describe(off)


_AFTER_WARM = r"""
import gpuos_ext
assert gpuos_ext.jit_base_cached("sm_90")
gpuos_ext._registry_add_arch("sm_90")
gpuos_ext._generation_image(0, "sm_90")
w = gpuos_ext.whole_build_info()
print("BUILT", gpuos_ext.generation_info()["generations"][0]["built"], w["requested"], w["helpers"],
      gpuos_ext.stats()["jit_compiles"])
"""


@requires_link
def test_warm_fills_the_cache_so_a_process_starts_whole(objects_only_cache):
    """`python -m gpuos --warm --arch sm_90` compiles the base image (no GPU needed); a process then takes
    generation 0 whole from the cache, with no helper and no compile; the report says where the cache stands."""
    import subprocess
    import sys

    def doctor(*args, timeout=300):
        return subprocess.run([sys.executable, "-m", "gpuos", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=REPO_ROOT, env=_child_env(objects_only_cache))
    before = doctor("--warm", "--arch", "sm_90", timeout=900)
    assert before.returncode == 0, describe(before)
    assert "base image sm_90" in before.stdout and "not in the JIT cache yet" in before.stdout, before.stdout
    assert "pass  sm_90" in before.stdout and "base image compiled in" in before.stdout, before.stdout
    p = run_python(_AFTER_WARM, env_extra=_env(objects_only_cache), timeout=300)
    assert p.returncode == 0 and _field(p.stdout, "BUILT") == "cached whole 0 0 0", describe(p)
    again = doctor("--warm", "--arch", "sm_90")
    assert again.returncode == 0 and "base image was cached" in again.stdout, describe(again)
    assert "in the JIT cache: every process's generation 0 starts whole" in again.stdout, again.stdout
    bad = doctor("--arch", "sm_90", timeout=120)
    assert bad.returncode == 2 and "--arch goes with --warm" in bad.stderr, describe(bad)
    typo = doctor("--warm", "--arch", "sm90", timeout=120)
    assert typo.returncode == 2 and "--arch sm90: name archs as NVRTC does" in typo.stderr, describe(typo)


_HELPER_JOB = r"""
import sys, gpuos_ext
print("COMPILED", gpuos_ext._compile_whole_image("compute_90", sys.argv[1]), gpuos_ext.stats()["jit_compiles"])
"""


def test_helpers_of_two_processes_take_turns_and_compile_once(objects_only_cache, tmp_path):
    """Two helpers of the same header at once (processes started together on a machine without the image): one
    compiles, the other waits for the lock and finds the image in the cache. PTX (compute_90) keeps it short."""
    import subprocess
    import sys
    header = tmp_path / "job.h"
    header.write_text("")  # the base image
    env = _child_env(objects_only_cache)
    jobs = [subprocess.Popen([sys.executable, "-c", _HELPER_JOB, str(header)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [j.communicate(timeout=600) for j in jobs]
    assert all(j.returncode == 0 for j in jobs), outs
    got = sorted(o[0].split("COMPILED")[1].split()[0] for o in outs)
    assert got == ["False", "True"], outs
    assert list(objects_only_cache.glob("whole-lock-compute_90-*")), list(objects_only_cache.iterdir())
