"""tools/reliability_run.py without a GPU: compute-sanitizer summaries are read from every tool's log format, and
result rows say where they were measured (rows kept from an earlier run keep their own commit)."""
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import reliability_run as R  # noqa: E402
from benchmarks import harness as H  # noqa: E402


def _log(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_sanitizer_summaries_of_each_tool(tmp_path):
    mem = _log(tmp_path, "memcheck.log", "========= COMPUTE-SANITIZER\nOK\n========= ERROR SUMMARY: 0 errors\n")
    race = _log(tmp_path, "racecheck.log", "========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warnings)\n")
    sync = _log(tmp_path, "synccheck.log", "========= ERROR SUMMARY: 1 error\n")
    total, logs, found = R.sanitizer_errors([mem, race, sync])
    assert (total, found) == (3, 3)
    assert [lg["summaries"] for lg in logs] == [[0], [2], [1]]


def test_sanitizer_log_without_summary_is_reported(tmp_path):
    cut = _log(tmp_path, "cut.log", "========= COMPUTE-SANITIZER\n(killed)\n")
    ok = _log(tmp_path, "ok.log", "========= ERROR SUMMARY: 0 errors\n")
    a = type("A", (), {"sanitizer_log": [cut, ok]})()
    rows, good = R.run_sanitizer(a)
    assert not good and rows[0]["value"] == 0 and "did not finish" in rows[0]["note"]
    a.sanitizer_log = [cut]
    rows, good = R.run_sanitizer(a)
    assert not good and "error" in rows[0]


def test_merged_rows_keep_where_they_were_measured(tmp_path):
    path = tmp_path / "r.json"
    meta1 = {"gpuos": "aaaaaaa", "device": "GPU one", "date": "d1"}
    meta2 = {"gpuos": "bbbbbbb", "device": "GPU two", "date": "d2"}
    H.merge_results("r", meta1, [H.value_row("W", "x", 1, "s"), H.value_row("W", "y", 2, "s")], path=path)
    H.merge_results("r", meta2, [H.value_row("W", "y", 3, "s")], path=path)
    rows = {r["config"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["x"]["measured_at"]["gpuos"] == "aaaaaaa" and rows["x"]["value"] == 1
    assert rows["y"]["measured_at"] == {"gpuos": "bbbbbbb", "device": "GPU two", "date": "d2"}


def test_stress_child_runs_chosen_activities_and_names_its_modes():
    """The stress child (tests/_reliability.py, as test_gpu_stress.py runs it) takes --activities, refuses an
    unknown one with the list, gets the live scheduler's A/B switches from env_extra (every other GPUOS_* setting
    of the caller is stripped) and names the ways it ran with in the result's `modes`."""
    import _reliability as REL  # (tests/ is on sys.path, as for test_gpu_stress.py)
    c = REL.run_child("stress", ["--seconds", "0.5", "--threads", "2", "--device", "cpu", "--no-register",
                                 "--activities", "nested"], timeout=120,
                      env_extra={"GPUOS_TIMER_OFF_GIL": "1", "GPUOS_LIVE_IDLE_US": "5000"})
    res = c["result"]
    assert res is not None and res.get("ok"), REL.describe_child(c)
    assert set(res["iterations"]) == {"nested"} and res["iterations"]["nested"] > 0, res["iterations"]
    assert res["modes"] == {"timer_off_gil": True, "GPUOS_LIVE_IDLE_US": "5000"}, res["modes"]  # (default: off)
    c = REL.run_child("stress", ["--seconds", "0.5", "--device", "cpu", "--no-register", "--activities", "nested,x"],
                      timeout=120)
    assert c["result"] is not None and "unknown ['x']" in c["result"]["error"] and "'nested'" in \
        c["result"]["error"], REL.describe_child(c)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

