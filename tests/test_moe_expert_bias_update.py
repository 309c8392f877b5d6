"""Auxiliary-loss-free balancing's per-step bias update in a stage's update block
(decoder/moe_bias_update.py; Megatron-LM d98e8a64 finalize_model_grads.py lines 334-371,
682-692, moe_utils.py get_updated_expert_bias lines 1199-1229)."""

from __future__ import annotations

import warnings

import pytest

import ddlsim
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.decoder.moe_bias_update import bias_update_ops, with_bias_update
from ddlsim.workloads.decoder.plan import resolve_plan

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def builder(bias: bool = True, tp: int = 2, pp: int = 2, cp: int = 1) -> StageBuilder:
    """Qwen3-30B-A3B cut to 4 layers (2 per stage) on two DGX H100s, EP 4, a sigmoid router."""
    moe = {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
           "router_score_function": "sigmoid", "router_enable_expert_bias": bias}
    d = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 4},
         "parallel": {"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1,
                      "pipeline_model_parallel_size": pp, "context_parallel_size": cp,
                      "expert_model_parallel_size": 4, "moe": moe},
         "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 2, "software": "megatron-core-2025"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config(d)
    return StageBuilder(resolve_plan(cfg, cfg.model.shape()))


def _names(block) -> list:
    return [getattr(o.payload, "name", None) for o in block.ops]


def test_the_update_all_reduces_the_stage_counts_before_the_step():
    """2 MoE layers × 128 experts × 4 B over DP (4 ranks) and TP (2), then 8 + 2·2 kernels,
    on the compute stream just before the optimizer step."""
    b = builder()
    block = with_bias_update(b, b.update_block(0, True, True), 0)
    names = _names(block)
    at = names.index("optimizer")
    assert names[at - 3:at] == ["expert_bias.all_reduce.dp", "expert_bias.all_reduce.tp",
                                "expert_bias.update"]
    reduces = [o.payload for o in block.ops[at - 3:at - 1]]
    assert [(c.op, c.group, c.bytes) for c in reduces] == [
        ("all_reduce", "dp", 4.0 * 2 * 128), ("all_reduce", "tp", 4.0 * 2 * 128)]
    assert len(block.ops[at - 1].payload.kernels) == 8 + 2 * 2
    assert all(o.stream == "compute" for o in block.ops[at - 3:at])


def test_context_parallelism_joins_the_group():
    names = [o.payload.name for o in bias_update_ops(builder(tp=1, pp=1, cp=2), 0)]
    assert names == ["expert_bias.all_reduce.dp", "expert_bias.all_reduce.cp",
                     "expert_bias.update"]


def test_no_bias_no_update():
    b = builder(bias=False)
    block = b.update_block(0, True, True)
    assert bias_update_ops(b, 0) == [] and with_bias_update(b, block, 0) is block


def test_the_update_is_in_the_trace_and_costs_time():
    """Built into every stage's update block (decoder/build.py ``_stage_update``): at ρ given
    1 the iteration with the bias (its router kernels and this update) takes longer than
    without it."""
    d = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 4},
         "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                      "pipeline_model_parallel_size": 2, "expert_model_parallel_size": 4,
                      "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                              "router_score_function": "sigmoid",
                              "router_enable_expert_bias": True, "router_imbalance": 1.0}},
         "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 2, "software": "megatron-core-2025"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on = ddlsim.load_config(d)
        d["parallel"]["moe"]["router_enable_expert_bias"] = False
        off = ddlsim.load_config(d)
    update = ddlsim.build_workload(on).classes[0].program.blocks["update"]
    assert "expert_bias.all_reduce.dp" in _names(update)
    assert ddlsim.predict(on).iteration_time_s > ddlsim.predict(off).iteration_time_s
