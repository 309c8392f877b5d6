"""Under the combined 1F1B the flex dispatcher's first host wait follows the communication
stream too: DeepEP's and HybridEP's dispatch run on the dispatch node's stream after its earlier
work (the paired backward's combine), and the host polls the counts they compute
(``decoder/combined.py`` ``_merge``, docs/moe.md). The alltoall dispatcher's wait is for an
event of the compute stream only."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.trace import Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

DEEPEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"}
ALLTOALL = {"token_dispatcher_type": "alltoall"}


def _cfg(dispatcher: dict) -> dict:
    """Qwen3-30B-A3B cut to two layers on one DGX H100, EP8, four micro-batches, the combined
    1F1B with delayed weight gradients (PP 1)."""
    moe = {**dispatcher, "grouped_gemm": True, "permute_fusion": True,
           "router_force_load_balancing": True, "overlap_expert_parallel_comm": True,
           "delay_wgrad_compute": True}
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
                         "moe": moe},
            "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 4096,
                      "dtype": "bf16", "recompute": "none"},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def _combined_block(cfg: dict):
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    blocks = w.classes[0].program.blocks
    name = next(n for n in blocks if n.startswith("C"))
    return blocks[name].flat.ops


def _first_syncs(ops) -> list[int]:
    """Indices of each forward dispatch node's first host wait (the router's)."""
    out, seen_issue = [], False
    for i, op in enumerate(ops):
        p = op.payload
        if type(p) is Compute and op.stream == "host" and p.name.endswith("dispatch.sync"):
            if not seen_issue:
                out.append(i)
            seen_issue = True
        elif type(p) is Compute and op.stream == "host" and p.name.endswith(".moe.host.te"):
            seen_issue = False          # the layer's work: the next sync opens a new layer
    return out


def _last_comm_before(ops, i: int) -> int:
    return max(j for j in range(i) if ops[j].stream == "ep")


def test_deepep_first_wait_follows_the_paired_backward_combine():
    ops = _combined_block(_cfg(DEEPEP))
    syncs = _first_syncs(ops)
    assert syncs
    for i in syncs:
        j = _last_comm_before(ops, i)
        assert j in ops[i].deps
        assert ops[j].payload.name.startswith("bwd.")     # the backward's combine gradient


def test_alltoall_wait_does_not_follow_the_communication_stream():
    ops = _combined_block(_cfg(ALLTOALL))
    syncs = _first_syncs(ops)
    assert syncs
    for i in syncs:
        assert _last_comm_before(ops, i) not in ops[i].deps


def test_the_wait_can_only_lengthen_the_step():
    from ddlsim.workloads.decoder import combined
    with_wait = ddlsim.predict(_cfg(DEEPEP), "analytical").iteration_time_s
    merge = combined._merge

    def without(order, ops, cont=None, wait_on_comm=False):
        return merge(order, ops, cont, False)

    combined._merge = without
    try:
        without_wait = ddlsim.predict(_cfg(DEEPEP), "analytical").iteration_time_s
    finally:
        combined._merge = merge
    assert with_wait >= without_wait
