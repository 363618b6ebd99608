#!/usr/bin/env python
"""PNG plots of the benchmark results (matplotlib), from the JSON files alone.

    python benchmarks/plots.py                       # benchmarks/results/*.json -> benchmarks/results/*.png
    python benchmarks/plots.py --results DIR [--out DIR] [--quick]

Per result file (first_call.json aside) it writes:

    <name>_speedup.png     speedup over eager (eager median / config median, log scale) against size, one
                           line per configuration (one bar per configuration when the file has one size);
                           W3's softmax rows are measured against eager_softmax
    <name>_breakdown.png   per size: host time (until the work returned), GPU-stream time (CUDA events) and
                           end-to-end median per configuration (log scale)

Runs anywhere the JSON is (no GPU, no torch); without matplotlib it says so and exits 0.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

BASELINES = ("eager", "eager_softmax")  # the eager config of a row's group (W3 has one per op)
MAX_PANELS = 6


def _import_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def speedups(rows: list) -> dict:
    """{config: [(size, speedup over the eager config of its (size, op) group)]} for correct timed rows."""
    base = {}
    for r in rows:
        if r["config"] in BASELINES:
            base[H.group_key(r)] = r["median_ms"]
    out: dict = {}
    for r in rows:
        b = base.get(H.group_key(r))
        if b and r["median_ms"] > 0 and r.get("correct") is not False:
            out.setdefault(r["config"], []).append((r["size"], b / r["median_ms"]))
    return out


def plot_speedup(plt, doc: dict, rows: list, path: Path) -> bool:
    series = speedups(rows)
    if not series:
        return False
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    if len(sizes) == 1:
        names = list(series)
        ax.bar(range(len(names)), [series[n][0][1] for n in names], color="tab:blue")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    else:
        for config, pts in series.items():
            xs = [sizes.index(s) for s, _ in pts]
            ax.plot(xs, [v for _, v in pts], marker="o", label=config,
                    linestyle="-" if H.is_gpuos_config(config) else "--")
        ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set_xlabel("size")
        ax.legend(fontsize=8, ncol=2)
    ax.set_yscale("log")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("speedup over eager (x, log)")
    ax.set_title(f"{doc['benchmark']}: {doc.get('device')} (torch {doc.get('torch')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_breakdown(plt, doc: dict, rows: list, path: Path) -> bool:
    sizes = list(dict.fromkeys(r["size"] for r in rows))[:MAX_PANELS]
    if not sizes:
        return False
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 4.6), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        sel = [r for r in rows if r["size"] == size]
        xs = range(len(sel))
        w = 0.27
        nan = float("nan")  # a missing figure draws no bar (log scale)
        ax.bar([x - w for x in xs], [r.get("host_median_ms") or nan for r in sel], w, label="host (until return)")
        ax.bar(list(xs), [r.get("median_gpu_ms") or nan for r in sel], w, label="GPU stream (CUDA events)")
        ax.bar([x + w for x in xs], [r["median_ms"] for r in sel], w, label="end to end")
        ax.set_xticks(list(xs), [r["config"] + (f" ({r['op']})" if r.get("op") else "") for r in sel],
                      rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"size {size}", fontsize=9)
    axes[0][0].set_ylabel("ms per repetition (log)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{doc['benchmark']}: host vs GPU time ({doc.get('device')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def make_plots(results: Path, out: Optional[Path] = None, quick: bool = False) -> list:
    """Write the PNGs for every result file in ``results``; returns their paths ([] without matplotlib)."""
    plt = _import_pyplot()
    if plt is None:
        print("plots: matplotlib is not installed, so no PNG was written; `pip install matplotlib`, then run "
              "`python benchmarks/plots.py` (here or on any machine with the JSON files)")
        return []
    out = Path(out or results)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path, doc in H.load_result_docs(results, quick):
        if doc.get("benchmark") == "first_call":
            continue
        rows = H.timed_rows(doc)
        stem = path.stem
        for kind, fn in (("speedup", plot_speedup), ("breakdown", plot_breakdown)):
            target = out / f"{stem}_{kind}.png"
            try:
                if fn(plt, doc, rows, target):
                    written.append(target)
            except Exception as exc:  # one bad file must not stop the others
                print(f"plots: {target.name}: {H.format_exc(exc, 200)}")
    print(f"plots: wrote {len(written)} PNG files to {out}")
    return written


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(H.RESULTS_DIR), help="folder of result JSON files")
    p.add_argument("--out", default=None, help="where the PNGs go (default: the results folder)")
    p.add_argument("--quick", action="store_true", help="plot the *_quick.json files")
    args = p.parse_args(argv)
    make_plots(Path(args.results), Path(args.out) if args.out else None, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
