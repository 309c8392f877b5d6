"""Sustained rates at a board power limit (ddlsim/simulator/kernels/power.py): the H100 of
torchtitan's runs at its 500 W limit, from the measurement its preset cites
(facebookexperimental/triton PR 854: cuBLAS fp16 8192³ at 557.2 TFLOP/s, attention × 0.86),
and the sustained (power-saturated) rates at the ceilings' own limit: MSMF of the H200 SXM at
700 W (stas00/ml-engineering 996698d) and H. He's A100 at 400 W."""

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
    """The burst shape model gives 770 TFLOP/s at 700 W (989.4 × 0.803 × 0.970, the wave
    quantisation of 8192³ on 132 SMs), which the 700 W sustained rate 0.716 caps at 708
    TFLOP/s; the 500 W rate 0.563 of peak caps it at 557 TFLOP/s."""
    burst = 989.4 * 0.803 * 2048 / (16 * 132)
    assert burst == pytest.approx(770.4, abs=0.05)
    assert _gemm_tflops(_device(power_limit_W=700), 8192) == pytest.approx(
        989.4 * 0.716, rel=1e-9)
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
    """fp8 is not measured at 500 W: its sustained 700 W rate × bf16's 500 W / 700 W ratio
    (sustained against sustained, not against the burst ceilings)."""
    dev = kernel_device(_device())
    assert dev.sustained["fp8"] == pytest.approx(0.651 * 0.563 / 0.716, rel=1e-12)


def test_attention_scaled_memory_kernels_not():
    d500, d700 = kernel_device(_device()), kernel_device(_device(power_limit_W=700))
    shape = (8192.0, 8192.0, 128.0)
    assert d500.flash("flash3", "bf16", shape) == pytest.approx(
        0.86 * d700.flash("flash3", "bf16", shape), rel=1e-12)
    mem = Kernel("memory", bytes=1e9)
    assert kernel_time(mem, d500) == kernel_time(mem, d700)


def test_a_users_efficiency_unchanged():
    own = _device().model_copy(update={"compute_efficiency": 0.5})
    dev = kernel_device(own)
    assert dev.sustained is None and dev.attention_scale == 1.0


#: MSMF of "NVIDIA H200 SXM", stas00/ml-engineering compute/accelerator/README.md at 996698d:
#: TFLOP/s and the table's Theory (BF16 8192x8448x20480, FP8 8448x8192x16384; ~693 W)
MSMF_H200 = {"bf16": (708.5, 989), "fp8": (1288.7, 1979)}


@pytest.mark.parametrize("preset", ["dgx-h100", "grand-teton-h100"])
def test_the_h100_sustains_the_msmf_of_the_same_die_at_700_w(preset):
    dev = _device(preset, power_limit_W=700).device
    entry = dev.power_limits[700]
    for dtype, (tflops, theory) in MSMF_H200.items():
        assert entry.matmul_efficiency[dtype] == round(tflops / theory, 3)
    assert entry.matmul_efficiency["fp16"] == entry.matmul_efficiency["bf16"]
    assert entry.attention == 1.0
    # both MSMF shapes fill whole waves of 256x128 tiles: the rate is the ceiling, q = 1
    from ddlsim.simulator.kernels.gemm import gemm_quantisation
    assert gemm_quantisation(8192, 8448, 1, 132, 20480) == 1.0
    assert gemm_quantisation(8448, 8192, 1, 132, 16384) == 1.0
    k = kernel_device(_device(preset, power_limit_W=700))
    assert k.sustained == {"bf16": 0.716, "fp16": 0.716, "fp8": 0.651}
    assert k.attention_scale == 1.0


def test_the_a100_sustains_its_400_w_randn_measurement():
    """H. He: an A100 at 400 W runs randn 8192³ at 258 TFLOP/s; 258 / 312 / q."""
    from ddlsim.simulator.kernels.gemm import gemm_quantisation
    dev = _device("dgx-a100").device
    q = gemm_quantisation(8192, 8192, 1, 108, 8192)
    assert dev.power_limits[400].matmul_efficiency == {"fp16": round(258 / 312 / q, 3),
                                                        "bf16": 0.829}
    a100 = _device("dgx-a100")
    assert _gemm_tflops(a100, 16384, "bf16") == pytest.approx(312 * 0.829, rel=1e-9)
    # the 2021 stack's cuBLAS 11 ceiling (0.739) is below the cap: not slowed
    k11 = kernel_device(a100.model_copy(update={"software": "megatron-lm-2021"}))
    big = Kernel("gemm", (16384, 16384, 16384), dtype="bf16")
    assert 2 * 16384 ** 3 / kernel_time(big, k11) / 312e12 == pytest.approx(0.739 * 0.998,
                                                                          rel=2e-3)


def test_a_gemm_below_the_sustained_rate_is_not_slowed_at_700_w():
    """The cap slows only GEMMs the burst shape model puts above it (a skinny one is not)."""
    skinny = Kernel("gemm", (128, 4096, 4096), dtype="bf16")
    capped = kernel_device(_device("dgx-h100"))
    burst = kernel_device(_device("dgx-h100", power_limits=None))
    assert burst.sustained == {}
    assert kernel_time(skinny, capped) == kernel_time(skinny, burst)
    big = Kernel("gemm", (8192, 8448, 20480), dtype="bf16")
    assert kernel_time(big, capped) > kernel_time(big, burst)


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
    with pytest.raises(ConfigError, match=r"power_limits.700.attention = 0.9 but 700 W is "
                                          r"matmul_power_limit_W.*allowed: 1"):
        _loaded(power_limits={700: {"matmul_efficiency": {"bf16": 0.7}, "attention": 0.9}})
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
