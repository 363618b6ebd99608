"""Result files: writing (atomic; merged by config for shared files), the file of a standalone run, and
reading them back for report.py, plots.py and the suite's summary.

Imports: env, rows.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from .env import RESULTS_DIR, env_metadata
from .rows import is_gpuos_config


def json_default(o: Any):
    """JSON of what json cannot write: one-element tensors as numbers, anything else as its str()."""
    try:
        import torch
        if isinstance(o, torch.Tensor) and o.numel() == 1:
            return o.item()
    except Exception:
        pass
    if isinstance(o, Path):
        return str(o)
    return str(o)


def sanitize(o: Any) -> Any:
    """Recursively replace non-finite floats by None so the JSON stays strict (no NaN/Infinity)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): sanitize(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [sanitize(v) for v in o]
    return o


def write_results(name: str, meta: dict, rows: list, path: Optional[Path] = None, **extra: Any) -> Path:
    """Write ``{**meta, "rows": rows, **extra}`` to benchmarks/results/<name>.json (atomic rename).

    Shape (BENCH_SCHEMA.md): benchmark, device, driver, torch, gpuos, date, rows[]. Timing rows have
    workload/size/config/median_ms/min_ms/max_ms/reps/correct; value rows config/value/unit; rows that
    could not run have "error" and no times.
    """
    path = Path(path) if path else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = dict(meta)
    doc["rows"] = rows
    doc.update(extra)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(sanitize(doc), fh, indent=2, default=json_default, allow_nan=False)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def result_path(name: str, quick: bool = False, out: Optional[str] = None) -> Path:
    """A standalone run's result file: ``--out`` when given, else benchmarks/results/<name>[_quick].json."""
    return Path(out) if out else RESULTS_DIR / (f"{name}_quick.json" if quick else f"{name}.json")


def save_results(name: str, meta: dict, rows: list, path: Path, params: dict, partial: bool,
                 goals: Optional[list] = None) -> Path:
    """A standalone run's file, written after every configuration: params, then goals (when given), then
    ``"partial": true`` until the run is done."""
    extra: dict = {"params": params}
    if goals is not None:
        extra["goals"] = goals
    if partial:
        extra["partial"] = True
    return write_results(name, meta, rows, path=path, **extra)


def merge_results(name: str, meta: dict, rows: list, path: Optional[Path] = None, **extra: Any) -> Path:
    """Write ``rows`` into benchmarks/results/<name>.json (or ``path``), replacing rows of the same config and
    keeping the others (several scripts share one file, e.g. injection.json); ``extra``: top-level fields. Each
    new row gets ``measured_at`` (commit, device, date of ``meta``): the file's header names the last run only."""
    path = Path(path) if path else RESULTS_DIR / f"{name}.json"
    old = []
    if path.exists():
        try:
            old = json.loads(path.read_text()).get("rows", [])
        except (OSError, ValueError):
            old = []
    mine = {r["config"] for r in rows}
    stamp = {k: meta.get(k) for k in ("gpuos", "device", "date")}
    for r in rows:  # rows kept from earlier runs keep saying where and when they were measured
        r.setdefault("measured_at", stamp)
    return write_results(name, meta, [r for r in old if r.get("config") not in mine] + rows, path=path, **extra)


def merge_and_print_values(name: str, rows: list) -> Path:
    """merge_results for a script's value rows (env metadata of this run), then one line per row: figure,
    value, unit, goal. Returns the file written."""
    path = merge_results(name, env_metadata(name), rows)
    w = max([len("figure")] + [len(r["config"]) for r in rows])
    print(f"{'figure':{w}s} {'value':>10s}  unit")
    for r in rows:
        print(f"{r['config']:{w}s} {r['value']:10.4g}  {r['unit']}  {r.get('goal', '')}")
    return path


# --------------------------------------------------------------------------------------------------
# reading result files (report.py, plots.py, run_all's summary)
# --------------------------------------------------------------------------------------------------
def load_result_docs(results_dir: Path = RESULTS_DIR, quick: bool = False) -> list:
    """[(path, doc)] of the result JSON files in ``results_dir`` (sorted by name): the ``*_quick.json`` ones
    when ``quick``, the others otherwise. Unreadable files are reported on stderr and left out."""
    docs = []
    for path in sorted(Path(results_dir).glob("*.json")):
        if path.name.endswith("_quick.json") != quick:
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
            docs.append((path, doc))
    return docs


def timed_rows(doc: dict) -> list:
    """The rows of a result file that carry a median time (and no error)."""
    return [r for r in doc.get("rows", []) if isinstance(r.get("median_ms"), (int, float)) and "error" not in r]


def group_key(row: dict) -> tuple:
    """Rows comparable with each other: same workload, size and op (W3 measures sum and softmax)."""
    return (row.get("workload"), row.get("size"), row.get("op"))


def gpuos_vs_best_peer(rows: Iterable[dict]) -> list:
    """Per (workload, size, op): the fastest correct GPUOS config against the fastest correct peer.

    Returns dicts with workload, size, op, gpuos (config), gpuos_ms, peer (config), peer_ms and
    ratio = peer_ms / gpuos_ms (> 1: GPUOS is faster). Groups without both sides are left out."""
    groups: dict = {}
    for r in rows:
        if "error" in r or not isinstance(r.get("median_ms"), (int, float)) or r.get("correct") is not True:
            continue
        side = "gpuos" if is_gpuos_config(r["config"]) else "peer"
        best = groups.setdefault(group_key(r), {})
        if side not in best or r["median_ms"] < best[side]["median_ms"]:
            best[side] = r
    out = []
    for (workload, size, op), best in groups.items():
        if "gpuos" in best and "peer" in best and best["gpuos"]["median_ms"] > 0:
            g, p = best["gpuos"], best["peer"]
            out.append({"workload": workload, "size": size, "op": op, "gpuos": g["config"], "gpuos_ms": g["median_ms"],
                        "peer": p["config"], "peer_ms": p["median_ms"], "ratio": p["median_ms"] / g["median_ms"]})
    return out
