"""Regenerate README.md's results section from benchmarks/results/*.json.

    python benchmarks/report.py          # rewrites the block between the results markers in README.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _timing_table(doc: dict) -> list[str]:
    rows = [r for r in doc["rows"] if "median_ms" in r]
    configs = list(dict.fromkeys(r["config"] for r in rows))
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
                cells.append(f"{r['median_ms']:.2f}{mark}")
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return out


def _values(doc: dict) -> list[str]:
    vals = [r for r in doc["rows"] if "value" in r]
    seen, out = set(), []
    for r in vals:
        key = (r["config"], r.get("size"), r.get("for_config"))
        if key in seen:
            continue
        seen.add(key)
        size = f" (size {r['size']})" if r.get("size") else ""
        who = f" [{r['for_config']}]" if r.get("for_config") else ""
        out.append(f"- `{r['config']}`{who}{size}: **{r['value']:.3g} {r['unit']}**")
    return out


def render() -> str:
    parts = []
    for path in sorted(RESULTS.glob("*.json")):
        if path.name.endswith("_quick.json"):
            continue
        doc = json.loads(path.read_text())
        parts.append(f"### `{doc['benchmark']}` — {doc['device']}, driver {doc['driver']}, torch {doc['torch']}, "
                     f"gpuos {doc['gpuos']}, {doc['date']}")
        parts.append("")
        parts.append("Median ms per repetition (lower is better):")
        parts.append("")
        parts += _timing_table(doc)
        parts.append("")
        parts += _values(doc)
        parts.append("")
    return "\n".join(parts)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print("README.md lacks the results markers", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + BEGIN + "\n" + render() + END + tail)
    print("README.md results section regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
