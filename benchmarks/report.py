#!/usr/bin/env python
"""Regenerate the results: benchmarks/RESULTS.md (every table) and README.md's short results section.

    python benchmarks/report.py                         # writes RESULTS.md, rewrites the README's marked block
    python benchmarks/report.py --stdout                # prints the full tables instead
    python benchmarks/report.py --readme /tmp/README.md --results /tmp/results --out /tmp/RESULTS.md [--quick]

RESULTS.md names the GPU, driver, torch and gpuos version of the runs, then per result file: a table of
median ms per size and configuration (WRONG marks a failed correctness check), the peers that do not apply
and why, the configurations that failed, the line "GPUOS vs best peer" (per size: the fastest correct GPUOS
configuration against the fastest correct peer, wins and losses) and the file's value rows; first_call.json
becomes a table of first-call costs. The README's block (between the results markers; nothing else changes)
has the environments and one line per result file: GPUOS against the best peer, with a link to RESULTS.md.
Needs no torch.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Iterable, Optional

if __package__ in (None, ""):  # run as a script: make the repo root importable
    import _rootpath  # noqa: F401
from benchmarks import harness as H

ROOT = H.REPO_ROOT
RESULTS = H.RESULTS_DIR
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
COLUMN_ORDER = ("eager", "eager_out", "foreach", "cudagraph", "compile", "compile_reduce_overhead", "eager_softmax")


def _order(doc: dict) -> tuple:
    """W1..W7 first (by workload), then first_call, then any other result file (by name)."""
    wl = _workload(doc)
    if wl.startswith("W") and doc.get("benchmark") != "first_call":
        return (0, wl, doc.get("benchmark", ""))
    return (1 if doc.get("benchmark") == "first_call" else 2, "", doc.get("benchmark", ""))


def load_docs(results_dir: Path = RESULTS, quick: bool = False) -> list:
    """The result documents of ``results_dir`` in report order, each with its file name under ``_file``."""
    return sorted((dict(doc, _file=path.name) for path, doc in H.load_result_docs(results_dir, quick)), key=_order)


def _is_suite_file(doc: dict) -> bool:
    """Whether a document belongs in the README's block: every result file but the records of one commit's A/B
    runs, which carry that commit in their name (``models_program_<commit>[_variant].json``: one row pair each,
    kept as evidence). RESULTS.md shows every file; those under their file name."""
    name, sha = doc.get("_file"), str(doc.get("gpuos") or "")
    return name is None or len(sha) < 7 or sha not in name


def _column_key(config: str) -> tuple:
    if config in COLUMN_ORDER:
        return (0, COLUMN_ORDER.index(config))
    return (2 if H.is_gpuos_config(config) else 1, 0)


def _fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _workload(doc: dict) -> str:
    ids = list(dict.fromkeys(r.get("workload") for r in doc["rows"] if r.get("workload")))
    return "/".join(str(i) for i in ids)


def _title(doc: dict) -> str:
    return (doc.get("suite") or {}).get("title") or ""


def _timing_table(doc: dict) -> list:
    rows = [r for r in doc["rows"] if "size" in r and ("median_ms" in r or ("error" in r and "unit" not in r))]
    rows = [r for r in rows if r.get("config") not in ("compile_time_s",)]
    if not rows:
        return []
    configs = sorted(dict.fromkeys(r["config"] for r in rows), key=_column_key)
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    by = {(r["size"], r["config"]): r for r in rows}
    out = ["| size | " + " | ".join(configs) + " |", "|---:|" + "---:|" * len(configs)]
    for s in sizes:
        cells = []
        for c in configs:
            r = by.get((s, c))
            if r is None:
                cells.append("–")
            elif "error" in r:
                cells.append("error")
            else:
                mark = "" if r.get("correct", True) else " (WRONG)"
                cells.append(_fmt_ms(r["median_ms"]) + mark)
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return out


def _problems(doc: dict) -> list:
    out = []
    na = [r for r in doc["rows"] if r.get("not_applicable")]
    if na:
        out.append("Not applicable: " + "; ".join(f"`{r['config']}` ({r['error'].replace('not applicable: ', '')})"
                                                 for r in na) + ".")
    errs: dict = {}  # message -> {config: [sizes]}
    for r in doc["rows"]:
        if "error" in r and not r.get("not_applicable"):
            errs.setdefault(r["error"][:160], {}).setdefault(r["config"], []).append(r.get("size"))
    for why, by_config in errs.items():
        who = []
        for cfg, sizes in by_config.items():
            known = [str(x) for x in sizes if x is not None]
            who.append(f"`{cfg}`" + (f" at {', '.join(known)}" if known else ""))
        out.append(f"Could not run: {'; '.join(who)}: {why}.")
    older: dict = {}  # rows kept from an earlier run of another commit (H.merge_results / a partial re-run)
    for r in doc["rows"]:
        if r.get("gpuos") and r["gpuos"] != doc.get("gpuos") and not r.get("not_applicable"):
            older.setdefault(r["gpuos"], set()).add(r["config"])
    for sha, cfgs in sorted(older.items()):
        out.append(f"From an earlier run (gpuos {sha}): " + ", ".join(f"`{c}`" for c in sorted(cfgs)) + ".")
    wrong = [r for r in H.timed_rows(doc) if r.get("correct") is False]
    if wrong:
        out.append("Failed the correctness check: " + ", ".join(f"`{r['config']}` at {r.get('size')}"
                                                               for r in wrong) + ".")
    return out


def ratio_line(doc: dict) -> Optional[str]:
    """'GPUOS vs best peer' for one result file: per size, wins and losses, geometric mean."""
    res = H.gpuos_vs_best_peer(doc["rows"])
    if not res:
        return None
    parts = []
    for r in res:
        where = f"{r['size']}" + (f" {r['op']}" if r.get("op") else "")
        verdict = "win" if r["ratio"] > 1 else "loss"
        parts.append(f"{where}: {H.fmt_ratio(r['ratio'])} (`{r['gpuos']}` {_fmt_ms(r['gpuos_ms'])} ms vs "
                     f"`{r['peer']}` {_fmt_ms(r['peer_ms'])} ms, {verdict})")
    wins = sum(r["ratio"] > 1 for r in res)
    geo = math.exp(sum(math.log(r["ratio"]) for r in res) / len(res))
    return ("**GPUOS vs best peer** (peer ms / GPUOS ms, > 1 = GPUOS faster): " + "; ".join(parts) +
            f" — {wins} win{'s' if wins != 1 else ''}, {len(res) - wins} loss{'es' if len(res) - wins != 1 else ''}, "
            f"geometric mean {H.fmt_ratio(geo)}")


def _values(doc: dict) -> list:
    seen, out = set(), []
    for r in doc["rows"]:
        if "value" not in r or not isinstance(r["value"], (int, float)):
            continue
        key = (r["config"], r.get("size"), r.get("for_config"))
        if key in seen:
            continue
        seen.add(key)
        size = f" (size {r['size']})" if r.get("size") is not None else ""
        who = f" [{r['for_config']}]" if r.get("for_config") else ""
        at = r.get("measured_at") or {}
        when = (f" (measured at {at.get('gpuos')}{', ' + at['device'] if at.get('device') != doc.get('device') else ''})"
                if at.get("gpuos") and at.get("gpuos") != doc.get("gpuos") else "")
        out.append(f"- `{r['config']}`{who}{size}: **{r['value']:.3g} {r['unit']}**{when}")
    return out


def _first_call(doc: dict) -> list:
    rows = [r for r in doc["rows"] if "value" in r]
    by_wl: dict = {}
    for r in rows:
        if r.get("workload") == "gpuos":
            continue
        col = r["for_config"] if r["config"] == "compile_time_s" else r["config"]
        by_wl.setdefault(r["workload"], {}).setdefault(col, r)
    out = ["| workload | compile (s) | compile reduce-overhead (s) | CUDA-graph capture (ms) |", "|---|---:|---:|---:|"]
    for wl, cols in by_wl.items():
        cells = []
        for col in ("compile", "compile_reduce_overhead", "cudagraph_capture_ms"):
            r = cols.get(col)
            warm = " warm caches" if "warm" in str(r and r.get("inductor_cache")) else ""
            cells.append("–" if r is None else f"{r['value']:.3g}" + (f" (size {r['size']}{warm})" if r.get("size")
                                                                       else ""))
        out.append(f"| {wl} | " + " | ".join(cells) + " |")
    out.append("")
    for r in doc["rows"]:
        if r.get("workload") != "gpuos":
            continue
        if "error" in r:
            out.append(f"- `{r['config']}`: error: {r['error'][:200]}")
            continue
        extra = "" if r.get("jit_compiles") is None else f", {r['jit_compiles']} NVRTC compiles"
        ok = "" if r.get("correct", True) else " (UNEXPECTED compile count)"
        proc = f", whole process {r['process_s']:.2f} s" if r.get("process_s") is not None else ""
        out.append(f"- `{r['config']}`: **{r['value']:.3g} s**{proc}{extra}{ok}")
    return out


def _environments(docs: Iterable[dict]) -> list:
    envs = list(dict.fromkeys((d.get("device"), d.get("driver"), d.get("torch"), d.get("gpuos")) for d in docs))
    return [f"**{dev}**, driver **{drv}**, torch **{tv}**, gpuos {sha}" for dev, drv, tv, sha in envs]


def render(docs: list) -> str:
    """The README block (without the markers) for these result documents."""
    if not docs:
        return "No results yet: run `python -m benchmarks` on a GPU, then `python benchmarks/report.py`.\n"
    dates = sorted(d.get("date", "") for d in docs)
    parts = ["Measured on " + "; ".join(_environments(docs)) + f" ({dates[0]} – {dates[-1]}). Generated by "
             "`python benchmarks/report.py` from `benchmarks/results/*.json` (written by `python -m benchmarks`).",
             ""]
    for doc in docs:
        what = "First-call costs" if doc["benchmark"] == "first_call" else f"{_workload(doc)} `{doc['benchmark']}`"
        head = (f"### {what}" + (f" — {_title(doc)}" if _title(doc) else "") +
                f" — {doc.get('device')}, driver {doc.get('driver')}, torch {doc.get('torch')}, "
                f"gpuos {doc.get('gpuos')}, {doc.get('date')}" +
                ("" if _is_suite_file(doc) else f" — file `{doc['_file']}`"))
        parts += [head, ""]
        if doc["benchmark"] == "first_call":
            parts += _first_call(doc) + [""]
            continue
        table = _timing_table(doc)
        if table:
            parts += ["Median ms per repetition (lower is better; every configuration checked against eager first):",
                      ""] + table + [""]
        line = ratio_line(doc)
        parts += ([line, ""] if line else []) + [p + "\n" for p in _problems(doc)]
        values = _values(doc)
        if values:
            parts += values + [""]
    return "\n".join(parts)


def summary_lines(docs: list) -> list:
    """One line per result file: GPUOS's ratio against the best peer (for the suite's closing summary)."""
    out = []
    for doc in docs:
        if doc.get("benchmark") == "first_call":
            continue
        res = H.gpuos_vs_best_peer(doc["rows"])
        name = f"{_workload(doc)} {doc.get('benchmark')}"
        if not res:
            out.append(f"{name}: no GPUOS-vs-peer pair with correct results")
            continue
        cells = ", ".join(f"{r['size']}{' ' + r['op'] if r.get('op') else ''}: {H.fmt_ratio(r['ratio'])} vs {r['peer']}"
                          for r in res)
        wins = sum(r["ratio"] > 1 for r in res)
        gpu = str(doc.get("device") or "?").replace("NVIDIA ", "").replace(" 80GB HBM3", "")
        out.append(f"{name} [{gpu}, {doc.get('gpuos') or '?'}]: GPUOS vs best peer {cells} ({wins} wins, "
                   f"{len(res) - wins} losses)")
    return out


def readme_block(docs: list, results_md: str = "benchmarks/RESULTS.md") -> str:
    """The README's short block: where the figures come from, one line per result file, the link to the tables."""
    if not docs:
        return "No results yet: run `python -m benchmarks` on a GPU, then `python benchmarks/report.py`.\n"
    records = [d for d in docs if not _is_suite_file(d)]
    docs = [d for d in docs if _is_suite_file(d)]
    lines = ["Measured on " + "; ".join(_environments(docs)) + ". Per result file, the fastest correct GPUOS "
             "configuration against the fastest correct peer (above 1.00x: GPUOS faster):", ""]
    lines += [f"- {line}" for line in summary_lines(docs) if "no GPUOS-vs-peer pair" not in line]
    values = [f"{_workload(d)} `{d.get('benchmark')}`" for d in docs
              if d.get("benchmark") != "first_call" and not H.gpuos_vs_best_peer(d["rows"])]
    if values:
        lines.append("- figures without a peer (costs, counts, reliability): " + ", ".join(values))
    if records:
        lines.append(f"- {len(records)} more result files, each the record of one commit's A/B run ("
                     + ", ".join(f"`{d['_file']}`" for d in records) + f"): their tables are in [{results_md}]"
                     f"({results_md})")
    lines += ["", f"Every table (median ms per size and configuration, value rows, first-call costs, the commit of "
              f"each file): [{results_md}]({results_md}), generated by `python benchmarks/report.py`."]
    return "\n".join(lines) + "\n"


def rewrite(readme: Path, block: str) -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme} lacks the results markers {BEGIN} / {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + BEGIN + "\n" + block.rstrip("\n") + "\n" + END + tail)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="README to rewrite (default: the repo's)")
    p.add_argument("--results", default=str(RESULTS), help="folder of result JSON files")
    p.add_argument("--quick", action="store_true", help="use the *_quick.json files")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"), help="the full tables' file")
    p.add_argument("--stdout", action="store_true", help="print the tables instead of writing any file")
    args = p.parse_args(argv)
    docs = load_docs(Path(args.results), args.quick)
    block = render(docs)
    if args.stdout:
        print(block)
    else:
        try:
            rewrite(Path(args.readme), readme_block(docs))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 1
        Path(args.out).write_text("# Measured results\n\n" + block.rstrip("\n") + "\n")
        print(f"{args.out}: tables from {len(docs)} result files; {args.readme}: results section regenerated")
    for line in summary_lines(docs):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
