"""The element-wise forms a stack runs, as features with sources (ddlsim/data/software.yaml):
the unfused rotary embedding's form (``rope_form``: Megatron's rotate-half, torchtitan's complex
multiply) and a fused norm's backward (``fused_norm_backward``: TransformerEngine's one kernel,
torch's, apex's and Inductor's two), derived by hand from the code each names."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels.elementwise import (layer_elementwise_kernels,
                                                  layer_elementwise_parts)
from ddlsim.simulator.kernels.elementwise_backward import norm_backward_kernels
from ddlsim.simulator.kernels.rotary import rope_passes
from ddlsim.software import resolve_software, stacks
from ddlsim.workloads.decoder.early_stop import without_last_add

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

EXAMPLE = Path(__file__).parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"
S = 8192


def _llama(software: str):
    zero = ["parallel.zero_stage=1"] if software == "megatron-core-2024" else []  # no_zero3
    return ddlsim.load_config(str(EXAMPLE), [f"system.software={software}", *zero])


def test_rope_forms_by_hand():
    # rotate-half: ·cos 2, negate 2, concatenate 2, ·sin 2, add 3 (units of d)
    assert rope_passes(False, "rotate_half", 2) == [4, 2, 4, 4, 6]   # negate: the second half only
    # complex: xq.float() (read 2, write 4), the complex multiply in fp32 (read 4, write 4),
    # type_as (read 4, write 2): 20 B per element; in fp32 no casts
    assert rope_passes(False, "complex", 2) == [6, 8, 6]
    assert rope_passes(False, "complex", 4) == [8]
    assert rope_passes(True, "complex", 2) == [4]


def test_torchtitan_rotates_q_and_k_apart_in_three_kernels_each():
    cfg = _llama("torchtitan-2025")
    sh, sw = cfg.model.shape(), cfg.software
    rope = layer_elementwise_parts(sh, 1, S, 1, False, 2, sw)["rope"]
    q, k = S * 4096, S * 1024
    assert [x.bytes for x in rope] == [6 * q, 8 * q, 6 * q, 6 * k, 8 * k, 6 * k]


def test_fused_norm_backward_by_library():
    x = S * 4096
    tt = _llama("{stack: torchtitan-2025, kernels: {fused_layernorm: true}}")
    mc = _llama("megatron-core-2024")
    # torch 2.11: layer_norm_grad_input_kernel (read dy, x, write dx) then GammaBeta (dy, x)
    got = norm_backward_kernels(tt.model.shape(), 1, S, 1, False, 2, tt.software)
    assert [k.bytes for k in got] == [6 * x, 4 * x]
    # TransformerEngine: one pass, dx and dgamma's partial sums
    got = norm_backward_kernels(mc.model.shape(), 1, S, 1, False, 2, mc.software)
    assert [k.bytes for k in got] == [6 * x]
    # an unfused (composite) norm keeps twice its forward, class norm_backward
    comp = _llama("torchtitan-2025")
    got = norm_backward_kernels(comp.model.shape(), 1, S, 1, False, 2, comp.software)
    assert len(got) == 8 and {k.variant for k in got} == {"norm_backward"}


@pytest.mark.parametrize("stack", stacks())
def test_every_stack_names_its_forms_with_a_source(stack):
    sw = resolve_software(stack)
    assert sw.rope_form in ("rotate_half", "complex", "real_matrix") and sw.sources["rope_form"]
    assert sw.fused_norm_backward in ("one_kernel", "two_kernels")
    assert sw.sources["fused_norm_backward"]


def test_a_bad_form_is_refused_naming_the_allowed_ones():
    with pytest.raises(ConfigError) as e:
        _llama("{stack: torchtitan-2025, kernels: {rope_form: polar}}")
    assert all(w in str(e.value) for w in ("rope_form", "polar", "complex", "rotate_half"))


def test_the_checkpoints_early_stop_drops_the_residual_add_not_a_rope_kernel():
    # q's upcast (6 B over s·4096) moves what the last residual add (3·2 B over s·h) does:
    # the trimmed recomputation keeps all six RoPE kernels and one add less
    cfg = _llama("torchtitan-2025")
    sh, sw = cfg.model.shape(), cfg.software
    ew = layer_elementwise_kernels(sh, 1, S, 1, False, 2, sw)
    parts = layer_elementwise_parts(sh, 1, S, 1, False, 2, sw)
    got = without_last_add(ew, sh, S * 4096, 2, sw, "bf16")
    assert got[-6:] == parts["rope"]
    assert len(got) == len(ew) - 1
