"""What each software stack can run (ddlsim/stackrules/, the `rules:` of software.yaml):
refused by predict with the stack, the rule and its source, run as an explicit what-if, and
rejected by the search through the same rule objects."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.plans import enumerate_plans
from ddlsim.search.spec import Constraints
from ddlsim.software import stacks
from ddlsim.stackrules import PlanFacts, broken_rules, rules, stack_rules
from ddlsim.sweeps import _setting

#: gpt3-1.3b (24 layers, 32 heads) on one DGX A100: TP2 × PP2 × DP2
BASE = {"model": "gpt3-1.3b",
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
        "system": {"preset": "dgx-a100", "nodes": 1}}


def _cfg(*sets: str):
    return build_config(copy.deepcopy(BASE), list(sets))


def _what_if(stack: str) -> str:
    return f"system.software={{stack: {stack}, what_if: true}}"


def test_every_stack_declares_registered_rules_with_sources():
    used = set()
    for stack in stacks():
        declared = stack_rules(stack)
        assert declared, stack
        for rule, source in declared:
            assert len(source) > 40 and any(c.isdigit() for c in source), (stack, rule.name)
            used.add(rule.name)
    assert used == set(rules())   # no rule registered that no stack declares


@pytest.mark.parametrize("sets, stack, rule", [
    (["parallel.zero_stage=2"], "megatron-core-2024", "distributed_optimizer_is_zero1"),
    (["parallel.zero_stage=1", "system.software=megatron-lm-2021"], "megatron-lm-2021",
     "no_distributed_optimizer"),
    (["parallel.sequence_parallel=true", "system.software=megatron-lm-2021"],
     "megatron-lm-2021", "no_sequence_parallel"),
    (["parallel.zero_stage=2", "system.software=deepspeed"], "deepspeed", "pipeline_zero"),
    (["parallel.schedule=gpipe", "system.software=deepspeed"], "deepspeed",
     "pipeline_1f1b_only"),
    (["parallel.schedule=interleaved", "parallel.virtual_pipeline_model_parallel_size=2",
      "parallel.overlap_p2p_comm=false"], "megatron-core-2024",
     "interleaved_blocking_needs_pp3"),
    (["parallel.schedule=interleaved", "parallel.virtual_pipeline_model_parallel_size=2",
      "system.software=megatron-lm-2021"], "megatron-lm-2021", "interleaved_needs_pp3"),
    (["parallel.tp_comm_overlap=torch_async", "parallel.sequence_parallel=true"],
     "megatron-core-2024", "no_torch_async_tp"),
    (["parallel.tp_comm_overlap=torch_async", "parallel.sequence_parallel=true",
      "system.software=megatron-core-2025"], "megatron-core-2025", "no_torch_async_tp"),
    (["parallel.context_parallel_size=2", "parallel.cp_comm_type=all_gather"],
     "megatron-core-2024", "no_cp_all_gather"),
])
def test_predict_refuses_what_the_stack_cannot_run(sets, stack, rule):
    """The message names the stack, the rule, the plan's values, the source and the opt-in;
    the same plan as a what-if is predicted, and the result says so."""
    with pytest.raises(ConfigError) as exc:
        _cfg(*sets)
    text = str(exc.value)
    assert f"software stack {stack!r} cannot run" in text and f"rule {rule}" in text
    source = dict((r.name, s) for r, s in stack_rules(stack))[rule]
    assert source in text and "what_if: true" in text
    cfg = _cfg(*[s for s in sets if not s.startswith("system.software")], _what_if(stack))
    assert [r.name for r, _ in broken_rules(cfg)][0] == rule
    result = ddlsim.predict(cfg, check_fit=False)
    assert result.extra["what_if"].startswith(f"what-if: {stack} cannot run")
    assert result.iteration_time_s > 0


def test_what_if_changes_no_figure():
    """A plan the stack runs predicts the same bit for bit with or without what_if."""
    plain = ddlsim.predict(_cfg("parallel.zero_stage=1"))
    marked = ddlsim.predict(_cfg("parallel.zero_stage=1", _what_if("megatron-core-2024")))
    assert plain.iteration_time_s == marked.iteration_time_s
    assert "what_if" not in plain.extra and "what_if" not in marked.extra


def test_the_stacks_run_what_their_frameworks_run():
    _cfg("parallel.zero_stage=2", "parallel.pipeline_model_parallel_size=1",
         "system.software=deepspeed")                      # DeepSpeed: ZeRO-2 without a pipeline
    _cfg("parallel.zero_stage=1", "system.software=deepspeed")   # ZeRO-1 with its pipeline
    _cfg("parallel.schedule=interleaved", "parallel.virtual_pipeline_model_parallel_size=2")
    _cfg("parallel.zero_stage=1", "parallel.sequence_parallel=true")


def test_cli_predict_refuses_in_one_paragraph_and_runs_the_what_if(tmp_path):
    runner = CliRunner()
    path = tmp_path / "run.yaml"
    import yaml
    path.write_text(yaml.safe_dump(BASE))
    bad = runner.invoke(app, ["predict", str(path), "--set", "parallel.zero_stage=2"])
    assert bad.exit_code == 2 and "error:" in bad.output and "Traceback" not in bad.output
    assert "distributed_optimizer_is_zero1" in bad.output
    ok = runner.invoke(app, ["predict", str(path), "--set", "parallel.zero_stage=2",
                             "--set", _what_if("megatron-core-2024")])
    assert ok.exit_code == 0, ok.output
    assert "WHAT-IF" in ok.output and "distributed_optimizer_is_zero1" in ok.output


def test_memory_advice_proposes_no_plan_the_stack_cannot_run():
    """An OOM plan's alternatives are built as configs, so none breaks the stack's rules."""
    from ddlsim.api import memory_alternatives
    cfg = build_config({"model": "gpt3-13b", "parallel": {"pipeline_model_parallel_size": 2},
                        "train": {"micro_batch_size": 4, "global_batch_size": 64,
                                  "seq_length": 2048},
                        "system": {"preset": "dgx-a100", "nodes": 1}})
    changes = [text for text, _ in memory_alternatives(cfg, limit=20)]
    assert changes and not any("zero_stage = 2" in c for c in changes)
    assert any("zero_stage = 1" in c for c in changes)


# ------------------------------------------------------------------- one rule, two forms
def test_rules_on_arrays_equal_rules_on_configs():
    """Each rule on the arrays of every combination (the search's form) equals the rule on
    each combination alone (0-d arrays, the form PlanFacts.of_config gives a RunConfig)."""
    combos = list(itertools.product([1, 2], [1, 2, 4], [0, 1, 2, 3], [False, True],
                                    ["1f1b", "interleaved", "gpipe"], [False, True]))
    cols = list(zip(*combos))
    facts = PlanFacts.of(tp=np.array(cols[0]), pp=np.array(cols[1]), cp=np.ones(len(combos)),
                         zero=np.array(cols[2]), sp=np.array(cols[3]),
                         interleaved=np.array([s == "interleaved" for s in cols[4]]),
                         one_f_one_b=np.array([s == "1f1b" for s in cols[4]]),
                         p2p_overlap=np.array(cols[5]))
    for rule in rules().values():
        on_arrays = np.broadcast_to(rule.rejects(facts), (len(combos),))
        for k, (tp, pp, zero, sp, sched, p2p) in enumerate(combos):
            one = PlanFacts.of(tp=tp, pp=pp, cp=1, zero=zero, sp=sp,
                               interleaved=sched == "interleaved", one_f_one_b=sched == "1f1b",
                               p2p_overlap=p2p)
            assert bool(rule.rejects(one)) == bool(on_arrays[k]), (rule.name, combos[k])


GRID = {"parallel.tensor_model_parallel_size": [1, 2],
        "parallel.pipeline_model_parallel_size": [1, 2, 4],
        "parallel.virtual_pipeline_model_parallel_size": [None, 2],
        "parallel.sequence_parallel": [False, True],
        "parallel.zero_stage": [0, 1, 2, 3]}


@pytest.mark.parametrize("stack, extra_axes", [
    ("megatron-core-2024", {}),
    ("megatron-lm-2021", {}),
    ("deepspeed", {"parallel.schedule": ["1f1b", "gpipe", "interleaved"]}),
    ("megatron-core-2024", {"parallel.overlap_p2p_comm": [False, True]}),
    ("megatron-core-2024", {"parallel.schedule": ["interleaved"]}),
])
def test_search_rejects_exactly_what_building_the_config_refuses(stack, extra_axes):
    """Every plan of a grid on 8 GPUs: evaluated by the search iff build_config accepts it
    (the stack's rules, the overlap options and the schedule axes included)."""
    data = copy.deepcopy(BASE)
    data["system"]["software"] = stack
    axes = {**GRID, **extra_axes}
    grid = evaluate_grid(data, None, [], axes, Constraints(must_fit=False))
    valid = set(grid.frame["plan"].tolist())
    fields = {"parallel.tensor_model_parallel_size": 1, "parallel.pipeline_model_parallel_size": 1,
              "parallel.data_parallel_size": None,
              "parallel.virtual_pipeline_model_parallel_size": None,
              "parallel.sequence_parallel": False, "parallel.zero_stage": 0,
              "train.micro_batch_size": 1, "train.global_batch_size": 16,
              "train.recompute": "none", "parallel.schedule": "1f1b"}
    plans = enumerate_plans(axes, fields, 8)
    assert grid.total == len(plans) and 0 < len(valid) < len(plans)
    for i in range(len(plans)):
        sets = [_setting(p, v) for p, v in plans.overrides(i).items()]
        try:
            build_config(data, sets)
            ok = True
        except ConfigError:
            ok = False
        assert ok == (i in valid), (i, sets)
    if stack == "megatron-core-2024" and not extra_axes:
        reason = ("megatron-core-2024 cannot run ZeRO-2 (its distributed optimizer shards the "
                  "optimizer state, not the gradients) (rule distributed_optimizer_is_zero1)")
        assert grid.rejected[reason] > 0
        # ZeRO-3: the stack's rule is the reason, as predict gives it (not the FSDP model's
        # limit on a plan this stack cannot run at all)
        assert any("(rule no_zero3)" in r for r in grid.rejected), grid.rejected
        assert not any("is not modelled" in r for r in grid.rejected), grid.rejected


# ------------------------------------------------------------ the search's context bugs
def test_overlap_p2p_comm_axis_keeps_its_pipelined_plans():
    """issue #27: every plan with overlap_p2p_comm: true was rejected as 'PP is 1' (the
    context was built on a one-device plan); now the interleaved plans at PP > 1 are
    evaluated, and only the plans predict refuses are rejected, with predict's reason."""
    axes = {"parallel.pipeline_model_parallel_size": [1, 4],
            "parallel.virtual_pipeline_model_parallel_size": [None, 2],
            "parallel.overlap_p2p_comm": [True]}
    data = copy.deepcopy(BASE)
    grid = evaluate_grid(data, None, [], axes, Constraints(must_fit=False))
    frame = grid.frame
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row["parallel.pipeline_model_parallel_size"], row["parallel.schedule"]) == \
        (4, "interleaved")
    assert any("pipeline_model_parallel_size is 1" in r for r in grid.rejected)
    assert any("needs the interleaved schedule" in r for r in grid.rejected)
    cfg = build_config(data, [_setting(p, v) for p, v in
                              {"parallel.pipeline_model_parallel_size": 4,
                               "parallel.virtual_pipeline_model_parallel_size": 2,
                               "parallel.schedule": "interleaved",
                               "parallel.overlap_p2p_comm": True}.items()])
    assert row["iteration_time_s"] == pytest.approx(
        ddlsim.predict(cfg, check_fit=False).iteration_time_s, rel=0.03)


def test_interleaved_schedule_axis_with_a_vpp_axis():
    """issue #27: axes schedule: [interleaved] and VPP: [2] were rejected as 'needs VPP >= 2
    (got None)'; they are one valid plan per pipeline size that can interleave."""
    axes = {"parallel.pipeline_model_parallel_size": [2, 4],
            "parallel.schedule": ["interleaved"],
            "parallel.virtual_pipeline_model_parallel_size": [2]}
    grid = evaluate_grid(copy.deepcopy(BASE), None, [], axes, Constraints(must_fit=False))
    assert sorted(grid.frame["parallel.pipeline_model_parallel_size"]) == [2, 4]
    assert grid.rejected == {}


def test_a_context_no_plan_can_run_keeps_its_reason():
    """fp8 has no peak on an A100: every plan of that context is rejected with the config's
    message (now judged through the config once per structural combination)."""
    axes = {"train.dtype": ["bf16", "fp8"], "parallel.tensor_model_parallel_size": [1, 2]}
    grid = evaluate_grid(copy.deepcopy(BASE), None, [], axes, Constraints(must_fit=False))
    assert set(grid.frame["train.dtype"]) == {"bf16"}
    assert sum(c for r, c in grid.rejected.items() if "fp8" in r) == 2


def test_a_what_if_search_ranks_and_marks_the_plans_the_stack_cannot_run():
    """Under what_if: true the stack's rules reject nothing, and the frame says which plans
    are what-ifs (the rule objects again): here the ZeRO-2 ones."""
    axes = {"parallel.zero_stage": [0, 1, 2]}
    strict = evaluate_grid(copy.deepcopy(BASE), None, [], axes, Constraints(must_fit=False))
    data = copy.deepcopy(BASE)
    data["system"]["software"] = {"stack": "megatron-core-2024", "what_if": True}
    loose = evaluate_grid(data, None, [], axes, Constraints(must_fit=False))
    assert len(strict.frame) == 2 and "what_if" not in strict.frame
    assert len(loose.frame) == 3
    marked = loose.frame.set_index("parallel.zero_stage")["what_if"]
    assert marked.to_dict() == {0: False, 1: False, 2: True}


@pytest.mark.parametrize("plan, rule", [
    ({"tensor_model_parallel_size": 2, "data_parallel_size": 4}, "no_tensor_parallel"),
    ({"pipeline_model_parallel_size": 2, "data_parallel_size": 4, "zero_stage": 0},
     "no_pipeline_parallel")])
def test_fms_fsdp_runs_fsdp_alone(plan, rule):
    """fms-fsdp's pre-training wraps the model in FSDP and nothing else: TP and PP refused by
    name, in predict and in search alike; FSDP over all 8 ranks runs."""
    d = {"model": "llama-2-7b", "parallel": {"zero_stage": 3, **plan},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
         "system": {"preset": "dgx-a100", "nodes": 1, "software": "fms-fsdp-2024"}}
    with pytest.raises(ConfigError, match=rf"cannot run .* \(rule {rule};"):
        build_config(copy.deepcopy(d))
    d["parallel"] = {"zero_stage": 3, "data_parallel_size": 8}
    build_config(copy.deepcopy(d))
    axes = {"parallel.tensor_model_parallel_size": [1, 2],
            "parallel.pipeline_model_parallel_size": [1, 2], "parallel.zero_stage": [0, 3]}
    grid = evaluate_grid(d, None, [], axes, Constraints(must_fit=False))
    assert set(grid.frame["parallel.tensor_model_parallel_size"]) == {1}
    assert set(grid.frame["parallel.pipeline_model_parallel_size"]) == {1}
    assert any(f"(rule {rule})" in r for r in grid.rejected), grid.rejected


# ------------------------------------------- the audit of deepspeed, deepspeed-2021, mcore-2025
#: gpt3-1.3b on one DGX A100 (DP 8), fp16 (DeepSpeed v0.3.13's ZeRO), no pipeline
DENSE = {"model": "gpt3-1.3b", "parallel": {},
         "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024,
                   "dtype": "fp16"},
         "system": {"preset": "dgx-a100", "nodes": 1}}
#: Mixtral 8x7B (8 experts) on two DGX H100
MOE = {"model": "mixtral-8x7b", "parallel": {"expert_model_parallel_size": 2},
       "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
       "system": {"preset": "dgx-h100", "nodes": 2}}
#: Llama 3.1 8B on one DGX H100
LLAMA = {"model": "llama-3.1-8b", "parallel": {},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 1}}
#: a small Nemotron-4 (squared ReLU, no biases) on one DGX A100
NEMOTRON = {"model": {"architecture": "nemotron", "name": "nemotron-small", "num_hidden_layers": 8,
                      "hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 4096,
                      "vocab_size": 32000, "max_position_embeddings": 1024},
            "parallel": {},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-a100", "nodes": 1}}

AUDITED = [
    # (stack, base, plan's settings, rule)
    ("deepspeed", DENSE, ["parallel.tensor_model_parallel_size=2", "train.dtype=fp8",
                          "system.preset=dgx-h100",
                          "system.software.kernels.fp8_recipe=te_current"],
     "no_te_current_scaling"),
    ("deepspeed", DENSE, ["train.dtype=fp8", "system.preset=dgx-h100",
                          "system.software.kernels.fp8_recipe=tensorwise"], "no_torchao_float8"),
    ("deepspeed", DENSE, ["parallel.tensor_model_parallel_size=2",
                          "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=bulk"],
     "no_te_tp_overlap"),
    ("deepspeed", DENSE, ["parallel.pipeline_model_parallel_size=2",
                          "parallel.num_layers_in_first_pipeline_stage=10"],
     "no_megatron_uneven_split"),
    ("deepspeed", DENSE, ["parallel.zero_stage=1", "parallel.overlap_param_gather=true"],
     "no_param_gather_overlap"),
    ("deepspeed", DENSE, ["parallel.schedule=gpipe"], "pipeline_1f1b_only"),
    ("deepspeed", DENSE, ["system.software.kernels.host_dispatch=cuda_graphs"], "no_cuda_graphs"),
    ("deepspeed", MOE, ["parallel.zero_stage=3"], "zero3_no_moe"),
    ("deepspeed", MOE, ["parallel.expert_model_parallel_size=8",
                        "parallel.tensor_model_parallel_size=4",
                        "parallel.expert_tensor_parallel_size=1"], "moe_ep_divides_dp"),
    ("deepspeed", MOE, ["parallel.tensor_model_parallel_size=4",
                        "parallel.sequence_parallel=true",
                        "parallel.expert_tensor_parallel_size=2"], "expert_tp_is_tp_or_one"),
    ("deepspeed", MOE, ["parallel.moe={token_dispatcher_type: allgather}"],
     "no_allgather_dispatcher"),
    ("deepspeed", MOE, ["parallel.moe={grouped_gemm: true}"], "no_grouped_gemm"),
    ("deepspeed", MOE, ["parallel.moe={permute_fusion: true}"], "no_permute_fusion"),
    ("deepspeed-2021", DENSE, ["parallel.zero_stage=1", "train.dtype=bf16"], "zero_needs_fp16"),
    ("deepspeed-2021", DENSE, ["train.dtype=fp8", "system.preset=dgx-h100"], "no_fp8"),
    ("deepspeed-2021", DENSE, ["parallel.pipeline_model_parallel_size=2",
                               "parallel.schedule=gpipe"], "pipeline_1f1b_only"),
    ("deepspeed-2021", DENSE, ["train.recompute=selective"], "no_selective_recompute"),
    # TE's TP overlap needs SP, which this stack lacks too (rule no_sequence_parallel first)
    ("deepspeed-2021", DENSE, ["parallel.tensor_model_parallel_size=2",
                               "parallel.sequence_parallel=true",
                               "parallel.tp_comm_overlap=pipelined"], "no_te_tp_overlap"),
    ("deepspeed-2021", DENSE, ["parallel.pipeline_model_parallel_size=2",
                               "parallel.num_layers_in_last_pipeline_stage=10"],
     "no_megatron_uneven_split"),
    ("deepspeed-2021", DENSE, ["parallel.zero_stage=2", "parallel.overlap_param_gather=true"],
     "no_param_gather_overlap"),
    ("deepspeed-2021", DENSE, ["system.software.kernels.compile=true"], "no_torch_compile"),
    ("deepspeed-2021", DENSE, ["system.software.kernels.host_dispatch=cuda_graphs"],
     "no_cuda_graphs"),
    ("deepspeed-2021", MOE, ["train.dtype=fp16", "parallel.moe={token_dispatcher_type: "
                             "alltoall, grouped_gemm: false, permute_fusion: false}"], "no_moe"),
    ("megatron-core-2025", LLAMA, ["parallel.zero_stage=3"], "fsdp2_no_grad_accum_fusion"),
    ("megatron-core-2025", LLAMA, ["parallel.zero_stage=3", "train.dtype=fp16",
                                   "system.software.kernels.gradient_accumulation_fusion=false"],
     "fsdp2_no_fp16"),
    ("megatron-core-2025", DENSE, ["parallel.zero_stage=3", "train.dtype=bf16",   # GPT-3: tied
                                   "system.software.kernels.gradient_accumulation_fusion=false"],
     "fsdp2_needs_untied_embeddings"),
    ("megatron-core-2025", LLAMA, ["parallel.schedule=gpipe"], "no_gpipe"),
    ("megatron-core-2025", LLAMA, ["system.software.kernels.compile=true"], "no_torch_compile"),
    # the audit of 2026-12-01 of megatron-core-2024 against Megatron-LM 900f1b76
    ("megatron-core-2024", LLAMA, ["parallel.schedule=gpipe"], "no_gpipe"),
    ("megatron-core-2024", LLAMA, ["system.software.kernels.compile=true"], "no_torch_compile"),
    ("megatron-core-2024", LLAMA, ["parallel.pipeline_model_parallel_size=2",
                                   "parallel.num_layers_in_first_pipeline_stage=14"],
     "no_megatron_uneven_split"),
    ("megatron-core-2024", MOE, ["parallel.moe={permute_fusion: true}"], "no_permute_fusion"),
    ("megatron-core-2024", MOE, ["parallel.moe={grouped_gemm: true}", "train.dtype=fp16",
                                 "parallel.expert_model_parallel_size=1"],
     "grouped_gemm_needs_bf16"),
    ("megatron-core-2024", MOE, ["train.dtype=fp16"], "moe_ep_no_fp16"),
    ("megatron-core-2024", MOE, ["model.capacity_factor=1.25"], "capacity_needs_alltoall"),
    ("megatron-core-2024", MOE, ["parallel.moe={router_load_balancing_type: seq_aux_loss}"],
     "no_seq_aux_loss"),
    ("megatron-core-2024", MOE, ["parallel.moe={router_score_function: sigmoid}"],
     "no_router_score_function"),
    ("megatron-core-2024", MOE, ["parallel.moe={router_score_function: sigmoid, "
                                 "router_enable_expert_bias: true}"], "no_expert_bias"),
    ("megatron-core-2024", MOE, ["parallel.moe={router_num_groups: 2, router_group_topk: 1}"],
     "no_group_limited_routing"),
    ("megatron-core-2024", MOE, ["parallel.moe={router_dtype: fp32}"], "no_router_dtype"),
    ("megatron-core-2024", MOE, ["parallel.moe={router_force_load_balancing: true}"],
     "no_forced_balance"),
    ("megatron-core-2024", MOE, ["model=deepseek-v2-lite", "parallel.expert_model_parallel_size=8"],
     "no_shared_experts"),
    ("megatron-core-2024", MOE, ["model=deepseek-v2-lite", "parallel.expert_model_parallel_size=8"],
     "no_mla"),
    ("megatron-lm-2021", DENSE, ["train.dtype=fp8", "system.preset=dgx-h100"], "no_fp8"),
    ("megatron-lm-2021", DENSE, ["train.recompute=selective"], "no_selective_recompute"),
    ("megatron-lm-2021", MOE, ["train.dtype=fp16", "parallel.moe={token_dispatcher_type: "
                               "alltoall, grouped_gemm: false, permute_fusion: false, "
                               "overlap_expert_parallel_comm: false, delay_wgrad_compute: false}"],
     "no_moe"),
    # the audit of 2026-12-01 of megatron-lm-2021 against Megatron-LM 6985e58
    ("megatron-lm-2021", DENSE, ["parallel.pipeline_model_parallel_size=2",
                                 "parallel.schedule=gpipe"], "no_gpipe"),
    ("megatron-lm-2021", DENSE, ["parallel.schedule=gpipe"], "no_gpipe"),
    ("megatron-lm-2021", DENSE, ["parallel.pipeline_model_parallel_size=2",
                                 "parallel.num_layers_in_first_pipeline_stage=10"],
     "no_megatron_uneven_split"),
    ("megatron-lm-2021", DENSE, ["system.software.kernels.compile=true"], "no_torch_compile"),
    ("megatron-lm-2021", DENSE, ["system.software.kernels.host_dispatch=cuda_graphs"],
     "no_cuda_graphs"),
    # TE's TP overlap needs SP, which this stack lacks too (rule no_sequence_parallel first)
    ("megatron-lm-2021", DENSE, ["parallel.tensor_model_parallel_size=2",
                                 "parallel.sequence_parallel=true",
                                 "parallel.tp_comm_overlap=pipelined"], "no_te_tp_overlap"),
    # squared ReLU (2026-12-01 night): none in 2021's code; Megatron-Core raises when the
    # bias-activation fusion meets it, which only --disable-bias-linear turns off itself
    ("megatron-lm-2021", NEMOTRON, [], "no_squared_relu"),
    ("deepspeed-2021", NEMOTRON, ["train.dtype=fp16"], "no_squared_relu"),
    ("megatron-core-2024", NEMOTRON, ["model.mlp_bias=true"], "squared_relu_no_bias_fusion"),
    ("megatron-core-2025", NEMOTRON, ["model.mlp_bias=true"], "squared_relu_no_bias_fusion"),
    # ddlsim's MLA models are MoE: refused by no_moe as well
    ("megatron-lm-2021", MOE, ["model=deepseek-v2-lite", "parallel.expert_model_parallel_size=8",
                               "train.dtype=fp16", "parallel.moe={token_dispatcher_type: "
                               "alltoall, grouped_gemm: false, permute_fusion: false, "
                               "overlap_expert_parallel_comm: false, delay_wgrad_compute: false}"],
     "no_mla"),
]


def _audited(stack: str, base: dict, sets: list[str], what_if: bool = False):
    data = copy.deepcopy(base)
    data["system"]["software"] = {"stack": stack, "what_if": what_if}
    return build_config(data, sets)


@pytest.mark.parametrize("stack, base, sets, rule", AUDITED,
                         ids=[f"{s}-{r}" for s, _, _, r in AUDITED])
def test_audited_stacks_refuse_what_their_code_cannot_run(stack, base, sets, rule):
    """Each plan the audit of 2026-12-01 found the framework refuses (or has no code for) is
    refused by predict naming the rule and its source, and predicted as a marked what-if."""
    with pytest.raises(ConfigError) as exc:
        _audited(stack, base, sets)
    text = str(exc.value)
    assert f"software stack {stack!r} cannot run" in text and rule in text, text
    cfg = _audited(stack, base, sets, what_if=True)
    broken = [r.name for r, _ in broken_rules(cfg)]
    assert rule in broken
    if broken[0] == rule:   # the message gives the first rule's source
        assert dict((r.name, s) for r, s in stack_rules(stack))[rule] in text
    if rule == "zero3_no_moe":   # nor does ddlsim model DeepSpeed's module hooks on MoE layers
        with pytest.raises(ConfigError, match="modelled for dense decoder layers"):
            ddlsim.predict(cfg, check_fit=False)
        return
    result = ddlsim.predict(cfg, check_fit=False)
    assert result.extra["what_if"].startswith(f"what-if: {stack} cannot run")
    assert result.iteration_time_s > 0


@pytest.mark.parametrize("stack, base, sets", [
    ("deepspeed", DENSE, ["parallel.zero_stage=2", "train.dtype=bf16"]),   # bf16 ZeRO today
    ("deepspeed", DENSE, ["system.software.kernels.compile=true"]),   # DeepSpeed's compile()
    ("deepspeed", MOE, ["parallel.zero_stage=2", "parallel.tensor_model_parallel_size=2",
                        "parallel.sequence_parallel=true",
                        "parallel.expert_tensor_parallel_size=1"]),    # experts not TP-split
    ("deepspeed-2021", DENSE, ["parallel.zero_stage=3", "train.recompute=full"]),
    ("megatron-core-2025", LLAMA, ["parallel.zero_stage=3",
                                   "system.software.kernels.gradient_accumulation_fusion=false"]),
    ("megatron-core-2025", LLAMA, ["parallel.zero_stage=1",
                                   "system.software.kernels.host_dispatch=cuda_graphs"]),
    # megatron-core-2024's runnable neighbours: 1F1B and interleaved, no compile, an even
    # split, the alltoall dispatcher with a capacity factor, grouped GEMM in bf16 and FP8,
    # fp16 without EP, the softmax router with aux_loss/sinkhorn/none, enable_cuda_graph
    ("megatron-core-2024", LLAMA, ["parallel.pipeline_model_parallel_size=2"]),
    ("megatron-core-2024", LLAMA, ["parallel.pipeline_model_parallel_size=4",
                                   "parallel.schedule=interleaved",
                                   "parallel.virtual_pipeline_model_parallel_size=2"]),
    ("megatron-core-2024", LLAMA, ["system.software.kernels.host_dispatch=cuda_graphs"]),
    ("megatron-core-2024", MOE, ["parallel.moe={grouped_gemm: true}"]),
    ("megatron-core-2024", MOE, ["parallel.moe={grouped_gemm: true}", "train.dtype=fp8"]),
    ("megatron-core-2024", MOE, ["train.dtype=fp16", "parallel.expert_model_parallel_size=1"]),
    ("megatron-core-2024", MOE, ["model.capacity_factor=1.25",
                                 "parallel.moe={token_dispatcher_type: alltoall}"]),
    ("megatron-core-2024", MOE, ["model.capacity_factor=1.25",
                                 "parallel.moe={token_dispatcher_type: alltoall, "
                                 "pad_expert_input_to_capacity: true}"]),
    ("megatron-core-2024", MOE, ["parallel.moe={router_load_balancing_type: sinkhorn, "
                                 "aux_loss_coeff: 0}"]),
    ("megatron-core-2024", MOE, ["parallel.moe={router_load_balancing_type: none, "
                                 "aux_loss_coeff: 0}"]),
    ("megatron-core-2024", MOE, ["parallel.moe={permute_fusion: false, "
                                 "router_num_groups: 2, router_group_topk: 2}"]),
    # megatron-lm-2021's runnable neighbours: 1F1B and interleaved (PP 4) with an even split,
    # eager PyTorch, blocking TP
    ("megatron-lm-2021", DENSE, ["parallel.pipeline_model_parallel_size=2"]),
    ("megatron-lm-2021", DENSE, ["parallel.pipeline_model_parallel_size=4",
                                 "parallel.schedule=interleaved",
                                 "parallel.virtual_pipeline_model_parallel_size=2"]),
    ("megatron-lm-2021", DENSE, ["parallel.tensor_model_parallel_size=2", "train.recompute=full"]),
    # a Nemotron without biases (the fusion off by Megatron itself), or with them and
    # --no-bias-gelu-fusion; Megatron-DeepSpeed's --squared-relu ignores the fusion
    ("megatron-core-2024", NEMOTRON, []),
    ("megatron-core-2025", NEMOTRON, ["model.mlp_bias=true",
                                      "system.software.kernels.fused_bias_gelu=false"]),
    ("deepspeed", NEMOTRON, ["model.mlp_bias=true", "train.dtype=fp16"]),
])
def test_audited_stacks_still_run_what_their_code_runs(stack, base, sets):
    assert not broken_rules(_audited(stack, base, sets))


@pytest.mark.parametrize("stack, data, axes, rule", [
    ("deepspeed-2021", DENSE, {"parallel.zero_stage": [0, 1], "train.dtype": ["fp16", "bf16"]},
     "zero_needs_fp16"),
    ("deepspeed-2021", DENSE, {"train.recompute": ["none", "selective"]},
     "no_selective_recompute"),
    ("deepspeed", DENSE, {"parallel.tensor_model_parallel_size": [2],
                          "parallel.sequence_parallel": [True],
                          "parallel.tp_comm_overlap": ["off", "bulk"]}, "no_te_tp_overlap"),
    ("deepspeed", MOE, {"parallel.zero_stage": [0, 3]}, "zero3_no_moe"),
    ("megatron-core-2025", LLAMA, {"parallel.zero_stage": [1, 3]},
     "fsdp2_no_grad_accum_fusion"),
    ("megatron-core-2024", LLAMA, {"parallel.pipeline_model_parallel_size": [2],
                                   "parallel.schedule": ["1f1b", "gpipe"]}, "no_gpipe"),
    ("megatron-lm-2021", DENSE, {"parallel.pipeline_model_parallel_size": [2],
                                 "parallel.schedule": ["1f1b", "gpipe"]}, "no_gpipe"),
    ("megatron-core-2024", MOE, {"train.dtype": ["bf16", "fp16"],
                                 "parallel.expert_model_parallel_size": [1, 2]},
     "moe_ep_no_fp16"),
    ("megatron-core-2024", MOE, {"train.dtype": ["bf16", "fp16"],
                                 "parallel.expert_model_parallel_size": [1],
                                 "parallel.moe.grouped_gemm": [False, True]},
     "grouped_gemm_needs_bf16"),
    ("megatron-core-2024", NEMOTRON, {"model.mlp_bias": [False, True],
                                      "parallel.tensor_model_parallel_size": [1, 2]},
     "squared_relu_no_bias_fusion"),
])
def test_search_rejects_the_audited_plans_as_predict_does(stack, data, axes, rule):
    """Both tiers: every plan the search evaluates builds, every plan it rejects is refused
    by the config, and the rule's name is among the rejections."""
    from ddlsim.search.run import plan_overrides
    data = copy.deepcopy(data)
    data["system"]["software"] = stack
    grid = evaluate_grid(data, None, [], axes, Constraints(must_fit=False))
    assert any(f"rule {rule}" in r for r in grid.rejected), grid.rejected
    columns = [c for c in grid.frame.columns if "." in c]
    for i in range(len(grid.frame)):
        assert not broken_rules(build_config(data, plan_overrides(grid.frame.iloc[i], columns)))
    assert grid.total == len(grid.frame) + sum(grid.rejected.values())


@pytest.mark.parametrize("stack", ["megatron-lm-2021", "deepspeed-2021"])
def test_a_moe_model_under_a_stack_without_moe_code_is_refused_by_the_rule(stack):
    """Before any MoE option is asked for, a stack that declares no_moe says it runs no MoE
    layers, by the rule and its source (it used to ask for parallel.moe options it has none of)."""
    with pytest.raises(ConfigError, match=rf"'{stack}' cannot run Mixture-of-Experts layers "
                                          r"\(rule no_moe; source: .*MoE"):
        ddlsim.load_config("examples/mixtral-8x7b-ep8.yaml",
                           overrides=[f"system.software={stack}"])


# ---------------------------------------------------------------- programs of their own
@pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")
@pytest.mark.parametrize("example", ["gpt2_large", "bert_large"])
def test_a_proxy_runs_its_own_schedule_where_the_stacks_framework_would_refuse_it(example):
    """The seed's C++ proxies run GPipe themselves (gpt2_large.cpp, bert_large.cpp): the
    default stack's no_gpipe judges Megatron-LM's program, not theirs (runs_own_program).
    The same plan as Megatron's program (no proxy options) is refused by the rule."""
    import yaml
    from pathlib import Path
    path = Path(__file__).parents[1] / "examples" / "proxies" / f"{example}.yaml"
    doc = yaml.safe_load(path.read_text())
    cfg = ddlsim.load_config(copy.deepcopy(doc))
    assert cfg.software.name == "megatron-core-2024" and not cfg.software.what_if
    assert cfg.parallel.schedule == "gpipe" and broken_rules(cfg) == []
    assert "what_if" not in ddlsim.predict(cfg).to_dict()
    model = {k: v for k, v in doc["model"].items()
             if k not in ("program", "pipeline_p2p", "grad_sync", "grad_buffers", "recv_buffers",
                          "compute", "proxy_timings", "grad_buckets", "p2p_attention_mask",
                          "stage_exchange")}
    with pytest.raises(ConfigError, match="rule no_gpipe"):
        ddlsim.load_config({**copy.deepcopy(doc), "model": model})


def test_an_unset_sp_is_on_where_megatron_cores_moe_layers_need_it_and_off_elsewhere():
    """Megatron-Core's MoELayer raises with TP > 1 and no sequence parallelism: left unset,
    it is on for an MoE model (rule moe_tp_needs_sp), off for a dense one; written false it
    is refused."""
    moe = {"model": "mixtral-8x7b", "parallel": {"tensor_model_parallel_size": 2,
                                                  "pipeline_model_parallel_size": 4},
           "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
           "system": {"preset": "dgx-h100", "nodes": 8, "software": "megatron-core-2025"}}
    cfg = ddlsim.load_config(moe)
    assert cfg.parallel.sequence_parallel
    assert cfg.family.plan_summary(cfg).startswith("TP2 SP (moe_tp_needs_sp) × PP4")
    with pytest.raises(ddlsim.ConfigError, match=r"\(rule moe_tp_needs_sp"):
        ddlsim.load_config(moe, ["parallel.sequence_parallel=false"])
    dense = ddlsim.load_config(moe, ["model=llama-3.1-8b"])
    assert not dense.parallel.sequence_parallel
    assert dense.family.plan_summary(dense).startswith("TP2 × PP4")
