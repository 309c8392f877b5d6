"""Topologies built without networkx (GraphRecord): the same graph, the same routes, the same
refusals as from an nx.DiGraph, and a prediction that never imports networkx."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from ddlsim.errors import ConfigError
from ddlsim.topologies import NODE_FABRICS, Topology, build_topology
from ddlsim.topologies.build import from_spec
from ddlsim.topologies.spec import parse_spec

from topo_helpers import make_spec, two_nodes

ROOT = Path(__file__).resolve().parents[2]

NETWORKS = [
    {"topology": "single_switch"},
    {"topology": "fat_tree", "nodes_per_leaf": 2},
    {"topology": "fat_tree", "nodes_per_leaf": 1, "levels": 3, "leaves_per_pod": 3},
    {"topology": "rail_optimized", "nodes_per_leaf": 4},
    {"topology": "torus", "torus_dims": [3, 4]},
    {"topology": "dragonfly", "routers_per_group": 4, "global_links": 2},
]


def _both(spec: dict) -> tuple[Topology, Topology]:
    """The topology from the builders' record, and from that record as an nx.DiGraph."""
    built = build_topology(spec)
    again = from_spec(parse_spec(spec))
    return built, Topology(again.graph.copy(), name="nx", router=again.router)


@pytest.mark.parametrize("network", NETWORKS, ids=lambda n: n["topology"])
@pytest.mark.parametrize("intra", sorted(NODE_FABRICS))
def test_record_and_networkx_graph_give_the_same_topology(network, intra):
    spec = make_spec(nodes=12, devices_per_node=4, nics_per_node=2, network=network,
                     intra_node={"kind": intra})
    rec, gx = _both(spec)
    assert rec.edges == gx.edges and rec.devices == gx.devices
    assert np.array_equal(rec.edge_bandwidth_Bps, gx.edge_bandwidth_Bps)
    assert np.array_equal(rec.edge_latency_s, gx.edge_latency_s)
    assert rec.edge_kind == gx.edge_kind and rec.nics_of_node == gx.nics_of_node
    # the lazily built nx graph holds every vertex and edge with its attributes
    g = rec.graph
    assert isinstance(g, nx.DiGraph) and nx.is_frozen(g)
    assert list(g.edges) == rec.edges and g.number_of_nodes() == len(gx.graph)
    for src, dst, key in [(0, 47, 0), (5, 30, 3), (1, 2, 1), (44, 3, 7)]:
        assert rec.route(src, dst, key) == gx.route(src, dst, key)
        assert rec.route_rail(src, dst, key) == gx.route_rail(src, dst, key)


@pytest.mark.parametrize("network", NETWORKS, ids=lambda n: n["topology"])
def test_rail_stripes_are_the_rail_routes_of_every_rail(network):
    topo = build_topology(make_spec(nodes=12, devices_per_node=4, nics_per_node=4,
                                    network=network))
    for a, b in [(0, 11), (3, 4), (7, 2)]:
        edges, lengths, lat = topo.rail_stripes(a, b)
        routes = [topo.rail_fabric_route(a, b, c) for c in range(4)]
        assert edges.tolist() == [e for r in routes for e in r]
        assert lengths.tolist() == [len(r) for r in routes]
        assert lat == max(topo.path_latency_s(r) for r in routes)



@pytest.mark.parametrize("change, message", [
    (lambda r: r.succ["sw"].pop("nic1"), r"edge \('nic1', 'sw'\) has no reverse edge"),
    (lambda r: r.succ["nic0"]["sw"].update(bandwidth_Bps=0.0),
     r"edge \('nic0', 'sw'\) has bandwidth_Bps = 0.0"),
    (lambda r: r.nodes["sw"].update(kind="hub"), r"vertex 'sw' has kind = 'hub'"),
    (lambda r: (r.succ["sw"].pop("nic1"), r.succ["nic1"].pop("sw")),
     r"the topology is not connected: 2 parts"),
])
def test_a_broken_record_is_refused_as_a_broken_graph_is(change, message):
    record = two_nodes().graph
    change(record)
    with pytest.raises(ConfigError, match=message):
        Topology(record)


def test_a_prediction_does_not_import_networkx():
    code = ("import sys, ddlsim; "
            "r = ddlsim.predict('examples/gpt3-175b-1024-a100.yaml'); "
            "assert r.iteration_time_s > 0; "
            "print('networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False"
