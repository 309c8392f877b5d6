"""The Hopper presets' 700 W sustained GEMM cap (``device.power_limits[700]``) is the lent
H200's own microbenchmark, and the rows it was not taken from check it (issue 29).

The cap comes from three rows of one file, the n = 16384 squares of
``benchmarks/data/device_h200_2026-11-30/run1/kernels/sustained.csv`` (held 3 s at the 700 W
limit); every row of the same run's ``gemm.csv`` and the file's n = 4096 and 8192 rows are
held out. The published MSMF it replaces (0.716 bf16/fp16, 0.651 fp8: the best shape of a
search) timed the held-out GEMMs at the cap 5.4 % (bf16), 9.1 % (fp16) and 7.8 % (fp8) fast.
"""

from __future__ import annotations

import csv
import warnings

import numpy as np
import pytest

from benchscripts import BENCH, load_script

from ddlsim.config import SystemConfig
from ddlsim.presets import get_preset
from ddlsim.simulator.kernels import kernel_device

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

RUN = BENCH / "data" / "device_h200_2026-11-30" / "run1" / "kernels"
#: the rows the cap is taken from (sustained.csv's n); the others are held out
FIT_N = 16384
#: dense peaks of the GH100 SXM (H100 datasheet; the H200's are the same), TFLOP/s
PEAK_TFLOPS = {"bf16": 989.4, "fp16": 989.4, "fp8": 1979.0}
HOPPER = ("dgx-h100", "dgx-h200", "grand-teton-h100")


def _system(name: str, **device) -> SystemConfig:
    spec = get_preset("system", name)
    spec = dict(spec, device=dict(spec["device"], **device))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SystemConfig.model_validate(spec)


def _sustained_rows() -> dict[tuple[int, str], float]:
    """(n, dtype) → sustained TFLOP/s of sustained.csv."""
    with open(RUN / "sustained.csv", newline="") as fh:
        return {(int(r["n"]), r["dtype"]): float(r["sustained_tflops"])
                for r in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def script():
    return load_script("device_compare")


@pytest.mark.parametrize("preset", HOPPER)
def test_the_700_w_cap_is_the_h200s_16384_rows(preset):
    """Each dtype's own row over the datasheet peak, to the digits written; the H100 presets
    take the same figures (the same die, clocks and limit)."""
    rows = _sustained_rows()
    entry = _system(preset).device.power_limits[700]
    for dtype, peak in PEAK_TFLOPS.items():
        assert entry.matmul_efficiency[dtype] == round(rows[(FIT_N, dtype)] / peak, 3)
    assert entry.attention == 1.0
    if preset != "grand-teton-h100":           # at its 500 W limit it takes another entry
        assert kernel_device(_system(preset)).sustained == dict(entry.matmul_efficiency)


def test_the_500_w_fp8_rate_follows_the_700_w_cap():
    """grand-teton-h100 at 500 W: bf16/fp16 measured there (0.563), fp8 derived as the 700 W
    sustained fp8 times the smaller of the two 16-bit ratios, bf16's 0.563 / 0.680."""
    dev = kernel_device(_system("grand-teton-h100"))
    assert dev.sustained["bf16"] == dev.sustained["fp16"] == 0.563
    assert dev.sustained["fp8"] == pytest.approx(0.624 * 0.563 / 0.680, rel=1e-12)


def test_held_out_sustained_rows_within_5_percent(script):
    """sustained.csv's n = 8192 rows, not used: the preset's time of each within 5 % of its
    3-s hold (they read -8.5 % bf16, -11.1 % fp16, -7.9 % fp8 at the MSMF cap)."""
    dev = kernel_device(_system("dgx-h200"))
    for dtype, tflops in ((d, t) for (n, d), t in _sustained_rows().items() if n == 8192):
        err = script.compare_sustained([dict(n="8192", dtype=dtype, burst_seconds="1",
                                             sustained_seconds=str(2 * 8192 ** 3 / tflops
                                                                   / 1e12))], dev)[0]
        assert abs(err) < 0.05, (dtype, err)


def test_held_out_gemms_at_the_cap_lean_neither_way(script, capsys):
    """gemm.csv's GEMMs the preset times at the cap: their signed mean error within 3 % for
    bf16 and fp16 and 6 % for fp8 (the FP8 kernels' own share of the ceiling is another
    figure); with the MSMF cap they read -5.4 %, -9.1 %, -7.8 %."""
    got = script.by_class(RUN, kernel_device(_system("dgx-h200")))
    capsys.readouterr()
    bound = {"bf16": 0.03, "fp16": 0.03, "fp8": 0.06}
    for dtype, b in bound.items():
        s = got[f"gemm {dtype} at the cap"]
        assert s["n"] >= 50 and abs(s["signed"]) < b, (dtype, s)


def test_by_class_splits_attention_into_its_passes(script, tmp_path, capsys):
    """The backward's error is (fwd+bwd − fwd) predicted over (fwd+bwd − fwd) measured."""
    (tmp_path / "attention.csv").write_text(
        "backend,dtype,b,heads,seq,head_dim,causal,fwd_s,fwd_bwd_s,cases\n"
        "flash,bf16,1,32,4096,128,True,1.0e-3,3.5e-3,x\n")
    dev = kernel_device(_system("dgx-h200"))
    got = script.by_class(tmp_path, dev)
    capsys.readouterr()
    fwd, both = (script.attention_s("flash2", 1, 32, 4096, 128, dev, b) for b in (False, True))
    assert got["attention flash d128 fwd"]["signed"] == pytest.approx(fwd / 1.0e-3 - 1)
    assert got["attention flash d128 bwd"]["signed"] == pytest.approx(
        (both - fwd) / 2.5e-3 - 1)
    assert got["attention flash d128 fwd+bwd"]["signed"] == pytest.approx(both / 3.5e-3 - 1)
    assert not any(k.startswith(("gemm", "memory")) for k in got)     # their files missing
    assert np.isfinite(got["attention flash d128 bwd"]["mean_abs"])
