"""Small helpers shared by the test modules (not a test module itself)."""

import os
import subprocess
import sys
import tempfile
import textwrap

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: env vars that change runtime behaviour; stripped from subprocess environments unless given (not GPUOS_KICKS,
#: GPUOS_KICK_ALONE, GPUOS_KICK_WAIT: `GPUOS_KICKS=0 pytest` runs the whole suite, child processes included, with
#: standbys)
GPUOS_ENV_VARS = ["GPUOS_CACHE_DIR", "GPUOS_CACHE_MAX_MB", "GPUOS_DISABLE_CACHE", "GPUOS_FORBID_COMPILE",
                  "GPUOS_NVRTC_PATH", "GPUOS_TIMEOUT_S", "GPUOS_WORKER_BLOCKS", "GPUOS_IDLE_US", "GPUOS_BURST_MIN", "GPUOS_BURST_BLOCKS",
                  "GPUOS_PUBLISH_MIN", "GPUOS_TRACE", "GPUOS_DMA_MIN", "GPUOS_DMA_LEVELS", "GPUOS_MM_ITEMS",
                  "GPUOS_MM_ITEMS_LIVE", "GPUOS_PROGRAM_IDLE_US", "GPUOS_ATTN_MIN_ROWS", "GPUOS_SPECIALIZE_AFTER", "GPUOS_PTXAS_OPT", "GPUOS_FAST_COMPILE",
                  "GPUOS_HANDOVER_QUEUE",
                  "GPUOS_JOIN_LEVELS", "GPUOS_LOCAL_COMBINE", "GPUOS_MM_EPILOGUE", "GPUOS_MM_PROLOGUE",
                  "GPUOS_HOME_LEVELS", "GPUOS_TIMER_OFF_GIL"]


def load_tool(name):
    """tools/<name>.py as a module (the tools are scripts, not a package), registered in sys.modules as `name` (a
    dataclass looks its module up there)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, "tools", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_python(code, env_extra=None, timeout=180, cwd=None):
    """Run `code` in a fresh interpreter with the repo importable (after any PYTHONPATH the caller
    set, so an installed/overridden build keeps priority). Returns CompletedProcess."""
    env = dict(os.environ)
    for k in GPUOS_ENV_VARS:
        if k == "GPUOS_NVRTC_PATH":  # keep: the user may need it to find NVRTC at all
            continue
        env.pop(k, None)
    env.update(env_extra or {})
    env["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH") else "") + REPO_ROOT
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          cwd=cwd or tempfile.gettempdir(), env=env,
                          capture_output=True, text=True, timeout=timeout)


def describe(proc):
    return f"rc={proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


def hand_over_to_tier2():
    """Wait for the tier-2 generation a test's hot program asked for, let the worker exit, and return that
    generation's id: the next flush runs on it (asserted by the caller through generation_info()["active"])."""
    import gpuos
    import gpuos_ext
    import torch

    newest = gpuos_ext.wait_generations()
    info = gpuos.generation_info()
    spec = [g["id"] for g in info["generations"] if g["state"] == "ready" and any(
        op.startswith("fused#") for op in g["ops"])]
    assert spec and newest >= spec[-1], info
    gpuos_ext.yield_worker()
    torch.cuda.synchronize()  # the worker has exited: the next flush takes over the newest generation
    return spec[-1]


def tiny_hf_llama(device="cuda"):
    """A small random HF Llama (2 layers, 4 heads / 2 KV heads, head_dim 64, fp16, sdpa) and a 12-token prompt, and
    `generate(cache)`: 8 greedy tokens with a "static" or "dynamic" cache (no torch.compile). Skips without
    transformers."""
    import pytest
    import torch
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(device, torch.float16).eval()
    prompt = torch.randint(0, 512, (1, 12), device=device)

    def generate(cache):
        kw = {"disable_compile": True}  # a static cache makes generate() torch.compile the forward otherwise
        if cache == "static":
            kw["cache_implementation"] = "static"
        return model.generate(prompt, max_new_tokens=8, do_sample=False, **kw)

    return cfg, generate


def hot_then_tier2(f, x, stat, per_run=1):
    """f(x) three times under the scheduler with tier 2 after three uses of a program (the interpreter runs these):
    gpuos.stats()[stat] grows by `per_run` each time and tier 2 is asked for one program's code; then, handed over to
    that generation, f(x) once more. Returns (the interpreted results, the tier-2 result)."""
    import gpuos
    import gpuos_ext
    import torch

    gpuos_ext.set_specialize_after(3)
    try:
        req0, s0 = gpuos.stats()["specializations_requested"], gpuos.stats()[stat]
        interp = []
        for _ in range(3):
            with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
                interp.append(f(x))
        assert gpuos.stats()[stat] == s0 + 3 * per_run
        assert gpuos.stats()["specializations_requested"] == req0 + 1
    finally:
        gpuos_ext.set_specialize_after(64)
    spec = hand_over_to_tier2()
    with torch.no_grad(), gpuos.scheduler_context(auto_flush_ms=0):
        got = f(x)
    assert gpuos.generation_info()["active"][torch.cuda.current_device()] >= spec
    return interp, got


def within_one_rounding(a, b, eps):
    """a and b (tensors of one shape) differ by at most one rounding of unit `eps` (twice eps, relative to b's
    largest magnitude): the same values through two copies of one computation."""
    a, b = a.float(), b.float()
    err = (a - b).abs().max().item()
    assert err <= eps * 2 * b.abs().max().item() + 1e-6, err


def captured_levels(fn, make_input, set_on, compare, calls=2):
    """Captures fn with a rewrite off and on (set_on(False / True); left on), replays each program `calls` times with
    new inputs from make_input(), comparing with fn's eager result (compare(got, ref)). Returns {on: levels}."""
    import gpuos

    levels = {}
    for on in (False, True):
        set_on(on)
        try:
            prog = gpuos.capture(fn, make_input())
            levels[on] = sum(prog.info()["levels"])
            for _ in range(calls):
                x = make_input()
                compare(prog(x), fn(x))
        finally:
            set_on(True)
    return levels


def seeded_cache(cache, pattern):
    """A fresh JIT cache dir `cache` holding the files of the session's cache (conftest's GPUOS_CACHE_DIR) that match
    `pattern` -- e.g. the worker objects, so a test's generations link without a 20 s compile. Returns it."""
    import shutil
    from pathlib import Path
    cache.mkdir()
    for f in Path(os.environ["GPUOS_CACHE_DIR"]).glob(pattern):
        shutil.copy(f, cache / f.name)
    return cache


def seen_ops_mode(key=str):
    """A TorchDispatchMode that runs every op as it comes and notes it (`key(func)`: str gives "aten.add.Tensor")
    in its `.funcs`: what a mode entered around or inside the scheduler sees."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class SeenOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.funcs = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.funcs.append(key(func))
            return func(*args, **(kwargs or {}))

    return SeenOps()
