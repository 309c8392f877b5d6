"""Kernel seconds found by the kernel object's identity (issue 27's speed target, 2026-12-01):
a search grid's stage pieces time every kernel of their compute ops in one call
(:func:`ddlsim.search.blocks._time_kernels`) and hand the seconds to
:func:`~ddlsim.simulator.kernels.device.op_time` keyed by ``id(kernel)``, where each compute
op was looked up by value (hashing all its kernels' fields) and each kernel again in the
kernel model's memo. The specification is :func:`op_time` without them: the same float for
every op, and a kernel that is not that very object (an equal one included) never takes
another's seconds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ddlsim.config import build_config
from ddlsim.search import blocks
from ddlsim.simulator.kernels.device import kernel_device, kernel_time, op_time
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.payloads import Compute, Kernel


def _pieces(tp: int, recompute: str, sp: bool):
    """Every piece's ops of one plan of GPT-3 175B on DGX A100 (the search's piece table)."""
    cfg = build_config({"model": "gpt3-175b", "system": {"preset": "dgx-a100", "nodes": 16},
                        "parallel": {"tensor_model_parallel_size": tp,
                                     "pipeline_model_parallel_size": 4,
                                     "sequence_parallel": sp},
                        "train": {"micro_batch_size": 2, "global_batch_size": 256,
                                  "seq_length": 2048, "recompute": recompute}})
    sb = StageBuilder.from_config(cfg, cfg.model.shape())
    return cfg, [blocks.lean_ops(tuple(make(sb))) for make in blocks._PIECES.values()]


@pytest.mark.parametrize("tp, recompute, sp", [(1, "none", False), (4, "selective", True),
                                               (8, "full", True), (2, "full", False)])
def test_ops_timed_from_kernels_by_identity_as_without(tp, recompute, sp):
    cfg, pieces = _pieces(tp, recompute, sp)
    dev = kernel_device(cfg.system)
    kernel_s: dict[int, float] = {}
    blocks._time_kernels(pieces, dev, kernel_s)
    ops = [op.payload for piece in pieces for op in piece if type(op.payload) is Compute
           and op.payload.seconds is None and op.payload.contention is None]
    assert any(op.kernels for op in ops)
    got = [op_time(op, dev, memo={}, kernel_s=kernel_s) for op in ops]
    want = [op_time(op, dev) for op in ops]
    assert np.array_equal(np.array(got).view(np.int64), np.array(want).view(np.int64))
    # every kernel of those ops was timed, once per object
    assert {id(k) for op in ops for k in op.kernels or ()} <= set(kernel_s)


def test_a_kernel_takes_only_its_own_objects_seconds():
    cfg, _ = _pieces(2, "none", False)
    dev = kernel_device(cfg.system)
    k = Kernel("gemm", (2048.0, 12288.0, 3072.0), dtype="bf16")
    equal = replace(k)                  # an equal kernel, another object
    assert equal == k and equal is not k
    op = Compute("fwd.mlp", 1.0, dtype="bf16", kernels=(equal, equal))
    wrong = {id(k): 1.0}                # seconds of the other object: never read for this one
    assert op_time(op, dev, kernel_s=wrong) == op_time(op, dev)
    mine = {id(equal): kernel_time(equal, dev)}
    assert op_time(op, dev, kernel_s=mine) == op_time(op, dev)
    # a kernel not in the table is timed as without it (through the memo, where given)
    memo: dict = {}
    assert op_time(op, dev, memo=memo, kernel_s={}) == op_time(op, dev)
    assert (equal, None) in memo
