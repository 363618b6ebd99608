"""The scheduler's handlers of the CUDA SDPA backend ops (gpuos/scheduler.py builds its table with them): decode
attention as a worker task (device_src/attention.h, csrc/sched/record.cpp sched_attention)."""
from __future__ import annotations

import torch

import gpuos_ext as _ext

from ._handler_base import Schema, UNSUPPORTED, is_reason, reason_code

aten = torch.ops.aten


def handlers() -> dict:
    """The CUDA backend ops of ``F.scaled_dot_product_attention`` (flash / efficient / cuDNN: what the composite
    dispatches to; the scheduler's torch-function front passes the call itself on) as decode-attention worker tasks
    (gpuos.set_worker_attention): query of <= 16 rows, fp16 / bf16, GQA / MQA, causal or additive / bool mask. The
    aten results are tuples: the output, the log-sum-exp (computed by the task where the op always returns it:
    flash, cuDNN; an op asked to compute it for autograd runs eagerly, reason 'attention_lse'), and the RNG /
    length outputs of a run without dropout. Dropout, and everything the checks refuse, runs with torch."""
    sched_attention = _ext.sched_attention
    lse_code = reason_code("attention_lse")

    def empty_long(like):
        return torch.empty((), dtype=torch.long, device=like.device)

    def flash(thr, args, kwargs, schema=Schema(aten._scaled_dot_product_flash_attention.default)):
        # (query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None)
        if len(args) < 3 or schema.get(args, kwargs, "dropout_p") != 0.0 or \
                schema.get(args, kwargs, "return_debug_mask"):
            return UNSUPPORTED
        q, k = args[0], args[1]
        r = sched_attention(q, k, args[2], None, bool(schema.get(args, kwargs, "is_causal")),
                            schema.get(args, kwargs, "scale"), True)
        if is_reason(r):
            return r
        out, lse = r
        return (out, lse, None, None, q.shape[2], k.shape[2], empty_long(q), empty_long(q),
                torch.empty(0, dtype=q.dtype, device=q.device))

    def efficient(thr, args, kwargs, schema=Schema(aten._scaled_dot_product_efficient_attention.default)):
        # (query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None)
        if len(args) < 5 or schema.get(args, kwargs, "dropout_p") != 0.0:
            return UNSUPPORTED
        if args[4]:
            return lse_code  # autograd wants the padded log-sum-exp of the efficient kernel
        q = args[0]
        r = sched_attention(q, args[1], args[2], args[3], bool(schema.get(args, kwargs, "is_causal")),
                            schema.get(args, kwargs, "scale"), False)
        if is_reason(r):
            return r
        lse = torch.empty((q.shape[0], q.shape[1], 0), dtype=torch.float32, device=q.device)
        return (r[0], lse, empty_long(q), empty_long(q))

    def cudnn(thr, args, kwargs, schema=Schema(aten._scaled_dot_product_cudnn_attention.default)):
        # (query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
        #  return_debug_mask=False, *, scale=None)
        if len(args) < 5 or schema.get(args, kwargs, "dropout_p") != 0.0 or \
                schema.get(args, kwargs, "return_debug_mask"):
            return UNSUPPORTED
        if args[4]:
            return lse_code
        q, k = args[0], args[1]
        r = sched_attention(q, k, args[2], args[3], bool(schema.get(args, kwargs, "is_causal")),
                            schema.get(args, kwargs, "scale"), True)
        if is_reason(r):
            return r
        out, lse = r
        return (out, lse.unsqueeze(-1), None, None, q.shape[2], k.shape[2], empty_long(q), empty_long(q), None)

    table = {"_scaled_dot_product_flash_attention": flash, "_scaled_dot_product_efficient_attention": efficient,
             "_scaled_dot_product_cudnn_attention": cudnn}
    return {getattr(aten, name).default: h for name, h in table.items() if hasattr(aten, name)}
