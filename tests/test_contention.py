"""SMs taken from overlapped GEMMs by communication kernels (ddlsim.simulator.kernels.contention).

Numbers by hand: NCCL's channels from its topology search and duplications (search.cc
``ncclTopoDupChannels``, connect.cc ``ncclTopoPostset``), a GEMM's extra time
``(k/S)·min(C, G·S/(S − k))``.
"""

from __future__ import annotations

import math

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.simulator.costs import CostModel
from ddlsim.simulator.kernels import kernel_device
from ddlsim.simulator.kernels.contention import (contention_seconds, extra_seconds,
                                                 nccl_ring_ctas)
from ddlsim.workloads.trace import Compute, Contention


def _system(preset: str, **extra):
    cfg = build_config({"model": "gpt3-1.3b", "train": {"global_batch_size": 8,
                                                        "micro_batch_size": 1,
                                                        "seq_length": 2048},
                        "system": {"preset": preset, "nodes": 1, **extra}})
    return cfg.system


@pytest.mark.parametrize("preset, ctas", [
    # 300 GB/s × 20/25 / 40 GB/s = 6 channels; 40 >= 25 GB/s: doubled (A100 is cc 8.0, not
    # > 80); ncclTopoPostset doubles again: 24
    ("dgx-a100", 24),
    # 450 GB/s × 20.6/25 / 60 GB/s = 6.18 -> 6; cc 9.0 > 80 but 60 >= 50 GB/s: doubled; x2
    ("dgx-h100", 24),
])
def test_nccl_channels_of_an_nvlink_node(preset, ctas):
    assert nccl_ring_ctas(_system(preset)) == ctas


def test_te_margin_is_the_devices_sm_split():
    """TE's 16 SMs for the GEMM's whole duration: 16/(132 − 16) = 13.8 % on an H100 SXM,
    16/(108 − 16) = 17.4 % on an A100 — the rate lost on the SMs taken, nothing fitted."""
    for preset, sms in (("dgx-h100", 132), ("dgx-a100", 108)):
        dev = kernel_device(_system(preset))
        assert dev.sm_count == sms
        op = Compute("g.sm_contention", 0.0, contention=Contention(1e12, sms=16))
        gemm_s = 1e12 / (dev.peak_flops("bf16") * dev.ceiling("bf16"))
        assert contention_seconds(op, dev, 24) == pytest.approx(gemm_s * 16 / (sms - 16),
                                                                rel=1e-12)


def test_extra_time_is_the_lost_rate_while_both_run():
    G, S, k = 1.0, 108, 24
    G_k = G * S / (S - k)
    assert extra_seconds(G, math.inf, k, S) == pytest.approx(G_k - G, rel=1e-12)
    assert extra_seconds(G, 0.1, k, S) == pytest.approx(0.1 * k / S, rel=1e-12)
    assert extra_seconds(G, 5.0, k, S) == pytest.approx(G_k - G, rel=1e-12)   # C >= G_k
    assert extra_seconds(G, 1.0, 0, S) == 0.0
    assert extra_seconds(G, 1.0, k, None) == 0.0       # a device without the fact
    with pytest.raises(ConfigError, match="system.device.sm_count = 108"):
        extra_seconds(G, 1.0, S, S)


def _async_plan():
    return build_config({
        "model": "gpt3-13b",
        "parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True},
        "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 2048},
        "system": {"preset": "dgx-a100", "nodes": 1}})


def _contention_ops(workload):
    for cls in workload.classes:
        for block in cls.program.blocks.values():
            for op in block.flat.ops:
                p = op.payload
                if isinstance(p, Compute) and p.contention is not None:
                    yield p


def test_async_backward_pays_nccls_sms_while_its_collectives_run():
    """Megatron-Core's NCCL overlap of the backward's SP collectives (tp_async_backward):
    each overlapped block carries a contention op of the qkv/fc1 dgrad + wgrad GEMMs with the
    collectives that run beside them; the cost model times it as (24/108)·min(C, G_k)."""
    cfg = _async_plan()
    wl = ddlsim.build_workload(cfg)
    ops = list(_contention_ops(wl))
    assert ops and all(op.contention.collectives and op.flops == 0.0 for op in ops)
    cost = CostModel(cfg.system, wl)
    dev = kernel_device(cfg.system)
    for op in ops:
        C = sum(cost.collective(c) for c in op.contention.collectives)
        G = op.contention.gemm_flops / (dev.peak_flops(op.dtype) * dev.ceiling(op.dtype))
        want = 24 / 108 * min(C, G * 108 / (108 - 24))
        assert cost.compute(op) == pytest.approx(want, rel=1e-12) and want > 0


def test_no_nccl_sms_under_another_collective_backend():
    """Under MPI collectives (no NCCL channels) the async backward's GEMMs lose no SMs."""
    cfg = _async_plan()
    system = cfg.system.model_copy(update={
        "collectives": cfg.system.collectives.model_copy(update={"backend": "mpi"})})
    wl = ddlsim.build_workload(cfg)
    cost = CostModel(system, wl)
    assert all(cost.compute(op) == 0.0 for op in _contention_ops(wl))


def test_contention_op_with_collectives_needs_the_cost_model():
    dev = kernel_device(_system("dgx-a100"))
    from ddlsim.simulator.kernels import op_time
    from ddlsim.workloads.trace import Collective
    op = Compute("g.sm_contention", 0.0, contention=Contention(
        1e12, collectives=(Collective("ag", "all_gather", "tp", 1e6),)))
    with pytest.raises(ValueError, match="CostModel.compute"):
        op_time(op, dev)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_nccl_sms_slow_the_async_backward(engine, monkeypatch):
    """The same plan without NCCL's SMs taken is faster, in both engines, by less than 5 %."""
    cfg = _async_plan()
    with_sms = ddlsim.predict(cfg, engine, check_fit=False).iteration_time_s
    from ddlsim.simulator.kernels import contention
    monkeypatch.setattr(contention, "nccl_ring_ctas", lambda system: 0)
    without = ddlsim.predict(cfg, engine, check_fit=False).iteration_time_s
    assert without < with_sms < without * 1.05
