"""benchmarks/moe_layer_vs_ddlsim.py and benchmarks/device/moe_layer_step.py: Megatron-Core's MoE
layer measured on one H200 beside ddlsim's ops of the same layer.

Reads the committed measurements (benchmarks/data/device_h200_2026-11-30/run7, run8); no GPU.
"""

from __future__ import annotations

import sys

import pytest
from benchscripts import BENCH, load_script

vs = load_script("moe_layer_vs_ddlsim")
sys.path.insert(0, str(BENCH / "device"))
import moe_layer_step  # noqa: E402


def _trace(launch_cat: str) -> dict:
    """A range 'experts' holding one launch (of ``launch_cat``) of a 10 µs kernel, and a
    kernel whose launch has no range."""
    return {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "experts", "ts": 0, "dur": 100},
        {"ph": "X", "cat": launch_cat, "name": "cuLaunchKernelEx", "ts": 50, "dur": 2,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "ts": 60, "dur": 10,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "stray", "ts": 80, "dur": 5,
         "args": {"correlation": 8}}]}


@pytest.mark.parametrize("cat", ["cuda_runtime", "cuda_driver"])
def test_kernels_are_charged_to_the_range_of_their_launch(cat):
    """cuBLAS launches through the driver API: its kernels count in their range too."""
    parts = moe_layer_step.kernel_parts(_trace(cat))
    assert parts["parts"]["experts"] == {"kernels": 1, "us": 10}
    assert parts["parts"]["other"] == {"kernels": 1, "us": 5}
    assert parts["busy_us"] == 15 and parts["span_us"] == 25


def test_the_forward_kernels_of_run7_include_the_gemms():
    """run7's json was written before the driver-API launches counted: re-read from its trace,
    the forward's kernels (GEMMs included) are most of the two passes' device time."""
    for run in vs.MOE_RUNS:
        fwd = vs.kineto_forward_ms(run, "zoo4")
        assert 1.5 < fwd < 3.0, (run, fwd)


def test_every_measured_case_has_ddlsim_device_and_host_parts():
    rows = vs.rows()
    assert [r["case"] for r in rows] == list(moe_layer_step.CASES)
    for r in rows:
        d = r["ddlsim"]
        assert d["fwd_device"] > 0 and d["bwd_device"] > d["fwd_device"] > 0, r
        assert d["fwd_host"] > 0 and d["bwd_host"] > 0, r
        runs = [run for run in vs.MOE_RUNS if r["case"] in vs.load(run)]
        assert len(r["wall_ms"]) == len(vs.MOE_RUNS)
        assert [w is not None for w in r["wall_ms"]] == [run in runs for run in vs.MOE_RUNS]
        assert len(r["bwd_host_ms"]) == len(r["bwd_device_ms"]) == len(vs.HOST_RUNS)
        assert min(x for x in r["bwd_host_ms"] if x is not None) > 0


def test_ddlsim_config_is_the_measured_layer():
    case = vs.load("run8")["q30e16"]
    cfg = vs.config(case)
    assert cfg["model"] == {"preset": "qwen3-30b-a3b", "num_hidden_layers": 1,
                            "num_local_experts": 16, "num_experts_per_tok": 8}
    assert cfg["train"]["seq_length"] == 4096
    assert cfg["parallel"]["moe"]["grouped_gemm"] is False
    assert "router_dtype" not in cfg["parallel"]["moe"]      # the layer's bf16
