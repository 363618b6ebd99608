#!/usr/bin/env python
"""TP2: tensor-parallel greedy decode of a small Llama-style model over 2 GPUs with torch.distributed (issue #20).

    torchrun --nproc_per_node=2 benchmarks/bench_tp.py            # -> benchmarks/results/multi_gpu.json (merged)
    torchrun --nproc_per_node=2 benchmarks/bench_tp.py --quick    # fewer reps
    torchrun --nproc_per_node=2 benchmarks/bench_tp.py --cpu-check   # no GPU: gloo, CPU tensors, eager and the
                                                                     # scheduler's pass-through; writes nothing

The model is plain torch, random weights from a fixed seed (no downloads): token embedding, per layer RMSNorm ->
attention (q/k/v projections, rotary embedding, a static KV cache written with ``index_copy_`` at the step's
position, grouped-query attention over the whole cache with a mask beyond the position, output projection) ->
residual -> RMSNorm -> SwiGLU MLP (gate, up, silu, down) -> residual; final RMSNorm and an LM head; the next token
is the argmax. Default: 4 layers, hidden 512, 8 heads / 4 KV heads of 64, ffn 1536, vocab 2048, float32 (fp16 /
bf16 with --dtype: the 2-rank sum of partial products rounds differently from one GEMM, so greedy tokens may then
differ from the 1-GPU run at near-ties, which float32 makes vanishingly rare).

Tensor parallelism (Megatron style): q/k/v, gate and up are split by output columns (each rank owns half the heads
and half the ffn), o and down by input rows; one ``dist.all_reduce`` after the attention's o projection and one
after the MLP's down projection; embedding, norms and LM head are replicated. Every step's input position and
token stay on the GPU (no host sync inside a generation).

Configs (each rank runs the same one at a time; times are the slower rank's per repetition):
``eager``; ``cudagraph`` (one static-cache step, NCCL all_reduces included, captured once and replayed per step);
``gpuos_scheduler`` (the eager loop inside ``gpuos.scheduler_context()``: collectives fall back, ordered after the
deferred work they read); ``gpuos_scheduler_worker_mm`` (the same with ``gpuos.set_worker_matmul(True)``);
``eager_1gpu`` (the unsplit model on rank 0's GPU: the reference whose greedy tokens every config must reproduce).
``gpuos_program`` (one step captured with ``gpuos.capture``, worker matmul off; its all_reduces are eager steps
of the program, replayed in order with a stream wait each; per token, the token and position tensors are bound by
pointer; never run on two GPUs yet at this commit).

A repetition generates from scratch: ``--prompt`` teacher-forced steps then ``--new`` greedy steps; the row's
``median_ms`` is milliseconds per step (``ms_per_generation`` / steps). ``correct``: both ranks produced exactly
the 1-GPU reference's tokens. Rows: workload ``TP2``, size = the model config, ``gpus`` = the two GPUs' names.
"""
from __future__ import annotations

import datetime
import math
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H  # first: CUDA_MODULE_LOADING=EAGER before CUDA starts

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

NAME = "multi_gpu"
WORKLOAD = "TP2"
CONFIGS = ["eager", "cudagraph", "gpuos_scheduler", "gpuos_scheduler_worker_mm", "gpuos_program"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ------------------------------------------------------------------------------------------------ the model
class ModelCfg:
    def __init__(self, layers=4, hidden=512, heads=8, kv_heads=4, ffn=1536, vocab=2048, max_seq=64,
                 dtype=torch.float32):
        self.layers, self.hidden, self.heads, self.kv_heads = layers, hidden, heads, kv_heads
        self.ffn, self.vocab, self.max_seq, self.dtype = ffn, vocab, max_seq, dtype
        self.head_dim = hidden // heads

    def name(self, world: int) -> str:
        dt = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]
        return f"llama-{self.layers}x{self.hidden}-{dt}-static-tp{world}"


def full_weights(cfg: ModelCfg, seed: int = 0) -> dict:
    """Every weight of the unsplit model, float32 on the CPU, from one seeded generator (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    H_, hd = cfg.hidden, cfg.head_dim

    def rnd(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    w = {"emb": rnd(cfg.vocab, H_), "norm": 1 + rnd(H_, std=0.1), "head": rnd(cfg.vocab, H_, std=4 / math.sqrt(H_))}
    for i in range(cfg.layers):
        w[f"{i}.an"] = 1 + rnd(H_, std=0.1)
        w[f"{i}.q"] = rnd(cfg.heads * hd, H_, std=1 / math.sqrt(H_))
        w[f"{i}.k"] = rnd(cfg.kv_heads * hd, H_, std=1 / math.sqrt(H_))
        w[f"{i}.v"] = rnd(cfg.kv_heads * hd, H_, std=1 / math.sqrt(H_))
        w[f"{i}.o"] = rnd(H_, cfg.heads * hd, std=1 / math.sqrt(cfg.heads * hd))
        w[f"{i}.mn"] = 1 + rnd(H_, std=0.1)
        w[f"{i}.gate"] = rnd(cfg.ffn, H_, std=1 / math.sqrt(H_))
        w[f"{i}.up"] = rnd(cfg.ffn, H_, std=1 / math.sqrt(H_))
        w[f"{i}.down"] = rnd(H_, cfg.ffn, std=1 / math.sqrt(cfg.ffn))
    return w


def shard(cfg: ModelCfg, w: dict, rank: int, world: int, device) -> dict:
    """Rank `rank`'s shard: column-parallel q/k/v/gate/up (output rows), row-parallel o/down (input columns)."""
    hd = cfg.head_dim
    hq, hk, f = cfg.heads // world * hd, cfg.kv_heads // world * hd, cfg.ffn // world
    s = {}
    for k, t in w.items():
        kind = k.split(".")[-1]
        if kind == "q":
            t = t[rank * hq:(rank + 1) * hq]
        elif kind in ("k", "v"):
            t = t[rank * hk:(rank + 1) * hk]
        elif kind in ("gate", "up"):
            t = t[rank * f:(rank + 1) * f]
        elif kind == "o":
            t = t[:, rank * hq:(rank + 1) * hq]
        elif kind == "down":
            t = t[:, rank * f:(rank + 1) * f]
        s[k] = t.contiguous().to(device=device, dtype=cfg.dtype)
    return s


class TPModel:
    """One rank's part of the model with its static KV cache. world == 1: the unsplit model (no collectives)."""

    def __init__(self, cfg: ModelCfg, w: dict, rank: int, world: int, device):
        self.cfg, self.world = cfg, world
        self.w = shard(cfg, w, rank, world, device)
        self.hl, self.kvl = cfg.heads // world, cfg.kv_heads // world
        self.group = cfg.heads // cfg.kv_heads
        hd = cfg.head_dim
        shape = (self.kvl, cfg.max_seq, hd)
        self.kc = [torch.zeros(shape, device=device, dtype=cfg.dtype) for _ in range(cfg.layers)]
        self.vc = [torch.zeros(shape, device=device, dtype=cfg.dtype) for _ in range(cfg.layers)]
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(cfg.max_seq, dtype=torch.float32), inv)
        self.cos = ang.cos().to(device=device, dtype=cfg.dtype)
        self.sin = ang.sin().to(device=device, dtype=cfg.dtype)
        self.ar = torch.arange(cfg.max_seq, device=device)

    @staticmethod
    def rms(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * g

    @staticmethod
    def rope(x, cos, sin):  # x: (1, heads, hd); cos / sin: (1, 1, hd / 2)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def reduce(self, t):
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def step(self, tok, pos):
        """tok, pos: (1,) int64 device tensors; returns the greedy next token, (1,) int64."""
        c, w, hd = self.cfg, self.w, self.cfg.head_dim
        x = F.embedding(tok, w["emb"])  # (1, hidden)
        cos = self.cos.index_select(0, pos).view(1, 1, -1)
        sin = self.sin.index_select(0, pos).view(1, 1, -1)
        mask = (self.ar > pos).float() * -1e9  # (max_seq,): positions after this step's are masked
        for i in range(c.layers):
            h = self.rms(x, w[f"{i}.an"])
            q = self.rope(F.linear(h, w[f"{i}.q"]).view(1, self.hl, hd), cos, sin)
            k = self.rope(F.linear(h, w[f"{i}.k"]).view(1, self.kvl, hd), cos, sin)
            v = F.linear(h, w[f"{i}.v"]).view(1, self.kvl, hd)
            self.kc[i].index_copy_(1, pos, k.transpose(0, 1))
            self.vc[i].index_copy_(1, pos, v.transpose(0, 1))
            qg = q.view(self.kvl, self.group, hd)  # grouped-query attention: a KV head serves `group` q heads
            s = torch.bmm(qg, self.kc[i].transpose(1, 2)).float() * (1.0 / math.sqrt(hd)) + mask
            p = torch.softmax(s, dim=-1).to(c.dtype)
            o = torch.bmm(p, self.vc[i]).reshape(1, self.hl * hd)
            x = x + self.reduce(F.linear(o, w[f"{i}.o"]))
            h = self.rms(x, w[f"{i}.mn"])
            m = F.linear(F.silu(F.linear(h, w[f"{i}.gate"])) * F.linear(h, w[f"{i}.up"]), w[f"{i}.down"])
            x = x + self.reduce(m)
        logits = F.linear(self.rms(x, w["norm"]), w["head"])
        return logits.argmax(dim=-1)


# ------------------------------------------------------------------------------------------------ generation
class Generator:
    """Greedy generation from scratch: `prompt` teacher-forced steps, then `new` steps fed their own argmax."""

    def __init__(self, model: TPModel, prompt: torch.Tensor, new: int):
        self.m, self.prompt, self.new = model, prompt, new
        self.steps = prompt.numel() + new
        self.pos = torch.arange(self.steps, device=prompt.device)
        self.graph = self.program = None

    def eager(self) -> torch.Tensor:
        toks, tok = [], self.prompt[0:1]
        for i in range(self.steps):
            nxt = self.m.step(tok, self.pos[i:i + 1])
            toks.append(nxt)
            tok = self.prompt[i + 1:i + 2] if i + 1 < self.prompt.numel() else nxt
        return torch.cat(toks)

    def capture_program(self) -> dict:
        """gpuos_program: one step recorded with gpuos.capture; one token / position tensor per step, made here
        (slices of one buffer would differ in alignment, which the program's guards check). Returns its info."""
        import gpuos
        self.step_pos = [self.pos[i:i + 1].clone() for i in range(self.steps)]
        self.step_tok = [self.prompt[i:i + 1].clone() for i in range(self.prompt.numel())]
        self.program = gpuos.capture(self.m.step, self.step_tok[0], self.step_pos[0])
        return self.program.info()

    def replay_program(self) -> torch.Tensor:
        toks, tok = [], self.step_tok[0]
        for i in range(self.steps):
            nxt = self.program(tok, self.step_pos[i])
            toks.append(nxt)
            tok = self.step_tok[i + 1] if i + 1 < len(self.step_tok) else nxt
        return torch.cat(toks)

    def capture(self) -> None:
        """Capture one step (its all_reduces included) on static token / position buffers."""
        self.tok_buf = self.prompt[0:1].clone()
        self.pos_buf = self.pos[0:1].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.m.step(self.tok_buf, self.pos_buf)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.nxt_buf = self.m.step(self.tok_buf, self.pos_buf)

    def replay(self) -> torch.Tensor:
        toks = []
        for i in range(self.steps):
            self.tok_buf.copy_(self.prompt[i:i + 1] if i < self.prompt.numel() else toks[-1])
            self.pos_buf.copy_(self.pos[i:i + 1])
            self.graph.replay()
            toks.append(self.nxt_buf.clone())
        return torch.cat(toks)


# ------------------------------------------------------------------------------------------------ measuring
def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, reps: int, warmup: int, device) -> tuple:
    """(tokens of the last rep, [ms per rep, the slower rank's]); a barrier before each rep."""
    out = None
    for _ in range(warmup):
        out = fn()
    sync(device)
    samples = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return out, t.tolist()


def stall_report(seconds: float, rank: int, config: str, deadline: float):
    """With seconds > 0: arm a report of this rank's state if `config` is still running after `seconds` (Python
    stacks through faulthandler, which needs no GIL; gpuos' hang report -- each runtime's published / done words,
    worker state, the driver call it is in -- from a timer thread). Returns the disarm function, which re-arms the
    run's watchdog (faulthandler has one timer) to exit at `deadline` (time.monotonic(); 0: none)."""
    if seconds <= 0:
        return lambda: None
    import faulthandler
    import threading

    def report():
        sys.stderr.write(f"[{NAME}] rank {rank}: {config} still running after {seconds:.0f} s\n")
        try:
            import gpuos_ext
            sys.stderr.write(gpuos_ext._testing.hang_report())
        except Exception as e:  # no runtime yet, or the extension is missing: the stacks still come
            sys.stderr.write(f"[{NAME}] rank {rank}: no gpuos hang report ({e})\n")
        sys.stderr.flush()
    timer = threading.Timer(seconds, report)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(seconds + 2, exit=False)

    def disarm():
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
        if deadline:
            faulthandler.dump_traceback_later(max(1.0, deadline - time.monotonic()), exit=True)
    return disarm


def same_everywhere(tokens: torch.Tensor, ref: list) -> bool:
    """Every rank produced exactly `ref` (the 1-GPU run's tokens, known on every rank)."""
    ok = torch.tensor([1 if tokens.tolist() == ref else 0], device=tokens.device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def run_config(config: str, gen: Generator, ref: list, reps: int, warmup: int, device) -> dict:
    size = gen.m.cfg.name(gen.m.world)
    extra: dict = {}
    if config == "eager":
        with torch.no_grad():
            toks, ms = timed(gen.eager, reps, warmup, device)
    elif config == "cudagraph":
        if device.type != "cuda":
            return H.error_row(WORKLOAD, size, config, "not applicable: CPU run")
        with torch.no_grad():
            gen.capture()
            toks, ms = timed(gen.replay, reps, warmup, device)
    elif config == "gpuos_program":
        if device.type != "cuda":
            return H.error_row(WORKLOAD, size, config, "not applicable: CPU run (programs need the GPU worker)")
        with torch.no_grad():
            info = gen.capture_program()
            toks, ms = timed(gen.replay_program, reps, warmup, device)
        extra = {"segments": info["segments"], "levels": sum(info["levels"]), "subops": info["entries"],
                 "eager_ops_per_step": len(info["fallbacks"]), "capture_ms": round(info["capture_s"] * 1e3, 3)}
    else:
        import gpuos
        gpuos.set_worker_matmul(config == "gpuos_scheduler_worker_mm")
        before, s0 = gpuos.scheduler_stats(), gpuos.stats()

        def run():
            with torch.no_grad(), gpuos.scheduler_context():
                return gen.eager()
        try:
            toks, ms = timed(run, reps, warmup, device)
        finally:
            gpuos.set_worker_matmul(False)
        after, s1 = gpuos.scheduler_stats(), gpuos.stats()
        n = (reps + warmup) * gen.steps
        fb = {k: v - before["fallbacks"].get(k, 0) for k, v in after["fallbacks"].items()}
        extra = {"intercepted_per_step": round((after["ops_intercepted"] - before["ops_intercepted"]) / n, 2),
                 "fallbacks_per_step": round(sum(fb.values()) / n, 2),
                 "collectives_per_step": round(fb.get("collective", 0) / n, 2),
                 "batches_per_step": round((s1["batches"] - s0["batches"]) / n, 2),
                 "worker_launches_per_step": round((s1["worker_launches"] - s0["worker_launches"]) / n, 2)}
    ok = same_everywhere(toks, ref)
    timing = H.Timing(samples_ms=[m / gen.steps for m in ms])
    return H.timing_row(WORKLOAD, size, config, timing, ok, ms_per_generation=round(statistics.median(ms), 3),
                        steps=gen.steps, **extra)


def reference(cfg: ModelCfg, w: dict, prompt_cpu: torch.Tensor, new: int, reps: int, warmup: int, device,
              rank: int) -> tuple:
    """The unsplit model on rank 0's device: its tokens (sent to every rank) and its timing row."""
    row = None
    toks = torch.zeros(prompt_cpu.numel() + new, dtype=torch.int64, device=device)
    if rank == 0:
        gen = Generator(TPModel(cfg, w, 0, 1, device), prompt_cpu.to(device), new)
        with torch.no_grad():
            out, samples = None, []
            for i in range(warmup + reps):
                t0 = time.perf_counter()
                out = gen.eager()
                sync(device)
                if i >= warmup:
                    samples.append((time.perf_counter() - t0) * 1e3 / gen.steps)
        toks.copy_(out)
        row = H.timing_row(WORKLOAD, cfg.name(1), "eager_1gpu", H.Timing(samples_ms=samples), True,
                           steps=gen.steps, note="the unsplit model on one GPU: the reference tokens")
        del gen
    dist.broadcast(toks, src=0)
    return toks.tolist(), row


def main(argv=None) -> int:
    p = H.new_parser(__doc__)
    p.add_argument("--quick", action="store_true", help="3 reps per config")
    p.add_argument("--reps", type=int, default=None, help="timed generations per config (default 10; --quick 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--configs", nargs="+", default=None, help=f"subset of {' '.join(CONFIGS)}")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--prompt", type=int, default=8, help="teacher-forced steps")
    p.add_argument("--new", type=int, default=24, help="greedy steps")
    p.add_argument("--cpu-check", action="store_true", help="gloo on CPU tensors (no GPU); writes no result file")
    p.add_argument("--out", default=None, help="result file (default benchmarks/results/multi_gpu.json, merged)")
    p.add_argument("--nccl-timeout-s", type=float, default=120.0, help="process group timeout (NCCL watchdog)")
    p.add_argument("--stall-s", type=float, default=0.0,
                   help="diagnose a stalled config: after this many seconds in one config, each rank writes its "
                        "Python stacks and gpuos' hang report (runtimes' control words, threads) to stderr")
    H.add_watchdog_arg(p, 540)
    args = p.parse_args(argv)
    H.start_watchdog(args.watchdog)
    deadline = time.monotonic() + args.watchdog if args.watchdog and args.watchdog > 0 else 0.0
    configs = H.select_configs(args.configs, CONFIGS, p.error)
    reps = args.reps or (3 if args.quick else 10)
    if "RANK" not in os.environ:
        p.error("run with torchrun --nproc_per_node=2 (RANK / WORLD_SIZE are not set)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu_check:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.nccl_timeout_s))
    else:
        if torch.cuda.device_count() < world:
            print(f"[{NAME}] needs {world} CUDA GPUs, found {torch.cuda.device_count()}: nothing measured (exit 0)")
            return 0
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        dist.init_process_group("nccl", device_id=device,
                                timeout=datetime.timedelta(seconds=args.nccl_timeout_s))
    gen = None
    try:
        cfg = ModelCfg(layers=args.layers, hidden=args.hidden, heads=8, kv_heads=4, ffn=3 * args.hidden,
                       max_seq=args.prompt + args.new, dtype=DTYPES[args.dtype])
        if cfg.kv_heads % world or cfg.ffn % world:
            p.error(f"{cfg.kv_heads} KV heads and ffn {cfg.ffn} must split over {world} ranks")
        w = full_weights(cfg)
        prompt = torch.randint(0, cfg.vocab, (args.prompt,), generator=torch.Generator().manual_seed(1))
        ref, ref_row = reference(cfg, w, prompt, args.new, reps, args.warmup, device, rank)
        gen = Generator(TPModel(cfg, w, rank, world, device), prompt.to(device), args.new)
        rows = [ref_row] if ref_row else []
        for config in configs:
            stall = stall_report(args.stall_s, rank, config, deadline)
            try:
                row = run_config(config, gen, ref, reps, args.warmup, device)
            except Exception as e:  # a config that cannot run gets an error row; the others still run
                row = H.error_row(WORKLOAD, cfg.name(world), config, e)
            finally:
                stall()
            rows.append(row)
            if rank == 0:
                print(f"[{NAME}] {config:28s} " + (f"{row['median_ms']:8.3f} ms/step  correct={row['correct']}"
                                                   if "error" not in row else f"error: {row['error']}"), flush=True)
        if rank == 0:
            names = [torch.cuda.get_device_name(d) for d in range(world)] if device.type == "cuda" else ["cpu"]
            for r in rows:
                r.update(gpus=names, world=world, note=r.get("note", "") or
                         f"ms per decode step (greedy, batch 1, {args.prompt} prompt + {args.new} new steps), "
                         f"slower rank of {world}; tokens vs the 1-GPU run")
            if args.cpu_check:
                print("CPU_CHECK " + str({r["config"]: r.get("correct", r.get("error")) for r in rows}), flush=True)
            else:
                path = H.merge_results(NAME, H.env_metadata(NAME), rows, path=args.out)
                print(f"[{NAME}] wrote {path}", flush=True)
    finally:
        teardown(args.stall_s, rank, device, deadline, gen)
    return 0


def teardown(stall_s: float, rank: int, device, deadline: float, gen) -> None:
    """Release the CUDA graph and the program (their NCCL kernels and memory), stop GPUOS' workers, then destroy
    the process group. (At 1b68531 a full run on 2 x H200 wrote its results and then hung in its exit: each step
    here says where a hang is.)"""
    stall = stall_report(stall_s, rank, "teardown", deadline)
    try:
        if gen is not None:
            gen.graph = gen.program = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if "gpuos" in sys.modules:
            sys.modules["gpuos"].shutdown()
        dist.destroy_process_group()
    finally:
        stall()
    if stall_s > 0:
        sys.stderr.write(f"[{NAME}] rank {rank}: teardown done\n")


if __name__ == "__main__":
    sys.exit(main())
