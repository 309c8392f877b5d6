"""Shared helpers for the topology tests: a small spec factory, a two-node graph and a route
checker.

A plain module (not conftest.py) so its name cannot clash with other test folders' conftest.
"""

from __future__ import annotations

import copy
from typing import Any

from ddlsim.topologies import GraphBuilder, Topology

BASE_SPEC: dict[str, Any] = {
    "name": "test",
    "nodes": 4,
    "devices_per_node": 2,
    "intra_node": {"kind": "nvswitch", "bandwidth_Bps": "100 GB/s", "latency_s": "2 us"},
    "nics_per_node": 1,
    "nic": {"bandwidth_Bps": "100 Gb/s", "latency_s": "5 us"},
    "network": {"topology": "fat_tree"},
}


def make_spec(**override: Any) -> dict[str, Any]:
    """``BASE_SPEC`` with ``override`` merged in (nested mappings merge key by key)."""
    spec = copy.deepcopy(BASE_SPEC)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def assert_valid_route(topo: Topology, src: int, dst: int, path: tuple[int, ...]) -> None:
    """``path`` is a simple chain of edges from device ``src`` to device ``dst``."""
    assert isinstance(path, tuple)
    if src == dst:
        assert path == ()
        return
    vertices = topo.path_vertices(path)
    assert vertices[0] == topo.devices[src]
    assert vertices[-1] == topo.devices[dst]
    for a, b in zip(path, path[1:]):
        assert topo.edges[a][1] == topo.edges[b][0]
    assert len(set(vertices)) == len(vertices), f"route revisits a vertex: {vertices}"
    for u, v in zip(vertices, vertices[1:]):
        assert topo.graph.has_edge(u, v)


def two_nodes() -> GraphBuilder:
    """Two one-device nodes, each with a NIC (10 GB/s PCIe, 1 GB/s NIC link with 1 µs) on one
    switch of 0.1 µs latency."""
    b = GraphBuilder(switch_latency_s=1e-7)
    b.add_node("sw", "switch", level=1)
    for n in range(2):
        b.add_node(f"d{n}", "device", node=n, local=0)
        b.add_node(f"nic{n}", "nic", node=n)
        b.add_link(f"d{n}", f"nic{n}", bandwidth_Bps=1e10, link_kind="pcie")
        b.add_link(f"nic{n}", "sw", bandwidth_Bps=1e9, latency_s=1e-6, link_kind="nic")
    return b
