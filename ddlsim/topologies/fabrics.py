"""Switched fabrics between nodes: one switch, fat trees (2 or 3 levels), rail-optimised.

Sizing (all bandwidths per direction). A leaf has ``D`` down-ports (NIC links). With
oversubscription ``r`` its uplinks carry ``D · B_nic / r`` in total, spread over ``U`` uplinks
(``network.spines``, default ``ceil(D / r)``) of ``D · B_nic / (r · U)`` each — the NIC
bandwidth when ``r`` divides ``D`` — unless ``network.link_bandwidth_Bps`` is given.
Three levels group ``P`` leaves (``network.leaves_per_pod``, default ``D``) into a pod with
``U`` aggregation switches; aggregation switch *j* of every pod links to the ``P`` core
switches of plane *j*, so only the leaves are oversubscribed (the k-ary fat tree of Al-Fares
et al., SIGCOMM 2008, generalised to any leaf count).
"""

from __future__ import annotations

import math

import numpy as np

from .registry import GraphBuilder, register_topology
from .routing import TreeRouter
from .spec import TopologySpec

__all__ = ["link_nic", "link_nics", "single_switch", "fat_tree", "rail_optimized", "DEFAULT_LEAF_PORTS"]

#: Down-ports of a leaf when ``network.nodes_per_leaf`` is not given (half of a 64-port switch).
DEFAULT_LEAF_PORTS = 32


def link_nic(b: GraphBuilder, nic: str, switch: str, spec: TopologySpec) -> None:
    """NIC ↔ switch at the NIC's bandwidth; half the NIC latency on each side of the fabric."""
    b.add_link(nic, switch, bandwidth_Bps=spec.nic.bandwidth_Bps, latency_s=spec.nic.latency_s / 2,
               link_kind="nic")


def link_nics(b: GraphBuilder, nics: list[str], switches: list[str], spec: TopologySpec) -> None:
    """:func:`link_nic` for each ``nics[i]`` ↔ ``switches[i]``, all at once."""
    b.add_links(nics, switches, bandwidth_Bps=spec.nic.bandwidth_Bps,
                latency_s=spec.nic.latency_s / 2, link_kind="nic")


def _ids(b: GraphBuilder, names: list[str]) -> np.ndarray:
    """The vertex ids of ``names``."""
    return np.fromiter(map(b.index.__getitem__, names), dtype=np.int64, count=len(names))


def _add_switches(b: GraphBuilder, names: list[str], level: int) -> list[str]:
    return [b.add_node(name, "switch", level=level) for name in names]


@register_topology("single_switch")
def single_switch(b: GraphBuilder, spec: TopologySpec, nics_by_node: list[list[str]]) -> TreeRouter:
    """Every NIC on one switch (``switch0``): a non-blocking crossbar."""
    (switch,) = _add_switches(b, ["switch0"], level=1)
    nics = [nic for per_node in nics_by_node for nic in per_node]
    link_nics(b, nics, [switch] * len(nics), spec)
    b.attrs["fabric"] = {"topology": "single_switch", "levels": 1, "leaves": 1}
    return TreeRouter()


@register_topology("fat_tree")
def fat_tree(b: GraphBuilder, spec: TopologySpec, nics_by_node: list[list[str]]) -> TreeRouter:
    """Leaves of ``nodes_per_leaf`` nodes (all of a node's NICs on its leaf) under spines
    (2 levels) or aggregation and core switches (3 levels; automatic above 2·D leaves)."""
    per_node = spec.nics_per_node
    npl = spec.network.nodes_per_leaf or max(1, DEFAULT_LEAF_PORTS // per_node)
    count = math.ceil(spec.nodes / npl)
    leaves = _add_switches(b, [f"leaf{i}" for i in range(count)], level=1)
    per = np.fromiter(map(len, nics_by_node), dtype=np.int64, count=len(nics_by_node))
    link_nics(b, [nic for nics in nics_by_node for nic in nics],
              np.repeat(_ids(b, leaves)[np.arange(len(nics_by_node)) // npl], per), spec)
    return _upper_levels(b, spec, leaves, down_ports=npl * per_node, nodes_per_leaf=npl)


@register_topology("rail_optimized")
def rail_optimized(b: GraphBuilder, spec: TopologySpec,
                   nics_by_node: list[list[str]]) -> TreeRouter:
    """One leaf per rail per group of ``nodes_per_leaf`` nodes: NIC *i* of every node of the
    group links to leaf ``rail{i}.leaf{g}``, so same-rail traffic crosses one switch (NVIDIA
    DGX SuperPOD reference architecture). Spines (or pods) above join the rails."""
    npl = spec.network.nodes_per_leaf or DEFAULT_LEAF_PORTS
    groups = math.ceil(spec.nodes / npl)
    names = [f"rail{r}.leaf{g}" for g in range(groups) for r in range(spec.nics_per_node)]
    leaves = _add_switches(b, names, level=1)
    link_nics(b, [nic for nics in nics_by_node for nic in nics],
              [leaves[(n // npl) * spec.nics_per_node + rail]
               for n, nics in enumerate(nics_by_node) for rail in range(len(nics))], spec)
    return _upper_levels(b, spec, leaves, down_ports=npl, nodes_per_leaf=npl)


def _upper_levels(b: GraphBuilder, spec: TopologySpec, leaves: list[str], down_ports: int,
                  nodes_per_leaf: int) -> TreeRouter:
    """Spines or pods above ``leaves``; records the sizing in ``graph.graph['fabric']``."""
    net = spec.network
    r = net.oversubscription
    uplinks = net.spines or max(1, math.ceil(down_ports / r))
    link_bw = net.link_bandwidth_Bps or down_ports * spec.nic.bandwidth_Bps / (r * uplinks)
    leaves_per_pod = net.leaves_per_pod or down_ports
    levels = net.levels or (2 if len(leaves) <= 2 * down_ports else 3)
    if len(leaves) == 1:
        levels = 1
    elif levels == 3 and len(leaves) <= leaves_per_pod:
        levels = 2  # one pod: its aggregation switches are the spines
    info = {"topology": net.topology, "levels": levels, "leaves": len(leaves),
            "nodes_per_leaf": nodes_per_leaf, "leaf_down_ports": down_ports,
            "leaf_uplinks": uplinks if levels > 1 else 0,
            "uplink_bandwidth_Bps": link_bw if levels > 1 else None,
            "oversubscription": (down_ports * spec.nic.bandwidth_Bps / (uplinks * link_bw)
                                 if levels > 1 else 1.0)}
    b.attrs["fabric"] = info
    if levels == 1:
        return TreeRouter()
    if levels == 2:
        return _two_level(b, leaves, uplinks, link_bw)
    info["leaves_per_pod"] = leaves_per_pod
    return _three_level(b, leaves, uplinks, leaves_per_pod, link_bw)


def _two_level(b: GraphBuilder, leaves: list[str], spines: int, link_bw: float) -> TreeRouter:
    names = _add_switches(b, [f"spine{j}" for j in range(spines)], level=2)
    b.add_links(np.repeat(_ids(b, leaves), len(names)), np.tile(_ids(b, names), len(leaves)),
                bandwidth_Bps=link_bw, link_kind="fabric")   # each leaf to every spine
    return TreeRouter(spines=names)


def _three_level(b: GraphBuilder, leaves: list[str], aggs_per_pod: int, leaves_per_pod: int,
                 link_bw: float) -> TreeRouter:
    pods = math.ceil(len(leaves) / leaves_per_pod)
    aggs = [_add_switches(b, [f"agg{p}.{j}" for j in range(aggs_per_pod)], level=2)
            for p in range(pods)]
    cores = [_add_switches(b, [f"core{j}.{c}" for c in range(leaves_per_pod)], level=3)
             for j in range(aggs_per_pod)]
    pod_of_leaf = {leaf: i // leaves_per_pod for i, leaf in enumerate(leaves)}
    agg_ids = np.array([_ids(b, pod) for pod in aggs]).reshape(pods, aggs_per_pod)
    core_ids = np.array([_ids(b, plane) for plane in cores]).reshape(aggs_per_pod, -1)
    # each leaf to its pod's aggregation switches; aggregation switch j of each pod to the
    # cores of plane j (as ids: no look-up by name per link)
    b.add_links(np.repeat(_ids(b, leaves), aggs_per_pod),
                agg_ids[np.arange(len(leaves)) // leaves_per_pod].ravel(),
                bandwidth_Bps=link_bw, link_kind="fabric")
    b.add_links(np.repeat(agg_ids.ravel(), core_ids.shape[1]),
                core_ids[np.tile(np.arange(aggs_per_pod), pods)].ravel(),
                bandwidth_Bps=link_bw, link_kind="fabric")
    b.attrs["fabric"].update(pods=pods, cores=aggs_per_pod * leaves_per_pod)
    return TreeRouter(pod_of_leaf=pod_of_leaf, aggs=aggs, cores=cores)
