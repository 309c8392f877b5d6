"""The unfused MoE permutation's backward is an index_add_ (class ``index_add``), timed on
dgx-h200 at its measured rate (benchmarks/data/device_h200_2026-11-30/run9/permute)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.simulator.kernels import kernel_device, op_time
from ddlsim.workloads.decoder.moe_dispatch import INDEX_ADD


def _config(fusion: bool, preset: str = "dgx-h200") -> dict:
    return {"model": {"preset": "qwen3-235b-a22b", "num_hidden_layers": 1,
                      "num_local_experts": 16, "num_experts_per_tok": 8},
            "parallel": {"moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "permute_fusion": fusion, "router_fusion": False,
                                 "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048,
                      "dtype": "bf16", "recompute": "none"},
            "system": {"preset": preset, "nodes": 1, "devices_per_node": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def _op(cfg: dict, name: str):
    loaded = ddlsim.load_config(cfg)
    prog = build_workload(loaded).classes[0].program
    ops = [op.payload for step in prog.steps for op in prog.blocks[step.block].flat.ops
           if op.payload.name == name]
    return ops[0], kernel_device(loaded.system)


def test_the_unfused_backward_unpermute_is_an_index_add_at_its_measured_rate():
    op, dev = _op(_config(fusion=False), "bwd.unpermute")
    (kern,) = op.kernels
    assert kern.variant == INDEX_ADD
    # T 2,048, k 8, hidden 4,096, bf16: the gather's read + write, 268 MB
    assert kern.bytes == pytest.approx(2 * 2048 * 8 * 4096 * 2)
    # the Megatron-Core layer measured 0.543 ms for this index_add_ (run8's IndexSelectBackward0)
    assert op_time(op, dev) == pytest.approx(0.543e-3, rel=0.05)


def test_the_fused_permutation_and_the_forward_stay_streaming():
    fused, _ = _op(_config(fusion=True), "bwd.unpermute")
    forward, _ = _op(_config(fusion=False), "fwd.unpermute")
    assert fused.kernels[0].variant == "" and forward.kernels[0].variant == ""


def test_a_device_without_the_class_streams_it():
    op, dev = _op(_config(fusion=False, preset="dgx-a100"), "bwd.unpermute")
    assert op.kernels[0].variant == INDEX_ADD
    assert op_time(op, dev) < 0.4 * 0.543e-3        # the A100's streaming rate, no class figure


def test_the_class_figure_is_the_microbenchmarks_median():
    """dgx-h200's index_add figure is the median, over run9's bf16 index_add_ rows with at
    least 4,096 copies, of ddlsim's bytes (2·T·k·h·2) over the measured time, / 4.8 TB/s."""
    import csv
    import statistics
    from pathlib import Path

    path = (Path(__file__).resolve().parents[1] / "benchmarks" / "data" /
            "device_h200_2026-11-30" / "run9" / "permute" / "permute_kernels.csv")
    rows = [r for r in csv.DictReader(path.open()) if r["kernel"] == "index_add"
            and r["dtype"] == "bf16" and int(r["tokens"]) * int(r["k"]) >= 4096]
    fractions = [2 * int(r["tokens"]) * int(r["k"]) * int(r["hidden"]) * 2
                 / float(r["seconds"]) / 4.8e12 for r in rows]
    assert len(fractions) == 18
    dev = ddlsim.load_config(_config(fusion=False)).system.device
    assert dev.elementwise_efficiency[INDEX_ADD] == pytest.approx(
        statistics.median(fractions), abs=5e-4)
