"""A stack runs only the FP8 recipes its code has: Transformer Engine's current scaling from
Megatron-Core of 2025, torchao's Float8Linear under torchtitan, Transformer Engine's recipes
under Megatron, torchao's rowwise scaling only from torchtitan of 2025 (stack rules
no_te_current_scaling, no_torchao_float8, no_transformer_engine_fp8, no_torchao_rowwise)."""

import pytest

import ddlsim
from ddlsim.errors import ConfigError


def _cfg(stack: str, recipe: str, dtype: str = "fp8") -> dict:
    return {"model": {"preset": "llama-3-8b", "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
            "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 2048,
                      "dtype": dtype},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": stack, "kernels": {"fp8_recipe": recipe}}}}


@pytest.mark.parametrize("stack, recipe, rule", [
    ("megatron-core-2024", "te_current", "no_te_current_scaling"),
    ("megatron-lm-2021", "te_current", "no_te_current_scaling"),
    ("megatron-core-2025", "rowwise", "no_torchao_float8"),
    ("megatron-core-2024", "tensorwise", "no_torchao_float8"),
    ("torchtitan-2025", "te_delayed", "no_transformer_engine_fp8"),
    ("torchtitan-2024", "te_current", "no_transformer_engine_fp8"),
    ("torchtitan-2024", "rowwise", "no_torchao_rowwise")])
def test_a_recipe_the_stack_lacks_is_refused_by_name(stack, recipe, rule):
    with pytest.raises(ConfigError, match=rf"fp8_recipe = '{recipe}'.*rule {rule}\b.*source"):
        ddlsim.load_config(_cfg(stack, recipe))


@pytest.mark.parametrize("stack, recipe", [
    ("megatron-core-2025", "te_current"), ("megatron-core-2025", "te_delayed"),
    ("megatron-core-2024", "te_delayed"), ("torchtitan-2025", "rowwise"),
    ("torchtitan-2024", "tensorwise")])
def test_a_recipe_the_stack_has_runs(stack, recipe):
    assert ddlsim.load_config(_cfg(stack, recipe)).software.fp8_recipe == recipe


def test_the_recipe_binds_only_an_fp8_run():
    # a bf16 run names no FP8 recipe in effect: nothing to refuse
    cfg = ddlsim.load_config(_cfg("megatron-core-2024", "te_current", dtype="bf16"))
    assert cfg.train.dtype == "bf16"


def test_a_what_if_runs_it_anyway():
    cfg = _cfg("megatron-core-2024", "te_current")
    cfg["system"]["software"]["what_if"] = True
    assert ddlsim.load_config(cfg).software.what_if
