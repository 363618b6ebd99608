"""The benchmark suite's plumbing, checked without a GPU: CLI, no-GPU exit, budget and rep planning, the
check-then-time measurement (the suite's and the batch benchmarks'), the child-process protocol, README
rendering (ratio math, environment names), plots (with and without matplotlib), and the layout of the package
(benchmarks.harness in layers without cycles, every script runnable as a script, no file over 600 lines).
Fast (seconds); the GPU numbers come from `python -m benchmarks` and the bench_*.py scripts.
"""

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import harness as H
from benchmarks import bench_decode, bench_dynamic, bench_mlp, plots, report, run_all

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _run(*args, timeout=60, env=None):
    return subprocess.run([sys.executable, *args], cwd=str(REPO), env={**ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


# ----------------------------------------------------------------------------------------------- CLI
def test_help_lists_the_options():
    res = _run("-m", "benchmarks", "--help")
    assert res.returncode == 0, res.stderr
    for opt in ("--quick", "--only", "--reps", "--budget-s", "--configs", "--out-dir", "--progress"):
        assert opt in res.stdout


def test_unknown_workload_is_a_usage_error():
    res = _run("-m", "benchmarks", "--only", "W9")
    assert res.returncode == 2
    assert "unknown workload" in res.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_cuda_says_so_and_exits_zero(tmp_path, capsys):
    res = _run("-m", "benchmarks", "--out-dir", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "no CUDA GPU available" in res.stdout
    assert bench_decode.main(["--out-dir", str(tmp_path)]) == 0  # a workload alone: the same path, in process
    assert "no CUDA GPU available" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU debug run is for machines without a GPU")
def test_cpu_debug_run_writes_a_schema_file(tmp_path, capsys):
    assert run_all.main(["--allow-cpu", "--quick", "--only", "W6", "--configs", "eager", "cudagraph", "foreach",
                         "--no-plots",
                         "--progress", "plain", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "dynamic_quick.json").read_text())
    for key in ("benchmark", "device", "driver", "torch", "gpuos", "date", "rows", "params", "suite"):
        assert key in doc
    timed = [r for r in doc["rows"] if "median_ms" in r]
    assert [(r["config"], r["correct"], r["reps"]) for r in timed] == [("eager", True, 5)]
    assert timed[0]["min_ms"] <= timed[0]["median_ms"] <= timed[0]["max_ms"] and timed[0]["cold_pass_ms"] > 0
    assert any(r["config"] == "cudagraph" and "needs CUDA" in r["error"] for r in doc["rows"])
    assert any(r.get("not_applicable") and r["config"] == "foreach" for r in doc["rows"])
    assert "W6 16 sizes 1024-4864 eager" in out and "[1/" in out  # plain progress lines


# ----------------------------------------------------------------------------------------------- budget
def test_plan_reps_keeps_or_trims():
    assert H.plan_reps(0.001, 20, 2, 10.0) == (20, 2, None)
    reps, warmup, note = H.plan_reps(1.0, 20, 2, 6.0)
    assert (reps, warmup) == (5, 1) and "time budget" in note
    assert H.plan_reps(10.0, 20, 2, 1.0)[0] == 3  # never below min_reps


def test_grid_cases_picked_by_label():
    """--only of the micro-benchmark grids (bench_matmul, bench_attention): the cases whose label contains a part,
    every case without it, a ValueError listing the labels when nothing matches."""
    from benchmarks import bench_matmul
    from benchmarks.harness.suite import select_cases
    label = lambda m, nk, dt: f"M{m}-N{nk}-{dt}"  # noqa: E731 (bench_matmul's)
    cases = bench_matmul.grid(False)
    picked = select_cases(cases, label, ["M1-N4096-torch.float16", "M16-N4096-torch.float16"])
    assert [(m, nk, dt) for m, nk, dt in picked] == [(1, 4096, torch.float16), (16, 4096, torch.float16)]
    assert select_cases(cases, label, None) == cases and len(cases) == 16
    with pytest.raises(ValueError, match="no case matches.*M64-N1024-torch.bfloat16"):
        select_cases(cases, label, ["M3-"])


def test_budget_part_never_outlives_its_parent():
    b = H.Budget(5.0)
    assert 4.0 < b.part(100.0).remaining() <= 5.0
    assert H.Budget(0.0).expired()


# ----------------------------------------------------------------------------------------------- measurement
def _ctx(**kw):
    return H.RunContext(budget=H.Budget(kw.pop("seconds", 30.0)), reps=3, warmup=1, device="cpu",
                        log=lambda m: None, **kw)


def test_measure_config_checks_then_times():
    x = torch.arange(8.0)
    case = H.Case(size=8, ref=x * 2, tol={}, ops_per_rep=4)
    row = H.measure_config(_ctx(), "T", case, "eager", lambda: H.Prepared(lambda: x * 2, extra={"capture_ms": 1.0}))
    assert row["correct"] is True and row["reps"] == 3 and row["capture_ms"] == 1.0
    # median_ms is rounded to 4 decimals (rows.rnd): up to 0.5e-4 ms of it is rounding, not timing
    assert row["us_per_op"] == pytest.approx(row["median_ms"] * 1e3 / 4, rel=1e-2, abs=0.5e-4 * 1e3 / 4)
    assert "median_gpu_ms" not in row  # no CUDA events on the CPU

    wrong = H.measure_config(_ctx(), "T", case, "compile", lambda: (lambda: x * 3))
    assert wrong["correct"] is False and "Mismatched" in wrong["correct_detail"]

    def boom():
        raise RuntimeError("no compiler")
    err = H.measure_config(_ctx(), "T", case, "compile", boom)
    assert err["error"] == "RuntimeError: no compiler" and "median_ms" not in err


def test_measure_config_without_gpuos_or_time_gives_error_rows():
    case = H.Case(size=1, ref=torch.ones(1), tol={})
    row = H.measure_config(_ctx(gpuos_err="not built"), "T", case, "gpuos_scheduler", lambda: None)
    assert row["error"] == "gpuos unavailable: not built"
    late = H.measure_config(_ctx(seconds=0.0), "T", case, "eager", lambda: None)
    assert late["error"].startswith("time budget")


def test_child_crash_becomes_error_rows():
    ctx = _ctx(seconds=60.0)
    rows = H.child_rows(ctx, "T", "no_such_module", {}, [(1, "compile")])
    assert len(rows) == 1 and rows[0]["config"] == "compile" and "exited with status" in rows[0]["error"]
    ctx = _ctx(seconds=5.0)  # too little time: no child is started
    rows = H.child_rows(ctx, "T", "no_such_module", {}, [(1, "compile"), (2, "compile")])
    assert [r["size"] for r in rows] == [1, 2] and all(r["error"].startswith("time budget") for r in rows)


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: replay() runs the captured callable again."""

    def __init__(self, fn):
        self.fn = fn

    def replay(self):
        self.fn()


def _fake_capture(warmup, capture):
    warmup()
    return _FakeGraph(capture), capture(), 0.25


class _FakeGpuos:
    """A gpuos package whose scheduler_context changes nothing (the plumbing, not the batching, is tested)."""

    @staticmethod
    def scheduler_context(capacity=8192):
        return contextlib.nullcontext()

    @staticmethod
    def stats():
        return {}

    # programs: the captured function itself (the plumbing of the gpuos_program peer)
    _flags = [False, False]

    @classmethod
    def worker_matmul_enabled(cls):
        return cls._flags[0]

    @classmethod
    def worker_attention_enabled(cls):
        return cls._flags[1]

    @classmethod
    def set_worker_matmul(cls, on):
        cls._flags[0] = on

    @classmethod
    def set_worker_attention(cls, on):
        cls._flags[1] = on

    @staticmethod
    def wrap(fn, cache_size=8):
        class _Wrapped:
            captures = 0

            def __call__(self, *a):
                return fn(*a)
        return _Wrapped()

    @staticmethod
    def capture(fn, *args):
        class _Prog:
            def __call__(self, *a):
                return fn(*a)

            def info(self):
                return {"entries": 1, "tiles": 1, "segments": 1, "levels": [1], "fallbacks": []}
        return _Prog()


@pytest.mark.parametrize("workload", ["W4", "W5", "W6"])
def test_gpu_peer_setups_with_fake_graphs(workload, monkeypatch):
    """The cudagraph and gpuos_scheduler setups (GPU-only for real) check correct and keep their counters."""
    monkeypatch.setattr(H, "capture_cuda_graph", _fake_capture)
    ctx = _ctx(gpuos=_FakeGpuos())
    module, case = {"W4": (bench_decode, lambda: bench_decode.make_case(16, 4, "cpu")),
                    "W5": (bench_mlp, lambda: bench_mlp.make_case("2x32", 3, "cpu")),
                    "W6": (bench_dynamic, lambda: bench_dynamic.make_case(40, "cpu"))}[workload]
    case = case()
    setups = module.make_setups(ctx)
    assert set(setups) == set(module.IN_PROCESS)
    for config, setup in setups.items():
        row = H.measure_config(ctx, workload, case, config, lambda: setup(case))
        assert row.get("correct") is True, row
        if config == "gpuos_program" and workload != "W6":  # captured once: timed after replays past the tier-2
            assert row.get("settle_ms", -1) >= 0, row          # threshold and the generation wait (W6: wrap)
    if workload == "W6":  # one capture per size, counted and timed; the cold pass is recorded
        assert row["config"] == "gpuos_scheduler"
        graph = H.measure_config(ctx, workload, case, "cudagraph", lambda: setups["cudagraph"](case))
        assert graph["captures"] == 16 and graph["capture_ms_total"] == pytest.approx(4.0)
        assert graph["cold_pass_ms"] > 0
        counts = bench_dynamic.count_rows([graph])
        assert [(r["config"], r["value"]) for r in counts][0] == ("captures", 16)


FAKE_PROBE = ("import json, os; print('@@GPUOS_JIT@@' + json.dumps({'import_s': 1.0, 'init_s': 0.5, "
              "'jit_compiles': 0 if os.environ.get('GPUOS_FORBID_COMPILE') else 3, 'disk_cache_hits': 1}))")


def test_jit_probe_rows_prove_the_warm_start(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "JIT_PROBE", FAKE_PROBE)  # the real one needs a GPU; the plumbing is the same
    cold = run_all.finish_jit_probe(run_all.start_jit_probe(tmp_path / "jit", False), "gpuos_jit_cold_s", 30)
    warm = run_all.finish_jit_probe(run_all.start_jit_probe(tmp_path / "jit", True), "gpuos_jit_warm_s", 30,
                                    forbid_compile=True)
    assert (cold["value"], cold["jit_compiles"], cold["correct"]) == (0.5, 3, True)
    assert (warm["jit_compiles"], warm["correct"]) == (0, True)
    monkeypatch.setattr(run_all, "JIT_PROBE", "raise SystemExit('no driver')")
    failed = run_all.finish_jit_probe(run_all.start_jit_probe(tmp_path / "jit", False), "gpuos_jit_cold_s", 30)
    assert "no driver" in failed["error"]


def test_first_call_rows_gather_compile_and_capture_costs():
    rows = [H.value_row("W4", "compile_time_s", 3.0, "s", size=128, for_config="compile", first_size=True),
            H.value_row("W4", "compile_time_s", 1.0, "s", size=256, for_config="compile", first_size=False),
            _timing(128, "cudagraph", 1.0, capture_ms=2.5), _timing(256, "cudagraph", 1.0, capture_ms=3.5)]
    out = run_all.first_call_rows({"W4": {"rows": rows}})
    assert [(r["workload"], r["config"], r["value"]) for r in out] == [("W4", "compile_time_s", 3.0),
                                                                       ("W4", "cudagraph_capture_ms", 2.5)]
    assert out[1]["all_sizes"] == {128: 2.5, 256: 3.5}


# ----------------------------------------------------------------------------------------------- report
def _timing(size, config, ms, correct=True, **kw):
    return dict({"workload": "W4", "size": size, "config": config, "median_ms": ms, "min_ms": ms, "max_ms": ms,
                 "reps": 20, "correct": correct}, **kw)


def _doc(name, rows):
    return {"benchmark": name, "device": "NVIDIA Test GPU", "driver": "999.1", "torch": "9.9.9+cu999",
            "gpuos": "abc1234", "date": "2026-01-01T00:00:00Z", "rows": rows,
            "suite": {"title": "synthetic decode"}}


@pytest.fixture
def results(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    decode = [
        _timing(128, "eager", 10.0), _timing(128, "cudagraph", 3.0), _timing(128, "gpuos_scheduler", 2.0),
        _timing(256, "eager", 12.0), _timing(256, "compile", 2.0), _timing(256, "gpuos_scheduler", 4.0),
        _timing(256, "gpuos_submit", 1.0, correct=False),  # wrong results never count as a win
        {"workload": "W4", "size": 256, "config": "cudagraph", "error": "time budget: skipped"},
        H.not_applicable_row("W4", "foreach", "no lists"),
    ]
    (d / "decode.json").write_text(json.dumps(_doc("decode", decode)))
    first = [H.value_row("W4", "compile_time_s", 12.5, "s", size=128, for_config="compile"),
             H.value_row("gpuos", "gpuos_jit_warm_s", 0.02, "s", jit_compiles=0, correct=True)]
    (d / "first_call.json").write_text(json.dumps(_doc("first_call", first)))
    (d / "decode_quick.json").write_text(json.dumps(_doc("decode", [_timing(1, "eager", 1.0)])))
    return d


def test_ratio_math_groups_by_size_and_op():
    rows = [_timing(8, "eager", 6.0, op="sum"), _timing(8, "gpuos_submit_reduce", 2.0, op="sum"),
            _timing(8, "eager_softmax", 9.0, op="softmax"), _timing(8, "gpuos_softmax", 12.0, op="softmax")]
    res = {r["op"]: r for r in H.gpuos_vs_best_peer(rows)}
    assert res["sum"]["ratio"] == pytest.approx(3.0) and res["sum"]["peer"] == "eager"
    assert res["softmax"]["ratio"] == pytest.approx(0.75) and res["softmax"]["gpuos"] == "gpuos_softmax"


def test_report_marks_rows_kept_from_an_earlier_run():
    """A results file refreshed by a partial re-run keeps the other configs' rows from the older commit: the
    report names them, so the table's header commit is not taken for theirs."""
    doc = _doc("decode", [_timing(128, "eager", 10.0), _timing(128, "gpuos_scheduler", 2.0),
                          _timing(128, "compile", 5.0, gpuos="0ld0001")])
    text = report.render([doc])
    assert "From an earlier run (gpuos 0ld0001): `compile`." in text
    assert "From an earlier run" not in report.render([_doc("decode", [_timing(128, "eager", 10.0)])])


def test_report_rewrites_only_the_marked_block(results, tmp_path):
    readme, out = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text("# Title\nbefore\n<!-- results:begin -->\nold table\n<!-- results:end -->\nafter\n")
    assert report.main(["--readme", str(readme), "--results", str(results), "--out", str(out)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\nbefore\n<!-- results:begin -->\n")
    assert text.endswith("<!-- results:end -->\nafter\n")
    short = text.split("<!-- results:begin -->")[1].split("<!-- results:end -->")[0]
    assert "old table" not in short and "NVIDIA Test GPU" in short and "benchmarks/RESULTS.md" in short
    assert "- W4 decode [Test GPU, abc1234]: GPUOS vs best peer 128: 1.50x vs cudagraph" in short
    assert "| size |" not in short
    block = out.read_text()
    assert block.startswith("# Measured results\n")
    assert "NVIDIA Test GPU" in block and "999.1" in block and "9.9.9+cu999" in block
    assert "| size | eager | cudagraph | compile | gpuos_scheduler | gpuos_submit |" in block  # peers first
    assert "| 128 | 10.00 | 3.00 | – | 2.00 | – |" in block
    assert "| 256 | 12.00 | error | 2.00 | 4.00 | 1.00 (WRONG) |" in block
    # 128: best peer cudagraph 3.0 / gpuos 2.0 = 1.5 (win); 256: compile 2.0 / gpuos_scheduler 4.0 = 0.5 (loss)
    assert "128: 1.50x" in block and "256: 0.50x" in block and "1 win, 1 loss" in block
    assert "geometric mean 0.87x" in block  # sqrt(1.5 * 0.5)
    assert "Not applicable: `foreach` (no lists)" in block and "time budget: skipped" in block
    assert "| W4 | 12.5 (size 128) |" in block and "`gpuos_jit_warm_s`" in block
    assert "decode_quick" not in block and "| 1 |" not in block  # quick files are left out


def test_report_readme_block_lists_the_suites_files_and_names_the_others(results, tmp_path):
    """A result file named by the commit it measured (an A/B run's models_program_<commit>.json) gets its table in
    RESULTS.md, headed with its file name, and only a mention in the README's block."""
    (results / "decode_abc1234_ab.json").write_text(json.dumps(_doc("decode", [
        _timing(128, "eager", 10.0), _timing(128, "cudagraph", 3.0), _timing(128, "gpuos_scheduler", 6.0)])))
    readme, out = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    assert report.main(["--readme", str(readme), "--results", str(results), "--out", str(out)]) == 0
    short = readme.read_text()
    assert short.count("- W4 decode [") == 1 and "1.50x vs cudagraph" in short and "0.50x vs cudagraph" not in short
    assert "1 more result files, each the record of one commit's A/B run" in short
    assert "`decode_abc1234_ab.json`" in short
    block = out.read_text()
    assert "file `decode_abc1234_ab.json`" in block and "128: 0.50x" in block  # its table, under its name
    assert "file `decode.json`" not in block


def test_report_without_markers_fails_cleanly(results, tmp_path):
    readme, out = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text("no markers\n")
    assert report.main(["--readme", str(readme), "--results", str(results), "--out", str(out)]) == 1
    assert readme.read_text() == "no markers\n" and not out.exists()


def test_summary_lines_name_the_ratio(results):
    lines = report.summary_lines(report.load_docs(results))
    assert lines == ["W4 decode [Test GPU, abc1234]: GPUOS vs best peer 128: 1.50x vs cudagraph, 256: 0.50x vs compile "
                     "(1 wins, 1 losses)"]  # each line names the GPU and commit of its file


# ----------------------------------------------------------------------------------------------- plots
def test_plots_without_matplotlib_say_so(results, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    assert plots.make_plots(results) == []
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert plots.main(["--results", str(results)]) == 0


def test_plots_write_pngs(results, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "png"
    written = plots.make_plots(results, out)
    assert {p.name for p in written} == {"decode_speedup.png", "decode_breakdown.png"}
    assert all(p.stat().st_size > 1000 for p in written)


def test_speedups_are_relative_to_the_groups_eager(results):
    rows = H.timed_rows(json.loads((results / "decode.json").read_text()))
    sp = plots.speedups(rows)
    assert dict(sp["cudagraph"])[128] == pytest.approx(10.0 / 3.0)
    assert "gpuos_submit" not in sp  # failed its correctness check
    assert math.isclose(dict(sp["eager"])[256], 1.0)


# ----------------------------------------------------------------------------------------------- package layout
BENCH = REPO / "benchmarks"
BOOTSTRAP = ('if __package__ in (None, ""):  # run as a script: make the repo root importable\n'
             '    import _rootpath  # noqa: F401\n')


def _imported(path: Path, package: str) -> set:
    """Every module ``path`` imports, at module level or inside functions, as a dotted name (relative imports
    resolved against ``package``)."""
    import ast
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(p for p in (base, node.module) if p)
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from benchmarks import run_all`
    return out


def test_harness_modules_import_only_lower_layers():
    """Each harness module imports only harness modules of earlier layers (LAYERS, bottom first): no cycles,
    and never run_all, report, plots, _child or a bench file."""
    mods = sorted(p.stem for p in (BENCH / "harness").glob("*.py") if p.stem != "__init__")
    assert sorted(H.LAYERS) == mods
    for i, name in enumerate(H.LAYERS):
        bad = set()
        for dep in _imported(BENCH / "harness" / f"{name}.py", "benchmarks.harness"):
            parts = dep.split(".")
            if parts[0] == "benchmarks" and not (parts[1:2] == ["harness"] and parts[2:3]
                                                 and parts[2] in H.LAYERS[:i]):
                bad.add(dep)
        assert not bad, f"harness.{name} imports {sorted(bad)}"


def test_no_import_cycle_in_benchmarks():
    """The static import graph of benchmarks/ (function-level imports included) has no cycle."""
    files = {f"benchmarks.{p.stem}": p for p in BENCH.glob("*.py")}
    files.update({f"benchmarks.harness.{p.stem}": p for p in (BENCH / "harness").glob("*.py")})
    files["benchmarks.harness"] = files.pop("benchmarks.harness.__init__")
    files.pop("benchmarks.__init__")
    graph = {m: {d for d in _imported(p, m if p.stem == "__init__" else m.rsplit(".", 1)[0]) if d in files and d != m}
             for m, p in files.items()}
    state: dict = {}

    def visit(m, path):
        if state.get(m) == "open":
            raise AssertionError("import cycle: " + " -> ".join(path + [m]))
        if state.get(m) is None:
            state[m] = "open"
            for d in graph[m]:
                visit(d, path + [m])
            state[m] = "done"
    for m in graph:
        visit(m, [])
    assert "benchmarks.run_all" not in set().union(*(graph[m] for m in graph if m.startswith("benchmarks.harness")))


def test_importing_the_harness_pulls_in_no_suite_module_and_no_torch():
    code = ("import sys, benchmarks.harness\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.split('.')[-1] in "
            "('run_all', 'report', 'plots', '_child') or m.split('.')[-1].startswith('bench_'))\n"
            "print(bad)")
    res = _run("-c", code)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
    res = _run("-c", "import sys, benchmarks.report, benchmarks.plots; print('torch' in sys.modules)")
    assert res.stdout.strip() == "False", res.stdout + res.stderr  # report and plots need no torch


def test_no_benchmark_module_is_over_600_lines():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in BENCH.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > 600} == {}


def test_every_script_runs_as_a_script():
    """`python benchmarks/<script>.py --help` works for every script (the shared two-line bootstrap makes the
    repo root importable), and no file has its own sys.path juggling."""
    scripts = sorted(p for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
                     and p.stem not in ("__main__", "_child"))
    assert {p.stem for p in scripts} >= {"run_all", "report", "plots", "bench_microbatch", "bench_reduce",
                                         "bench_scheduler", "bench_fusion", "bench_injection", "bench_decode",
                                         "bench_mlp", "bench_dynamic"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    procs = [(p, subprocess.Popen([sys.executable, str(p), "--help"], cwd="/", env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)) for p in scripts]
    for p, proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "usage:" in out, (p.name, err[-500:])
        text = p.read_text()
        assert BOOTSTRAP in text and "sys.path" not in text.replace(BOOTSTRAP, ""), p.name


def test_git_sha_honours_the_environment(monkeypatch):
    monkeypatch.setenv("GPUOS_GIT_SHA", "feedbee")
    assert H.git_sha() == "feedbee" and H.env_metadata("x")["gpuos"] == "feedbee"


# ----------------------------------------------------------------------------------------------- batch benchmarks
def test_batch_checks_of_w1_and_w3_name_the_failing_ops():
    from benchmarks import bench_microbatch, bench_reduce
    A = [torch.randn(8) for _ in range(5)]
    B = [torch.randn(8) for _ in range(5)]
    outs = [a + b for a, b in zip(A, B)]
    assert bench_microbatch.check_add(outs, A, B) == (True, None)
    outs[3] = outs[3] + 1
    ok, why = bench_microbatch.check_add(outs, A, B)
    assert not ok and why.startswith("ops 0..4: ")
    assert bench_microbatch.check_add(outs[:2], A, B) == (False, "expected 5 outputs, got 2")
    X = [torch.randn(4, 16) for _ in range(300)]
    sums = [x.sum(-1) for x in X]
    assert bench_reduce.check_outputs(sums, X, "sum") == (True, None)
    sums[260] = sums[260] * 2
    ok, why = bench_reduce.check_outputs(sums, X, "sum")
    assert not ok and why.startswith("ops 250..299: ")  # chunks of 250
    assert bench_reduce.check_outputs([torch.softmax(x, -1) for x in X], X, "softmax") == (True, None)


def test_bench_config_checks_then_times_into_one_row(monkeypatch):
    """The per-configuration flow of W1 / W3 (GPU-only for real; syncs stubbed here): outputs poisoned, one
    checked run, planned reps, the row (lead fields, per-op times, the setup's fields, reps_note), the after
    hook; any error becomes an error row and reaches on_error."""
    from benchmarks.harness import batch, timing
    monkeypatch.setattr(timing, "cuda_sync", H.no_sync)
    monkeypatch.setattr(batch, "cuda_sync", H.no_sync)
    monkeypatch.setattr(timing, "_events_usable", lambda: False)  # CPU tensors: no CUDA events even on a GPU host
    A = [torch.randn(8) for _ in range(4)]
    outs = [torch.zeros(8) for _ in range(4)]
    rows, logs, after, failed = [], [], [], []

    def setup():
        def fn():
            for a, o in zip(A, outs):
                torch.add(a, 1, out=o)
        return fn, outs, {"op": "add1", "capture_ms": 0.5}, after.append

    def check(got, fields):
        assert fields["op"] == "add1"
        return H.check_batch(got, 4, lambda i, j: torch.stack(A[i:j]) + 1)

    plan = lambda check_s, run_s: H.plan_reps(run_s, 7, 1, 100.0)  # noqa: E731
    H.bench_config(rows, "T", 8, "eager", setup, check, plan, 4, logs.append, "n=8", {"count": 4},
                   lead={"count": 4})
    row = rows[0]
    assert list(row)[:10] == ["workload", "size", "config", "median_ms", "min_ms", "max_ms", "reps", "correct",
                              "count", "us_per_op"]
    assert (row["correct"], row["reps"], row["op"], row["capture_ms"]) == (True, 7, "add1", 0.5)
    assert len(after) == 1 and after[0].reps == 7 and "n=8 eager" in logs[-1]

    def broken():
        raise RuntimeError("boom")
    H.bench_config(rows, "T", 8, "gpuos_x", broken, check, plan, 4, logs.append, "n=8", {"count": 4},
                   on_error=failed.append)
    assert rows[1] == {"workload": "T", "size": 8, "config": "gpuos_x", "error": "RuntimeError: boom", "count": 4}
    assert [str(e) for e in failed] == ["boom"] and logs[-1] == "n=8 gpuos_x: ERROR RuntimeError: boom"


def test_goals_and_speedup_table():
    from benchmarks import bench_microbatch, bench_reduce
    rows = [_timing(256, "eager", 10.0), _timing(256, "gpuos_submit", 0.2), _timing(256, "cudagraph", 1.0),
            _timing(256, "gpuos_submit_many", 0.5, correct=False),
            H.value_row("W1", "roundtrip_us", 5.0, "us", correct=True)]
    goals = bench_microbatch.evaluate_goals(rows, [256, 1024])
    assert [(g["achieved"], g["pass"], g["note"]) for g in goals] == [
        (50.0, True, ""), (2.0, False, "results incorrect"), (None, False, "no data"), (5.0, True, ""),
        (None, False, "no data")]
    assert list(goals[0]) == ["goal", "target", "achieved", "pass", "note"] and goals[0]["target"] == ">= 25x"
    table = H.speedup_table(rows, [256], bench_microbatch.CONFIGS)
    assert table[0][:2] == ["256", "eager"] and table[0][7:] == ["1.00x", "0.10x", "yes"]
    assert [r[1] for r in table] == ["eager", "cudagraph", "gpuos_submit", "gpuos_submit_many"]
    w3 = [_timing("8x256", "eager", 8.0), _timing("8x256", "gpuos_submit_reduce", 2.0),
          _timing("8x256", "eager_softmax", 6.0), _timing("8x256", "gpuos_softmax", 3.0)]
    g3 = bench_reduce.evaluate_goals(w3, [(8, 256)])
    assert [(g["achieved"], g["pass"], g.get("informational")) for g in g3] == [(4.0, True, None), (2.0, False, True)]
    soft = H.speedup_table(w3, ["8x256"], bench_reduce.CONFIGS, baseline={"gpuos_softmax": "eager_softmax"},
                           mark=" (sm)")
    assert soft[-1][7:9] == ["2.00x (sm)", "-"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
@pytest.mark.parametrize("tool", ["matmul_host", "ew_paths", "sched_model_probe"])
def test_gpu_measuring_tools_without_cuda_say_so(tool):
    """The device-only measuring tools (DEVELOPING *Next*) exit 0 with a message on a machine without a GPU."""
    res = _run(f"tools/{tool}.py")
    assert res.returncode == 0, res.stderr
    assert f"{tool}: no CUDA GPU" in res.stdout


def test_sched_model_probe_on_the_cpu():
    """tools/sched_model_probe.py's own check (PROBE_CPU=1: eager and the do-nothing mode on W7's Llama-small, on
    the CPU): it counts the step's aten ops, times both configs and profiles the mode's run."""
    pytest.importorskip("transformers")
    res = _run("tools/sched_model_probe.py", timeout=300,
               env={"PROBE_CPU": "1", "PROBE_STEPS": "2", "PROBE_RUNS": "1", "PROBE_TOP": "5"})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    ops = float(out.split(" aten ops per step")[0].split()[-1])
    assert ops > 100, out  # a decode step of 4 layers: a few hundred aten ops
    assert "  eager " in out and "  noop_mode " in out and "us per aten op" in out, out
    assert "by tottime" in out and "by cumulative" in out, out


def test_matmul_sequences_compute_the_products():
    """bench_matmul's timed sequences (which tools/matmul_host.py shares) and its F.linear forms: the independent
    products of x and the chain, on the CPU through the cuBLAS config's torch.mm."""
    from benchmarks.bench_matmul import linears, sequences
    g = torch.Generator().manual_seed(3)
    ws = [torch.randn(8, 8, generator=g) for _ in range(3)]
    x = torch.randn(2, 8, generator=g)
    outs = [torch.empty(2, 8) for _ in range(3)]
    seqs = sequences(ws, x, outs)
    assert sorted(seqs) == [("chain", "cublas"), ("chain", "gpuos_worker"), ("independent", "cublas"),
                            ("independent", "gpuos_worker")]
    ref = x
    for w in ws:
        ref = ref @ w.t()
    seqs["chain", "cublas"]()
    torch.testing.assert_close(outs[-1], ref)
    torch.testing.assert_close(linears(ws, chain=True)(x), ref)
    seqs["independent", "cublas"]()
    for o, w, y in zip(outs, ws, linears(ws, chain=False)(x)):
        torch.testing.assert_close(o, x @ w.t())
        torch.testing.assert_close(y, x @ w.t())
