"""Decode attention (issue #16, device_src/attention.h) without a GPU: the device code compiles into the worker
through NVRTC for sm_80 and sm_90, the op table row, the host's split choice, the settings, the scheduler's
handlers and reason codes, and the explicit API's typed errors for inputs it refuses before touching a GPU."""

import pytest
import torch

import gpuos
import gpuos_ext


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_worker_with_attention_compiles(requires_nvrtc, arch):
    cubin = gpuos_ext.jit_compile(arch)
    assert cubin[:4] == b"\x7fELF"
    # the attention paths are noinline functions of the worker module: their symbols are in the image
    for name in (b"attention_op", b"attn_item", b"attn_finish"):
        assert name in cubin, f"{name!r} missing from the {arch} worker image"


def test_attention_header_is_part_of_the_worker():
    src = gpuos_ext.device_sources()
    assert "device_src/attention.h" in src
    assert '#include "device_src/attention.h"' in src["device_src/worker.cu"]
    assert "attention_op(" in src["device_src/worker.cu"]


def test_op_table_row():
    rows = {r["name"]: r for r in gpuos_ext.op_table()}
    r = rows["sdpa"]
    assert r["kind"] == "attention" and r["arity"] == 3 and r["scalars"] == ["scale"] and r["aten"] == []


def test_submit_rejects_attention_op():
    with pytest.raises(ValueError, match="submit_attention"):
        gpuos_ext.submit("sdpa", [torch.zeros(1)] * 3, torch.zeros(1))


@pytest.mark.parametrize("tiles, kv, cap, want", [
    (8, 128, 4096, 2),        # Llama decode at KV 128: 64-position slices
    (8, 8192, 4096, 64),      # ... at KV 8,192: the most slices
    (1, 63, 4096, 1),         # shorter than a slice: no split
    (2048, 4096, 4096, 1),    # enough tiles for the grid already
    (16, 100, 4096, 1),       # 100 / 64: one slice
    (4, 1000, 4096, 15),      # ceil(1000 / 15) = 67 positions per slice, no empty slice
])
def test_attention_split(tiles, kv, cap, want):
    ns = gpuos_ext._testing.attention_split(tiles, kv, cap)
    assert ns == want
    span = -(-kv // ns)
    assert (ns - 1) * span < kv, "an empty slice"
    assert tiles * ns <= max(cap // 2, tiles), "a split op must fit one piece of the ring"


def test_attention_split_min_rows():
    # GPUOS_ATTN_MIN_ROWS: 16-position slices at KV 256 give 16 splits, 64-position ones 4
    assert gpuos_ext._testing.attention_split(4, 256, 4096, min_rows=16) == 16
    assert gpuos_ext._testing.attention_split(4, 256, 4096, min_rows=64) == 4
    assert gpuos_ext._testing.attention_split(4, 256, 4096, min_rows=1) == 64   # kAttnMaxSplit


def test_attention_split_max_split():
    # a captured attention whose kv range 8 warps cover in <= 32-position splits takes <= 8 (one per warp): a claim
    # of one descriptor per warp then holds whole tiles (the shared-memory combine)
    assert gpuos_ext._testing.attention_split(4, 256, 4096, min_rows=16, max_split=8) == 8
    assert gpuos_ext._testing.attention_split(4, 200, 4096, min_rows=16, max_split=8) == 8   # 25 positions each
    assert gpuos_ext._testing.attention_split(4, 40, 4096, min_rows=16, max_split=8) == 2
    assert gpuos_ext._testing.attention_split(4, 256, 4096, min_rows=1, max_split=500) == 64  # kAttnMaxSplit


def test_attention_split_respects_the_ring():
    # 600 tiles x 2 slices would exceed half a 1,024-slot ring: no split
    assert gpuos_ext._testing.attention_split(600, 8192, 1024) == 1


def test_setting_and_config():
    was = gpuos.worker_attention_enabled()
    try:
        gpuos.set_worker_attention(True)
        assert gpuos.worker_attention_enabled()
        gpuos.set_worker_attention(False)
        assert not gpuos.worker_attention_enabled()
    finally:
        gpuos.set_worker_attention(was)
    assert gpuos_ext.config()["GPUOS_WORKER_ATTENTION"] in ("0", "1")


def test_reason_codes():
    names = set(gpuos_ext.sched_reasons().values())
    assert {"attention_off", "attention_shape", "attention_layout", "attention_lse"} <= names


def test_scheduler_intercepts_the_sdpa_backends():
    ops = gpuos.scheduler.intercepted_ops()
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention"):
        if hasattr(torch.ops.aten, name):
            assert f"aten.{name}.default" in ops


def _reason(code):
    return gpuos_ext.sched_reasons()[code]


def test_sched_attention_reasons_without_a_gpu():
    q = torch.zeros(1, 4, 1, 64, dtype=torch.float16)
    k = v = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    was = gpuos.worker_attention_enabled()
    try:
        gpuos.set_worker_attention(False)
        assert _reason(gpuos_ext.sched_attention(q, k, v, None, False, None, False)) == "attention_off"
        gpuos.set_worker_attention(True)
        assert _reason(gpuos_ext.sched_attention(q, k, v, None, False, None, False)) == "not_cuda"
        assert _reason(gpuos_ext.sched_attention(q, 1.0, v, None, False, None, False)) == "unsupported_args"
    finally:
        gpuos.set_worker_attention(was)


def test_submit_attention_typed_errors_without_a_gpu():
    q = torch.zeros(1, 4, 1, 64, dtype=torch.float16)
    k = v = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"submit_attention\(q \(1, 4, 1, 64\).*CUDA tensor"):
        gpuos.submit_attention(q, k, v, torch.empty_like(q))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        gpuos.submit_attention(q, "k", v, torch.empty_like(q))
