"""Megatron-Core 2024's DDP passes and host waits on both gradient buffers of an MoE plan
whose experts are split (EP >= 2): the dense buffer reduced over DP, the experts'
``expert_parallel_buffers`` over the expert-data-parallel group, each running the same
``start_grad_sync`` (NaN check's norm and 1/DP scaling per bucket) and ``zero_()``
(Megatron-LM core_r0.8.0 baf94af3, megatron/core/distributed/distributed_data_parallel.py
lines 167-171 and 237-282). Bytes and waits counted from the trace's own collectives.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.trace import Collective, Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _ops(ep: int, overlap: bool) -> list:
    data = {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2, "hidden_size": 1024,
                      "intermediate_size": 2048, "num_attention_heads": 16,
                      "num_key_value_heads": 8, "vocab_size": 32768},
            "parallel": {"data_parallel_size": 8, "expert_model_parallel_size": ep,
                         "zero_stage": 1, "overlap_grad_reduce": overlap},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2024"}}}
    w = ddlsim.build_workload(ddlsim.load_config(data))
    prog = w.classes[0].program
    return [op for step in prog.steps for op in prog.blocks[step.block].flat.ops]


def _sum(ops, name: str, repeat: bool = True) -> float:
    return sum((o.payload.bytes if isinstance(o.payload, (Compute, Collective)) else 1)
               * (o.repeat if repeat else 1) for o in ops if o.payload.name == name)


@pytest.mark.parametrize("overlap", [True, False])
def test_an_ep2_plan_pays_the_passes_on_both_buffers(overlap):
    """4 passes (3 per bucket, 1 zero_()) over every reduced gradient byte, dense and
    expert alike, and one NaN-check wait per bucket of either buffer."""
    ops = _ops(2, overlap)
    dense = _sum(ops, "grad.reduce_scatter")
    expert = _sum(ops, "grad.expert.reduce_scatter")
    assert dense > 0 and expert > 0
    passes = _sum(ops, "grad.ddp_passes") + _sum(ops, "grad.bucket_passes")
    assert passes == pytest.approx(4 * (dense + expert))
    zero = [o.payload for o in ops if o.payload.name == "grad.ddp_passes"]
    assert len(zero) == 2                       # one op per buffer
    buckets = sum(o.repeat for o in ops if isinstance(o.payload, Collective)
                  and o.payload.name.startswith("grad.") and o.payload.name.endswith("scatter"))
    waits = sum(o.repeat for o in ops if o.payload.name == "bucket.sync")
    assert waits == buckets >= 2
    assert sum(o.repeat for o in ops if o.payload.name == "grad_norm.sync") == 1


def test_ep1_and_ep2_pay_the_same_passes():
    """The same model's gradients (the same bytes per rank at EP 1; at EP 2 half the
    experts' on a rank) pay 4 passes per reduced byte either way: one physics."""
    for ep in (1, 2):
        ops = _ops(ep, True)
        reduced = _sum(ops, "grad.reduce_scatter") + _sum(ops, "grad.expert.reduce_scatter")
        passes = _sum(ops, "grad.ddp_passes") + _sum(ops, "grad.bucket_passes")
        assert passes == pytest.approx(4 * reduced)
