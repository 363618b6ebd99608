"""Goals of the standalone benchmarks (a speedup or a value against its target; PASS / MISS) and their table.

Imports: rows, table.
"""
from __future__ import annotations

from typing import Optional

from .rows import incorrect, ratio, rnd, row_median
from .table import fmt_ratio, print_table


def speedup_goal(name: str, target_x: float, base: Optional[dict], row: Optional[dict], missing: str = "no data",
                 informational: bool = False) -> dict:
    """Goal ``row`` >= ``target_x`` times faster than ``base`` (median ratio); a row that failed its check never
    passes. ``missing``: the note when either side has no time. ``informational`` goals are reported, not
    counted."""
    r = ratio(row_median(base), row_median(row))
    g = {"goal": name, "target": f">= {target_x:g}x", "achieved": rnd(r) if r is not None else None,
         "pass": r is not None and r >= target_x and not incorrect(row),
         "note": missing if r is None else ("results incorrect" if incorrect(row) else "")}
    if informational:
        g["informational"] = True
    return g


def value_goal(name: str, target: str, row: Optional[dict], limit: float) -> dict:
    """Goal: the value row ``row`` at most ``limit`` (and correct); a missing or failed row is a miss saying why."""
    if row is None or "error" in row:
        return {"goal": name, "target": target, "achieved": None, "pass": False,
                "note": "no data" if row is None else row["error"][:80]}
    return {"goal": name, "target": target, "achieved": rnd(row["value"]),
            "pass": bool(row["value"] <= limit and not incorrect(row)),
            "note": "results incorrect" if incorrect(row) else ""}


def print_goals(goals: list, plain: bool = False, title: str = "Goals") -> None:
    """The goal table: goal, target, achieved (a ratio for "x" targets), PASS / MISS (no data is a miss; the
    note says why; informational goals are marked)."""
    gt = []
    for g in goals:
        res = "PASS" if g["pass"] else "MISS"
        if g.get("informational"):
            res += " (info)"
        ach = g["achieved"]
        if ach is None:
            ach_s = "-"
        elif "x" in g["target"]:
            ach_s = fmt_ratio(ach)
        else:
            ach_s = f"{ach:.2f}"
        gt.append([g["goal"], g["target"], ach_s, res + (f" ({g['note']})" if g["note"] else "")])
    print_table(["goal", "target", "achieved", "result"], gt, title=title, plain=plain, align="lrrl")
