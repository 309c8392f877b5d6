"""Small synthetic workloads and clusters for checking the engines (tests and
``benchmarks/engine_agreement.py``).

Real workloads come from :mod:`ddlsim.workloads`; these isolate one mechanism at a time: one
collective (even or with per-peer sizes), several collectives at once on separate streams, a
send/recv pair between two rank classes. :func:`run_case` times one collective with both
engines.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dataclasses import dataclass

from ddlsim.config import ParallelConfig, SystemConfig
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.trace import (P2P, Block, Collective, Compute, GroupFamily, Op, Program,
                                    RankClass, Step, Wait, Workload, WorkloadMeta)

__all__ = ["cluster", "single_collective", "uneven_all_to_all", "concurrent_collectives",
           "send_recv_pair", "cost_model", "with_bandwidth", "AgreementCase", "run_case",
           "exact", "RING_EXACT"]

_META = WorkloadMeta(samples=1, tokens=1)


def cluster(nodes: int, g: int, fabric: str = "switch", *, nic: str = "100 Gb/s",
            oversubscription: float = 1.0, nodes_per_leaf: int | None = None,
            intra: str = "100 GB/s") -> SystemConfig:
    """``nodes`` × ``g`` devices: NVSwitch inside (``intra`` per device, 2 µs), one NIC per
    node (``nic``, 5 µs). ``fabric``: ``switch`` (one switch, 0.5 µs), ``ring`` (a ring of
    routers, one per node, no switch latency) or ``fat_tree`` (``oversubscription``,
    ``nodes_per_leaf``, no switch latency)."""
    if fabric == "switch":
        network: dict = {"topology": "single_switch", "switch_latency_s": "0.5 us"}
    elif fabric == "ring":
        network = {"topology": "torus", "torus_dims": [nodes], "switch_latency_s": 0.0}
    else:
        network = {"topology": "fat_tree", "oversubscription": oversubscription,
                   "nodes_per_leaf": nodes_per_leaf, "switch_latency_s": 0.0}
    return SystemConfig.model_validate({
        "name": f"{fabric}-{nodes}x{g}", "nodes": nodes, "devices_per_node": g,
        "device": {"name": "gpu", "peak_flops": {"bf16": "100 TFLOP/s"},
                   "memory_bytes": "80 GB", "memory_bandwidth_Bps": "2 TB/s"},
        "intra_node": {"kind": "nvswitch", "bandwidth_Bps": intra, "latency_s": "2 us"},
        "nics_per_node": 1, "nic": {"bandwidth_Bps": nic, "latency_s": "5 us"},
        "network": network})


def cost_model(system: SystemConfig, workload: Workload, **parallel) -> CostModel:
    """The cost model both engines use, with the collective algorithms of a parallel config
    (its defaults, or ``parallel``'s settings)."""
    return CostModel(system, workload, ParallelConfig(**parallel).collective_algorithm)


def _one_class(name: str, p: int, ops: Sequence[Op], groups: dict) -> Workload:
    program = Program({"b": Block("b", "other", tuple(ops))}, (Step("b"),))
    return Workload(name, p, groups, (RankClass("all", tuple(range(p)), program),), _META)


def single_collective(op: str, algorithm: str | None, nbytes: float, p: int,
                      root: int = 0) -> Workload:
    """One class of ``p`` ranks issuing one collective on one group of all of them."""
    coll = Collective("x", op, "g", float(nbytes), root=root, algorithm=algorithm)
    group = GroupFamily("g", "dp", np.arange(p).reshape(1, p))
    return _one_class(f"{op}-{algorithm}-{p}", p, [Op(coll)], {"g": group})


def uneven_all_to_all(split_bytes: Sequence[float], algorithm: str | None) -> Workload:
    """One class of ``len(split_bytes)`` ranks issuing one all-to-all in which every rank
    sends ``split_bytes[j]`` bytes to member j (docs/trace.md, "Uneven all-to-all")."""
    p = len(split_bytes)
    split = tuple(float(b) for b in split_bytes)
    coll = Collective("x", "all_to_all", "g", sum(split), split_bytes=split, algorithm=algorithm)
    group = GroupFamily("g", "ep", np.arange(p).reshape(1, p))
    return _one_class(f"uneven-a2a-{algorithm}-{p}", p, [Op(coll)], {"g": group})


def concurrent_collectives(specs: Sequence[tuple[str, str | None, float, int]], p: int,
                           group_rows: int = 1, compute_flops: float = 0.0) -> Workload:
    """``specs`` = (op, algorithm, bytes, root), each issued at once on its own stream over
    groups of ``p // group_rows`` ranks (``group_rows`` groups side by side), after an
    optional compute op; the compute stream then waits for all of them."""
    size = p // group_rows
    group = GroupFamily("g", "dp", np.arange(size * group_rows).reshape(group_rows, size))
    ops = [Op(Compute("work", compute_flops))]
    for i, (op, algo, nbytes, root) in enumerate(specs):
        ops.append(Op(Collective(f"c{i}", op, "g", float(nbytes), root=root % size,
                                 algorithm=algo), stream=f"s{i}", deps=(0,)))
    ops += [Op(Wait(f"join{i}", f"s{i}")) for i in range(len(specs))]
    return _one_class("concurrent", size * group_rows, ops, {"g": group})


def send_recv_pair(nbytes: float, p: int = 2, recv_first: bool = False,
                   send: bool = True, recv: bool = True, compute_flops: float = 1e9) -> Workload:
    """Two classes (halves of ``p`` ranks, paired across a ``pp`` family): the first
    computes and sends, the second receives and computes. ``recv_first`` makes both sides
    receive before sending (a cycle of waits); ``send=False`` drops the first side's send
    (a recv with no send), ``recv=False`` the second side's recv (a send with no recv)."""
    half = p // 2
    pp = GroupFamily("pp", "pp", np.stack([np.arange(half), np.arange(half, p)], axis=1))
    work = Op(Compute("work", compute_flops))
    tx = Op(P2P("send.act", "send", "pp", +1, float(nbytes), "act"), stream="pp", deps=(0,))
    rx = Op(P2P("recv.act", "recv", "pp", -1, float(nbytes), "act"), stream="pp")
    back_tx = Op(P2P("send.grad", "send", "pp", -1, float(nbytes), "grad"), stream="pp",
                 deps=(1,))
    back_rx = Op(P2P("recv.grad", "recv", "pp", +1, float(nbytes), "grad"), stream="pp")
    if recv_first:
        first = (back_rx, Op(Compute("work", compute_flops), deps=(0,)), tx)
        second = (rx, Op(Compute("work", compute_flops), deps=(0,)), back_tx)
    else:
        first = (work, tx) if send else (work,)
        second = (rx, Op(Compute("work", compute_flops), deps=(0,))) if recv else (work,)
    classes = []
    for name, ranks, ops in (("first", range(half), first), ("second", range(half, p), second)):
        program = Program({"b": Block("b", "forward", tuple(ops))}, (Step("b"),))
        classes.append(RankClass(name, tuple(ranks), program))
    return Workload("pair", p, {"pp": pp}, tuple(classes), _META)


def with_bandwidth(topology, edge: int, factor: float):
    """A copy of ``topology`` with directed link ``edge``'s bandwidth × ``factor`` (routes
    are unchanged: they depend on hops and latencies only)."""
    import copy

    out = copy.copy(topology)
    bw = topology.edge_bandwidth_Bps.copy()
    bw[edge] *= factor
    bw.flags.writeable = False
    out.edge_bandwidth_Bps = bw
    return out


#: Algorithms whose flows only ever go to a ring neighbour (member i ↔ i ± 1): contention-free
#: on a ring of nodes with one rank per node.
RING_EXACT = {("all_reduce", "ring"), ("reduce_scatter", "ring"), ("all_gather", "ring"),
              ("reduce", "ring"), ("broadcast", "ring"), ("all_reduce", "hierarchical"),
              ("reduce_scatter", "hierarchical"), ("all_gather", "hierarchical")}


@dataclass(frozen=True)
class AgreementCase:
    """One collective timed by both engines."""

    op: str
    algorithm: str
    nbytes: float
    p: int
    g: int
    fabric: str
    analytical_s: float
    des_s: float

    @property
    def relative(self) -> float:
        """DES / analytical − 1."""
        return self.des_s / self.analytical_s - 1.0


def run_case(op: str, algorithm: str, nbytes: float, p: int, g: int = 1,
             fabric: str = "switch") -> AgreementCase:
    """Time one collective with both engines."""
    from ddlsim.simulator.des import run_des

    system = cluster(max(1, p // g), g, fabric)
    wl = single_collective(op, algorithm, nbytes, p)
    analytical = simulate_analytical(wl, cost_model(system, wl)).timings[0].end
    run, _ = run_des(wl, cost_model(system, wl), record_spans=False)
    return AgreementCase(op, algorithm, float(nbytes), p, g, fabric, analytical,
                         run.timings[0].end)


def exact(case: AgreementCase) -> bool:
    """Is the closed form exact here (every flow of a step gets the bandwidth and latency
    the formula gives it)? One rank per node on a switch, or one node; on a ring, only the
    neighbour-to-neighbour algorithms."""
    if case.fabric == "ring":
        return case.g == 1 and (case.op, case.algorithm) in RING_EXACT
    return case.g in (1, case.p)
