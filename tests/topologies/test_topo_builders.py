"""Every builder and every system preset gives a valid, connected graph of the right shape."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from ddlsim.config import SystemConfig
from ddlsim.errors import ConfigError
from ddlsim.presets import get_preset, list_presets
from ddlsim.topologies import NODE_FABRICS, TOPOLOGIES, build_topology, from_system

from topo_helpers import make_spec

PRESETS = sorted(list_presets("system")["system"])
INTRA = sorted(NODE_FABRICS)
FABRICS = sorted(TOPOLOGIES)


def _assert_well_formed(topo, nodes: int, per_node: int) -> None:
    g = topo.graph
    assert nx.is_strongly_connected(g)
    assert topo.num_nodes == nodes and topo.devices_per_node == per_node
    assert topo.num_devices == len(topo.devices) == nodes * per_node
    assert np.all(topo.edge_bandwidth_Bps > 0) and np.all(topo.edge_latency_s >= 0)
    assert len(topo.edges) == len(topo.edge_id) == len(topo.edge_bandwidth_Bps)
    assert all(g.has_edge(v, u) for u, v in topo.edges)
    assert topo.node_of_device.tolist() == [d // per_node for d in range(nodes * per_node)]
    assert [g.nodes[v]["local"] for v in topo.devices] == list(range(per_node)) * nodes


def test_registries_hold_every_documented_builder():
    assert set(INTRA) == {"nvswitch", "nvlink_ring", "nvlink_mesh", "pcie", "shared_memory"}
    assert set(FABRICS) == {"single_switch", "fat_tree", "rail_optimized", "torus", "dragonfly"}


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("intra", INTRA)
@pytest.mark.parametrize("nics", [1, 4, 8])
def test_every_builder_combination_is_connected(fabric, intra, nics):
    spec = make_spec(nodes=6, devices_per_node=4, nics_per_node=nics,
                     intra_node={"kind": intra}, network={"topology": fabric})
    _assert_well_formed(build_topology(spec), nodes=6, per_node=4)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("nodes", [None, 1, 16])
def test_every_system_preset_builds(preset, nodes):
    spec = {"preset": preset} if nodes is None else {"preset": preset, "nodes": nodes}
    topo = build_topology(spec)
    raw = get_preset("system", preset)
    _assert_well_formed(topo, nodes or raw["nodes"], raw["devices_per_node"])
    assert topo.name == raw["name"]


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_name_and_system_config_give_the_same_graph(preset):
    system = SystemConfig.model_validate(get_preset("system", preset))
    a, b = build_topology(preset), from_system(system)
    assert a.edges == b.edges
    assert np.array_equal(a.edge_bandwidth_Bps, b.edge_bandwidth_Bps)
    assert np.array_equal(a.edge_latency_s, b.edge_latency_s)


def test_preset_override_merges_nested_sections():
    topo = build_topology({"preset": "dgx-a100", "nodes": 8,
                           "network": {"oversubscription": 2.0, "nodes_per_leaf": 2}})
    fabric = topo.graph.graph["fabric"]
    assert fabric["oversubscription"] == pytest.approx(2.0)
    assert fabric["leaves"] == 4 and topo.graph.graph["spec"].nic.bandwidth_Bps == 25e9


def test_system_only_keys_are_ignored():
    spec = dict(get_preset("system", "cpu-10gbe"))
    assert "device" in spec
    assert build_topology(spec).num_devices == 10


# ------------------------------------------------------------------------------ node fabrics
def _link_bandwidths(topo, link_kind):
    return {float(b) for b, k in zip(topo.edge_bandwidth_Bps, topo.edge_kind) if k == link_kind}


def test_nvswitch_links_each_device_at_its_bandwidth():
    topo = build_topology(make_spec(nodes=1, devices_per_node=8))
    assert topo.graph.out_degree("node0/nvswitch") == 8
    assert _link_bandwidths(topo, "nvlink") == {100e9}


@pytest.mark.parametrize("devices, links", [(2, 1), (3, 3), (8, 8)])
def test_nvlink_ring_splits_bandwidth_over_two_neighbours(devices, links):
    topo = build_topology(make_spec(nodes=1, devices_per_node=devices,
                                    intra_node={"kind": "nvlink_ring"}))
    assert topo.edge_kind.count("nvlink") == 2 * links
    assert _link_bandwidths(topo, "nvlink") == {100e9 if devices == 2 else 50e9}


@pytest.mark.parametrize("link_bw, expected", [(None, 100e9 / 7), ("10 GB/s", 10e9)])
def test_nvlink_mesh_is_all_to_all(link_bw, expected):
    intra = {"kind": "nvlink_mesh", "link_bandwidth_Bps": link_bw}
    topo = build_topology(make_spec(nodes=1, devices_per_node=8, intra_node=intra))
    assert topo.edge_kind.count("nvlink") == 2 * 28
    assert _link_bandwidths(topo, "nvlink") == {expected}


def test_pcie_node_has_switch_and_host():
    topo = build_topology(make_spec(intra_node={"kind": "pcie"}))
    kinds = nx.get_node_attributes(topo.graph, "kind")
    assert kinds["node0/pcie"] == "pcie_switch" and kinds["node0/host"] == "host"
    assert topo.graph.has_edge("node0/pcie", "node0/nic0")


def test_shared_memory_nodes_share_one_nic_through_the_host():
    topo = build_topology("cpu-10gbe")
    assert topo.nics_of_device[0] == topo.nics_of_device[1] == ["node0/nic0"]
    assert topo.graph.has_edge("node0/host", "node0/nic0")


@pytest.mark.parametrize("preset, nic_of_device", [
    ("dgx-a100", [0, 1, 2, 3, 4, 5, 6, 7]),   # rails: device i uses NIC i
    ("dgx1-v100", [0, 0, 1, 1, 2, 2, 3, 3]),  # 4 NICs for 8 GPUs: pairs share one
])
def test_devices_use_their_share_of_the_nics(preset, nic_of_device):
    topo = build_topology({"preset": preset, "nodes": 2})
    assert topo.nics_of_device[:8] == [[f"node0/nic{j}"] for j in nic_of_device]


def test_two_nics_per_device_are_both_used():
    topo = build_topology(make_spec(devices_per_node=2, nics_per_node=4))
    assert topo.nics_of_device[1] == ["node0/nic2", "node0/nic3"]


# ------------------------------------------------------------------------------ fabrics
@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_fat_tree_leaf_uplinks_carry_downlinks_over_oversubscription(ratio):
    topo = build_topology(make_spec(nodes=16, nics_per_node=2,
                                    network={"nodes_per_leaf": 4, "oversubscription": ratio}))
    g = topo.graph
    down = sum(g.edges["leaf0", v]["bandwidth_Bps"] for v in g.succ["leaf0"]
               if g.nodes[v]["kind"] == "nic")
    up = sum(g.edges["leaf0", v]["bandwidth_Bps"] for v in g.succ["leaf0"]
             if g.nodes[v]["kind"] == "switch")
    assert down == pytest.approx(8 * 12.5e9)
    assert up == pytest.approx(down / ratio)


def test_fat_tree_sizes_its_levels():
    two = build_topology(make_spec(nodes=8, network={"nodes_per_leaf": 2})).graph.graph["fabric"]
    assert (two["levels"], two["leaves"], two["leaf_uplinks"]) == (2, 4, 2)
    three = build_topology(make_spec(nodes=16, network={"nodes_per_leaf": 2, "levels": 3,
                                                         "leaves_per_pod": 2}))
    levels = nx.get_node_attributes(three.graph, "level")
    assert sorted(levels.values()).count(1) == 8  # leaves
    assert sorted(levels.values()).count(2) == 8  # 4 pods × 2 aggregation switches
    assert sorted(levels.values()).count(3) == 4  # 2 planes × 2 cores
    auto = build_topology({"preset": "dgx-a100", "nodes": 1024}).graph.graph["fabric"]
    assert (auto["levels"], auto["leaves"], auto["pods"]) == (3, 256, 8)


def test_one_leaf_needs_no_spines():
    topo = build_topology(make_spec(nodes=4))
    assert topo.graph.graph["fabric"]["levels"] == 1
    assert not any(k == "fabric" for k in topo.edge_kind)


def test_rail_optimized_puts_nic_i_of_every_node_on_rail_i():
    topo = build_topology(make_spec(nodes=4, devices_per_node=4, nics_per_node=4,
                                    network={"topology": "rail_optimized"}))
    for n in range(4):
        for i in range(4):
            assert topo.attach_of_nic[f"node{n}/nic{i}"] == [f"rail{i}.leaf0"]


def test_torus_links_wrap_around():
    topo = build_topology(make_spec(nodes=12, network={"topology": "torus", "torus_dims": [4, 3]}))
    routers = [v for v, k in topo.graph.nodes(data="kind") if k == "router"]
    assert len(routers) == 12
    fabric_degree = {r: sum(topo.graph.nodes[w]["kind"] == "router" for w in topo.graph.succ[r])
                     for r in routers}
    assert set(fabric_degree.values()) == {4}


def test_dragonfly_groups_are_all_to_all_with_global_links():
    topo = build_topology(make_spec(nodes=12, network={"topology": "dragonfly",
                                                       "routers_per_group": 4, "global_links": 2}))
    g = topo.graph
    groups = nx.get_node_attributes(g, "group")
    local = sum(1 for u, v in topo.edges if u in groups and v in groups
                and groups[u] == groups[v]) // 2
    global_ = sum(1 for u, v in topo.edges if u in groups and v in groups
                  and groups[u] != groups[v]) // 2
    assert local == 3 * 6 and global_ == 3 * 2


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("override, message", [
    ({"network": {"topology": "hypercube"}},
     r"system.network.topology: .*allowed: dragonfly, fat_tree, .* \(got 'hypercube'\)"),
    ({"intra_node": {"kind": "infiniband"}},
     r"system.intra_node.kind: .*allowed: .*nvlink_mesh.* \(got 'infiniband'\)"),
    ({"nics_per_node": 3},
     r"nics_per_node = 3 must divide or be a multiple of devices_per_node = 2"),
    ({"network": {"topology": "torus", "torus_dims": [3, 3]}},
     r"torus_dims = \[3, 3\] holds 9 nodes but the system has nodes = 4"),
    ({"network": {"topology": "torus", "torus_dims": [0, 4]}},
     r"network.torus_dims.0: Input should be greater than 0 \(got 0\)"),
    ({"network": {"topology": "dragonfly", "routers_per_group": 2, "global_links": 3}},
     r"global_links = 3 exceeds .* allowed: 1..2"),
    ({"network": {"oversubscription": 0.5}}, r"network.oversubscription.*got 0.5"),
    ({"nic": {"bandwidth_Bps": "fast"}}, r"nic.bandwidth_Bps.*'fast'"),
    ({"nic": {"bandwidth_Bps": 0}}, r"nic.bandwidth_Bps.*greater than 0"),
    ({"nic": {"bandwidth_Bps": 1e9, "latency_s": -1}}, r"nic.latency_s.*got -1"),
    ({"network": {"radix": 64}},
     r"unknown key 'radix' in system.network; allowed keys: .*spines"),
    ({"nodes": 0}, r"system.nodes.*greater than 0.*got 0"),
])
def test_bad_specs_raise_config_errors_naming_field_value_and_allowed(override, message):
    with pytest.raises(ConfigError, match=message):
        build_topology(make_spec(**override))


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"'dgx-z900' does not exist.*cpu-10gbe, dgx-a100"):
        build_topology("dgx-z900")


def test_non_mapping_spec_is_refused():
    with pytest.raises(ConfigError, match=r"must be a mapping, a SystemConfig or a preset name"):
        build_topology(42)
