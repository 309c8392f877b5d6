"""DeepSeek's config.json balancing keys read into the plan (hf_router.router_balancing through the
model section's seq_aux, scoring_func and topk_method): DeepSeek-V3 runs the expert bias with
a sequence-wise loss and a sigmoid router, DeepSeek-V2 a sequence-wise loss of 0.001, and the
bundled V3's warning no longer names aux_loss_alpha (issues 28, 29)."""

from __future__ import annotations

import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.decoder import moe_balance as mb
from ddlsim.workloads.decoder.moeplan import resolve_moe

#: a preset cut to 5 layers (V3: 3 dense, 2 MoE), EP 8 on one DGX H100, dropless
RUN = {"model": {"num_hidden_layers": 5},
       "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                    "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
       "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
       "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}


def load(preset: str, moe: dict | None = None) -> tuple[ddlsim.RunConfig, list[str]]:
    d = {**RUN, "model": {**RUN["model"], "preset": preset},
         "parallel": {**RUN["parallel"], "moe": {**RUN["parallel"]["moe"], **(moe or {})}}}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cfg = ddlsim.load_config(d)
    return cfg, [str(w.message) for w in record if "not modelled by ddlsim" in str(w.message)]


def test_deepseek_v3_runs_the_expert_bias_with_a_sequence_loss():
    cfg, notes = load("deepseek-v3")
    plan = resolve_moe(cfg)
    assert (plan.expert_bias, plan.score_function, plan.balancing) == (
        True, "sigmoid", "seq_aux_loss")
    assert plan.aux_loss_coeff == 0.001 and plan.aux_loss        # the file's aux_loss_alpha
    assert plan.sources["router_enable_expert_bias"] == "model.topk_method"
    expected = mb.hot_rank_load(256, 8, 8, 8 * 4096, mb.MAXVIO_GLOBAL_BIAS)
    assert (plan.imbalance, plan.imbalance_basis) == (pytest.approx(expected), "derived")
    line = cfg.family.plan_summary(cfg)
    assert "expert-bias router (router_imbalance" in line and "seq aux loss 0.001" in line
    (note,) = notes
    assert "aux_loss_alpha" not in note and "num_nextn_predict_layers" in note


def test_the_plan_still_overrides_the_model():
    cfg, _ = load("deepseek-v3", {"router_enable_expert_bias": False,
                                  "router_load_balancing_type": "aux_loss",
                                  "aux_loss_coeff": 0.0})
    plan = resolve_moe(cfg)
    assert not plan.expert_bias and not plan.aux_loss and plan.score_function == "sigmoid"
    assert plan.imbalance_basis == "assumed"
    with pytest.raises(ConfigError, match="needs the sigmoid or sqrtsoftplus"):
        load("deepseek-v3", {"router_score_function": "softmax"})


@pytest.mark.parametrize("preset", ["deepseek-v2", "deepseek-v2-lite"])
def test_deepseek_v2_runs_a_sequence_loss_of_its_alpha(preset):
    cfg, notes = load(preset)
    plan = resolve_moe(cfg)
    assert (plan.expert_bias, plan.score_function, plan.balancing, plan.aux_loss_coeff) == (
        False, "softmax", "seq_aux_loss", 0.001)
    assert plan.imbalance_basis == "derived" and notes == []
