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
from ddlsim.search.family import vector_family
from ddlsim.search.netcost import affine_form, check_affine, collective_seconds, mesh_networks
from ddlsim.search.pipeline import flow_shop_tail, iteration_time
from ddlsim.search.plans import SCHEDULE, VECTOR_FIELDS, enumerate_plans
from ddlsim.simulator.collectives import GroupNet, algorithms_for, collective_time, get_algorithm
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.schedules import peak_inflight
from ddlsim.workloads.trace import Collective, Compute

NETS = [GroupNet(8, 8, 1e-6, 150e9),                                  # one node
        GroupNet(16, 8, 1e-6, 150e9, 5e-6, 25e9, 2),                  # two nodes, uniform
        GroupNet(12, 8, 1e-6, 150e9, 5e-6, 12.5e9, 2),                # uneven: 8 + 4
        GroupNet(9, 2, 0.5e-6, 20e9, 25e-6, 1.25e9, 5)]               # the 10 GbE CPU cluster


GENERIC = sorted((op, name) for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                        "reduce", "gather", "scatter", "all_to_all")
                 for name in algorithms_for(op) if get_algorithm(op, name).backend != "nccl")


def test_every_algorithm_is_generic_or_nccl():
    """Every registered algorithm of these ops is either affine (tested below) or NCCL's
    (timed by its own array form, tests/simulator/test_nccl_vector.py)."""
    for op in {op for op, _ in GENERIC}:
        nccl = {n for n in algorithms_for(op) if get_algorithm(op, n).backend == "nccl"}
        assert set(algorithms_for(op)) == {n for o, n in GENERIC if o == op} | nccl


@pytest.mark.parametrize("key", GENERIC)
def test_every_generic_form_is_affine_in_the_message_size(key):
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
    # ZeRO-3 as PyTorch FSDP (Megatron-Core of 2024 has none: rule no_zero3), a what-if
    "zero3 pp1 tp4": ["parallel.zero_stage=3", "parallel.pipeline_model_parallel_size=1",
                      "parallel.tensor_model_parallel_size=4",
                      "system.software={stack: megatron-core-2024, what_if: true}"],
    # ZeRO-2 (Megatron-Core has none: ddlsim/data/software.yaml rules) as an explicit what-if
    "two nodes pp4 no overlap": ["system.nodes=2", "parallel.pipeline_model_parallel_size=4",
                                 "parallel.overlap_grad_reduce=false", "parallel.zero_stage=2",
                                 "system.software={stack: megatron-core-2024, what_if: true}"],
    "tree all-reduce": ["parallel.collective_algorithm={all_reduce: tree}"],
    "mpi backend two nodes": ["system.collectives.backend=mpi", "system.nodes=2"],
    "mpich backend two nodes": ["system.collectives.backend=mpich", "system.nodes=2",
                                "parallel.pipeline_model_parallel_size=1"],
    "openmpi backend four nodes": ["system.collectives.backend=openmpi", "system.nodes=4",
                                   "parallel.tensor_model_parallel_size=8",
                                   "parallel.pipeline_model_parallel_size=1"],
    "nccl tree Simple two nodes": ["parallel.collective_algorithm={all_reduce: nccl_tree}",
                                   "system.collectives.nccl_protocol=Simple", "system.nodes=2"],
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
                                             nets.nets, sample.parallel.collective_algorithm,
                                             backend=nets.backend)
                    assert got[0] == pytest.approx(cost.collective(p), rel=1e-9)
    assert seen


BACKENDS = {"nccl": [], "nccl 4 nodes": ["system.nodes=4"],
            # H100: NVLS and NVLS-tree, chosen by NCCL's estimate, timed with their fill
            "nccl h100": ["system.preset=dgx-h100"],
            "nccl h100 2 nodes": ["system.preset=dgx-h100", "system.nodes=2"],
            "nccl h100 4 nodes": ["system.preset=dgx-h100", "system.nodes=4"],
            "nccl ring": ["system.nodes=2", "parallel.collective_algorithm={all_reduce: nccl_ring}"],
            "mpi": ["system.collectives.backend=mpi", "system.nodes=2"],
            "mpich": ["system.collectives.backend=mpich", "system.nodes=2"],
            "openmpi": ["system.collectives.backend=openmpi", "system.nodes=2"],
            "openmpi disjoint dp": ["system.collectives.backend=openmpi", "system.nodes=4",
                                    "parallel.tensor_model_parallel_size=8"]}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_collectives_match_the_cost_model_on_dense_sizes(name, base_dict):
    """Sizes from 1 B to 8 GiB, dense enough to cross every threshold of NCCL's tuning model
    (the tree correction's powers of two, the ring plateau) and of MPICH's rules (8 B,
    512 KiB, 80 KiB, 12,288 B, 2,048 B), on every family of one mesh: collective_seconds is
    CostModel.collective."""
    cfg = load_config(base_dict, BACKENDS[name] + ["parallel.pipeline_model_parallel_size=1"])
    wl = build_workload(cfg)
    cost = CostModel(cfg.system, wl, cfg.parallel.collective_algorithm,
                     devices=_placement(cfg, wl))
    nets = mesh_networks(cfg, np.array([[cfg.parallel.tp, cfg.parallel.pp, cfg.dp]]))
    sizes = np.unique(np.concatenate([np.geomspace(1, 2.0 ** 33, 400), 2.0 ** np.arange(34),
                                      [8, 9, 2048, 2049, 12288, 12289, 80 * 1024]]))
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        for family in ("tp", "dp"):
            got = collective_seconds(op, family, sizes, np.zeros(len(sizes), dtype=int),
                                     nets.nets, cfg.parallel.collective_algorithm,
                                     backend=nets.backend)
            want = [cost.collective(Collective("x", op, family, float(n))) for n in sizes]
            np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=f"{op} {family}")


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
        _zero3_is_the_engines(sample)
        return
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


def _zero3_is_the_engines(sample):
    """ZeRO-3's plan is timed as a whole by ddlsim.search.zero3's recurrence over the trace's
    two streams (prefetch limit, gathers and reduce-scatters on one dp stream): the exact
    analytical engine runs that same schedule, so they agree to rounding; the DES runs it
    too, with its own flow-level network (within 2 %: the engines' network models differ,
    issue 11 item 3)."""
    family = vector_family(sample.model.architecture)
    whole = family.costs(family.prepare(sample), _plan_set(sample), None).whole[0]
    exact = ddlsim.predict(sample, "analytical", check_fit=False).iteration_time_s
    assert whole == pytest.approx(exact, rel=1e-9)
    des = ddlsim.predict(sample, "des", check_fit=False).iteration_time_s
    assert whole == pytest.approx(des, rel=0.02)


def test_memory_is_the_families(sample):
    family = vector_family(sample.model.architecture)
    memory, capacity = family.memory(family.prepare(sample), _plan_set(sample))
    assert memory[0] == pytest.approx(ddlsim.memory_per_device(sample).total, rel=1e-12)
    assert capacity[0] == sample.system.device.memory_bytes


def test_the_cost_models_compute_is_the_roofline(small_cfg):
    """An op given as FLOPs and bytes only: the roofline at the device's matmul ceiling
    (η_max, dgx-a100: the 0.869 burst, capped at the 0.829 a GEMM sustains at the 400 W
    limit, kernels/power.py) and its achieved memory bandwidth (2,039 GB/s × 0.90); an
    element-wise op at the full peak. (The search tier times such ops with the same
    ``op_time``: its pieces are the builder's ops.) Each is one kernel launched eagerly: its
    device gap after it (0.9 µs) and at least the host's 5.8 µs (device.launch)."""
    wl = build_workload(small_cfg)
    cost = CostModel(small_cfg.system, wl)
    peak, eta, bw = 312e12, min(0.869, 0.829), 2039e9 * 0.90
    gap, host = 0.9e-6, 5.8e-6
    for flops, nbytes in ((1e12, 0.0), (0.0, 3e9), (1e9, 5e9), (4e12, 1e6)):
        gemm = max(max(flops / (peak * eta), nbytes / bw) + gap, host)
        assert gemm == pytest.approx(cost.compute(Compute("x", flops, nbytes)), rel=1e-12)
        ew = max(max(nbytes / bw, flops / peak) + gap, host)
        assert ew == pytest.approx(cost.compute(Compute("x", flops, nbytes, "elementwise")),
                                   rel=1e-12)


def test_inflight_on_arrays_is_the_schedules_peak():
    """The search tier's memory calls peak_inflight with arrays of plans: element for
    element the scalar rule's counts."""
    cases = list(itertools.product(SCHEDULE, (0, 1, 3), (4,), (1, 3, 8, 16), (1, 2, 4)))
    sched = np.array([SCHEDULE.index(c[0]) for c in cases])
    stage, pp, m, v = (np.array([c[i] for c in cases]) for i in range(1, 5))
    got = np.select([sched == k for k in range(len(SCHEDULE))],
                    [peak_inflight(name, stage, pp, m, v) for name in SCHEDULE])
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
