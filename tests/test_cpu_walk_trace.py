"""tools/walk_trace.py's per-level summary (walk_summary) on synthetic trace records; no GPU."""
import pytest
from _helpers import load_tool


@pytest.fixture(scope="module")
def wt():
    return load_tool("walk_trace")


def rec(block, seq, t0, load=0, exe=0):
    return (block, seq, 0, 1, t0, load, exe)


def test_fill_claim_start_against_the_level_before(wt):
    recs = [
        rec(-1, 10, 0), rec(-1, 11, 100), rec(-1, 12, 9000),  # fills; level 12 filled 1 us after 11 ended
        rec(3, 10, 500, 500, 2000),      # level 10: executing at 1000, done at 3000
        rec(4, 11, 600, 3400, 1000),     # level 11: claimed 2.4 us ahead, started 1 us after 10 ended, done 5000
        rec(5, 11, 700, 3300, 1500),     # a second claim of 11: done at 5500
        rec(6, 12, 9500, 1000, 1000),    # level 12: claimed after its fill, 4 us after 11 ended
        rec(-2, 12, 9000, 10, 10),       # a sub-op record: ignored
    ]
    rows = wt.walk_summary(recs)
    assert [r["seq"] for r in rows] == [11, 12]  # level 10 has no traced level before it
    r11, r12 = rows
    assert r11["filled"] == pytest.approx(-2.9) and r11["claimed"] == pytest.approx(-2.4)
    assert r11["started"] == pytest.approx(1.0) and r11["exec"] == pytest.approx(1.5) and r11["blocks"] == 2
    assert r12["filled"] == pytest.approx(3.5) and r12["claimed"] == pytest.approx(4.0)
    assert r12["started"] == pytest.approx(5.0) and r12["exec"] == pytest.approx(1.0) and r12["blocks"] == 1


def test_levels_without_a_traced_predecessor_or_fill(wt):
    rows = wt.walk_summary([rec(0, 5, 0, 10, 10), rec(1, 7, 100, 10, 10), rec(2, 8, 200, 10, 10)])
    assert [r["seq"] for r in rows] == [8]
    assert rows[0]["filled"] is None
    lines = wt.describe(rows)
    assert [ln.split()[0] for ln in lines] == ["claimed", "started", "exec", "blocks"]  # no fill figures
