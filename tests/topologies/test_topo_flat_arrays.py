"""The flat forms the 131,072-GPU path keeps (issue 27) say what the per-item forms say: each
device's NICs (:class:`~ddlsim.topologies.layout.DeviceNics`) as the graph's ``nics``
attributes, edge offsets per source as a binary search finds them, and a repeated tree-route
query the same arrays, read-only."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.topologies import build_topology
from ddlsim.topologies.builder import source_offsets

from topo_helpers import make_spec


@pytest.mark.parametrize("intra", ["nvswitch", "pcie"])
def test_device_nics_are_the_graphs_nics_attributes(intra):
    topo = build_topology(make_spec(nodes=5, devices_per_node=4, nics_per_node=2,
                                    network={"topology": "fat_tree", "nodes_per_leaf": 2},
                                    intra_node={"kind": intra}))
    index = {name: i for i, name in enumerate(topo._names)}
    attrs = topo.graph.nodes
    for d, name in enumerate(topo.devices):
        node = int(topo.node_of_device[d])
        want = tuple(index[n] for n in attrs[name]["nics"]) if "nics" in attrs[name] \
            else tuple(topo._node_nics[node])      # a device without ``nics``: its node's
        assert topo._dev_nics[d] == want
    assert list(topo._dev_nics) == [topo._dev_nics[d] for d in range(topo.num_devices)]
    assert topo._dev_nics[-1] == topo._dev_nics[topo.num_devices - 1]
    with pytest.raises(IndexError):
        topo._dev_nics[topo.num_devices]


def test_source_offsets_are_a_binary_search():
    rng = np.random.default_rng(0)
    for vertices, edges in [(1, 0), (5, 3), (40, 200), (300, 40)]:
        u = np.sort(rng.integers(0, vertices, edges))
        assert np.array_equal(source_offsets(u, vertices),
                              np.searchsorted(u, np.arange(vertices + 1)))


def test_a_repeated_tree_route_query_returns_the_same_read_only_arrays():
    topo = build_topology(make_spec(nodes=8, devices_per_node=2, nics_per_node=2,
                                    network={"topology": "fat_tree", "nodes_per_leaf": 2}))
    trees = topo._trees
    src, dst, rail = np.array([0, 1, 7]), np.array([5, 1, 2]), np.array([0, 1, 1])
    first = trees.routes(src, dst, rail)
    again = trees.routes(src.copy(), dst.copy(), rail.copy())
    assert all(a is b and not a.flags.writeable for a, b in zip(first, again))
    other = trees.routes(src, dst, 1 - rail)        # new arguments: routed afresh
    assert other[0] is not first[0]
    one = [topo.rail_fabric_route(a, b, c) for a, b, c in zip(src, dst, rail)]
    assert first[0].tolist() == [e for r in one for e in r]
    assert first[1].tolist() == [len(r) for r in one]
