"""benchmarks/bench_models.py (W7, Hugging Face decode) without a GPU: labels, the per-step scheduler figures, the
label selection, and -- when transformers is installed -- a CPU debug run whose peers agree with eager."""
import json

import pytest

from benchmarks import bench_models as M
from benchmarks import run_all


def test_labels_parse_and_bad_ones_are_named():
    s = M.parse_label("llama-base-bf16-eager-dynamic")
    assert (s.model, s.scale, s.dtype, s.attn, s.cache) == ("llama", "base", "bf16", "eager", "dynamic")
    assert len(M.FULL) == 34 and len(set(M.FULL)) == 34
    s = M.parse_label("llama-small-fp16-sdpa-static4096")
    assert (s.cache, s.slots) == ("static", 4096)
    assert M.parse_label("gpt2-small-fp16-sdpa-static").slots == M.MAX_CACHE
    assert M.parse_label("gpt2-small-fp16-sdpa-dynamic").slots is None
    for bad in ("llama-small-fp16-sdpa-static16", "llama-small-fp16-sdpa-staticx", "llama-small-fp16-sdpa"):
        with pytest.raises(ValueError, match="static<N>"):
            M.parse_label(bad)
    assert set(M.DEFAULT) <= set(M.FULL) and set(M.QUICK) <= set(M.DEFAULT)
    with pytest.raises(ValueError, match="bad config label 'llama-huge-fp16-sdpa-static'"):
        M.parse_label("llama-huge-fp16-sdpa-static")


def test_label_selection_from_the_environment(monkeypatch):
    assert M.suite_params(False)["labels"] == M.DEFAULT and M.suite_params(True)["labels"] == M.QUICK
    monkeypatch.setenv("GPUOS_BENCH_MODELS", "full")
    assert M.suite_params(False)["labels"] == M.FULL
    monkeypatch.setenv("GPUOS_BENCH_MODELS", "gpt2-small-bf16-eager-static, llama-small-fp16-sdpa-dynamic")
    assert M.suite_params(True)["labels"] == ["gpt2-small-bf16-eager-static", "llama-small-fp16-sdpa-dynamic"]
    monkeypatch.setenv("GPUOS_BENCH_MODELS", "gpt3-small-fp16-sdpa-static")
    with pytest.raises(ValueError):
        M.suite_params(False)


def test_per_step_stats():
    s0 = {"ops_intercepted": 100, "batches": 10, "worker_launches": 2,
          "fallback_ops": {"aten.mm.default": 4}, "launches_by_cause": {"exit": 1},
          "flushes_by_cause": {"exit": 1}}
    s1 = {"ops_intercepted": 300, "batches": 30, "worker_launches": 2,
          "fallback_ops": {"aten.mm.default": 24, "aten.embedding.default": 2},
          "launches_by_cause": {"exit": 1}, "flushes_by_cause": {"exit": 3, "dependency": 20}}
    f = M.per_step_stats(s0, s1, steps=2)
    assert f["aten_ops_per_step"] == 111.0 and f["fallbacks_per_step"] == 11.0
    assert f["fallback_share"] == round(22 / 222, 4)
    assert list(f["fallback_ops_per_step"]) == ["aten.mm.default", "aten.embedding.default"]
    assert f["batches_per_step"] == 10.0 and f["worker_launches_per_step"] == 0.0
    assert f["launches_per_step_by_cause"] == {}
    assert f["flushes_per_step_by_cause"] == {"exit": 1.0, "dependency": 10.0}


def test_cpu_debug_run_matches_eager(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers is not installed: W7 rows say so")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the CPU debug run is for machines without a GPU")
    monkeypatch.setenv("GPUOS_BENCH_MODELS", "gpt2-small-bf16-eager-dynamic,llama-small-bf16-sdpa-static")
    assert run_all.main(["--allow-cpu", "--quick", "--only", "W7", "--configs", "eager", "cudagraph",
                         "--no-plots", "--progress", "plain", "--out-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "models_quick.json").read_text())
    timed = [r for r in doc["rows"] if "median_ms" in r]
    assert sorted(r["size"] for r in timed) == ["gpt2-small-bf16-eager-dynamic", "llama-small-bf16-sdpa-static"]
    assert all(r["correct"] and r["ops_per_rep"] == M.QUICK_STEPS and r["sdpa"] == M.SDPA_NOTE for r in timed)
    assert any(r["config"] == "cudagraph" and "needs CUDA" in r["error"] for r in doc["rows"])


def test_token_mismatches_allows_only_near_ties():
    import torch
    ref = torch.tensor([1, 2, 3])
    logits = torch.zeros(3, 5)
    logits[0, 1], logits[1, 2], logits[1, 4], logits[2, 3], logits[2, 0] = 1.0, 1.0, 0.99, 1.0, 0.5
    tol = {"rtol": 5e-2, "atol": 5e-2}
    assert M.token_mismatches(ref.clone(), ref, logits, tol) == []
    assert M.token_mismatches(torch.tensor([1, 4, 3]), ref, logits, tol) == []  # 0.99 vs 1.0: a near-tie
    assert M.token_mismatches(torch.tensor([1, 2, 0]), ref, logits, tol) == [(2, 0, 3, 0.5)]  # a clear loss
