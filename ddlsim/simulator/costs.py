"""Closed-form costs of single ops: compute (roofline), collectives (α-β per algorithm, on the
links each group crosses given where its ranks sit) and point-to-point transfers.

Compute: ``max(FLOPs / (peak[dtype] · η), bytes / memory bandwidth)`` with η the system's GEMM
efficiency (or the calibration profile's efficiency curve); element-wise ops are bytes only.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..config import ParallelConfig, SystemConfig
from ..errors import ConfigError
from ..units import format_bytes
from ..workloads.trace import Collective, Compute, GroupFamily, P2P, Workload
from .collectives import GroupNet, best_algorithm, collective_time, get_algorithm

__all__ = ["CostModel", "place_ranks_on_system"]


class _Shape(NamedTuple):
    """What rank placement needs to know of a system (no graph to build)."""

    name: str
    num_nodes: int
    devices_per_node: int
    num_devices: int


def place_ranks_on_system(system: SystemConfig, num_ranks: int) -> np.ndarray:
    """Device id of each rank, by the system's placement policy (see
    :func:`ddlsim.topologies.place_ranks`; the same function places ranks for the DES)."""
    from ..topologies.placement import place_ranks

    shape = _Shape(system.name, system.nodes, system.devices_per_node, system.num_devices)
    return place_ranks(shape, num_ranks, system.placement)  # type: ignore[arg-type]


class CostModel:
    """Costs for one workload on one system (and optionally a calibration profile)."""

    def __init__(self, system: SystemConfig, workload: Workload, parallel: ParallelConfig,
                 profile=None, backend: str | None = None, bound: str | None = None):
        self.system = system
        self.parallel = parallel
        self.profile = profile
        self.backend = backend
        self.bound = bound  # None, "lo" or "hi": use the profile's interval ends
        self.backend_choices: dict[str, str] = {}
        devices = place_ranks_on_system(system, workload.world_size)
        self.node_of_rank = devices // system.devices_per_node
        self.ranks_per_node = np.bincount(self.node_of_rank, minlength=system.nodes)
        self.nets = {name: self._group_net(fam) for name, fam in workload.groups.items()}
        self.kind = {name: fam.kind for name, fam in workload.groups.items()}
        self.algorithms: dict[str, str] = {}
        self._coll = lru_cache(maxsize=None)(self._collective_uncached)
        dev = system.device
        self._eff = system.compute_efficiency
        self._peak = dict(dev.peak_flops)
        self._mem_bw = dev.memory_bandwidth_Bps

    # ------------------------------------------------------------------ networks
    def _group_net(self, fam: GroupFamily) -> GroupNet:
        s = self.system
        row = fam.members[0]
        nodes_of = self.node_of_rank[row]
        _, counts = np.unique(nodes_of, return_counts=True)
        g, n_nodes = int(counts.max()), len(counts)
        # groups of this family sharing a node's NICs at the same time
        node0 = int(nodes_of[0])
        concurrent = max(1, int(self.ranks_per_node[node0]) // g)
        bw_node = s.nics_per_node * s.nic.bandwidth_Bps / concurrent
        alpha_inter = s.nic.latency_s + s.network.switch_latency_s
        if s.network.oversubscription > 1 and n_nodes > 1:
            bw_node /= s.network.oversubscription
        return GroupNet(fam.size, g, s.intra_node.latency_s, s.intra_node.bandwidth_Bps,
                        alpha_inter, bw_node, n_nodes)

    # ------------------------------------------------------------------ op costs
    def compute(self, op: Compute) -> float:
        peak = self._peak.get(op.dtype) or max(self._peak.values())
        t_mem = op.bytes / self._mem_bw
        if op.kind in ("elementwise", "optimizer"):
            return max(t_mem, op.flops / peak)
        eff = self._eff
        if self.profile is not None and self.profile.has_compute:
            from ..calibration.schema import CalibrationError
            try:
                eff = self.profile.compute_efficiency(op.flops, op.dtype)
            except CalibrationError:  # dtype not calibrated: keep the system's efficiency
                pass
        return max(op.flops / (peak * eff), t_mem)

    def collective(self, op: Collective) -> float:
        return self._coll(op.op, op.group, op.bytes if op.split_bytes is None
                          else float(sum(op.split_bytes)), op.algorithm)

    def _collective_uncached(self, kind: str, group: str, nbytes: float, algo: str | None) -> float:
        net = self.nets[group]
        if net.p <= 1:
            return 0.0
        if self.profile is not None:
            t = self.profile_time(kind, nbytes, net)
            if t is not None:
                return t
        choice = algo or self.parallel.collective_algorithm.get(kind, "auto")
        if choice == "auto":
            choice, t = best_algorithm(kind, nbytes, net)
        else:
            get_algorithm(kind, choice)
            t = collective_time(kind, choice, nbytes, net)
            if not math.isfinite(t):
                raise ConfigError(f"collective_algorithm.{kind} = {choice!r} cannot run on group "
                                  f"{group!r} (its ranks are not spread evenly over nodes); "
                                  "choose another algorithm or 'auto'")
        self.algorithms[f"{group}.{kind}[{format_bytes(nbytes)}]"] = choice
        return t

    def profile_time(self, kind: str, nbytes: float, net: GroupNet) -> float | None:
        """Time from the calibration profile (the fastest backend with ``auto``), or None if
        the profile does not cover this operation and scope (the closed forms are used)."""
        prof = self.profile
        scope = "inter" if net.multi_node else "intra"
        try:
            backend = self.backend
            if backend in (None, "auto"):
                backend, t = prof.best_backend(kind, nbytes, net.p, scope)
            else:
                t = prof.time_s(backend, kind, nbytes, net.p, scope)
            if self.bound is not None:
                lo, hi = prof.interval_s(backend, kind, nbytes, net.p, scope)
                t = lo if self.bound == "lo" else hi
        except KeyError:
            return None
        self.backend_choices[f"{kind}[{format_bytes(nbytes)}]"] = backend
        self.algorithms[f"{kind}[{format_bytes(nbytes)}]"] = f"{backend} (calibrated)"
        return t

    def p2p(self, op: P2P, src: int, dst: int) -> float:
        """Seconds to move ``op.bytes`` from rank ``src`` to rank ``dst``."""
        net = self.nets[op.group]
        if self.node_of_rank[src] != self.node_of_rank[dst]:
            return net.alpha_inter_s + op.bytes / min(net.bw_intra_Bps, net.bw_node_Bps)
        return net.alpha_intra_s + op.bytes / net.bw_intra_Bps
