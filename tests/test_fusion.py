"""Megatron-LM's operator fusion gains (Narayanan et al. 2021 §5.8: +19 % for GPT-3 175B, +11 %
for 530B) as benchmarks/validate_fusion.py predicts them, and the unfused softmax's passes
derived by hand from Megatron-LM 6985e58 ``megatron/model/fused_softmax.py``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ddlsim.simulator.kernels.elementwise import unfused_softmax_passes

_PATH = Path(__file__).parents[1] / "benchmarks" / "validate_fusion.py"
sys.path.insert(0, str(_PATH.parent))
_spec = importlib.util.spec_from_file_location("validate_fusion", _PATH)
vf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vf)


def test_unfused_softmax_passes_by_hand():
    # fp16 scores, fp32 softmax: float() 2+4, *scale 8, masked_fill_ 8, softmax 8, half() 4+2
    assert unfused_softmax_passes(2, True, False) == [6, 8, 8, 8, 6]
    # backward: the casts' 6 each, softmax's 12 (y, dy -> dx), the mask's and scale's 8
    assert unfused_softmax_passes(2, True, True) == [6, 12, 8, 8, 6]
    # 16-bit softmax without layer scaling: masked_fill_ and softmax; backward 3d + 2d
    assert unfused_softmax_passes(2, False, False) == [4, 4]
    assert unfused_softmax_passes(2, False, True) == [6, 4]
    # fp32 training: no casts
    assert unfused_softmax_passes(4, True, False) == [8, 8, 8]


@pytest.fixture(scope="module")
def gains():
    return {o["model"]: o for o in vf.evaluate()}


@pytest.mark.parametrize("model", ["GPT-3 175B", "530B"])
def test_fusion_gain_within_two_points_of_the_paper(gains, model):
    o = gains[model]
    assert o["unfused_s"] > o["fused_s"]
    assert o["predicted"] == pytest.approx(o["published"], abs=0.02), o


def test_the_larger_model_gains_less(gains):
    # the s² passes grow with heads/TP, the GEMMs with h²: fusion matters less at 530B
    assert gains["530B"]["predicted"] < gains["GPT-3 175B"]["predicted"]


def test_the_2021_stacks_softmax_is_pytorch_1_8s():
    # Megatron-LM 2021's unfused path softmaxes fp32 copies of 2,048-key rows (8 KB): PyTorch
    # 1.8's cunn_SoftMaxForward reads each three times (16 B), its backward is tmp = grad *
    # output (12 B) then cunn_SoftMaxBackward (16 B); the casts, scale and mask as before
    sw = vf.ddlsim.load_config(vf.gpt3_175b()).software
    assert sw.softmax_dispatch == "torch-1.8" and sw.softmax_in_fp32
    assert unfused_softmax_passes(2, True, False, 2048, "torch-1.8") == [6, 8, 8, 16, 6]
    assert unfused_softmax_passes(2, True, True, 2048, "torch-1.8") == [6, 12, 16, 8, 8, 6]
