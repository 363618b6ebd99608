"""tools/worker_trace.py's level handoff summary (level_gaps) on synthetic claim records; no GPU."""
import pytest
from _helpers import load_tool


@pytest.fixture(scope="module")
def wt():
    return load_tool("worker_trace")


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


def test_item_summary_reports_items_combines_and_sms(wt, capsys):
    # item records: (-2, sm, ring index, combined, t0, item ns, combine ns); claims and fills are not items
    recs = [rec(0, 1, 0, 100, 50000), rec(-1, 1, 0, 0, 0)]
    recs += [(-2, sm, i, 0, 1000 + 100 * i, 10000, 500) for i, sm in enumerate((3, 3, 3, 7))]
    recs += [(-2, 7, 9, 1, 1000, 20000, 30000)]  # the tile's last item: its combine took 30 us
    wt.item_summary(recs)
    out = capsys.readouterr().out
    assert "5 items: duration" in out and "p100 20.0" in out
    assert "1 combines / finishes (us): p10 30.0" in out
    assert "their items end at 20.0" in out            # t0 + 20 us, from the first item's start (the same t0)
    assert "2 SMs ran items" in out and "3: median 10.0 (1 SMs)" in out and "2: median 15.0 (1 SMs)" in out
    wt.item_summary([rec(0, 1, 0, 1, 1)])               # no item records: nothing printed, no error
    assert capsys.readouterr().out == ""


def test_item_lead_unpacks_the_traced_workers_dispatch_bits(wt):
    """device_src/worker.cu lead_bits: kind in the low byte; above it, 16-ns units to the item function, 128-ns units
    of the matmul prologue, 16-ns units of the item's arguments; the untraced worker's records are kinds alone."""
    assert wt.item_lead(1) == (1, None)
    kind, lead = wt.item_lead(1 | 10 << 8 | 80 << 16 | 150 << 24)
    assert kind == 1 and lead == pytest.approx((0.16, 10.24, 2.4))
    kind, lead = wt.item_lead(255 << 24)  # saturated
    assert kind == 0 and lead == pytest.approx((0.0, 0.0, 4.08))
    recs, leads = wt.split_items([rec(0, 1, 0, 1, 2), (-2, 3, 4, 1 | 2 << 8, 10, 20, 30), (-2, 3, 5, 2, 10, 20, 30)])
    assert [r[3] for r in recs] == [1, 1, 2] and list(leads) == [1] and leads[1] == pytest.approx((0.032, 0.0, 0.0))


def test_item_summary_reads_kinds_under_the_lead_bits(wt, capsys):
    recs = [(-2, 3, i, (i == 2) | (5 + i) << 8 | 1 << 24, 1000 + i, 10000, 500) for i in range(3)]
    wt.item_summary(recs)
    out = capsys.readouterr().out
    assert "3 items: duration" in out and "1 combines / finishes" in out  # the packed records still count
    assert "to the item function 0.10 / 0.11" in out and "arguments 0.02 / 0.02" in out and "(3 items)" in out


def test_item_summary_reports_the_rest_of_unsplit_items(wt, capsys):
    # an unsplit traced item's record is split (K loop / outputs): the second half is summarised apart from combines
    recs = [(-2, 1, i, 0, 1000, 3000, 1000 * (i + 1)) for i in range(4)] + [(-2, 2, 9, 1, 1000, 3000, 30000)]
    wt.item_summary(recs)
    out = capsys.readouterr().out
    assert "4 unsplit items, after the split point (us): p50 3.00" in out and "max 4.00" in out
    assert "1 combines / finishes (us): p10 30.0" in out  # the combined item is not among the unsplit ones


def test_mm_shapes_parses_the_env_list(wt):
    assert wt.mm_shapes("1x32000x256,16x4096x4096") == ((1, 32000, 256), (16, 4096, 4096))
    assert wt.mm_shapes("") == ()
    with pytest.raises(ValueError):
        wt.mm_shapes("1x2")


def test_claim_timeline_puts_claims_and_items_on_one_axis(wt, capsys):
    """The timeline line (worker_trace.py claim_timeline): claims' exec start, items' start and end (an uncombined
    item's outputs included, a combined item's combine not), claims' end, in us from the first claim's start."""
    claims = [rec(0, 1, 1000, 4000, 40000), rec(1, 1, 1200, 4000, 30000)]  # exec from 4.0 / 4.2, ends 44.0 / 34.2
    items = [(-2, 3, 0, 0, 25000, 10000, 500),     # starts 24.0, ends 34.5 (its outputs' 0.5 us included)
             (-2, 4, 1, 1, 26000, 12000, 2000)]    # starts 25.0, ends 37.0 (its 2-us combine is the claim's)
    line = wt.claim_timeline(claims, items)
    assert "claims' exec start p50 4.2 / max 4.2" in line
    assert "items start p50 25.0 / max 25.0, end p50 37.0 / max 37.0" in line
    assert "claims end p50 44.0 / max 44.0" in line
    wt.item_summary(claims + items)
    assert "timeline (us from the first claim)" in capsys.readouterr().out
    wt.item_summary(items)                          # items without claims: no timeline
    assert "timeline" not in capsys.readouterr().out


def test_level_timeline_puts_each_level_on_the_axis_of_the_one_before(wt, capsys):
    # batch 5 fills ring slots 100-101, batch 6 slots 4095 and 0 (the ring wraps at 4,096); ns throughout
    recs = [rec(-1, 5, 0, 0, 0, idx=100, k=2), rec(-1, 6, 0, 0, 0, idx=4095, k=2)]
    recs += [rec(0, 5, 0, 1000, 5000), rec(1, 5, 100, 900, 5400)]      # level 5 ends at 6,400
    recs += [rec(0, 6, 6100, 900, 4000)]                                # claimed before that end, runs 7,000-11,000
    recs += [(-2, 3, i, 0, 2000, 3000, 0) for i in (100, 101)]          # level 5's items: 2,000-5,000
    recs += [(-2, 4, i, 0, 7500, 2500, 0) for i in (4095, 0)]           # level 6's: 7,500-10,000
    recs += [(-2, 4, 7, 0, 1, 1, 0)]                                    # another batch's item: in neither level
    wt.level_timeline(recs, 4096)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2, out
    assert "level seq 5 (2 claims, 2 items), us from its first claim: first claim +0.0; exec start +1.0 / +1.0; " \
           "items start +2.0 / +2.0, end +5.0 / +5.0; claims end +6.4 / +6.4" in out[0], out[0]
    assert "level seq 6 (1 claims, 2 items), us from the level before ends: first claim -0.3; exec start +0.6 / " \
           "+0.6; items start +1.1 / +1.1, end +3.6 / +3.6; claims end +4.6 / +4.6" in out[1], out[1]


def test_launch_timeline_pairs_starts_and_exits(wt):
    # launch records: (-3, gen, idx, 0 start / 1 exit / 3 exit after running work, t0, standby flags, 0)
    recs = [(-3, 7, 10, 0, 1000, 0, 0), (-3, 7, 12, 3, 51000, 0, 0),      # gen 7 ran work for 50 us
            (-3, 8, 12, 0, 57000, 3, 0), (-3, 8, 12, 1, 63000, 3, 0),     # a standby: 6 us, found nothing
            (-3, 9, 12, 0, 69000, 3, 0), (-3, 9, 12, 1, 77000, 3, 0),     # another: 8 us
            (-3, 10, 12, 0, 80000, 3, 0),                                  # started, not exited yet: not counted
            rec(0, 11, 2000, 10, 10), rec(-1, 11, 0, 0, 0)]                # claims and fills: ignored
    t = wt.launch_timeline(recs)
    assert t["launches"] == 3 and t["ran_work"] == 1
    assert t["life_working_us"] == 50.0 and t["life_idle_us"] == 7.0
    assert t["gap_exit_to_next_start_us"] == 6.0  # 57 - 51, 69 - 63, 80 - 77 us: the median
    assert t["kicks"] == 0 and t["kick_life_us"] != t["kick_life_us"]  # nan
    empty = wt.launch_timeline([])
    assert empty["launches"] == 0 and empty["life_idle_us"] != empty["life_idle_us"]  # nan


def test_launch_timeline_keeps_kicks_apart(wt):
    # kicks (standby flag 'kick' of gpuos_ext.launch_flags()) interleave with the side stream's launches by gen: their
    # lives are reported apart, and the side stream's gaps go from one worker launch to the next one
    kick = wt.gpuos_ext.launch_flags()["kick"]
    kicks = wt.gpuos_ext.launch_flags()["kicks"]
    recs = [(-3, 1, 0, 0, 0, kicks, 0), (-3, 1, 5, 3, 100000, kicks, 0),                # the worker: 100 us, ran work
            (-3, 2, 0, 0, 10000, kick | kicks, 0), (-3, 2, 0, 1, 13000, kick | kicks, 0),  # a kick: 3 us, nothing
            (-3, 3, 0, 0, 20000, kick | kicks, 0), (-3, 3, 0, 1, 24000, kick | kicks, 0),  # 4 us
            (-3, 4, 0, 0, 30000, kick | kicks, 0), (-3, 4, 1, 3, 40000, kick | kicks, 0),  # took the token: 10 us
            (-3, 5, 5, 0, 104000, kicks, 0), (-3, 5, 5, 1, 124000, kicks, 0)]              # the next worker launch
    t = wt.launch_timeline(recs)
    assert t["launches"] == 2 and t["ran_work"] == 1 and t["life_working_us"] == 100.0 and t["life_idle_us"] == 20.0
    assert t["gap_exit_to_next_start_us"] == 4.0 and t["gap_p90_us"] == 4.0  # 104 - 100 us
    assert t["kicks"] == 3 and t["kicks_filled"] == 1 and t["kick_life_us"] == 4.0 and t["kick_life_p90_us"] == 10.0
