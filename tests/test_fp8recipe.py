"""FP8 recipes' scaling and cast passes (ddlsim/simulator/kernels/fp8recipe.py), by hand from
pytorch/ao's roofline model (torchao/testing/float8/roofline_utils.py at 6243040)."""

from __future__ import annotations

import pytest

from ddlsim.simulator.kernels.fp8recipe import FP8_RECIPES, fp8_cast_kernels
from ddlsim.software import SoftwareSpec, resolve_software

M, N, K = 8192.0, 4096.0, 14336.0


def total(recipe, compiled=False):
    return sum(k.bytes for bwd in (False, True)
               for k in fp8_cast_kernels(recipe, M, N, K, bwd, compiled))


@pytest.mark.parametrize("recipe, by_hand", [
    # TE delayed scaling: cast_transpose of x and g (2 + 1 + 1), cast of w (2 + 1)
    ("te_delayed", 4 * M * K + 3 * K * N + 4 * M * N),
    # tensorwise: amax read + cast to both layouts for x and g (2 + 4), w: amax + two casts
    ("tensorwise", 6 * M * K + 8 * K * N + 6 * M * N),
    # rowwise: x and g: cast + bf16 transpose (5), transpose's cast (3); w: 3 + 4 + 3
    ("rowwise", 8 * M * K + 10 * K * N + 8 * M * N),
])
def test_bytes_per_linear_by_hand(recipe, by_hand):
    assert total(recipe) == pytest.approx(by_hand, rel=1e-12)


def test_compiling_fuses_the_first_read_of_input_and_output_gradient():
    assert total("tensorwise") - total("tensorwise", True) == pytest.approx(2 * M * K + 2 * M * N)
    assert total("rowwise") - total("rowwise", True) == pytest.approx(2 * M * K + 2 * M * N)
    assert total("te_delayed", True) == total("te_delayed")


def test_rowwise_moves_more_than_tensorwise_which_moves_more_than_te():
    assert total("rowwise") > total("tensorwise") > total("te_delayed")


def test_every_stack_names_a_registered_recipe():
    from ddlsim.software import stacks
    for name in stacks():
        assert resolve_software(name).fp8_recipe in FP8_RECIPES
    sw = resolve_software(SoftwareSpec(stack="torchtitan-2025", kernels={"fp8_recipe": "rowwise"}))
    assert sw.fp8_recipe == "rowwise"
