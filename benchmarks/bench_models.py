#!/usr/bin/env python
"""W7 real models: Hugging Face GPT-2 and Llama, batch-1 greedy decode (issue 16).

    python benchmarks/bench_models.py                       # = python -m benchmarks --only W7
    python benchmarks/bench_models.py --quick               # 2 configs, 8 steps (models_quick.json)
    GPUOS_BENCH_MODELS=full python benchmarks/bench_models.py   # all 34 configs (or a comma-separated list of labels)

Models are built from code with random weights (seeded; no downloads): ``<model>-<scale>-<dtype>-<attn>-<cache>``
with model gpt2 | llama, scale small (4 layers, hidden 256, 4 heads; Llama 2 KV heads) | base (GPT-2-small size:
12 layers, hidden 768, 12 heads; Llama 4 KV heads), dtype fp16 | bf16, attention eager | sdpa (HF's
``attn_implementation``), cache static (``StaticCache`` of 256 slots) | static<N> (of N slots: ``static128`` /
``static4096`` show what a long static cache costs, issue #17) | dynamic (``DynamicCache``). Without
``transformers`` every row says so.

One repetition = STEPS decode steps after a PROMPT-token prefill done once in setup; each step feeds the token
eager's greedy decode chose at that step (teacher forcing, so a near-tie cannot make one peer's later steps
differ from the others'); the output is (argmax per step, fp32 logits per step), compared with eager's: tokens
exactly, logits within fp16/bf16 tolerance. A repetition rewrites the same cache positions (a dynamic cache is
cropped back to the prompt first). ``us_per_op`` of a row is microseconds per decode step.

Peers: ``eager``; ``cudagraph`` (static cache only: one step captured, replayed per token with the token and
position copied into its static inputs); ``compile`` / ``compile_reduce_overhead`` (torch.compile of the step
in a child process; a dynamic cache recompiles per length as torch.compile does); ``gpuos_scheduler`` (the eager
loop inside ``gpuos.scheduler_context()``; its rows carry per-step aten ops, fallbacks by op, batches and worker
launches); ``gpuos_scheduler_worker_mm`` (the same with ``gpuos.set_worker_matmul(True)``: mm / addmm / bmm /
baddbmm with <= 64 rows as worker tasks); ``gpuos_scheduler_worker`` (matmuls and decode attention -- the SDPA
backend ops, ``gpuos.set_worker_attention(True)`` -- both in the worker). SDPA backend: cuDNN SDPA is disabled for every peer (``torch.backends.cuda.enable_cudnn_sdp(False)``:
with it, eager builds a cuDNN plan per new KV length, ../shared/DESIGN.md F10); the rows name the backends left.
Results: benchmarks/results/models.json.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

NAME = "models"
WORKLOAD = "W7"
TITLE = "HF GPT-2 / Llama batch-1 decode (random weights)"
PROMPT, STEPS, QUICK_STEPS = 16, 32, 8
MAX_CACHE = 256
SCALES = {  # layers, hidden, heads, kv heads (Llama), MLP width (Llama)
    "small": (4, 256, 4, 2, 688),
    "base": (12, 768, 12, 4, 2048),
}
FULL = [f"{m}-{s}-{d}-{a}-{c}" for m in ("gpt2", "llama") for s in SCALES for d in ("fp16", "bf16")
        for a in ("eager", "sdpa") for c in ("static", "dynamic")]
# A static cache of 128 and of 4,096 slots at the same positions: what reading the real length (not the slots)
# saves (issue #17, acceptance 5).
LONG_CACHE = ["llama-small-fp16-sdpa-static128", "llama-small-fp16-sdpa-static4096"]
FULL += LONG_CACHE
# Small models first: when the suite's time budget runs out, the headline configs (GPT-2 / Llama small) are
# the ones measured (at 8adc8bd, gpt2-base ate the rest of W7's budget before llama-small ran).
DEFAULT = [f"{m}-{s}-fp16-sdpa-{c}" for s in SCALES for m in ("gpt2", "llama") for c in ("static", "dynamic")] + [
    "llama-small-bf16-sdpa-static", "gpt2-small-fp16-eager-static", "llama-small-fp16-eager-dynamic"] + LONG_CACHE
QUICK = ["llama-small-fp16-sdpa-static", "gpt2-small-fp16-sdpa-dynamic"]
TOL = {"fp16": {"rtol": 2e-2, "atol": 2e-2}, "bf16": {"rtol": 5e-2, "atol": 5e-2}}
SDPA_NOTE = "cuDNN SDPA off; flash / mem-efficient / math left to torch's choice"
# cudagraph last: a failure inside a captured graph loses the CUDA context for every peer after it. (At 12a9572 its
# replay hit a device-side assert, index_copy_ out of bounds: the static cache the graph writes into was freed
# after capture, and transformers 5.x writes at the cache's own on-device counter, not at cache_position --
# rewind_static below.)
IN_PROCESS = ["eager", "gpuos_scheduler", "gpuos_scheduler_worker_mm", "gpuos_scheduler_worker", "gpuos_program",
              "cudagraph"]
NOT_APPLICABLE = {
    "foreach": "a decode step is a chain of dependent ops; torch._foreach_* needs lists of independent tensors",
    "gpuos_submit": "the explicit submit API has no matmul or attention; gpuos_scheduler runs the model unchanged",
}
IN_PROCESS_SHARE = 0.55


def parse_label(label: str) -> SimpleNamespace:
    parts = label.split("-")
    model, scale, dtype, attn, cache = parts if len(parts) == 5 else ("",) * 5
    slots = MAX_CACHE
    if cache.startswith("static") and cache[6:].isdigit() and int(cache[6:]) > PROMPT + STEPS:
        cache, slots = "static", int(cache[6:])
    if model not in ("gpt2", "llama") or scale not in SCALES or dtype not in TOL or attn not in ("eager", "sdpa") \
            or cache not in ("static", "dynamic"):
        raise ValueError(f"bench_models: bad config label {label!r}; expected e.g. {FULL[0]!r} (model gpt2|llama, "
                         f"scale {'|'.join(SCALES)}, dtype fp16|bf16, attn eager|sdpa, cache static|static<N> "
                         f"(N > {PROMPT + STEPS} slots)|dynamic)")
    return SimpleNamespace(model=model, scale=scale, dtype=dtype, attn=attn, cache=cache,
                           slots=slots if cache == "static" else None)


def build_model(spec: SimpleNamespace, device: str):
    """(model, config): random weights, seeded."""
    import torch
    import transformers as T
    layers, hidden, heads, kv_heads, inter = SCALES[spec.scale]
    torch.manual_seed(1234)
    if spec.model == "gpt2":
        cfg = T.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=1024)
    else:
        cfg = T.LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048)
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation=spec.attn)
    dt = torch.float16 if spec.dtype == "fp16" else torch.bfloat16
    return model.to(device=device, dtype=dt).eval(), cfg


def cache_kw(model) -> str:
    """The forward argument that takes the KV cache: ``cache`` in newer transformers, ``past_key_values`` before."""
    import inspect
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_cache(d):
    import transformers as T
    if d.spec.cache == "static":
        return T.StaticCache(config=d.cfg, max_cache_len=d.spec.slots)
    return T.DynamicCache(config=d.cfg)


def prefill(d, cache) -> None:
    import torch
    with torch.no_grad():
        d.model(input_ids=d.prompt, cache_position=d.prompt_pos, use_cache=True, **{d.cache_kw: cache})


def step_logits(model, tok, cache, pos, kw="past_key_values"):
    """One decode step: the last position's logits in fp32 (what torch.compile compiles)."""
    return model(input_ids=tok, cache_position=pos, use_cache=True, **{kw: cache}).logits[:, -1].float()


def token_mismatches(toks, ref_toks, ref_logits, tol: dict) -> list:
    """Steps whose greedy token differs from eager's where eager's own logits do not make it a near-tie: [(step,
    token, eager's token, eager's logit gap)]. With teacher forcing a step's token depends on that step alone;
    two candidates whose eager logits lie within the dtype's tolerance (atol + rtol * |top|) can swap under any
    other summation order (bf16 logits of random weights do), so such a swap is not a wrong result."""
    out = []
    for i in (toks != ref_toks).nonzero().flatten().tolist():
        a, b = int(toks[i]), int(ref_toks[i])
        top = float(ref_logits[i, b])
        gap = top - float(ref_logits[i, a])
        if gap > tol.get("atol", 0.0) + tol.get("rtol", 0.0) * abs(top):
            out.append((i, a, b, gap))
    return out


def rewind_static(cache, length: int = PROMPT) -> None:
    """Set a static cache's write position back to ``length``, in place. transformers 5.x StaticLayer ignores
    ``cache_position``: it writes at its on-device ``cumulative_length`` and bumps it in place every update (a
    captured graph bumps it on every replay). Older versions have no such tensor and use cache_position."""
    import torch
    for layer in getattr(cache, "layers", ()):
        n = getattr(layer, "cumulative_length", None)
        if isinstance(n, torch.Tensor):
            n.fill_(length)


def reset_cache(d, cache) -> None:
    """Back to the prompt: a dynamic cache cropped to it, a static one's write position rewound to it."""
    if d.spec.cache == "dynamic" and cache.get_seq_length() > PROMPT:
        cache.crop(PROMPT - cache.get_seq_length())  # negative: drop that many tokens (every version takes it)
    if d.spec.cache == "static":
        rewind_static(cache)


def decode(d, cache, step=step_logits):
    """STEPS teacher-forced steps from the prompt: (argmax per step, logits per step)."""
    import torch
    reset_cache(d, cache)
    out = []
    with torch.no_grad():
        for i in range(d.steps):
            out.append(step(d.model, d.forced[i], cache, d.positions[i], d.cache_kw))
    logits = torch.cat(out)
    return logits.argmax(-1), logits


def suite_params(quick: bool) -> dict:
    """GPUOS_BENCH_MODELS: "full" (every label), or labels separated by commas; default DEFAULT (QUICK)."""
    import os
    sel = os.environ.get("GPUOS_BENCH_MODELS", "").strip()
    labels = FULL if sel == "full" else [x.strip() for x in sel.split(",") if x.strip()] if sel else None
    for label in labels or []:
        parse_label(label)
    return {"labels": labels or (QUICK if quick else DEFAULT),
            "steps": QUICK_STEPS if quick else STEPS, "prompt": PROMPT, "max_cache": MAX_CACHE, "sdpa": SDPA_NOTE}


def make_case(label: str, steps: int, device: str) -> H.Case:
    """The model of one label, its prompt, eager's greedy tokens (the forced inputs) and eager's output."""
    import torch
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"transformers is not installed ({exc}); pip install transformers") from exc
    if device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    spec = parse_label(label)
    model, cfg = build_model(spec, device)
    g = torch.Generator(device="cpu").manual_seed(77)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(device)
    positions = [torch.tensor([PROMPT + i], device=device) for i in range(steps)]
    d = SimpleNamespace(spec=spec, model=model, cfg=cfg, prompt=prompt, steps=steps, positions=positions,
                        prompt_pos=torch.arange(PROMPT, device=device), cache_kw=cache_kw(model))
    cache = new_cache(d)
    prefill(d, cache)
    toks, tok = [], prompt[:, -1:]
    with torch.no_grad():  # eager greedy decode: its tokens are every peer's inputs
        for i in range(steps):
            toks.append(tok)
            tok = step_logits(model, tok, cache, positions[i], d.cache_kw).argmax(-1, keepdim=True)
    d.forced = toks
    cache = new_cache(d)
    prefill(d, cache)
    ref = decode(d, cache)
    layers, hidden, heads, kv_heads, _ = SCALES[spec.scale]
    return H.Case(size=label, ref=ref, tol=TOL[spec.dtype], data=d, ops_per_rep=steps,
                  extra={"model": spec.model, "layers": layers, "hidden": hidden, "heads": heads,
                         "kv_heads": kv_heads if spec.model == "llama" else heads, "dtype": spec.dtype,
                         "attn": spec.attn, "cache": spec.cache, "steps": steps, "prompt": PROMPT,
                         "max_cache": spec.slots, "sdpa": SDPA_NOTE,
                         "per_op": "decode step"})


# ------------------------------------------------------------------------------------------------ peers
def _cached(case: H.Case):
    cache = new_cache(case.data)
    prefill(case.data, cache)
    return cache


def setup_eager(case: H.Case) -> H.Prepared:
    cache = _cached(case)
    return H.Prepared(lambda: decode(case.data, cache))


def setup_cudagraph(case: H.Case) -> H.Prepared:
    """One step of a static cache captured; per token: the token and position copied in, one replay."""
    import torch
    d = case.data
    if d.spec.cache != "static":
        raise RuntimeError("not applicable: CUDA-graph replay needs a static cache (a dynamic cache changes shape "
                           "every step)")
    cache = _cached(case)
    tok, pos = d.forced[0].clone(), d.positions[0].clone()

    def step():
        with torch.no_grad():
            return step_logits(d.model, tok, cache, pos, d.cache_kw)
    g, out, capture_ms = H.capture_cuda_graph(step, step)

    def fn():
        rewind_static(cache)  # also keeps `cache` alive: the graph holds raw pointers into its tensors
        res = []
        for i in range(d.steps):
            tok.copy_(d.forced[i])
            pos.copy_(d.positions[i])
            g.replay()
            res.append(out.clone())
        logits = torch.cat(res)
        return logits.argmax(-1), logits
    return H.Prepared(fn, extra={"capture_ms": H.rnd(capture_ms, 3)})


def scheduler_setup(ctx: H.RunContext, worker_mm: bool = False, worker_attn: bool = False):
    """gpuos_scheduler: the eager loop in one scheduler_context per repetition (worker_mm: with the worker's
    matmul on; worker_attn: with the worker's decode attention on); the check call also measures what one repetition did per decode step (aten ops, fallbacks by op,
    batches, worker launches)."""
    def setup(case: H.Case) -> H.Prepared:
        cache = _cached(case)
        steps = case.data.steps
        extra: dict = {}

        def fn():
            import gpuos
            with H.worker_tasks(gpuos, worker_mm, worker_attn), ctx.scheduler():
                return decode(case.data, cache)

        def check():
            import gpuos
            s0 = gpuos.stats()
            out = fn()
            s1 = gpuos.stats()
            extra.update(per_step_stats(s0, s1, steps))
            return out
        return H.Prepared(fn, check=check, extra=extra)
    return setup


def setup_program(case: H.Case, settle: bool = True) -> H.Prepared:
    """gpuos_program: one static-cache step captured with gpuos.capture (worker matmul and attention on while
    capturing), replayed per token with that token and position bound by pointer (no copies); settled (tier 2 in,
    H.settle_program) unless `settle` is False (tools/program_probe.py times both)."""
    import collections

    import torch

    import gpuos
    d = case.data
    if d.spec.cache != "static":
        raise RuntimeError("not applicable: a dynamic cache grows by a Python-held concatenation every step; a "
                           "program replays the GPU work of one length (symbolic extents are not built)")
    cache = _cached(case)
    toks = [t.contiguous().clone() for t in d.forced]  # one layout for every step (the guards compare strides)

    def step(tok, pos):
        with torch.no_grad():
            return step_logits(d.model, tok, cache, pos, d.cache_kw)
    prog, capture_ms = H.capture_program(gpuos, step, (toks[0], d.positions[0]), torch.cuda.synchronize)
    info = prog.info()
    settle_ms = H.settle_program(lambda: prog(toks[0], d.positions[0]), torch.cuda.synchronize) if settle else None

    def fn():
        rewind_static(cache)
        res = [prog(toks[i], d.positions[i]) for i in range(d.steps)]
        logits = torch.cat(res)
        return logits.argmax(-1), logits
    extra = {"capture_ms": H.rnd(capture_ms, 3), "settle_ms": H.rnd(settle_ms, 1),
             "subops_per_step": info["entries"], "tiles_per_step": info["tiles"],
             "segments_per_step": info["segments"], "levels_per_step": sum(info["levels"]),
             "eager_ops_per_step": dict(collections.Counter(info["fallbacks"])),
             "arena_mb": H.rnd(info["arena_bytes"] / 2**20, 2), **H.whole_build_extra()}

    def check():
        # Worker launches per replayed step (back to back: a resident worker runs every call, each call's gated
        # standby finds nothing and leaves -- or the worker left and a fresh grid ramps up per call).
        s0 = gpuos.stats()
        out = fn()
        torch.cuda.synchronize()
        extra.update(counts_per_step(s0, gpuos.stats(), d.steps, ("worker_launches", "working_launches",
                                                                  "burst_launches", "gated_launches", "batches")))
        return out
    return H.Prepared(fn, check=check, extra=extra)


def captured_step(label: str, steps: int = 8) -> tuple:
    """Config `label`'s static-cache step captured as a program, its first token and position bound by pointer, and
    settled (tier 2 in), for the tools that trace or profile one replay (tools/worker_trace.py hf,
    tools/replay_loop.py): (prog, tok, pos, case) -- the case holds the model and cache the program reads."""
    import torch

    import gpuos
    case = make_case(label, steps, "cuda")
    d = case.data
    cache = _cached(case)
    tok, pos = d.forced[0].contiguous().clone(), d.positions[0]

    def step(t, p):
        with torch.no_grad():
            return step_logits(d.model, t, cache, p, d.cache_kw)
    prog, _ = H.capture_program(gpuos, step, (tok, pos), torch.cuda.synchronize)
    H.settle_program(lambda: prog(tok, pos), torch.cuda.synchronize)
    return prog, tok, pos, case


def counts_per_step(s0: dict, s1: dict, steps: int, keys) -> dict:
    """{key + "_per_step": the counter's growth from s0 to s1 per decode step} for gpuos.stats() counters."""
    return {k + "_per_step": H.rnd((s1[k] - s0[k]) / steps, 2) for k in keys}


def per_step_stats(s0: dict, s1: dict, steps: int) -> dict:
    """Per-decode-step figures of the scheduler from two gpuos.stats() snapshots."""
    def delta(key):
        a, b = s0.get(key) or {}, s1.get(key) or {}
        return {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) != a.get(k, 0)}
    fb_ops = delta("fallback_ops")
    fallbacks = sum(fb_ops.values())
    intercepted = s1["ops_intercepted"] - s0["ops_intercepted"]
    aten = intercepted + fallbacks
    return {
        "aten_ops_per_step": H.rnd(aten / steps, 2),
        "fallbacks_per_step": H.rnd(fallbacks / steps, 2),
        "fallback_share": H.rnd(fallbacks / aten, 4) if aten else None,
        "fallback_ops_per_step": {k: H.rnd(v / steps, 2) for k, v in sorted(fb_ops.items(), key=lambda kv: -kv[1])},
        **counts_per_step(s0, s1, steps, ("batches", "worker_launches")),
        "launches_per_step_by_cause": {k: H.rnd(v / steps, 2) for k, v in delta("launches_by_cause").items()},
        "flushes_per_step_by_cause": {k: H.rnd(v / steps, 2) for k, v in delta("flushes_by_cause").items()},
    }


def prepare_compiled(case: H.Case, compiled, mode: str, ctx: H.RunContext) -> H.Prepared:
    cache = _cached(case)
    if mode == "reduce-overhead":
        import torch

        def step(model, tok, c, pos, kw):
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(model, tok, c, pos, kw).clone()
        return H.Prepared(lambda: decode(case.data, cache, step))
    return H.Prepared(lambda: decode(case.data, cache, compiled))


def make_setups(ctx: H.RunContext) -> dict:
    return {"eager": setup_eager, "gpuos_scheduler": scheduler_setup(ctx),
            "gpuos_scheduler_worker_mm": scheduler_setup(ctx, worker_mm=True),
            "gpuos_scheduler_worker": scheduler_setup(ctx, worker_mm=True, worker_attn=True),
            "gpuos_program": setup_program, "cudagraph": setup_cudagraph}


# ------------------------------------------------------------------------------------------------ suite
run_workload, compile_child, suite_units = H.standard_hooks(
    WORKLOAD, "bench_models", lambda p: p["labels"], lambda label, p, device: make_case(label, p["steps"], device),
    make_setups, step_logits, prepare_compiled, IN_PROCESS, IN_PROCESS_SHARE, NOT_APPLICABLE)


def main(argv: Any = None) -> int:
    from benchmarks import run_all  # this workload alone = python -m benchmarks --only W7
    return run_all.standalone_main(WORKLOAD, argv)


if __name__ == "__main__":
    sys.exit(main())
