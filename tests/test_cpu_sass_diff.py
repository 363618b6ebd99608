"""tools/sass_diff.py on synthetic `ncu --page source --csv --print-source sass` exports; no GPU."""
import csv

import pytest
from _helpers import load_tool

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "# Samples", "Instructions Executed", "stall_wait", "stall_no_inst", "stall_wait (Not Issued)"]


@pytest.fixture(scope="module")
def sd():
    return load_tool("sass_diff")


def export(path, base, listing):
    """listing: (offset, source, executed, samples, wait samples); written as ncu writes it (kernel line, header)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "bench(int)"])
        w.writerow(HEADER)
        for off, src, ex, smp, wait in listing:
            w.writerow([hex(base + off), src, smp, smp, smp, f"{ex:,}", wait, smp - wait, 0])


A = [(0x0, "S2R R5, SR_TID.X", 1, 0, 0),
     (0x10, "LDC R4, c[0x0][0x28]", 3, 1, 1),
     (0x20, "@!P0 LDL.64 R2, [R1+0x10]", 3, 2, 2),
     (0x30, "STL [R1+0x8], R2", 3, 0, 0),
     (0x200, "I2F.U32.RP R3, R2", 3, 4, 3),
     (0x210, "MUFU.RCP R3, R3", 3, 0, 0),
     (0x220, "BRA 0x1000", 6, 0, 0),
     (0x230, "LDS.64 R6, [R48+0x208]", 2, 0, 0)]


def test_summary_counts_per_call_by_class(sd, tmp_path):
    p = tmp_path / "a.csv"
    export(p, 0x7F0000001000, A)
    instrs = sd.load(str(p))
    assert [i.offset for i in instrs] == [o for o, *_ in A]  # offsets from the listing's first address
    s = sd.summary(instrs, calls=3)
    assert s["per_call"]["instructions"] == pytest.approx(24 / 3)
    assert s["per_call"]["local"] == pytest.approx(2.0)  # the predicated LDL counts as LDL
    assert s["per_call"]["shared"] == pytest.approx(2 / 3)
    assert s["per_call"]["branch"] == pytest.approx(2.0)
    assert s["samples"] == 7 and s["stalls"] == {"stall_wait": 6.0, "stall_no_inst": 1.0}


def test_extra_regions_against_another_load_address(sd, tmp_path):
    b = [(o, src, ex if o < 0x200 else 0, smp, wait) for o, src, ex, smp, wait in A]  # never ran the division
    pa, pb = tmp_path / "a.csv", tmp_path / "b.csv"
    export(pa, 0x7F0000001000, A)
    export(pb, 0x7E0000400000, b)
    regions = sd.extra(sd.load(str(pa)), sd.load(str(pb)), calls=3)
    # 0x200..0x220 ran >= 3 times in a alone; 0x230 ran twice (below one per call); the rest ran in both.
    assert len(regions) == 1
    r = regions[0]
    assert (r["first"], r["last"]) == (0x200, 0x220)
    assert r["per_call"] == pytest.approx(4.0)
    assert r["head"][0] == "I2F.U32.RP R3, R2"


def test_regions_split_at_gaps(sd, tmp_path):
    far = A + [(0x400, "IMAD R6, R4, R7, RZ", 3, 0, 0)]
    b = [(o, src, 0, 0, 0) for o, src, *_ in far]
    pa, pb = tmp_path / "a.csv", tmp_path / "b.csv"
    export(pa, 0x1000, far)
    export(pb, 0x1000, b)
    regions = sd.extra(sd.load(str(pa)), sd.load(str(pb)), calls=3)
    assert [(r["first"], r["last"]) for r in regions] == [(0x10, 0x30), (0x200, 0x220), (0x400, 0x400)]


def test_main_prints_both_profiles(sd, tmp_path, capsys):
    pa, pb = tmp_path / "a.csv", tmp_path / "b.csv"
    export(pa, 0x1000, A)
    export(pb, 0x2000, [(o, src, 0, 0, 0) for o, src, *_ in A])
    assert sd.main([str(pa), str(pb), "--calls", "3"]) == 0
    out = capsys.readouterr().out
    assert "executed by" in out and "+0x200..0x220" in out


def test_not_an_ncu_export(sd, tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="Address"):
        sd.load(str(p))
