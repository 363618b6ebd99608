"""What one decode step of a Hugging Face model issues, as aten ops (issue #16's list; no GPU needed).

Builds tiny GPT-2 / Llama / Qwen2 / Mistral configs with random weights on the CPU, runs a prefill and then one
decode step (static and dynamic KV caches) under a logging TorchDispatchMode, and prints the aten overloads of
the decode step with their counts, and whether gpuos.scheduler has a handler for each (on the GPU a handler may
still refuse a call: see gpuos.scheduler_stats()["fallback_ops"]).

    python tools/decode_ops_probe.py [--json out.json]

CPU and CUDA differ in the sdpa backend (_scaled_dot_product_* overloads) and little else.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _desc(x):
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(_desc(v) for v in x) + "]"
    return repr(x) if isinstance(x, (int, float, bool, type(None))) else type(x).__name__


class _Log(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.sigs: dict = collections.defaultdict(collections.Counter)  # op -> argument descriptions

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        kw = {k: v for k, v in (kwargs or {}).items() if k not in ("layout", "pin_memory")}
        self.sigs[str(func)][_desc(list(args)) + (" " + _desc(list(kw.items())) if kw else "")] += 1
        return func(*args, **(kwargs or {}))


def _models():
    import transformers as T
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    yield "gpt2", T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64))
    yield "llama", T.LlamaForCausalLM(T.LlamaConfig(**small))
    yield "qwen2", T.Qwen2ForCausalLM(T.Qwen2Config(**small))
    yield "mistral", T.MistralForCausalLM(T.MistralConfig(**small, sliding_window=None))


def step_ops(model, cache: str, attn: str) -> collections.Counter:
    """aten ops of one greedy decode step after a 5-token prefill."""
    import transformers as T
    model.config._attn_implementation = attn
    ids = torch.randint(0, 128, (1, 5))
    kw = {}
    if cache == "static":
        kw["past_key_values"] = T.StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        out = model(ids, use_cache=True, **kw)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        pos = torch.tensor([ids.shape[1]])
        log = _Log()
        with log:
            out = model(nxt, past_key_values=past, use_cache=True, cache_position=pos)
            out.logits[:, -1].argmax(-1, keepdim=True)
    return log.ops, log.sigs


_VIEWS = ("view", "_unsafe_view", "unsqueeze", "squeeze", "transpose", "expand", "alias", "t", "select", "slice",
          "split", "permute", "reshape", "unbind", "chunk", "as_strided", "detach", "empty")


def markdown(res: dict, handled: set) -> str:
    """One row per aten op (views and allocation left out: they read no data), its count per decode step in each
    model / cache (sdpa attention; '+n' more with eager attention), and whether gpuos has a handler."""
    models = sorted({k.split("/")[0] for k in res})
    cols = [(m, c) for m in models for c in ("static", "dynamic")]
    ops = sorted({op for d in res.values() for op in d if op.split(".")[1] not in _VIEWS},
                 key=lambda op: -sum(d.get(op, 0) for d in res.values()))
    head = "| aten op | " + " | ".join(f"{m} {c[0]}" for m, c in cols) + " | gpuos |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for op in ops:
        cells = []
        for m, c in cols:
            sd, ea = res.get(f"{m}/{c}/sdpa", {}).get(op, 0), res.get(f"{m}/{c}/eager", {}).get(op, 0)
            cells.append(f"{sd}" + (f" ({ea})" if ea != sd else "") if sd or ea else "")
        lines.append(f"| `{op}` | " + " | ".join(cells) + f" | {'yes' if op in handled else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write {model/cache/attn: {op: count}} here")
    ap.add_argument("--args", action="store_true", help="also print each op's argument dtypes / shapes")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved --json run and exit")
    a = ap.parse_args(argv)
    try:
        import gpuos.scheduler as S
        handled = set(S.intercepted_ops())
    except Exception as e:  # noqa: BLE001 -- the probe still lists the ops
        print(f"(gpuos not importable: {e}; the 'gpuos' column is empty)", file=sys.stderr)
        handled = set()
    if a.table:
        with open(a.table) as f:
            print(markdown(json.load(f), handled))
        return 0
    res = {}
    for name, model in _models():
        model.eval()
        for cache in ("static", "dynamic"):
            for attn in ("sdpa", "eager"):
                ops, sigs = step_ops(model, cache, attn)
                key = f"{name}/{cache}/{attn}"
                res[key] = dict(ops.most_common())
                print(f"== {key}: {sum(ops.values())} aten ops")
                for op, n in ops.most_common():
                    print(f"  {n:4d}  {op:55s} {'yes' if op in handled else 'no'}")
                    if a.args:
                        for sig, m in sigs[op].most_common(4):
                            print(f"          {m:3d}x {sig[:150]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
