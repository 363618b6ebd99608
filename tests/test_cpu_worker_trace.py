"""tools/worker_trace.py's level handoff summary (level_gaps) on synthetic claim records; no GPU."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wt():
    spec = importlib.util.spec_from_file_location("worker_trace", os.path.join(ROOT, "tools", "worker_trace.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rec(block, seq, t0, load, exe, idx=0, k=1):
    return (block, seq, idx, k, t0, load, exe)


def test_level_gaps_pairs_consecutive_levels(wt):
    recs = [
        rec(-1, 1, 0, 0, 0), rec(-1, 2, 0, 0, 0), rec(-1, 3, 0, 0, 0),  # slot fills: ignored
        rec(0, 1, 1000, 500, 2000),        # level 1 ends at 3500 (block 0) ...
        rec(1, 1, 1200, 300, 2500),        # ... and at 4000 (block 1): the level ends at 4000
        rec(1, 2, 3000, 1500, 1000),       # level 2 claimed at 3000, executes from 4500, ends 5500
        rec(0, 2, 3600, 1200, 500),        # executes from 4800
        rec(0, 3, 5000, 1300, 100),        # level 3 executes from 6300
    ]
    gaps, leads = wt.level_gaps(recs)
    assert gaps == [0.5, 0.8]                # 4500 - 4000, 6300 - 5500 (ns -> us)
    assert leads == [1.0, 0.5]               # 4000 - 3000, 5500 - 5000


def test_level_gaps_skips_untraced_neighbours(wt):
    recs = [rec(0, 5, 0, 10, 10), rec(0, 7, 100, 10, 10)]  # batch 6 not traced: no pair
    assert wt.level_gaps(recs) == ([], [])
    assert wt.level_gaps([]) == ([], [])
