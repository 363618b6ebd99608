"""Reliability engine, part 3: comparing gpuos with eager (quick counts, float64 verdicts, stories) and the soak."""
from __future__ import annotations

import json
import math
import os
import random
import traceback

import torch
from _rel_ops import (  # noqa: F401
    DRIFT_FACTOR,
    F32,
    QUICK_TOL,
    _EPS,
    _meta,
    _now,
)
from _rel_chains import (  # noqa: F401
    ALLOC,
    CALL,
    CAST,
    ChainGen,
    LEAF,
    Pools,
    _exec,
    make_leaves,
    run_chain,
)


# ================================================================================================ comparison
def quick_count(env_g, env_e, slots=None):
    """(0-d tensor: elements outside QUICK_TOL, summed over every live slot -- no host sync; list of metadata
    differences (shape / dtype / missing), found on the host)."""
    groups, meta_bad = {}, []
    for i in range(len(env_e)) if slots is None else slots:
        e, g = env_e[i], env_g[i]
        if e is None and g is None:
            continue
        if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
            meta_bad.append((i, f"slot {i}: gpuos {_meta(g)} vs eager {_meta(e)}"))
            continue
        if g.shape != e.shape or g.dtype != e.dtype:
            meta_bad.append((i, f"slot {i}: gpuos {_meta(g)} vs eager {_meta(e)}"))
            continue
        gl = groups.setdefault(e.dtype, ([], []))
        gl[0].append(g.reshape(-1))
        gl[1].append(e.reshape(-1))
    counts = []
    for dt, (gs, es) in groups.items():
        G, E = torch.cat(gs), torch.cat(es)
        if dt.is_floating_point:
            rt, at = QUICK_TOL[dt]
            if dt != F32 and dt != torch.float64:
                G, E = G.float(), E.float()
            counts.append((~torch.isclose(G, E, rtol=rt, atol=at, equal_nan=True)).sum())
        else:
            counts.append((G != E).sum())
    total = torch.stack(counts).sum() if counts else None
    return total, meta_bad


def _slot_bad(g, e):
    """Boolean mask of g's elements outside QUICK_TOL of e (same shape and dtype)."""
    if e.dtype.is_floating_point:
        rt, at = QUICK_TOL[e.dtype]
        return ~torch.isclose(g.double(), e.double(), rtol=rt, atol=at, equal_nan=True)
    return g != e


def _chain_eps(chain):
    """Unit roundoff of the lowest float precision the chain's values pass through (leaves, casts, out= tensors):
    a value rounded there may round the other way in the other run (one ulp), and the float64 replay has no
    such rounding at all."""
    dts = [spec[0] for spec in chain.leaves]
    dts += [ins[3] for ins in chain.prog if ins[0] in (ALLOC, CAST)]
    return max([_EPS[d] for d in dts if d in _EPS] + [_EPS[F32]])


def _judge(g, e, r, eps):
    """A slot outside the quick tolerance: 'drift' when gpuos is no more than DRIFT_FACTOR times further from the
    float64 replay r than eager is, plus 8 units of roundoff `eps` of the chain's lowest precision (relative to the
    slot's largest value), else 'mismatch'. Returns (verdict, facts)."""
    facts = {}
    if not e.dtype.is_floating_point:
        return "mismatch", {"why": "integer/bool values differ (exact comparison)"}
    gd, ed, rd = g.double(), e.double(), r.double()
    fin_g, fin_e = torch.isfinite(gd), torch.isfinite(ed)
    both_nan = torch.isnan(gd) & torch.isnan(ed)
    same_inf = torch.isinf(gd) & torch.isinf(ed) & (gd == ed)
    pattern = (fin_g != fin_e) | (~fin_g & ~fin_e & ~both_nan & ~same_inf)
    if bool(pattern.any()):
        facts["why"] = f"NaN/inf pattern differs at {int(pattern.sum())} elements"
        return "mismatch", facts
    both = fin_g & fin_e
    zero = torch.zeros((), dtype=torch.float64, device=gd.device)
    err_g = float(torch.where(both, (gd - rd).abs(), zero).max()) if gd.numel() else 0.0
    err_e = float(torch.where(both, (ed - rd).abs(), zero).max()) if gd.numel() else 0.0
    scale = float(torch.where(torch.isfinite(rd), rd.abs(), zero).max()) if rd.numel() else 0.0
    slack = 8.0 * eps * max(1.0, scale)
    facts.update(err_gpuos_vs_f64=err_g, err_eager_vs_f64=err_e, f64_scale=scale, slack=slack)
    if err_g <= DRIFT_FACTOR * err_e + slack:
        facts["why"] = "gpuos no further from float64 than eager: rounding drift through the chain"
        return "drift", facts
    facts["why"] = (f"gpuos is {err_g:.3g} from float64, eager {err_e:.3g} (allowed {DRIFT_FACTOR} x eager + "
                    f"{slack:.3g})")
    return "mismatch", facts


def _first_bad(g, e, r=None):
    bad = _slot_bad(g, e)
    n_bad = int(bad.sum())
    out = {"n_bad": n_bad, "numel": g.numel()}
    if n_bad:
        idx = tuple(int(v) for v in bad.nonzero()[0].tolist()) if g.dim() else ()
        out["first_bad_index"] = list(idx)
        out["gpuos"] = float(g[idx]) if g.numel() else None
        out["eager"] = float(e[idx]) if e.numel() else None
        if r is not None and isinstance(r, torch.Tensor) and r.shape == g.shape:
            out["f64"] = float(r[idx])
        if e.dtype.is_floating_point:
            d = (g.double() - e.double()).abs()
            d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
            out["max_abs_diff"] = float(d.max())
    return out


def listing(chain, pools, limit=80):
    """The program with every instruction's input and output shapes, dtypes and strides (an eager replay)."""
    env = [None] * chain.slots
    leaves = make_leaves(chain, pools, "eager")
    lines = []
    for k, ins in enumerate(chain.prog):
        if ins[0] == CALL:
            ins_meta = ", ".join(f"s{i}:{_meta(env[i])}" for i in ins[3])
        elif ins[0] == CAST:
            ins_meta = f"s{ins[2]}:{_meta(env[ins[2]])}"
        else:
            ins_meta = ""
        try:
            _exec(ins, env, leaves, pools.device, False)
        except Exception as e:  # noqa: BLE001
            lines.append(f"{k:3d} {chain.labels[k]}({ins_meta}) raised {type(e).__name__}: {str(e)[:200]}")
            continue
        dst = ins[1]
        res = _meta(env[dst]) if dst >= 0 else "-"
        lines.append(f"{k:3d} s{dst} = {chain.labels[k]}({ins_meta}) -> {res}")
    if len(lines) > limit:
        lines = lines[:limit // 2] + [f"... {len(lines) - limit} more ..."] + lines[-limit // 2:]
    return lines


def diagnose(chain, env_g, env_e, pools, sched_kwargs, details=True):
    """A chain that failed the quick check: judge every slot against a float64 replay; for a mismatch, the full
    story (program listing, first divergent op of an unfused replay, whether it reproduces). Returns
    (verdict 'ok'|'drift'|'mismatch', info dict)."""
    info = {"seed": chain.seed, "dtype": str(chain.dtype).replace("torch.", ""), "n_ops": chain.n_ops}
    slots = []
    verdict = "ok"
    env_r = None
    try:
        env_r = run_chain(chain, pools, "f64")
    except Exception as e:  # noqa: BLE001
        info["f64_replay_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    for i in range(chain.slots):
        g, e = env_g[i], env_e[i]
        if g is None and e is None:
            continue
        if not isinstance(g, torch.Tensor) or not isinstance(e, torch.Tensor) or g.shape != e.shape \
                or g.dtype != e.dtype:
            slots.append({"slot": i, "verdict": "mismatch", "why": "metadata differs", "gpuos": _meta(g),
                          "eager": _meta(e)})
            verdict = "mismatch"
            continue
        bad = _slot_bad(g, e)
        if not bool(bad.any()):
            continue
        r = env_r[i] if env_r is not None else None
        if r is None:
            v, facts = "mismatch", {"why": "no float64 replay"}
        else:
            v, facts = _judge(g, e, r, _chain_eps(chain))
        s = {"slot": i, "verdict": v, "tensor": _meta(g), "eager_layout": _meta(e)}
        s.update(facts)
        s.update(_first_bad(g, e, r))
        s["last_writer"] = _last_writer(chain, i)
        slots.append(s)
        if v == "mismatch":
            verdict = "mismatch"
        elif verdict == "ok":
            verdict = "drift"
    info["slots"] = slots
    if verdict == "mismatch" and details:
        _story(chain, env_e, pools, sched_kwargs, info)
    elif verdict == "drift":
        info["program"] = listing(chain, pools, limit=30)
    return verdict, info


def _last_writer(chain, slot):
    for k in range(len(chain.prog) - 1, -1, -1):
        ins = chain.prog[k]
        if ins[1] == slot:
            return f"{k}: {chain.labels[k]}"
    return None


def _story(chain, env_e, pools, sched_kwargs, info):
    import gpuos
    try:
        info["program"] = listing(chain, pools)
    except Exception as e:  # noqa: BLE001
        info["program"] = [f"listing failed: {type(e).__name__}: {e}"]
    try:  # does the same replay give the same wrong answer?
        lv = make_leaves(chain, pools, "gpuos")
        with gpuos.scheduler_context(**sched_kwargs):
            env_g2 = run_chain(chain, pools, "gpuos", lv)
        cnt, meta_bad = quick_count(env_g2, env_e)
        info["reproduced"] = bool(meta_bad) or (cnt is not None and int(cnt) > 0)
    except Exception as e:  # noqa: BLE001
        info["reproduced"] = f"replay raised {type(e).__name__}: {str(e)[:300]}"
    try:  # unfused replay (each result cloned: a dependency flush per op): the first op whose output differs
        cap_e, cap_g = [], []
        run_chain(chain, pools, "eager", capture=cap_e)
        lv = make_leaves(chain, pools, "gpuos")
        with gpuos.scheduler_context(**sched_kwargs):
            run_chain(chain, pools, "gpuos", lv, capture=cap_g)
        first = None
        for (k, a), (_, b) in zip(cap_e, cap_g):
            if not isinstance(a, torch.Tensor) or chain.prog[k][0] in (ALLOC, LEAF):  # uninitialised / inputs
                continue
            if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
                first = {"op": k, "label": chain.labels[k], "why": f"gpuos {_meta(b)} vs eager {_meta(a)}"}
                break
            if bool(_slot_bad(b, a).any()):
                first = {"op": k, "label": chain.labels[k], "out": _meta(b)}
                first.update(_first_bad(b, a))
                break
        info["first_divergent_op_unfused"] = first if first is not None else \
            "none: the op-by-op replay matches eager (the difference needs the fused / batched run)"
    except Exception as e:  # noqa: BLE001
        info["first_divergent_op_unfused"] = f"capture replay raised {type(e).__name__}: {str(e)[:300]}"


# ================================================================================================ soak
def _sched_counters():
    import gpuos
    import gpuos_ext
    s = gpuos_ext.sched_stats()
    fb = gpuos.scheduler_stats()["fallbacks"]
    rt = gpuos_ext.stats() if gpuos_ext.is_initialized() else {}
    return {"ops_intercepted": s["ops_intercepted"], "front_ops": s["front_ops"], "fused_ops": s["fused_ops"],
            "fused_groups": s["fused_groups"], "sched_flushes": s["sched_flushes"],
            "specializations_requested": s["specializations_requested"],
            "fallbacks": dict(fb), "flushes_by_cause": dict(s["flushes_by_cause"]),
            "subops": rt.get("subops", 0), "batches": rt.get("batches", 0), "jit_compiles": rt.get("jit_compiles", 0),
            "handovers": rt.get("handovers", 0), "early_publishes": rt.get("early_publishes", 0)}


def _delta(a, b):
    out = {}
    for k, v in b.items():
        if isinstance(v, dict):
            out[k] = {kk: vv - a.get(k, {}).get(kk, 0) for kk, vv in v.items() if vv - a.get(k, {}).get(kk, 0)}
        else:
            out[k] = v - a.get(k, 0)
    return out


def soak(n_ops=1_000_000, seed=0, device="cuda", chain_len=(10, 50), check_every=32, max_seconds=None,
         inject_fault=0, details=5, progress_s=15.0, sched_kwargs=None, log=print):
    """Random chains under the scheduler vs eager until n_ops ops ran (see the module docstring).

    inject_fault: every that-many-th chain gets one wrong element added to a gpuos result after the replay (a
    self-test: the soak must report those chains as mismatches). max_seconds: stop early (result 'truncated').
    Returns counts, the intercepted fraction, the first `details` mismatches and drifts with full detail."""
    import gpuos
    sched_kwargs = dict(sched_kwargs or {"auto_flush_ms": 0})
    pools = Pools(device, seed)
    gen = ChainGen(pools)
    if device != "cpu":
        log(f"soak: CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING')}")
    # warm up (runtime init and the first NVRTC load happen here, outside the timed loop)
    with torch.no_grad():
        warm, _ = gen.build(random.Random(seed), 10, dtype=F32, shape=(64,))
        lv = make_leaves(warm, pools, "gpuos")
        with gpuos.scheduler_context(**sched_kwargs):
            run_chain(warm, pools, "gpuos", lv)
    if device != "cpu":
        torch.cuda.synchronize()
    c0 = _sched_counters()
    res = {"requested_ops": n_ops, "ops": 0, "chains": 0, "mismatches": 0, "mismatch_chains": 0, "drift_chains": 0,
           "raised": 0, "injected": 0, "mismatch_details": [], "drift_details": [], "dtypes": {}, "forms": {},
           "seed": seed, "device": device}
    forms = res["forms"]
    pending = []
    t0 = _now()
    last = t0
    idx = 0

    def settle():
        if not pending:
            return
        counts = torch.stack([p[4] for p in pending]).tolist()
        for p, c in zip(pending, counts):
            ch, env_g, env_e, meta_bad = p[0], p[1], p[2], p[3]
            if not c and not meta_bad:
                continue
            verdict, info = diagnose(ch, env_g, env_e, pools, sched_kwargs,
                                     details=len(res["mismatch_details"]) < details)
            info["chain"] = p[5]
            if p[6]:
                info["injected_fault"] = p[6]
            if verdict == "mismatch":
                res["mismatch_chains"] += 1
                res["mismatches"] += sum(1 for s in info["slots"] if s["verdict"] == "mismatch")
                if len(res["mismatch_details"]) < details:
                    res["mismatch_details"].append(info)
                    log(f"soak: MISMATCH in chain {p[5]} (seed {ch.seed}):\n" + json.dumps(info, indent=1, default=str))
            elif verdict == "drift":
                res["drift_chains"] += 1
                if len(res["drift_details"]) < 3:
                    res["drift_details"].append(info)
        pending.clear()

    with torch.no_grad():
        while res["ops"] < n_ops:
            idx += 1
            cseed = seed * 1_000_003 + idx
            rng = random.Random(cseed)
            chain, env_e = gen.build(rng, rng.randint(*chain_len), seed=cseed)
            raised = None
            lv = make_leaves(chain, pools, "gpuos")
            try:
                with gpuos.scheduler_context(**sched_kwargs):
                    env_g = run_chain(chain, pools, "gpuos", lv)
            except gpuos.GpuosError as e:  # the runtime is in trouble (a timeout, a driver error): stop here
                res["runtime_error"] = {"chain": idx, "seed": cseed, "error": f"{type(e).__name__}: {str(e)[:2000]}",
                                        "traceback": traceback.format_exc()[-3000:]}
                try:  # host-side counters: safe to read with the GPU stuck
                    res["runtime_error"]["stats"] = {k: v for k, v in gpuos.stats().items()
                                                     if isinstance(v, (int, float)) and v}
                except Exception as e2:  # noqa: BLE001
                    res["runtime_error"]["stats"] = repr(e2)
                log(f"soak: runtime error in chain {idx}: {type(e).__name__}: {e}\nstats: "
                    f"{res['runtime_error']['stats']}")
                break
            except Exception as e:  # noqa: BLE001 -- eager ran this chain: gpuos raising is a difference
                raised = f"{type(e).__name__}: {str(e)[:500]}"
                env_g = [None] * chain.slots
            res["ops"] += chain.n_ops
            res["chains"] += 1
            dn = str(chain.dtype).replace("torch.", "")
            res["dtypes"][dn] = res["dtypes"].get(dn, 0) + chain.n_ops
            for ins, lab in zip(chain.prog, chain.labels):
                if ins[0] == CALL or ins[0] == CAST:
                    f = _form_of(lab)
                    forms[f] = forms.get(f, 0) + 1
            if raised is not None:
                res["raised"] += 1
                res["mismatch_chains"] += 1
                res["mismatches"] += 1
                if len(res["mismatch_details"]) < details:
                    info = {"chain": idx, "seed": cseed, "raised": raised, "program": listing(chain, pools)}
                    res["mismatch_details"].append(info)
                    log(f"soak: chain {idx} raised under the scheduler:\n" + json.dumps(info, indent=1, default=str))
                continue
            fault = None
            if inject_fault and idx % inject_fault == 0:
                fault = _inject(env_g)
                res["injected"] += fault is not None
            cnt, meta_bad = quick_count(env_g, env_e)
            if cnt is None:
                cnt = torch.zeros((), dtype=torch.int64, device=device)
            pending.append((chain, env_g, env_e, meta_bad, cnt, idx, fault))
            if len(pending) >= check_every:
                settle()
            now = _now()
            if now - last >= progress_s:
                last = now
                el = now - t0
                log(f"soak: {res['ops']:,}/{n_ops:,} ops, {res['chains']:,} chains, {el:.0f} s, "
                    f"{1e6 * el / max(res['ops'], 1):.1f} us/op, mismatches {res['mismatches']}, "
                    f"drift chains {res['drift_chains']}")
            if max_seconds is not None and now - t0 > max_seconds:
                res["truncated"] = True
                break
        if "runtime_error" in res:  # streams may wait for work that never completes: no sync, no checks
            res["seconds"] = round(_now() - t0, 2)
            res["ok"] = False
            return res
        settle()
    if device != "cpu":
        torch.cuda.synchronize()
    res["seconds"] = round(_now() - t0, 2)
    res["us_per_op"] = round(1e6 * res["seconds"] / max(res["ops"], 1), 2)
    d = _delta(c0, _sched_counters())
    res["counters"] = d
    res["intercepted"] = d["ops_intercepted"]
    res["fallbacks"] = sum(d["fallbacks"].values())
    res["intercepted_fraction"] = round(d["ops_intercepted"] / max(res["ops"], 1), 4)
    res["fallback_fraction"] = round(res["fallbacks"] / max(res["ops"], 1), 4)
    res["eager_rejected_ops"] = gen.rejected
    res["reproduce"] = (f"_reliability.rebuild_chain(seed, pool_seed={seed}, device={device!r}, "
                        f"chain_len={tuple(chain_len)}) with a detail's seed")
    res["ok"] = res["mismatches"] == 0 and res["ops"] >= n_ops and "runtime_error" not in res
    return res


_FOREIGN = ("where", "to(", "clone", "contiguous", "cumsum", "mm", "item", "gpuos.flush", "gt.")
_VIEWS = ("unsqueeze", "reshape", "transpose", "t()", "[", "expand")
_REDUCE = ("sum.", "mean.", "amax", "amin", "softmax", "log_softmax")


def _form_of(label):
    """The soak's op categories (for its coverage counts)."""
    if label.startswith(_FOREIGN):
        return "foreign"
    if label.startswith(_VIEWS):
        return "view"
    if ".out" in label:
        return "out"
    if label.endswith("_"):
        return "inplace"
    if label.startswith(_REDUCE):
        return "reduce"
    if ".Scalar" in label or label.startswith("rdiv"):
        return "scalar"
    return "functional"


def rebuild_chain(seed, pool_seed=0, device="cuda", chain_len=(10, 50)):
    """The chain a soak (pool_seed = its seed) or the stress (pool_seed = its seed, chain_len (5, 25)) ran under
    `seed` (a mismatch detail's "seed"): (chain, eager slots, pools). Replay it with run_chain; print listing()."""
    pools = Pools(device, pool_seed)
    rng = random.Random(seed)
    chain, env_e = ChainGen(pools).build(rng, rng.randint(*chain_len), seed=seed)
    return chain, env_e, pools


def _inject(env_g):
    """Self-test fault: one element of one float result off by 1 + 10 % (out of place: the tensor is replaced)."""
    for i, t in enumerate(env_g):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel() > 0:
            w = t.clone()
            flat = w.view(-1) if w.is_contiguous() else None
            if flat is None:
                continue
            flat[flat.numel() // 2] += 1.0 + 0.1 * flat[flat.numel() // 2].abs()
            env_g[i] = w
            return f"slot {i} element {flat.numel() // 2}"
    return None
