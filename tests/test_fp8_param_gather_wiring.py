"""FP8 parameters wired into the decoder's trace (update.py, moe_update.py, build.py,
builder.py, plan.py, layerkernels.py, the family's check and the stack rule
no_fp8_param_gather): the distributed optimizer's gather moves one byte per layer parameter,
the step casts the master shard instead of copying it, the search tier moves as the engine,
and Megatron's rules and the stacks without FP8 parameters refuse the setting."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: Llama 3 8B on one DGX H100, DP 2 under the distributed optimizer, TE current scaling
BASE = {"model": "llama3-8b",
        "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                     "data_parallel_size": 2, "zero_stage": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048,
                  "dtype": "fp8"},
        "system": {"preset": "dgx-h100", "nodes": 1,
                   "software": {"stack": "megatron-core-2025",
                                "kernels": {"fp8_recipe": "te_current"}}}}
#: Llama 3 8B: vocabulary and hidden size (the untied embedding and head stay 16-bit)
VOCAB, HIDDEN = 128256, 4096


def _with(**kernels):
    cfg = copy.deepcopy(BASE)
    cfg["system"]["software"]["kernels"].update(kernels)
    return cfg


def test_the_gather_halves_for_the_layers_parameters():
    off = ddlsim.predict(_with(), check_fit=False)
    on = ddlsim.predict(_with(fp8_param_gather=True), check_fit=False)
    layers = off.parameter_count - 2 * VOCAB * HIDDEN
    # one byte less per layer parameter; the amaxes' all-reduce adds a few hundred bytes
    assert off.comm_bytes["dp"] - on.comm_bytes["dp"] == pytest.approx(layers, rel=1e-5)


def test_it_is_refused_without_the_distributed_optimizer():
    cfg = _with(fp8_param_gather=True)
    cfg["parallel"]["zero_stage"] = 0
    with pytest.raises(ConfigError, match="fp8_param_gather = true needs the distributed"):
        ddlsim.predict(cfg)


def test_it_is_refused_outside_fp8_training():
    cfg = _with(fp8_param_gather=True)
    cfg["train"]["dtype"] = "bf16"
    with pytest.raises(ConfigError, match="train.dtype = 'bf16'"):
        ddlsim.predict(cfg)


def _search_frame(on: bool):
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    base = {"model": "llama3-8b", "parallel": {"zero_stage": 1},
            "system": {"preset": "dgx-h100", "nodes": 4,
                       "software": {"stack": "megatron-core-2025",
                                    "kernels": {"fp8_recipe": "te_current",
                                                "fp8_param_gather": on}}},
            "train": {"micro_batch_size": 1, "global_batch_size": 256, "seq_length": 4096,
                      "dtype": "fp8"}}
    axes = {"parallel.tensor_model_parallel_size": [1, 2, 4],
            "parallel.pipeline_model_parallel_size": [1, 2, 4],
            "parallel.virtual_pipeline_model_parallel_size": [None, 2],
            "parallel.sequence_parallel": [True], "parallel.zero_stage": [1],
            "train.micro_batch_size": [1], "train.recompute": ["selective"]}
    return base, evaluate_grid(base, None, [], axes, Constraints()).frame


def test_the_search_tier_moves_as_the_engine_with_fp8_parameters():
    """Per plan, what turning the setting on changes in the tier's time (its gather at one
    byte, the amaxes' all-reduce, the step's cast, the weights' transposes) is what it
    changes in the exact engine's, to 1 % of the change or 10 us."""
    from ddlsim.config import build_config
    from ddlsim.search.run import plan_overrides
    base_on, on = _search_frame(True)
    base_off, off = _search_frame(False)
    columns = [c for c in on.columns if "." in c]
    both = on.merge(off, on=columns, suffixes=("", "_off"))
    assert len(both) >= 8
    for i in range(len(both)):
        plan = plan_overrides(both.iloc[i], columns)
        exact = [ddlsim.predict(build_config(base, plan), check_fit=False).iteration_time_s
                 for base in (base_on, base_off)]
        tier = both["iteration_time_s"].iloc[i] - both["iteration_time_s_off"].iloc[i]
        assert tier == pytest.approx(exact[0] - exact[1], rel=0.01, abs=1e-5), plan


@pytest.mark.parametrize("stack", ["megatron-core-2024", "megatron-lm-2021", "deepspeed"])
def test_a_stack_without_fp8_parameters_refuses_them_by_rule(stack):
    # (H16-stackrule.patch) delayed scaling, which these stacks run, so only the rule refuses
    cfg = _with(fp8_param_gather=True, fp8_recipe="te_delayed")
    cfg["system"]["software"] = {"stack": stack, "kernels": cfg["system"]["software"]["kernels"]}
    # (Megatron-LM 2021 breaks no_distributed_optimizer first: the rule is named beside it)
    with pytest.raises(ConfigError, match=r"cannot run.*no_fp8_param_gather.*source: .*[0-9]"):
        ddlsim.load_config(cfg)
