"""Transformer Engine casts an FP8 linear's weight once per optimizer step, not per micro-batch
(``get_weight_workspace`` with ``is_first_microbatch``: simulator/kernels/fp8recipe.py
``fp8_weight_share``); torchao casts it in every forward. ddlsim spreads the one cast over the
step's micro-batches (``microbatches`` of ``fp8_cast_kernels``, ``linear_kernels``,
``with_fp8_casts``)."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.simulator.kernels.fp8recipe import (FP8_RECIPES, fp8_cast_kernels,
                                                fp8_weight_share)
from ddlsim.software import SoftwareSpec, resolve_software
from ddlsim.workloads.decoder.fp8linear import (linear_kernels, weight_cast_microbatches,
                                                with_fp8_casts)
from ddlsim.workloads.trace import Compute, Kernel

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: a Llama-3-8B fc1 on one TP rank (8,192 tokens, 14,336 wide, hidden 4,096)
M, N, K = 8192.0, 14336.0, 4096.0
#: the weight's cast as ddlsim charges it: read bf16 (2), write FP8 (1) per element
WEIGHT_CAST = 3 * K * N
TE = ("te_delayed", "te_current")
TORCHAO = ("tensorwise", "rowwise")


def _sw(recipe: str, stack: str = "megatron-core-2025"):
    return resolve_software(SoftwareSpec(stack=stack, kernels={"fp8_recipe": recipe}))


def _bytes(kernels) -> float:
    return sum(k.bytes for k in kernels)


@pytest.mark.parametrize("recipe", TE)
def test_te_casts_the_weight_once_over_the_steps_microbatches(recipe):
    # the m forwards of a step carry one cast between them (1/m each); the input's passes stay
    one = _bytes(fp8_cast_kernels(recipe, M, N, K, False))
    for m in (2, 8, 64):
        each = _bytes(fp8_cast_kernels(recipe, M, N, K, False, microbatches=m))
        assert one - each == pytest.approx(WEIGHT_CAST * (1 - 1 / m))
        assert m * (each - (one - WEIGHT_CAST)) == pytest.approx(WEIGHT_CAST)


@pytest.mark.parametrize("recipe", TE + TORCHAO)
def test_the_backward_does_not_depend_on_the_microbatches(recipe):
    # TE's cached weight holds the transpose the data gradient needs (no backward weight
    # pass); torchao casts the weight again in every backward
    assert (fp8_cast_kernels(recipe, M, N, K, True, microbatches=16)
            == fp8_cast_kernels(recipe, M, N, K, True))


@pytest.mark.parametrize("recipe", TORCHAO)
def test_torchao_casts_the_weight_in_every_forward(recipe):
    assert not FP8_RECIPES[recipe].weight_cached
    assert fp8_weight_share(recipe, 16) == 1.0
    assert (fp8_cast_kernels(recipe, M, N, K, False, microbatches=16)
            == fp8_cast_kernels(recipe, M, N, K, False))


def test_a_te_weight_gathered_in_fp8_is_not_cast_only_transposed_once_per_step():
    # an FP8 parameter (fp8_param_gather): the gathered weight's transpose, read 1 + write 1
    # bytes per element (TE post_all_gather_processing), spread over the 4 micro-batches
    got = fp8_cast_kernels("te_delayed", M, N, K, False, weight_fp8=True, microbatches=4)
    assert _bytes(got) == pytest.approx(4 * M * K + 2 * K * N / 4)


@pytest.mark.parametrize("bad", [0, -3])
def test_fewer_than_one_microbatch_is_refused_naming_the_value(bad):
    with pytest.raises(ValueError, match=rf"microbatches = {bad}.*>= 1"):
        fp8_weight_share("te_delayed", bad)


@pytest.mark.parametrize("recipe", TE)
def test_linear_kernels_spread_the_weight_cast(recipe):
    sw = _sw(recipe)
    whole = _bytes(linear_kernels(sw, "fp8", M, N, K, False))
    spread = _bytes(linear_kernels(sw, "fp8", M, N, K, False, microbatches=4))
    assert whole - spread == pytest.approx(WEIGHT_CAST * 3 / 4)


@pytest.mark.parametrize("recipe", TE)
def test_grouped_experts_spread_each_experts_weight_cast(recipe):
    # a grouped linear of 8 experts: each expert's weight cast once per step
    batch, m = 8, 16
    op = Compute("fwd.experts.fc1", 2 * M * N * K * batch, kind="gemm", dtype="fp8",
                 kernels=(Kernel("gemm", (M, N, K), batch=batch, dtype="fp8"),))
    whole = _bytes(with_fp8_casts(op, _sw(recipe), M, N, K, False, batch).kernels)
    spread = _bytes(with_fp8_casts(op, _sw(recipe), M, N, K, False, batch,
                                   microbatches=m).kernels)
    assert whole - spread == pytest.approx(batch * WEIGHT_CAST * (1 - 1 / m))


def test_the_search_tier_tells_plans_apart_only_where_the_casts_depend_on_microbatches():
    m = np.array([1, 4, 32])
    assert weight_cast_microbatches(_sw("te_current"), "fp8", m).tolist() == [1, 4, 32]
    assert weight_cast_microbatches(_sw("te_current"), "bf16", m).tolist() == [0, 0, 0]
    assert weight_cast_microbatches(_sw("tensorwise", "torchtitan-2025"), "fp8",
                                    m).tolist() == [0, 0, 0]
    assert weight_cast_microbatches(_sw("te_delayed"), "fp8", 8) == 8
