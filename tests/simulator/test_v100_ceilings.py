"""The V100 presets' matmul ceilings: one measurement per dtype (mli/transformers-benchmarks
micro_bench.ipynb, commit 53a232b, a Tesla V100-SXM2-16GB under CUDA 11.7), so no dtype a V100
row computes in takes another dtype's figure (docs/compute.md, "Device constants")."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import DDLSimWarning
from ddlsim.simulator.kernels import gemm_quantisation, kernel_device
from ddlsim.simulator.kernels.device import matmul_ceilings

V100_PRESETS = ("dgx1-v100", "dgx2-v100")
#: micro_bench.ipynb at 53a232b, the "Matrix Multiplication" cell: n = 8192, TFLOP/s
MEASURED = {"fp16": 94.904, "fp32": 14.426}
#: NVIDIA V100 datasheet (SXM2): Tensor Core fp16 and FP32 peaks, TFLOP/s
PEAK = {"fp16": 125.0, "fp32": 15.7}


def _system(preset: str, library: str = "cublas-11"):
    return ddlsim.load_config({
        "model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16,
                  "vocab_size": 1024, "max_position_embeddings": 2048},
        "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048,
                  "dtype": "fp16"},
        "system": {"preset": preset, "nodes": 1, "devices_per_node": 1,
                   "software": {"kernels": {"gemm_library": library}}}}).system


@pytest.mark.parametrize("preset", V100_PRESETS)
def test_each_v100_ceiling_is_its_dtype_measurement_over_peak_and_quantisation(preset):
    """8192³ fills 2,048 tiles of 26 waves of 80 SMs, so the ceiling behind each measured
    TFLOP/s is measured / peak / that fraction."""
    dev = _system(preset).device
    q = gemm_quantisation(8192, 8192, 1, dev.sm_count, 8192)
    assert q == pytest.approx(2048 / (26 * 80))
    assert dev.matmul_library == "cublas-11"
    assert dev.matmul_efficiency == {d: round(MEASURED[d] / PEAK[d] / q, 3) for d in MEASURED}
    assert dev.matmul_efficiency == {"fp16": 0.771, "fp32": 0.933}


@pytest.mark.parametrize("preset", V100_PRESETS)
def test_every_dtype_a_v100_has_a_peak_for_has_its_own_ceiling(preset):
    """The fallback "a dtype without its own figure: the device's best" never applies on
    V100: the FP32 (CUDA-core) ceiling is not the fp16 Tensor Core one."""
    system = _system(preset)
    table = matmul_ceilings(system)
    assert set(system.device.peak_flops) <= set(table)
    dev = kernel_device(system)
    assert dev.ceiling("fp32") == 0.933 != dev.ceiling("fp16") == 0.771


def test_the_v100_resnet_rows_compute_in_dtypes_with_their_own_ceiling():
    bench = Path(__file__).parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("validate_resnet", bench / "validate_resnet.py")
    vr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vr)
    rows = [r for r in vr.rows() if r["preset"] in V100_PRESETS]
    assert {r["dtype"] for r in rows} == {"fp16", "fp32"}
    for row in rows:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DDLSimWarning)   # the stack's library is measured
            cfg = ddlsim.load_config(vr.config(row))
            assert cfg.train.dtype in matmul_ceilings(cfg.system)


def test_a_v100_under_a_stack_of_another_gemm_library_says_so():
    with pytest.warns(DDLSimWarning, match="'V100-SXM2-32GB' has no matmul ceiling measured "
                                           "with cublas-12.*cublas-11 figure is used"):
        matmul_ceilings(_system("dgx1-v100", "cublas-12"))
