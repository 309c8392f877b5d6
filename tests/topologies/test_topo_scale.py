"""The array paths that build and route 10^5-device clusters give what the one-at-a-time
paths give: nodes copied from node 0, tree rail routes for many pairs, NCCL's p2p rails as a
table, and device routes of many flows at once (edge for edge, latency bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.topologies import build, build_topology

from topo_helpers import make_spec

FABRICS = [
    {"topology": "fat_tree", "nodes_per_leaf": 2},
    {"topology": "fat_tree", "nodes_per_leaf": 1, "levels": 3, "leaves_per_pod": 3},
    {"topology": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 2},
    {"topology": "rail_optimized", "nodes_per_leaf": 4},
    {"topology": "single_switch"},
]
INTRA = ["nvswitch", "pcie", "nvlink_ring", "nvlink_mesh", "shared_memory"]


def _spec(network: dict, intra: str = "nvswitch", nics: int = 4) -> dict:
    return make_spec(nodes=12, devices_per_node=4, nics_per_node=nics, network=network,
                     intra_node={"kind": intra})


@pytest.mark.parametrize("intra", INTRA)
@pytest.mark.parametrize("network", FABRICS + [{"topology": "torus", "torus_dims": [3, 4]},
                                               {"topology": "dragonfly"}],
                         ids=lambda n: n["topology"])
def test_copied_nodes_are_the_nodes_built_one_by_one(network, intra, monkeypatch):
    copied = build_topology(_spec(network, intra))
    monkeypatch.setattr(build, "_node_template", lambda spec, fabric: None)
    one_by_one = build_topology(_spec(network, intra))
    assert copied.edges == one_by_one.edges and copied.devices == one_by_one.devices
    assert np.array_equal(copied.edge_latency_s, one_by_one.edge_latency_s)
    assert np.array_equal(copied.edge_bandwidth_Bps, one_by_one.edge_bandwidth_Bps)
    assert copied.nics_of_device == one_by_one.nics_of_device
    assert dict(copied.graph.nodes(data=True)) == dict(one_by_one.graph.nodes(data=True))


@pytest.mark.parametrize("network", FABRICS, ids=lambda n: n["topology"])
def test_tree_rail_routes_of_many_pairs_are_the_routes_one_by_one(network):
    topo = build_topology(_spec(network))
    assert topo._trees is not None
    a, b = np.meshgrid(np.arange(12), np.arange(12))
    keep = a.ravel() != b.ravel()
    src, dst = a.ravel()[keep], b.ravel()[keep]
    links, lengths, per_pair, latency = topo.rail_stripes_flat(src, dst)
    one = [topo.rail_stripes(x, y) for x, y in zip(src.tolist(), dst.tolist())]
    assert links.tolist() == [e for s in one for e in s[0].tolist()]
    assert lengths.tolist() == [e for s in one for e in s[1].tolist()]
    assert per_pair.tolist() == [len(s[1]) for s in one]
    assert latency.tolist() == [s[2] for s in one]
    rail = np.arange(len(src)) % 5
    links, lengths = topo.rail_routes_flat(src, dst, rail)
    want = [topo.rail_fabric_route(x, y, c) for x, y, c in zip(src.tolist(), dst.tolist(),
                                                                rail.tolist())]
    assert links.tolist() == [e for r in want for e in r]
    assert lengths.tolist() == [len(r) for r in want]


@pytest.mark.parametrize("intra", ["nvswitch", "pcie", "nvlink_ring"])
@pytest.mark.parametrize("nics, per_node", [(1, 4), (2, 4), (4, 4), (8, 4), (4, 8), (2, 2)])
def test_p2p_rail_table_is_every_device_rails(intra, nics, per_node):
    topo = build_topology(make_spec(nodes=6, devices_per_node=per_node, nics_per_node=nics,
                                    intra_node={"kind": intra}))
    table, count = topo.p2p_rail_table
    for d in range(topo.num_devices):
        rails = topo.p2p_rails(d)
        assert count[d] == len(rails) and tuple(table[d, :len(rails)].tolist()) == rails


@pytest.mark.parametrize("intra", ["nvswitch", "pcie"])
@pytest.mark.parametrize("network", FABRICS[:4], ids=lambda n: n["topology"])
def test_device_routes_of_many_flows_are_route_rail(network, intra):
    topo = build_topology(_spec(network, intra))
    rng = np.random.default_rng(7)
    src = rng.integers(0, topo.num_devices, 600)
    dst = rng.integers(0, topo.num_devices, 600)
    dst[:100] = src[:100] ^ 1                      # pairs inside a node
    rail = rng.integers(0, 9, 600)
    rows, latency = topo.route_rail_many(src, dst, rail)
    for a, b, c, row, lat in zip(src.tolist(), dst.tolist(), rail.tolist(), rows.tolist(),
                                 latency.tolist()):
        want = topo.route_rail(a, b, c)
        assert tuple(e for e in row if e >= 0) == want
        assert lat == topo.path_latency_s(want)


def test_device_routes_of_many_flows_decline_where_nodes_are_not_copies():
    topo = build_topology(_spec({"topology": "torus", "torus_dims": [3, 4]}))
    assert topo.route_rail_many(np.array([0]), np.array([5]), np.array([1])) is None
