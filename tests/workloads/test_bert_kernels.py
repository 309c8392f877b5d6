"""The bert family's kernels (ddlsim/workloads/bert/kernels.py) against its FLOP counts and the
byte table of its module docstring, derived by hand."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.bert.kernels import embedding_kernels, head_kernels, layer_kernels


@pytest.fixture(scope="module")
def model():
    return ddlsim.load_config({
        "model": {"preset": "bert-large", "mlm_predictions_per_seq": 20},
        "parallel": {"data_parallel_size": 1},
        "train": {"micro_batch_size": 4, "global_batch_size": 4, "seq_length": 128},
        "system": {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 1}}).model


def _flops(kernels):
    return sum(2.0 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch
               for k in kernels if k.kind == "gemm")


@pytest.mark.parametrize("backward", [False, True])
def test_the_gemms_do_the_layers_flops(model, backward):
    b, s = 4, 128
    dense, core, passes = layer_kernels(model, b, s, 2.0, "fp16", backward)
    gemm, attn = model.layer_flops(b, s)
    k = 2.0 if backward else 1.0          # backward: data and weight gradient per GEMM
    assert _flops(dense) == pytest.approx(k * gemm)
    assert _flops(core) == pytest.approx(k * attn)
    assert len(dense) == (12 if backward else 6) and not _flops(passes)


def test_the_forward_passes_move_the_tables_bytes(model):
    b, s, d, h, f, a = 4, 128, 2.0, 1024, 4096, 16
    x, y, scores = b * s * h, b * s * f, b * a * s * s
    _, core, passes = layer_kernels(model, b, s, d, "fp16", False)
    # scale, mask, softmax: read + write; dropout: read + write + 1-byte mask
    assert sum(k.bytes for k in core) == pytest.approx((3 * 2 * d + 2 * d + 1) * scores)
    # context copy, 2 × (dropout, residual add, LayerNorm), bias-GeLU
    assert sum(k.bytes for k in passes) == pytest.approx(
        2 * d * x + 2 * ((2 * d + 1) * x + 3 * d * x + 2 * d * x) + 2 * d * y)
    # the backward moves each pass twice
    _, _, back = layer_kernels(model, b, s, d, "fp16", True)
    assert sum(k.bytes for k in back) == pytest.approx(2 * sum(k.bytes for k in passes))


def test_the_heads_run_over_the_masked_tokens(model):
    b, s, h, v = 4, 128, 1024, 30522
    fwd = head_kernels(model, b, s, 2.0, "fp16", False)
    # MLM transform and decoder over 20 tokens per sequence, pooler and NSP over b
    mlm, pooler_nsp = 2.0 * b * 20 * (h * h + v * h), 2.0 * b * (h * h + 2 * h)
    assert _flops(fwd) == pytest.approx(mlm + pooler_nsp)
    assert all(k.kind == "memory" for k in embedding_kernels(model, b, s, 2.0, "fp16", True))
