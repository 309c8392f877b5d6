"""Context parallelism's fused attention kernels at the shapes the stack launches them.

Setting (as tests/workloads/test_context_parallel.py): b = 1, s = 8192, cp = 4, 16 query heads
of d = 64 over t = 2, so each rank holds 8 heads and two chunks of c = s/(2cp) = 1024
tokens; the stack's attention is cuDNN's fused kernel. With ``n = s/128`` blocks per row, a
causal square of ``s`` computes ``(n+1)/(2n)`` of its ``s²`` scores.

Before the per-step shapes every ring step was the whole-sequence kernel scaled to ``1/cp²``
of it, so one rank's forward core did ``4·8·64·s²·(65/128)/4`` FLOPs in all; the per-step
kernels must sum to the same figure (the FLOPs do not move, only the lengths and masks at
which the measured efficiency is looked up).
"""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.simulator.kernels.attention import attention_kernels, flash_forward_flops
from ddlsim.workloads.decoder.partition import make_partitioner
from ddlsim.workloads.trace import Compute

BASE = {
    "model": {"architecture": "llama", "num_hidden_layers": 2, "hidden_size": 1024,
              "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
              "vocab_size": 32000},
    "parallel": {"tensor_model_parallel_size": 2, "context_parallel_size": 4},
    "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 8192},
    "system": {"preset": "dgx-h100", "nodes": 1},
}

S, C, HEADS, D = 8192, 1024, 8, 64
#: one rank's forward core before the per-step shapes: 4·b·heads·s²·d · causal(s) / cp
RANK_FORWARD = 4 * HEADS * S * S * D * (S / 128 + 1) / (2 * S / 128) / 4


def layer(comm: str = "p2p"):
    d = copy.deepcopy(BASE)
    d["parallel"]["cp_comm_type"] = comm
    cfg = ddlsim.load_config(d)
    part = make_partitioner(cfg, cfg.model.shape())
    return part.layer_forward(), part.layer_backward(0.0)


def core_kernels(ops, tag):
    return [k for op in ops if isinstance(op.payload, Compute)
            and op.payload.name.startswith(tag) for k in op.payload.kernels]


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_summed_kernel_flops_equal_the_whole_sequence_count(comm):
    fwd, bwd = layer(comm)
    assert sum(k.flops for k in core_kernels(fwd, "fwd.attn_core")) == \
        pytest.approx(RANK_FORWARD, rel=1e-12)
    assert sum(k.flops for k in core_kernels(bwd, "bwd.attn_core")) == \
        pytest.approx(2.5 * RANK_FORWARD, rel=1e-12)


def test_ring_step_zero_is_causal_and_later_steps_unmasked_half_queries():
    # Step 0: the rank's 2c queries on its own 2c keys, causal. Later steps of rank 0: the
    # second query chunk (c) on both key chunks (2c) of the arriving block, no mask.
    fwd, bwd = layer()
    for ops, tag, pass_ in ((fwd, "fwd.attn_core", "fwd"), (bwd, "bwd.attn_core", "bwd")):
        shapes = [(k.shape, k.variant) for k in core_kernels(ops, tag)]
        assert shapes == [((2 * C, 2 * C, D), f"cudnn/{pass_}/causal")] + \
            [((C, 2 * C, D), f"cudnn/{pass_}/full")] * 3


def test_all_gather_runs_one_causal_call_per_query_chunk():
    # Rank 0's chunks 0 and 2cp − 1 = 7: c queries on keys 0 … c, and on keys 0 … 8c = s.
    fwd, _ = layer("all_gather")
    kernels = core_kernels(fwd, "fwd.attn_core")
    assert [(k.shape, k.variant) for k in kernels] == [
        ((C, C, D), "cudnn/fwd/causal"), ((C, S, D), "cudnn/fwd/causal")]
    # (c, c) causal: 9/16 of c²; (c, s): the 7c keys before the square whole, then 9/16 of c²
    assert [k.flops for k in kernels] == [4 * HEADS * D * C * C * 9 / 16,
                                          4 * HEADS * D * (C * 7 * C + C * C * 9 / 16)]


def test_ring_kernel_traffic_counts_queries_and_keys_at_their_own_lengths():
    # Forward moves Q, O (c queries) and K, V (2c keys): 2·b·(c + 2c)·heads·d·2 bytes.
    fwd, _ = layer()
    later = core_kernels(fwd, "fwd.attn_core")[1]
    assert later.bytes == 2 * (C + 2 * C) * HEADS * D * 2


def test_bottom_right_causal_needs_at_least_as_many_keys_as_queries():
    assert flash_forward_flops(1, 1, 256, 64, True, s_k=256) == 4 * 256 * 256 * 64 * 3 / 4
    assert flash_forward_flops(1, 1, 128, 64, True, s_k=384) == 4 * 64 * 128 * (256 + 128)
    with pytest.raises(ValueError, match="s_k >= s"):
        flash_forward_flops(1, 1, 512, 64, True, s_k=256)


def test_unfused_kernels_refuse_a_key_length_of_their_own():
    with pytest.raises(ValueError, match="only the fused kinds"):
        attention_kernels("fused_softmax", 1, 8, 1024, 64, 2, False, False, s_k=2048)


def test_torch_all_gather_rotation_runs_the_ring_steps_in_one_core():
    # torch's _AllGatherRotater gathers K/V once and feeds _templated_ring_attention's steps:
    # one causal (2c, 2c) call and cp − 1 unmasked (c, 2c) calls, FLOPs as the ring's.
    d = copy.deepcopy(BASE)
    d["parallel"]["cp_comm_type"] = "all_gather"
    d["system"]["software"] = "torchtitan-2024"
    d["parallel"]["zero_stage"] = 3
    cfg = ddlsim.load_config(d)
    part = make_partitioner(cfg, cfg.model.shape())
    kernels = core_kernels(part.layer_forward(), "fwd.attn_core")
    assert [(k.shape, k.variant) for k in kernels] == \
        [((2 * C, 2 * C, D), "flash2/fwd/causal")] + [((C, 2 * C, D), "flash2/fwd/full")] * 3
    assert sum(k.flops for k in kernels) == pytest.approx(RANK_FORWARD, rel=1e-12)
