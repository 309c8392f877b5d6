"""FP8 parameters (Megatron's ``--fp8-param-gather``, the stack's ``fp8_param_gather``): no
forward weight cast, the gathered weight's transpose once per step, the optimizer step's cast
of the fp32 master shard (simulator/kernels/fp8_weights.py), the distributed optimizer's gather
at one byte per layer parameter and Megatron's rules (workloads/decoder/param_gather.py).
Figures by hand from the passes' bytes per element (the module docstrings' sources)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ddlsim.simulator.kernels.fp8recipe import fp8_cast_kernels
from ddlsim.simulator.kernels.fp8_weights import (fp8_param_amax_bytes,
                                                  fp8_param_update_kernels)
from ddlsim.software import SoftwareSpec, resolve_software
from ddlsim.workloads.decoder import param_gather
from ddlsim.workloads.decoder.fp8linear import linear_kernels, weights_in_fp8

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: a Llama-3-8B fc1 on one TP rank (8,192 tokens, 14,336 wide, hidden 4,096)
M, N, K = 8192.0, 14336.0, 4096.0
TE = ("te_delayed", "te_current")


def _sw(recipe: str = "te_current", on: bool = True):
    return resolve_software(SoftwareSpec(stack="megatron-core-2025", kernels={
        "fp8_recipe": recipe, "fp8_param_gather": on}))


def _bytes(kernels) -> float:
    return sum(k.bytes for k in kernels)


def test_every_stack_leaves_it_off():
    for stack in ("megatron-lm-2021", "megatron-core-2024", "megatron-core-2025", "deepspeed",
                  "torchtitan-2025"):
        assert resolve_software(SoftwareSpec(stack=stack)).fp8_param_gather is False


@pytest.mark.parametrize("recipe", TE)
def test_an_fp8_parameter_is_not_cast_its_transpose_is_made_once_per_step(recipe):
    # the forward's weight pass: the cast, read 2 + write 1 (3 B), becomes the gathered FP8
    # weight's transpose, read 1 + write 1 (2 B), spread over the step's 4 micro-batches
    cast = _bytes(fp8_cast_kernels(recipe, M, N, K, False, microbatches=4))
    fp8 = _bytes(fp8_cast_kernels(recipe, M, N, K, False, weight_fp8=True, microbatches=4))
    assert cast - fp8 == pytest.approx((3 - 2) * K * N / 4)
    # the backward casts no weight either way
    assert (_bytes(fp8_cast_kernels(recipe, M, N, K, True, weight_fp8=True))
            == _bytes(fp8_cast_kernels(recipe, M, N, K, True)))


def test_linear_kernels_read_the_setting():
    on = _bytes(linear_kernels(_sw(), "fp8", M, N, K, False, microbatches=2))
    off = _bytes(linear_kernels(_sw(on=False), "fp8", M, N, K, False, microbatches=2))
    assert off - on == pytest.approx(K * N / 2)
    assert weights_in_fp8(_sw()) and not weights_in_fp8(_sw(on=False))


def test_the_step_casts_the_master_shard():
    n = 1e9
    # delayed scaling: the cast, read fp32 4 + write FP8 1; current scaling: its amax read
    # (4) first
    assert _bytes(fp8_param_update_kernels("te_delayed", n)) == pytest.approx(5 * n)
    assert _bytes(fp8_param_update_kernels("te_current", n)) == pytest.approx(9 * n)
    # they replace the copy into the 16-bit weights, read 4 + write 2
    assert param_gather.fp8_param_step_delta_bytes(_sw(), "fp8", n) == pytest.approx(3 * n)
    assert param_gather.fp8_param_step_delta_bytes(_sw("te_delayed"), "fp8", n) == (
        pytest.approx(-1 * n))
    assert param_gather.fp8_param_step_delta_bytes(_sw(), "bf16", n) == 0.0
    assert param_gather.fp8_param_step_delta_bytes(_sw(on=False), "fp8", n) == 0.0
    assert fp8_param_amax_bytes(320) == 1280.0


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="recipe = 'tensorwise'.*te_delayed, te_current"):
        fp8_param_update_kernels("tensorwise", 1.0)
    with pytest.raises(ValueError, match="elements = -1"):
        fp8_param_update_kernels("te_current", -1)
    with pytest.raises(ValueError, match="weights = -2"):
        fp8_param_amax_bytes(-2)


def test_the_gather_moves_one_byte_per_layer_parameter_and_two_per_edge():
    params, edges = 1e9, 1e8
    assert param_gather.gathered_bytes(_sw(), "fp8", 2, params, edges) == pytest.approx(
        0.9e9 * 1 + 1e8 * 2)
    assert param_gather.gathered_bytes(_sw(on=False), "fp8", 2, params, edges) == 2e9
    # element-wise on the search tier's arrays of plans
    got = param_gather.gathered_bytes(_sw(), "fp8", 2, np.array([1e9, 2e9]), np.array([0, 1e9]))
    assert got == pytest.approx([1e9, 3e9])
    assert param_gather.gather_bytes_per_param(_sw(), "fp8", 2) == 1.0


def _cfg(dtype="fp8", recipe="te_current", zero=1, strategy="ddp"):
    return SimpleNamespace(software=_sw(recipe), train=SimpleNamespace(dtype=dtype),
                           parallel=SimpleNamespace(zero_stage=zero, dp_strategy=strategy))


@pytest.mark.parametrize("cfg, match", [
    (_cfg(dtype="bf16"), "train.dtype = 'bf16'"),
    (_cfg(recipe="tensorwise"), "fp8_recipe = 'tensorwise'"),
    (_cfg(zero=0), "distributed optimizer.*zero_stage = 0"),
    (_cfg(zero=3), "zero_stage = 3"),
    (_cfg(strategy="reduce_scatter"), "dp_strategy = 'reduce_scatter'"),
])
def test_megatrons_rules_refuse_it_naming_field_and_value(cfg, match):
    with pytest.raises(ValueError, match=f"fp8_param_gather = true.*{match}"):
        param_gather.check_fp8(cfg)


@pytest.mark.parametrize("recipe", TE)
def test_a_distributed_optimizer_fp8_run_passes(recipe):
    param_gather.check_fp8(_cfg(recipe=recipe, zero=2))
