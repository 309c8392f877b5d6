"""Sustained rates at a board power limit (ddlsim/simulator/kernels/power.py): the H100 of
torchtitan's runs at its 500 W limit, from the measurement its preset cites
(facebookexperimental/triton PR 854: cuBLAS fp16 8192³ at 557.2 TFLOP/s, attention × 0.86)."""

import warnings

import pytest

from ddlsim.config import SystemConfig
from ddlsim.errors import ConfigError
from ddlsim.presets import get_preset
from ddlsim.simulator.kernels.device import kernel_device, kernel_time
from ddlsim.workloads.trace import Kernel

#: the preset's source: torch.matmul of randn fp16 8192³ under a 500 W cap, TFLOP/s
MEASURED_8192_TFLOPS = 557.213551
PEAK_FP16 = 989.4e12


def _device(name: str = "grand-teton-h100", **device):
    spec = get_preset("system", name)
    spec = dict(spec, device=dict(spec["device"], **device))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SystemConfig.model_validate(spec)


def _gemm_tflops(system, n: float, dtype: str = "fp16") -> float:
    dev = kernel_device(system)
    return 2.0 * n ** 3 / kernel_time(Kernel("gemm", (n, n, n), dtype=dtype), dev) / 1e12


def test_preset_runs_at_torchtitans_500_w_with_ceilings_from_700_w():
    dev = _device().device
    assert (dev.power_limit_W, dev.matmul_power_limit_W) == (500, 700)
    entry = dev.power_limits[500]
    assert entry.matmul_efficiency == {"fp16": 0.563, "bf16": 0.563}
    assert entry.attention == 0.86
    # the rate is the measured 8192³ rate over the datasheet peak, to the digits written
    assert entry.matmul_efficiency["fp16"] == pytest.approx(
        MEASURED_8192_TFLOPS * 1e12 / PEAK_FP16, abs=5e-4)


def test_8192_gemm_at_500_w_runs_at_the_measured_rate():
    """The shape model gives 770 TFLOP/s at 700 W (989.4 × 0.803 × 0.970, the wave
    quantisation of 8192³ on 132 SMs); the 500 W rate 0.563 of peak caps it at 557 TFLOP/s."""
    assert _gemm_tflops(_device(power_limit_W=700), 8192) == pytest.approx(
        989.4 * 0.803 * 2048 / (16 * 132), rel=1e-6)
    assert _gemm_tflops(_device(), 8192) == pytest.approx(989.4 * 0.563, rel=1e-9)
    assert _gemm_tflops(_device(), 8192) == pytest.approx(MEASURED_8192_TFLOPS, rel=1e-3)


def test_the_same_runs_smaller_gemms_within_their_measured_rates():
    """The source's 4096³ and 2048³ ran at 623.2 and 600.5 TFLOP/s at 500 W: the model
    (the cap, or the shape model's slower 2048³) stays within 11 % below them."""
    sys500 = _device()
    assert _gemm_tflops(sys500, 4096) == pytest.approx(557.2, rel=1e-3)
    assert 0.89 < _gemm_tflops(sys500, 4096) / 623.2 < 1.0
    assert 0.89 < _gemm_tflops(sys500, 2048) / 600.5 < 1.0


def test_a_gemm_slower_than_the_cap_at_700_w_is_not_slowed():
    skinny = Kernel("gemm", (128, 4096, 4096), dtype="bf16")
    t500 = kernel_time(skinny, kernel_device(_device()))
    t700 = kernel_time(skinny, kernel_device(_device(power_limit_W=700)))
    assert t500 == t700


def test_fp8_takes_the_measured_clock_ratio_derived():
    dev = kernel_device(_device())
    assert dev.sustained["fp8"] == pytest.approx(0.709 * 0.563 / 0.803, rel=1e-12)


def test_attention_scaled_memory_kernels_not():
    d500, d700 = kernel_device(_device()), kernel_device(_device(power_limit_W=700))
    shape = (8192.0, 8192.0, 128.0)
    assert d500.flash("flash3", "bf16", shape) == pytest.approx(
        0.86 * d700.flash("flash3", "bf16", shape), rel=1e-12)
    mem = Kernel("memory", bytes=1e9)
    assert kernel_time(mem, d500) == kernel_time(mem, d700)


def test_dgx_h100_and_a_users_efficiency_unchanged():
    assert kernel_device(_device("dgx-h100")).sustained == {}
    own = _device().model_copy(update={"compute_efficiency": 0.5})
    dev = kernel_device(own)
    assert dev.sustained is None and dev.attention_scale == 1.0


def test_unmeasured_limit_refused_with_the_allowed_ones():
    assert _loaded().system.device.power_limit_W == 500
    assert _loaded(power_limit_W=700).system.device.power_limit_W == 700
    with pytest.raises(ConfigError, match=r"power_limit_W = 600 W .* no entry for 600 W; "
                                          r"allowed: 500, 700 W"):
        _loaded(power_limit_W=600)


def test_power_limits_entry_checked():
    with pytest.raises(ConfigError, match=r"power_limits.500.matmul_efficiency has unknown "
                                          r"dtype 'bf61'"):
        _loaded(power_limits={500: {"matmul_efficiency": {"bf61": 0.5}, "attention": 0.9}})
    with pytest.raises(ConfigError, match=r"has no dtype of matmul_efficiency"):
        _loaded(power_limits={500: {"matmul_efficiency": {"tf32": 0.5}, "attention": 0.9}})
    with pytest.raises(ConfigError, match=r"power_limits needs matmul_power_limit_W"):
        _loaded(matmul_power_limit_W=None, power_limit_W=None)


def _loaded(**device):
    """Load grand-teton-h100 with ``device`` overrides the way a user's config is loaded."""
    from ddlsim import load_config
    spec = get_preset("system", "grand-teton-h100")
    spec = dict(spec, device={k: v for k, v in dict(spec["device"], **device).items()
                              if v is not None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config({"model": "llama-3.1-8b", "system": spec,
                            "parallel": {"data_parallel_size": 8},
                            "train": {"global_batch_size": 8, "micro_batch_size": 1,
                                      "seq_length": 2048}})
