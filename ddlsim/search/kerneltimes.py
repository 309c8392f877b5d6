"""Seconds of one dense layer's compute ops, per plan, for the vectorised search tier: the
kernels the trace builder attaches to its ops (:func:`ddlsim.workloads.decoder.layerkernels.
layer_kernels`, the logits GEMM), timed by :func:`ddlsim.simulator.kernels.kernel_time`, once
per distinct (micro-batch size, TP degree, sequence parallelism, micro-batches where the FP8
weight casts are spread over them) of the plans — the same
kernels and the same clock as the exact engine, so the two tiers agree by construction."""

from __future__ import annotations

import numpy as np

from ..simulator.kernels import kernel_time
from ..simulator.kernels.dtensor import regathers_input
from ..simulator.kernels.host import stream_time
from ..workloads.decoder.layerkernels import compute_dtype, layer_kernels, logits_kernels
from ..workloads.decoder.wgrad import main_grad_bytes
from ..workloads.trace import Kernel

__all__ = ["kernel_times"]

_KEYS = ("attn", "mlp", "ew", "bwd.attn", "bwd.mlp", "bwd.ew", "recompute", "logits",
         "bwd.logits")
#: the GEMM ops' parts by module, for ZeRO-3 from module hooks only
_PART_KEYS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "bwd.mlp.fc2", "bwd.mlp.fc1",
              "bwd.attn.proj", "bwd.attn.qkv")


def _keys(ctx) -> tuple[str, ...]:
    return _KEYS if ctx.cfg.software.zero3_gather == "per_layer" else _KEYS + _PART_KEYS


def _one(ctx, b: int, t: int, sp: bool, m: int, seen: dict) -> dict[str, float]:
    """The ops' seconds at micro-batch ``b``, TP ``t``, sequence parallelism ``sp`` and ``m``
    micro-batches per step (0: the kernels do not depend on it,
    :func:`~ddlsim.workloads.decoder.fp8linear.weight_cast_microbatches`); a kernel met
    before (in ``seen``: the same GEMM forward and backward, the same pass in several ops)
    is not timed again."""
    cfg, sh = ctx.cfg, ctx.shape
    lk = dict(layer_kernels(sh, cfg.software, b, ctx.s, t, sp, cfg.train.dtype,
                            regathers_input(cfg.software, cfg.train.recompute), max(m, 1)))
    n, dtype = b * ctx.s, compute_dtype(cfg.train.dtype)
    for key, backward in (("logits", False), ("bwd.logits", True)):   # the builder's head
        lk[key] = logits_kernels(n, sh.vocab / t, sh.hidden, dtype, backward,
                                 main_grad_bytes(cfg.software, cfg.train.dtype))
    def time(k: Kernel) -> float:
        got = seen.get(k)
        if got is None:
            got = seen[k] = kernel_time(k, ctx.dev)
        return got

    # each key is one op of the builder: its kernels' host and launch time as op_time adds it
    return {key: stream_time(sum(time(k) for k in lk[key]), len(lk[key]), ctx.dev.launch)
            for key in _keys(ctx)}


def kernel_times(ctx, mbs: np.ndarray, tp: np.ndarray, sp: np.ndarray,
                 m: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per plan: seconds of each compute op of a layer (keys as ``layer_kernels``, plus
    ``logits`` and ``bwd.logits``; the ops' parts by module only under ZeRO-3 from module
    hooks); ``m``: each plan's micro-batches per step where its kernels depend on them
    (:func:`~ddlsim.workloads.decoder.fp8linear.weight_cast_microbatches`), default none."""
    mbs, tp = np.asarray(mbs, dtype=np.int64), np.asarray(tp, dtype=np.int64)
    m = np.zeros_like(mbs) if m is None else np.asarray(m, dtype=np.int64)
    # one integer per (mbs, tp, sp, m), ordered as the tuples are: a 1-D unique is far
    # cheaper than np.unique(axis=0) on the stacked tuples
    span, mspan = int(tp.max(initial=0)) + 1, int(m.max(initial=0)) + 1
    codes = ((mbs * span + tp) * 2 + np.asarray(sp, dtype=np.int64)) * mspan + m
    uniq, inverse = np.unique(codes, return_inverse=True)
    seen: dict = {}
    keys = _keys(ctx)
    table = np.array([[row[k] for k in keys] for row in
                      (_one(ctx, int(c // mspan // 2 // span), int(c // mspan // 2 % span),
                            bool(c // mspan % 2), int(c % mspan), seen)
                       for c in uniq)]).reshape(len(uniq), len(keys))
    per_plan = table[inverse.reshape(-1)]
    return {k: per_plan[:, i] for i, k in enumerate(keys)}
