"""The deferred queue's rewrites (csrc/sched/rewrite.h) on the CPU, through gpuos_ext._testing.rewrite_queue and
gqa_source: which ops fold, which are dropped, and every condition that must keep an op as it is. The GPU results
of the same rewrites are tests/test_gpu_rewrite.py's. Each queue is built inside a helper function, so its tensors
are referenced by the spec alone (dropped by Python) unless the test keeps one."""

import pytest
import torch

gpuos_ext = pytest.importorskip("gpuos_ext")
T = gpuos_ext._testing


def linear_then_add(res_first=True, bias=False, alpha=1.0, beta=1.0, add_alpha=1.0, keep=None):
    """F.linear / addmm of (1, 256) x (256, 384) viewed (1, 1, 384), then a residual add (GPT-2 / Llama)."""
    a, w = torch.randn(1, 256), torch.randn(384, 256)
    prod = torch.empty(1, 384)
    res = torch.randn(1, 1, 384)
    b = torch.randn(384) if bias else None
    spec = [("mm", "mm", prod, [a, w.t(), b], True, alpha, beta)]
    view = prod.view(1, 1, 384)
    ins = [res, view] if res_first else [view, res]
    spec.append(("ew", "add", torch.empty(1, 1, 384), ins, True, add_alpha, 0.0))
    if keep is not None:
        keep.extend([prod, view])
    return spec, res, b


def test_residual_add_folds_into_the_matmul():
    spec, res, _ = linear_then_add()
    ops, n = T.rewrite_queue(spec)
    assert n["epilogues"] == 1 and ops[0]["dropped"] and not ops[1]["dropped"]
    mm = ops[1]
    assert mm["kind"] == "mm" and mm["ins"][2] == res.data_ptr() and (mm["s0"], mm["s1"]) == (1.0, 1.0)


@pytest.mark.parametrize("res_first", [True, False])
def test_scales_go_where_the_add_put_them(res_first):
    spec, _, _ = linear_then_add(res_first=res_first, alpha=2.0, add_alpha=0.5)
    ops, n = T.rewrite_queue(spec)
    assert n["epilogues"] == 1
    # res + 0.5 * (2 a@b) = 1.0 a@b + res; (2 a@b) + 0.5 res
    assert (ops[1]["s0"], ops[1]["s1"]) == ((1.0, 1.0) if res_first else (2.0, 0.5))


@pytest.mark.parametrize("res_first", [True, False])
def test_a_bias_is_summed_with_the_residual_in_the_matmuls_place(res_first):
    spec, res, b = linear_then_add(res_first=res_first, bias=True, beta=0.5, add_alpha=2.0)
    prod = spec[0][2].data_ptr()
    ops, n = T.rewrite_queue(spec)
    assert n["epilogues"] == 1 and not ops[0]["dropped"]
    add = ops[0]  # the bias sum, written into the product's own buffer
    assert add["kind"] == "ew" and add["op"] == "add" and add["out"] == prod
    if res_first:   # res + 2 (a@b + 0.5 b) = res + 1.0 * b + 2 a@b
        assert add["ins"] == [res.data_ptr(), b.data_ptr()] and add["s0"] == 1.0
        assert (ops[1]["s0"], ops[1]["s1"]) == (2.0, 1.0)
    else:           # a@b + 0.5 b + 2 res = 0.5 (b + 4 res) + a@b
        assert add["ins"] == [b.data_ptr(), res.data_ptr()] and add["s0"] == 4.0
        assert (ops[1]["s0"], ops[1]["s1"]) == (1.0, 0.5)
    assert ops[1]["ins"][2] == prod


def test_no_fold_while_python_holds_the_product():
    keep = []
    spec, _, _ = linear_then_add(keep=keep)
    ops, n = T.rewrite_queue(spec)
    assert n["epilogues"] == 0 and not ops[0]["dropped"] and ops[1]["op"] == "add"
    assert ops[1]["dropped"] and n["dead_ops"] == 1  # the add's own output is read by nobody


def test_no_fold_over_a_write_to_the_weight():
    spec, _, _ = linear_then_add()
    w = spec[0][3][1]
    spec.insert(1, ("ew", "mul", w, [w, None], False, 0.0, 0.0))  # w *= ... in place, between product and add
    ops, n = T.rewrite_queue(spec)
    assert n["epilogues"] == 0 and ops[2]["kind"] == "ew"


def test_no_fold_with_a_broadcast_residual():
    a, w, prod = torch.randn(1, 256), torch.randn(384, 256), torch.empty(1, 384)
    spec = [("mm", "mm", prod, [a, w.t(), None], True, 1.0, 1.0),
            ("ew", "add", torch.empty(1, 384), [prod.view(1, 384), torch.randn(384)], True, 1.0, 0.0)]
    ops, n = T.rewrite_queue(spec)
    assert n["epilogues"] == 0


def cat_of_neg(keep=None):
    x = torch.randn(4, 1, 64)
    out = torch.empty(4, 1, 64)
    neg = torch.empty(4, 1, 32)
    spec = [("ew", "neg", neg, [x[..., 32:]], True, 0.0, 0.0),
            ("ew", "copy", out[..., :32], [neg], False, 0.0, 0.0),
            ("ew", "copy", out[..., 32:], [x[..., :32]], False, 0.0, 0.0)]
    if keep is not None:
        keep.append(neg)
    return spec, x, out


def test_a_cat_piece_is_written_by_its_producer():
    spec, x, out = cat_of_neg()
    ops, n = T.rewrite_queue(spec)
    assert n["copies_folded"] == 1 and ops[0]["dropped"]
    assert ops[1]["op"] == "neg" and ops[1]["out"] == out.data_ptr() and ops[1]["ins"] == [x[..., 32:].data_ptr()]
    assert ops[2]["op"] == "copy" and not ops[2]["dropped"]


def test_a_piece_python_holds_is_copied():
    keep = []
    spec, _, _ = cat_of_neg(keep)
    ops, n = T.rewrite_queue(spec)
    assert n["copies_folded"] == 0 and ops[1]["op"] == "copy"


def test_a_cast_piece_is_copied():
    x, out, half = torch.randn(4, 32), torch.empty(4, 64), torch.empty(4, 32, dtype=torch.float16)
    spec = [("ew", "neg", half, [x], True, 0.0, 0.0), ("ew", "copy", out[:, :32], [half], False, 0.0, 0.0)]
    ops, n = T.rewrite_queue(spec)
    assert n["copies_folded"] == 0 and ops[1]["op"] == "copy"


def test_dead_results_are_dropped_and_live_ones_kept():
    held = torch.empty(100)
    spec = [("ew", "neg", torch.empty(100), [torch.randn(100)], True, 0.0, 0.0),   # nobody reads it
            ("ew", "neg", held, [torch.randn(100)], True, 0.0, 0.0)]                # Python holds it
    ops, n = T.rewrite_queue(spec)
    assert n["dead_ops"] == 1 and ops[0]["dropped"] and not ops[1]["dropped"]


def repeat_kv_copy(n_rep=2):
    x = torch.randn(1, 2, 40, 64)
    e = x[:, :, None].expand(1, 2, n_rep, 40, 64)
    out = torch.empty(1, 2, n_rep, 40, 64)
    return x, e, out, out.view(1, 2 * n_rep, 40, 64)


@pytest.mark.parametrize("n_rep", [2, 4])
def test_gqa_source_is_repeat_kvs_input(n_rep):
    x, e, out, kv = repeat_kv_copy(n_rep)
    src = T.gqa_source([(out, e)], kv)
    assert src.shape == x.shape and src.data_ptr() == x.data_ptr() and src.stride() == x.stride()


def test_gqa_source_keeps_the_copy_after_a_write():
    x, e, out, kv = repeat_kv_copy()
    assert T.gqa_source([(out, e), (x, x)], kv).data_ptr() == kv.data_ptr()        # x written after the copy
    assert T.gqa_source([(out, e), (out, out)], kv).data_ptr() == kv.data_ptr()    # the copy written after
    y = torch.randn(1, 2, 2, 40, 64)                                               # not an expanded view
    assert T.gqa_source([(out, y)], kv).data_ptr() == kv.data_ptr()
