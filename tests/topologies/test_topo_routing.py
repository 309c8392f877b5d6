"""Routes: valid shortest paths, intra-node traffic never on a NIC, deterministic ECMP."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlsim.errors import ConfigError
from ddlsim.topologies import NODE_FABRICS, build_topology

from topo_helpers import assert_valid_route, make_spec

NETWORKS = {
    "single_switch": {"topology": "single_switch"},
    "fat_tree_2": {"topology": "fat_tree", "nodes_per_leaf": 2},
    "fat_tree_3": {"topology": "fat_tree", "nodes_per_leaf": 1, "levels": 3, "leaves_per_pod": 3},
    "rail_optimized": {"topology": "rail_optimized", "nodes_per_leaf": 4},
    "torus_2d": {"topology": "torus", "torus_dims": [3, 4]},
    "torus_3d": {"topology": "torus", "torus_dims": [2, 3, 2]},
    "dragonfly": {"topology": "dragonfly", "routers_per_group": 4, "global_links": 2},
}


def _topo(network: str, **override):
    return build_topology(make_spec(nodes=12, devices_per_node=4, network=NETWORKS[network],
                                    **override))


TOPOS = {name: _topo(name) for name in NETWORKS}
RAILS = {name: _topo(name, nics_per_node=4) for name in NETWORKS}


@pytest.mark.parametrize("name", sorted(NETWORKS))
@settings(max_examples=60, deadline=None)
@given(src=st.integers(0, 47), dst=st.integers(0, 47), key=st.integers(-(2**70), 2**70))
def test_routes_are_simple_paths_between_the_right_devices(name, src, dst, key):
    for topo in (TOPOS[name], RAILS[name]):
        assert_valid_route(topo, src, dst, topo.route(src, dst, key))


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_routes_have_fewest_hops_then_least_latency(name):
    """With one NIC per node no inter-node path can cut through another node, so routes must
    match networkx's shortest paths (hops, then latency) on the whole graph — on the graph
    without NICs for pairs inside one node (a NIC is never a transit point)."""
    topo = TOPOS[name]
    kinds = nx.get_node_attributes(topo.graph, "kind")
    no_nics = nx.subgraph_view(topo.graph, filter_node=lambda v: kinds[v] != "nic")
    for src, dst in itertools.product(range(0, 48, 5), range(1, 48, 7)):
        path = topo.route(src, dst)
        same_node = topo.node_of_device[src] == topo.node_of_device[dst]
        g = no_nics if same_node else topo.graph
        shortest = list(nx.all_shortest_paths(g, topo.devices[src], topo.devices[dst]))
        assert len(path) == len(shortest[0]) - 1
        best = min(sum(g.edges[e]["latency_s"] for e in zip(p, p[1:])) for p in shortest)
        assert topo.path_latency_s(path) == pytest.approx(best, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("intra", sorted(NODE_FABRICS))
@pytest.mark.parametrize("nics", [1, 2, 8])
def test_intra_node_routes_never_touch_a_nic(intra, nics):
    topo = build_topology(make_spec(nodes=3, devices_per_node=4, nics_per_node=nics,
                                    intra_node={"kind": intra}))
    for n in range(3):
        for a, b in itertools.permutations(range(4 * n, 4 * n + 4), 2):
            for key in range(4):
                path = topo.route(a, b, key)
                assert_valid_route(topo, a, b, path)
                assert {topo.edge_kind[e] for e in path} <= {"nvlink", "pcie", "shm"}
                for v in topo.path_vertices(path):
                    assert topo.graph.nodes[v]["kind"] != "nic"
                    assert topo.graph.nodes[v]["node"] == n


def test_inter_node_routes_leave_through_the_devices_own_nic():
    topo = RAILS["fat_tree_2"]
    for src, dst in [(0, 5), (3, 46), (6, 17)]:
        vertices = topo.path_vertices(topo.route(src, dst))
        assert vertices[1] == topo.nics_of_device[src][0]
        assert vertices[-2] == topo.nics_of_device[dst][0]


def test_same_rail_traffic_crosses_one_switch_and_other_rails_cross_spines():
    topo = RAILS["rail_optimized"]
    same_rail = topo.path_vertices(topo.route(1, 4 * 2 + 1))   # device 1 of nodes 0 and 2
    assert [topo.graph.nodes[v]["kind"] for v in same_rail].count("switch") == 1
    other_rail = topo.path_vertices(topo.route(1, 4 * 2 + 3))
    assert [topo.graph.nodes[v].get("level") for v in other_rail if
            topo.graph.nodes[v]["kind"] == "switch"] == [1, 2, 1]


# ---------------------------------------------------------------------------------- ECMP
def test_routes_are_deterministic_across_builds():
    a, b = _topo("fat_tree_3"), _topo("fat_tree_3")
    rng = np.random.default_rng(7)
    for src, dst, key in rng.integers(0, 48, size=(300, 3)).tolist():
        assert a.route(src, dst, key) == b.route(src, dst, key) == a.route(src, dst, key)


def _spines_used(topo, pairs):
    return {v for src, dst, key in pairs for v in topo.path_vertices(topo.route(src, dst, key))
            if topo.graph.nodes[v].get("level") == 2}


def test_ecmp_spreads_flows_of_one_pair_over_every_spine():
    topo = build_topology(make_spec(nodes=16, devices_per_node=1,
                                    network={"nodes_per_leaf": 8}))   # 2 leaves, 8 spines
    assert topo.graph.graph["fabric"]["leaf_uplinks"] == 8
    assert len(_spines_used(topo, [(0, 15, key) for key in range(64)])) == 8
    assert len(_spines_used(topo, [(0, 15, 0)])) == 1


def test_ecmp_spreads_different_pairs_over_every_spine():
    topo = build_topology(make_spec(nodes=16, devices_per_node=1, network={"nodes_per_leaf": 8}))
    pairs = [(src, dst, 0) for src in range(8) for dst in range(8, 16)]
    assert len(_spines_used(topo, pairs)) == 8


def test_torus_ties_in_direction_spread_both_ways():
    topo = build_topology(make_spec(nodes=4, devices_per_node=1,
                                    network={"topology": "torus", "torus_dims": [4]}))
    seconds = {topo.path_vertices(topo.route(0, 2, key))[3] for key in range(16)}
    assert seconds == {"router1", "router3"}   # 0 → 2 on a ring of 4: both ways are 2 hops


# ------------------------------------------------------------------------- golden numbers
def test_wiki_cluster_node0_nic_downlink_is_the_shared_10gbps_link():
    """Seed wiki: 5 nodes × 2 ranks, 10 Gb/s in and out of each node. Every route into node 0
    ends on switch → node 0's NIC, a 10 Gb/s = 1.25e9 B/s link the senders share."""
    topo = build_topology("cpu-10gbe")
    downlink = topo.edge_id[("switch0", "node0/nic0")]
    assert topo.edge_bandwidth_Bps[downlink] == 1.25e9
    path = topo.route(2, 0)                       # device 0 of node 1 → device 0 of node 0
    assert downlink in path
    assert topo.path_bandwidth_Bps(path) == 1.25e9
    for src in (2, 4, 6, 8):                      # one rank on each of nodes 1..4
        assert downlink in topo.route(src, 0)
        assert downlink in topo.route(src + 1, 1)


def test_wiki_cluster_latencies():
    topo = build_topology("cpu-10gbe")
    # inter-node: NIC latency (25 us) + half the shared-memory latency at each end (0.5 us)
    assert topo.path_latency_s(topo.route(2, 0)) == pytest.approx(25.5e-6)
    assert topo.path_latency_s(topo.route(1, 0)) == pytest.approx(0.5e-6)
    assert topo.path_bandwidth_Bps(topo.route(1, 0)) == 20e9


def test_dgx_a100_latency_between_nodes_on_one_leaf():
    """NCCL's NET latency (9.6 us) plus one QM8700 switch traversal (0.13 us)."""
    topo = build_topology({"preset": "dgx-a100", "nodes": 2})
    assert topo.path_latency_s(topo.route(0, 8)) == pytest.approx(9.73e-6)
    assert topo.path_latency_s(topo.route(0, 1)) == pytest.approx(3.4e-6)
    assert topo.path_bandwidth_Bps(topo.route(0, 8)) == 25e9


def test_empty_path():
    topo = TOPOS["single_switch"]
    assert topo.route(3, 3) == ()
    assert topo.path_latency_s(()) == 0.0
    assert topo.path_bandwidth_Bps(()) == float("inf")


@pytest.mark.parametrize("src, dst, message", [
    (48, 0, r"src_device = 48 is not a device id; this topology has devices 0..47"),
    (0, -1, r"dst_device = -1 is not a device id"),
    (0, 1.5, r"dst_device = 1.5 is not a device id"),
])
def test_bad_device_ids_are_refused(src, dst, message):
    with pytest.raises(ConfigError, match=message):
        TOPOS["single_switch"].route(src, dst)


# ------------------------------------------------------------------------------- scale
def test_8192_gpu_fat_tree_routes_10000_random_pairs():
    """Correctness only; the speed is printed by benchmarks/topology_speed.py."""
    topo = build_topology({"preset": "dgx-a100", "nodes": 1024})
    assert topo.num_devices == 8192
    rng = np.random.default_rng(0)
    for src, dst in rng.integers(0, 8192, size=(10_000, 2)).tolist():
        assert_valid_route(topo, src, dst, topo.route(src, dst))
