"""IBM fms's rotary embedding (``rope_form: real_matrix``, the ``fms-fsdp-2024`` stack), derived
by hand from foundation-model-stack 953ef99b ``fms/modules/positions.py``
``RotaryEmbedding.adjusted_qk``: per tensor ``q.float()`` (read d, write 4), the broadcast
``freqs[..., None, :, :, :].mul(q_.unsqueeze(-2))`` writing two fp32 products an element (read
4, write 8), ``.sum(5)`` over the pair (read 8, write 4), ``type_as(q)`` (read 4, write d); the
backward runs the same four kernels (torch 2.13's CPU profiler: ``ToCopyBackward0``,
``MulBackward0``'s ``mul`` and ``sum``, ``ToCopyBackward0``), with no ``conj`` kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.kernels.elementwise import layer_elementwise_parts
from ddlsim.simulator.kernels.elementwise_backward import layer_elementwise_backward_parts
from ddlsim.simulator.kernels.rotary import rope_classes, rope_passes

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

EXAMPLE = Path(__file__).parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"
S = 8192


def _rope(software: str, backward: bool = False) -> list[tuple[float, str]]:
    """(bytes per token, class) of each RoPE kernel of one Llama 3.1 8B layer at 8192 tokens."""
    cfg = ddlsim.load_config(str(EXAMPLE), [f"system.software={software}"])
    parts = layer_elementwise_backward_parts if backward else layer_elementwise_parts
    got = parts(cfg.model.shape(), 1, S, 1, False, 2, cfg.software)["rope"]
    return [(k.bytes / S, k.variant) for k in got]


def test_real_matrix_passes_by_hand():
    assert rope_passes(False, "real_matrix", 2) == [6, 12, 12, 6]      # 36 B in bf16
    assert rope_classes(False, "real_matrix", 2) == ["rope_upcast", "", "", ""]
    # fp32: .float() and type_as return their input, no kernel
    assert rope_passes(False, "real_matrix", 4) == [12, 12]
    assert rope_classes(False, "real_matrix", 4) == ["", ""]
    assert rope_passes(True, "real_matrix", 2) == [4]                  # a fused kernel


def test_fms_stack_runs_the_real_matrix_form_with_its_source():
    sw = ddlsim.load_config(str(EXAMPLE), ["system.software=fms-fsdp-2024"]).software
    assert sw.rope_form == "real_matrix" and not sw.fused_rope
    assert "positions.py" in sw.sources["rope_form"]


def test_fms_layer_rotates_q_and_k_in_four_kernels_each_way():
    q, k = 4096, 1024        # Llama 3.1 8B: 32 query heads, 8 K/V heads of 128
    want = [(p * w, c) for w in (q, k)
            for p, c in zip((6, 12, 12, 6), ("rope_upcast", "", "", ""))]
    assert _rope("fms-fsdp-2024") == want
    assert _rope("fms-fsdp-2024", backward=True) == want     # no conj of a real table
    # torchtitan's complex form, for contrast: 20 B and a conj kernel before each multiply
    assert sum(b for b, _ in _rope("torchtitan-2025")) == 20 * (q + k)
    assert len(_rope("torchtitan-2025", backward=True)) == 8


def test_compiled_fms_fuses_the_rotation():
    got = _rope("{stack: fms-fsdp-2024, compile: true}")
    assert got == [(4 * 4096, ""), (4 * 1024, "")]
