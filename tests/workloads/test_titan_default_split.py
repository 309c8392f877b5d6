"""A torchtitan stack's own pipeline split (``system.software.kernels.pipeline_split``): a plan
that gives no split gets the one torchtitan makes (``decoder/titan_split.py``), as the
importer writes it for a torchtitan config, not Megatron's even split."""

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.decoder.split import chunk_layers
from ddlsim.workloads.decoder.titan_split import split_2024, split_2025


def _cfg(model: str, stack: str, pp: int, vpp: int | None = None, **parallel):
    par = {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": pp,
           "sequence_parallel": True, "zero_stage": 3, **parallel}
    if vpp:
        par.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vpp)
    return ddlsim.load_config({
        "model": model, "parallel": par,
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 8192},
        "system": {"preset": "dgx-h100", "nodes": 64, "software": {"stack": stack}}})


@pytest.mark.parametrize("stack, rule", [("torchtitan-2024", split_2024),
                                         ("torchtitan-2025", split_2025)])
def test_405b_on_pp8_is_split_as_torchtitan_splits_it(stack, rule):
    """126 layers over 8 × 2 virtual stages, refused as 'not divisible' until 2026-11-30:
    7, 8, ..., 8, 7 laid out in torchtitan's loop order, and the same prediction, bit for
    bit, as with the split given outright."""
    cfg = _cfg("llama-3.1-405b", stack, 8, 2)
    stages = rule(126, 16)
    assert stages == [7] + [8] * 14 + [7]
    assert chunk_layers(cfg) == tuple(tuple(stages[c * 8 + s] for c in range(2))
                                      for s in range(8))
    given = _cfg("llama-3.1-405b", stack, 8, 2, layers_per_virtual_stage=stages)
    assert (ddlsim.predict(cfg, check_fit=False).iteration_time_s
            == ddlsim.predict(given, check_fit=False).iteration_time_s)


def test_2025_weighs_the_embedding_and_the_output_as_a_layer_each():
    """Llama 3.1 8B's 32 layers on PP 4: torchtitan 07c00d9 splits 34 effective layers
    9, 9, 8, 8 and takes one off the first and the last stage; 2024's rule and Megatron's
    split them evenly."""
    assert chunk_layers(_cfg("llama-3.1-8b", "torchtitan-2025", 4)) == ((8,), (9,), (8,), (7,))
    assert chunk_layers(_cfg("llama-3.1-8b", "torchtitan-2024", 4)) == ((8,),) * 4
    mc = _cfg("llama-3.1-8b", "megatron-core-2025", 4, zero_stage=1)
    assert mc.software.pipeline_split == "even" and chunk_layers(mc) == ((8,),) * 4


def test_megatron_stacks_keep_their_even_split_and_its_refusal():
    with pytest.raises(ConfigError, match="126 is not divisible by .* Megatron-Core can "
                                          "split unevenly"):
        ddlsim.build_workload(_cfg("llama-3.1-405b", "megatron-core-2025", 8, zero_stage=1))


def test_a_split_torchtitan_refuses_names_the_stack_rule():
    """More virtual stages than layers: torchtitan raises, so does ddlsim."""
    with pytest.raises(ConfigError, match="pipeline_split = 'torchtitan-2025'"):
        ddlsim.build_workload(_cfg("llama-3.1-8b", "torchtitan-2025", 8, 8))


def test_the_vectorised_search_tier_leaves_such_stacks_to_the_exact_engine():
    from ddlsim.search.decoder import DecoderVectors
    with pytest.raises(ConfigError, match="own \\(uneven\\) rule"):
        DecoderVectors().prepare(_cfg("llama-3.1-8b", "torchtitan-2025", 1))


def test_the_plan_line_and_the_json_name_the_stacks_split():
    """Nothing a stack decides is silent: the split it makes is shown with its rule."""
    from ddlsim.planinfo import plan_fields
    cfg = _cfg("llama-3.1-8b", "torchtitan-2025", 4, tensor_model_parallel_size=2)
    assert "PP4 [8+9+8+7 layers per stage (torchtitan-2025's split)]" in \
        cfg.family.plan_summary(cfg)
    fields = plan_fields(cfg)
    assert (fields["layers_per_virtual_stage"], fields["pipeline_split"]) == \
        ([8, 9, 8, 7], "torchtitan-2025")
    mc = _cfg("llama-3.1-8b", "megatron-core-2025", 4, zero_stage=1)
    assert "pipeline_split" not in plan_fields(mc) and "[" not in mc.family.plan_summary(mc)
