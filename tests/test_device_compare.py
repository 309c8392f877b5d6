"""benchmarks/device_compare.py on a hand-made sweep in h100_kernels.py's columns: each figure
it prints is ddlsim's kernel functions called directly on the dgx-h200 preset (issues 29/30)."""

from __future__ import annotations

import json
import math

import pytest

from benchscripts import load_script

from ddlsim.simulator.kernels import attention_kernels, kernel_time
from ddlsim.simulator.kernels.gemm import GemmOverhead, gemm_time
from ddlsim.workloads.trace import Kernel

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: dgx-h200's device (ddlsim/data/systems.yaml): dense bf16 peak, MAMF (cublas-12), SMs,
#: HBM3e at the streaming fraction, MSMF at 700 W, gemm_overhead, launch (eager)
PEAK, ETA, SMS, BW = 989.4e12, 0.803, 132, 4.8e12 * 0.90
MSMF, OVER = 0.716, GemmOverhead(5.13e-6, 0.99e-6)
HOST, GAP = 6.5e-6 + 0.72e-6, 1.54e-6      # launch: measured on the lent H200 (2026-11-30)

GEMM_CSV = """m,n,k,batch,dtype,layout,origin,seconds,tflops
4096,4096,4096,1,bf16,linear TN,grid,2.0e-4,0.687
8192,8192,8192,1,bf16,linear TN,grid,1.5e-3,0.733
256,256,256,1,bf16,linear TN,grid,9.0e-6,0.0037
1024,1024,1024,1,bf16,failed,grid,nan,nan
4096,4096,4096,1,fp8_rowwise,scaled_mm TN,grid,1.2e-4,1.145
"""
ATTENTION_CSV = """backend,dtype,b,heads,seq,head_dim,causal,fwd_s,fwd_bwd_s,cases
flash,bf16,1,32,4096,128,True,1.0e-3,3.5e-3,x
math,bf16,1,2,128,64,True,5e-2,1e-1,y
"""
MEMORY_CSV = """kernel,bytes,seconds,GBps,elements,hidden,note
copy,4294967296,1.0e-3,4294.97,1073741824,,
rmsnorm_composite_fwd,3623878656,1.2e-3,3019.9,100663296,12288,
a_kernel_ddlsim_lacks,1000,1e-5,0.1,250,,
"""
SUSTAINED_CSV = """n,dtype,layout,calls,burst_seconds,sustained_seconds,burst_tflops,sustained_tflops,clocks
8192,bf16,linear TN,2000,1.4e-3,1.6e-3,785.4,687.2,"1410 MHz, 690 W, 0x1"
"""


@pytest.fixture(scope="module")
def script():
    return load_script("device_compare")


@pytest.fixture(scope="module")
def dev(script):
    from ddlsim.simulator.kernels import kernel_device
    return kernel_device(script.load_system("dgx-h200", "torchtitan-2025"))


@pytest.fixture
def sweep(tmp_path):
    for name, text in (("gemm", GEMM_CSV), ("attention", ATTENTION_CSV),
                       ("memory", MEMORY_CSV), ("sustained", SUSTAINED_CSV)):
        (tmp_path / f"{name}.csv").write_text(text)
    (tmp_path / "launch.json").write_text(json.dumps(
        {"host_launch_s": 13.0e-6, "eager_op_s": 0.72e-6, "stream_gap_s": 3.08e-6,
         "graph_gap_s": 0.18e-6}))
    return tmp_path


def test_the_dgx_h200_preset_is_the_h100_die_with_the_h200_memory(dev):
    from ddlsim.presets import get_preset
    h100, h200 = (get_preset("system", p)["device"] for p in ("dgx-h100", "dgx-h200"))
    assert h200["peak_flops"] == h100["peak_flops"] and h200["sm_count"] == 132
    assert h200["power_limits"] == h100["power_limits"]       # the H200's own MSMF
    assert dev.memory_Bps == pytest.approx(BW)
    assert dev.peak["bf16"] == PEAK and dev.matmul["bf16"] == ETA
    assert dev.sustained["bf16"] == MSMF and dev.launch.host_s == pytest.approx(HOST)


def test_gemm_errors_are_the_shape_model_and_the_kernel_model(script, dev, sweep):
    groups, failed = script.gemm_groups(script.read_rows(sweep / "gemm.csv"))
    assert failed == 1 and list(groups) == [("grid", "linear TN", "bf16"),
                                            ("grid", "scaled_mm TN", "fp8_rowwise")]
    pts = groups[("grid", "linear TN", "bf16")]
    shape = script.gemm_errors(pts, dev, dev.gemm_overhead)
    for p, e in zip(pts, shape):
        t = gemm_time(p.m, p.n, p.k, 1, 2, PEAK, ETA, SMS, BW, OVER)
        assert e == pytest.approx(t / p.seconds - 1)
    n = 8192                                   # capped at 700 W's sustained rate, one launch
    t = max(gemm_time(n, n, n, 1, 2, PEAK, ETA, SMS, BW, OVER), 2 * n ** 3 / (PEAK * MSMF))
    assert script.gemm_kernel_s(pts[1], dev) == pytest.approx(max(t + GAP, HOST))
    small = gemm_time(256, 256, 256, 1, 2, PEAK, ETA, SMS, BW, OVER)  # its fixed costs
    assert script.gemm_kernel_s(pts[2], dev) == pytest.approx(max(small + GAP, HOST))


def test_attention_is_ddlsims_flash2_forward_and_backward(script, dev, sweep):
    errs = script.compare_attention(script.read_rows(sweep / "attention.csv"), dev)
    fwd, bwd = (attention_kernels("flash2", 1, 32, 4096, 128, 2, False, b)[0]
                for b in (False, True))
    t_fwd = kernel_time(fwd, dev) + GAP
    assert len(errs) == 2                                      # the math backend: none
    assert errs[0] == pytest.approx(t_fwd / 1.0e-3 - 1)
    assert errs[1] == pytest.approx((t_fwd + kernel_time(bwd, dev) + GAP) / 3.5e-3 - 1)


def test_memory_kernels_by_ddlsims_passes(script, dev, sweep, capsys):
    errs = script.compare_memory(script.read_rows(sweep / "memory.csv"), dev)
    assert len(errs) == 2 and "no counterpart" in capsys.readouterr().out
    el = 1 << 30                                                # copy: read 2, write 2 B
    assert errs[0] == pytest.approx((4 * el / BW + GAP) / 1.0e-3 - 1)
    el, h = 100663296, 12288                    # the composite RMSNorm: 8 kernels, 36 B
    norm_Bps = 4.8e12 * 0.591                   # dgx-h200's norm class (its memory.csv)
    passes = [6, 8, 4, 8 / h, 8 / h, 8, 6, 4]
    device_s = sum(p * el / norm_Bps for p in passes) + 8 * GAP
    assert errs[1] == pytest.approx(device_s / 1.2e-3 - 1)


def test_sustained_and_launch(script, dev, sweep):
    errs = script.compare_sustained(script.read_rows(sweep / "sustained.csv"), dev)
    k = Kernel("gemm", (8192, 8192, 8192))
    assert errs == [pytest.approx(kernel_time(k, dev) / 1.6e-3 - 1)]
    assert kernel_time(k, dev) == pytest.approx(2 * 8192 ** 3 / (PEAK * MSMF))
    spec = script.load_system("dgx-h200", "torchtitan-2025").device.launch  # 6.5, 0.72, 1.54, 0.18 us
    errs = script.compare_launch(sweep, spec, dev)
    assert errs == pytest.approx([-0.5, 0.0, -0.5, 0.0])


def test_main_ends_with_one_summary_line_per_part(script, sweep, capsys):
    summary = script.compare(sweep, script.load_system("dgx-h200", "torchtitan-2025"))
    tail = capsys.readouterr().out.splitlines()[-5:]
    assert [line.split()[0] for line in tail] == list(script.PARTS)
    assert summary["memory"]["no_counterpart"] == 1 and summary["gemm"]["n"] == 4
    assert all(math.isfinite(summary[p]["mean_abs"]) for p in script.PARTS)


def test_a_missing_folder_is_refused_by_name(script, tmp_path, capsys):
    with pytest.raises(SystemExit):
        script.main(["--dir", str(tmp_path / "nowhere")])
    assert "nowhere" in capsys.readouterr().err


def test_the_sweeps_own_gemm_library_takes_the_h200s_cu130_mamf(script):
    from ddlsim.simulator.kernels import kernel_device
    dev = kernel_device(script.load_system("dgx-h200", "torchtitan-2025", "cublas-13"))
    assert dev.matmul == {"bf16": 0.851, "fp16": 0.851, "fp8": 0.754}


def test_fp8_rowwise_rows_are_fp8_gemms_on_the_cutlass_rowwise_kernel(script, dev, sweep):
    """h100_kernels.py's fp8_rowwise rows: ddlsim's fp8 GEMM (1-byte operands, the fp8 peak
    and ceiling) on PyTorch's CUTLASS row-wise kernel, 0.95 of that ceiling (fp8recipe)."""
    groups, _ = script.gemm_groups(script.read_rows(sweep / "gemm.csv"))
    (p,) = groups[("grid", "scaled_mm TN", "fp8_rowwise")]
    assert p.dtype == "fp8"
    n, peak = 4096, 1979e12
    t = gemm_time(n, n, n, 1, 1, peak, 0.734 * 0.95, SMS, BW, OVER)
    t = max(t, 2 * n ** 3 / (peak * 0.651))                  # 700 W's sustained fp8
    errs = script.compare_gemms(script.read_rows(sweep / "gemm.csv"), dev, False)
    assert errs[-1] == pytest.approx(max(t + GAP, HOST) / 1.2e-4 - 1)
