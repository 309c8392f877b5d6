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
        "parallel.overlap_grad_reduce=true", "train.recompute=full"])  # 2021: no selective
    sw = cfg.software
    assert (sw.name, sw.attention, sw.overlap_grad_reduce) == ("megatron-lm-2021", "flash2", True)
    assert sw.sources["attention"] == "system.software.kernels"
    assert sw.sources["overlap_grad_reduce"] == "parallel.overlap_grad_reduce"
    assert sw.overlap_param_gather is False          # untouched: the 2021 stack's value


def test_unknown_stack_is_refused_with_the_known_names():
    with pytest.raises(ConfigError, match="megatron-lm-2O21.*allowed: megatron-lm-2021"):
        load_config("examples/gpt3-175b-1024-a100.yaml", overrides=["system.software=megatron-lm-2O21"])


# ---------------------------------------------------------------- gradient dtype
GPT_DP2 = {"model": {"preset": "gpt2-124m"},
           "parallel": {"data_parallel_size": 2, "overlap_grad_reduce": False},
           "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 1024},
           "system": {"preset": "dgx-a100", "nodes": 1}}


def _grad_bytes(dtype: str, software) -> float:
    """Bytes of the one data-parallel gradient all-reduce per iteration (no overlap)."""
    import ddlsim
    from ddlsim.workloads.trace import Collective
    cfg = load_config({**GPT_DP2, "train": {**GPT_DP2["train"], "dtype": dtype},
                       "system": {**GPT_DP2["system"], "software": software}},
                      overrides=["parallel.data_parallel_size=2"])
    w = ddlsim.build_workload(cfg)
    block = w.classes[0].program.blocks["update"]
    return sum(o.repeat * o.payload.bytes for o in block.flat.ops
               if isinstance(o.payload, Collective) and o.payload.name.startswith("grad."))


@pytest.mark.parametrize("dtype,software,per_param", [
    # Megatron-LM (2021 and 2024): --bf16 forces accumulate_allreduce_grads_in_fp32 (4 B);
    # --fp16 leaves it off (2 B); DeepSpeed reduces in the model's dtype; fp32 training is 4 B
    ("bf16", "megatron-core-2024", 4), ("fp16", "megatron-core-2024", 2),
    ("bf16", "megatron-lm-2021", 4), ("fp16", "megatron-lm-2021", 2),
    ("bf16", "deepspeed", 2), ("fp32", "deepspeed", 4),
    ("fp16", {"stack": "megatron-lm-2021", "kernels": {"grad_reduce_dtype": "fp32"}}, 4),
    ("bf16", {"stack": "megatron-core-2024", "kernels": {"grad_reduce_dtype": "param"}}, 2),
])
def test_gradients_are_reduced_in_the_stacks_dtype(dtype, software, per_param):
    import ddlsim
    cfg = load_config({**GPT_DP2, "train": {**GPT_DP2["train"], "dtype": dtype},
                       "system": {**GPT_DP2["system"], "software": software}})
    params = ddlsim.memory_per_device(cfg).weights / {"fp32": 4, "bf16": 2, "fp16": 2}[dtype]
    assert _grad_bytes(dtype, software) == pytest.approx(per_param * params, rel=1e-12)
    assert ddlsim.memory_per_device(cfg).gradients == pytest.approx(per_param * params,
                                                                     rel=1e-12)


def test_unknown_gradient_dtype_is_refused_with_the_allowed_values():
    with pytest.raises(ConfigError, match="grad_reduce_dtype: .*'fp32_if_bf16'.*got 'bf32'"):
        load_config(GPT_DP2, overrides=["system.software.kernels.grad_reduce_dtype=bf32"])


@pytest.mark.parametrize("param,grad,scaler,want", [
    # Megatron-LM 2021, fp16: grads to fp32 (2 + 4), unscale (4 + 4), norm (4), FusedAdam
    # (16 read + 12 write), master -> fp16 copy (4 + 2)
    (2, 2, True, 6 + 8 + 4 + 28 + 6),
    # Megatron-Core, bf16 with fp32 main grads: no copy, no scaler
    (2, 4, False, 4 + 28 + 6),
    # fp32 training: no master weights, no copies
    (4, 4, False, 4 + 28),
])
def test_optimizer_step_moves_the_mixed_precision_passes(param, grad, scaler, want):
    from ddlsim.simulator.kernels import optimizer_bytes_per_param
    assert optimizer_bytes_per_param("adam", True, param, grad, scaler) == want


def test_a_bad_software_field_is_named_once_without_union_branches():
    # system.software is "a stack name or a mapping": the error names the mapping's field and
    # its allowed keys, not pydantic's branch names (str, function-after[...])
    with pytest.raises(ConfigError) as bad_key:
        load_config(GPT_DP2, overrides=["system.software.kernels.atention=flash2"])
    text = str(bad_key.value)
    assert "unknown key 'atention' in system.software.kernels (did you mean 'attention'?)" in text
    assert "grad_reduce_dtype" in text and "function-after" not in text and ".str" not in text
    with pytest.raises(ConfigError) as bad_type:
        load_config(GPT_DP2, overrides=["system.software=5"])
    assert str(bad_type.value).count("system.software:") == 1
    assert "valid string, or a valid dictionary" in str(bad_type.value)
