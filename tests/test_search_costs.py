"""The vectorised tier's costs are the exact engine's: the registered collective forms, the
roofline, the builder's blocks, the memory model and the schedules' in-flight counts, each
compared with the scalar code on samples (the premise of docs/engines.md, "The search
tier's closed forms")."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ddlsim
from ddlsim.api import _placement, build_workload
from ddlsim.config import load_config
from ddlsim.search.decoder import inflight
from ddlsim.search.family import vector_family
from ddlsim.search.netcost import affine_form, check_affine, collective_seconds, mesh_networks
from ddlsim.search.pipeline import flow_shop_tail, iteration_time
from ddlsim.search.plans import SCHEDULE, VECTOR_FIELDS, enumerate_plans
from ddlsim.simulator.collectives import GroupNet, _REGISTRY, collective_time
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.schedules import peak_inflight
from ddlsim.workloads.trace import Collective, Compute

NETS = [GroupNet(8, 8, 1e-6, 150e9),                                  # one node
        GroupNet(16, 8, 1e-6, 150e9, 5e-6, 25e9, 2),                  # two nodes, uniform
        GroupNet(12, 8, 1e-6, 150e9, 5e-6, 12.5e9, 2),                # uneven: 8 + 4
        GroupNet(9, 2, 0.5e-6, 20e9, 25e-6, 1.25e9, 5)]               # the 10 GbE CPU cluster


@pytest.mark.parametrize("key", sorted(_REGISTRY))
def test_every_registered_form_is_affine_in_the_message_size(key):
    op, name = key
    for net in NETS:
        check_affine(op, name, net)
        a, b = affine_form(op, name, net)
        for n in (0.0, 1e3, 3.3e6, 7.7e8):
            exact = collective_time(op, name, n, net)
            assert a + b * n == pytest.approx(exact, rel=1e-12, abs=1e-18) or not np.isfinite(exact)


def _plan_set(cfg):
    fields = {p: getattr(getattr(cfg, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    fields["parallel.schedule"] = cfg.parallel.schedule
    return enumerate_plans({}, fields, cfg.system.num_devices)


SAMPLES = {
    "gpt3-1.3b tp2 pp2": [],
    "sp full mbs2": ["parallel.sequence_parallel=true", "train.recompute=full",
                     "train.micro_batch_size=2"],
    "interleaved zero1": ["parallel.schedule=interleaved",
                          "parallel.virtual_pipeline_model_parallel_size=2",
                          "parallel.zero_stage=1", "train.recompute=selective"],
    "zero3 pp1 tp4": ["parallel.zero_stage=3", "parallel.pipeline_model_parallel_size=1",
                      "parallel.tensor_model_parallel_size=4"],
    "two nodes pp4 no overlap": ["system.nodes=2", "parallel.pipeline_model_parallel_size=4",
                                 "parallel.overlap_grad_reduce=false", "parallel.zero_stage=2"],
    "tree all-reduce": ["parallel.collective_algorithm={all_reduce: tree}"],
}


@pytest.fixture(params=sorted(SAMPLES))
def sample(request, base_dict):
    return load_config(base_dict, SAMPLES[request.param])


def test_collectives_match_the_cost_model(sample):
    """Every collective of the trace, timed by CostModel, equals collective_seconds on the
    plan's mesh networks."""
    wl = build_workload(sample)
    cost = CostModel(sample.system, wl, sample.parallel.collective_algorithm,
                     devices=_placement(sample, wl))
    nets = mesh_networks(sample, np.array([[sample.parallel.tp, sample.parallel.pp, sample.dp]]))
    seen = set()
    for cls in wl.classes:
        for block in cls.program.blocks.values():
            for op in block.flat.ops:
                p = op.payload
                if isinstance(p, Collective) and (p.op, p.group, p.bytes) not in seen:
                    seen.add((p.op, p.group, p.bytes))
                    got = collective_seconds(p.op, p.group, np.array([p.bytes]), np.array([0]),
                                             nets.nets, sample.parallel.collective_algorithm)
                    assert got[0] == pytest.approx(cost.collective(p), rel=1e-9)
    assert seen


def _compute_stream(block, cost) -> float:
    """A block's compute-stream time as the engine adds it when nothing else waits."""
    total = 0.0
    for op in block.flat.ops:
        if op.stream != "compute":
            continue
        if isinstance(op.payload, Compute):
            total += cost.compute(op.payload) * op.repeat
        elif isinstance(op.payload, Collective):
            total += cost.collective(op.payload) * op.repeat
    return total


def test_stage_costs_are_the_builders_blocks(sample):
    """Forward and backward per micro-batch of the first and last stages: the sum of the
    builder's blocks timed by CostModel (ZeRO-3's blocks are timed by their own form)."""
    if sample.parallel.zero_stage == 3:
        pytest.skip("ZeRO-3's per-layer prefetch is timed as a whole (test_search_agreement)")
    wl = build_workload(sample)
    cost = CostModel(sample.system, wl, sample.parallel.collective_algorithm,
                     devices=_placement(sample, wl))
    family = vector_family(sample.model.architecture)
    costs = family.costs(family.prepare(sample), _plan_set(sample), None)
    v = sample.parallel.vpp
    for cls, fwd, bwd in ((wl.classes[0], costs.fwd_first, costs.bwd_first),
                          (wl.classes[-1], costs.fwd_last, costs.bwd_last)):
        blocks = cls.program.blocks
        assert fwd[0] == pytest.approx(sum(_compute_stream(blocks[f"F{c}"], cost)
                                           for c in range(v)), rel=1e-9)
        assert bwd[0] == pytest.approx(sum(_compute_stream(blocks[f"B{c}"], cost)
                                           for c in range(v)), rel=1e-9)


def test_memory_is_the_families(sample):
    family = vector_family(sample.model.architecture)
    memory, capacity = family.memory(family.prepare(sample), _plan_set(sample))
    assert memory[0] == pytest.approx(ddlsim.memory_per_device(sample).total, rel=1e-12)
    assert capacity[0] == sample.system.device.memory_bytes


def test_roofline_is_the_cost_models_compute(small_cfg):
    from ddlsim.search.family import roofline

    wl = build_workload(small_cfg)
    cost = CostModel(small_cfg.system, wl)
    dev = small_cfg.system.device
    for flops, nbytes in ((1e12, 0.0), (0.0, 3e9), (1e9, 5e9), (4e12, 1e6)):
        gemm = roofline(flops, nbytes, dev.peak_flops["bf16"], small_cfg.system.compute_efficiency,
                        dev.memory_bandwidth_Bps)
        assert gemm == pytest.approx(cost.compute(Compute("x", flops, nbytes)), rel=1e-12)
        ew = roofline(flops, nbytes, dev.peak_flops["bf16"], small_cfg.system.compute_efficiency,
                      dev.memory_bandwidth_Bps, gemm=False)
        assert ew == pytest.approx(cost.compute(Compute("x", flops, nbytes, "elementwise")),
                                   rel=1e-12)


def test_inflight_is_the_schedules_peak():
    cases = list(itertools.product(SCHEDULE, (0, 1, 3), (4,), (1, 3, 8, 16), (1, 2, 4)))
    sched = np.array([SCHEDULE.index(c[0]) for c in cases])
    stage, pp, m, v = (np.array([c[i] for c in cases]) for i in range(1, 5))
    got = inflight(sched, stage, pp, m, v)
    want = [peak_inflight(name, s, p, mm, vv) for name, s, p, mm, vv in cases]
    assert got.tolist() == want


def test_flow_shop_tail_by_hand():
    """5 layers in 2 segments (3 then 2 layers, the builder's cut), 1 s per layer, 2.5 s of
    buckets per segment: the stream ends at max(3 + 2·2.5, 5 + 2.5) = 8 s, 3 s after the
    layers; with 0.5 s buckets it ends 0.5 s after them (the last segment's buckets)."""
    assert flow_shop_tail(5, 2, 1.0, 2.5) == pytest.approx(3.0)
    assert flow_shop_tail(5, 2, 1.0, 0.5) == pytest.approx(0.5)
    assert flow_shop_tail(4, 4, 1.0, 0.0) == 0.0


def test_pipeline_closed_form_by_hand():
    """1F1B, 4 equal stages of t = 3 s (1 s forward, 2 s backward), m = 8 micro-batches, free
    point-to-point: (m − 1)·t + p·t = 7·3 + 4·3 = 33 s, plus the update (0.5 s) of stage 0.
    Interleaved with v = 2 chunks: (m − 1)·t + t + (p − 1)·t/v = 21 + 3 + 4.5 = 28.5 s."""
    from ddlsim.search.family import StageCosts

    one = np.ones(1)
    plans = {"pp": 4 * one.astype(int), "v": one.astype(int), "gbs": 8 * one.astype(int),
             "mbs": one.astype(int), "dp": one.astype(int),
             "schedule": np.array([SCHEDULE.index("1f1b")])}
    costs = StageCosts(one, one, one, 2 * one, 2 * one, 2 * one, 2 * one, 0 * one, 0 * one,
                       0 * one, 0 * one, 0.5 * one, 0.5 * one, np.full(1, np.nan))
    assert iteration_time(costs, plans)[0] == pytest.approx(33.5)
    plans = {**plans, "v": 2 * one.astype(int), "schedule": np.array([1])}
    assert iteration_time(costs, plans)[0] == pytest.approx(28.5 + 0.5)
