"""benchmarks/device_compare.py's signed error by kernel class (issue 29): which way each
class of ddlsim's Hopper kernel model leans against the lent H200's sweep
(``benchmarks/data/device_h200_2026-11-30/run1/kernels``)."""

from __future__ import annotations

import warnings

import pytest

from benchscripts import BENCH, load_script

from ddlsim.config import SystemConfig
from ddlsim.presets import get_preset
from ddlsim.simulator.kernels import kernel_device, kernel_time
from ddlsim.workloads.trace import Kernel

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

RUN = BENCH / "data" / "device_h200_2026-11-30" / "run1" / "kernels"


@pytest.fixture(scope="module")
def script():
    return load_script("device_compare")


@pytest.fixture(scope="module")
def dev():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kernel_device(SystemConfig.model_validate(get_preset("system", "dgx-h200")))


def _point(script, n: int, dtype: str = "bf16"):
    return script.GemmPoint("x", "", dtype, 1, n, n, n, 1.0, "measured")


def test_a_gemm_is_at_the_cap_where_the_power_limits_rate_times_it(script, dev):
    """16384³ runs at the 700 W sustained rate (the shape model's burst is faster); 256³ is
    slower than the rate by its fixed costs and keeps the shape model's time."""
    big, small = _point(script, 16384), _point(script, 256)
    assert kernel_time(Kernel("gemm", (16384,) * 3, dtype="bf16"), dev) == pytest.approx(
        big.flops / (dev.peak_flops("bf16") * dev.sustained_rate("bf16")))
    assert script.gemm_class(big, dev) == "gemm bf16 at the cap"
    assert script.gemm_class(small, dev) == "gemm bf16 below the cap"


def test_the_classes_partition_the_sweep(script, dev, capsys):
    """Every measured GEMM, attention pass and memory kernel with a counterpart is in one
    class: the GEMM classes hold the sweep's 483 rows, attention's fwd and fwd+bwd classes
    its 80 calls, the memory classes its 31 kernels with a counterpart."""
    got = script.by_class(RUN, dev)
    out = capsys.readouterr().out
    assert out.startswith("Signed error by class")
    n = {p: sum(s["n"] for k, s in got.items() if k.startswith(p)) for p in ("gemm", "memory")}
    assert n == {"gemm": 483, "memory": 31}
    attn = [s["n"] for k, s in got.items() if k.startswith("attention") and
            k.endswith(("fwd", "fwd+bwd"))]
    assert sum(attn) == 80
    # the sweep's large GEMMs, back to back at the saturated 700 W clock, read faster in
    # ddlsim than measured (docs/compute.md, "Sustained clocks")
    assert all(got[f"gemm {d} at the cap"]["signed"] < 0 for d in ("bf16", "fp16", "fp8"))


def test_memory_kernels_by_ddlsims_class(script):
    assert script.memory_class("adamw_fused") == "optimizer"
    assert script.memory_class("copy") == "stream"
    assert script.memory_class("rmsnorm_composite_fwd") == "norm"
    assert script.memory_class("softmax_bwd") == "softmax_backward"


def test_by_class_splits_attention_into_its_passes(script, dev, tmp_path, capsys):
    """The backward's error is (fwd+bwd − fwd) predicted over (fwd+bwd − fwd) measured."""
    (tmp_path / "attention.csv").write_text(
        "backend,dtype,b,heads,seq,head_dim,causal,fwd_s,fwd_bwd_s,cases\n"
        "flash,bf16,1,32,4096,128,True,1.0e-3,3.5e-3,x\n")
    got = script.by_class(tmp_path, dev)
    capsys.readouterr()
    fwd, both = (script.attention_s("flash2", 1, 32, 4096, 128, dev, b) for b in (False, True))
    assert got["attention flash d128 fwd"]["signed"] == pytest.approx(fwd / 1.0e-3 - 1)
    assert got["attention flash d128 bwd"]["signed"] == pytest.approx(
        (both - fwd) / 2.5e-3 - 1)
    assert got["attention flash d128 fwd+bwd"]["signed"] == pytest.approx(both / 3.5e-3 - 1)
    assert not any(k.startswith(("gemm", "memory")) for k in got)     # their files missing
