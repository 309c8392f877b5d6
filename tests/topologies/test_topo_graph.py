"""A Topology from a hand-made graph: the model's rules and their messages."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from ddlsim.errors import ConfigError
from ddlsim.topologies import Topology

from topo_helpers import assert_valid_route, two_nodes



def test_custom_graph_routes_with_the_generic_router():
    topo = Topology(two_nodes().graph, name="hand-made")
    path = topo.route(0, 1)
    assert_valid_route(topo, 0, 1, path)
    assert topo.path_vertices(path) == ["d0", "nic0", "sw", "nic1", "d1"]
    assert topo.path_latency_s(path) == pytest.approx(2e-6 + 1e-7)
    assert topo.path_bandwidth_Bps(path) == 1e9


def test_arrays_are_read_only_and_the_graph_frozen():
    topo = Topology(two_nodes().graph)
    with pytest.raises(ValueError):
        topo.edge_bandwidth_Bps[0] = 1.0
    with pytest.raises(nx.NetworkXError):
        topo.graph.add_node("x")
    assert topo.node_of_device.dtype == np.int64


def _broken(change) -> nx.DiGraph:
    g = two_nodes().graph.to_networkx()  # a hand-made networkx graph, as users pass one
    change(g)
    return g


@pytest.mark.parametrize("change, message", [
    (lambda g: g.remove_edge("sw", "nic1"), r"edge \('nic1', 'sw'\) has no reverse edge"),
    (lambda g: g.edges["nic0", "sw"].update(bandwidth_Bps=0.0),
     r"edge \('nic0', 'sw'\) has bandwidth_Bps = 0.0; it must be a finite number > 0"),
    (lambda g: g.edges["nic0", "sw"].update(latency_s=-1e-6),
     r"latency_s = -1e-06; it must be a finite number >= 0"),
    (lambda g: g.edges["nic0", "sw"].update(link_kind="ethernet"),
     r"link_kind = 'ethernet'; allowed: nvlink, pcie, shm, nic, fabric"),
    (lambda g: g.nodes["sw"].update(kind="hub"), r"vertex 'sw' has kind = 'hub'; allowed: device"),
    (lambda g: g.nodes["sw"].update(level=4), r"switch 'sw' has level = 4; allowed: 1 \(leaf\)"),
    (lambda g: g.nodes["d1"].pop("node"), r"vertex 'd1' \(kind 'device'\) needs an integer 'node'"),
    (lambda g: g.nodes["d1"].pop("local"), r"device 'd1' needs an integer 'local' attribute"),
    (lambda g: g.remove_edges_from([("nic1", "sw"), ("sw", "nic1")]),
     r"the topology is not connected: 2 parts"),
    (lambda g: g.nodes["d1"].update(node=5), r"must number the compute nodes 0..N-1; got \[0, 5\]"),
])
def test_graphs_breaking_the_model_are_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        Topology(_broken(change))


def test_uneven_nodes_are_refused():
    b = two_nodes()
    b.add_node("d2", "device", node=1, local=1)
    b.add_link("d2", "nic1", bandwidth_Bps=1e10, link_kind="pcie")
    with pytest.raises(ConfigError, match=r"same number of devices; got \{0: 1, 1: 2\}"):
        Topology(b.graph)


def test_device_without_nic_is_refused_on_several_nodes():
    b = two_nodes()
    b.add_node("d2", "device", node=1, local=1, nics=())
    b.add_node("d3", "device", node=0, local=1, nics=())
    for d, nic in (("d2", "nic1"), ("d3", "nic0")):
        b.add_link(d, nic, bandwidth_Bps=1e10, link_kind="pcie")
    with pytest.raises(ConfigError, match=r"device 'd3' has no NIC; with 2 nodes"):
        Topology(b.graph)


def test_not_a_digraph_is_refused():
    with pytest.raises(ConfigError, match=r"must be an nx.DiGraph; got Graph"):
        Topology(nx.Graph())
