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
    monkeypatch.setattr(contention, "nccl_ring_ctas", lambda system, net=None: 0)
    without = ddlsim.predict(cfg, engine, check_fit=False).iteration_time_s
    assert without < with_sms < without * 1.05


def _dp_plan(preset="dgx-a100", tp=1, nodes=2, **parallel):
    dp = 8 * nodes // tp
    return build_config({
        "model": "gpt3-1.3b",
        "parallel": {"tensor_model_parallel_size": tp, "data_parallel_size": dp,
                     "overlap_grad_reduce": True, **parallel},
        "train": {"micro_batch_size": 1, "global_batch_size": dp, "seq_length": 2048},
        "system": {"preset": preset, "nodes": nodes}})


@pytest.mark.parametrize("preset, tp, ctas", [
    # 8 GPUs a node, 8 HDR NICs: 200 GB/s / 48 GB/s = 4 channels; doubled (cc 8.0); x2 by
    # ncclTopoPostset: 16
    ("dgx-a100", 1, 16),
    # 8 NDR NICs: min(450 × 20.6/25, 400) / 48 = 7 channels; cc 9.0 > 80, 48 < 50 GB/s and
    # 7 > 4: not duplicated; x2: 14 (NCCL printed 16 on 3 × 8 H100s, NVIDIA/nccl issue 1453)
    ("dgx-h100", 1, 14),
    # one GPU a node (TP 8): its one NIC, 25 GB/s / 48 -> 1 channel; doubled, x2: 4
    ("dgx-a100", 8, 4),
    # 50 GB/s / 48 -> 1; on Hopper doubled (1 channel is not > 4), x2: 4
    ("dgx-h100", 8, 4),
])
def test_nccl_channels_across_nodes_follow_the_nics(preset, tp, ctas):
    cfg = _dp_plan(preset, tp)
    cost = CostModel(cfg.system, ddlsim.build_workload(cfg))
    assert cost.nets["dp"].multi_node
    assert nccl_ring_ctas(cfg.system, cost.nets["dp"]) == ctas
    assert nccl_ring_ctas(cfg.system, None) == 24   # inside one node


def test_overlapped_grad_buckets_pay_nccls_sms_beside_the_next_layers():
    """Megatron-Core's overlapped gradient buckets: a run's buckets run beside the next run
    of backward layers, whose GEMMs get a contention op with those buckets (the first run has
    none: nothing was issued before it); timed (16/108)·min(C, G_k) across DGX A100 nodes."""
    cfg = _dp_plan()
    wl = ddlsim.build_workload(cfg)
    ops = [op for op in _contention_ops(wl) if op.name.startswith("dp.run")]
    assert ops and all(c.group == "dp" and c.op == "all_reduce"
                       for op in ops for c in op.contention.collectives)
    cost, dev = CostModel(cfg.system, wl), kernel_device(cfg.system)
    for op in ops:
        C = sum(k * cost.collective(c) for c, k in op.contention.issues())
        G = op.contention.gemm_flops / (dev.peak_flops(op.dtype) * dev.ceiling(op.dtype))
        assert cost.compute(op) == pytest.approx(16 / 108 * min(C, G * 108 / 92), rel=1e-12)
    off = ddlsim.build_workload(_dp_plan(overlap_grad_reduce=False))
    assert not any(op.name.startswith("dp.run") for op in _contention_ops(off))


def test_ddp_buckets_pay_nccls_sms_beside_the_backward_after_them():
    """PyTorch DDP (ResNet-50): the buckets issued at one point run beside the backward up
    to the next; one contention op per window, in the engines' compute."""
    from ddlsim.workloads.buckets import BackwardUnit, backward_with_buckets
    from ddlsim.workloads.trace import Collective as Coll
    units = [BackwardUnit((Compute(f"l{i}", 1e9),), 1) for i in range(4)]
    ops = backward_with_buckets(units, [range(0, 1), range(1, 3), range(3, 4)],
                                [1e6] * 4, "dp", True)
    cont = [o.payload.contention for o in ops
            if isinstance(o.payload, Compute) and o.payload.contention is not None]
    # bucket 0 beside l1 + l2, bucket 1 beside l3; bucket 2 (after l3) beside nothing
    assert [(c.gemm_flops, [x.name for x in c.collectives]) for c in cont] == [
        (2e9, ["grad.bucket0"]), (1e9, ["grad.bucket1"])]
    assert all(isinstance(x, Coll) for c in cont for x in c.collectives)
    blocking = backward_with_buckets(units, [range(0, 4)], [1e6] * 4, "dp", False)
    assert not any(isinstance(o.payload, Compute) and o.payload.contention for o in blocking)


def _fsdp_plan(prefetch):
    return build_config({
        "model": "gpt3-1.3b", "parallel": {"data_parallel_size": 8, "zero_stage": 3},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
        "system": {"preset": "dgx-a100", "nodes": 1,
                   "software": {"stack": "megatron-core-2024", "what_if": True,
                                "overlap": {"zero3_prefetch_layers": prefetch}}}})


def test_fsdp_layers_pay_nccls_sms_beside_the_prefetch_and_the_reduce_scatter():
    """Per-layer ZeRO-3 gathering one layer ahead: forward layer j runs beside the gather of
    layer j + 1 (layer 0 beside it too: issued with its own), the last layer beside nothing;
    backward layer j beside the reduce-scatter of layer j − 1 and the gather of j + 1."""
    wl = ddlsim.build_workload(_fsdp_plan(1))
    blocks = wl.classes[0].program.blocks
    def kinds(name):
        return [[c.op for c in op.payload.contention.collectives] for op in blocks[name].flat.ops
                if isinstance(op.payload, Compute) and op.payload.contention is not None]
    L = 24
    assert kinds("F0") == [["all_gather"]] * (L - 1)
    assert kinds("B0") == [["all_gather"]] + [["reduce_scatter", "all_gather"]] * (L - 2) \
        + [["reduce_scatter"]]


def test_fsdp_without_prefetch_overlaps_nothing():
    """Gathered on demand, a layer waits for its gather, queued behind the reduce-scatter
    before it on the same stream: nothing runs beside a layer, no contention op."""
    wl = ddlsim.build_workload(_fsdp_plan(0))
    assert not list(_contention_ops(wl))


def test_overlapped_param_gather_pays_nccls_sms_beside_the_first_forward():
    """overlap_param_gather: the first forward's compute before its wait for the gather runs
    beside it; one contention op there, with that gather, placed before the wait."""
    cfg = _dp_plan(zero_stage=1, overlap_param_gather=True)
    wl = ddlsim.build_workload(cfg)
    block = wl.classes[0].program.blocks["F0.pg"]
    names = [op.payload.name for op in block.ops]
    at = names.index("params.all_gather.sm_contention")
    assert names[at + 1] == "params.gather.wait"
    c = block.ops[at].payload.contention
    assert [x.name for x in c.collectives] == ["params.all_gather.overlapped"]
    from ddlsim.workloads.smcontention import gemm_flops
    assert c.gemm_flops == gemm_flops(wl.classes[0].program.blocks["F0"].ops) > 0


def test_fsdp_in_pipeline_stages_pays_nccls_sms_beside_the_rest_of_the_gather():
    """torchtitan's FSDP2 inside pipeline stages: each stage's first forward runs beside the
    gather of the rest of its parameters (its first layer waits for its own, queued first),
    so a contention op with that gather goes before the forward's wait for it, on every
    stage; both engines time the trace alike."""
    d = {"model": {"preset": "llama3-8b", "num_hidden_layers": 8},
         "parallel": {"pipeline_model_parallel_size": 2, "data_parallel_size": 4,
                      "zero_stage": 3},
         "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 1, "software": "torchtitan-2025"}}
    cfg = build_config(d)
    wl = ddlsim.build_workload(cfg)
    for cls in wl.classes:
        ops = cls.program.blocks["F0.pg"].ops
        names = [o.payload.name for o in ops]
        at = names.index("fsdp.params.all_gather.sm_contention")
        assert names[at + 1] == "params.gather.wait"
        assert [c.name for c in ops[at].payload.contention.collectives] == [
            "params.all_gather.overlapped"]
    times = [ddlsim.predict(cfg, engine).iteration_time_s for engine in ("analytical", "des")]
    assert times[0] == pytest.approx(times[1], rel=1e-9)
