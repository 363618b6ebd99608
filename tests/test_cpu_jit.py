"""NVRTC compilation of the embedded device sources. Needs NVRTC, not a GPU."""

import os
import re
import struct
from pathlib import Path

import pytest

import gpuos
import gpuos_ext
from _helpers import REPO_ROOT, describe, run_python, seeded_cache

ARCHS = ["sm_80", "sm_90"]
EM_CUDA = 190
# device_src must be self-contained: no system includes of any kind, not even NVRTC's own
# (cuda_fp16.h is not built into NVRTC 13 and would need a toolkit include path).
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(["<])([^">]+)[">]', re.M)


@pytest.fixture(scope="module")
def cubins(requires_nvrtc):
    return {arch: gpuos_ext.jit_compile(arch) for arch in ARCHS}


def test_nvrtc_version(requires_nvrtc):
    v = requires_nvrtc
    assert isinstance(v, tuple) and len(v) == 2, v
    major, minor = v
    assert isinstance(major, int) and isinstance(minor, int)
    assert major >= 11 and minor >= 0, v


@pytest.mark.parametrize("arch", ARCHS)
def test_jit_compile_returns_cubin(cubins, arch):
    cubin = cubins[arch]
    assert isinstance(cubin, bytes)
    assert len(cubin) > 64
    assert cubin[:4] == b"\x7fELF", cubin[:16]
    assert cubin[4] == 2, "expected a 64-bit ELF"
    (e_machine,) = struct.unpack_from("<H", cubin, 18)
    assert e_machine == EM_CUDA, f"e_machine {e_machine} is not EM_CUDA"
    # the SM version is in e_flags: low byte (old CUDA ELF ABI) or second byte (CUDA 13 ABI)
    (e_flags,) = struct.unpack_from("<I", cubin, 48)
    sm = int(arch[3:])
    assert sm in (e_flags & 0xFF, (e_flags >> 8) & 0xFF), f"e_flags {e_flags:#x} is not for {arch}"


def test_cubins_differ_between_archs(cubins):
    assert cubins["sm_80"] != cubins["sm_90"]


def test_jit_compile_is_repeatable(cubins):
    # a second compile (or a cache hit) gives a usable cubin for the same arch again
    again = gpuos_ext.jit_compile("sm_90")
    assert again[:4] == b"\x7fELF"
    assert struct.unpack_from("<H", again, 18)[0] == EM_CUDA


@pytest.mark.parametrize("bad_arch", ["sm_xyz", "sm_1", "compute_banana"])
def test_invalid_arch_raises_compile_error_with_log(requires_nvrtc, bad_arch):
    with pytest.raises(gpuos.CompileError) as ei:
        gpuos_ext.jit_compile(bad_arch)
    e = ei.value
    assert isinstance(e, gpuos.GpuosError) and isinstance(e, RuntimeError)
    assert isinstance(e.log, str) and e.log.strip(), f"empty log: {e.log!r}"
    assert e.arch == bad_arch
    # options: a string or a list of strings (the spec does not fix the type); holds the arch
    if isinstance(e.options, str):
        opts = e.options
    else:
        assert all(isinstance(o, str) for o in e.options), e.options
        opts = " ".join(e.options)
    assert bad_arch in opts, f"options do not show the arch: {e.options!r}"
    assert isinstance(e.source_path, str)
    if e.source_path:
        assert os.path.exists(e.source_path), f"dumped source {e.source_path!r} does not exist"
    assert bad_arch in str(e), f"message should name the arch: {e}"


def test_traced_worker_is_a_build_of_its_own(cubins, tmp_path):
    """GPUOS_TRACE compiles the worker with GPUOS_TRACE_SUBOPS (every sub-op records itself: device_src/worker.cu
    kTraceSubops), so the untraced worker carries none of it: the traced build compiles and differs."""
    out = tmp_path / "traced.cubin"
    p = run_python(f"""
        import gpuos, gpuos_ext
        open({str(out)!r}, "wb").write(gpuos_ext.jit_compile("sm_90"))
    """, env_extra={"GPUOS_TRACE": "64", "GPUOS_CACHE_DIR": str(tmp_path / "cache")}, timeout=600)
    assert p.returncode == 0, describe(p)
    traced = out.read_bytes()
    assert traced[:4] == b"\x7fELF" and traced != cubins["sm_90"]


def test_trace_records_are_capped():
    """GPUOS_TRACE reads as given up to 2^20 records per block and as 2^20 above (the traced worker's record indices
    are 32-bit: device_src/worker.cu item_slot, kTraceItems x per_block + slot)."""
    for given, read in (("64", "64"), ("1048576", "1048576"), ("1048577", "1048576"), ("4000000000", "1048576")):
        p = run_python("import gpuos_ext; print(gpuos_ext.config()['GPUOS_TRACE'])", env_extra={"GPUOS_TRACE": given})
        assert p.returncode == 0, describe(p)
        assert p.stdout.strip().splitlines()[-1] == read, (given, p.stdout)


def test_fast_compile_is_a_build_of_its_own(cubins, tmp_path):
    """GPUOS_FAST_COMPILE picks the fast-compile mode of the whole worker -- ptxas's alone (ptxas-min, the default),
    NVRTC's (min: NVVM and ptxas), or 0 (off: the full ptxas): each a cubin of its own (its own cache key), all
    three different; ptxas-min named is the default's options (served from the default's cache entry with compiles
    forbidden); an unknown level raises ValueError naming the setting and the levels, and writes nothing to the
    cache."""
    images = {}
    for level in ("0", "min"):
        out = tmp_path / f"{level}.cubin"
        p = run_python(f"""
            import gpuos, gpuos_ext
            assert gpuos_ext.config()["GPUOS_FAST_COMPILE"] == {level!r}, gpuos_ext.config()
            open({str(out)!r}, "wb").write(gpuos_ext.jit_compile("sm_90"))
        """, env_extra={"GPUOS_FAST_COMPILE": level, "GPUOS_CACHE_DIR": str(tmp_path / "cache")}, timeout=600)
        assert p.returncode == 0, describe(p)
        images[level] = out.read_bytes()
        assert images[level][:4] == b"\x7fELF" and images[level] != cubins["sm_90"], level
    assert images["min"] != images["0"]
    default = run_python("""
        import gpuos_ext
        assert gpuos_ext.config()["GPUOS_FAST_COMPILE"] == "ptxas-min"
        gpuos_ext.jit_compile("sm_90")
    """, env_extra={"GPUOS_FAST_COMPILE": "ptxas-min", "GPUOS_CACHE_DIR": os.environ["GPUOS_CACHE_DIR"],
                    "GPUOS_FORBID_COMPILE": "1"})
    assert default.returncode == 0, describe(default)
    bad_cache = tmp_path / "bad-cache"
    bad = run_python("""
        import gpuos_ext
        try:
            gpuos_ext.jit_compile("sm_90")
        except ValueError as e:
            print("VALUE_ERROR", e)
    """, env_extra={"GPUOS_FAST_COMPILE": "ptxas-fast", "GPUOS_CACHE_DIR": str(bad_cache)})
    assert bad.returncode == 0 and "VALUE_ERROR" in bad.stdout, describe(bad)
    assert "GPUOS_FAST_COMPILE='ptxas-fast'" in bad.stdout and "ptxas-min or ptxas-mid" in bad.stdout, bad.stdout
    assert not bad_cache.exists() or not any(f.is_file() for f in bad_cache.rglob("*"))


_FORBID_SCRIPT = """
    import sys
    import gpuos, gpuos_ext
    try:
        cubin = gpuos_ext.jit_compile("sm_80")
    except gpuos.CompileError as e:
        print("COMPILE_ERROR", e)
        sys.exit(3)
    assert cubin[:4] == b"\\x7fELF"
    print("OK")
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm-cache", "empty-cache"])
def test_forbid_compile_switch(requires_nvrtc, tmp_path, warm):
    """With GPUOS_FORBID_COMPILE=1 a warm cache serves the image (no compile), an empty cache raises
    CompileError: the switch forbids exactly the compiles, so warm starts can be proven compile-free."""
    if warm:
        gpuos_ext.jit_compile("sm_80")  # this session's cache (conftest's GPUOS_CACHE_DIR) now holds sm_80
        cache = os.environ["GPUOS_CACHE_DIR"]
    else:
        cache = str(tmp_path / "empty-cache")
    proc = run_python(_FORBID_SCRIPT, {"GPUOS_CACHE_DIR": cache, "GPUOS_FORBID_COMPILE": "1"})
    if warm:
        assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)
    else:
        assert proc.returncode == 3, describe(proc)


# ----------------------------------------------------------------------------- embedded sources

@pytest.fixture(scope="module")
def sources():
    s = gpuos_ext.device_sources()
    assert isinstance(s, dict) and s, "device_sources() must be a non-empty dict"
    return s


def _rel(path):
    p = path.replace(os.sep, "/")
    i = p.find("device_src/")
    return p[i:] if i >= 0 else None


def test_device_sources_types(sources):
    for path, text in sources.items():
        assert isinstance(path, str) and isinstance(text, str), (type(path), type(text))
        assert text.strip(), f"{path} is empty"


def test_device_sources_are_under_device_src(sources):
    rels = [_rel(p) for p in sources]
    assert any(rels), f"no path under device_src/: {sorted(sources)}"


def test_device_sources_have_no_system_includes(sources):
    for path, text in sources.items():
        assert not re.search(r"#\s*include\s*<", text), f"{path} has a system #include <...>"


def test_device_sources_quoted_includes_are_embedded(sources):
    """Every `#include "x"` must resolve to an embedded file (nothing from the system)."""
    basenames = {p.replace(os.sep, "/").rsplit("/", 1)[-1] for p in sources}
    for path, text in sources.items():
        for kind, inc in INCLUDE_RE.findall(text):
            if kind == '"':
                name = inc.replace(os.sep, "/").rsplit("/", 1)[-1]
                assert name in basenames, f"{path} includes {inc!r}, which is not embedded"


def test_embedded_sources_match_files_on_disk(sources):
    """A stale build embeds old device code: compare with the checkout when it is present."""
    on_disk = os.path.join(REPO_ROOT, "device_src")
    if not os.path.isdir(on_disk):
        pytest.skip("no device_src/ checkout next to the tests")
    checked = 0
    for path, text in sources.items():
        rel = _rel(path)
        if rel is None:
            continue
        f = os.path.join(REPO_ROOT, *rel.split("/"))
        assert os.path.exists(f), f"embedded {path} has no file {f}"
        with open(f, encoding="utf-8") as fh:
            assert fh.read() == text, f"embedded {path} differs from {f}: rebuild the extension"
        checked += 1
    assert checked >= 1


def test_every_device_file_on_disk_is_embedded(sources):
    on_disk = os.path.join(REPO_ROOT, "device_src")
    if not os.path.isdir(on_disk):
        pytest.skip("no device_src/ checkout next to the tests")
    embedded = {_rel(p) for p in sources}
    for root, _dirs, files in os.walk(on_disk):
        for name in files:
            if name.startswith(".") or name.endswith((".pyc", "~")):
                continue
            rel = os.path.relpath(os.path.join(root, name), REPO_ROOT).replace(os.sep, "/")
            assert rel in embedded, f"{rel} exists but is not embedded: rebuild the extension"


_TRIM_SCRIPT = r"""
import gpuos, gpuos_ext
gpuos_ext._registry_add_arch("sm_90")
gpuos.register_elementwise("trim_axpb", "a * s0 + b")   # writes the op's object and the dispatch object
print("EVICTED", gpuos_ext.stats()["jit_cache_evictions"], gpuos_ext.config()["GPUOS_CACHE_MAX_MB"])
"""


def test_disk_cache_keeps_under_its_bound_dropping_least_recently_used(tmp_path):
    """GPUOS_CACHE_MAX_MB: a write that takes the cache dir over the bound removes the least recently used files
    (oldest first) until it is under 90 % of it -- never the file just written, a whole build's job file or another
    process's temporary file; 0 means no bound."""
    if gpuos_ext.link_info()["mode"] != "linked":  # the op's generation links (its objects are the writes)
        pytest.skip(gpuos_ext.link_info()["reason"])
    import time
    for bound in ("0", "bounded"):
        cache = seeded_cache(tmp_path / f"cache-{bound}", "worker-*.o.cubin")  # the linkable worker: no compile
        real = sum(f.stat().st_size for f in cache.iterdir())
        old = time.time() - 86400 * 365
        names = [f"stale{i}-sm_90-{i:016x}.cubin" for i in range(4)] + ["whole-1-0-sm_90.h", "x.cubin.tmp.1"]
        for i, name in enumerate(names):  # 4 MiB each of stale files, 1 MiB each of files that must stay
            (cache / name).write_bytes(b"\0" * ((4 if name.startswith("stale") else 1) << 20))
            os.utime(cache / name, (old + i, old + i))  # stale0 is the least recently used
        # Room for the real files, the two that stay, the new objects and two stale files: 90 % of it forces out
        # three stale files and nothing newer.
        mb = str(-(-real // (1 << 20)) + 11) if bound == "bounded" else "0"
        p = run_python(_TRIM_SCRIPT, {"GPUOS_CACHE_DIR": str(cache), "GPUOS_CACHE_MAX_MB": mb,
                                      "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
        assert p.returncode == 0 and "EVICTED" in p.stdout, describe(p)
        evicted, shown = p.stdout.split("EVICTED")[1].split()[:2]
        left = {f.name for f in cache.iterdir()}
        assert shown == mb and {"whole-1-0-sm_90.h", "x.cubin.tmp.1"} <= left, (left, describe(p))
        assert all(f.name in left for f in Path(os.environ["GPUOS_CACHE_DIR"]).glob("worker-*.o.cubin")), left
        if bound == "0":
            assert evicted == "0" and all(n in left for n in names), left
            continue
        total = sum(f.stat().st_size for f in cache.iterdir())
        gone = [n for n in names if n not in left]
        assert int(evicted) == len(gone) >= 1 and total <= int(mb) << 20, (evicted, gone, total, describe(p))
        assert gone == names[:len(gone)], gone  # oldest first
