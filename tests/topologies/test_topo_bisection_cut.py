"""The bisection of a large fabric: the contracted min cut from the edge arrays (Dinic's max
flow in scipy) equals networkx's on the contracted graph, and a large summary never builds
the networkx graph (10,000 rail-optimised nodes took 44 s and 1.5 GB that way)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from ddlsim.topologies import report
from ddlsim.topologies.build import build_topology

FABRIC = ("switch", "router")


def _reference(topology) -> nx.Graph:
    """The contracted graph as networkx held it before: fabric links as they are, a node's
    uplinks summed into one edge per switch."""
    g, cap = topology.graph, nx.Graph()
    for u, v, bw in g.edges(data="bandwidth_Bps"):
        if g.nodes[v]["kind"] not in FABRIC:
            continue
        if g.nodes[u]["kind"] in FABRIC:
            cap.add_edge(u, v, capacity=bw)
        else:
            a = ("node", g.nodes[u]["node"])
            old = cap.edges[a, v]["capacity"] if cap.has_edge(a, v) else 0.0
            cap.add_edge(a, v, capacity=old + bw)
    return cap


@pytest.mark.parametrize("spec", [
    {"preset": "dgx-a100", "nodes": 16},
    {"preset": "dgx-a100", "nodes": 24, "network": {"topology": "rail_optimized",
                                                    "nodes_per_leaf": 4}},
    {"preset": "cpu-10gbe", "nodes": 9},
    {"preset": "dgx-h100", "nodes": 12, "network": {"topology": "torus"}},
    {"preset": "dgx1-v100", "nodes": 20, "network": {"topology": "dragonfly"}},
    {"preset": "dgx-a100", "nodes": 40, "network": {"topology": "fat_tree",
                                                    "oversubscription": 4}},
    {"preset": "dgx-a100", "nodes": 7, "network": {"topology": "fat_tree",
                                                   "nodes_per_leaf": 2, "levels": 3}},
])
def test_contracted_cut_equals_networkx(spec):
    t = build_topology(spec)
    half = t.num_nodes // 2
    want = report._min_cut(_reference(t), {("node", n): n < half for n in range(t.num_nodes)})
    got, exact = report.contracted_cut(t, half)
    assert exact and got == want


def test_a_large_rail_fabric_is_summarised_without_networkx():
    t = build_topology({"preset": "dgx-a100", "nodes": 1000,
                        "network": {"topology": "rail_optimized", "nodes_per_leaf": 1}})
    s = report.summary(t)
    assert "contracted" in s["bisection_method"]
    assert s["bisection_bandwidth_Bps"] == 500 * 8 * 25e9   # half the nodes' NICs, 200 Gb/s
    assert s["vertices"]["leaf switch"] == 8000
    assert "graph" not in t.__dict__   # the networkx view was never built


def test_capacities_that_are_not_whole_are_rounded_and_said_so():
    ints, scale, exact = report._integer_capacities(np.array([1.5, 3.0, 2.25]))
    assert not exact and ints.max() == 10**6 and ints * scale == pytest.approx([1.5, 3, 2.25])
    ints, scale, exact = report._integer_capacities(np.array([25e9, 12.5e9]))
    assert exact and ints.tolist() == [2, 1] and scale == 12.5e9
