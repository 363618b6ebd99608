"""Reliability figures: the stress, the soak and the flush drift of tests/_reliability.py (each in its own child
process, as tests/test_gpu_stress.py runs them), written to benchmarks/results/reliability.json as value rows
(BENCH_SCHEMA.md: ``{"workload", "config": <figure>, "value", "unit", ...}``; a part that could not run gets an
``error`` row):

    soak_ops, soak_mismatches, stress_seconds, stress_hangs, stress_mismatches, stress_errors,
    flush_memory_drift_bytes (torch.cuda.memory_allocated), flush_rss_drift_bytes (host RSS),
    sanitizer_errors (only with --sanitizer-log: the sum of compute-sanitizer's "ERROR SUMMARY: N errors" lines)

    python tools/reliability_run.py                               # 60 s stress, 1,000,000-op soak, 100,000 flushes
    python tools/reliability_run.py --stress-s 300 --only stress
    python tools/reliability_run.py --only sanitizer --sanitizer-log $OUT/sanitizer_*.log

Rows of figures not run this time are kept from the existing file. Exit status 1 when a part failed (a mismatch,
a hang, an error, a drift past its bound) or could not run.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
from benchmarks import harness as H  # noqa: E402  (metadata, rows, result files: one definition each)

TESTS_DIR = os.path.join(REPO_ROOT, "tests")
DEFAULT_OUT = os.path.join(REPO_ROOT, "benchmarks", "results", "reliability.json")
PARTS = ("stress", "soak", "drift", "sanitizer")
WORKLOAD = "reliability"


# ------------------------------------------------------------------------------------------------ rows
def value_row(name, value, unit, **extra) -> dict:
    return H.value_row(WORKLOAD, name, value, unit, kind="value", metric=name, **extra)


def error_row(name, error, **extra) -> dict:
    return H.error_row(WORKLOAD, None, name, str(error)[:2000], kind="value", metric=name, **extra)


# ------------------------------------------------------------------------------------------------ parts
def _child(kind, args, timeout, timeout_s_env):
    """(result dict or None, why not)."""
    sys.path.insert(0, TESTS_DIR)
    import _reliability as R
    c = R.run_child(kind, [str(a) for a in args] + ["--hard-limit-s", str(int(timeout - 30))], timeout=timeout,
                    timeout_s_env=timeout_s_env)
    if c["result"] is None:
        why = f"killed after {timeout:.0f} s (a hang past every bound)" if c["timed_out"] else f"rc={c['rc']}"
        print(R.describe_child(c, 6000), file=sys.stderr)
        return None, f"{kind} child printed no result: {why}"
    res = c["result"]
    if res.get("error"):
        print(R.describe_child(c, 6000), file=sys.stderr)
        return None, f"{kind} failed: {res['error']}"
    return res, None


def _trim_details(details, n=3, program_lines=40):
    out = []
    for d in (details or [])[:n]:
        d = dict(d)
        if isinstance(d.get("program"), list) and len(d["program"]) > program_lines:
            d["program"] = d["program"][:program_lines] + [f"... {len(d['program']) - program_lines} more"]
        out.append(d)
    return out


def run_stress(a):
    res, err = _child("stress", ["--seconds", a.stress_s, "--threads", a.threads, "--seed", a.seed],
                      a.stress_s + 420, a.timeout_s)
    names = ("stress_seconds", "stress_hangs", "stress_mismatches", "stress_errors")
    if res is None:
        return [error_row(n, err) for n in names], False
    common = {"threads": res["threads"], "seed": res["seed"]}
    rows = [
        value_row("stress_seconds", res["seconds"], "s", correct=res["ok"], iterations=res["iterations"],
                  total_iterations=res["total_iterations"], expected_errors=res["expected_errors"],
                  injection=res["injection"], final_checks=res["final"], **common),
        value_row("stress_hangs", res["hangs"], "calls", correct=res["hangs"] == 0 and not res["stuck_threads"],
                  bounds_s=res["bounds_s"], details=res["hang_details"][:5], stuck_threads=res["stuck_threads"],
                  note="calls past their bound (2 x GPUOS_TIMEOUT_S + 10 s per blocking call)", **common),
        value_row("stress_mismatches", res["mismatches"], "results", correct=res["mismatches"] == 0,
                  details=_trim_details(res["mismatch_details"]), drift_chains=res["drift_chains"], **common),
        value_row("stress_errors", res["errors"], "errors", correct=res["errors"] == 0,
                  details=_trim_details(res["error_details"]), thread_errors=res["thread_errors"][:5],
                  note="exceptions other than the expected typed ones", **common),
    ]
    return rows, bool(res["ok"])


def run_soak(a):
    max_s = max(600.0, a.soak_ops / 1000.0)
    res, err = _child("soak", ["--ops", a.soak_ops, "--seed", a.seed, "--max-seconds", max_s], max_s + 240,
                      a.timeout_s_soak)
    if res is None:
        return [error_row("soak_ops", err), error_row("soak_mismatches", err)], False
    info = {k: res.get(k) for k in ("chains", "seconds", "us_per_op", "intercepted", "intercepted_fraction",
                                    "fallbacks", "fallback_fraction", "drift_chains", "dtypes", "forms", "seed")}
    rows = [
        value_row("soak_ops", res["ops"], "ops", correct=res["ops"] >= res["requested_ops"],
                  requested_ops=res["requested_ops"], truncated=bool(res.get("truncated")), **info),
        value_row("soak_mismatches", res["mismatches"], "mismatches", correct=res["mismatches"] == 0,
                  mismatch_chains=res["mismatch_chains"], raised=res["raised"], ops=res["ops"],
                  details=_trim_details(res["mismatch_details"]), drift_chains=res["drift_chains"],
                  note="a chain counts as rounding drift, not a mismatch, when gpuos is within 4x eager's distance "
                       "from a float64 replay (+8 units of roundoff of the chain's lowest precision)"),
    ]
    return rows, bool(res["ok"])


def run_drift(a):
    res, err = _child("drift", ["--flushes", a.drift_flushes], 600 + a.drift_flushes / 200.0, a.timeout_s_soak)
    if res is None:
        return [error_row("flush_memory_drift_bytes", err), error_row("flush_rss_drift_bytes", err)], False
    common = {"flushes": res["flushes"], "warmup_flushes": res["warmup_flushes"],
              "us_per_flush": res["us_per_flush"], "results_correct": res["results_correct"]}
    series = [{"flushes": s["flushes"], "alloc": s["alloc_drift"], "rss": s["rss_drift"]} for s in res["series"]]
    rows = [
        value_row("flush_memory_drift_bytes", res["alloc_drift_bytes"], "bytes",
                  correct=abs(res["alloc_drift_bytes"]) <= res["alloc_bound_bytes"],
                  bound_bytes=res["alloc_bound_bytes"], before=res["alloc_before"], after=res["alloc_after"],
                  max_abs_drift_bytes=res["max_alloc_drift_bytes"], series=series,
                  note="torch.cuda.memory_allocated() after vs before, after a warm-up, synced, gc'd", **common),
        value_row("flush_rss_drift_bytes", res["rss_drift_bytes"], "bytes",
                  correct=res["rss_drift_bytes"] < res["rss_bound_bytes"], bound_bytes=res["rss_bound_bytes"],
                  before=res["rss_before"], after=res["rss_after"], max_drift_bytes=res["max_rss_drift_bytes"],
                  note="host VmRSS after vs before, after a warm-up", **common),
    ]
    return rows, bool(res["ok"])


# memcheck / synccheck end with "ERROR SUMMARY: N errors"; racecheck with "RACECHECK SUMMARY: H hazards displayed
# (N errors, W warnings)".
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error|RACECHECK SUMMARY:[^(\n]*\((\d+)\s+error")


def sanitizer_errors(paths):
    """(sum of compute-sanitizer's error counts (its ERROR / RACECHECK SUMMARY lines) over the logs, per-log
    details); a log without such a line is reported (the tool did not finish) and makes the row an error row when
    no log has one."""
    total, logs, found = 0, [], 0
    for p in paths:
        try:
            with open(p, errors="replace") as f:
                text = f.read()
        except OSError as e:
            logs.append({"log": p, "error": str(e)})
            continue
        counts = [int(a or b) for a, b in _SUMMARY.findall(text)]
        logs.append({"log": p, "summaries": counts})
        if counts:
            found += 1
            total += sum(counts)
    return total, logs, found


def run_sanitizer(a):
    total, logs, found = sanitizer_errors(a.sanitizer_log)
    if not found:
        return [error_row("sanitizer_errors", "no 'ERROR SUMMARY' line in any log", logs=logs)], False
    missing = [lg["log"] for lg in logs if not lg.get("summaries")]
    row = value_row("sanitizer_errors", total, "errors", correct=total == 0 and not missing, logs=logs)
    if missing:
        row["note"] = f"no ERROR SUMMARY in {missing} (that tool did not finish)"
    return [row], total == 0 and not missing


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stress-s", type=float, default=60.0, help="stress duration in seconds (default 60)")
    p.add_argument("--threads", type=int, default=6, help="stress threads (default 6)")
    p.add_argument("--soak-ops", type=int, default=1_000_000, help="soak ops (default 1,000,000)")
    p.add_argument("--drift-flushes", type=int, default=100_000, help="flushes measured for drift (default 100,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None,
                   help=f"comma-separated subset of {','.join(PARTS)} (default: stress,soak,drift, plus sanitizer "
                        "when --sanitizer-log is given)")
    p.add_argument("--sanitizer-log", nargs="+", action="extend", default=[], metavar="PATH",
                   help="compute-sanitizer log(s) (e.g. tools/gpu_check.sh sanitize's sanitizer_<tool>.log): "
                        "sanitizer_errors = the sum of their ERROR SUMMARY counts; no log, no row")
    p.add_argument("--timeout-s", type=float, default=10.0,
                   help="GPUOS_TIMEOUT_S of the stress child (every GPU wait; default 10)")
    p.add_argument("--timeout-s-soak", type=float, default=20.0,
                   help="GPUOS_TIMEOUT_S of the soak and drift children (default 20)")
    p.add_argument("--out", default=DEFAULT_OUT, help="result file (default benchmarks/results/reliability.json)")
    a = p.parse_args(argv)
    parts = a.only.split(",") if a.only else ["stress", "soak", "drift"] + (["sanitizer"] if a.sanitizer_log else [])
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error(f"unknown part(s) {bad}; choose from {PARTS}")
    if "sanitizer" in parts and not a.sanitizer_log:
        p.error("--only sanitizer needs --sanitizer-log")

    gpu_parts = [x for x in parts if x != "sanitizer"]
    if gpu_parts:
        import torch
        if not torch.cuda.is_available():
            print(f"reliability_run: no CUDA GPU (torch {torch.__version__}); nothing to run for {gpu_parts}. "
                  "Run this on a GPU machine.")
            if "sanitizer" not in parts:
                return 0
            parts = ["sanitizer"]
    head = H.env_metadata(WORKLOAD)
    try:
        import gpuos_ext
        head["gpuos_version"] = gpuos_ext.__version__
    except Exception:  # noqa: BLE001 -- the header still names the commit
        head["gpuos_version"] = "unknown"
    params = {"stress_s": a.stress_s, "threads": a.threads, "soak_ops": a.soak_ops,
                      "drift_flushes": a.drift_flushes, "seed": a.seed, "gpuos_timeout_s": a.timeout_s,
                      "gpuos_timeout_s_soak": a.timeout_s_soak, "parts": parts}
    rows, ok = [], True
    runners = {"stress": run_stress, "soak": run_soak, "drift": run_drift, "sanitizer": run_sanitizer}
    for part in parts:
        print(f"reliability_run: {part} ...", flush=True)
        r, good = runners[part](a)
        rows += r
        ok = ok and good
        for row in r:
            v = row.get("value", row.get("error"))
            print(f"  {row['config']:26s} {v!s:>14}  {row.get('unit', '')}"
                  f"{'' if row.get('correct', 'error' not in row) else '   <-- FAILED'}", flush=True)
    H.merge_results(WORKLOAD, head, rows, path=a.out, params=params)
    print(f"reliability_run: wrote {a.out} ({head['device']}, gpuos {head['gpuos']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
