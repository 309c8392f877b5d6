"""GPT arithmetic against published counts and closed forms."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import ModelConfig
from ddlsim.presets import get_preset
from ddlsim.workloads.models.gpt import GPTShape


def shape(name: str) -> GPTShape:
    return GPTShape.of(ModelConfig(name=name, **get_preset("model", name)))


def test_gpt2_124m_parameter_count_is_exact():
    # HuggingFace openai-community/gpt2: 124,439,808 parameters (tied embeddings)
    assert shape("gpt2-124m").params == 124_439_808


def test_gpt3_175b_parameter_count():
    # Brown et al. 2020, Table 2.1: 175.0 B
    assert shape("gpt3-175b").params == pytest.approx(175.0e9, rel=0.003)


@pytest.mark.parametrize("name, billions", [
    ("megatron-1.7b", 1.7), ("megatron-7.5b", 7.5), ("megatron-145.6b", 145.6), ("megatron-1t", 1008.0)])
def test_megatron_family_matches_narayanan_eq2(name, billions):
    # Narayanan et al. 2021, eq. (2): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
    s = shape(name)
    p = 12 * s.L * s.h**2 * (1 + 13 / (12 * s.h) + (s.V + s.s_max) / (12 * s.L * s.h))
    assert s.params == pytest.approx(p, rel=2e-3)
    assert s.params == pytest.approx(billions * 1e9, rel=0.03)


def test_training_flops_closed_form_and_6n_rule():
    s = shape("gpt3-175b")
    B, seq = 1536, 2048
    expected = 72 * B * seq * s.L * s.h**2 * (1 + seq / (6 * s.h) + s.V / (12 * s.L * s.h))
    assert s.model_flops(B, seq) == pytest.approx(expected, rel=1e-12)
    # 6·N·tokens counts the GEMM FLOPs of the non-embedding parameters; the rest is the
    # attention s² term and the logits
    n_layers = s.L * s.layer_params
    six_n = 6 * n_layers * B * seq
    attention = 3 * B * s.L * 4 * seq * seq * s.h
    logits = 3 * B * 2 * seq * s.h * s.V
    assert s.model_flops(B, seq) == pytest.approx(six_n + attention + logits, rel=2e-3)


def test_hardware_flops_with_full_recompute_match_megatron_formula():
    # Narayanan et al. 2021 §5.1: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    cfg = ddlsim.load_config("examples/megatron-1t-3072-a100.yaml")
    r = ddlsim.predict(cfg)
    s = GPTShape.of(cfg.model)
    B, seq = cfg.train.global_batch_size, cfg.train.seq_length
    F = 96 * B * seq * s.L * s.h**2 * (1 + seq / (6 * s.h) + s.V / (16 * s.L * s.h))
    assert r.hardware_flops == pytest.approx(F, rel=2e-3)
