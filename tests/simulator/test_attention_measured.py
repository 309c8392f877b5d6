"""The fused attention kernels timed from published measurements (ddlsim/data/
attention_measured.csv; ddlsim/simulator/kernels/attention_measured.py)."""

from __future__ import annotations

import math

import pytest

import ddlsim
from ddlsim.simulator.kernels import attention_kernels, causal_fraction, kernel_device, \
    kernel_time
from ddlsim.simulator.kernels.attention import parse_flash_variant
from ddlsim.simulator.kernels.attention_measured import measured_efficiency, measured_gpus

GPU, PEAK = "h100-sxm5", 989.4e12     # the table's H100 SXM5: datasheet dense BF16 peak


def _cfg(preset: str, software: str | None = None) -> dict:
    system = {"preset": preset, "nodes": 1, "devices_per_node": 1}
    if software:
        system["software"] = software
    return {"model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
                      "vocab_size": 1024, "max_position_embeddings": 8192},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 4096},
            "system": system}


def _dev(preset: str = "dgx-h100"):
    return kernel_device(ddlsim.load_config(_cfg(preset)).system)


@pytest.mark.parametrize("kernel, pass_, d, s, tflops", [
    ("flash2", "fwd", 128, 4096, 368),   # FA3 paper Fig. 5, no mask, head dim 128
    ("cudnn", "fwd", 64, 512, 335),      # Fig. 5, no mask, head dim 64
    ("flash3", "bwd", 128, 16384, 561),  # Fig. 6, head dim 128
])
def test_a_measured_point_is_its_bar(kernel, pass_, d, s, tflops):
    assert measured_efficiency(GPU, kernel, pass_, False, d, s) == pytest.approx(
        tflops / 989.4, rel=1e-12)


def test_a_causal_bar_is_converted_to_the_blocks_ddlsim_counts():
    # published: half of 4·b·a·s²·d per time; ddlsim: (n+1)/(2n) of it, so the kernel time
    # is the measured one: Fig. 5 causal head dim 128, FA2 at 2k = 298 TFLOP/s
    b, a, s, d = 8, 16, 2048, 128
    (k,) = attention_kernels("flash2", b, a, s, d, 2, False, False)
    published = 0.5 * 4 * b * a * s * s * d / 298e12
    assert kernel_time(k, _dev()) == pytest.approx(published, rel=1e-12)
    assert measured_efficiency(GPU, "flash2", "fwd", True, d, s) == pytest.approx(
        298 / 989.4 * causal_fraction(s) / 0.5, rel=1e-12)


def test_lengths_interpolate_in_log_s_and_clamp_at_the_ends():
    at = lambda s: measured_efficiency(GPU, "flash2", "fwd", False, 128, s)  # noqa: E731
    # halfway between 1k (350) and 2k (362) in log2 s
    assert at(1024 * math.sqrt(2)) == pytest.approx(356 / 989.4, rel=1e-12)
    assert at(128) == at(512) == pytest.approx(309 / 989.4)
    assert at(131072) == at(16384) == pytest.approx(370 / 989.4)


def test_the_nearest_head_dim_is_used():
    eta = lambda d: measured_efficiency(GPU, "flash2", "bwd", False, d, 4096)  # noqa: E731
    assert eta(96) == eta(128) and eta(80) == eta(64) and eta(256) == eta(128)
    assert eta(64) == pytest.approx(279 / 989.4) and eta(128) == pytest.approx(310 / 989.4)


def test_the_causal_head_dim_64_forward_is_its_own_curve():
    # Fig. 5, causal, head dim 64: cuDNN at 8k = 379 TFLOP/s (not the head dim 128 curve)
    s = 8192
    assert measured_efficiency(GPU, "cudnn", "fwd", True, 64, s) == pytest.approx(
        379 / 989.4 * causal_fraction(s) / 0.5, rel=1e-12)


def test_a_causal_backward_takes_the_forward_mask_ratio():
    # no causal backward is published: the non-causal backward × causal/non-causal forward
    s = 4096
    fwd_c = 319 / 989.4 * causal_fraction(s) / 0.5
    expected = 310 / 989.4 * fwd_c / (368 / 989.4)
    assert measured_efficiency(GPU, "flash2", "bwd", True, 128, s) == pytest.approx(
        expected, rel=1e-12)


def test_no_curve_falls_back_to_the_device_figure():
    assert measured_efficiency("a100-sxm4", "flash2", "fwd", True, 128, 4096) is None
    assert measured_efficiency(GPU, "flash4", "fwd", True, 128, 4096) is None
    a100 = _dev("dgx-a100")                      # no table: attention_efficiency
    assert a100.attention_gpu is None
    (k,) = attention_kernels("flash2", 1, 16, 4096, 128, 2, False, True)
    assert a100.flash(k.variant, "bf16", k.shape) == 0.62
    # cuDNN on a device with no cudnn figure: FlashAttention-2's (TE's choice off Hopper)
    (c,) = attention_kernels("cudnn", 1, 16, 4096, 128, 2, False, True)
    assert a100.flash(c.variant, "bf16", c.shape) == 0.62


def test_kernels_carry_pass_mask_and_shape():
    (f,) = attention_kernels("cudnn", 2, 16, 4096, 128, 2, False, True, causal=False)
    assert f.shape == (4096, 4096, 128)
    assert parse_flash_variant(f.variant) == ("cudnn", "bwd", False, False)
    assert parse_flash_variant("flash2") == ("flash2", "fwd", True, False)


def test_attention_dropout_slows_cudnn_by_its_measured_factor():
    # TE#3312: cuDNN's fused attention fwd + bwd 0.594 -> 0.614 ms with dropout 0.1 (H200, sbhd)
    from ddlsim.simulator.kernels import kernel_time
    dev = _dev("dgx-h100")
    for backward in (False, True):
        (plain,) = attention_kernels("cudnn", 1, 16, 4096, 128, 2, False, backward)
        (drop,) = attention_kernels("cudnn", 1, 16, 4096, 128, 2, True, backward)
        assert parse_flash_variant(drop.variant).dropout and drop.flops == plain.flops
        assert kernel_time(drop, dev) / kernel_time(plain, dev) == pytest.approx(0.614 / 0.594)
    # no published figure for FlashAttention-2's dropout: its time unchanged, and so is cuDNN's
    # kind off Hopper, where TE runs FlashAttention-2 (an A100 has no cudnn figure)
    a100 = _dev("dgx-a100")
    for kind, d in (("flash2", dev), ("cudnn", a100)):
        (plain,) = attention_kernels(kind, 1, 16, 4096, 128, 2, False, False)
        (drop,) = attention_kernels(kind, 1, 16, 4096, 128, 2, True, False)
        assert kernel_time(drop, d) == kernel_time(plain, d)


def test_the_h100_presets_use_the_table_and_megatron_core_runs_cudnn():
    assert _dev("dgx-h100").attention_gpu == _dev("grand-teton-h100").attention_gpu == GPU
    assert GPU in measured_gpus()
    for stack, kind in [("megatron-core-2024", "cudnn"), ("megatron-core-2025", "cudnn"),
                        ("torchtitan-2024", "flash2"), ("torchtitan-2025", "flash2")]:
        sw = ddlsim.load_config(_cfg("dgx-h100", stack)).software
        assert sw.attention == kind


def test_an_unknown_measured_gpu_is_refused():
    from ddlsim.errors import ConfigError
    d = _cfg("dgx-h100")
    dev = ddlsim.load_config(d).system.device.model_dump()
    dev["attention_measured"] = "h100-sxm"
    d["system"]["device"] = dev
    with pytest.raises(ConfigError, match="attention_measured = 'h100-sxm'.*allowed: "
                                          "h100-sxm5"):
        ddlsim.load_config(d)
