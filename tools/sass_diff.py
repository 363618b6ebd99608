"""What a kernel executed per call, by SASS instruction, and what it executed beyond another profile of the same binary.

    WB_ONLY=12 ncu --set full --import-source yes -k bench -o /tmp/wb12 /tmp/warp_bench   # GPU machine
    ncu -i /tmp/wb12.ncu-rep --page source --csv --print-source sass > wb12.csv
    python tools/sass_diff.py wb12.csv [wb9.csv] [--calls 21] [--top 20]          # any machine

For a one-warp case of tools/warp_bench.cu (WB_REPS calls per launch, 21 by default) the instruction counts are
exact where ncu's stall samples are too few to place a microsecond: the twenty-seventh session found the matmul
dispatch's 1.2 us as 1,094 against 755 warp instructions per call (kinds 12 / 9), ~400 of them in matmul_op's
divisions and its MmArgs stores. Prints per call: instructions executed, local (LDL / STL), shared (LDS / STS) and
global memory instructions, branches, the stall reasons sampled. With a second profile: the instructions the first
executed at least `calls` times that the second did not (offsets from each listing's first address: the same binary
loads at different addresses), grouped into regions with their count per call and first instructions.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass, field

EXEC = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass
class Instr:
    offset: int
    source: str
    executed: float
    samples: float
    stalls: dict = field(default_factory=dict)


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def load(path: str) -> list[Instr]:
    """The first kernel's SASS listing of an `ncu --page source --csv --print-source sass` export."""
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = None
        for row in rows:
            if row and row[0] == "Address":
                header = row
                break
        if header is None:
            raise ValueError(f"{path}: no 'Address' header line (an ncu --page source --csv export?)")
        if EXEC not in header:
            raise ValueError(f"{path}: no '{EXEC}' column (profile with --set full or the SourceCounters section)")
        stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        out, base = [], None
        for row in rows:
            if len(row) < len(header):
                continue
            d = dict(zip(header, row))
            try:
                addr = int(d["Address"], 16)
            except ValueError:
                break  # the next kernel's section
            base = addr if base is None else base
            out.append(Instr(addr - base, d["Source"].strip(), number(d[EXEC]), number(d.get(SAMPLES, "0")),
                             {s: number(d[s]) for s in stall_cols if number(d[s])}))
    return out


def opcode(source: str) -> str:
    """The opcode of a SASS line, predicate and modifiers dropped: '@!P0 LDL.64 R2, [R1]' -> 'LDL'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


CLASSES = {"local": ("LDL", "STL"), "shared": ("LDS", "STS"), "global": ("LDG", "STG", "LD", "ST", "RED", "ATOM"),
           "branch": ("BRA", "BRX", "CALL", "RET", "BSSY", "BSYNC")}


def summary(instrs: list[Instr], calls: int) -> dict:
    """Per call: instructions, and those of each class; the stall samples by reason (whole profile)."""
    per = {"instructions": sum(i.executed for i in instrs) / calls}
    for name, ops in CLASSES.items():
        per[name] = sum(i.executed for i in instrs if opcode(i.source) in ops) / calls
    stalls = Counter()
    for i in instrs:
        stalls.update(i.stalls)
    return {"per_call": per, "samples": sum(i.samples for i in instrs), "stalls": dict(stalls.most_common(6))}


def extra(a: list[Instr], b: list[Instr], calls: int, gap: int = 0x40) -> list[dict]:
    """Regions of instructions `a` executed at least `calls` times and `b` fewer: each region's offsets, its
    instructions per call and its first instructions."""
    b_exec = {i.offset: i.executed for i in b}
    hot = [i for i in a if i.executed >= calls and b_exec.get(i.offset, 0.0) < calls]
    regions: list[list[Instr]] = []
    for i in hot:
        if regions and i.offset - regions[-1][-1].offset <= gap:
            regions[-1].append(i)
        else:
            regions.append([i])
    return [{"first": r[0].offset, "last": r[-1].offset, "per_call": sum(i.executed for i in r) / calls,
             "head": [i.source for i in r[:4]]} for r in regions]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("base", nargs="?", help="a second profile of the same binary: what `profile` ran beyond it")
    ap.add_argument("--calls", type=int, default=21, help="calls per launch (warp_bench's WB_REPS; default 21)")
    ap.add_argument("--top", type=int, default=20, help="regions (or, alone, hottest instructions) to list")
    args = ap.parse_args(argv)
    a = load(args.profile)
    sa = summary(a, args.calls)
    print(f"{args.profile}: " + ", ".join(f"{k} {v:.0f}" for k, v in sa["per_call"].items())
          + f" per call; {sa['samples']:.0f} stall samples {sa['stalls']}")
    if not args.base:
        for i in sorted(a, key=lambda i: -i.samples)[:args.top]:
            print(f"  +0x{i.offset:x} samples {i.samples:.0f} executed {i.executed:.0f}  {i.source}")
        return 0
    b = load(args.base)
    sb = summary(b, args.calls)
    print(f"{args.base}: " + ", ".join(f"{k} {v:.0f}" for k, v in sb["per_call"].items())
          + f" per call; {sb['samples']:.0f} stall samples {sb['stalls']}")
    regions = extra(a, b, args.calls)
    print(f"executed by {args.profile} alone: {sum(r['per_call'] for r in regions):.0f} instructions per call in "
          f"{len(regions)} regions (largest first)")
    for r in sorted(regions, key=lambda r: -r["per_call"])[:args.top]:
        print(f"  +0x{r['first']:x}..0x{r['last']:x} {r['per_call']:5.0f}  " + " ; ".join(r["head"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
