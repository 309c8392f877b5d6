"""The epilogue of a GEMM that accumulates into a wider buffer (``β = 1``: Megatron's fused
weight gradient into an fp32 ``main_grad``), serialized with the main loop on a device whose
GEMM kernels hold one tile per SM (``device.gemm_epilogue: serialized``; docs/compute.md, "The
epilogue of an accumulating GEMM"; ddlsim/simulator/kernels/gemm.py).

Expected times are derived by hand: a wave of ``SMs`` tiles of ``Tm × Tn`` outputs moves
``SMs·Tm·Tn·(2·c − 2)`` bytes more than a bf16 store, at the device's memory bandwidth.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels import kernel_device
from ddlsim.simulator.kernels.device import kernel_time
from ddlsim.simulator.kernels.gemm import GEMM_TILE, epilogue_increment_bytes, gemm_time
from ddlsim.workloads.decoder.wgrad import into_main_grad
from ddlsim.workloads.trace import Kernel

PEAK, CEILING, SMS, BW = 312e12, 0.829, 108, 1.8351e12   # an A100's, rounded


def _cfg(preset: str, **device) -> dict:
    system = {"preset": preset, "nodes": 1, "devices_per_node": 1,
              "software": "megatron-core-2024"}
    if device:
        system["device"] = device
    return {"model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16,
                      "vocab_size": 1024, "max_position_embeddings": 2048},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048},
            "system": system}


@lru_cache(maxsize=None)
def _device(preset: str):
    return kernel_device(ddlsim.load_config(_cfg(preset)).system)


@pytest.mark.parametrize("b, c, extra", [(2, 4, 6.0), (2, 2, 2.0), (1, 4, 6.0), (2, 0, 0.0)])
def test_increment_is_the_buffer_read_and_write_less_a_16_bit_store(b, c, extra):
    assert epilogue_increment_bytes(b, c) == extra


def test_one_full_wave_pays_its_epilogue_after_its_main_loop():
    # 9 × 12 tiles of 256 × 128 (and 18 × 6 the other way): one wave of 108, no split-K
    tm, tn = GEMM_TILE
    M, N, K = 9 * tm, 12 * tn, 8192
    flops = 2.0 * M * N * K
    plain = gemm_time(M, N, K, 1, 2, PEAK, CEILING, SMS, BW)
    fused = gemm_time(M, N, K, 1, 2, PEAK, CEILING, SMS, BW, epilogue_bytes=6.0)
    assert plain == pytest.approx(flops / (PEAK * CEILING), rel=1e-12)
    assert fused - plain == pytest.approx(SMS * tm * tn * 6.0 / BW, rel=1e-9)


def test_two_waves_pay_it_twice():
    tm, tn = GEMM_TILE
    M, N, K = 18 * tm, 12 * tn, 8192
    plain = gemm_time(M, N, K, 1, 2, PEAK, CEILING, SMS, BW)
    fused = gemm_time(M, N, K, 1, 2, PEAK, CEILING, SMS, BW, epilogue_bytes=6.0)
    assert fused - plain == pytest.approx(2 * SMS * tm * tn * 6.0 / BW, rel=1e-9)


def test_a_memory_bound_gemm_pays_its_bytes_once():
    # K = 16: the roofline's bytes (C read and written in fp32 among them) bound it already
    M, N, K = 8192, 8192, 16
    nbytes = (M * K + K * N) * 2 + M * N * 8.0
    t = gemm_time(M, N, K, 1, 2, PEAK, CEILING, SMS, BW, None, nbytes, 6.0)
    assert t == pytest.approx(nbytes / BW, rel=1e-12)


def test_no_increment_leaves_the_model_as_it_was():
    for shape in ((4096, 4096, 4096), (1000, 3000, 512), (128, 128, 65536)):
        assert gemm_time(*shape, 1, 2, PEAK, CEILING, SMS, BW, epilogue_bytes=0.0) \
            == gemm_time(*shape, 1, 2, PEAK, CEILING, SMS, BW)


def _wgrad(main_grad: int):
    pair = (Kernel("gemm", (2048, 12288, 4608)), Kernel("gemm", (12288, 4608, 2048)))
    return into_main_grad(pair, main_grad)[1]


def test_the_fused_weight_gradient_carries_its_buffer():
    assert _wgrad(4).accumulate_bytes == 4.0
    assert _wgrad(0).accumulate_bytes == 0.0


def test_a100_serializes_the_epilogue_an_overlapped_device_hides_it():
    """The A100 and Hopper presets serialize it (Hopper: the lent H200's measurement,
    tests/test_megatron_h100_wgrad.py); a device marked ``overlapped`` pays the bytes in its
    roofline only."""
    fused = _wgrad(4)
    same_bytes = Kernel("gemm", fused.shape, bytes=fused.bytes)
    a100 = _device("dgx-a100")
    h100 = kernel_device(ddlsim.load_config(_cfg("dgx-h100", gemm_epilogue="overlapped")).system)
    assert a100.gemm_epilogue_serialized and _device("dgx-h100").gemm_epilogue_serialized
    assert not h100.gemm_epilogue_serialized
    # 175B's QKV weight gradient at TP 8 over 2,048 tokens: 48 × 36 tiles, 16 full waves on
    # A100 (q = 1); compute-bound, so the main loop runs at the ceiling, the epilogue's extra
    # bytes follow it, and the board's sustained rate (its power limit) bounds the whole
    flops = 2.0 * 12288 * 4608 * 2048
    peak = a100.peak_flops("bf16")
    main = flops / (peak * a100.ceiling("bf16"))
    extra = 16 * SMS * 256 * 128 * 6.0 / a100.memory_Bps
    capped = flops / (peak * a100.sustained_rate("bf16"))
    assert kernel_time(same_bytes, a100) == pytest.approx(max(main, capped), rel=1e-12)
    assert kernel_time(fused, a100) == pytest.approx(max(main + extra, capped), rel=1e-12)
    assert kernel_time(fused, a100) > kernel_time(same_bytes, a100)
    assert kernel_time(fused, h100) == kernel_time(same_bytes, h100)


def test_a_bad_epilogue_value_is_refused_by_name():
    with pytest.raises(ConfigError, match="gemm_epilogue"):
        ddlsim.load_config(_cfg("dgx-a100", gemm_epilogue="hidden"))
