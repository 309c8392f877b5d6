"""The software stack: named stacks, overrides, and the plan's overlap options on top."""

import pytest

from ddlsim.config import load_config
from ddlsim.errors import ConfigError
from ddlsim.software import resolve_software, stacks


def test_every_stack_sets_every_field_with_a_source():
    from ddlsim.software import KernelSpec, OverlapSpec
    for name in stacks():
        sw = resolve_software(name)
        assert set(sw.kernels) == set(KernelSpec.model_fields)
        assert set(sw.overlap) == set(OverlapSpec.model_fields)
        assert all(sw.sources[f] for f in (*sw.kernels, *sw.overlap))


def test_layers_apply_in_order_stack_then_system_then_plan():
    # megatron-lm-2021 runs Megatron's fused softmax and no overlap (its YAML entry).
    assert resolve_software("megatron-lm-2021").attention == "fused_softmax"
    cfg = load_config("examples/gpt3-175b-1024-a100.yaml", overrides=[
        "system.software.stack=megatron-lm-2021", "system.software.kernels.attention=flash2",
        "parallel.overlap_grad_reduce=true"])
    sw = cfg.software
    assert (sw.name, sw.attention, sw.overlap_grad_reduce) == ("megatron-lm-2021", "flash2", True)
    assert sw.sources["attention"] == "system.software.kernels"
    assert sw.sources["overlap_grad_reduce"] == "parallel.overlap_grad_reduce"
    assert sw.overlap_param_gather is False          # untouched: the 2021 stack's value


def test_unknown_stack_is_refused_with_the_known_names():
    with pytest.raises(ConfigError, match="megatron-lm-2O21.*allowed: megatron-lm-2021"):
        load_config("examples/gpt3-175b-1024-a100.yaml", overrides=["system.software=megatron-lm-2O21"])
