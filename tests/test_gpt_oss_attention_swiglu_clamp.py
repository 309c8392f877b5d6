"""GPT-OSS's clamped SwiGLU (``swiglu_limit``): Megatron-Core clamps the experts' fc1 output in
torch ops before its fused activation (d7288711 fused_bias_geglu.py lines 424-432), and
autograd runs the clamps' gradients (ddlsim/workloads/decoder/moe.py
``expert_activation_kernels``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from ddlsim.workloads.decoder.moe_activation import expert_activation_kernels
from ddlsim.workloads.models.decoder import DecoderShape
from ddlsim.workloads.models.hf import read_hf_config

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

HF = Path(ddlsim.__file__).parent / "data" / "hf"
R = 16384 * 2880          # rows x f of one rank's experts (GPT-OSS 120B, EP8, seq 4096, top-4)


def _shape(name: str) -> DecoderShape:
    return DecoderShape(**read_hf_config(HF / f"{name}.json")[0])


def test_gpt_oss_config_json_sets_the_clamp():
    assert _shape("gpt-oss-120b").glu_clamp == 7.0
    assert _shape("gpt-oss-20b").glu_clamp == 7.0
    assert _shape("qwen3-30b-a3b").glu_clamp is None


def test_plain_activation_is_one_fused_kernel():
    sh = _shape("qwen3-30b-a3b")
    for backward in (False, True):
        ks = expert_activation_kernels(sh, R, 2, "bf16", backward)
        assert len(ks) == 1 and ks[0].bytes == R * 3 * 2 * (2 if backward else 1)


def test_clamps_add_three_kernels_forward_and_seven_backward():
    """Forward: clamp(max), clamp(-c, c), cat: 2R + 2R + 4R elements of 2 bytes. Backward:
    ge, le, logical_and_, where (two-sided), le, where (one-sided), the chunk's cat."""
    sh = _shape("gpt-oss-120b")
    fwd = expert_activation_kernels(sh, R, 2, "bf16", False)
    bwd = expert_activation_kernels(sh, R, 2, "bf16", True)
    assert len(fwd) == 4 and len(bwd) == 8
    assert sum(k.bytes for k in fwd) == pytest.approx(R * (3 * 2 + 16))
    compare, where = 3 * R, 5 * R
    assert sum(k.bytes for k in bwd) == pytest.approx(
        R * 12 + 3 * compare + 3 * R + 2 * where + 8 * R)


def test_the_clamps_reach_the_step_and_the_plan_line_names_the_sink_kernel():
    """GPT-OSS 120B as Megatron-Bridge runs it (validate_moe_models 26.04.01): slower with
    the clamps than the same model without them; the plan line names cuDNN's sink kernel."""
    from benchscripts import load_script
    vmm = load_script("validate_moe_models")
    row = next(r for r in vmm.rows() if r["release"] == "26.04.01")
    cfg = vmm.config(row)
    clamped = ddlsim.predict(cfg).iteration_time_s
    cfg["model"] = {"preset": "gpt-oss-120b", "swiglu_limit": None}
    plain = ddlsim.predict(cfg).iteration_time_s
    assert clamped > plain * 1.05
    from ddlsim.planinfo import kernels_line
    assert "attention cudnn (sinks in kernel)" in kernels_line(ddlsim.load_config(cfg))
